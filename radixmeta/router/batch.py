"""The batch path: deciding a batch of requests together (``Router.dispatch_batch``).

A batch is matched whole, its own shared-prefix groups are found once (one native
trie over the batch, :func:`radixmeta._batch.prefix_groups`), and then either the
policy's ``choose_batch`` decides every request from those views and groups, or the
router decides group by group with the policy's ``choose``: a group's first request
is chosen for, and its members follow while load allows.

A decision's ``matched`` also counts what the request shares with the batch's
earlier requests sent to the same worker (their pages are marked with this batch):
:func:`batch_matched` settles that from the groups' partners.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from itertools import compress
from typing import Any

import numpy as np
import numpy.typing as npt

from radixmeta._batch import PrefixGroups, legacy_groups, prefix_groups, warn_legacy_groups
from radixmeta._keys import check_int, check_namespace
from radixmeta._workers import WorkerId
from radixmeta.errors import InputTypeError, InvalidInputError, PolicyError
from radixmeta.policies._params import extremes
from radixmeta.policies.base import Request, View
from radixmeta.policies.expected import expected_length, expected_lengths
from radixmeta.router.estimate import Estimate
from radixmeta.router.registry import Detail, Registry, Spill

__all__ = [
    "BatchItem",
    "Expected",
    "Plan",
    "Planned",
    "batch_item",
    "batch_matched",
    "by_groups",
    "by_policy",
    "expected_of",
    "groups_of",
]

Tokens = npt.NDArray[np.uint32]
#: One batch item, checked: (tokens, id, namespace, extras, group, expected output).
BatchItem = tuple[Tokens, str | None, Hashable, object, Hashable, int | None]
#: One planned decision: the worker, the policy's label and detail (one tuple shared by
#: the requests of a batch that got equal choices).
Planned = tuple[WorkerId, str, Detail]
#: A batch's plan, by batch index: each request's planned decision, the view it was
#: decided from, and what it finds on its worker.
Plan = tuple[list[Planned], list[View], list[int]]

_KEYWORDS = frozenset(
    {"tokens", "request_id", "namespace", "extras", "group", "expected_output"}
)


def batch_item(k: int, item: object, convert: Any) -> BatchItem:
    """Batch item ``k``, checked: a prompt, or a mapping of ``dispatch``'s keyword arguments."""
    if type(item) is np.ndarray:  # the common case, before the slower Mapping check
        return convert(item), None, None, None, None, None
    if isinstance(item, Mapping):
        unknown = set(item) - _KEYWORDS
        if "tokens" not in item or unknown:
            msg = (
                f"batch item {k}: a mapping needs 'tokens' and only dispatch's keyword "
                f"arguments, got {sorted(map(str, item))}"
            )
            raise InvalidInputError(msg)
        rid = item.get("request_id")
        if rid is not None and type(rid) is not str:
            msg = f"batch item {k}: request_id must be a str, got {type(rid).__name__}"
            raise InputTypeError(msg)
        expected = item.get("expected_output")
        if expected is not None:
            expected = check_int("expected_output", expected, 0)
        namespace = item.get("namespace")
        check_namespace(namespace)
        return (
            convert(item["tokens"]),
            rid,
            namespace,
            item.get("extras"),
            item.get("group"),
            expected,
        )
    return convert(item), None, None, None, None, None


def groups_of(items: Sequence[BatchItem], page_size: int, ratio: float) -> PrefixGroups:
    """The batch's shared-prefix groups (one native trie over the batch's prompts)."""
    keys = [item[0] for item in items]
    if all(item[2] is None and item[3] is None for item in items):  # no namespace, no tags
        return prefix_groups(keys, None, None, page_size, ratio)
    namespaces = [item[2] for item in items]
    tagged = [item[3] is not None for item in items]
    return prefix_groups(keys, namespaces, tagged, page_size, ratio)


