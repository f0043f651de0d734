"""The gateway's parts on their own: engine specs and files, the circuit breaker, load
parsing, tokenization and namespaces, the retry's policy wrapper, the console script."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from radixmeta.errors import InputTypeError, InvalidInputError, NoWorkerError
from radixmeta.gateway.breaker import CircuitBreaker
from radixmeta.gateway.config import GatewayConfig, WorkerSpec, load_workers
from radixmeta.gateway.loads import ReportedLoad, parse_loads
from radixmeta.gateway.tokenize import (
    ByteTokenizer,
    HFTokenizer,
    namespace_of,
    prompt_of,
    render_chat,
)

pytestmark = pytest.mark.timeout(60)


# -- engine specs ------------------------------------------------------------------------
def test_worker_spec_parses_every_option():
    spec = WorkerSpec.parse(
        "http://10.0.0.1:8000/,events=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5558,"
        "dp-size=2,codec=sglang,name=a"
    )
    assert spec == WorkerSpec(
        "http://10.0.0.1:8000", "a", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558", 2, "sglang"
    )
    assert spec.exact and spec.as_dict()["mode"] == "exact"
    plain = WorkerSpec.parse("http://h:1")
    assert plain.name == "http://h:1" and not plain.exact and plain.codec == "vllm"
    assert WorkerSpec.parse("http://h:1,capacity=5000").capacity == 5000


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("h:1", r"http\(s\)://host:port"),
        ("http://h:1,colour=red", "unknown engine option"),
        ("http://h:1,events", "unknown engine option"),
        ("http://h:1,events=tcp://h:2,codec=grpc", "codec"),
        ("http://h:1,dp-size=0", "dp-size"),
        ("http://h:1,dp-size=two", "dp-size"),
        ("http://h:1,capacity=-3", "capacity"),
        ("http://h:1,replay=tcp://h:3", "needs an events endpoint"),
    ],
)
def test_bad_worker_specs_say_what_is_wrong(spec, needle):
    with pytest.raises(InvalidInputError, match=needle):
        WorkerSpec.parse(spec)


def test_engine_files_yaml_and_json(tmp_path):
    yaml_file = tmp_path / "fleet.yaml"
    yaml_file.write_text(
        "workers:\n"
        "  - url: http://a:8000\n    events: tcp://a:5557\n    dp-size: 2\n"
        "  - {url: 'http://b:8000', events: 'tcp://b:5557', codec: sglang}\n"
    )
    json_file = tmp_path / "fleet.json"
    json_file.write_text(json.dumps([{"url": "http://c:8000", "dp_size": 1, "capacity": 9}]))
    specs = load_workers(yaml_file) + load_workers(json_file)
    assert [(s.name, s.dp_size, s.codec, s.capacity) for s in specs] == [
        ("http://a:8000", 2, "vllm", None),
        ("http://b:8000", 1, "sglang", None),
        ("http://c:8000", 1, "vllm", 9),
    ]
    assert GatewayConfig.workers_from(["http://d:1"], [str(json_file)])[1].url == "http://c:8000"
    bad = tmp_path / "bad.json"
    for text, needle in [
        ("{", "not valid JSON"),
        ('{"engines": []}', "list of engines"),
        ('[{"url": "http://e:1", "port": 3}]', "only"),
        ("[5]", "a mapping"),
    ]:
        bad.write_text(text)
        with pytest.raises(InvalidInputError, match=needle):
            load_workers(bad)


def test_gateway_config_checks_its_numbers_and_names():
    with pytest.raises(InvalidInputError, match="page_size"):
        GatewayConfig(page_size=0)
    with pytest.raises(InvalidInputError, match="request_timeout"):
        GatewayConfig(request_timeout=0)
    with pytest.raises(InvalidInputError, match="max_open_seconds"):
        GatewayConfig(open_seconds=5, max_open_seconds=1)
    with pytest.raises(InvalidInputError, match="share a name"):
        GatewayConfig([WorkerSpec("http://a:1", "x"), WorkerSpec("http://b:1", "x")])


# -- circuit breaker -----------------------------------------------------------------------
def test_breaker_opens_after_k_failures_and_retries_with_backoff():
    now = [0.0]
    b = CircuitBreaker(3, 1.0, 4.0, clock=lambda: now[0])
    assert [b.failure() for _ in range(3)] == [False, False, True]
    assert b.state == "open" and b.opens == 1
    assert not b.try_half_open()  # the wait is not over
    for wait in (1.0, 2.0, 4.0, 4.0):  # each failed trial doubles the wait, up to the cap
        now[0] += wait
        assert b.try_half_open() and b.state == "half-open"
        assert b.failure() and b.state == "open"
    assert b.wait == 4.0
    now[0] += 4.0
    b.try_half_open()
    assert b.success() and b.state == "closed" and b.wait == 1.0 and b.failures == 0
    assert not b.success()  # already closed
    b.failure()
    b.success()
    assert b.failure() is False  # a success resets the consecutive count


# -- loads ---------------------------------------------------------------------------------
def test_parse_loads_of_vllm_and_sglang():
    vllm = (
        "# HELP vllm:num_requests_waiting waiting\n# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 7.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 1.5\n'
        "vllm:prompt_tokens_total 100\n"
    )
    assert parse_loads(vllm) == {
        0: ReportedLoad(queue_length=3, running=7, kv_usage=0.5),
        1: ReportedLoad(queue_length=1, kv_usage=1.0),  # clamped to [0, 1]
    }
    sglang = (
        'sglang:num_queue_reqs{model_name="m",dp_rank="2"} 4\n'
        'sglang:num_running_reqs{model_name="m",dp_rank="2"} 2\n'
        'sglang:token_usage{model_name="m",dp_rank="2"} 0.25\n'
    )
    assert parse_loads(sglang) == {2: ReportedLoad(queue_length=4, running=2, kv_usage=0.25)}
    old = "vllm:gpu_cache_usage_perc 0.125\n"  # vLLM before 0.10
    assert parse_loads(old) == {0: ReportedLoad(kv_usage=0.125)}
    assert parse_loads("") == {}
    with pytest.raises(ValueError):
        parse_loads("vllm:num_requests_waiting{engine= 3\n")


# -- tokens and namespaces -----------------------------------------------------------------
def _tiny_tokenizer(tmp_path):
    """A real Hugging Face tokenizer.json (a word-level vocabulary), made here."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<|user|>": 3, "<|assistant|>": 4, "hi": 5}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_hf_tokenizer_from_a_file_a_directory_or_the_local_cache(tmp_path, monkeypatch):
    path = _tiny_tokenizer(tmp_path)
    for source in (str(path), str(tmp_path)):
        tok = HFTokenizer(source)
        assert tok.exact and tok.encode("hello world").tolist() == [1, 2]
        assert tok.chat([{"role": "user", "content": "hi"}]).tolist() == [3, 5, 4]
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_bytes(path.read_bytes())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert HFTokenizer("org/tiny").encode("world hello").tolist() == [2, 1]
    with pytest.raises(InvalidInputError, match="no tokenizer"):
        HFTokenizer("org/absent")


