"""The simulator's request record, the workload container and the helpers every builder uses."""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from radixmeta.errors import InputTypeError, InvalidInputError

__all__ = ["Request", "Workload"]

TOKEN_LIMIT = 2**32


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    """One simulated request: a prompt that arrives at a time and wants some output.

    Attributes
    ----------
    request_id : int
        Its position in the workload (``workload[request_id] is request``).
    tokens : numpy.ndarray of uint32
        The prompt, 1-D and read-only. Requests may share memory (a multi-turn
        session's prompts are views of one array), so never write to it.
    arrival : float
        Arrival time in seconds from the start of the run.
    output_len : int
        Tokens to generate (``>= 0``).
    group : str or None
        A label for reports: the GSP group, the MMLU subject, the ShareGPT
        conversation id. Policies must not need it.

    Notes
    -----
    Equality is identity (``eq=False``): comparing token arrays element-wise is
    never what ``==`` on two requests should silently do.
    """

    request_id: int
    tokens: npt.NDArray[np.uint32]
    arrival: float
    output_len: int
    group: str | None = None

    @property
    def prompt_len(self) -> int:
        """Tokens in the prompt."""
        return int(self.tokens.shape[0])


class Workload(Sequence[Request]):
    """The requests of one simulation, in arrival order, with where they came from.

    Parameters
    ----------
    name : str
        The workload's kind (``"gsp"``, ``"mmlu"``, ...) or a name of your own.
    requests : sequence of Request
        In the order the simulator receives them: arrivals never decrease, and
        ``requests[i].request_id == i``. The builders and :func:`from_requests`
        produce exactly that; this constructor checks it.
    metadata : mapping, optional
        How the workload was made (source, tokenizer, seed, parameters): plain
        JSON-able values, shown in reports. Kept as a read-only copy.

    Raises
    ------
    InvalidInputError
        Ids out of order, or arrivals that decrease or are not finite.
    InputTypeError
        An element that is not a :class:`Request`.
    """

    __slots__ = ("_arrivals", "_hit_rates", "_metadata", "_name", "_output_lens",
                 "_prompt_lens", "_requests")

    def __init__(
        self,
        name: str,
        requests: Sequence[Request],
        metadata: Mapping[str, object] | None = None,
    ) -> None:
        self._name = str(name)
        self._requests = tuple(requests)
        for i, request in enumerate(self._requests):
            if not isinstance(request, Request):
                msg = f"requests[{i}] must be a Request, got {type(request).__name__}"
                raise InputTypeError(msg)
            if request.request_id != i:
                msg = (
                    f"requests[{i}].request_id must be {i} (its position), "
                    f"got {request.request_id}"
                )
                raise InvalidInputError(msg)
        arrivals = np.fromiter((r.arrival for r in self._requests), np.float64, len(self._requests))
        if not np.isfinite(arrivals).all() or (arrivals < 0).any():
            bad = int(np.flatnonzero(~np.isfinite(arrivals) | (arrivals < 0))[0])
            msg = f"requests[{bad}].arrival must be finite and >= 0, got {arrivals[bad]}"
            raise InvalidInputError(msg)
        if arrivals.size > 1 and (np.diff(arrivals) < 0).any():
            bad = int(np.flatnonzero(np.diff(arrivals) < 0)[0]) + 1
            msg = (
                f"requests[{bad}] arrives at {arrivals[bad]}, before requests[{bad - 1}] "
                f"({arrivals[bad - 1]}): a workload is in arrival order"
            )
            raise InvalidInputError(msg)
        self._arrivals = _frozen(arrivals)
        self._output_lens = _frozen(
            np.fromiter((r.output_len for r in self._requests), np.int64, len(self._requests))
        )
        self._prompt_lens = _frozen(
            np.fromiter((r.tokens.shape[0] for r in self._requests), np.int64, len(self._requests))
        )
        self._metadata: Mapping[str, object] = MappingProxyType(dict(metadata or {}))
        self._hit_rates: dict[int, float] = {}

    # -- the sequence ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._requests)

    @overload
    def __getitem__(self, index: int) -> Request: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Request]: ...
    def __getitem__(self, index: int | slice) -> Request | Sequence[Request]:
        return self._requests[index]

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    # -- what it is ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The workload's kind or name."""
        return self._name

    @property
    def requests(self) -> tuple[Request, ...]:
        """The requests, in arrival order."""
        return self._requests

    @property
    def metadata(self) -> Mapping[str, object]:
        """How it was made: ``source``, ``tokenizer``, ``seed``, the builder's parameters."""
        return self._metadata

    @property
    def arrivals(self) -> npt.NDArray[np.float64]:
        """Arrival times in seconds, one per request (read-only)."""
        return self._arrivals

    @property
    def output_lens(self) -> npt.NDArray[np.int64]:
        """Output lengths, one per request (read-only)."""
        return self._output_lens

    @property
    def prompt_lens(self) -> npt.NDArray[np.int64]:
        """Prompt lengths, one per request (read-only)."""
        return self._prompt_lens

    @property
    def total_prompt_tokens(self) -> int:
        """Tokens over all prompts."""
        return int(self._prompt_lens.sum())

    def optimal_hit_rate(self, page_size: int = 1) -> float:
        """The best prefix-cache hit rate any router can reach on these prompts: H*.

        ``H* = (sum over requests of the tokens already cached when it is inserted
        into one unbounded cache of all prompts) / (total prompt tokens)``. Every
        distinct full page of the trie of all prompts is computed once and
        everything else is a hit; the tail of a prompt after its last full page is
        never cached, so it never hits. With ``page_size=1`` this is
        ``1 - (tokens in the trie of all prompts) / (total prompt tokens)``. The
        order of the requests does not change it. ``0.0`` for a workload without
        prompt tokens.

        Parameters
        ----------
        page_size : int, default 1
            The KV page size of the caches it is compared with.

        Notes
        -----
        Computed exactly, once per page size (then remembered), by marking every
        prompt in a one-worker :class:`~radixmeta.MetaTree` of that page size: a
        prompt's hit is its full pages minus the pages it newly marks. The
        meta-tree keeps only token ids (about 4 bytes a trie token), where a
        :class:`~radixmeta.RadixCache` would keep a KV slot beside each id (12):
        on the Mooncake conversation trace the transient is 0.37 GB instead of
        0.88 GB, and it takes half the time. O(total prompt tokens) time and
        O(trie tokens) memory, freed on return.
        """
        page = operator.index(page_size)
        if page in self._hit_rates:
            return self._hit_rates[page]
        from radixmeta.meta import MetaTree  # the tree is imported only when asked for

        tree = MetaTree(page)
        only = tree.add_worker("optimal")
        total = self.total_prompt_tokens
        pages = 0
        for request in self._requests:
            pages += request.tokens.shape[0] // page - tree.insert(request.tokens, only)
        del tree  # the trie of every prompt: freed before anything else is built
        rate = pages * page / total if total else 0.0
        self._hit_rates[page] = rate
        return rate

    def summary(self) -> dict[str, object]:
        """Counts and lengths, as plain numbers (for reports and the console script)."""
        lens = self._prompt_lens
        groups = {r.group for r in self._requests if r.group is not None}
        empty = lens.size == 0
        return {
            "name": self._name,
            "requests": len(self._requests),
            "prompt_tokens": self.total_prompt_tokens,
            "output_tokens": int(self._output_lens.sum()),
            "prompt_len_mean": 0.0 if empty else float(lens.mean()),
            "prompt_len_median": 0.0 if empty else float(np.median(lens)),
            "prompt_len_min": 0 if empty else int(lens.min()),
            "prompt_len_max": 0 if empty else int(lens.max()),
            "groups": len(groups),
            "duration_s": 0.0 if empty else float(self._arrivals[-1]),
            "optimal_hit_rate": self.optimal_hit_rate(1),
        }

    def digest(self) -> str:
        """A SHA-256 hex digest of every request's tokens, arrival, output length and group.

        Two workloads with one digest feed the simulator exactly the same input;
        the same builder with the same parameters and seed gives the same digest.
        """
        h = hashlib.sha256()
        h.update(self._arrivals.tobytes())
        h.update(self._output_lens.tobytes())
        h.update(self._prompt_lens.tobytes())
        for request in self._requests:
            h.update(np.ascontiguousarray(request.tokens, dtype="<u4").tobytes())
            label = b"\x00" if request.group is None else b"\x01" + request.group.encode()
            h.update(len(label).to_bytes(8, "little") + label)
        return h.hexdigest()

    def __repr__(self) -> str:
        return (
            f"Workload(name={self._name!r}, requests={len(self._requests)}, "
            f"prompt_tokens={self.total_prompt_tokens})"
        )


