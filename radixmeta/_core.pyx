# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""Native backend: a thin Cython layer over the header-only C++ core.

This module only converts arguments, owns the C++ tree, and maps errors onto
``radixmeta.errors``; every rule lives in ``csrc/include/radixmeta``. It must
behave exactly like ``radixmeta._reference`` (same results, same exception
types and messages), which the test suite checks call by call.

Every method holds the GIL for its whole tree operation: the GIL is what makes
calls from several threads atomic with respect to each other. Creating a Python
object can run a collection, whose finalizers may run any code, so each method
reads all it needs out of the tree before it creates any object.
"""

from cpython.object cimport PyObject
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy
from libcpp.memory cimport unique_ptr
from libcpp.pair cimport pair
from libcpp.vector cimport vector

cimport cython
cimport numpy as cnp

from radixmeta._radix_tree cimport (
    EvictionPolicy,
    InsertOutcome,
    MatchOutcome,
    RadixTree,
    TreeStats,
    kNoCapacity,
    kNoNode,
)

import itertools
import operator

import numpy as np

from radixmeta._keys import check_int, check_priority
from radixmeta._types import EVICTION_POLICIES, CacheStats
from radixmeta.errors import (
    CacheFullError,
    ForeignNodeError,
    InputTypeError,
    InvalidInputError,
    LockError,
    StaleNodeError,
)

cnp.import_array()

cdef extern from "radixmeta/tokens.hpp" namespace "radixmeta" nogil:
    bint narrow_to_tokens(const uint64_t* src, uint32_t* dst, size_t n)
    bint all_non_negative(const int32_t* src, size_t n)

cdef extern from "Python.h":
    bint PyLong_CheckExact(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    PyObject** PySequence_Fast_ITEMS(object o)

cdef object _owner_ids = itertools.count(1)
cdef uint32_t _NO_NAMESPACE = 0xFFFFFFFE  # an id never assigned: "no such namespace"


# -- argument conversion -------------------------------------------------------------

cdef cnp.ndarray _as_1d_integer_array(object obj, str name):
    """The array form of a non-list argument, checked to be 1-D of an integer dtype."""
    cdef cnp.ndarray arr
    if cnp.PyArray_Check(obj):  # the common case first
        arr = <cnp.ndarray>obj
    elif isinstance(obj, (str, bytes)):
        raise InputTypeError(f"{name} must be a sequence of integers, got {type(obj).__name__}")
    else:
        try:
            arr = np.asarray(obj)
        except Exception as exc:
            raise InputTypeError(
                f"{name} must be a sequence of integers, got {type(obj).__name__}"
            ) from exc
    if cnp.PyArray_NDIM(arr) == 0:  # a scalar, None, or an object numpy cannot read
        raise InputTypeError(f"{name} must be a sequence of integers, got {type(obj).__name__}")
    if cnp.PyArray_NDIM(arr) != 1:
        raise InvalidInputError(
            f"{name} must be 1-D, got an array with {cnp.PyArray_NDIM(arr)} dimensions"
        )
    if cnp.PyArray_DIM(arr, 0) == 0 and arr.descr.kind == b'f':
        # np.asarray([]) and np.asarray(range(0)) are float64: still no tokens.
        return np.empty(0, dtype=np.uint32)
    cdef char kind = arr.descr.kind
    if kind != b'i' and kind != b'u':
        raise InputTypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if not cnp.PyArray_ISNOTSWAPPED(arr):
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISALIGNED(arr):
        arr = np.array(arr, order="C", copy=True)  # the core reads whole aligned words
    if cnp.PyArray_ITEMSIZE(arr) < 4:  # rare narrow dtypes: widen once
        arr = arr.astype(np.int64)
    return arr


cdef object _list_item(object item, Py_ssize_t i, str name):
    """A non-int list element as a Python int, or the library's type error."""
    if isinstance(item, float) or not hasattr(item, "__index__"):
        raise InputTypeError(f"{name}[{i}] must be an integer, got {type(item).__name__}")
    return operator.index(item)


