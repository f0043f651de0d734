"""The worker-side event log: both cores record alike, and replaying a cache's log into an
empty MetaTree reproduces what the cache holds (the A.4 eviction-log design)."""

from __future__ import annotations

import contextlib
import pickle
import random
from typing import Any

import numpy as np
import pytest
from conftest import META_CORES, NATIVE, REFERENCE, require_native

from radixmeta import _reference
from radixmeta._hashing import chain_hashes, sglang_hashes
from radixmeta._records import Cleared, Removed, Stored
from radixmeta.errors import CacheFullError, InputTypeError, InvalidInputError, LogTruncatedError

LOG_CORES = {"reference": (REFERENCE.EventLogCore, REFERENCE.CacheCore)}
if NATIVE is not None:
    LOG_CORES["native"] = (NATIVE.EventLogCore, NATIVE.CacheCore)


@pytest.fixture(params=list(LOG_CORES))
def log_impl(request: pytest.FixtureRequest) -> tuple[type, type]:
    """(EventLogCore, CacheCore) of one backend."""
    return LOG_CORES[request.param]


def drive(cache: Any, rng: random.Random, steps: int, vocab: int = 3) -> None:
    """Random serving-like traffic: inserts over shared stems, matches, evictions, resets."""
    stems = [[rng.randrange(vocab) for _ in range(rng.randrange(4, 40))] for _ in range(4)]
    for _ in range(steps):
        roll = rng.random()
        key = rng.choice(stems)[: rng.randrange(41)] + [rng.randrange(vocab)] * rng.randrange(6)
        if roll < 0.55:
            with contextlib.suppress(CacheFullError):  # a key longer than the capacity allows
                cache.insert(key)
        elif roll < 0.75:
            cache.match_prefix(key)
        elif roll < 0.97:
            cache.evict(rng.randrange(1, 12))
        else:
            cache.reset()


def apply(tree: Any, worker: Any, record: Any) -> None:
    """Replay one record into a MetaTree (token-path or block form)."""
    if isinstance(record, Cleared):
        tree.apply_cleared(worker)
    elif record.form == "path":
        op = tree.insert if isinstance(record, Stored) else tree.remove
        op(record.key, worker, start=record.start)
    elif isinstance(record, Stored):
        tree.apply_stored(worker, record.parent_hash, record.block_hashes, record.token_ids)
    else:
        tree.apply_removed(worker, record.block_hashes)