class Expected:
    """Per request of a batch, what each worker is expected to still hold of it when it
    runs there (``View.expected``, by worker index as ``MetaMatch.length_list``), from
    the loads before the batch; computed when asked.

    :meth:`row` is a request's whole row, an O(workers) Python loop (the view of a
    request a policy decides); :meth:`at` one worker's value, O(1) in Python beside
    the match's lengths and their minimum, read in C (a member following its run's
    first request onto that worker). Both give what the same
    request's row would: the rule is :func:`~radixmeta.policies.expected.expected_lengths`.
    """

    __slots__ = ("_dense", "_estimate", "_matches", "_queued", "_registry", "_requests",
                 "_rows")

    def __init__(
        self, registry: Registry, estimate: Estimate, requests: list[Request], matches: list[Any]
    ) -> None:
        self._registry, self._estimate = registry, estimate
        self._requests, self._matches = requests, matches
        self._dense = registry.dense
        # A copy: the rows are made while the batch is decided, and a policy may call
        # the router meanwhile; every row is of the loads before the batch.
        self._queued = registry.align(registry.prefill)
        self._rows: dict[int, list[int]] = {}

    def _protection(self, k: int, lengths: list[int]) -> Any:
        request, registry = self._requests[k], self._registry
        return self._estimate.protection(
            request.tokens, request.namespace, request.extras, lengths, registry.up
        )

    def row(self, k: int) -> list[int]:
        """Request ``k``'s row, by worker index (its ``length_list`` itself when nothing
        is cut)."""
        row = self._rows.get(k)
        if row is not None:
            return row
        registry = self._registry
        every = self._matches[k].length_list
        lengths = every if self._dense else registry.align(every)
        got = expected_lengths(
            lengths,
            registry.capacities,
            self._queued,
            registry.page_size,
            self._protection(k, lengths),
        )
        if got is lengths:
            row = every
        elif self._dense:
            row = got
        else:
            row = every[:]
            for p, i in enumerate(registry.up_index):
                row[i] = got[p]
        self._rows[k] = row
        return row

    def at(self, k: int, i: int) -> int:
        """``row(k)[i]``: what request ``k`` is expected to find on worker index ``i``."""
        row = self._rows.get(k)
        if row is not None:
            return row[i]
        registry = self._registry
        every = self._matches[k].length_list
        lengths = every if self._dense else registry.align(every)
        p = i if self._dense else registry.position[i]
        return expected_length(
            p,
            lengths,
            registry.capacities,
            self._queued,
            registry.page_size,
            self._protection(k, lengths),
        )

    def rows(self) -> list[list[int]]:
        """Every request's row, in batch order."""
        return [self.row(k) for k in range(len(self._requests))]


def expected_of(
    registry: Registry, estimate: Estimate, requests: list[Request], matches: list[Any]
) -> Expected | None:
    """What the batch's requests are expected to find per worker (:class:`Expected`);
    ``None`` when the router makes no estimate (no capacity known, or an approximate
    router's: its match is its estimate)."""
    if not registry.bounded or estimate.modelled:
        return None
    return Expected(registry, estimate, requests, matches)


def by_policy(
    registry: Registry,
    choose_batch: Any,
    requests: list[Request],
    matches: list[Any],
    groups: PrefixGroups,
    estimate: Expected | None = None,
    *,
    flat: bool,
) -> Plan:
    """Every request decided by the policy's ``choose_batch``, from views that all show
    the loads before any decision of the batch; and what each finds on its worker.
    ``estimate``: :func:`expected_of`'s, shown as each view's ``expected``. ``flat``:
    the policy sets ``flat_groups`` and is handed ``groups`` itself; otherwise it is
    handed a list of the deprecated ``PrefixGroup`` made from them, with a warning."""
    if flat:
        handed: Sequence[tuple[Sequence[int], int]] = groups
    else:
        warn_legacy_groups(choose_batch)  # before anything is made: it may raise
        handed = legacy_groups(groups)
    every = [m.length_list for m in matches]
    held = None if estimate is None else estimate.rows()
    shared = registry.aligned()  # one copy for every view (views are read-only)
    expected = held if held is not None else [None] * len(every)
    views = registry.views(matches, every, shared, expected)
    choices = choose_batch(requests, views, handed)
    if not isinstance(choices, (list, tuple)) or len(choices) != len(requests):
        msg = (
            f"choose_batch must return one choice per request ({len(requests)}), "
            f"got {choices!r}"
        )
        raise PolicyError(msg)
    # A policy that packs returns one choice object for many requests: checked once.
    checked = registry.checked
    seen: dict[int, Planned] = {}
    planned: list[Planned] = []
    for c in choices:
        plan = seen.get(id(c))
        if plan is None:
            plan = seen[id(c)] = checked(c)
        planned.append(plan)
    found = every if held is None else held
    return planned, views, batch_matched(requests, found, planned, groups, registry.page_size)


