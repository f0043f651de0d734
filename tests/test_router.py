"""The Router: dispatch, loads, the optimistic overlay, modes, errors, metrics, threads.

Policies are the small ones of ``tests/_policies.py``, so every test states exactly what
it routes by; a few run the built-in ones by name.
"""

from __future__ import annotations

import array
import re
import threading
from typing import Any

import numpy as np
import pytest
from _policies import BatchFirst, First, LeastLoaded, Longest, Named, Recorder, Returns
from prometheus_client.parser import text_string_to_metric_families

from radixmeta import EventLog, RadixCache, Router, WorkerId, policies
from radixmeta.errors import (
    DuplicateRequestError,
    DuplicateWorkerError,
    InputTypeError,
    InvalidInputError,
    NoWorkerError,
    PolicyError,
    RadixMetaError,
    RouterClosedError,
    StaleWorkerError,
    UnknownRequestError,
)
from radixmeta.policies import base


class Clock:
    """An injectable clock: seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def snapshot(router: Router) -> tuple[Any, ...]:
    """Everything a failed call must leave as it was."""
    tree = router.tree
    items = [(k.tolist(), h, ns, host) for k, h, ns, _, host in tree.items()]
    loads = [router.load(w) for w in router.workers]
    m = router.metrics()
    counters = [
        {k: v for k, v in w.items() if k not in ("held_tokens", "hold_tokens")}
        for w in m["workers"]
    ]
    decisions = m["decisions"]
    return items, tree.hold_count, tree.node_count, loads, router.in_flight, counters, decisions


def prompt(*pages: int, page: int = 4) -> list[int]:
    """A prompt of whole pages, page k filled with token k."""
    return [p for p in pages for _ in range(page)]


@pytest.fixture
def router() -> Router:
    r = Router(4, policy=Longest())
    r.add_worker("a")
    r.add_worker("b")
    return r


# -- dispatch and the overlay ------------------------------------------------------------
def test_a_decision_marks_the_pages_for_its_worker_at_once(router: Router) -> None:
    a, b = router.workers
    first = router.dispatch(prompt(1, 2, 3), request_id="r1")
    assert (first.request_id, first.worker, first.matched) == ("r1", a, 0)
    assert first.lengths == {a: 0, b: 0}
    assert first.label == "affinity" and first.reason == "affinity (matched=0)"
    assert "r1" in repr(first)
    # The next request of that prefix sees the pages held by a, before any event.
    second = router.dispatch(prompt(1, 2, 9))
    assert second.worker == a and second.matched == 8 and second.lengths == {a: 8, b: 0}
    assert second.request_id.startswith("req-") and second.request_id != "r1"
    # Held optimistically, never in the reported view.
    tree = router.tree
    assert tree.match(prompt(1, 2, 3)).length_of(a) == 12
    assert tree.match(prompt(1, 2, 3), optimistic=False).length_of(a) == 0
    assert tree.held_tokens(a) == 0 and tree.dump(a) == [] and tree.hold_tokens(a) == 16
    assert router.load(a).requests == 2 and router.load(a).prefill_tokens == 12 + 4
    router.finish("r1")
    router.finish(second.request_id)
    assert tree.hold_count == 0 and tree.node_count == 0  # no event confirmed anything
    assert router.load(a) == router.load(b)
    assert router.load(a).requests == router.load(a).prefill_tokens == 0
    tree.check()


def test_event_confirmed_pages_stay_after_finish() -> None:
    router = Router(4, policy=Longest())
    a = router.add_worker("a")
    router.add_worker("b")
    log = EventLog(worker="a")
    cache = RadixCache(4, event_log=log)
    d = router.dispatch(prompt(1, 2, 3))
    assert d.worker == a
    cache.insert(prompt(1, 2))  # the engine cached two of the three pages
    router.submit(log.read())
    assert router.tree.match(prompt(1, 2, 3), optimistic=False).length_of(a) == 0
    assert router.replay().applied == 1
    assert router.tree.match(prompt(1, 2, 3), optimistic=False).length_of(a) == 8
    assert router.tree.match(prompt(1, 2, 3)).length_of(a) == 12  # the hold still covers page 3
    router.finish(d.request_id)
    assert router.tree.match(prompt(1, 2, 3)).length_of(a) == 8  # what the engine reported
    assert router.tree.hold_count == 0
    router.tree.check()


def test_the_reported_view_never_holds_a_page_no_worker_reported(rng: Any) -> None:
    router = Router(2, policy=LeastLoaded())
    workers = [router.add_worker(f"w{i}") for i in range(3)]
    open_ids: list[str] = []
    for _ in range(200):
        if open_ids and rng.random() < 0.4:
            router.finish(open_ids.pop(rng.randrange(len(open_ids))))
        else:
            key = [rng.randrange(3) for _ in range(rng.randrange(0, 12))]
            open_ids.append(router.dispatch(key).request_id)
        for w in workers:
            assert router.tree.held_tokens(w) == 0 and router.tree.dump(w) == []
        assert all(not holders for _, holders, *_ in router.tree.items())
    for rid in open_ids:
        router.finish(rid)
    assert router.tree.node_count == 0 and router.tree.hold_count == 0
    router.tree.check()


def test_views_show_the_up_workers_aligned() -> None:
    recorder = Recorder(LeastLoaded())
    router = Router(4, policy=recorder)
    a = router.add_worker("a", capacity=1000)
    b = router.add_worker("b")
    c = router.add_worker("c", capacity=500)
    router.report_load(c, queue_length=3, kv_usage=0.5, running=2)
    router.mark_down(b)
    router.dispatch(prompt(1, 2), expected_output=7, group="session-1", request_id="x")
    request, view = recorder.seen[-1]
    assert view.workers == (a, c)
    assert view.capacities == [1000, 500] and view.page_size == 4
    assert view.reported[0] is None
    report = view.reported[1]
    assert report is not None and report.at is not None  # stamped by the router's clock
    assert report == base.EngineLoad(3, 0.5, 2, report.at, 0)
    assert view.lengths == view.host_lengths == [0, 0] and view.prefix_key is None
    assert (request.request_id, request.group, request.expected_output) == ("x", "session-1", 7)
    assert request.tokens.dtype == np.uint32 and request.tokens.tolist() == prompt(1, 2)
    router.dispatch(prompt(1, 2, 5))
    _, view = recorder.seen[-1]
    assert view.lengths == [8, 0] and view.requests == [1, 0] and view.prefill_tokens == [8, 0]
    key = view.prefix_key
    router.dispatch(prompt(1, 2, 6))
    assert recorder.seen[-1][1].prefix_key == key  # the same matched prefix, the same key
    assert recorder.dispatched[0] == ("x", a, 0)


def test_decisions_follow_the_policy_and_its_reasons() -> None:
    router = Router(4, policy=First())
    a = router.add_worker("a")
    d = router.dispatch([1, 2, 3, 4])
    assert d.worker == a and d.label == d.reason == "chosen" and d.detail == ()
    assert router.metrics()["decisions"] == {"chosen": 1}


# -- loads ---------------------------------------------------------------------------------
def test_loads_move_from_prefill_to_decode_and_back_to_zero() -> None:
    clock = Clock()
    router = Router(4, policy=First(), clock=clock)
    a = router.add_worker("a")
    d1 = router.dispatch(prompt(1, 2), expected_output=10)
    d2 = router.dispatch(prompt(1, 2, 3))  # 8 tokens cached (held by d1), 4 uncached
    assert router.load(a).requests == 2 and router.load(a).prefill_tokens == 8 + 4
    router.prefill_done(d1.request_id)
    router.prefill_done(d1.request_id)  # twice: nothing more
    assert router.load(a).prefill_tokens == 4 and router.load(a).decode_tokens == 8 + 10
    router.finish(d1.request_id, output_tokens=6)
    router.prefill_done(d2.request_id)  # no expected output: the mean of the reported ones
    assert router.load(a).decode_tokens == 12 + 6
    clock.now += 30
    d3 = router.dispatch(prompt(7))
    assert router.expire(older_than=20) == [d2.request_id]
    assert router.load(a).requests == 1 and router.load(a).decode_tokens == 0
    clock.now += 30
    assert router.expire(older_than=20) == [d3.request_id]
    assert router.load(a) == router.load(a).__class__(0, 0, 0, True, None, None)
    with pytest.raises(UnknownRequestError):
        router.finish(d2.request_id)
    state = router.metrics()["workers"][0]
    assert (state["finished"], state["expired"], state["output_tokens"]) == (1, 2, 6)
    assert router.tree.hold_count == 0 and router.tree.node_count == 0


def test_engine_reports_are_checked(router: Router) -> None:
    a = router.workers[0]
    for bad in [dict(kv_usage=1.5), dict(kv_usage="x"), dict(queue_length=-1), dict(running=1.0)]:
        with pytest.raises(RadixMetaError):
            router.report_load(a, **bad)
    assert router.load(a).reported is None


# -- down workers, removals ------------------------------------------------------------------
def test_a_down_worker_is_never_chosen() -> None:
    router = Router(1, policy=Named("a"))
    a, b = router.add_worker("a"), router.add_worker("b")
    assert router.dispatch([1]).worker == a
    router.mark_down(a)
    assert router.up == (b,) and router.dispatch([1]).worker == b
    router.mark_down(b)
    before = snapshot(router)
    with pytest.raises(NoWorkerError, match="every worker is down"):
        router.dispatch([1])
    with pytest.raises(NoWorkerError):
        router.dispatch_batch([[1], [2]])
    assert snapshot(router) == before
    router.mark_up(a)
    assert router.dispatch([1]).worker == a
    assert router.load(b).requests == 1  # a down worker's requests stay counted


def test_no_worker_at_all() -> None:
    with pytest.raises(NoWorkerError, match="no worker is registered"):
        Router(policy=First()).dispatch([1, 2])


def test_removing_a_worker_drops_its_requests() -> None:
    recorder = Recorder(First())
    router = Router(2, policy=recorder)
    a = router.add_worker("a")
    b = router.add_worker("b")
    d = router.dispatch([1, 2, 3, 4])
    assert router.remove_worker(a) == 1
    assert recorder.finished == [(d.request_id, a)]
    assert router.tree.hold_count == 0 and router.in_flight == 0
    with pytest.raises(UnknownRequestError):
        router.finish(d.request_id)
    with pytest.raises(StaleWorkerError):
        router.load(a)
    assert router.dispatch([1, 2]).worker == b
    again = router.add_worker("a")  # the same index, a new id
    assert again.index == a.index and again != a and router.load(again).requests == 0


# -- errors change nothing -------------------------------------------------------------------
def test_bad_calls_raise_and_change_nothing(router: Router) -> None:
    d = router.dispatch(prompt(1, 2), request_id="live")
    gone = WorkerId("gone", 0, 7, 0)
    before = snapshot(router)
    bad: list[tuple[Any, type[Exception]]] = [
        (lambda: router.dispatch([1.5, 2.0]), InputTypeError),
        (lambda: router.dispatch(np.array([1, -1])), InvalidInputError),
        (lambda: router.dispatch(np.array([1, 2**32], dtype=np.int64)), InvalidInputError),
        (lambda: router.dispatch(np.zeros((2, 2), dtype=np.int64)), InvalidInputError),
        (lambda: router.dispatch("text"), InputTypeError),
        (lambda: router.dispatch([1], request_id=5), InputTypeError),
        (lambda: router.dispatch([1], request_id="live"), DuplicateRequestError),
        (lambda: router.dispatch([1], namespace=[]), InputTypeError),
        (lambda: router.dispatch([1, 2, 3, 4], extras=[1, 2]), InvalidInputError),
        (lambda: router.dispatch([1], expected_output=-1), InvalidInputError),
        (lambda: router.finish("nope"), UnknownRequestError),
        (lambda: router.finish("live", output_tokens=-3), InvalidInputError),
        (lambda: router.finish(7), InputTypeError),
        (lambda: router.prefill_done("nope"), UnknownRequestError),
        (lambda: router.expire(-1), InvalidInputError),
        (lambda: router.expire("soon"), InputTypeError),
        (lambda: router.mark_down(gone), StaleWorkerError),
        (lambda: router.load("a"), InputTypeError),
        (lambda: router.add_worker("a"), DuplicateWorkerError),
        (lambda: router.add_worker("c", capacity=-5), InvalidInputError),
        (lambda: router.dispatch_batch([[1], {"tokens": [2], "request_id": "live"}]),
         DuplicateRequestError),
        (lambda: router.dispatch_batch([{"tokens": [1], "request_id": "x"},
                                        {"tokens": [2], "request_id": "x"}]),
         DuplicateRequestError),
        (lambda: router.dispatch_batch([[1], {"prompt": [2]}]), InvalidInputError),
        (lambda: router.dispatch_batch([[1], [-2]]), InvalidInputError),
    ]
    for call, error in bad:
        with pytest.raises(error):
            call()
        assert snapshot(router) == before, call
    router.finish(d.request_id)
    router.tree.check()


@pytest.mark.parametrize(
    "value",
    [None, "w", WorkerId("a", 0, 0, 99), 3],
)
def test_a_policy_that_chooses_no_worker_of_its_view(value: Any) -> None:
    router = Router(1, policy=Returns(value))
    router.add_worker("a")
    before = snapshot(router)
    with pytest.raises(PolicyError, match="not one of its view's workers"):
        router.dispatch([1, 2])
    assert snapshot(router) == before


def test_a_policy_cannot_choose_a_down_worker() -> None:
    router = Router(1, policy=Returns(None))
    a = router.add_worker("a")
    router.add_worker("b")
    router.mark_down(a)
    router.policy = Returns(a)
    with pytest.raises(PolicyError):
        router.dispatch([1])
    assert router.in_flight == 0


def test_constructor_arguments_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="mode"):
        Router(policy=First(), mode="fast")
    with pytest.raises(InputTypeError, match="choose"):
        Router(policy=object())
    with pytest.raises(InvalidInputError, match="page_size"):
        Router(0, policy=First())
    with pytest.raises(InvalidInputError, match="group_ratio"):
        Router(policy=First(), group_ratio=2)


def test_policy_names_resolve_through_policies_create() -> None:
    router = Router(4, policy="least_loaded")
    router.add_worker("a")
    assert router.dispatch([1, 2, 3, 4]).worker == router.workers[0]
    assert type(router.policy) is type(policies.create("least_loaded"))
    with pytest.raises(PolicyError, match="nope"):
        Router(policy="nope")


@pytest.mark.parametrize("name", ["default", "least_loaded", "cache_aware"])
def test_builtin_policies_route(name: str) -> None:
    router = Router(4, policy=name)
    workers = [router.add_worker(f"w{i}") for i in range(4)]
    decisions = [router.dispatch(prompt(1, 2, k)) for k in range(12)]
    assert all(d.worker in workers for d in decisions)
    decisions += router.dispatch_batch([prompt(1, 2, k) for k in range(8)])
    for d in decisions:
        router.finish(d.request_id)
    assert router.tree.hold_count == 0


# -- approximate mode -----------------------------------------------------------------------
TOKEN_FORMS: dict[str, Any] = {
    "list": list,
    "tuple": tuple,
    "uint32": lambda key: np.array(key, dtype=np.uint32),
    "int32": lambda key: np.array(key, dtype=np.int32),
    "int64": lambda key: np.array(key, dtype=np.int64),
    "uint64": lambda key: np.array(key, dtype=np.uint64),
    "uint16": lambda key: np.array(key, dtype=np.uint16),
    "reversed-int64": lambda key: np.array(key[::-1], dtype=np.int64)[::-1],
    "array-I": lambda key: array.array("I", key),
    "range": lambda key: range(key[0], key[0] + len(key)),
}


@pytest.mark.parametrize("form", list(TOKEN_FORMS))
def test_every_token_form_is_converted_once_to_uint32(form: str) -> None:
    """A prompt in any form the trees take: one uint32 array for the policy and every tree
    call, the same decision as the uint32 array's."""
    key = list(range(40, 52))  # three pages, a range too
    router = Router(4, policy=(recorder := Recorder(Longest())))
    a = router.add_worker("a")
    router.add_worker("b")
    first = router.dispatch(np.array(key[:8], dtype=np.uint32))
    d = router.dispatch(TOKEN_FORMS[form](key))
    assert (d.worker, d.matched) == (a, 8) and router.load(a).prefill_tokens == 8 + 4
    tokens = recorder.seen[-1][0].tokens
    assert type(tokens) is np.ndarray and tokens.dtype == np.uint32
    assert tokens.tolist() == key
    for rid in (first.request_id, d.request_id):
        router.finish(rid)
    assert router.tree.hold_count == 0 and router.tree.node_count == 0
    # Batches convert their prompts the same way.
    [b] = router.dispatch_batch([TOKEN_FORMS[form](key)])
    assert recorder.seen[-1][0].tokens.tolist() == key
    router.finish(b.request_id)


