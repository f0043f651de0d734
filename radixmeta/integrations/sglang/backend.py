"""The radix-cache backend itself: SGLang's ``BasePrefixCache`` over :class:`radixmeta.RadixCache`.

Importing this module imports SGLang and torch; :mod:`radixmeta.integrations.sglang`
imports it only when SGLang builds the cache. Everything SGLang sees is its own
type (``MatchResult``, ``InsertResult``, ``TreeLock``, its event structs, int64
tensors on the allocator's device); everything the tree holds is radixmeta's.

What the scheduler calls, and what each call costs here:

* ``match_prefix`` walks the tree once and gathers no slots (``values=False``):
  the scheduler reads a matched prefix's slots only for the requests it admits,
  through ``prefix_device_indices`` -> :meth:`path_device_indices`, which copies
  them out of the tree once (numpy, shared with torch through
  ``torch.from_numpy``) and transfers them once when the device is not the CPU.
* ``checkpoint`` inserts the request's row, frees the duplicate slots the insert
  exposed through the allocator's ``free_segment`` and re-anchors the request's
  lock on the new node. The row is rewritten only where the tree's slots differ
  from the request's: ``[cache_protected_len, prefix_len)``, empty unless another
  request stored the same tokens meanwhile.
* ``evict`` frees whole leaves in the policy's order and hands all their slots
  to the allocator in one ``free_segment`` call (each leaf's slots are whole
  pages, so the pages are released exactly once).
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from radixmeta import EventLog, RadixCache
from radixmeta._records import Cleared, Removed, Stored
from radixmeta.errors import InvalidInputError, LogTruncatedError
from radixmeta.integrations.sglang._hashes import EventHasher, Namespace, signed

if TYPE_CHECKING:
    # SGLang is not installed where radixmeta is type-checked: its types are Any here.
    BasePrefixCache: Any
    torch: Any
    AllBlocksCleared: Any
    BlockRemoved: Any
    BlockStored: Any
    StorageMedium: Any
    DecLockRefResult: Any
    EvictResult: Any
    IncLockRefResult: Any
    InsertResult: Any
    MatchResult: Any
    TreeLock: Any
    KvEventLoraNames: Any
    _RECEIPT: Any
else:
    import torch
    from sglang.srt.disaggregation.kv_events import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        StorageMedium,
    )
    from sglang.srt.mem_cache.base_prefix_cache import (
        BasePrefixCache,
        DecLockRefParams,
        DecLockRefResult,
        EvictResult,
        IncLockRefResult,
        InsertResult,
        MatchResult,
        TreeLock,
    )
    from sglang.srt.mem_cache.events import KvEventLoraNames

    # Every lock of this cache is released the same way, so one empty receipt
    # serves them all (SGLang's unified tree replays per-component ones).
    _RECEIPT = DecLockRefParams()

__all__ = ["BackendStats", "RadixMetaPrefixCache"]

logger = logging.getLogger(__name__)

_TOKEN_LIMIT = 2**32  # radixmeta's token ids are uint32


@dataclass(frozen=True)
class BackendStats:
    """What the backend counted besides the tree's own :class:`~radixmeta.CacheStats`.

    Attributes
    ----------
    out_of_range_keys : int
        Keys (matches, stores, touches) holding a token id outside
        ``[0, 2**32)``, which radixmeta cannot store: each was served up to
        the last whole page before its first such id, the rest as a miss.
    """

    out_of_range_keys: int = 0

# The event log is a ring: it keeps the latest records (their paths in all at most
# _LOG_TOKENS tokens, 16 MiB) whether or not they were read. The scheduler drains it every
# step, far within that; a step that overflowed it anyway is reported as a clear and
# the cache's whole contents (see take_events), never as silently lost events.
_LOG_CAPACITY = 1 << 16
_LOG_TOKENS = 1 << 22


class RadixMetaPrefixCache(BasePrefixCache):  # type: ignore[misc]
    """SGLang's prefix cache, kept in a :class:`radixmeta.RadixCache`.

    Parameters
    ----------
    params : sglang.srt.mem_cache.cache_init_params.CacheInitParams
        What SGLang builds every tree cache with: the request and KV pools, the
        page size, the eviction policy, EAGLE, KV events. Checked by the
        plugin's factory before this is built (unsupported settings never get
        here).

    Notes
    -----
    Node handles are :class:`radixmeta.Node` objects; a request holds one in
    ``req.last_node``. Namespaces: a key's ``(extra_key, cache_salt)`` pair, as
    SGLang's own trees keep them apart (see
    :class:`~radixmeta.integrations.sglang._hashes.Namespace`). A token id
    outside radixmeta's ``[0, 2**32)`` never raises in the scheduler: the key
    is served up to the last whole page before it, the rest is a miss (counted
    in :attr:`stats`, logged once).
    """

    def __init__(self, params: Any) -> None:
        self.disable = False  # the factory refuses a disabled cache
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = int(params.page_size)
        self.is_eagle = bool(params.is_eagle)
        self.eviction_policy = str(params.eviction_policy).lower()
        # Slots live where the allocator keeps them (its ``device``, as SGLang's trees read it).
        dev = getattr(self.token_to_kv_pool_allocator, "device", "cpu")
        self.device = torch.device(dev if isinstance(dev, (str, torch.device)) else "cpu")
        self._on_cpu = self.device.type == "cpu"
        self._dynamo = bool(getattr(params, "dynamo_kv_event_format", False))
        names = getattr(params, "kv_event_lora_names", None)
        self._lora_names = names if names is not None else KvEventLoraNames()
        self._log: EventLog | None = None
        self._hasher = EventHasher(dynamo=self._dynamo, lora_name=self._lora_names.get)
        if params.enable_kv_cache_events:
            self._log = EventLog(
                _LOG_CAPACITY, max_tokens=_LOG_TOKENS, form="blocks", hash=self._hasher
            )
        # SGLang's trees stamp a node as used before they split it, so the tokens
        # past the cut count as recent too: the same here, for the same eviction order.
        self._cache = RadixCache(
            self.page_size,
            eviction=self.eviction_policy,
            event_log=self._log,
            refresh_split_tail=True,
        )
        self._table: Any = None  # the request pool's tensor, and a numpy view of it
        self._table_np: Any = None
        self._seen = -1  # the last log record turned into events
        self._out_of_range = 0
        if getattr(params, "enable_metrics", False):
            self.init_metrics_collector()
        self.reset()

    # -- keys ------------------------------------------------------------------------------
    def _tree_key(self, key: Any) -> tuple[Any, Namespace | None]:
        """The radixmeta key and namespace of a ``RadixKey``, without copying its tokens.

        The ``array('q')`` SGLang keeps is viewed as an int64 numpy array (a
        capped key, ``limit``, as a slice of it), which the native core narrows
        and range-checks in one pass. An EAGLE bigram key moves its first raw
        token into the namespace (see ``Namespace``).
        """
        tokens = _int64_view(key.token_ids)
        n = len(tokens)
        limit = key.limit
        if limit is not None and limit < n:
            n = limit
        extra, salt = key.extra_key, key.cache_salt
        if key.is_bigram or self.is_eagle:
            if n <= 1:
                return (), None
            return tokens[1:n], Namespace(extra, salt, int(tokens[0]))
        if n != len(tokens):
            tokens = tokens[:n]
        if extra is None and salt is None:
            return tokens, None
        return tokens, Namespace(extra, salt)

    def _row(self, index: int) -> Any:
        """Request row ``index`` of the request-to-token pool, as numpy (int32).

        On the CPU, a view of the pool's own tensor (no copy; the pool is
        viewed again if it ever replaces its tensor); on a device, a copy.
        """
        table = self.req_to_token_pool.req_to_token
        if table is not self._table:
            self._table = table
            self._table_np = table.numpy() if table.device.type == "cpu" else None
        if self._table_np is not None:
            return self._table_np[index]
        return table[index].cpu().numpy()

    # -- the six abstract methods ----------------------------------------------------------
    def reset(self) -> None:
        """Drop every node (SGLang clears the allocator itself when it flushes)."""
        self._cache.reset()
        self._hasher.clear()
        self._root = self._cache.match_prefix((), values=False).node
        self._empty = torch.empty((0,), dtype=torch.int64, device=self.device)

    def match_prefix(self, params: Any) -> Any:
        """Longest cached prefix of ``params.key``, in whole pages; splits where it ends.

        Complexity: O(len(key) + nodes on the path); no slot is copied.
        """
        tree_key, namespace = self._tree_key(params.key)
        try:
            m = self._cache.match_prefix(tree_key, namespace=namespace, values=False)
        except InvalidInputError as exc:
            tree_key = self._servable(tree_key, exc)
            m = self._cache.match_prefix(tree_key, namespace=namespace, values=False)
        node = m.node
        return MatchResult(m.length, node, node, node)

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """Insert ``req``'s KV up to row position ``up_to`` and move its lock there.

        The insert stores ``[0, up_to)`` (whole pages); the slots it found
        already cached in ``[cache_protected_len, prefix_len)`` are the
        request's duplicates: freed through ``free_segment`` and replaced in the
        row by the tree's. The prompt is then split from the output (SGLang does
        the same, one priority higher), so eviction can drop the output alone.
        """
        kv = req.kv
        protected = kv.cache_protected_len
        if kv.swa_evict_floor > 0:  # never set without SWA (refused); kept for parity
            page = self.page_size
            up_to = min(up_to, -(-kv.swa_evict_floor // page) * page)
        tokens = _int64_view(req.full_untruncated_fill_ids)[:up_to]
        tree_key, namespace = self._tree_key_of(tokens, req)
        page = self.page_size
        length = len(tree_key) // page * page
        if length != len(tree_key):
            tree_key = tree_key[:length]
        row = self._row(kv.req_pool_idx)
        priority = req.priority or 0
        cache = self._cache
        # The nodes this request stored before were counted then (LFU's hits).
        counted = kv.cache_inserted_len
        try:
            prefix = cache.insert(
                tree_key, row[:length], namespace=namespace, priority=priority, counted=counted
            )
        except InvalidInputError as exc:  # an id radixmeta cannot hold: store up to it
            tree_key = self._servable(tree_key, exc)
            length = len(tree_key)
            prefix = cache.insert(
                tree_key, row[:length], namespace=namespace, priority=priority, counted=counted
            )
        kv.cache_inserted_len = max(kv.cache_inserted_len, length)
        # The prompt's own key (bigrams are one fewer than their raw tokens): the
        # leaf is cut there, one priority higher, so eviction can drop the output alone.
        prompt = (len(req.origin_input_ids) - self.is_eagle) // page * page
        # Already cut there when this insert's new leaf starts at the prompt (a
        # checkpoint stored the prompt while the request ran): the second insert
        # would only raise priorities, which only the priority order reads; the
        # match below stamps the path for the others.
        if 0 < prompt < length and (prefix != prompt or self.eviction_policy == "priority"):
            cache.insert(
                tree_key[:prompt],
                row[:prompt],
                namespace=namespace,
                priority=min(priority + 1, 2**63 - 1),
                counted=prompt,  # only cuts the leaf: no store to count
            )
        duplicates = prefix > protected
        if duplicates:
            table = self.req_to_token_pool.req_to_token
            self.token_to_kv_pool_allocator.free_segment(
                table[kv.req_pool_idx, protected:prefix], start_pos=protected
            )
        m = cache.match_prefix(tree_key, namespace=namespace, values=duplicates)
        assert m.length == length, (m.length, length)
        if m.values is not None:  # the tree's slots where the request had its duplicates
            self.req_to_token_pool.write(
                (kv.req_pool_idx, slice(protected, prefix)),
                self._to_device(m.values[protected:prefix]),
            )
        node = m.node
        # Lock the new anchor before releasing the old one: the shared path
        # stays protected throughout, and its tokens are not moved to the
        # evictable side and back.
        cache.lock(node)
        old = req.lock
        if old is not None:
            cache.unlock(old.node)
        req.lock = TreeLock(node, _RECEIPT)
        kv.cache_protected_len = length
        req.last_node = node

    def _tree_key_of(self, tokens: Any, req: Any) -> tuple[Any, Namespace | None]:
        extra, salt = req.extra_key, req.cache_salt or None
        if self.is_eagle:
            if len(tokens) <= 1:
                return (), None
            return tokens[1:], Namespace(extra, salt, int(tokens[0]))
        if extra is None and salt is None:
            return tokens, None
        return tokens, Namespace(extra, salt)

    def evict(self, params: Any) -> Any:
        """Free at least ``params.num_tokens`` tokens of unlocked leaves, in policy order.

        All freed slots go back in one ``free_segment`` call. Complexity:
        O(m log n + tokens) for m leaves.
        """
        start = time.perf_counter()
        freed = self._cache.evict(params.num_tokens)
        count = freed.count
        if count:
            self.token_to_kv_pool_allocator.free_segment(
                self._to_device(freed.values), start_pos=0
            )
            self.update_eviction_metrics(count, start)
        return EvictResult(num_tokens_evicted=count)

    def inc_lock_ref(self, node: Any) -> Any:
        """Lock ``node``'s path; ``delta`` is the change of the evictable size (<= 0)."""
        cache = self._cache
        before = cache.evictable_size
        cache.lock(node)
        return IncLockRefResult(delta=cache.evictable_size - before)

    def lock(self, node: Any) -> Any:
        """A ``TreeLock`` on ``node`` for one holder (no receipt to replay: one lock count)."""
        self._cache.lock(node)
        return TreeLock(node, _RECEIPT)

    def unlock(self, lock: Any) -> None:
        if lock is not None:
            self._cache.unlock(lock.node)

    def dec_lock_ref(self, node: Any, params: Any = None) -> Any:
        """Release one lock taken on ``node``; ``delta`` is the change of the evictable size."""
        cache = self._cache
        before = cache.evictable_size
        cache.unlock(node)
        return DecLockRefResult(delta=cache.evictable_size - before)

    # -- the other calls the scheduler makes -------------------------------------------------
    def insert(self, params: Any) -> Any:
        """Store ``params.key`` with the slots ``params.value``; the caller frees duplicates.

        Returns SGLang's ``InsertResult`` with the cached prefix length and the
        node the key ends on.
        """
        tree_key, namespace = self._tree_key(params.key)
        length = len(tree_key) // self.page_size * self.page_size
        if length != len(tree_key):
            tree_key = tree_key[:length]
        value = params.value
        if value is None:  # SGLang's test fallback: the token ids are the values
            values: Any = None
        else:
            values = _host_int64(value[:length])

        def store(key: Any) -> int:
            return self._cache.insert(
                key,
                values if values is None else values[: len(key)],
                namespace=namespace,
                priority=params.priority or 0,
                counted=params.inserted_len or 0,  # what this request stored before
            )

        try:
            prefix = store(tree_key)
        except InvalidInputError as exc:  # an id radixmeta cannot hold: store up to it
            tree_key = self._servable(tree_key, exc)
            length = len(tree_key)
            prefix = store(tree_key)
        node = self._cache.match_prefix(tree_key, namespace=namespace, values=False).node
        return InsertResult(prefix_len=prefix, total_len=length, last_device_node=node)

    def prefix_device_indices(self, req: Any) -> Any:
        """The KV indices of ``req``'s matched prefix (what allocation writes into its row)."""
        if req.prefix_len == 0:
            return self._empty
        return self._to_device(self._cache.path_values(req.last_node)[: req.prefix_len])

    def path_device_indices(self, node: Any) -> Any:
        """The KV indices of the path to ``node``: an int64 tensor on the allocator's device.

        One copy out of the tree (shared with torch, not copied again) and, off
        the CPU, one transfer. Valid until the next eviction unless the path is
        locked.
        """
        if node.length == 0:
            return self._empty
        return self._to_device(self._cache.path_values(node))

    def touch_prefix(self, key: Any) -> None:
        """Refresh the recency of ``key``'s cached path (a match that returns nothing)."""
        tree_key, namespace = self._tree_key(key)
        try:
            self._cache.match_prefix(tree_key, namespace=namespace, values=False)
        except InvalidInputError as exc:
            tree_key = self._servable(tree_key, exc)
            self._cache.match_prefix(tree_key, namespace=namespace, values=False)

    def _servable(self, tree_key: Any, refusal: InvalidInputError) -> Any:
        """The part of ``tree_key`` radixmeta can hold, after it refused the whole key.

        SGLang's trees take any int64 id; radixmeta's ids are uint32. The key is
        cut before its first id outside ``[0, 2**32)``, down to whole pages, so
        the request is served up to there and misses the rest: a miss, never an
        exception in the scheduler loop. Counted in :attr:`stats`, logged once.
        Any other ``refusal`` is raised again (a bug, not a request's content).
        Complexity: O(len(tree_key)), only on this slow path.
        """
        tokens = np.asarray(tree_key, dtype=None if _is_int64(tree_key) else object)
        if tokens.ndim != 1:
            raise refusal
        bad = np.flatnonzero((tokens < 0) | (tokens >= _TOKEN_LIMIT))
        if not len(bad):
            raise refusal
        first = int(bad[0])
        if self._out_of_range == 0:
            logger.warning(
                "radixmeta: token id %s at position %d is outside [0, 2**32): this key "
                "and any other like it is cached only up to such an id (logged once; "
                "counted in the cache's stats.out_of_range_keys)",
                tokens[first],
                first,
            )
        self._out_of_range += 1
        return tree_key[: first // self.page_size * self.page_size]

    @property
    def stats(self) -> BackendStats:
        """What the backend counted (see :class:`BackendStats`)."""
        return BackendStats(out_of_range_keys=self._out_of_range)

    def supports_fast_match_prefix(self) -> bool:
        """False, as SGLang's own trees answer: the scheduler then does less.

        True makes ``calc_priority`` match every waiting request on every pass
        under ``fcfs`` (and under ``lpm`` past 128 waiting) and skip the
        waiting-prefix touch, a cost that grows with the queue; False keeps
        SGLang's default pass, and its LRU order (bench/sglang_scheduling.py,
        docs/sglang.md).
        """
        return False

    def supports_prefix_sharing(self) -> bool:
        return True

    def supports_mamba(self) -> bool:
        return False

    def root_node_handle(self, extra_key: str | None = None) -> Any:
        # radixmeta answers a miss in any namespace with the default root.
        return self._root

    def is_root(self, node: Any) -> bool:
        return bool(node.length == 0)

    def dfs_weight_order(self, node_handles: Sequence[Any]) -> list[int]:
        """Waiting-queue order for the dfs-weight policy: deepest shared prefixes together.

        SGLang's walk needs the tree's children; radixmeta's handles carry their
        depth only, so requests are grouped by their matched node, groups by
        depth (deepest first), keeping arrival order within and between equal
        depths. Complexity: O(k log k) for k requests.
        """
        groups: dict[Any, list[int]] = {}
        for i, node in enumerate(node_handles):
            groups.setdefault(node, []).append(i)
        ordered = sorted(groups.items(), key=lambda item: (-_depth(item[0]), item[1][0]))
        return [i for _, members in ordered for i in members]

    def evictable_size(self) -> int:
        return self._cache.evictable_size

    def full_evictable_size(self) -> int:
        return self._cache.evictable_size

    def protected_size(self) -> int:
        return self._cache.protected_size

    def full_protected_size(self) -> int:
        return self._cache.protected_size

    def total_size(self) -> int:
        return self._cache.total_size

    def all_values_flatten(self) -> Any:
        """Every cached slot (the scheduler's leak check). Complexity: O(cached tokens)."""
        parts = []
        for namespace in self._cache.namespaces():
            for _, values in self._cache.items(namespace=namespace):
                parts.append(values)
        if not parts:
            return self._empty
        return self._to_device(np.unique(np.concatenate(parts)))

    def sanity_check(self) -> None:
        self._cache.check()

    def pretty_print(self) -> None:
        for namespace in self._cache.namespaces():
            print(self._cache.pretty(namespace))
        print(f"#tokens: {self.total_size()}")

    # -- KV events ---------------------------------------------------------------------------
    def take_events(self) -> list[Any]:
        """SGLang's events for what the tree stored and removed since the last call.

        The records of radixmeta's block-form event log, as SGLang's own
        ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, with SGLang's
        hashes, coalesced as its recorder does (a store that continues the
        previous one's chain, and consecutive removals, become one event).
        """
        log = self._log
        if log is None:
            return []
        events: list[Any] = []
        try:
            records = log.read(after=self._seen) if log.next_seq - 1 > self._seen else []
        except LogTruncatedError:
            # More changed in one step than the ring holds: start the consumers over.
            events.append(AllBlocksCleared())
            records = self._cache.snapshot()
            self._seen = log.next_seq - 1
        else:
            if records:
                self._seen = records[-1].seq
        for record in records:
            self._append_event(events, record)
        return events

    def _append_event(self, events: list[Any], record: Any) -> None:
        if isinstance(record, Cleared):
            events.append(AllBlocksCleared())
            return
        hashes = record.block_hashes.view(np.int64).tolist()  # SGLang publishes them signed
        if isinstance(record, Removed):
            if events and type(events[-1]) is BlockRemoved:
                events[-1].block_hashes.extend(hashes)
            else:
                events.append(BlockRemoved(block_hashes=hashes, medium=StorageMedium.GPU))
            return
        assert isinstance(record, Stored)
        namespace = record.namespace
        parent = None if record.parent_hash is None else signed(record.parent_hash)
        assert record.token_ids is not None  # block form: a store names its tokens
        tokens: list[Any] = record.token_ids.tolist()
        extra = salt = None
        if isinstance(namespace, Namespace):  # never a bigram one: EAGLE + events is refused
            extra, salt = namespace.extra_key, namespace.cache_salt
        lora = (self._lora_names.resolve if self._dynamo else self._lora_names.get)(extra)
        tail: Any = events[-1] if events else None
        if (
            type(tail) is BlockStored
            and tail.cache_salt == salt
            and tail.lora_name == lora
            and tail.block_hashes
            and parent == tail.block_hashes[-1]
        ):
            tail.block_hashes.extend(hashes)
            tail.token_ids.extend(tokens)
            return
        events.append(
            BlockStored(
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=tokens,
                block_size=self.page_size,
                lora_id=None,
                medium=StorageMedium.GPU,
                cache_salt=salt,
                lora_name=lora,
            )
        )

    # -- helpers -----------------------------------------------------------------------------
    def _to_device(self, values: Any) -> Any:
        """An int64 numpy array as a tensor on the allocator's device: shared, then moved once."""
        tensor = torch.from_numpy(values)
        return tensor if self._on_cpu else tensor.to(self.device, non_blocking=True)


def _int64_view(tokens: Any) -> Any:
    """SGLang's token ids as an int64 numpy array: a view of an ``array('q')``, no copy.

    Other inputs (a list, in SGLang's own tests) are converted by radixmeta as
    they are.
    """
    if type(tokens) is array and tokens.typecode == "q":
        return np.frombuffer(tokens, dtype=np.int64) if len(tokens) else _NO_TOKENS
    return tokens


_NO_TOKENS = np.empty(0, dtype=np.int64)


def _is_int64(tokens: Any) -> bool:
    return isinstance(tokens, np.ndarray) and tokens.dtype == np.int64


def _host_int64(slots: Any) -> Any:
    """A slot tensor as something radixmeta reads without a per-element loop.

    A CPU tensor is viewed through numpy (no copy; radixmeta widens an int32
    row itself); a device tensor is copied to the host once.
    """
    if slots.device.type != "cpu":
        slots = slots.cpu()
    return slots.numpy()


def _depth(node: Any) -> int:
    return int(node.length)
