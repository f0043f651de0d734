"""The DP dispatcher in SGLang's own DataParallelController, without schedulers.

The controller is built with ``__new__`` and the attributes dispatch reads (the
pattern of SGLang's CPU dispatch test); each rank is a real loopback ZeroMQ
publisher sending SGLang-format events (``radixmeta.wire.sglang``), and the load
snapshots are synthetic. Skipped where SGLang is not installed.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Iterator
from typing import Any

import _sglang as H
import numpy as np
import pytest
from _ports import free_port_block

if not H.HAVE_SGLANG:
    pytest.skip(H.SKIP_REASON, allow_module_level=True)

from radixmeta.integrations.sglang import dispatch as D
from radixmeta.transport import ZmqPublisher
from radixmeta.wire import BlockStored, EventBatch, sglang

PAGE = 4
DP = 3


@pytest.fixture(scope="module")
def sgl() -> Any:
    H.load()  # the torchvision stand-in, then SGLang's modules
    import warnings

    with warnings.catch_warnings():
        # The controller imports the scheduler, which warns about the missing GPU.
        warnings.simplefilter("ignore")
        from sglang.srt.managers import data_parallel_controller as dpc
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.managers.load_snapshot import LoadSnapshot
        from sglang.srt.sampling.sampling_params import SamplingParams

    return dpc, TokenizedGenerateReqInput, LoadSnapshot, SamplingParams


class Socket:
    """Stands in for a scheduler's PUSH socket: keeps the bytes sock_send sends."""

    def __init__(self, rank: int, log: list[tuple[int, bytes]]) -> None:
        self.rank, self.log = rank, log

    def send(self, data: bytes, flags: int = 0) -> None:
        self.log.append((self.rank, bytes(data)))

    def send_pyobj(self, obj: Any, flags: int = 0, protocol: int = 0) -> None:
        import pickle

        self.log.append((self.rank, pickle.dumps(obj, protocol)))


class Snapshots:
    """A load snapshot reader with loads the test sets."""

    def __init__(self, make: Any) -> None:
        self.make, self.loads = make, {}

    def set(self, rank: int, **fields: Any) -> None:
        self.loads[rank] = self.make(dp_rank=rank, timestamp=time.time(), **fields)

    def read_all(self) -> list[Any]:
        return list(self.loads.values())


def controller(sgl: Any, log: list[tuple[int, bytes]], kv_events: str | None) -> Any:
    dpc, _, snapshot, _ = sgl
    c = dpc.DataParallelController.__new__(dpc.DataParallelController)
    c.workers = [Socket(r, log) for r in range(DP)]
    c.launch_dp_size = DP
    c.max_dp_size = DP
    c.dp_active = [True] * DP
    c.status = [True] * DP
    c._active_workers = list(range(DP))
    c._active_count_cache = DP
    c.round_robin_counter = 0
    c.load_balance_method = dpc.LoadBalanceMethod.ROUND_ROBIN
    c.dispatching = c.round_robin_scheduler
    c.load_snapshot_reader = Snapshots(snapshot)
    c.server_args = type("Args", (), {"kv_events_config": kv_events, "page_size": PAGE,
                                      "dp_size": DP})()
    return c


def request(sgl: Any, rid: str, tokens: list[int], **kw: Any) -> Any:
    _, make, _, sampling = sgl
    return make(
        input_text=None, input_ids=array("q", tokens), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=sampling(), return_logprob=False,
        logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False,
        rid=rid, **kw,
    )


def stored(tokens: list[int], first_hash: int) -> bytes:
    n = len(tokens) // PAGE
    hashes = np.arange(first_hash, first_hash + n, dtype=np.uint64)
    event = BlockStored(hashes, None, np.array(tokens, np.uint32), PAGE, medium="GPU")
    return sglang.encode_batch(EventBatch(time.time(), [event], 0), version="0.5.23")