@pytest.mark.parametrize("form", ["path", "blocks"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("meta_name", list(META_CORES))
def test_replaying_the_log_reproduces_the_cache(
    log_impl: tuple[type, type], meta_name: str, form: str, page_size: int, rng: Any
) -> None:
    log_cls, cache_cls = log_impl
    log = log_cls(capacity=10**6, form=form, worker="w")
    cache = cache_cls(page_size, capacity=rng.choice([None, 40 * page_size]), event_log=log)
    tree = META_CORES[meta_name](page_size)
    w = tree.add_worker("w")
    seen = -1
    for _ in range(6):
        drive(cache, rng, 60, vocab=3 if page_size == 1 else 2)
        for record in log.read(after=seen):
            apply(tree, w, record)
            seen = record.seq
        tree.check()
        for _ in range(40):
            stem = [rng.randrange(3 if page_size == 1 else 2) for _ in range(rng.randrange(60))]
            query = np.array(stem, dtype=np.uint32)
            assert (
                tree.match(query).length_of(w)
                == cache_cls.match_prefix(cache, query, values=False).length
            )
        assert tree.held_tokens(w) == cache.total_size


def test_both_cores_record_alike(rng: Any) -> None:
    if NATIVE is None:
        pytest.skip("the native core is not built")
    seed = rng.randrange(2**32)
    outs = []
    for log_cls, cache_cls in (LOG_CORES["native"], LOG_CORES["reference"]):
        for form in ("path", "blocks"):
            log = log_cls(capacity=500, form=form, worker="w", dp_rank=2)
            cache = cache_cls(2, capacity=50, event_log=log)
            drive(cache, random.Random(seed), 300)
            outs.append((form, log.read(), cache.snapshot(), log.next_seq, log.oldest_seq))
    assert outs[:2] == outs[2:]


@pytest.mark.parametrize(
    ("capacity", "max_tokens"), [(1, 1), (3, 8), (6, 30), (40, 24), (300, 90), (65536, 2**22)]
)
@pytest.mark.parametrize("page_size", [1, 2])
def test_both_cores_record_alike_in_small_rings(
    rng: Any, capacity: int, max_tokens: int, page_size: int
) -> None:
    """The native ring shares path tokens between records and wraps its buffer; in rings
    small enough that both happen all the time, every record still equals the reference's,
    read as it comes and re-read later (records that outlived what they once named)."""
    if NATIVE is None:
        pytest.skip("the native core is not built")
    seed, cache_capacity = rng.randrange(2**32), rng.choice([None, 60])
    runs = []
    for log_cls, cache_cls in (LOG_CORES["native"], LOG_CORES["reference"]):
        log = log_cls(capacity=capacity, max_tokens=max_tokens, worker="w")
        cache = cache_cls(page_size, capacity=cache_capacity, event_log=log)
        driver, reads = random.Random(seed), []
        for _ in range(60):
            drive(cache, driver, 15, vocab=2)
            reads.append((log.read(), log.held_tokens, log.oldest_seq, log.next_seq))
            after = driver.randrange(log.oldest_seq - 1, log.next_seq)
            reads.append(log.read(after=after, max_records=driver.randrange(1, 5)))
        runs.append(reads)
    assert runs[0] == runs[1]


def test_records_are_numbered_and_bounded(log_impl: tuple[type, type]) -> None:
    log_cls, cache_cls = log_impl
    log = log_cls(capacity=3, worker="w")
    cache = cache_cls(event_log=log)
    for i in range(5):
        cache.insert([i, i])
    assert (len(log), log.oldest_seq, log.next_seq) == (3, 2, 5)
    assert [r.seq for r in log.read()] == [2, 3, 4]
    assert [r.seq for r in log.read(after=2, max_records=1)] == [3]
    assert log.read(after=4) == []
    with pytest.raises(LogTruncatedError, match=r"records 1 to 1 were dropped") as info:
        log.read(after=0)
    assert info.value.oldest_seq == 2
    assert pickle.loads(pickle.dumps(info.value)).oldest_seq == 2


def test_a_truncated_consumer_resyncs_from_the_snapshot(log_impl: tuple[type, type]) -> None:
    log_cls, cache_cls = log_impl
    log = log_cls(capacity=4, worker="w")
    cache = cache_cls(capacity=12, event_log=log)
    tree = _reference.MetaCore()
    w = tree.add_worker("w")
    drive(cache, random.Random(7), 80)
    cache.insert([9, 9, 9])
    cache.insert([9, 8])
    with pytest.raises(LogTruncatedError):
        log.read(after=0)
    snapshot = cache.snapshot()
    assert {r.seq for r in snapshot} == {log.next_seq - 1}
    tree.apply_cleared(w)
    for record in snapshot:
        apply(tree, w, record)
    drive(cache, random.Random(8), 3)
    for record in log.read(after=snapshot[0].seq):
        apply(tree, w, record)
    assert tree.held_tokens(w) == cache.total_size
    for key, _ in cache.items():
        assert tree.match(key).length_of(w) == len(key)


def test_namespaces_in_records_survive_id_recycling(log_impl: tuple[type, type]) -> None:
    """A namespace emptied and forgotten by the cache keeps its name in older records."""
    log_cls, cache_cls = log_impl
    log = log_cls(capacity=1000, worker="w")
    cache = cache_cls(capacity=4, event_log=log)
    for user in range(50):  # each salt evicts the previous one
        cache.insert([1, 2, 3, 4], namespace=f"salt-{user}")
    stored = [r.namespace for r in log.read() if isinstance(r, Stored)]
    removed = [r.namespace for r in log.read() if isinstance(r, Removed)]
    assert stored == [f"salt-{u}" for u in range(50)]
    assert removed == [f"salt-{u}" for u in range(49)]
    assert cache.namespaces() == [None, "salt-49"]


def test_block_records_use_the_chosen_hash(log_impl: tuple[type, type]) -> None:
    log_cls, cache_cls = log_impl
    path = np.array([151644, 872, 198, 9064, 374, 279, 6722, 315], dtype=np.uint32)
    for scheme, expected in (
        (None, chain_hashes(path, 4)),
        ("chain", chain_hashes(path, 4)),
        ("sglang", sglang_hashes(path, 4)),
        (lambda tokens, page: np.arange(len(tokens) // page) + 7, [7, 8]),
    ):
        log = log_cls(form="blocks", hash=scheme, worker="w")
        cache = cache_cls(4, event_log=log)
        cache.insert(path[:4])
        cache.insert(path)
        first, second = log.read()
        assert first.block_hashes.tolist() == [int(expected[0])]
        assert (second.parent_hash, second.block_hashes.tolist()) == (
            int(expected[0]),
            [int(expected[1])],
        )
        assert second.token_ids.tolist() == path[4:].tolist()
    # SGLang's own check vector (reference note, section 5.3), published signed.
    signed = [h - 2**64 if h >= 2**63 else h for h in sglang_hashes(path, 4).tolist()]
    assert signed == [-1944566869021170841, 9056173362842263460]


def test_a_hash_callable_may_take_the_namespace(log_impl: tuple[type, type]) -> None:
    """A scheme that accepts ``namespace`` is told each record's; a two-argument one is not."""
    log_cls, cache_cls = log_impl
    seen: list[Any] = []

    def by_namespace(tokens: Any, page: int, *, namespace: Any) -> np.ndarray:
        seen.append(namespace)
        return np.arange(len(tokens) // page, dtype=np.uint64) + (100 if namespace else 0)

    def with_kwargs(tokens: Any, page: int, **kwargs: Any) -> np.ndarray:
        seen.append(kwargs)
        return np.zeros(len(tokens) // page, dtype=np.uint64)

    log = log_cls(form="blocks", hash=by_namespace, worker="w")
    assert log.hash is by_namespace
    cache = cache_cls(2, event_log=log)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4], namespace="salt:a")
    cache.evict(100)
    records = log.read()
    assert seen == [None, "salt:a", None, "salt:a"]
    assert [r.block_hashes.tolist() for r in records] == [[0, 1], [100, 101], [0, 1], [100, 101]]
    assert [r.block_hashes.tolist() for r in cache.snapshot()] == []
    seen.clear()
    log = log_cls(form="blocks", hash=with_kwargs, worker="w")
    cache = cache_cls(2, event_log=log)
    cache.insert([5, 6], namespace=7)
    log.read()
    assert seen == [{"namespace": 7}]


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"capacity": 0}, InvalidInputError, "capacity must be >= 1, got 0"),
        ({"form": "tokens"}, InvalidInputError, "form must be 'path' or 'blocks', got 'tokens'"),
        ({"hash": "sglang"}, InvalidInputError, "hash= applies to form='blocks' only"),
        (
            {"form": "blocks", "hash": "md5"},
            InvalidInputError,
            "hash must be 'chain', 'sglang' or a callable, got 'md5'",
        ),
        (
            {"form": "blocks", "hash": 5},
            InputTypeError,
            "hash must be 'chain', 'sglang' or a callable, got int",
        ),
        ({"worker": 3}, InputTypeError, "worker must be a str, got int"),
        ({"dp_rank": -1}, InvalidInputError, "dp_rank must be >= 0, got -1"),
    ],
)
def test_bad_log_arguments(
    log_impl: tuple[type, type], kwargs: dict[str, Any], exc: type, message: str
) -> None:
    with pytest.raises(exc, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        log_impl[0](**kwargs)


def test_bad_uses_of_a_log(log_impl: tuple[type, type]) -> None:
    log_cls, cache_cls = log_impl
    log = log_cls(worker="w")
    cache_cls(event_log=log)
    with pytest.raises(InvalidInputError, match="already attached"):
        cache_cls(event_log=log)
    with pytest.raises(InputTypeError, match="event_log must be an EventLog or None, got str"):
        cache_cls(event_log="log")
    with pytest.raises(InvalidInputError, match="snapshot\\(\\) needs an event log"):
        cache_cls().snapshot()
    with pytest.raises(InvalidInputError, match="after must be >= -1, got -2"):
        log.read(after=-2)
    with pytest.raises(TypeError, match="cannot pickle"):
        pickle.dumps(log)
    wrong = log_cls(form="blocks", hash=lambda tokens, page: [1], worker="w")
    cache = cache_cls(event_log=wrong)
    cache.insert([1, 2])
    with pytest.raises(InvalidInputError, match="must return 2 integer hashes"):
        wrong.read()


def test_no_log_costs_no_records(log_impl: tuple[type, type]) -> None:
    """A cache built without a log has none, and a log outlives its cache safely."""
    log_cls, cache_cls = log_impl
    assert cache_cls().event_log is None
    log = log_cls(worker="w")
    cache = cache_cls(event_log=log)
    cache.insert([1, 2, 3])
    assert cache.event_log is log
    del cache
    assert [r.kind for r in log.read()] == ["stored"]


def test_the_ring_is_bounded_by_tokens_too(log_impl: tuple[type, type]) -> None:
    log_cls, cache_cls = log_impl
    log = log_cls(capacity=100, max_tokens=10, worker="w")
    cache = cache_cls(event_log=log)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4, 5, 6])  # paths of 4 and 6 tokens: 10 held
    assert (len(log), log.held_tokens, log.max_tokens) == (2, 10, 10)
    cache.insert([7, 7])  # 12 > 10: the oldest record goes
    assert ([r.seq for r in log.read()], log.held_tokens) == ([1, 2], 8)
    cache.insert(list(range(50)))  # longer than the bound alone: the newest always stays
    assert [r.seq for r in log.read()] == [3]


def test_native_chain_hashes_are_the_reference_chain() -> None:
    """radixmeta._core.native_chain_hashes: the default block chain, computed in C++."""
    core = require_native()
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 2**32, size=50, dtype=np.uint32)
    for page in (1, 4, 7):
        got = core.native_chain_hashes(tokens, page)
        assert got.tolist() == chain_hashes(tokens, page).tolist()
    assert core.native_chain_hashes(tokens[:0], 2).tolist() == []
    with pytest.raises(InvalidInputError, match="tokens must be a 1-D uint32 array"):
        core.native_chain_hashes(tokens.astype(np.int64), 2)
