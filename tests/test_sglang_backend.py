"""The SGLang backend through SGLang's registry, side by side with SGLang's own trees.

Every test here needs SGLang 0.5.23 (CPU torch is enough); where it is not
installed the module is skipped with the reason. Each scenario runs the same
scheduler calls on three caches, each with SGLang's real CPU pools: radixmeta's
backend, SGLang's classic ``RadixCache`` and its ``UnifiedRadixCache`` on the
Rust core. After every step they must agree on the prefix lengths, the slots
given back to the allocator, the KV events, the evictable and protected sizes
and the allocator's free size; at the end the allocator is full again.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import _sglang as H
import pytest

if not H.HAVE_SGLANG:
    pytest.skip(H.SKIP_REASON, allow_module_level=True)

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from radixmeta.errors import UnsupportedConfigurationError, UnsupportedVersionError
from radixmeta.integrations import sglang as integration
from radixmeta.integrations.sglang import _plugin

S = H.load()
registry = S["registry"]


def engines(page_size: int = 1, **kwargs: Any) -> list[H.Engine]:
    H.set_server_args(page_size)
    return [H.Engine(kind, page_size=page_size, **kwargs) for kind in H.KINDS]


def agree(what: str, observed: list[Any]) -> Any:
    for kind, seen in zip(H.KINDS[1:], observed[1:], strict=True):
        assert seen == observed[0], f"{what}: radixmeta {observed[0]!r} != {kind} {seen!r}"
    return observed[0]


def step(es: list[H.Engine], method: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``engine.method(*args, **kwargs)`` on every engine; require the same observations."""
    results = [getattr(e, method)(*args, **kwargs) for e in es]
    seen = [(r, e.take_freed(), e.events(), e.sizes()) for r, e in zip(results, es, strict=True)]
    return agree(f"{method}{args}", seen)


# -- registration ------------------------------------------------------------------------------
@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    table: dict[str, Any] = {}
    monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", table)
    return table


def test_registered_with_sglangs_registry(fresh_registry: dict[str, Any]) -> None:
    integration.register()
    integration.register()  # again: nothing happens (each SGLang process may load plugins twice)
    assert registry.get_radix_cache_factory("radixmeta") is integration.create_cache
    assert "radixmeta" in registry.registered_radix_cache_backends()


def test_sglang_builds_it_for_the_flag(fresh_registry: dict[str, Any]) -> None:
    """create_tree_cache, SGLang's own selection, picks the backend by name."""
    integration.register()
    H.set_server_args(1, radix_cache_backend="radixmeta")
    probe = H.Engine("classic", events=False)  # only for its pools
    ctx = H.context(_params_of(probe))
    cache = registry.create_tree_cache(ctx)
    assert type(cache).__name__ == "RadixMetaPrefixCache"
    assert cache.supports_prefix_sharing() and not cache.supports_mamba()


def _params_of(engine: H.Engine) -> Any:
    return S["CacheInitParams"](
        disable=False,
        req_to_token_pool=engine.rtp,
        token_to_kv_pool_allocator=engine.alloc,
        page_size=engine.page_size,
        eviction_policy="lru",
    )


def test_sglangs_plugin_loader_finds_the_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry: dict[str, Any]
) -> None:
    """What pip installs (an entry point in sglang.srt.plugins) is what SGLang loads."""
    dist = tmp_path / "radixmeta-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: radixmeta\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nradixmeta = radixmeta.integrations.sglang:register\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    plugins = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    func, _ = plugins["radixmeta"]
    assert func is integration.register
    func()
    assert registry.get_radix_cache_factory("radixmeta") is integration.create_cache


def test_an_untested_release_warns(
    monkeypatch: pytest.MonkeyPatch, fresh_registry: dict[str, Any]
) -> None:
    monkeypatch.setattr(_plugin, "sglang_version", lambda: "0.5.99")
    with pytest.warns(RuntimeWarning, match=r"tested with sglang 0\.5\.23; found 0\.5\.99"):
        integration.register()
    assert registry.get_radix_cache_factory("radixmeta") is integration.create_cache


def test_a_changed_interface_is_refused_at_startup(
    monkeypatch: pytest.MonkeyPatch, fresh_registry: dict[str, Any]
) -> None:
    monkeypatch.setattr(_plugin, "sglang_version", lambda: "0.6.0")
    monkeypatch.setattr(_plugin, "interface_problems", lambda: ["MatchResult has no field x"])
    with pytest.warns(RuntimeWarning, match="does not support sglang 0.6.0"):
        integration.register()
    factory = registry.get_radix_cache_factory("radixmeta")
    with pytest.raises(UnsupportedVersionError, match=r"MatchResult has no field x.*0\.5\.23"):
        factory(None)


