"""dispatch_batch: the batch's own prefix trie, its groups, and keeping groups together.

``prefix_partners`` (the native trie and the reference) is checked against its
definition; ``dispatch_batch`` is checked for what the A.4 batch path promises: a
shared-prefix group stays on one worker unless load forbids it, and then spills to the
workers load allows.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
from _policies import LeastLoaded, Longest, Recorder
from conftest import NATIVE, REFERENCE
from hypothesis import given
from hypothesis import strategies as st

from radixmeta import Router
from radixmeta._batch import PrefixGroup, PrefixGroups, legacy_groups, prefix_groups
from radixmeta.errors import PolicyError
from radixmeta.policies import Request
from radixmeta.router import batch
from radixmeta.router.registry import Spill

CORES = [REFERENCE] + ([NATIVE] if NATIVE is not None else [])


def definition(keys: list[list[int]], page: int) -> tuple[list[int], list[int]]:
    partner, shared = [], []
    for i, key in enumerate(keys):
        best, who = 0, -1
        for j in range(i):
            m = 0
            while m < min(len(key), len(keys[j])) and key[m] == keys[j][m]:
                m += 1
            m -= m % page
            if m > best:
                best, who = m, j
        partner.append(who)
        shared.append(best)
    return partner, shared


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[list[int]], int]:
    page = draw(st.sampled_from([1, 2, 4]))
    keys: list[list[int]] = []
    for _ in range(draw(st.integers(0, 12))):
        base: list[int] = []
        if keys and draw(st.booleans()):
            base = list(draw(st.sampled_from(keys)))
            base = base[: draw(st.integers(0, len(base)))]
        keys.append(base + draw(st.lists(st.integers(0, 2), max_size=4 * page)))
    return keys, page


def check_batch_counts(
    router: Router,
    keys: list[list[int]],
    decisions: list[Any],
    page: int,
    before: list[list[int]] | None = None,
    shares: Any = None,
) -> None:
    """Each decision's matched length is what its worker held before the batch
    (``before[i][worker index]``, else 0) or the longest whole-page prefix it shares
    with an earlier request of the batch sent to the same worker (those ``shares(i, j)``
    allows), the longer; the prefill loads are the rest, and ``finish`` empties them."""
    for i, d in enumerate(decisions):
        best = 0 if before is None else before[i][d.worker.index]
        for j in range(i):
            if decisions[j].worker != d.worker or (shares is not None and not shares(i, j)):
                continue
            m = 0
            while m < min(len(keys[i]), len(keys[j])) and keys[i][m] == keys[j][m]:
                m += 1
            best = max(best, m - m % page)
        assert d.matched == best
    workers = router.workers
    for worker in workers:
        pairs = zip(keys, decisions, strict=True)
        want = sum(len(k) - d.matched for k, d in pairs if d.worker == worker)
        assert router.load(worker).prefill_tokens == want
    for d in decisions:
        router.finish(d.request_id)
    assert all(router.load(w).prefill_tokens == 0 for w in workers)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.__name__)
@given(batch=batches())
def test_prefix_partners_follow_their_definition(core: Any, batch: Any) -> None:
    keys, page = batch
    partner, shared = core.prefix_partners([np.array(k, dtype=np.uint32) for k in keys], page)
    assert (partner.tolist(), shared.tolist()) == definition(keys, page)
    lists = core.prefix_partners(keys, page)  # lists take the trees' input rules too
    assert lists[0].tolist() == partner.tolist()


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.__name__)
@given(batch=batches(), ratio=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_prefix_groups_link_requests_to_their_partners(core: Any, batch: Any, ratio: float) -> None:
    keys, page = batch
    partner, shared = definition(keys, page)
    first, group_shared = core.prefix_groups(keys, page, ratio)
    want_first, want_shared = list(range(len(keys))), [0] * len(keys)
    for i, (j, length) in enumerate(zip(partner, shared, strict=True)):
        shorter = min(len(keys[i]) // page, len(keys[j]) // page) * page if j >= 0 else 0
        if j < 0 or length < page or length < ratio * shorter:
            continue
        f = want_first[j]
        want_first[i] = f
        want_shared[f] = length if want_shared[f] == 0 else min(want_shared[f], length)
    assert (first.tolist(), group_shared.tolist()) == (want_first, want_shared)


def test_prefix_partners_refuse_bad_input() -> None:
    for core in CORES:
        with pytest.raises(TypeError):
            core.prefix_partners("abc", 1)
        with pytest.raises(ValueError):
            core.prefix_partners([[1, -1]], 1)
        with pytest.raises(ValueError):
            core.prefix_partners([[1]], 0)


def test_groups_join_requests_that_share_most_of_a_prompt() -> None:
    sys_a, sys_b = [1] * 8, [2] * 8
    keys = [
        [*sys_a, 3, 3],  # 0
        [*sys_b, 4, 4],  # 1
        [*sys_a, 5, 5],  # 2: shares 8 of 10 with 0
        [1, 1, 9, 9],  # 3: shares 2 of 4 with 0: exactly the ratio
        [*sys_b, 6],  # 4: shares 8 with 1
        [7, 7],  # 5: alone
        [*sys_a, 5, 5],  # 6: the same as 2, but tagged
    ]
    arrays = [np.array(k, dtype=np.uint32) for k in keys]
    groups = prefix_groups(arrays, [None] * 7, [False] * 6 + [True], 2, 0.5)
    assert groups == [([0, 2, 3], 2), ([1, 4], 8), ([5], 0), ([6], 0)]
    stricter = prefix_groups(arrays, [None] * 7, [False] * 7, 2, 0.9)
    # 2 shares 8 of 0's 10 tokens (< 90 %); 4 shares all 8 of its whole pages with 1.
    assert stricter == [([0], 0), ([1, 4], 8), ([2, 6], 10), ([3], 0), ([5], 0)]
    by_namespace = prefix_groups(arrays[:3], ["x", None, None], [False] * 3, 2, 0.5)
    assert by_namespace == [([0], 0), ([1], 0), ([2], 0)]


def prompt(group: int, k: int) -> list[int]:
    """A 32-token prompt: a 24-token prefix of its group, then its own 8 tokens."""
    return [100 + group] * 24 + [k] * 8


def test_a_shared_prefix_group_stays_on_one_worker() -> None:
    recorder = Recorder(LeastLoaded())
    router = Router(4, policy=recorder)
    workers = [router.add_worker(f"w{i}") for i in range(3)]
    batch = [prompt(g, k) for k in range(5) for g in range(3)]  # interleaved groups
    ids = [f"r{k}" for k in range(len(batch))]
    decisions = router.dispatch_batch(
        [{"tokens": key, "request_id": i} for key, i in zip(batch, ids, strict=True)]
    )
    assert [d.request_id for d in decisions] == ids  # in input order
    on: dict[int, set[Any]] = {g: set() for g in range(3)}
    for d, key in zip(decisions, batch, strict=True):
        on[key[0] - 100].add(d.worker)
    assert all(len(ws) == 1 for ws in on.values())
    assert {next(iter(ws)) for ws in on.values()} == set(workers)  # one group per worker
    assert len(recorder.seen) == 3  # one decision per group, not per request
    assert [d.label for d in decisions] == ["least_loaded"] * 15
    # The loads count every request; a hit counts what the batch's earlier requests sent
    # to the same worker give (their pages are marked at once): the group's 24-token
    # prefix for every member but the first, which the prefill load leaves out too.
    for w in workers:
        assert router.load(w).requests == 5
        assert router.load(w).prefill_tokens == 32 + 4 * 8
    seen_group: set[int] = set()
    for d, key in zip(decisions, batch, strict=True):
        assert d.matched == (24 if key[0] in seen_group else 0)
        seen_group.add(key[0])
    for d in decisions:
        router.finish(d.request_id)
    assert router.tree.hold_count == 0 and router.in_flight == 0
    router.tree.check()


def test_a_group_spills_when_it_would_overload_its_worker() -> None:
    router = Router(4, policy=Longest(), group_slack=2)
    workers = [router.add_worker(f"w{i}") for i in range(3)]
    decisions = router.dispatch_batch([prompt(0, k) for k in range(10)])
    loads = [router.load(w).requests for w in workers]
    assert sum(loads) == 10 and max(loads) - min(loads) <= 3
    chosen = [d.worker for d in decisions]
    assert len(set(chosen)) == 3
    # Kept together as far as load allows: each worker's part is one run of the batch.
    runs = [w for k, w in enumerate(chosen) if k == 0 or chosen[k - 1] != w]
    assert len(runs) == len(set(runs))
    # With room, the same group stays whole.
    roomy = Router(4, policy=Longest(), group_slack=32)
    for i in range(3):
        roomy.add_worker(f"w{i}")
    assert len({d.worker for d in roomy.dispatch_batch([prompt(0, k) for k in range(10)])}) == 1


class Busiest:
    """The most loaded worker of its view (a policy that would overload a spill's target)."""

    def choose(self, request: Any, view: Any) -> Any:
        return view.workers[view.requests.index(max(view.requests))]


class Outside:
    """Chooses, for a spill, a worker its view does not show (a buggy policy)."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def choose(self, request: Any, view: Any) -> Any:
        shown = set(view.workers)
        outside = [w for w in self.router.up if w not in shown]
        return outside[0] if outside else view.workers[0]


def test_a_spill_shows_only_the_workers_load_allows() -> None:
    """A spill's view is the up workers whose load is within the slack of the least
    loaded (on a fleet with a worker down: not every index is in a view), and a choice
    outside it is refused."""
    router = Router(4, policy=(seen := Recorder(_To(None))), group_slack=1)
    workers = [router.add_worker(f"w{i}") for i in range(5)]
    router.mark_down(workers[1])
    seen.inner = _To(workers[2])
    for k in range(3):  # w2 carries 3 requests: out of every spill's view
        router.dispatch(prompt(9, k))
    seen.inner = Busiest()
    decisions = router.dispatch_batch([prompt(0, k) for k in range(6)])
    views = [view for _, view in seen.seen[3:]]
    assert len(views) > 1  # the group spilled
    for view in views[1:]:
        assert workers[1] not in view.workers and workers[2] not in view.workers
        assert max(view.requests) - min(view.requests) <= 1
    assert all(d.worker in router.up for d in decisions)
    for d in decisions:
        router.finish(d.request_id)
    router.policy = Outside(router)
    before = [router.load(w) for w in router.workers]
    with pytest.raises(PolicyError, match="not one of its view's workers"):
        router.dispatch_batch([prompt(0, k) for k in range(6)])
    assert [router.load(w) for w in router.workers] == before


class _To:
    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def choose(self, request: Any, view: Any) -> Any:
        return self.worker


def test_a_batch_matches_the_tree_once_and_marks_every_request() -> None:
    router = Router(4, policy=Longest())
    a = router.add_worker("a")
    router.add_worker("b")
    first = router.dispatch(prompt(0, 99))  # the tree knows group 0 on a
    out = router.dispatch_batch(
        [prompt(0, 1), {"tokens": prompt(1, 1), "request_id": "mine", "expected_output": 3}]
    )
    assert out[0].worker == a and out[0].matched == 24
    assert out[1].request_id == "mine" and out[1].matched == 0
    assert router.tree.match(prompt(1, 1)).length_of(out[1].worker) == 32
    assert router.dispatch_batch([]) == []
    for d in (first, *out):
        router.finish(d.request_id)
    assert router.tree.hold_count == 0


def test_a_batchs_own_ids_avoid_the_ids_in_flight_and_given() -> None:
    # A caller's ids that look like the router's next ones, in flight and in the batch:
    # the ids the router draws for the rest skip both, and all of them differ.
    router = Router(4, policy=LeastLoaded())
    router.add_worker("a")
    router.add_worker("b")
    first = router.dispatch(prompt(0, 1))
    base = first.request_id.rsplit("-", 1)[0]
    flying = router.dispatch(prompt(0, 2), request_id=f"{base}-2")
    given = [{"tokens": prompt(1, 1), "request_id": f"{base}-4"}]
    out = router.dispatch_batch([prompt(2, k) for k in range(3)] + given + [prompt(3, 1)])
    ids = [d.request_id for d in (first, flying, *out)]
    assert len(set(ids)) == len(ids)
    assert out[3].request_id == f"{base}-4"
    # As dispatch would have drawn them one by one: in order, skipping the taken ones.
    assert [d.request_id for d in (*out[:3], out[4])] == [f"{base}-{k}" for k in (1, 3, 5, 6)]
    for rid in ids:
        router.finish(rid)
    assert router.tree.hold_count == 0


def test_approximate_batches_insert() -> None:
    router = Router(4, policy=LeastLoaded(), mode="approximate")
    workers = [router.add_worker(f"w{i}", capacity=64) for i in range(2)]
    out = router.dispatch_batch([prompt(g, k) for g in range(2) for k in range(3)])
    for d in out:
        router.finish(d.request_id)
    held = sum(router.tree.held_tokens(w) for w in workers)
    assert 0 < held <= 128 and router.tree.hold_count == 0
    router.tree.check()


class Fails:
    """Chooses the first worker for the first group, then raises."""

    def __init__(self) -> None:
        self.calls = 0

    def choose(self, request: Any, view: Any) -> Any:
        self.calls += 1
        if self.calls > 1:
            msg = "policy failure"
            raise RuntimeError(msg)
        return view.workers[0]


def test_a_batch_whose_policy_fails_changes_nothing() -> None:
    policy = Fails()
    router = Router(4, policy=policy)
    workers = [router.add_worker(f"w{i}") for i in range(2)]
    with pytest.raises(RuntimeError, match="policy failure"):
        router.dispatch_batch([prompt(0, k) for k in range(3)] + [prompt(1, 0)])
    assert policy.calls == 2 and router.in_flight == 0 and router.tree.hold_count == 0
    for w in workers:
        assert router.load(w).requests == 0 and router.load(w).prefill_tokens == 0



class SeesCollector:
    """Records whether the garbage collector was enabled at each choice, and may fail."""

    def __init__(self, fail: bool = False) -> None:
        self.enabled: list[bool] = []
        self.fail = fail

    def choose(self, request: Any, view: Any) -> Any:
        self.enabled.append(gc.isenabled())
        if self.fail:
            msg = "policy failure"
            raise RuntimeError(msg)
        return view.workers[0]


@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("enabled", [True, False])
def test_a_batch_pauses_the_garbage_collector_and_leaves_it_as_it_was(
    enabled: bool, fail: bool
) -> None:
    # A large batch's objects are not garbage; walking them was half its time.
    policy = SeesCollector(fail)
    router = Router(4, policy=policy)
    router.add_worker("w0")
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        if fail:
            with pytest.raises(RuntimeError, match="policy failure"):
                router.dispatch_batch([prompt(0, 0), prompt(1, 0)])
        else:
            assert len(router.dispatch_batch([prompt(0, 0), prompt(1, 0)])) == 2
        assert policy.enabled and not any(policy.enabled)  # paused while deciding
        assert gc.isenabled() is enabled  # and as it was afterwards, raise or not
    finally:
        (gc.enable if was else gc.disable)()


@given(batch=batches(), ratio=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_a_groups_own_tokens_add_up_to_its_trie(batch: Any, ratio: float) -> None:
    # shared + sum(own) is what the whole group computes on one worker: every member's
    # tokens past the longest whole-page prefix it shares with an earlier member of its
    # group (the first member's own part starts after the group's shared prefix).
    keys, page = batch
    arrays = [np.array(k, dtype=np.uint32) for k in keys]
    groups = prefix_groups(arrays, [None] * len(keys), [False] * len(keys), page, ratio)
    for members, shared in groups:
        own = [groups.own[k] for k in members]
        trie = len(keys[members[0]])
        for k, i in enumerate(members[1:], start=1):
            common = 0
            for j in members[:k]:
                m = 0
                while m < min(len(keys[i]), len(keys[j])) and keys[i][m] == keys[j][m]:
                    m += 1
                common = max(common, m - m % page)
            trie += len(keys[i]) - common
        assert shared + sum(own) == trie


@given(batch=batches(), data=st.data())
def test_a_batch_decision_counts_what_earlier_requests_on_its_worker_share(
    batch: Any, data: st.DataObject
) -> None:
    # Whatever worker each request goes to, its matched length is the longest whole-page
    # prefix it shares with an earlier request of the batch sent to the same worker
    # (the tree is empty before the batch), and the prefill loads are the rest.
    keys, page = batch
    keys = [k for k in keys if k]
    if not keys:
        return
    picks = data.draw(st.lists(st.integers(0, 2), min_size=len(keys), max_size=len(keys)))

    class Scatter:
        flat_groups = True

        def choose(self, request: Any, view: Any) -> Any:
            return view.workers[0]

        def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
            return [views[0].workers[p] for p in picks]

    router = Router(page, policy=Scatter())
    workers = [router.add_worker(f"w{i}") for i in range(3)]
    decisions = router.dispatch_batch([np.array(k, dtype=np.uint32) for k in keys])
    assert [d.worker for d in decisions] == [workers[p] for p in picks]
    check_batch_counts(router, keys, decisions, page)


@given(batch=batches(), data=st.data(), slack=st.sampled_from([0, 1, 32]))
def test_a_batch_decided_group_by_group_counts_what_it_shares_on_each_worker(
    batch: Any, data: st.DataObject, slack: int
) -> None:
    # The same promise as above on the path of a policy without choose_batch: its choose
    # picks any worker of each view it is shown (spills included, with a small slack),
    # and each decision's matched length is still the brute-force one.
    keys, page = batch
    keys = [k for k in keys if k]
    if not keys:
        return
    picks = iter(data.draw(st.lists(st.integers(0, 7), min_size=len(keys), max_size=len(keys))))

    class AnyWorker:
        def choose(self, request: Any, view: Any) -> Any:
            return view.workers[next(picks) % len(view.workers)]

    router = Router(page, policy=AnyWorker(), group_slack=slack)
    for i in range(3):
        router.add_worker(f"w{i}")
    decisions = router.dispatch_batch([np.array(k, dtype=np.uint32) for k in keys])
    check_batch_counts(router, keys, decisions, page)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.__name__)
@given(batch=batches(), ratio=st.sampled_from([0.0, 0.5, 1.0]))
def test_prefix_links_are_groups_and_partners_at_once(core: Any, batch: Any, ratio: float) -> None:
    keys, page = batch
    first, shared, partner, common = core.prefix_links(keys, page, ratio)
    groups, partners = core.prefix_groups(keys, page, ratio), core.prefix_partners(keys, page)
    assert (first.tolist(), shared.tolist()) == (groups[0].tolist(), groups[1].tolist())
    assert (partner.tolist(), common.tolist()) == (partners[0].tolist(), partners[1].tolist())

@pytest.mark.parametrize("core", CORES, ids=lambda c: c.__name__)
@given(batch=batches(), ratio=st.sampled_from([0.0, 0.5, 1.0]))
def test_group_runs_are_the_groups_of_the_links(core: Any, batch: Any, ratio: float) -> None:
    # The runs the plain batch path takes from the trie are the groups the namespace
    # path builds in Python from prefix_links (one namespace for all, so it runs).
    keys, page = batch
    arrays = [np.array(k, dtype=np.uint32) for k in keys]
    runs, partner, common, own = core.prefix_group_runs(arrays, page, ratio)
    built = prefix_groups(arrays, ["ns"] * len(keys), [False] * len(keys), page, ratio)
    assert runs == built.runs
    assert (partner, common, own) == (built.partner, built.common, built.own)
    assert sorted(i for r in runs for i in r[0]) == list(range(len(keys)))
    # The flat lists are the links of prefix_partners, by batch index.
    links = core.prefix_partners(arrays, page)
    assert (partner, common) == (links[0].tolist(), links[1].tolist())
    # The groups are the runs themselves; the deprecated PrefixGroup items a policy
    # without flat_groups gets hand out their members' slices of the flat lists.
    assert list(built) == runs and all(type(group) is tuple for group in built)
    for group, (members, shared) in zip(legacy_groups(built), runs, strict=True):
        assert isinstance(group, PrefixGroup) and (group[0], group[1]) == (members, shared)
        assert group.partners == [partner[k] for k in members]
        assert group.common == [common[k] for k in members]
        assert group.own == [own[k] for k in members]

@given(
    batch=batches(),
    data=st.data(),
    mode=st.sampled_from(["exact", "approximate"]),
    by_groups=st.booleans(),
)
def test_a_batch_counts_its_own_sharing_in_any_setting(
    batch: Any, data: st.DataObject, mode: str, by_groups: bool
) -> None:
    # Both batch paths, in both modes (approximate with caches small enough to evict
    # within the batch), after traffic, with namespaces and extra tags, and with a
    # choose_batch that reorders the (deprecated) list of groups it is handed, or reads
    # the PrefixGroups in reverse: a request's matched length
    # is what its worker held before the batch or what it shares with an earlier
    # request of the batch on that worker (one namespace, no tags), the longer.
    keys, page = batch
    keys = [k for k in keys if k]
    if not keys:
        return
    count = len(keys)
    picks = data.draw(st.lists(st.integers(0, 2), min_size=count, max_size=count))
    spaces = data.draw(st.lists(st.sampled_from([None, "a"]), min_size=count, max_size=count))
    tagged = data.draw(st.lists(st.booleans(), min_size=count, max_size=count))
    capacity = data.draw(st.integers(2, 12)) * page if mode == "approximate" else None
    drawn = iter(picks)

    class Picker:
        def choose(self, request: Any, view: Any) -> Any:
            return view.workers[next(drawn, 0) % len(view.workers)]

    class Reorders(Picker):
        def __init__(self, flat: bool) -> None:
            self.flat_groups = flat

        def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
            if self.flat_groups:
                assert list(reversed(groups)) == list(groups)[::-1]  # read-only: copies
            else:
                groups.reverse()  # a policy's own packing order (largest first, say)
            return [views[0].workers[p] for p in picks]

    flat = data.draw(st.booleans())
    router = Router(
        page, policy=Picker() if by_groups else Reorders(flat), mode=mode, group_slack=1
    )
    for i in range(3):
        router.add_worker(f"w{i}", capacity=capacity)
    for k in data.draw(st.lists(st.sampled_from(keys), max_size=3)):  # traffic before
        router.finish(router.dispatch(np.array(k, dtype=np.uint32)).request_id)
    items = []
    for k, ns, tag in zip(keys, spaces, tagged, strict=True):
        item: dict[str, Any] = {"tokens": np.array(k, dtype=np.uint32), "namespace": ns}
        if tag:
            item["extras"] = [7] * (len(k) // page)
        items.append(item)
    before = [
        router.tree.match(
            item["tokens"], namespace=item["namespace"], extras=item.get("extras")
        ).length_list
        for item in items
    ]
    drawn = iter(picks)
    if by_groups or flat:
        decisions = router.dispatch_batch(items)
    else:
        with pytest.warns(DeprecationWarning, match=r"Reorders\.choose_batch"):
            decisions = router.dispatch_batch(items)

    def shares(i: int, j: int) -> bool:  # one namespace, no extra tags
        return not tagged[i] and not tagged[j] and spaces[i] == spaces[j]

    check_batch_counts(router, keys, decisions, page, before, shares)


@given(data=st.data(), down=st.booleans(), exact=st.booleans())
def test_a_members_expected_value_is_that_of_its_whole_row(
    data: st.DataObject, down: bool, exact: bool
) -> None:
    # The group-by-group path asks batch.Expected for one worker's value of the members
    # that follow a run (at) and for whole rows only for the views (row): the two must
    # agree everywhere, with queues that cut prefixes, protected prefixes (requests in
    # flight), and a fleet with a worker down (rows realigned by worker index).
    page = 4
    router = Router(page, mode="exact" if exact else "approximate")
    workers = [router.add_worker(f"w{i}", capacity=data.draw(st.integers(8, 40)) * page)
               for i in range(4)]
    prefixes = [[g] * (3 * page) for g in range(3)]

    def prompt() -> np.ndarray:
        head = data.draw(st.sampled_from(prefixes))
        tail = data.draw(st.lists(st.integers(0, 3), max_size=3 * page))
        return np.array(head + tail, dtype=np.uint32)

    for _ in range(data.draw(st.integers(0, 8))):  # in flight: queued tokens, protections
        key = prompt()
        d = router.dispatch(key)
        if exact and data.draw(st.booleans()):  # reported too, as the replayer would
            router.tree.insert(key, d.worker)
    if down:
        router.mark_down(workers[data.draw(st.integers(0, 3))])
    registry = router._registry
    if not registry.up:
        return
    keys = [prompt() for _ in range(data.draw(st.integers(1, 6)))]
    requests = [Request(f"r{k}", key, None, None, None, None) for k, key in enumerate(keys)]
    matches = [router.tree.match(key, cursor=True) for key in keys]
    if not exact:  # an approximate router's model has written its queues: no estimate
        assert batch.expected_of(registry, router._estimate, requests, matches) is None
        for m, key in zip(matches, keys, strict=True):
            view = registry.view(m, m.length_list)
            assert router._estimate.expected(view, key, None, None) is view.lengths
        return
    rows = batch.Expected(registry, router._estimate, requests, matches).rows()
    fresh = batch.Expected(registry, router._estimate, requests, matches)
    for k in range(len(keys)):
        for i in registry.up_index:
            assert fresh.at(k, i) == rows[k][i]
    views = [registry.view(m, m.length_list) for m in matches]
    for view, key, row in zip(views, keys, rows, strict=True):  # dispatch's own estimate
        got = router._estimate.expected(view, key, None, None)
        assert got == [row[i] for i in registry.up_index]


class _Picks:
    """A batch policy that sends request i to worker picks[i] (and may reorder groups: a
    policy of before flat_groups, handed the deprecated list of its own)."""

    def __init__(self, picks: list[int], reorder: bool = False) -> None:
        self.picks, self.reorder = picks, reorder
        self.flat_groups = not reorder

    def choose(self, request: Any, view: Any) -> Any:
        return view.workers[0]

    def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
        if self.reorder:
            groups.reverse()  # a policy's own packing order
        return [views[0].workers[p] for p in self.picks]


def test_sharing_evicted_within_the_batch_still_counts_in_approximate_mode() -> None:
    # Request 4 shares [0, 1, 1, 0] with request 1 on w1; its partner (request 3) went to
    # w2, and w1's 4-token cache evicts request 1's pages while the batch is marked.
    # What it shares with the batch is counted all the same, as for any other request.
    router = Router(1, policy=_Picks([0, 1, 1, 2, 1]), mode="approximate")
    for i in range(3):
        router.add_worker(f"w{i}", capacity=4)
    keys = [[0, 0, 1], [0, 1, 1, 0], [0, 1, 0, 1, 1], [0, 1, 1, 0, 1, 0, 1], [0, 1, 1, 0, 1, 2]]
    decisions = router.dispatch_batch([np.array(k, dtype=np.uint32) for k in keys])
    assert [d.matched for d in decisions] == [0, 0, 2, 0, 4]


def test_a_policy_that_reorders_the_groups_changes_no_count() -> None:
    # Every request is a group of its own (ratio 1.0), so partners link groups: request 3
    # shares [1, 1] with request 1 on w1, however the policy reorders the group list.
    for reorder in (False, True):
        router = Router(2, policy=_Picks([0, 1, 0, 1], reorder), group_ratio=1.0)
        for i in range(2):
            router.add_worker(f"w{i}")
        keys = [[5, 5, 5, 5], [1, 1, 7, 7], [1, 1, 2, 2], [1, 1, 2, 2, 3, 3]]
        prompts = [np.array(k, dtype=np.uint32) for k in keys]
        if reorder:
            with pytest.warns(DeprecationWarning, match=r"_Picks\.choose_batch"):
                decisions = router.dispatch_batch(prompts)
        else:
            decisions = router.dispatch_batch(prompts)
        assert [d.matched for d in decisions] == [0, 0, 0, 2]


@given(data=st.data(), n=st.integers(0, 300))
def test_a_spill_keeps_exactly_the_positions_it_does_not_exclude(data: Any, n: int) -> None:
    """Both ways of keeping (deleting a few, filtering many) give the plain filter."""
    excluded = sorted(data.draw(st.sets(st.integers(0, max(0, n - 1)), max_size=n)) if n else [])
    spill = Spill(excluded)
    values = list(range(1000, 1000 + n))
    assert spill.keep(values) == [v for i, v in enumerate(values) if i not in excluded]
    assert spill.keep(tuple(values)) == spill.keep(values)  # and again, from its mask
    assert [p for p in range(n) if p in spill] == [p for p in range(n) if p not in excluded]


def test_prefix_groups_are_plain_tuples_over_the_batch_lists() -> None:
    keys = [[1] * 8 + [3, 3], [2] * 8, [1] * 8 + [5, 5], [7, 7]]
    arrays = [np.array(k, dtype=np.uint32) for k in keys]
    groups = prefix_groups(arrays, None, None, 2, 0.5)
    assert isinstance(groups, PrefixGroups)
    assert len(groups) == 3 and groups == [([0, 2], 8), ([1], 0), ([3], 0)]
    assert groups != [([0, 2], 8)] and groups != "not groups"
    first = groups[0]
    assert type(first) is tuple and first is groups.runs[0]  # nothing made per group
    members, shared = first  # unpacks as the (members, shared) pair of the contract
    assert (members, shared) == ([0, 2], 8)
    assert groups[-1] == ([3], 0) and groups[1:] == [([1], 0), ([3], 0)]
    assert list(groups) == groups.runs
    # The links, by batch index: request 2's partner is request 0, sharing 8 tokens.
    assert groups.partner == [-1, -1, 0, -1] and groups.common == [0, 0, 8, 0]
    assert groups.own == [2, 8, 2, 2]
    assert sum(groups.own[k] for k in members) + shared == 12  # what the group computes


@pytest.mark.skipif(NATIVE is None, reason="the native core is not built")
@given(batch=batches(), ratio=st.sampled_from([0.0, 0.5, 1.0]))
def test_group_runs_are_the_same_in_both_cores(batch: Any, ratio: float) -> None:
    # The runs and the three flat lists, natively and in the oracle, side by side.
    keys, page = batch
    arrays = [np.array(k, dtype=np.uint32) for k in keys]
    assert NATIVE.prefix_group_runs(arrays, page, ratio) == REFERENCE.prefix_group_runs(
        arrays, page, ratio
    )