cdef object _load_tokens(object key, vector[uint32_t]* scratch, const uint32_t** data,
                         size_t* n):
    """Point *data at key as uint32 tokens; returns the object owning the memory."""
    cdef Py_ssize_t i, length, bad = -1
    cdef PyObject** items
    cdef object item, value, bad_value = None
    cdef long long v
    cdef int overflow
    cdef cnp.ndarray arr
    cdef char kind
    if isinstance(key, (list, tuple)):
        length = len(key)
        scratch.resize(length)
        items = PySequence_Fast_ITEMS(key)
        # Type errors win over range errors, and the first of each is reported.
        for i in range(length):
            item = <object>items[i]
            if PyLong_CheckExact(item):
                v = PyLong_AsLongLongAndOverflow(item, &overflow)
                if overflow == 0 and 0 <= v <= 0xFFFFFFFF:
                    scratch[0][i] = <uint32_t>v
                    continue
                value = item
            else:
                # __index__ may run code that resizes the list under our
                # pointer: go on over a frozen copy (a tuple is its own copy).
                key = tuple(key)
                items = PySequence_Fast_ITEMS(key)
                value = _list_item(item, i, "key")
                if 0 <= value <= 0xFFFFFFFF:
                    scratch[0][i] = <uint32_t>value
                    continue
            if bad < 0:
                bad, bad_value = i, value
        if bad >= 0:
            raise InvalidInputError(f"key[{bad}] = {bad_value} is outside the token range [0, 2**32)")
        data[0] = scratch.data()
        n[0] = length
        return None
    arr = _as_1d_integer_array(key, "key")
    length = cnp.PyArray_DIM(arr, 0)
    kind = arr.descr.kind
    n[0] = length
    if cnp.PyArray_ITEMSIZE(arr) == 4:
        if kind == b'i' and not all_non_negative(<const int32_t*>cnp.PyArray_DATA(arr), length):
            _raise_token_range(arr)
        # int32 without negatives has the same bits as uint32: use it in place.
        data[0] = <const uint32_t*>cnp.PyArray_DATA(arr)
        return arr
    # 64-bit: check the range and narrow into the scratch buffer in one pass.
    scratch.resize(length)
    if not narrow_to_tokens(<const uint64_t*>cnp.PyArray_DATA(arr), scratch.data(), length):
        _raise_token_range(arr)
    data[0] = scratch.data()
    return arr


cdef int _raise_token_range(cnp.ndarray arr) except -1:
    bad = np.flatnonzero((arr < 0) | (arr > 0xFFFFFFFF))[0]
    raise InvalidInputError(f"key[{bad}] = {arr[bad]} is outside the token range [0, 2**32)")


cdef object _load_values(object values, size_t key_length, vector[int64_t]* scratch,
                         const int64_t** data):
    """Point *data at values as int64; returns the object owning the memory."""
    cdef Py_ssize_t i, length, bad = -1
    cdef PyObject** items
    cdef object item, value, bad_value = None
    cdef long long v
    cdef int overflow
    cdef cnp.ndarray arr
    cdef const int32_t* p32
    cdef const uint32_t* pu32
    cdef const uint64_t* pu64
    if isinstance(values, (list, tuple)):
        length = len(values)
        scratch.resize(length)
        items = PySequence_Fast_ITEMS(values)
        for i in range(length):
            item = <object>items[i]
            if PyLong_CheckExact(item):
                v = PyLong_AsLongLongAndOverflow(item, &overflow)
                if overflow == 0:
                    scratch[0][i] = v
                    continue
                value = item
            else:
                values = tuple(values)  # frozen against __index__ side effects, as above
                items = PySequence_Fast_ITEMS(values)
                value = _list_item(item, i, "values")
                if -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
                    scratch[0][i] = <int64_t>value
                    continue
            if bad < 0:
                bad, bad_value = i, value
        _check_values_length(length, key_length)
        if bad >= 0:
            raise InvalidInputError(f"values[{bad}] = {bad_value} is outside the int64 range")
        data[0] = scratch.data()
        return None
    arr = _as_1d_integer_array(values, "values")
    length = cnp.PyArray_DIM(arr, 0)
    _check_values_length(length, key_length)
    kind = arr.descr.kind
    if cnp.PyArray_ITEMSIZE(arr) == 8:
        if kind == b'u':
            pu64 = <const uint64_t*>cnp.PyArray_DATA(arr)
            for i in range(length):
                if pu64[i] > 0x7FFFFFFFFFFFFFFFu:
                    raise InvalidInputError(f"values[{i}] = {pu64[i]} is outside the int64 range")
        data[0] = <const int64_t*>cnp.PyArray_DATA(arr)
        return arr
    scratch.resize(length)
    if kind == b'i':
        p32 = <const int32_t*>cnp.PyArray_DATA(arr)
        for i in range(length):
            scratch[0][i] = p32[i]
    else:
        pu32 = <const uint32_t*>cnp.PyArray_DATA(arr)
        for i in range(length):
            scratch[0][i] = pu32[i]
    data[0] = scratch.data()
    return arr