# -- helpers shared by the builders ------------------------------------------------------


_Array = TypeVar("_Array", bound="np.ndarray[Any, Any]")


def frozen_tokens(array: _Array) -> _Array:
    """Mark an array read-only and return it: workloads are shared and must never change."""
    array.flags.writeable = False
    return array


_frozen = frozen_tokens


def make_rng(seed: int) -> np.random.Generator:
    """A generator of its own for one build: never numpy's global state.

    numpy keeps ``PCG64`` streams fixed, but not every distribution's algorithm
    across numpy versions, so byte-identical output is promised for one numpy
    version.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        msg = f"seed must be an integer >= 0, got {seed!r}"
        raise InvalidInputError(msg)
    return np.random.Generator(np.random.PCG64(int(seed)))


def check_rate(rate: float, what: str = "rate") -> float:
    """Return ``rate`` as a float: ``> 0``, ``math.inf`` meaning all at once."""
    try:
        value = float(rate)
    except (TypeError, ValueError):
        msg = f"{what} must be a number > 0 (or inf), got {rate!r}"
        raise InputTypeError(msg) from None
    if not value > 0:  # also refuses NaN
        msg = f"{what} must be > 0 (or inf for all at once), got {rate!r}"
        raise InvalidInputError(msg)
    return value


def poisson_arrivals(count: int, rate: float, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Arrival times of a Poisson process of ``rate`` per second, the first at 0.

    Gaps are exponential with mean ``1 / rate``, as a load generator that sends a
    request and then sleeps draws them. ``rate = inf`` puts every arrival at 0.
    """
    if count <= 0:
        return np.zeros(0, dtype=np.float64)
    if math.isinf(rate):
        return np.zeros(count, dtype=np.float64)
    gaps = rng.exponential(1.0 / rate, size=count - 1)
    return np.concatenate(([0.0], np.cumsum(gaps)))