def test_a_uint32_prompt_is_taken_without_a_copy() -> None:
    router = Router(4, policy=(recorder := Recorder(First())))
    router.add_worker("a")
    key = np.arange(8, dtype=np.uint32)
    router.dispatch(key)
    assert recorder.seen[-1][0].tokens is key
    int32 = np.arange(8, dtype=np.int32)
    router.dispatch(int32)  # converted: the request never aliases the caller's other array
    assert not np.shares_memory(recorder.seen[-1][0].tokens, int32)


@pytest.mark.parametrize(
    ("tokens", "error", "message"),
    [
        ([1, -2], InvalidInputError, "tokens[1] = -2 is outside the token range [0, 2**32)"),
        (np.array([3, -1], np.int32), InvalidInputError, "tokens[1] = -1 is outside the token"),
        (np.array([2**32], np.int64), InvalidInputError, "tokens[0] = 4294967296 is outside"),
        ([1, 2.5], InputTypeError, "tokens[1] must be an integer, got float"),
        ("text", InputTypeError, "tokens must be a sequence of integers, got str"),
        (np.zeros(2), InputTypeError, "tokens must hold integers, got dtype float64"),
        (np.zeros((2, 2), np.int64), InvalidInputError, "tokens must be 1-D"),
    ],
)
def test_bad_tokens_name_their_position(tokens: Any, error: type, message: str) -> None:
    router = Router(4, policy=First())
    router.add_worker("a")
    with pytest.raises(error, match=re.escape(message)):
        router.dispatch(tokens)
    with pytest.raises(error, match=re.escape(message)):
        router.dispatch_batch([[1, 2], tokens])
    assert router.in_flight == 0 and router.load(router.workers[0]).requests == 0