def test_this_sglang_has_the_interface() -> None:
    assert integration.interface_problems() == []
    assert integration.sglang_version() in integration.TESTED_VERSIONS


def test_a_refused_configuration_fails_at_startup() -> None:
    H.set_server_args(1)
    probe = H.Engine("classic", events=False)
    ctx = H.context(_params_of(probe), is_hybrid_ssm=True)
    with pytest.raises(UnsupportedConfigurationError, match="Mamba"):
        integration.create_cache(ctx)


# -- side by side ------------------------------------------------------------------------------
def scenario(es: list[H.Engine], rng: random.Random, requests: int, **key: Any) -> None:
    """Admit, checkpoint while running, finish, with the allocator evicting when short."""
    base = [rng.randrange(1000) for _ in range(48)]
    for i in range(requests):
        tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 24))]
        prompt = base[: rng.randrange(0, 48)] + tail
        outputs = [rng.randrange(1000) for _ in range(rng.randrange(1, 8))]
        rid = f"r{i}"
        admitted = step(es, "admit", rid, prompt, outputs, **key)[0]
        if admitted is None:
            continue
        if rng.random() < 0.5:
            step(es, "checkpoint", rid)
        if rng.random() < 0.7 or len(es[0].reqs) > 5:
            victim = rng.choice(sorted(es[0].reqs))
            step(es, "finish", victim)
        if rng.random() < 0.1:
            tokens = rng.randrange(1, 64)
            step(es, "evict", tokens)
    drain(es)


def drain(es: list[H.Engine]) -> None:
    for rid in sorted(es[0].reqs):
        step(es, "finish", rid)
    final = step(es, "evict", 10**9)
    assert final[3] == (0, 0, es[0].full), "every slot is back in the allocator"


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_scheduler_sequence_side_by_side(page_size: int) -> None:
    es = engines(page_size, size=256 if page_size == 1 else 512)
    scenario(es, random.Random(page_size), 60)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize(
    "key",
    [
        {"cache_salt": "tenant-a"},
        {"lora_id": "0123456789abcdef0123456789abcdef"},
        {"extra_key": "rag-v2", "cache_salt": "tenant-b"},
    ],
)
def test_namespaces_side_by_side(key: dict[str, Any], dynamo: bool) -> None:
    """Salts and LoRA ids (the extra key) keep pages apart and name them as SGLang does."""
    lora_names = S["KvEventLoraNames"]()
    es = engines(4, size=512, dynamo=dynamo, lora_names=lora_names)
    if "lora_id" in key:
        lora_names.register(lora_id=key["lora_id"], lora_name="my-adapter")
        lora_names._names[key["lora_id"]] = "my-adapter"  # as admission registers it
    rng = random.Random(7)
    prompt = [rng.randrange(1000) for _ in range(20)]
    step(es, "admit", "plain", prompt, [1, 2])
    step(es, "finish", "plain")
    hit = step(es, "admit", "ns", prompt, [1, 2], **key)
    assert hit[0] == 0, "a namespaced request does not hit the default namespace's pages"
    step(es, "finish", "ns")
    again = step(es, "admit", "ns2", prompt, [3], **key)
    assert again[0] == 16
    scenario(es, rng, 20, **key)


def test_eagle_bigram_keys_side_by_side() -> None:
    """With EAGLE the tree keys bigrams; prefix lengths and freed slots match SGLang's."""
    es = engines(1, size=256, is_eagle=True, events=False)
    scenario(es, random.Random(3), 40)


def test_eviction_policies_side_by_side() -> None:
    for policy in ("fifo", "priority"):
        es = engines(1, size=256, eviction=policy)
        scenario(es, random.Random(11), 30)


def test_path_device_indices_are_int64_on_the_allocators_device() -> None:
    (e,) = [H.Engine("radixmeta")]
    e.admit("a", list(range(1, 20)), [7])
    e.finish("a")
    m = e.cache.match_prefix(
        S["MatchPrefixParams"](key=S["RadixKey"](H.array("q", range(1, 20))))
    )
    got = e.cache.path_device_indices(m.last_device_node)
    assert got.dtype == S["torch"].int64 and got.device.type == "cpu"
    assert len(got) == m.device_prefix_len == 19
    assert e.cache.path_device_indices(e.cache.root_node_handle()).numel() == 0
    flat = e.cache.all_values_flatten()
    assert sorted(flat.tolist()) == sorted(set(flat.tolist())) and len(flat) == 20
    e.cache.sanity_check()