def by_groups(
    registry: Registry,
    choose: Any,
    slack: int,
    requests: list[Request],
    matches: list[Any],
    groups: PrefixGroups,
    estimate: Expected | None = None,
) -> Plan:
    """Decide a batch group by group with the policy's ``choose``; and what each request
    finds on its worker (``batch_matched``'s answer, found on the way; ``estimate``:
    :func:`expected_of`'s, where the router makes one: a whole row only for the
    requests the policy is asked about, one worker's value for those that follow).

    The group's first request is chosen for; the next ones follow while the worker's
    requests in flight stay within ``slack`` of the least loaded up worker's; the rest
    of the group is decided again among the workers that load still allows. The plan
    counts its own decisions in copies of the loads, which the views of the decisions
    after them show; the router's loads change only when the batch is committed.
    """
    count = len(requests)
    planned: list[Any] = [None] * count
    views: list[Any] = [None] * count
    matched = [0] * count
    where = [-1] * count  # each decided request's worker index
    again: set[int] = set()
    loads, prefill = registry.requests[:], registry.prefill[:]
    plan_loads = (loads, prefill, registry.decode)  # a batch moves no decode load
    up_index, dense = registry.up_index, registry.dense
    partners, common = groups.partner, groups.common  # by batch index
    for members, _ in groups.runs:
        at = 0
        spill: Spill | None = None  # once the group spilled: the workers load allows
        while at < len(members):
            first = matches[members[at]]
            view = registry.view(
                first,
                first.length_list,
                registry.aligned(plan_loads, spill),
                spill,
                None if estimate is None else estimate.row(members[at]),
            )
            worker, label, detail = registry.checked(choose(requests[members[at]], view), spill)
            i = worker.index
            start = loads[i]
            end = at + 1  # the first always goes; the room matters to a run of more
            if end < len(members):
                end = min(len(members), at + _room(loads, up_index, dense, i, slack, len(members)))
            choice = (worker, label, detail)
            uncached = 0
            for j in range(at, end):
                k = members[j]
                planned[k] = choice
                views[k] = view
                where[k] = i
                # What the batch's earlier requests leave on this worker (see
                # batch_matched; a partner is decided before its request).
                held = matches[k].length_of(worker) if estimate is None else estimate.at(k, i)
                p = partners[k]
                if p >= 0:
                    if where[p] != i:
                        again.add(k)  # see batch_matched
                    elif common[k] > held:
                        held = common[k]
                matched[k] = held
                uncached += len(requests[k].tokens) - held
            loads[i] = start + end - at
            prefill[i] += uncached
            at = end
            if at < len(members):  # spill: only the workers load still allows
                spill = _spill(loads, up_index, dense, slack)
    if again:
        _settle_again(again, where, partners, common, requests, registry.page_size, matched)
    return planned, views, matched


def _spill(loads: list[int], up_index: list[int], dense: bool, slack: int) -> Spill:
    """Where a group's spill may go: the up workers whose load is at most the least
    load plus the slack (the others' positions found in one C-level pass)."""
    up_loads = loads if dense else [loads[j] for j in up_index]
    ceiling = extremes(up_loads)[0] + slack  # loads are ints, so is this
    return Spill(list(compress(range(len(up_loads)), map(ceiling.__lt__, up_loads))))


def _room(
    loads: list[int], up_index: list[int], dense: bool, i: int, slack: int, size: int
) -> int:
    """How many members of a run may go to worker index ``i``: the first always; the next
    while its load, before each, is at most the least loaded other worker's plus the
    slack (only this worker's load moves, so that is a count)."""
    if len(up_index) < 2:
        return size
    low, low_at, _, _, _ = extremes(loads if dense else [loads[j] for j in up_index])
    if up_index[low_at] == i:  # then the others' floor is another load
        others = loads[:i] + loads[i + 1 :] if dense else [loads[j] for j in up_index if j != i]
        low = extremes(others)[0]
    return max(1, int(low) + slack - loads[i] + 1)


