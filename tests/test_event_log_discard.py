"""``EventLog.discard(through_seq)``: a producer drops what every reader has applied.

Both cores drop alike; bad sequence numbers are refused before any change; a read
from before what was discarded says so (``LogTruncatedError``, the snapshot path),
never returning less in silence.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from conftest import NATIVE, REFERENCE

from radixmeta import EventLog, MetaTree, RadixCache
from radixmeta.errors import InputTypeError, InvalidInputError, LogTruncatedError
from radixmeta.events import LogSource, Replayer, Unavailable

LOG_CORES = {"reference": (REFERENCE.EventLogCore, REFERENCE.CacheCore)}
if NATIVE is not None:
    LOG_CORES["native"] = (NATIVE.EventLogCore, NATIVE.CacheCore)


@pytest.fixture(params=["reference", "native"])
def log_impl(request: pytest.FixtureRequest) -> tuple[type, type]:
    """(EventLogCore, CacheCore) of one backend."""
    if request.param not in LOG_CORES:
        from conftest import require_native

        require_native()
    return LOG_CORES[request.param]


def state(log: Any) -> tuple[Any, ...]:
    return (len(log), log.oldest_seq, log.next_seq, log.held_tokens, log.read())


def filled(log_impl: tuple[type, type], n: int = 6, **kw: Any) -> tuple[Any, Any]:
    log_cls, cache_cls = log_impl
    log = log_cls(worker="w", **kw)
    cache = cache_cls(event_log=log)
    for i in range(n):
        cache.insert([i, i, i])
    return log, cache


def test_discard_drops_through_the_seq(log_impl: tuple[type, type]) -> None:
    log, _ = filled(log_impl)
    assert log.discard(2) == 3
    assert (len(log), log.oldest_seq, log.next_seq, log.held_tokens) == (3, 3, 6, 9)
    assert [r.seq for r in log.read()] == [3, 4, 5]
    assert [r.seq for r in log.read(after=2)] == [3, 4, 5]
    assert log.discard(5) == 3
    assert (len(log), log.oldest_seq, log.next_seq, log.held_tokens) == (0, 6, 6, 0)
    assert log.read() == [] and log.read(after=5) == []


def test_discard_of_nothing_or_again_drops_nothing(log_impl: tuple[type, type]) -> None:
    log, _ = filled(log_impl)
    assert log.discard(-1) == 0
    assert log.discard(3) == 4
    before = state(log)
    assert log.discard(3) == 0  # a second reader at the same place
    assert log.discard(1) == 0  # one further behind
    assert state(log) == before


@pytest.mark.parametrize("through", [6, 7, 2**64])
def test_a_seq_not_written_yet_is_refused_unchanged(
    log_impl: tuple[type, type], through: int
) -> None:
    log, _ = filled(log_impl)
    before = state(log)
    with pytest.raises(InvalidInputError, match=rf"through_seq {through} names a record not "
                       r"written yet \(the newest is 5\)"):
        log.discard(through)
    assert state(log) == before


def test_an_empty_log_refuses_any_seq(log_impl: tuple[type, type]) -> None:
    log = log_impl[0]()
    assert log.discard(-1) == 0
    with pytest.raises(InvalidInputError, match=r"\(no record yet\)"):
        log.discard(0)


@pytest.mark.parametrize(
    ("through", "error"),
    [(-2, InvalidInputError), (1.0, InputTypeError), ("3", InputTypeError),
     (True, InputTypeError), (None, InputTypeError)],
)
def test_bad_seqs_are_refused_unchanged(
    log_impl: tuple[type, type], through: Any, error: type
) -> None:
    log, _ = filled(log_impl)
    before = state(log)
    with pytest.raises(error, match="through_seq"):
        log.discard(through)
    assert state(log) == before


def test_a_read_from_before_the_discarded_says_so(log_impl: tuple[type, type]) -> None:
    log, _ = filled(log_impl)
    log.discard(3)
    with pytest.raises(LogTruncatedError, match=r"records 2 to 3 were dropped .* or discarded; "
                       r"resync from the cache's snapshot\(\)") as info:
        log.read(after=1)
    assert info.value.oldest_seq == 4


def test_records_after_a_discard_are_still_whole(log_impl: tuple[type, type]) -> None:
    """Later records through nodes whose first records went still spell their paths."""
    log_cls, cache_cls = log_impl
    log = log_cls(worker="w")
    cache = cache_cls(event_log=log)
    stem = list(range(100, 140))
    cache.insert(stem + [1] * 10)
    log.discard(log.next_seq - 1)
    cache.insert(stem + [2] * 10)
    cache.evict(10)
    got = [(r.kind, r.key.tolist(), r.start) for r in log.read()]
    assert got[0] == ("stored", stem + [2] * 10, 40)
    assert got[1][0] == "removed" and got[1][2] == 40


def test_both_cores_discard_alike(rng: Any) -> None:
    """Random traffic, reads and discards in small rings: the native ring (which shares
    tokens between records) gives every record the reference gives."""
    if NATIVE is None:
        pytest.skip("the native core is not built")
    seed = rng.randrange(2**32)
    runs = []
    for log_cls, cache_cls in (LOG_CORES["native"], LOG_CORES["reference"]):
        driver = random.Random(seed)
        log = log_cls(capacity=40, max_tokens=200, worker="w")
        cache = cache_cls(2, capacity=60, event_log=log)
        stems = [[driver.randrange(3) for _ in range(driver.randrange(8, 30))] for _ in range(3)]
        out = []
        for _ in range(400):
            roll = driver.random()
            key = driver.choice(stems)[: driver.randrange(31)] + [driver.randrange(3)] * 3
            if roll < 0.5:
                if len(key) - len(key) % 2 <= 60:
                    cache.insert(key)
            elif roll < 0.7:
                cache.evict(driver.randrange(1, 10))
            elif roll < 0.9:
                through = driver.randrange(max(-1, log.oldest_seq - 2), log.next_seq)
                out.append(log.discard(through))
            else:
                out.append(state(log))
        out.append(state(log))
        runs.append(out)
    assert runs[0] == runs[1]


def test_the_native_ring_stays_small_when_discarded() -> None:
    """A log whose reader keeps up holds nothing between reads, however long the run."""
    if NATIVE is None:
        pytest.skip("the native core is not built")
    log = EventLog(max_tokens=2**26)
    cache = RadixCache(event_log=log)
    rng = np.random.default_rng(3)
    for _ in range(300):
        cache.insert(rng.integers(0, 50_000, 2_000))
        cache.evict(1_000)
        log.read(after=log.oldest_seq - 1)
        log.discard(log.next_seq - 1)
        assert len(log) == 0 and log.held_tokens == 0
    assert log.next_seq > 300


def test_a_replayer_heals_a_gap_into_discarded_records() -> None:
    """A reader that missed discarded records gets ``Unavailable`` from the log, then the
    cache's snapshot: the meta-tree ends as the cache is."""
    log = EventLog(worker="w0")
    cache = RadixCache(4, event_log=log)
    tree = MetaTree(4)
    w = tree.add_worker("w0")
    source = LogSource({("w0", 0): cache})
    with Replayer(tree, source=source) as replayer:
        for k in range(5):
            cache.insert([k, k, k, k, 9, 9, 9, 9])
        replayer.submit(log.read()[:2])
        replayer.replay()
        log.discard(log.next_seq - 1)  # the producer believed every reader had applied it
        assert isinstance(source.replay("w0", 0, 2), Unavailable)
        cache.insert([7, 7, 7, 7])
        replayer.submit(log.read())  # seq 5 after 1: a gap the log cannot fill
        stats = replayer.replay()
        assert stats.gaps == 1
        assert tree.held_tokens(w) == cache.total_size
        for key, _ in cache.items():
            assert tree.match(key, optimistic=False).length_of(w) == len(key)


