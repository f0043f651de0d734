"""Exceptions raised by radixmeta.

Every class derives from :class:`RadixMetaError` *and* from the builtin a caller
would naturally catch (``ValueError``, ``TypeError``, ``RuntimeError``), so
``except ValueError`` keeps working in code that does not know this library.

A call that raises one of these leaves the tree exactly as it was before the call.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "RadixMetaError",
    "InvalidInputError",
    "InputTypeError",
    "NodeError",
    "StaleNodeError",
    "ForeignNodeError",
    "StaleHoldError",
    "LockError",
    "CacheFullError",
    "WorkerError",
    "StaleWorkerError",
    "DuplicateWorkerError",
    "BlockEventError",
    "UnknownParentError",
    "BlockConflictError",
    "LogTruncatedError",
    "TransportClosedError",
    "DecodeError",
    "WorkloadError",
    "DataNotFoundError",
    "OptionalDependencyError",
    "PolicyError",
    "UnsupportedConfigurationError",
    "UnsupportedVersionError",
    "RouterError",
    "NoWorkerError",
    "DuplicateRequestError",
    "UnknownRequestError",
    "RouterClosedError",
    "HookError",
]


class RadixMetaError(Exception):
    """Base class of every error raised by radixmeta."""


class InvalidInputError(RadixMetaError, ValueError):
    """An argument has the right type but a bad value.

    Examples: a token outside ``[0, 2**32)``, a 2-D key, values whose length
    differs from the key's, ``page_size < 1``, a negative eviction count.
    """


class InputTypeError(RadixMetaError, TypeError):
    """An argument has the wrong type, such as a float token or a float array."""


class NodeError(RadixMetaError, ValueError):
    """A node handle cannot be used with this tree."""


class StaleNodeError(NodeError):
    """The node a handle named has been evicted or the tree was reset."""


class ForeignNodeError(NodeError):
    """The handle belongs to a different tree."""


class StaleHoldError(NodeError):
    """A hold id of :meth:`MetaTree.release <radixmeta.MetaTree.release>` names no live hold.

    It was released already, its worker was removed (which ends its holds), or
    the id never came from this tree's ``hold``.
    """


class LockError(RadixMetaError, RuntimeError):
    """Unlocking a node that holds no lock."""


class CacheFullError(RadixMetaError, RuntimeError):
    """An insert cannot fit under the capacity because locked nodes cannot be evicted."""


class WorkerError(RadixMetaError, ValueError):
    """A worker argument of a :class:`~radixmeta.MetaTree` cannot be used."""


class StaleWorkerError(WorkerError):
    """The ``WorkerId`` names a worker that was removed (or never belonged to this tree)."""


class DuplicateWorkerError(WorkerError):
    """``add_worker`` for a ``(name, dp_rank)`` pair that is already registered."""


class BlockEventError(RadixMetaError, ValueError):
    """A KV-cache block event cannot be applied; the tree is unchanged."""


class UnknownParentError(BlockEventError):
    """A stored event's parent hash names no block the worker holds.

    It happens when the router joined late or missed events; the engine's
    event replay (or a resync) is the remedy, not guessing a position.
    """


class BlockConflictError(BlockEventError):
    """A block hash would name two different pages for one worker, a page a worker already
    names would get a second hash, or the hashes would form a cycle."""


class LogTruncatedError(RadixMetaError, LookupError):
    """The records a consumer asked for were dropped from a bounded event log.

    ``oldest_seq`` is the oldest sequence number still held. The consumer
    resyncs from the cache's ``snapshot()`` and reads on after its seq.
    """

    def __init__(self, message: str, oldest_seq: int) -> None:
        super().__init__(message)
        self.oldest_seq = oldest_seq

    def __reduce__(self) -> tuple[type, tuple[str, int]]:
        return type(self), (str(self), self.oldest_seq)


class TransportClosedError(RadixMetaError, RuntimeError):
    """A publisher or subscriber of :mod:`radixmeta.transport` was used after ``close()``."""


class DecodeError(RadixMetaError, ValueError):
    """Bytes from the wire are not a valid message of the codec that reads them.

    Raised by the decoders of :mod:`radixmeta.wire` for truncated or malformed
    msgpack, a wrong top-level type, or a field of the wrong type or out of
    range. The message names the byte offset or the field, for example
    ``batch[1][3]: BlockStored.token_ids must be an array of integers, got str``.
    A batch that raises decodes to nothing: no event of it is returned.
    """


class WorkloadError(RadixMetaError, ValueError):
    """A simulator workload's source data is malformed.

    Raised by :mod:`radixmeta.sim.workloads` for a bad CSV row, a bad trace line or a
    file that is not what its workload expects. The message starts with the place,
    ``path:line:`` for line-oriented files, then says what is wrong, for example
    ``trace.jsonl:7: input_length 2000 needs 4 blocks of 512 tokens, got 3 hash_ids``.
    Nothing is returned for a file with a bad line: no line is skipped silently.
    """


class DataNotFoundError(RadixMetaError, FileNotFoundError):
    """A folder or file a workload reads does not exist, or holds none of the files it needs.

    The message names the path and what was expected there (for MMLU, the ``dev`` and
    ``test`` folders of the Hugging Face CSV layout).
    """


class OptionalDependencyError(RadixMetaError, ImportError):
    """An optional package that a feature needs is not installed.

    The message names the package and the pip extra that installs it, for example
    ``pip install 'radixmeta[sim]'``.
    """


class PolicyError(RadixMetaError, ValueError):
    """A routing policy or cost model cannot be built as asked.

    Raised by :func:`radixmeta.policies.create` for a name that is not a built-in
    policy or a parameter the policy does not take, by a policy's constructor for a
    parameter value out of its range (a negative threshold, an unknown load
    measure), and by :func:`radixmeta.policies.costs.prefill_model` for an unknown
    model name. A parameter of the wrong type is an :class:`InputTypeError`. Also
    raised by :class:`~radixmeta.Router` when a policy's ``choose`` (or
    ``choose_batch``) returns something other than a worker of its view, or the
    wrong number of choices.
    """


class UnsupportedConfigurationError(RadixMetaError, ValueError):
    """An engine configuration that a radixmeta integration does not support.

    Raised at startup, before the engine serves anything, by the SGLang
    radix-cache backend (:doc:`sglang`) for the features it does not implement
    (HiCache, session caches, Mamba and sliding-window models, ...). The message
    names the flag or the model property and what to do instead.
    """


class UnsupportedVersionError(RadixMetaError, RuntimeError):
    """An engine release whose interface differs from what the integration was written for.

    The message names the release found and the releases the integration is
    tested with.
    """


class RouterError(RadixMetaError):
    """Base class of the errors of :class:`~radixmeta.Router` itself.

    A router call that raises changes nothing: no load is counted, no page
    marked, no request id taken.
    """


class NoWorkerError(RouterError, RuntimeError):
    """``dispatch`` found no worker to choose: none is registered, or every one is down."""


class DuplicateRequestError(RouterError, ValueError):
    """A request id is already in flight (dispatched and not finished), or repeats in a batch."""


class UnknownRequestError(RouterError, LookupError):
    """A request id names no request in flight: never dispatched, finished, expired, or
    dropped with its worker."""


class RouterClosedError(RouterError, RuntimeError):
    """A :class:`~radixmeta.Router` was asked to dispatch or subscribe after ``close()``."""


class HookError(RouterError, RuntimeError):
    """A policy's ``on_finish`` raised while the router released requests it had to release.

    Raised by ``Router.expire`` and ``Router.remove_worker``, which release every request
    they should whatever a hook does (a hook that keeps raising must not keep requests in
    flight forever): the releases are done, then this is raised, chained from the first
    hook error (``__cause__``).

    Attributes
    ----------
    released : list of str
        The ids of the requests the call released, as the call would have returned them.
    errors : list of BaseException
        What each hook that raised raised, in the order of the requests.
    """

    def __init__(
        self,
        message: str,
        released: Sequence[str] = (),
        errors: Sequence[BaseException] = (),
    ) -> None:
        super().__init__(message)  # args is (message,): it pickles (without the lists)
        self.released = list(released)
        self.errors = list(errors)
