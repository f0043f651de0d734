"""What a worker will still hold of a prompt when the request runs there.

A match says what a worker's cache holds *now*. A request dispatched to a worker
with a queue runs later, and the requests ahead of it write their own prompts
into the same KV pool first, evicting the least recently used pages. A prefix
that those writes push out is recomputed, so it is no hit, and counting it
makes a router expect more than it gets (5 to 10 times more under load). The
rule, per worker ``i`` with pool ``C`` tokens, matched length ``m``, ``P``
uncached tokens queued there and a prompt of ``L`` tokens:

- the prefix that every worker holds stays (a system prompt all traffic
  shares: it is in use somewhere at every moment, so always recent);
- of the rest, the share that survives is ``1 - P / (C - m)``, in ``[0, 1]``:
  what the requests ahead write before this one is admitted, against the room
  beside the prefix, with the prefix's place in the pool's recency order
  unknown (uniform). The request's own writes do not count: admission locks its
  prefix before it takes pages;
- unless a request in flight on the worker also starts with the prefix
  (``protected``): that request locks it while it runs and leaves it the most
  recent pages of the pool when it finishes, so only the writes queued after
  its finish can push the prefix out, and only by more than the room beside
  it. A request in flight runs its whole decode, far longer than its prefill,
  so where in the queue's writes it finishes is taken as uniform: the share
  is ``min(1, (C - m) / P)``, all of it while the queue writes no more than
  the room.

A worker without a capacity (unbounded, or unknown) keeps everything. On the
conversation trace at 4 and 16 workers with half the default pool and the
fleet 0.8 to 0.95 loaded, these shares put the estimate within a few points
of the hits the simulated workers made, where counting the whole match was 2
to 4 times too high. On multi-turn traffic most cut prefixes are protected
(the conversation's previous turn, a sibling of its burst still in flight):
there an earlier share, ``(C - m) / (C - m + P)``, which counted every write
of the queue against a locked prefix, put the estimate 6 to 18 points below
the hits on the synthetic ``chat`` and ``bursty`` traces at 8 workers.

The result is rounded to the nearest whole page. Complexity: O(workers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["expected_length", "expected_lengths"]


def expected_lengths(
    lengths: list[int],
    capacities: Sequence[int | None],
    prefill_tokens: Sequence[int],
    page_size: int = 1,
    protected: Sequence[bool] | Callable[[int], bool] | None = None,
) -> list[int]:
    """Per worker, the tokens of ``lengths`` expected to be cached when the request runs there.

    Parameters
    ----------
    lengths : list of int
        Per worker, the matched length of the prompt now (``View.lengths``).
    capacities : sequence of int or None
        Per worker, its KV pool in tokens (``None``: unbounded or unknown).
    prefill_tokens : sequence of int
        Per worker, uncached tokens of the requests dispatched there and not past
        prefill: what it writes before this request.
    page_size : int, default 1
        Every result is a multiple of it.
    protected : sequence of bool or callable, optional
        Per worker, whether a request in flight there starts with the matched
        prefix (its share is the larger one); a callable ``protected(i)`` is asked
        only about the workers whose prefix would be cut.

    Returns
    -------
    list of int
        ``lengths`` itself when nothing is cut (the common case, no copy), else
        a new list with every value ``<= lengths[i]`` (``head`` plus whole pages).

    Examples
    --------
    >>> expected_lengths([4000, 512, 0], [10_000, 10_000, 10_000], [0, 0, 0])
    [4000, 512, 0]
    >>> # 3,000 tokens queued ahead beside a 4,000-token prefix in a 10,000-token pool:
    >>> # half of the prefix past the 512 that every worker holds is expected to stay.
    >>> expected_lengths([4000, 512, 512], [10_000, 10_000, 10_000], [3000, 0, 0])
    [2256, 512, 512]
    >>> # A request in flight there starts with it: it all stays while the queue writes
    >>> # no more than the 6,000 beside it; of 8,000 queued, 6,000 / 8,000 of the 3,488.
    >>> expected_lengths([4000, 512, 512], [10_000] * 3, [3000, 0, 0], protected=[True] * 3)
    [4000, 512, 512]
    >>> expected_lengths([4000, 512, 512], [10_000] * 3, [8000, 0, 0], protected=[True] * 3)
    [3128, 512, 512]
    """
    head = min(lengths)
    out = lengths
    for i, matched in enumerate(lengths):
        capacity = capacities[i]
        if capacity is None or matched <= head:
            continue
        writes = prefill_tokens[i]
        if writes <= 0:
            continue
        keep = _kept(i, matched, head, capacity, writes, page_size, protected)
        if keep >= matched:
            continue
        if out is lengths:
            out = lengths[:]
        out[i] = keep
    return out


def expected_length(
    i: int,
    lengths: list[int],
    capacities: Sequence[int | None],
    prefill_tokens: Sequence[int],
    page_size: int = 1,
    protected: Sequence[bool] | Callable[[int], bool] | None = None,
    head: int | None = None,
) -> int:
    """``expected_lengths(...)[i]`` alone, for a caller that needs one worker's value.

    ``head`` is ``min(lengths)`` if the caller knows it already; ``protected`` is
    asked about ``i`` only. O(1) given ``head``, else O(workers) for the minimum.

    Examples
    --------
    >>> expected_length(0, [4000, 512, 512], [10_000, 10_000, 10_000], [3000, 0, 0])
    2256
    """
    matched = lengths[i]
    capacity = capacities[i]
    if head is None:
        head = min(lengths)
    if capacity is None or matched <= head:
        return matched
    writes = prefill_tokens[i]
    if writes <= 0:
        return matched
    keep = _kept(i, matched, head, capacity, writes, page_size, protected)
    return keep if keep < matched else matched


def _kept(
    i: int,
    matched: int,
    head: int,
    capacity: int,
    writes: int,
    page_size: int,
    protected: Sequence[bool] | Callable[[int], bool] | None,
) -> int:
    """What worker ``i`` is expected to keep of its ``matched`` tokens (module docstring),
    to the nearest whole page past ``head``; may be ``matched`` or more (nothing cut)."""
    room = capacity - matched
    if protected is not None and (protected(i) if callable(protected) else protected[i]):
        share = 1.0 if writes <= room else max(room, 0) / writes
    else:
        share = 1.0 - writes / room if room > writes else 0.0
    # To the nearest whole page, as an estimate (never past the match itself).
    return head + int((matched - head) * share / page_size + 0.5) * page_size
