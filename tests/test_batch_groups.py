"""A batch's groups as ``choose_batch`` gets them, on both sides of the deprecation.

A policy that sets ``flat_groups = True`` (every built-in) is handed the router's
``PrefixGroups``: plain ``(members, shared)`` tuples and the flat lists by batch index.
One that does not is handed, for one release, a list of its own of the deprecated
``PrefixGroup`` (per-member ``partners``, ``common``, ``own``), with a
``DeprecationWarning`` at its ``choose_batch``, once per method under the default
filters. Both must decide the same: a wrapper of before hands the default policy the
old groups, and the default policy still reads their links.
"""

from __future__ import annotations

import copy
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
from _policies import load_fleet
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policies_batch import fleets_and_batches
from test_router_machine import observed

from radixmeta import Router
from radixmeta._batch import PrefixGroup, PrefixGroups, legacy_groups, prefix_groups
from radixmeta.errors import InvalidInputError
from radixmeta.policies import BatchPolicy, create, names
from radixmeta.policies import default as default_module
from radixmeta.policies.default import DefaultPolicy


class Legacy:
    """A batch policy written before flat_groups: it reads each group's partners."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def choose(self, request: Any, view: Any) -> Any:
        return view.workers[0]

    def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
        self.seen.append(groups)
        return [view.workers[0] for view in views]


class OtherLegacy(Legacy):
    def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
        return super().choose_batch(requests, views, groups)


class Flat(Legacy):
    flat_groups = True


class PassesOn:
    """A wrapper written before flat_groups: hands its groups on to the default policy."""

    def __init__(self) -> None:
        self.inner = DefaultPolicy()

    def choose(self, request: Any, view: Any) -> Any:
        return self.inner.choose(request, view)

    def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
        return self.inner.choose_batch(requests, views, groups)

    def on_dispatch(self, request: Any, worker: Any, matched: int) -> None:
        self.inner.on_dispatch(request, worker, matched)

    def on_finish(self, request: Any, worker: Any) -> None:
        self.inner.on_finish(request, worker)


def prompts() -> list[np.ndarray]:
    keys = [[1] * 8 + [3, 3], [2] * 8, [1] * 8 + [5, 5], [7, 7], [1] * 8 + [3, 3, 4, 4]]
    return [np.array(k, dtype=np.uint32) for k in keys]


def fleet(policy: Any) -> Router:
    router = Router(2, policy=policy)
    for i in range(3):
        router.add_worker(f"w{i}")
    return router


def test_a_prefix_group_made_by_hand_warns_and_checks_its_parts() -> None:
    with pytest.warns(DeprecationWarning, match="PrefixGroup is deprecated"):
        alone = PrefixGroup([4, 6], 2, [1, 4], [3, 2], [5, 1])
    assert alone == ([4, 6], 2) and isinstance(alone, tuple)
    assert (alone.partners, alone.common, alone.own) == ([1, 4], [3, 2], [5, 1])
    # Copies and pickles are PrefixGroups with the same parts, made without a warning
    # (the suite turns warnings into errors).
    for other in (copy.copy(alone), copy.deepcopy(alone), pickle.loads(pickle.dumps(alone))):
        assert type(other) is PrefixGroup and other == alone
        assert (other.partners, other.common, other.own) == ([1, 4], [3, 2], [5, 1])
    # Bad parts raise before anything is made (no warning either).
    with pytest.raises(InvalidInputError, match="per member"):
        PrefixGroup([4, 6], 2, [1], [3, 2], [5, 1])
    for members in ([-3], [1.5], [True]):
        with pytest.raises(InvalidInputError, match="batch indices"):
            PrefixGroup(members, 0, [-1], [0], [1])  # type: ignore[arg-type]


def test_the_old_groups_list_each_members_slice_of_the_flat_lists() -> None:
    legacy, flat = Legacy(), Flat()
    for policy in (legacy, flat):
        router = fleet(policy)
        if policy is legacy:
            with pytest.warns(DeprecationWarning):
                router.dispatch_batch(prompts())
        else:
            router.dispatch_batch(prompts())
        router.close()
    (new,), (old,) = flat.seen, legacy.seen
    assert isinstance(new, PrefixGroups) and new == [([0, 2, 4], 8), ([1], 0), ([3], 0)]
    assert type(old) is list and old == new  # a list of the policy's own, as before
    for group, (members, shared) in zip(old, new, strict=True):
        assert isinstance(group, PrefixGroup) and group == (members, shared)
        assert group.partners == [new.partner[k] for k in members]
        assert group.common == [new.common[k] for k in members]
        assert group.own == [new.own[k] for k in members]
    assert new.partner == [-1, -1, 0, -1, 0] and new.common == [0, 0, 8, 0, 10]


def test_a_policy_without_flat_groups_is_warned_once_at_its_choose_batch() -> None:
    router = fleet(Legacy())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own rule: once per location
        for _ in range(3):
            router.dispatch_batch(prompts())
        router.policy = OtherLegacy()
        router.dispatch_batch(prompts())
        router.dispatch_batch(prompts())
        router.policy = Flat()
        router.dispatch_batch(prompts())
    got = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert [str(w.message).split(" ", 1)[0] for w in got] == [
        "Legacy.choose_batch",
        "OtherLegacy.choose_batch",
    ]
    assert "flat_groups = True" in str(got[0].message)
    # Where the code to change is: the choose_batch definition itself.
    assert got[0].filename == __file__
    assert got[0].lineno == Legacy.choose_batch.__code__.co_firstlineno
    assert got[1].lineno == OtherLegacy.choose_batch.__code__.co_firstlineno
    router.close()


def test_a_deprecation_raised_as_an_error_changes_nothing() -> None:
    # Under -W error (this suite's setting) the warning raises before the batch is
    # decided, and the batch, as any that raises, leaves the router as it was.
    policy = Legacy()
    router = fleet(policy)
    router.dispatch(prompts()[0])
    before = observed(router)
    with pytest.raises(DeprecationWarning, match=r"Legacy\.choose_batch"):
        router.dispatch_batch(prompts())
    assert observed(router) == before and not policy.seen
    router.close()


def test_every_built_in_batch_policy_is_handed_the_prefix_groups() -> None:
    batch_policies = [name for name in names() if isinstance(create(name), BatchPolicy)]
    assert {"default", "longest_prefix"} <= set(batch_policies)
    for name in batch_policies:
        assert create(name).flat_groups is True  # type: ignore[attr-defined]
    handed: list[Any] = []

    class Spy(DefaultPolicy):
        def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
            handed.append(groups)
            return super().choose_batch(requests, views, groups)

    router = fleet(Spy())
    router.dispatch_batch(prompts())
    assert [type(groups) for groups in handed] == [PrefixGroups]
    router.close()


@settings(deadline=None)
@given(case=fleets_and_batches(), packed=st.booleans())
def test_old_groups_passed_on_decide_as_the_prefix_groups(
    case: dict[str, Any], packed: bool
) -> None:
    # The default policy handed the deprecated list (by a wrapper of before) decides
    # every batch as when the router hands it the PrefixGroups: the same worker,
    # reason, detail and matched length, in order (small batches) and packed.
    routers = []
    for policy in (DefaultPolicy(), PassesOn()):
        router = Router(case["page"], policy=policy)
        workers = [
            router.add_worker(f"w{i}", capacity=case["capacity"])
            for i in range(case["workers"])
        ]
        load_fleet(router, workers, case)
        routers.append(router)
    budget = default_module.IN_ORDER_BUDGET
    default_module.IN_ORDER_BUDGET = 0.0 if packed else budget
    try:
        for batch in case["batches"]:
            items = [np.array(key, dtype=np.uint32) for key in batch]
            new = routers[0].dispatch_batch(items)
            if items:
                with pytest.warns(DeprecationWarning, match=r"PassesOn\.choose_batch"):
                    old = routers[1].dispatch_batch(items)
            else:
                old = routers[1].dispatch_batch(items)
            assert [(d.worker.name, d.label, d.detail, d.matched) for d in old] == [
                (d.worker.name, d.label, d.detail, d.matched) for d in new
            ]
    finally:
        default_module.IN_ORDER_BUDGET = budget
    for router in routers:
        router.close()


def test_the_policies_read_no_links_from_groups_of_their_own() -> None:
    # A caller's own (members, shared) pairs, or old groups of another batch: no links.
    from radixmeta.policies._in_order import links

    keys = prompts()
    groups = prefix_groups(keys, None, None, 2, 0.5)
    assert links(5, groups) == (groups.partner, groups.common)
    assert links(4, groups) is None  # another batch's
    assert links(5, list(groups)) is None  # plain pairs
    assert links(5, legacy_groups(groups)) == (groups.partner, groups.common)
    assert links(4, legacy_groups(groups)) is None