cdef int _check_values_length(Py_ssize_t length, size_t key_length) except -1:
    if <size_t>length != key_length:
        raise InvalidInputError(
            f"values must have the same length as the key ({key_length}), got {length}"
        )
    return 0


cdef void _free_int64_vector(object capsule) noexcept:
    cdef vector[int64_t]* owned = <vector[int64_t]*>PyCapsule_GetPointer(
        capsule, b"radixmeta.int64_vector")
    del owned


cdef cnp.ndarray _adopt_int64(vector[int64_t]* owned):
    """An int64 array over *owned's buffer, which the array frees: no copy."""
    cdef cnp.npy_intp dims = <cnp.npy_intp>owned.size()
    cdef cnp.ndarray arr = cnp.PyArray_SimpleNewFromData(1, &dims, cnp.NPY_INT64, owned.data())
    capsule = PyCapsule_New(owned, b"radixmeta.int64_vector", _free_int64_vector)
    cnp.PyArray_SetBaseObject(arr, capsule)  # steals a reference
    Py_INCREF(capsule)
    return arr


cdef inline cnp.ndarray _new_int64(size_t n):
    cdef cnp.npy_intp dims = <cnp.npy_intp>n
    return cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)


cdef inline cnp.ndarray _new_uint32(size_t n):
    cdef cnp.npy_intp dims = <cnp.npy_intp>n
    return cnp.PyArray_EMPTY(1, &dims, cnp.NPY_UINT32, 0)


# -- result types ------------------------------------------------------------------

# Freelists recycle these small objects: every match creates a Node and a MatchResult.
@cython.freelist(16)
cdef class Node:
    """Handle naming one cached prefix (a node of the tree).

    A handle stays valid until its node is evicted or the cache is reset; using
    it afterwards raises :class:`~radixmeta.errors.StaleNodeError`.
    """

    cdef uint64_t _owner
    cdef uint64_t _epoch
    cdef uint32_t _index
    cdef uint64_t _generation
    cdef uint32_t _length

    def __init__(self):
        raise TypeError("Node handles come from match_prefix; they cannot be created directly")

    @property
    def length(self):
        """Tokens from the root to the end of this node: the prefix length it names."""
        return self._length

    def __repr__(self):
        return f"<radixmeta.Node length={self._length}>"


@cython.freelist(16)
cdef class MatchResult:
    """Result of ``match_prefix``: ``length``, ``values`` and ``node``."""

    cdef readonly object length
    cdef readonly cnp.ndarray values
    cdef readonly Node node

    def __repr__(self):
        return f"MatchResult(length={self.length}, values=<{len(self.values)} int64>)"


@cython.freelist(16)
cdef class EvictResult:
    """Result of ``evict``: the freed slot ``values`` and their ``count``."""

    cdef readonly cnp.ndarray values
    cdef readonly object count

    def __repr__(self):
        return f"EvictResult(count={self.count})"


# -- the cache ---------------------------------------------------------------------