@pytest.fixture
def fleet(sgl: Any) -> Iterator[tuple[Any, list[ZmqPublisher], list[tuple[int, bytes]]]]:
    base = free_port_block(DP)
    pubs = [ZmqPublisher(f"tcp://127.0.0.1:{base + r}", bind=True) for r in range(DP)]
    log: list[tuple[int, bytes]] = []
    c = controller(sgl, log, f'{{"publisher": "zmq", "endpoint": "tcp://*:{base}"}}')
    d = D.install(c, c.server_args, policy="default", stale_after=0.5)
    time.sleep(0.3)  # the SUB sockets' connect (ZeroMQ drops what a late joiner misses)
    try:
        yield c, pubs, log
    finally:
        before = threading.active_count()
        t0 = time.monotonic()
        d.close(timeout=5.0)
        for p in pubs:
            p.close()
        assert time.monotonic() - t0 < 6.0
        assert threading.active_count() < before or threading.active_count() <= before


def wait_held(c: Any, rank: int, tokens: int) -> None:
    d = c.radixmeta_dispatcher
    worker = d.workers[rank]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if d.router.tree.held_tokens(worker) >= tokens:
            return
        time.sleep(0.01)
    msg = f"rank {rank} never reported {tokens} tokens"
    raise AssertionError(msg)


# 2,048 tokens: long enough that the default policy's prefill model prices a miss
# above a rotation (a 64-token prompt costs about the same anywhere).
PREFIX = list(range(1000, 3048))


def test_shared_prefix_goes_to_its_holder_within_the_load_bound(fleet: Any, sgl: Any) -> None:
    c, pubs, log = fleet
    pubs[2].publish(stored(PREFIX, 1))
    wait_held(c, 2, len(PREFIX))
    for r in range(DP):
        c.load_snapshot_reader.set(r, num_running_reqs=1)
    for i in range(4):
        c.dispatching(request(sgl, f"a{i}", [*PREFIX, i, i, i, i]))
    assert [rank for rank, _ in log] == [2, 2, 2, 2]
    # The holder reports a queue much longer than recomputing the prefix elsewhere:
    # the default policy's bound, so the next request spills.
    c.load_snapshot_reader.set(2, num_running_reqs=8, num_waiting_reqs=40,
                               num_waiting_uncached_tokens=200_000)
    c.radixmeta_dispatcher.refresh(force=True)
    c.dispatching(request(sgl, "spill", [*PREFIX, 9, 9, 9, 9]))
    assert log[-1][0] != 2
    m = c.radixmeta_dispatcher.metrics()
    assert m["routed"] == 5 and m["mean_overhead_us"] > 0


def test_routed_dp_rank_passes_through(fleet: Any, sgl: Any) -> None:
    c, pubs, log = fleet
    pubs[0].publish(stored(PREFIX, 1))
    wait_held(c, 0, len(PREFIX))
    c.dispatching(request(sgl, "pinned", PREFIX, routed_dp_rank=1))
    assert [rank for rank, _ in log] == [1]
    assert c.radixmeta_dispatcher.counts["passthrough"] == 1
    with pytest.raises(ValueError, match="DP rank 7 is not active"):
        c.dispatching(request(sgl, "bad", PREFIX, routed_dp_rank=7))