def as_tokens(value: object, what: str) -> npt.NDArray[np.uint32]:
    """Convert a user's prompt to a read-only 1-D uint32 array, checking every id."""
    if isinstance(value, str | bytes | bytearray):
        msg = f"{what} must be token ids, got {type(value).__name__} (tokenize text first)"
        raise InputTypeError(msg)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        msg = f"{what} must be a 1-D sequence of token ids: {exc}"
        raise InputTypeError(msg) from None
    if array.size == 0 and array.ndim == 1:
        return frozen_tokens(np.zeros(0, dtype=np.uint32))
    if array.dtype.kind not in "iu":
        msg = f"{what} must hold integer token ids, got dtype {array.dtype}"
        raise InputTypeError(msg)
    if array.ndim != 1:
        msg = f"{what} must be 1-D, got {array.ndim} dimensions"
        raise InvalidInputError(msg)
    if array.dtype.kind == "i" and (array < 0).any():
        pos = int(np.flatnonzero(array < 0)[0])
        msg = f"{what}[{pos}] = {array[pos]} is outside the token range [0, 2**32)"
        raise InvalidInputError(msg)
    if array.dtype.itemsize > 4 and (array >= TOKEN_LIMIT).any():
        pos = int(np.flatnonzero(array >= TOKEN_LIMIT)[0])
        msg = f"{what}[{pos}] = {array[pos]} is outside the token range [0, 2**32)"
        raise InvalidInputError(msg)
    return frozen_tokens(np.array(array, dtype=np.uint32))  # a copy the caller cannot change