cdef class CacheCore:
    """Native implementation of the worker cache core (see ``radixmeta.RadixCache``)."""

    cdef unique_ptr[RadixTree] _tree
    cdef uint64_t _owner
    cdef str _eviction
    cdef object _capacity
    cdef dict _ns_ids  # namespace object -> dense id (0 is None)

    def __cinit__(self, page_size=1, *, eviction="lru", capacity=None):
        cdef uint32_t page = 0
        page_size = check_int("page_size", page_size, 1)
        if page_size > 0xFFFFFFFF:
            raise InvalidInputError(f"page_size must be < 2**32, got {page_size}")
        page = page_size
        if eviction not in EVICTION_POLICIES:
            allowed = ", ".join(repr(p) for p in EVICTION_POLICIES)
            raise InvalidInputError(f"eviction must be one of {allowed}, got {eviction!r}")
        if capacity is not None:
            capacity = check_int("capacity", capacity, 0)
        # A policy's position in EVICTION_POLICIES is its C++ EvictionPolicy value.
        self._tree.reset(new RadixTree(
            page, <EvictionPolicy><int>EVICTION_POLICIES.index(eviction), True,
            kNoCapacity if capacity is None else <uint64_t>min(capacity, kNoCapacity - 1),
        ))
        self._owner = next(_owner_ids)
        self._eviction = eviction
        self._capacity = capacity
        self._ns_ids = {None: 0}

    # -- properties ----------------------------------------------------------------
    @property
    def page_size(self):
        """Tokens per page."""
        return self._tree.get().page_size()

    @property
    def eviction(self):
        """The eviction policy name."""
        return self._eviction

    @property
    def capacity(self):
        """The capacity in tokens, or None."""
        return self._capacity

    @property
    def evictable_size(self):
        """Tokens in unlocked nodes. O(1)."""
        return self._tree.get().evictable_size()

    @property
    def protected_size(self):
        """Tokens in locked nodes. O(1)."""
        return self._tree.get().protected_size()

    @property
    def total_size(self):
        """Tokens cached. O(1)."""
        return self._tree.get().total_size()

    @property
    def node_count(self):
        """Nodes in the tree, roots not counted. O(1)."""
        return self._tree.get().node_count()

    @property
    def stats(self):
        """Cumulative counters as a :class:`~radixmeta.CacheStats`."""
        cdef TreeStats s = self._tree.get().stats()
        return CacheStats(s.lookups, s.hit_tokens, s.inserted_tokens, s.evicted_tokens)

    # -- helpers ---------------------------------------------------------------------
    cdef inline uint32_t _namespace_id(self, object namespace, bint create) except? 0xFFFFFFFF:
        if namespace is None:
            return 0
        ns = self._ns_ids.get(namespace)
        if ns is not None:
            return ns
        if not create:
            return _NO_NAMESPACE
        ns = len(self._ns_ids)
        self._ns_ids[namespace] = ns
        return ns

    cdef uint32_t _node_index(self, object node) except? 0xFFFFFFFF:
        if type(node) is not Node:
            raise InputTypeError(f"node must be a Node handle, got {type(node).__name__}")
        cdef Node handle = <Node>node
        if handle._owner != self._owner:
            raise ForeignNodeError("node handle belongs to a different cache")
        if not self._tree.get().is_valid(handle._index, handle._generation, handle._epoch):
            raise StaleNodeError(
                "node handle is stale: its node was evicted or the cache was reset"
            )
        return handle._index

    cdef Node _handle(self, uint32_t index, uint64_t generation, uint32_t length):
        """A handle from fields read while the tree was not yet handed back to Python."""
        cdef Node handle = Node.__new__(Node)
        handle._owner = self._owner
        handle._epoch = self._tree.get().epoch()
        handle._index = index
        handle._generation = generation
        handle._length = length
        return handle

    # -- core API --------------------------------------------------------------------
    def match_prefix(self, key, *, namespace=None):
        """Longest cached prefix of ``key`` (whole pages), as a ``MatchResult``.

        Refreshes the recency of the matched path and splits the edge where the
        match ends inside it. Complexity: O(len(key) + nodes on the path).
        """
        cdef vector[uint32_t] scratch
        cdef const uint32_t* data = NULL
        cdef size_t n = 0
        owner = _load_tokens(key, &scratch, &data, &n)
        cdef uint32_t ns = self._namespace_id(namespace, False)
        cdef RadixTree* tree = self._tree.get()
        # Creating a Python object can run arbitrary code (a collection runs
        # finalizers, which may use this cache), so the values buffer exists
        # before the walk and every read of the tree happens before any other
        # object is made: the call stays atomic.
        cdef cnp.ndarray buffer = _new_int64(n)
        cdef MatchOutcome m = tree.match_prefix(ns, data, n)
        cdef uint64_t generation = tree.node(m.node).generation
        cdef uint32_t depth = tree.node(m.node).depth
        if m.length:
            tree.path_values(m.node, <int64_t*>cnp.PyArray_DATA(buffer))
        cdef cnp.ndarray values = buffer
        if m.length != n:  # values are out of the tree already: an exact copy is safe now
            values = _new_int64(m.length)
            memcpy(cnp.PyArray_DATA(values), cnp.PyArray_DATA(buffer), m.length * sizeof(int64_t))
        cdef MatchResult result = MatchResult.__new__(MatchResult)
        result.length = m.length
        result.values = values
        result.node = self._handle(m.node, generation, depth)
        return result

    def insert(self, key, values=None, *, namespace=None, priority=0):
        """Store ``key`` (whole pages) with its KV slot ``values``.

        Returns the length that was already cached, whose duplicate slots the
        caller frees. Complexity: O(len(key) + nodes on the path + log n).
        """
        cdef vector[uint32_t] scratch
        cdef vector[int64_t] value_scratch
        cdef const uint32_t* data = NULL
        cdef const int64_t* value_data = NULL
        cdef size_t n = 0
        cdef int64_t prio
        owner = _load_tokens(key, &scratch, &data, &n)
        if values is not None:
            value_owner = _load_values(values, n, &value_scratch, &value_data)
        if type(priority) is int and -0x8000000000000000 <= priority <= 0x7FFFFFFFFFFFFFFF:
            prio = priority
        else:
            prio = check_priority(priority)
        new_namespace = namespace is not None and namespace not in self._ns_ids
        cdef uint32_t ns = self._namespace_id(namespace, True)
        cdef InsertOutcome out = self._tree.get().insert(ns, data, value_data, n, prio)
        cdef uint64_t total = self._tree.get().total_size()
        if not out.fits:
            if new_namespace:  # a failed call creates nothing, not even a namespace
                del self._ns_ids[namespace]
            raise CacheFullError(
                f"cannot fit {out.new_tokens} new tokens under capacity {self._capacity}: "
                f"{total} cached, {out.evictable} evictable"
            )
        return out.prefix_length

    def lock(self, node):
        """Lock ``node`` and its path to the root against eviction. O(depth + log n)."""
        self._tree.get().lock(self._node_index(node))

    def unlock(self, node):
        """Release one lock taken by :meth:`lock`. O(depth + log n)."""
        cdef uint32_t index = self._node_index(node)
        cdef RadixTree* tree = self._tree.get()
        if not tree.node(index).is_root and tree.node(index).own_locks == 0:
            raise LockError("node is not locked")
        tree.unlock(index)

    def lock_count(self, node):
        """Number of locks held on ``node`` (directly or through descendants)."""
        return self._tree.get().node(self._node_index(node)).lock_count

    def evict(self, num_tokens):
        """Free at least ``num_tokens`` tokens from unlocked leaves, in policy order.

        Complexity: O(m log n + num_tokens) for m evicted leaves.
        """
        if not (type(num_tokens) is int and num_tokens >= 0):
            num_tokens = check_int("num_tokens", num_tokens, 0)
        cdef uint64_t want = <uint64_t>min(num_tokens, 0xFFFFFFFFFFFFFFFF)
        cdef RadixTree* tree = self._tree.get()
        cdef vector[int64_t]* freed = new vector[int64_t]()
        try:
            # One reservation: eviction overshoots the request by at most one leaf.
            freed.reserve(min(want, tree.evictable_size()))
            tree.evict(want, freed)
            values = _adopt_int64(freed)
        except BaseException:
            del freed
            raise
        cdef EvictResult result = EvictResult.__new__(EvictResult)
        result.values = values
        result.count = len(values)
        return result

    def take_evicted(self):
        """Slots freed by capacity-driven eviction since the last call, in eviction order."""
        cdef vector[int64_t]* taken = new vector[int64_t]()
        taken.swap(self._tree.get().pending_evicted_mutable())  # atomically empties the queue
        try:
            return _adopt_int64(taken)
        except BaseException:
            del taken
            raise

    def reset(self):
        """Empty the cache and its counters; every existing handle becomes stale. O(n)."""
        self._tree.get().reset()
        self._ns_ids = {None: 0}

    def items(self, *, namespace=None):
        """Every leaf's full prefix and values, in lexicographic order of the prefix."""
        cdef uint32_t ns = self._namespace_id(namespace, False)
        cdef RadixTree* tree = self._tree.get()
        if tree.root_of(ns) == kNoNode:
            return []
        # Read everything out of the tree first; only then make Python objects.
        cdef vector[uint32_t] leaves = tree.leaves_in_order(ns)
        cdef vector[size_t] ends
        cdef size_t total = 0
        for leaf in leaves:
            total += tree.node(leaf).depth
            ends.push_back(total)
        cdef vector[uint32_t] tokens = vector[uint32_t](total)
        cdef vector[int64_t] values = vector[int64_t](total)
        cdef size_t start = 0
        for i in range(leaves.size()):
            tree.path_tokens(leaves[i], tokens.data() + start)
            tree.path_values(leaves[i], values.data() + start)
            start = ends[i]
        all_tokens = _new_uint32(total)
        all_values = _new_int64(total)
        if total:
            memcpy(cnp.PyArray_DATA(all_tokens), tokens.data(), total * sizeof(uint32_t))
            memcpy(cnp.PyArray_DATA(all_values), values.data(), total * sizeof(int64_t))
        out = []
        start = 0
        for i in range(leaves.size()):
            out.append((all_tokens[start:ends[i]].copy(), all_values[start:ends[i]].copy()))
            start = ends[i]
        return out

    def _structure(self, namespace=None):
        """(level, label, lock count) of every node, depth first (for ``pretty``)."""
        cdef uint32_t ns = self._namespace_id(namespace, False)
        cdef RadixTree* tree = self._tree.get()
        if tree.root_of(ns) == kNoNode:
            return []
        cdef vector[pair[uint32_t, uint32_t]] nodes = tree.structure(ns)
        cdef vector[uint32_t] locks
        cdef vector[uint32_t] labels
        cdef vector[size_t] ends
        cdef uint32_t length
        for entry in nodes:
            length = tree.node(entry.first).length
            labels.insert(labels.end(), tree.label_tokens(entry.first),
                          tree.label_tokens(entry.first) + length)
            ends.push_back(labels.size())
            locks.push_back(tree.node(entry.first).lock_count)
        all_labels = _new_uint32(labels.size())
        if labels.size():
            memcpy(cnp.PyArray_DATA(all_labels), labels.data(), labels.size() * sizeof(uint32_t))
        out = []
        cdef size_t start = 0
        for i in range(nodes.size()):
            out.append((nodes[i].second, all_labels[start:ends[i]].copy(), locks[i]))
            start = ends[i]
        return out

    def namespaces(self):
        """Namespaces that have a root (None, the default, always does)."""
        cdef RadixTree* tree = self._tree.get()
        return [ns for ns, i in self._ns_ids.items() if tree.root_of(i) != kNoNode]

    def memory_usage(self):
        """Bytes held by the native tree (nodes, label arena, side tables)."""
        return self._tree.get().memory_usage()

    def check(self):
        """Verify every structural invariant in O(n); raises AssertionError on a violation."""
        try:
            self._tree.get().check_invariants()
        except RuntimeError as exc:
            raise AssertionError(str(exc)) from None
include "_meta_core.pxi"