def test_approximate_mode_models_each_cache_within_its_capacity() -> None:
    router = Router(4, policy=Longest(), mode="approximate")
    with pytest.raises(InvalidInputError, match="capacity"):
        router.add_worker("a")
    a = router.add_worker("a", capacity=16)
    b = router.add_worker("b", capacity=16)
    d = router.dispatch(prompt(1, 2, 3))
    router.finish(d.request_id)
    tree = router.tree
    assert tree.held_tokens(d.worker) == 12 and tree.hold_count == 0  # a model, not a hold
    again = router.dispatch(prompt(1, 2, 4))
    assert again.worker == d.worker and again.matched == 8
    for k in range(5, 9):
        router.finish(router.dispatch(prompt(k, k, k)).request_id)
    assert tree.held_tokens(a) <= 16 and tree.held_tokens(b) <= 16
    with pytest.raises(InvalidInputError, match="approximate"):
        router.submit([])
    with pytest.raises(InvalidInputError, match="approximate"):
        router.subscribe([], codec="native")
    assert router.replay().applied == 0 and router.idle().applied == 0
    tree.check()


def test_namespaces_and_extras_are_page_identity(router: Router) -> None:
    a, _ = router.workers
    d = router.dispatch(prompt(1, 2), namespace="lora-x")
    assert router.dispatch(prompt(1, 2)).matched == 0  # another namespace
    assert router.dispatch(prompt(1, 2), namespace="lora-x").matched == 8
    tagged = router.dispatch(prompt(3, 4), extras=[0, 5])
    assert router.dispatch(prompt(3, 4), extras=[0, 6]).matched == 4
    assert router.tree.match(prompt(1, 2), namespace="lora-x").length_of(d.worker) == 8
    assert tagged.worker in (a, router.workers[1])