# -- the simulator's workers discard what the router applied ---------------------------------
def _sim_worker(records: bool = True) -> Any:
    from radixmeta.sim.worker import BatchLimits, SimWorker

    w = SimWorker(
        "w0", 4, 10_000, lambda e, c: 0.001 * e, lambda b, c: 0.001, BatchLimits(),
        records=records,
    )
    prompts = [np.arange(k, k + 64, dtype=np.uint32) for k in range(0, 300, 30)]
    w.bind(prompts, [1] * len(prompts), [1] * len(prompts))
    w.waiting.extend(range(len(prompts)))
    return w


def test_a_sim_worker_keeps_no_values_and_drops_applied_records() -> None:
    w = _sim_worker()
    assert w.cache.store_values is False
    admitted = w.admit([0] * 10)
    assert admitted is not None
    w.finish_prefill(admitted[0])
    records = w.new_records()
    assert records and len(w.log) == len(records)
    w.applied(records[-1].seq)
    assert len(w.log) == 0 and w.log.held_tokens == 0
    assert w.new_records() == []  # nothing new, and nothing lost to the reader
    w.check_drained()


def test_a_sim_worker_without_a_reader_keeps_no_log() -> None:
    w = _sim_worker(records=False)
    assert w.log is None and w.cache.event_log is None
    admitted = w.admit([0] * 10)
    assert admitted is not None
    w.finish_prefill(admitted[0])
    assert w.new_records() == []
    w.applied(5)  # nothing to drop