def test_reset_clears_and_says_so() -> None:
    es = engines(1, size=128)
    step(es, "admit", "a", [1, 2, 3, 4], [5])
    step(es, "finish", "a")
    for e in es:
        e.cache.reset()
        e.alloc.clear()  # SGLang's flush clears the allocator next to the tree
    agree("reset", [(e.events(), e.sizes()) for e in es])


# -- a hypothesis state machine over the same calls --------------------------------------------
PROMPT_BASES = [[(b * 97 + i * 13) % 1000 for i in range(40)] for b in range(3)]


class SideBySide(RuleBasedStateMachine):
    """Random scheduler steps on the three caches; they must never disagree."""

    @initialize(page_size=st.sampled_from([1, 4]))
    def build(self, page_size: int) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.es = engines(page_size, size=160 if page_size == 1 else 256)
        self.count = 0

    @rule(
        base=st.integers(0, len(PROMPT_BASES) - 1),
        shared=st.integers(0, 40),
        tail=st.lists(st.integers(0, 999), min_size=1, max_size=12),
        outputs=st.lists(st.integers(0, 999), min_size=1, max_size=6),
        salt=st.sampled_from([None, None, "s"]),
    )
    def admit(
        self, base: int, shared: int, tail: list[int], outputs: list[int], salt: str | None
    ) -> None:
        rid = f"r{self.count}"
        self.count += 1
        prompt = PROMPT_BASES[base][:shared] + tail
        step(self.es, "admit", rid, prompt, outputs, cache_salt=salt)

    @precondition(lambda self: bool(self.es[0].reqs))
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.es[0].reqs)))
        if self.es[0].reqs[rid].kv.cache_protected_len == 0:
            step(self.es, "checkpoint", rid)

    @precondition(lambda self: bool(self.es[0].reqs))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.es[0].reqs)))
        step(self.es, "finish", rid)

    @rule(tokens=st.integers(1, 80))
    def evict(self, tokens: int) -> None:
        step(self.es, "evict", tokens)

    @rule(base=st.integers(0, len(PROMPT_BASES) - 1), shared=st.integers(1, 40))
    def match(self, base: int, shared: int) -> None:
        step(self.es, "match", [*PROMPT_BASES[base][:shared], 5000])

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "es"):
            self.es[0].cache.sanity_check()

    def teardown(self) -> None:
        if hasattr(self, "es"):
            drain(self.es)


SideBySide.TestCase.settings = settings(
    settings(), max_examples=min(settings().max_examples, 40), stateful_step_count=40
)
TestSideBySide = SideBySide.TestCase


def test_an_overflowed_log_restarts_the_consumers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the ring's capacity between two drains: a clear, then every block held."""
    from radixmeta.integrations.sglang import backend

    monkeypatch.setattr(backend, "_LOG_CAPACITY", 3)
    es = [H.Engine("radixmeta", size=256), H.Engine("classic", size=256)]
    rng = random.Random(5)
    for i in range(8):
        prompt = [rng.randrange(50) for _ in range(rng.randrange(2, 20))]
        for e in es:
            e.admit(f"r{i}", prompt, [1])
            e.finish(f"r{i}")
    for e in es:
        e.evict(30)
    ours, theirs = (e.events() for e in es)
    assert ours[0] == ("AllBlocksCleared",)
    held: set[int] = set()
    for event in theirs:
        if event[0] == "AllBlocksCleared":
            held.clear()
        elif event[0] == "BlockStored":
            held.update(event[1])
        else:
            held.difference_update(event[1])
    stored = [h for event in ours[1:] for h in event[1]]
    assert all(event[0] == "BlockStored" for event in ours[1:])
    assert sorted(stored) == sorted(held)