def batch_matched(
    requests: list[Request],
    every: list[list[int]],
    choices: Sequence[Any],
    groups: PrefixGroups,
    page: int,
) -> list[int]:
    """Per request of a batch: the tokens its worker holds of it, counting the pages
    of the batch's earlier requests sent to the same worker (in one namespace, with
    no extra tags: those pages are not their tokens alone).

    The batch's groups name each request's best earlier partner and what they
    share: when that partner went to the same worker (or there is none) that is
    the answer. A request whose partner went to another worker may still share
    less with an earlier request on its own: ``_settle_again`` finds that.
    One pass over the groups' flat lists, O(requests), then ``_settle_again``'s.
    """
    worker_of = [choice[0].index for choice in choices]
    matched = [lengths[w] for lengths, w in zip(every, worker_of, strict=True)]
    partner, common = groups.partner, groups.common
    again: set[int] = set()
    # A request with extra tags has no partner (-1), as the first of a batch.
    for k, p in enumerate(partner):
        if p < 0:
            continue
        if worker_of[p] != worker_of[k]:
            again.add(k)
        elif common[k] > matched[k]:
            matched[k] = common[k]
    if again:
        _settle_again(again, worker_of, partner, common, requests, page, matched)
    return matched


def _settle_again(
    again: set[int],
    worker_of: list[int],
    partner: list[int],
    common: list[int],
    requests: list[Request],
    page: int,
    matched: list[int],
) -> list[tuple[int, int]]:
    """Raise the ``matched`` of the requests of ``again`` (whose partner went to another
    worker) by what they share with the batch's earlier requests on their worker.
    Returns ``(request, tokens added)`` for those raised.

    ``partner`` and ``common`` are per request its partner and share. Requests share a
    page only within a chain of partners (a partner shares one at least), so one that
    went where nothing of its chain went before it shares nothing there. Whole-page
    common prefixes are an ultrametric (``lcp(a, c) >= min(lcp(a, b), lcp(b, c))``):
    two requests with the same partner ``p`` share exactly the smaller of their shares
    with ``p``, since neither shares more with the other than with ``p``. So when every
    earlier request of its chain on its worker has its partner, it shares ``min(its
    share, the largest of theirs)``; otherwise its tokens are compared with theirs, up
    to its share with its partner (no earlier request shares more).
    """
    count = len(worker_of)
    chain = list(range(count))  # each request's chain: the index of its first request
    for k in range(count):
        if partner[k] >= 0:
            chain[k] = chain[partner[k]]  # a partner comes first: resolved already
    hot = {chain[k] for k in again}  # the chains that have such a request
    # Per (worker, chain) so far, keyed by one int (no tuple per request): the partner
    # all its requests share (-2: not one), the largest of their shares with it, and
    # the requests themselves.
    width = max(worker_of) + 1
    star: dict[int, int] = {}
    top: dict[int, int] = {}
    earlier: dict[int, list[int]] = {}
    raised: list[tuple[int, int]] = []
    for k, w in enumerate(worker_of):
        c = chain[k]
        if c not in hot:
            continue
        key = c * width + w
        before = star.get(key)
        if before is None:  # nothing of its chain came here before it
            star[key], top[key], earlier[key] = partner[k], common[k], [k]
            continue
        mine, share = partner[k], common[k]
        if k in again:
            if before == mine:
                found = min(share, top[key])
            else:
                found = 0
                tokens = requests[k].tokens
                for j in earlier[key]:
                    found = max(found, _shared_pages(tokens, requests[j].tokens, share, page))
                    if found == share:
                        break
            if found > matched[k]:
                raised.append((k, found - matched[k]))
                matched[k] = found
        earlier[key].append(k)
        if before == mine:
            if share > top[key]:
                top[key] = share
        elif before != -2:
            star[key], top[key] = -2, 0
    again.clear()
    return raised


def _shared_pages(a: Tokens, b: Tokens, limit: int, page: int) -> int:
    """Tokens in the whole pages that ``a`` and ``b`` begin with alike, up to ``limit``."""
    n = min(len(a), len(b), limit)
    differ = np.flatnonzero(a[:n] != b[:n])
    same = int(differ[0]) if len(differ) else n
    return same - same % page
