"""A batch decided request by request, as a run of single dispatches would decide it.

``Router.dispatch_batch`` shows every request of a batch the loads and matches from
before the batch. A policy that decides the requests one after the other with its
own ``choose`` sees what ``Router.dispatch`` would have shown each of them instead,
when :func:`decide_in_order` gives each request a view that adds what the batch's
earlier decisions did:

- their requests, and their uncached tokens (the prompt past what the worker was
  found to hold), to their workers' loads, as the router's commit counts them;
- the whole pages the request shares with the earlier requests sent to a worker to
  what that worker holds of it, as the router's optimistic marks of those requests
  would show (device and host lengths, and the expected lengths where the router
  estimates evictions).

The pages shared come from the batch's prefix groups: each request's partner (the
earlier request it shares the most whole pages with) and that share. Whole-page
common prefixes are an ultrametric, so a request ``k`` with partner ``p`` and share
``c`` shares ``min(c, lcp(p, j))`` with every other earlier ``j`` (and ``c`` with
``p``): its path in the batch's trie is ``p``'s path cut at ``c``, then a segment of
its own. A decision marks, per worker, how deep into each segment of its path that
worker now holds; what the next request finds there is the deepest mark on its own
path.

Complexity: per request, O(workers) for its view plus O(segments x marked workers),
where a path has one segment per request of its chain of partners it still shares
pages with (one or two for a batch of fresh prompts or of one system prompt; up to
the batch's length for a conversation whose every turn is in the batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixmeta._batch import PrefixGroup, PrefixGroups
from radixmeta._workers import WorkerId
from radixmeta.errors import PolicyError
from radixmeta.policies.base import Choice, Request, View, worker_of

__all__ = ["decide_in_order", "links"]

#: One segment of a request's path in the batch's trie: (its request, from, to), in
#: tokens; the request's own pages between the two depths.
_Segment = tuple[int, int, int]


def links(
    count: int, groups: Sequence[tuple[Sequence[int], int]]
) -> tuple[list[int], list[int]] | None:
    """Per request of a batch, its partner (``-1``: none) and the tokens it shares with it,
    by batch index: the router's :class:`~radixmeta._batch.PrefixGroups` lists them;
    ``None`` for groups that do not (a caller's own) or that are of another batch.

    The deprecated ``PrefixGroup`` items of a policy without ``flat_groups`` (passed on
    to a built-in) still name them, for one release: :func:`_legacy_links`."""
    if isinstance(groups, PrefixGroups):
        return (groups.partner, groups.common) if len(groups.partner) == count else None
    return _legacy_links(count, groups)


def _legacy_links(
    count: int, groups: Sequence[tuple[Sequence[int], int]]
) -> tuple[list[int], list[int]] | None:
    """:func:`links` from each group's deprecated ``partners`` and ``common`` (goes with
    ``PrefixGroup``); ``None`` when a group has none or a request is in no group."""
    partner, common = [-1] * count, [0] * count
    seen = 0
    for group in groups:
        if not isinstance(group, PrefixGroup):
            return None
        members, partners, shares = group[0], group.partners, group.common
        if not len(partners) == len(shares) == len(members):
            return None
        for k, p, c in zip(members, partners, shares, strict=True):
            if not 0 <= k < count or p >= k:  # a partner comes before its request
                return None
            partner[k], common[k] = p, c
            seen += 1
    return (partner, common) if seen == count else None


def decide_in_order(
    choose: Callable[[Request, View], WorkerId | Choice],
    requests: Sequence[Request],
    views: Sequence[View],
    groups: Sequence[tuple[Sequence[int], int]],
    dispatched: Callable[[Request, WorkerId, int], None] | None = None,
) -> list[WorkerId | Choice] | None:
    """Decide a batch request by request with ``choose``, each seeing the earlier ones.

    Parameters
    ----------
    choose : callable
        The policy's ``choose(request, view)``.
    requests, views, groups
        As ``BatchPolicy.choose_batch`` is given them: the views all show the loads
        before the batch, and the groups are the router's (a ``PrefixGroups``, which
        names each request's partner).
    dispatched : callable, optional
        Told ``(request, worker, matched)`` after each decision, as the router tells a
        policy's ``on_dispatch`` after a single dispatch, for a policy whose state
        moves with its decisions (the caller restores it after the batch).

    Returns
    -------
    list or None
        ``choose``'s answer per request, in batch order; ``None`` (nothing decided,
        ``choose`` never called) when the groups do not name each request's partner.

    Raises
    ------
    PolicyError
        ``choose`` picked a worker that is not one of its view's.

    Notes
    -----
    Request ``k``'s view is ``views[k]`` with the loads of the decisions before it
    and, per worker, the longer of what the worker held of it and what it shares
    with the batch's earlier requests sent there (module docstring). Where the
    router's estimate cut a worker's ``expected`` length, a page shared with a
    request just ahead in the same batch counts as still cached. Requests with
    extra tags share no page in the batch's groups, so none here either.
    Complexity: the module docstring's.
    """
    count = len(requests)
    linked = links(count, groups)
    if linked is None:
        return None
    partner, common = linked
    if count == 0:
        return []
    first = views[0]
    workers = first.workers
    position = {worker: i for i, worker in enumerate(workers)}
    loads = list(first.requests)
    prefill = list(first.prefill_tokens)
    page = first.page_size
    # Per request, its path's segments; per request, how deep each worker holds its own
    # segment (a worker absent from a request's marks holds none of its segment).
    paths: list[list[_Segment]] = []
    marks: list[dict[int, int]] = []
    out: list[WorkerId | Choice] = []
    for k in range(count):
        request, view = requests[k], views[k]
        size = len(request.tokens)
        whole = size - size % page
        p, c = partner[k], common[k]
        path: list[_Segment] = []
        if p >= 0 and c > 0:
            for segment in paths[p]:
                owner, start, end = segment
                if start >= c:
                    break
                path.append(segment if end <= c else (owner, start, c))
        shared: dict[int, int] = {}
        for owner, _, end in path:
            for w, depth in marks[owner].items():
                held = depth if depth < end else end
                if held > shared.get(w, 0):
                    shared[w] = held
        path.append((k, c if p >= 0 else 0, whole))
        lengths, host, expected = view.lengths, view.host_lengths, view.expected
        if shared:
            lengths = _raised(lengths, shared)
            host = _raised(host, shared)
            if expected is not None:
                expected = _raised(expected, shared)
        seen = View(
            workers,
            lengths,
            host,
            loads[:],
            prefill[:],
            view.decode_tokens,
            view.capacities,
            view.reported,
            page,
            view.prefix_key,
            expected,
        )
        choice = choose(request, seen)
        w = position.get(worker_of(choice), -1)
        if w < 0 or workers[w] != worker_of(choice):
            msg = f"the policy chose {choice!r}, which is not one of its view's workers"
            raise PolicyError(msg)
        found = (lengths if expected is None else expected)[w]
        if dispatched is not None:
            dispatched(request, workers[w], found)
        loads[w] += 1
        prefill[w] += size - found
        for owner, _, end in path:
            if owner == k:
                marks.append({w: end})
            elif marks[owner].get(w, 0) < end:
                marks[owner][w] = end
        paths.append(path)
        out.append(choice)
    return out


def _raised(lengths: list[int], shared: dict[int, int]) -> list[int]:
    """``lengths`` with each worker of ``shared`` raised to its share, if that is longer."""
    out = lengths[:]
    for w, depth in shared.items():
        if depth > out[w]:
            out[w] = depth
    return out