# -- lifecycle ---------------------------------------------------------------------------------
def test_close_stops_dispatch_but_lets_requests_finish() -> None:
    with Router(1, policy=First()) as router:
        router.add_worker("a")
        d = router.dispatch([1])
        router.start(interval=0.001)
        with pytest.raises(RuntimeError, match="already running"):
            router.start()
    assert router.closed
    with pytest.raises(RouterClosedError):
        router.dispatch([1])
    with pytest.raises(RouterClosedError):
        router.add_worker("b")
    router.finish(d.request_id)
    router.close()  # again: nothing
    assert router.in_flight == 0


# -- metrics -------------------------------------------------------------------------------------
def test_metrics_count_dispatches_hits_reasons_and_loads() -> None:
    router = Router(4, policy=Longest())
    a = router.add_worker("a", capacity=4096)
    router.add_worker("b")
    router.report_load(a, queue_length=2, kv_usage=0.25)
    d1 = router.dispatch(prompt(1, 2, 3))
    router.dispatch(prompt(1, 2, 4))
    router.finish(d1.request_id, output_tokens=5)
    m = router.metrics()
    assert m["dispatches"] == 2 and m["in_flight"] == 1 and m["decisions"] == {"affinity": 2}
    wa = m["workers"][0]
    assert [wa[k] for k in ("worker", "dispatches", "hit_tokens", "prompt_tokens")] == [
        "a", 2, 8, 24,
    ]
    assert [wa[k] for k in ("requests", "prefill_tokens", "finished", "output_tokens")] == [
        1, 4, 1, 5,
    ]
    assert [wa[k] for k in ("capacity", "queue_length", "kv_usage", "running")] == [
        4096, 2, 0.25, None,
    ]
    assert wa["hold_tokens"] == 12 and wa["held_tokens"] == 0
    assert m["replay"]["stats"]["applied"] == 0 and m["tree"]["holds"] == 1

    families = {f.name: f for f in text_string_to_metric_families(router.metrics_text())}
    samples = {
        (s.name.removeprefix("radixmeta_router_"), tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    wa_, wb_ = (("dp_rank", "0"), ("worker", "a")), (("dp_rank", "0"), ("worker", "b"))
    assert families["radixmeta_router_dispatches"].type == "counter"
    assert samples[("dispatches_total", wa_)] == 2
    assert samples[("hit_tokens_total", wa_)] == 8
    assert samples[("decisions_total", (("reason", "affinity"),))] == 2
    assert samples[("requests_in_flight", wa_)] == 1
    assert samples[("engine_kv_usage", wa_)] == 0.25
    assert ("engine_kv_usage", wb_) not in samples
    assert samples[("up", wb_)] == 1
    assert samples[("tree_holds", ())] == 1
    assert samples[("replay_records_total", (("outcome", "applied"),))] == 0


def test_replay_lag_is_in_the_metrics() -> None:
    router = Router(4, policy=First())
    router.add_worker("a")
    log = EventLog(worker="a")
    cache = RadixCache(4, event_log=log)
    cache.insert(prompt(1, 2))
    router.submit(log.read())
    lag = router.metrics()["replay"]["lag"]
    assert lag[0]["worker"] == "a" and lag[0]["records"] == 1
    text = router.metrics_text()
    assert 'radixmeta_router_replay_lag_records{dp_rank="0",worker="a"} 1.0' in text
    router.replay()
    assert router.metrics()["replay"]["lag"][0]["records"] == 0


# -- threads -----------------------------------------------------------------------------------
def test_dispatch_and_finish_from_four_threads(fast_switching: None) -> None:
    router = Router(4, policy=Longest())
    workers = [router.add_worker(f"w{i}") for i in range(3)]
    errors: list[BaseException] = []
    decisions: list[Any] = []

    def client(seed: int) -> None:
        try:
            for k in range(150):
                d = router.dispatch(prompt(seed % 2, k % 5, k))
                decisions.append(d)
                if k % 3 == 0:
                    router.prefill_done(d.request_id)
                router.finish(d.request_id, output_tokens=k % 4)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert len({d.request_id for d in decisions}) == 600
    assert all(d.worker in workers for d in decisions)
    assert router.in_flight == 0 and router.tree.hold_count == 0 and router.tree.node_count == 0
    for w in workers:
        load = router.load(w)
        assert (load.requests, load.prefill_tokens, load.decode_tokens) == (0, 0, 0)
    assert router.metrics()["dispatches"] == 600
    router.tree.check()


def test_a_batch_policy_decides_a_batch_from_its_groups() -> None:
    policy = BatchFirst()
    router = Router(4, policy=policy)
    router.add_worker("a")
    router.add_worker("b")
    out = router.dispatch_batch([prompt(1, 2, 3), prompt(1, 2, 4), prompt(7, 7)])
    assert policy.calls == [(3, [([0, 1], 8), ([2], 0)])]
    assert [d.label for d in out] == ["group"] * 3
    assert out[0].worker == out[1].worker != out[2].worker