def test_a_chat_template_is_applied_through_transformers(tmp_path):
    """The model's own template, as the engine renders it, not radixmeta's stand-in."""
    pytest.importorskip("transformers")
    _tiny_tokenizer(tmp_path)
    template = (
        "{% for m in messages %}hello {{ m.content }} world {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = HFTokenizer(str(tmp_path))
    assert tok.templated
    # render_chat would give <|user|> hi <|assistant|>, that is [3, 5, 4].
    assert tok.chat([{"role": "user", "content": "hi"}]).tolist() == [1, 5, 2, 4]


def test_prompts_of_completions_and_chats():
    tok = ByteTokenizer()
    tokens, exact = prompt_of({"prompt": "ab"}, "completions", tok)
    assert tokens.tolist() == [97, 98] and not exact
    tokens, exact = prompt_of({"prompt": [5, 6, 7]}, "completions", tok)
    assert tokens.dtype == np.uint32 and tokens.tolist() == [5, 6, 7] and exact
    assert prompt_of({"prompt": ["xy", "z"]}, "completions", tok)[0].tolist() == [120, 121]
    assert prompt_of({"prompt": [[1, 2], [3]]}, "completions", tok)[0].tolist() == [1, 2]
    assert prompt_of({"input_ids": [9, 9], "prompt": "x"}, "completions", tok)[0].tolist() == [9, 9]
    chat = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url", "image_url": {"url": "u"}}]}]
    text = render_chat(chat)
    assert text == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert prompt_of({"messages": chat}, "chat", tok)[0].tolist() == list(text.encode())
    for body, error in [
        ([], InputTypeError),
        ({"prompt": 5}, InvalidInputError),
        ({"prompt": [2**32]}, InvalidInputError),
        ({"prompt": []}, InvalidInputError),
    ]:
        with pytest.raises(error):
            prompt_of(body, "completions", tok)


def test_namespaces_as_the_engines_key_them():
    assert namespace_of({"model": "m"}) is None
    assert namespace_of({"lora_path": "sql"}) == "lora:sql"
    assert namespace_of({"model": "sql", "cache_salt": "t1"}, {"sql"}) == "lora:sql|salt:t1"
    with pytest.raises(InvalidInputError, match="lora_path"):
        namespace_of({"lora_path": 3})


# -- the retry's policy wrapper ------------------------------------------------------------
def test_avoiding_hides_the_failed_engine_from_the_policy_and_nothing_else():
    from radixmeta import Router
    from radixmeta.gateway.policy import Avoiding
    from radixmeta.policies import create

    policy = Avoiding(create("least_loaded"))
    router = Router(1, policy=policy)
    a, b = router.add_worker("a"), router.add_worker("b")
    first = router.dispatch([1, 2, 3], request_id="r1")
    policy.avoid["r2"] = frozenset({first.worker.name})
    second = router.dispatch([1, 2, 3], request_id="r2")
    assert second.worker != first.worker
    policy.avoid["r3"] = frozenset({"a", "b"})
    with pytest.raises(NoWorkerError, match="besides a, b"):
        router.dispatch([1], request_id="r3")
    assert router.in_flight == 2  # the refused dispatch changed nothing
    assert {a, b} == {first.worker, second.worker}
    router.close()


# -- the console script ----------------------------------------------------------------------
def test_serve_reports_a_bad_engine_and_exits_2():
    run = subprocess.run(
        [sys.executable, "-m", "radixmeta", "serve", "--worker", "localhost:8000"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2
    assert "radixmeta serve: an engine URL is http(s)://host:port" in run.stderr


def test_import_radixmeta_and_its_help_stay_light():
    code = (
        "import sys, radixmeta, radixmeta.cli, radixmeta.gateway\n"
        "extra = ('starlette', 'aiohttp', 'uvicorn', 'tokenizers')\n"
        "heavy = [m for m in extra if m in sys.modules]\n"
        "print(heavy)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "[]", run.stderr