def test_a_silent_rank_is_stale_and_gets_least_loaded_fallback(fleet: Any, sgl: Any) -> None:
    c, pubs, log = fleet
    d = c.radixmeta_dispatcher
    pubs[1].publish(stored(PREFIX, 1))
    wait_held(c, 1, len(PREFIX))
    for r in range(DP):
        c.load_snapshot_reader.set(r, num_running_reqs=2)
    c.dispatching(request(sgl, "s0", [*PREFIX, 1, 2, 3, 4]))
    assert log[-1][0] == 1
    time.sleep(0.7)  # rank 1 publishes nothing for the request: its events stopped
    d.refresh(force=True)
    assert d.stale == [False, True, False]
    # Rank 1 is no longer chosen for its cache; it is the least loaded now, so it
    # takes the fallback; once loaded, the fresh ranks take requests by the policy.
    c.load_snapshot_reader.set(1, num_running_reqs=0)
    d.refresh(force=True)
    c.dispatching(request(sgl, "s1", [*PREFIX, 5, 6, 7, 8]))
    assert log[-1][0] == 1 and d.counts["stale_fallback"] == 1
    c.load_snapshot_reader.set(1, num_running_reqs=9)
    d.refresh(force=True)
    c.dispatching(request(sgl, "s2", [*PREFIX, 5, 6, 7, 9]))
    assert log[-1][0] in (0, 2)
    # Events again: the rank is fresh.
    pubs[1].publish(stored([7] * 8, 10_000))
    deadline = time.monotonic() + 10
    while d.stale[1] and time.monotonic() < deadline:
        time.sleep(0.02)
        d.refresh(force=True)
    assert not d.stale[1]