# -- token ids outside radixmeta's range (issue 21) ----------------------------------------
@pytest.mark.parametrize("page_size", [1, 16])
def test_issue_21_ids_outside_uint32_are_a_miss_not_an_exception(
    page_size: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A request holding ids SGLang accepts (2**32, -1) runs through the scheduler's calls.

    SGLang 0.5.23's tokenizer manager checks the length of ``input_ids``, not
    their range, so a client can send such ids. Every call the scheduler makes
    (waiting-queue matches and touches, admission, a chunk's checkpoint,
    decode, release, an ``insert``) is served: the key up to the last whole page
    before the first such id, the rest a miss; counted, logged once.
    """
    import _sglang_scheduler as T

    H.set_server_args(page_size)
    (s,) = [T.Scheduler("radixmeta", page_size=page_size, eviction="lru", size=512, chunk=32)]
    good = list(range(1, 41))
    prompt = [*good, 2**32, *range(50, 70), -1, *range(80, 90)]
    caplog.set_level("WARNING", logger="radixmeta.integrations.sglang.backend")
    s.arrive("a", prompt, [7, 8, 9], 0)
    s.calc_priority("lpm")  # the waiting-queue match
    for _ in range(33):
        s.calc_priority("fcfs")  # LRU: SGLang touches the waiting prefixes every 32nd pass
    while s.admit()[0] is not None and s.chunked is not None:
        pass  # chunked prefill, a checkpoint after each chunk
    assert "a" in s.running
    for _ in range(3):
        s.decode()
    s.finish("a")
    served = 40 // page_size * page_size
    s.arrive("b", prompt, [1], 0)
    (rid, start, matched, _), _ = s.admit()
    assert (rid, start) == ("b", served), "served up to the first id outside [0, 2**32)"
    assert matched == [("a", 0, p) for p in range(served)]
    while s.chunked is not None:
        s.admit()
    s.finish("b")
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    slots = s.alloc.alloc(48)  # SGLang's insert(): the caller's slots, the key's ids
    result = s.cache.insert(
        InsertParams(
            key=S["RadixKey"](H.array("q", [*range(100, 132), -5, *range(15)])), value=slots
        )
    )
    assert (result.prefix_len, result.last_device_node.length) == (0, 32)
    s.alloc.free(slots[32:])  # what the tree did not take is the caller's to free
    assert s.cache.stats.out_of_range_keys >= 6
    warnings_logged = [r for r in caplog.records if "outside [0, 2**32)" in r.getMessage()]
    assert len(warnings_logged) == 1, "logged once"
    s.evict(10**9)
    assert s.leaked()["slots"] == 0
    s.cache.sanity_check()


def test_every_eviction_policy_sglang_takes_is_served_or_refused_by_name() -> None:
    """SGLang's --radix-eviction-policy choices and its strategy table, one by one."""
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
    from sglang.srt.mem_cache.utils import _EVICTION_POLICY_FACTORIES

    names = set(RADIX_EVICTION_POLICY_CHOICES) | set(_EVICTION_POLICY_FACTORIES)
    assert {"lru", "lfu", "fifo", "priority", "slru", "tlru"} <= names
    H.set_server_args(1)
    probe = H.Engine("classic", events=False)
    for name in sorted(names):
        params = _params_of(probe)
        params.eviction_policy = name
        problems = integration.configuration_problems(H.context(params))
        if name in integration.EVICTION_POLICIES:
            assert problems == [], (name, problems)
        else:
            assert len(problems) == 1 and f"--radix-eviction-policy {name} " in problems[0]
            assert "has no such policy" not in problems[0], "each has its reason"


def test_issue_21_lfu_evicts_what_both_sglang_trees_evict() -> None:
    """Insert A once and B three times, match A five times, evict one token: A goes."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    H.set_server_args(1)
    es = [H.Engine(kind, eviction="lfu", events=False) for kind in H.KINDS]
    evicted = []
    for e in es:
        key = S["RadixKey"]
        a = e.alloc.alloc(4)
        e.cache.insert(InsertParams(key=key(H.array("q", [1, 2, 3, 4])), value=a))
        for _ in range(3):  # three requests store B, each with its own slots
            b = e.alloc.alloc(4)
            r = e.cache.insert(InsertParams(key=key(H.array("q", [5, 6, 7, 8])), value=b))
            if e.kind != "unified":  # the unified tree frees duplicates itself
                e.alloc.free(b[: r.prefix_len])
        for _ in range(5):
            assert e.match([1, 2, 3, 4]) == 4  # lookups: no hit counted
        e.take_freed()
        e.evict(1)
        evicted.append((e.take_freed(), sorted(a.tolist())))
    agree("the evicted KV", evicted)
    assert evicted[0][0] == evicted[0][1], "A, stored once, goes first"
    assert es[0].match([5, 6, 7, 8]) == 4