def test_disabled_is_sglangs_round_robin_byte_for_byte(
    sgl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.delenv(D.ENABLE_ENV, raising=False)
    from radixmeta.integrations.sglang import register

    register()  # the entry point, switch off: no hook
    assert D.CONTROLLER_TARGET not in HookRegistry._hooks
    reqs = [request(sgl, f"r{i}", PREFIX[: 8 + i]) for i in range(7)]
    reqs[3].routed_dp_rank = 2
    logs = []
    for hooked in (False, True):
        log: list[tuple[int, bytes]] = []
        c = controller(sgl, log, None)
        if hooked:  # what the AFTER hook does with the switch off
            D._after_init(None, c)
        for r in reqs:
            c.dispatching(r)
        logs.append(log)
        assert not hasattr(c, "radixmeta_dispatcher")
    assert logs[0] == logs[1]
    assert [rank for rank, _ in logs[0]] == [0, 1, 2, 2, 0, 1, 2]


def test_switch_and_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixmeta.errors import PolicyError, UnsupportedConfigurationError

    assert D.enabled_policy({}) is None
    assert D.enabled_policy({D.ENABLE_ENV: "0"}) is None
    assert D.enabled_policy({D.ENABLE_ENV: "1"}) == "default"
    assert D.enabled_policy({D.ENABLE_ENV: "cache_aware"}) == "cache_aware"
    with pytest.raises(PolicyError, match="names no policy"):
        D.enabled_policy({D.ENABLE_ENV: "nope"})
    with pytest.raises(UnsupportedConfigurationError, match="--kv-events-config"):
        D.event_endpoints(None, 2)
    with pytest.raises(UnsupportedConfigurationError, match="publisher"):
        D.event_endpoints('{"publisher": "null"}', 2)
    live, replay, topic = D.event_endpoints(
        '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600",'
        ' "topic": "kv"}', 3)
    assert live == ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5559"]
    assert replay == ["tcp://127.0.0.1:5600", "tcp://127.0.0.1:5601", "tcp://127.0.0.1:5602"]
    assert topic == b"kv"


def test_lora_requests_match_the_pages_their_adapter_stored(sgl: Any) -> None:
    # Events name a --lora-paths adapter by lora_name; requests carry its lora_id, the
    # deterministic id SGLang gives those adapters. Any other id is published without a
    # name, so it matches the base model's pages, as the events say.
    from sglang.srt.lora.lora_registry import LoRARef

    args = type("Args", (), {"lora_paths": ["sql=/adapters/sql", "/adapters/chat"]})()
    names = D.lora_names(args)
    sql = LoRARef.deterministic_id("sql", "/adapters/sql")
    assert names == {sql: "sql", LoRARef.deterministic_id("/adapters/chat", "/adapters/chat"):
                     "/adapters/chat"}
    assert D.lora_names(type("Args", (), {"lora_paths": None})()) == {}

    base = free_port_block(DP)
    pubs = [ZmqPublisher(f"tcp://127.0.0.1:{base + r}", bind=True) for r in range(DP)]
    log: list[tuple[int, bytes]] = []
    c = controller(sgl, log, f'{{"publisher": "zmq", "endpoint": "tcp://*:{base}"}}')
    c.server_args.lora_paths = args.lora_paths
    d = D.install(c, c.server_args, policy="longest_prefix")
    try:
        time.sleep(0.3)
        n = len(PREFIX) // PAGE
        event = BlockStored(np.arange(1, n + 1, dtype=np.uint64), None,
                            np.array(PREFIX, np.uint32), PAGE, medium="GPU", lora_name="sql")
        pubs[1].publish(sglang.encode_batch(EventBatch(time.time(), [event], 0),
                                            version="0.5.23"))
        deadline = time.monotonic() + 10
        while d.router.tree.held_tokens(d.workers[1]) < len(PREFIX):
            assert time.monotonic() < deadline, "rank 1 never reported its adapter's pages"
            time.sleep(0.01)
        c.dispatching(request(sgl, "sql", [*PREFIX, 1], lora_id=sql))
        assert log[0][0] == 1  # the adapter's own pages
        assert d.router.metrics()["decisions"] == {"affinity": 1}
        c.dispatching(request(sgl, "other", [*PREFIX, 3], lora_id="f" * 32))
        # Not the adapter's pages: nothing in the base namespace matched.
        assert d.router.metrics()["decisions"] == {"affinity": 1, "balance": 1}
        salted = request(sgl, "s", PREFIX, lora_id=sql, cache_salt="t1")
        assert D._namespace(salted, names) == "lora:sql|salt:t1"
        assert D._namespace(request(sgl, "o", PREFIX, lora_id="f" * 32), names) is None
    finally:
        d.close(timeout=5.0)
        for p in pubs:
            p.close()


def test_dispatch_never_waits_on_a_dead_replay_socket(sgl: Any) -> None:
    """Rank 0's replay endpoint is a port nothing listens on: the repair of its gap waits
    out the router's replay timeout (1 s) on a repair thread, while the controller's
    dispatches go on at once against what the router holds (issue 18: one dispatch
    blocked 953 ms when the repair ran under the router's lock)."""
    base, dead = free_port_block(DP), free_port_block(DP)
    pubs = [ZmqPublisher(f"tcp://127.0.0.1:{base + r}", bind=True) for r in range(DP)]
    log: list[tuple[int, bytes]] = []
    c = controller(sgl, log, f'{{"publisher": "zmq", "endpoint": "tcp://*:{base}", '
                             f'"replay_endpoint": "tcp://*:{dead}"}}')
    d = D.install(c, c.server_args, policy="default", stale_after=5.0)
    try:
        time.sleep(0.3)  # the SUB sockets' connect
        pubs[0].publish(stored(PREFIX, 1))
        wait_held(c, 0, len(PREFIX))
        pubs[0].publish(b"\xc1 not a batch")  # dropped and counted: the next shows a gap
        pubs[0].publish(stored([5] * 8, 50_000))

        def repairing() -> bool:
            return bool(d.router.health()["workers"][0]["repairing"])

        deadline = time.monotonic() + 10
        while not repairing():
            assert time.monotonic() < deadline, "the repair never started"
            time.sleep(0.005)
        for r in range(DP):
            c.load_snapshot_reader.set(r, num_running_reqs=1)
        started = time.monotonic()
        for i in range(5):
            c.dispatching(request(sgl, f"r{i}", [*PREFIX, i, i, i, i]))
        took = time.monotonic() - started
        assert repairing()  # the repair still waits on the dead socket...
        assert took < 0.3, took  # ...and five dispatches did not (each would wait ~1 s)
        assert [rank for rank, _ in log] == [0] * 5  # rank 0's pages, held meanwhile
    finally:
        started = time.monotonic()
        d.close(timeout=5.0)
        for p in pubs:
            p.close()
        assert time.monotonic() - started < 2.0  # closed mid-repair
