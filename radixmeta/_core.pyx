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
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
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
    TreeObserver,
    TreeStats,
    kNoCapacity,
    kNoNode,
)

import collections
import itertools
import warnings

import numpy as np

from radixmeta._keys import (
    as_sequence,
    check_flag,
    check_int,
    check_key_length,
    check_page_size,
    check_priority,
    element,
)
from radixmeta._types import EVICTION_POLICIES, TAKE_EVICTED_DEPRECATION, CacheStats
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
    Py_ssize_t PySequence_Fast_GET_SIZE(object o)
    bint PyIndex_Check(object o)
    bint PyBool_Check(object o)
    object PyNumber_Index(object o)

cdef extern from "_pyint.h":
    Py_ssize_t rm_exact_tokens(PyObject** items, Py_ssize_t n, uint32_t* dst)
    Py_ssize_t rm_exact_int64(PyObject** items, Py_ssize_t n, int64_t* dst)
    Py_ssize_t rm_exact_hashes(PyObject** items, Py_ssize_t n, uint64_t* dst)

cdef object _owner_ids = itertools.count(1)
cdef uint32_t _NO_NAMESPACE = 0xFFFFFFFE  # an id never assigned: "no such namespace"


# -- argument conversion -------------------------------------------------------------
# The rules are those of radixmeta/_keys.py, which the reference follows: exact
# lists and tuples are read here in compiled code, arrays in place, and anything
# else is first normalised by _keys.as_sequence (a list copy, or a checked array).

cdef inline bint _exact_list_or_tuple(object obj):
    return type(obj) is list or type(obj) is tuple


cdef cnp.ndarray _integer_array(cnp.ndarray arr, str name):
    """A 1-D integer array as the core reads it: native byte order, C-contiguous, 4+ bytes."""
    if cnp.PyArray_NDIM(arr) != 1:
        if cnp.PyArray_NDIM(arr) == 0:
            raise InputTypeError(f"{name} must be a sequence of integers, got {type(arr).__name__}")
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


cdef object _normalised(object obj, str name):
    """obj as an exact list or tuple, or as a checked 1-D integer array."""
    if _exact_list_or_tuple(obj):
        return obj
    if not cnp.PyArray_Check(obj):
        obj = as_sequence(obj, name)  # copies a list subclass: its __len__ may lie
        if _exact_list_or_tuple(obj):
            return obj
    return _integer_array(<cnp.ndarray>obj, name)


cdef int _check_key_length(Py_ssize_t n) except -1:
    if n > 0xFFFFFFFF:
        check_key_length(n)  # raises the library's error, as the reference does
    return 0


cdef object _np_bool = np.bool_


cdef inline object _element(object item, str name, Py_ssize_t i):
    """_keys.element in compiled code: the common integer-like objects without a Python call."""
    if PyIndex_Check(item) and not PyBool_Check(item) and type(item) is not _np_bool:
        return PyNumber_Index(item)
    return element(item, name, i)  # raises the library's error (or takes a rare subclass)


cdef int _tokens_one_by_one(tuple items, Py_ssize_t i, uint32_t* dst, str name="key") except -1:
    """Convert items[i:] into dst, element by element from i (the slow path)."""
    cdef Py_ssize_t n = len(items)
    cdef PyObject** base = PySequence_Fast_ITEMS(items)
    while i < n:
        value = _element(items[i], name, i)
        if not 0 <= value <= 0xFFFFFFFF:
            raise InvalidInputError(f"{name}[{i}] = {value} is outside the token range [0, 2**32)")
        dst[i] = <uint32_t>value
        i += 1
        i += rm_exact_tokens(base + i, n - i, dst + i)
    return 0


cdef object _load_tokens(object key, vector[uint32_t]* scratch, const uint32_t** data,
                         size_t* n):
    """Point *data at key as uint32 tokens; returns the object owning the memory."""
    cdef Py_ssize_t length, done
    cdef cnp.ndarray arr
    key = _normalised(key, "key")
    if not cnp.PyArray_Check(key):
        length = PySequence_Fast_GET_SIZE(key)  # an exact list or tuple: the size is true
        _check_key_length(length)
        scratch.resize(length)
        done = rm_exact_tokens(PySequence_Fast_ITEMS(key), length, scratch.data())
        if done < length:  # __index__ may run code that changes the list: use a snapshot
            _tokens_one_by_one(tuple(key), done, scratch.data())
        data[0] = scratch.data()
        n[0] = length
        return key
    arr = <cnp.ndarray>key
    length = cnp.PyArray_DIM(arr, 0)
    _check_key_length(length)
    n[0] = length
    if cnp.PyArray_ITEMSIZE(arr) == 4:
        if arr.descr.kind == b'i' and not all_non_negative(
                <const int32_t*>cnp.PyArray_DATA(arr), length):
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


cdef int _raise_token_range(cnp.ndarray arr, str name="key") except -1:
    bad = np.flatnonzero((arr < 0) | (arr > 0xFFFFFFFF))[0]
    raise InvalidInputError(f"{name}[{bad}] = {arr[bad]} is outside the token range [0, 2**32)")


def token_array(tokens, str name="tokens"):
    """``tokens`` as a 1-D, C-contiguous uint32 array, converted once by the trees' rules.

    What a caller that hands one prompt to several tree calls converts first (the
    Router does): a uint32 array that is already 1-D, C-contiguous and aligned is
    returned as it is, without a copy; every other form (a list or tuple, an
    ``array.array``, a buffer, an integer array of another dtype or layout) becomes a
    new array, read and range-checked in compiled code. Errors are the trees' (see
    ``radixmeta._keys``), naming ``name``: ``tokens[3] = -1 is outside the token range
    [0, 2**32)``. Complexity: O(len(tokens)).
    """
    cdef cnp.ndarray arr, out
    cdef Py_ssize_t length, done
    cdef uint32_t* dst
    if cnp.PyArray_CheckExact(tokens):
        arr = <cnp.ndarray>tokens
        if (arr.descr.type_num == cnp.NPY_UINT32 and cnp.PyArray_NDIM(arr) == 1
                and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISALIGNED(arr)
                and cnp.PyArray_ISNOTSWAPPED(arr)):
            _check_key_length(cnp.PyArray_DIM(arr, 0))
            return arr
    obj = _normalised(tokens, name)
    if not cnp.PyArray_Check(obj):  # an exact list or tuple: read straight into the result
        length = PySequence_Fast_GET_SIZE(obj)
        _check_key_length(length)
        out = _new_uint32(length)
        dst = <uint32_t*>cnp.PyArray_DATA(out)
        done = rm_exact_tokens(PySequence_Fast_ITEMS(obj), length, dst)
        if done < length:  # __index__ may run code that changes the list: use a snapshot
            _tokens_one_by_one(tuple(obj), done, dst, name)
        return out
    arr = <cnp.ndarray>obj  # native order, C-contiguous, aligned, 4 or 8 bytes an item
    length = cnp.PyArray_DIM(arr, 0)
    _check_key_length(length)
    out = _new_uint32(length)
    dst = <uint32_t*>cnp.PyArray_DATA(out)
    if cnp.PyArray_ITEMSIZE(arr) == 4:
        if arr.descr.kind == b'i' and not all_non_negative(
                <const int32_t*>cnp.PyArray_DATA(arr), length):
            _raise_token_range(arr, name)
        if length:
            memcpy(dst, cnp.PyArray_DATA(arr), length * sizeof(uint32_t))
        return out
    if not narrow_to_tokens(<const uint64_t*>cnp.PyArray_DATA(arr), dst, length):
        _raise_token_range(arr, name)
    return out


cdef int _values_one_by_one(tuple items, Py_ssize_t i, int64_t* dst) except -1:
    """Convert items[i:] into dst, element by element from i (the slow path)."""
    cdef Py_ssize_t n = len(items)
    cdef PyObject** base = PySequence_Fast_ITEMS(items)
    while i < n:
        value = _element(items[i], "values", i)
        if not -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
            raise InvalidInputError(f"values[{i}] = {value} is outside the int64 range")
        dst[i] = <int64_t>value
        i += 1
        i += rm_exact_int64(base + i, n - i, dst + i)
    return 0


cdef object _load_values(object values, size_t key_length, vector[int64_t]* scratch,
                         const int64_t** data):
    """Point *data at values as int64; returns the object owning the memory."""
    cdef Py_ssize_t i, length, done
    cdef cnp.ndarray arr
    cdef const int32_t* p32
    cdef const uint32_t* pu32
    cdef const uint64_t* pu64
    values = _normalised(values, "values")
    if not cnp.PyArray_Check(values):
        length = PySequence_Fast_GET_SIZE(values)
        _check_values_length(length, key_length)
        scratch.resize(length)
        done = rm_exact_int64(PySequence_Fast_ITEMS(values), length, scratch.data())
        if done < length:
            _values_one_by_one(tuple(values), done, scratch.data())
        data[0] = scratch.data()
        return values
    arr = <cnp.ndarray>values
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


cdef cnp.ndarray _uint32_copy(const vector[uint32_t]& tokens, size_t begin, size_t end):
    arr = _new_uint32(end - begin)
    if end > begin:
        memcpy(cnp.PyArray_DATA(arr), tokens.data() + begin, (end - begin) * sizeof(uint32_t))
    return arr


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
    """Result of ``match_prefix``: ``length``, ``values`` and ``node``.

    ``values`` is None when the match was asked with ``values=False``.
    """

    cdef readonly object length
    cdef readonly object values
    cdef readonly Node node

    def __repr__(self):
        shown = "None" if self.values is None else f"<{len(self.values)} int64>"
        return f"MatchResult(length={self.length}, values={shown})"


@cython.freelist(16)
cdef class EvictResult:
    """Result of ``evict``: the freed slot ``values`` and their ``count`` (tokens freed).

    ``values`` is None for a cache made with ``store_values=False``.
    """

    cdef readonly cnp.ndarray values
    cdef readonly object count

    def __repr__(self):
        return f"EvictResult(count={self.count})"


include "_log_core.pxi"


# -- namespaces --------------------------------------------------------------------

cdef class _NamespaceIds:
    """Namespace objects <-> the dense ids a core knows them by (0 is None, the default).

    An id is recycled once its core frees the namespace's root, so the table
    stays as small as the set of namespaces holding pages. Both trees' bindings
    keep one; each asks its own core whether a namespace still has a root.

    With an event log attached (the cache's), a freed id is only *retired*: its
    name stays in ``names``, which the log reads, until the log holds no record
    of it any more; then it is recycled. The ``names`` dict is never replaced,
    so the log keeps seeing it.
    """

    cdef dict ids  # live namespace -> id, in order of creation
    cdef dict names  # id -> namespace, live and retired
    cdef list free
    cdef uint32_t next_id
    cdef object retiring  # deque of (id, the log's next seq when it was retired)

    def __cinit__(self):
        self.names = {}
        self.retiring = collections.deque()
        self.forget()

    cdef int forget(self, object seq=None) except -1:
        """Forget every namespace (a reset); with ``seq``, retire their ids instead."""
        if seq is None:
            self.names.clear()
            self.names[0] = None
            self.free = []
            self.next_id = 1
            self.retiring.clear()
        else:
            for ns in self.ids.values():
                if ns:
                    self.retiring.append((ns, seq))
        self.ids = {None: 0}
        return 0

    cdef inline uint32_t lookup(self, object namespace, bint create) except? 0xFFFFFFFF:
        """The id of namespace; a new one if create, else _NO_NAMESPACE for an unknown one."""
        if namespace is None:
            return 0
        ns = self.ids.get(namespace)
        if ns is not None:
            return ns
        if not create:
            return _NO_NAMESPACE
        if self.free:
            ns = self.free.pop()
        else:
            ns = self.next_id
            self.next_id += 1
        self.ids[namespace] = ns
        self.names[ns] = namespace
        return ns

    cdef int release(self, uint32_t ns, object seq=None) except -1:
        """Forget id ns: its core holds no root for it (any more, or yet).

        With ``seq`` (the log's next sequence number) the id is retired until
        the log has dropped every record before it.
        """
        if ns == 0:
            return 0
        name = self.names.get(ns)
        if self.ids.get(name) != ns:  # not live: unknown, or already retired
            return 0
        del self.ids[name]
        if seq is None:
            del self.names[ns]
            self.free.append(ns)
        else:
            self.retiring.append((ns, seq))
        return 0

    cdef int recycle(self, uint64_t oldest) except -1:
        """Recycle the retired ids that no record from ``oldest`` on can name."""
        while self.retiring and self.retiring[0][1] <= oldest:
            ns = self.retiring.popleft()[0]
            del self.names[ns]
            self.free.append(ns)
        return 0

    cdef int renew(self, uint32_t ns) except -1:
        """Move ns to the end of the creation order: it was emptied, then created anew."""
        name = self.names[ns]
        del self.ids[name]
        self.ids[name] = ns
        return 0


# -- the cache ---------------------------------------------------------------------

cdef class CacheCore:
    """Native implementation of the worker cache core (see ``radixmeta.RadixCache``)."""

    cdef unique_ptr[RadixTree] _tree
    cdef uint64_t _owner
    cdef str _eviction
    cdef object _capacity
    cdef object _on_evict
    cdef _NamespaceIds _namespaces
    cdef EventLogCore _log
    # Slots the last insert freed for capacity, only for the deprecated
    # take_evicted() when there is no on_evict: never more than one call's worth.
    cdef object _last_evicted
    cdef bint _store_values

    def __cinit__(self, page_size=1, *, eviction="lru", capacity=None, on_evict=None,
                  event_log=None, refresh_split_tail=False, store_values=True):
        cdef uint32_t page = check_page_size(page_size)
        cdef bint keep = check_flag("store_values", store_values)
        if eviction not in EVICTION_POLICIES:
            allowed = ", ".join(repr(p) for p in EVICTION_POLICIES)
            raise InvalidInputError(f"eviction must be one of {allowed}, got {eviction!r}")
        if capacity is not None:
            capacity = check_int("capacity", capacity, 0)
        if on_evict is not None and not callable(on_evict):
            raise InputTypeError(
                f"on_evict must be callable or None, got {type(on_evict).__name__}"
            )
        if event_log is not None and not isinstance(event_log, EventLogCore):
            raise InputTypeError(
                f"event_log must be an EventLog or None, got {type(event_log).__name__}"
            )
        if on_evict is not None and not keep:
            raise InvalidInputError(
                "on_evict needs slot values: a cache made with store_values=False frees none"
            )
        # A policy's position in EVICTION_POLICIES is its C++ EvictionPolicy value.
        self._tree.reset(new RadixTree(
            page, <EvictionPolicy><int>EVICTION_POLICIES.index(eviction), keep,
            kNoCapacity if capacity is None else <uint64_t>min(capacity, kNoCapacity - 1),
        ))
        self._tree.get().set_refresh_split_tail(check_flag("refresh_split_tail",
                                                           refresh_split_tail))
        self._owner = next(_owner_ids)
        self._store_values = keep
        self._eviction = eviction
        self._capacity = capacity
        self._on_evict = on_evict
        self._namespaces = _NamespaceIds()
        self._last_evicted = None
        self._log = None
        if event_log is not None:
            (<EventLogCore>event_log)._attach(self._namespaces.names, page)
            self._log = event_log
            self._tree.get().set_observer(self._log._ring.get())

    def __dealloc__(self):
        if self._tree:  # the log may outlive the cache: the tree must not keep a pointer to it
            self._tree.get().set_observer(NULL)

    @property
    def event_log(self):
        """The attached :class:`~radixmeta.EventLog`, or None."""
        return self._log

    def __reduce__(self):
        # The tree lives in C++ memory: a copy would need a deep, versioned format.
        raise TypeError(f"cannot pickle or copy {type(self).__name__!r} object")

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
    def refresh_split_tail(self):
        """Whether a split also stamps the lower half of the cut node as just used."""
        return self._tree.get().refresh_split_tail()

    @property
    def store_values(self):
        """Whether the cache keeps a KV slot value beside each token."""
        return self._store_values

    @property
    def on_evict(self):
        """The callback that receives slots the cache frees on its own, or None."""
        return self._on_evict

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
        return self._namespaces.lookup(namespace, create)

    cdef object _log_seq(self):
        """The log's next sequence number (None without a log): when freed ids retire."""
        return None if self._log is None else self._log._ring.get().next_seq()

    cdef int _recycle_retired(self) except -1:
        if self._log is not None:
            self._namespaces.recycle(self._log._ring.get().oldest_seq())
        return 0

    cdef int _release_namespace(self, uint32_t ns) except -1:
        """Forget namespace id ns if the core holds no root for it (it may have one again)."""
        if ns != 0 and self._tree.get().root_of(ns) == kNoNode:
            self._namespaces.release(ns, self._log_seq())
        return 0

    cdef int _release_dropped_namespaces(self) except -1:
        cdef vector[uint32_t] dropped = self._tree.get().take_dropped_namespaces()
        for ns in dropped:
            if self._tree.get().root_of(ns) == kNoNode:
                self._namespaces.release(ns, self._log_seq())
            else:  # emptied, then created anew by the same insert: it is a new namespace
                self._namespaces.renew(ns)
        return 0

    cdef int _need_values(self, str what) except -1:
        """Raise if this cache keeps no slot values (``what`` names the call)."""
        if not self._store_values:
            raise InvalidInputError(
                f"{what} needs slot values: this cache was made with store_values=False"
            )
        return 0

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

    cdef Node _handle(self, uint32_t index, uint64_t generation, uint64_t epoch, uint32_t length):
        """A handle from fields read while the tree was not yet handed back to Python."""
        cdef Node handle = Node.__new__(Node)
        handle._owner = self._owner
        handle._epoch = epoch
        handle._index = index
        handle._generation = generation
        handle._length = length
        return handle

    # -- core API --------------------------------------------------------------------
    def match_prefix(self, key, *, namespace=None, values=True):
        """Longest cached prefix of ``key`` (whole pages), as a ``MatchResult``.

        Refreshes the recency of the matched path and splits the edge where the
        match ends inside it. With ``values=False`` the slots are not gathered
        (``values`` is None): the call for a caller that needs only the length.
        Complexity: O(len(key) + nodes on the path).
        """
        cdef vector[uint32_t] scratch
        cdef const uint32_t* data = NULL
        cdef size_t n = 0
        owner = _load_tokens(key, &scratch, &data, &n)
        cdef bint gather = values is True or check_flag("values", values)
        if gather and not self._store_values:
            self._need_values("match_prefix(values=True)")
        cdef uint32_t ns = self._namespace_id(namespace, False)
        cdef RadixTree* tree = self._tree.get()
        # Creating a Python object can run arbitrary code (a collection runs
        # finalizers, which may use this cache), so the values buffer exists
        # before the walk and every read of the tree, the epoch included,
        # happens before any other object is made: the call stays atomic.
        cdef cnp.ndarray buffer = _new_int64(n) if gather else None
        cdef MatchOutcome m = tree.match_prefix(ns, data, n)
        cdef uint64_t generation = tree.node(m.node).generation
        cdef uint64_t epoch = tree.epoch()
        cdef uint32_t depth = tree.node(m.node).depth
        if gather and m.length:
            tree.path_values(m.node, <int64_t*>cnp.PyArray_DATA(buffer))
        cdef cnp.ndarray gathered = buffer
        if gather and m.length != n:  # the values are out of the tree: a copy is safe now
            gathered = _new_int64(m.length)
            memcpy(cnp.PyArray_DATA(gathered), cnp.PyArray_DATA(buffer), m.length * sizeof(int64_t))
        cdef MatchResult result = MatchResult.__new__(MatchResult)
        result.length = m.length
        result.values = gathered
        result.node = self._handle(m.node, generation, epoch, depth)
        return result

    def insert(self, key, values=None, *, namespace=None, priority=0, counted=0):
        """Store ``key`` (whole pages) with its KV slot ``values``.

        Returns the length that was already cached, whose duplicate slots the
        caller frees. Under LFU, every node of the path that ends past the
        first ``counted`` tokens gains a hit. Complexity: O(len(key) + nodes
        on the path + log n).
        """
        cdef vector[uint32_t] scratch
        cdef vector[int64_t] value_scratch
        cdef const uint32_t* data = NULL
        cdef const int64_t* value_data = NULL
        cdef size_t n = 0
        cdef int64_t prio
        cdef uint64_t already = 0
        owner = _load_tokens(key, &scratch, &data, &n)
        if values is not None:
            self._need_values("insert(values=...)")
            value_owner = _load_values(values, n, &value_scratch, &value_data)
        if type(priority) is int and -0x8000000000000000 <= priority <= 0x7FFFFFFFFFFFFFFF:
            prio = priority
        else:
            prio = check_priority(priority)
        if not (type(counted) is int and counted == 0):
            # Past 2**64 - 1 nothing is counted anyway: keys are shorter than that.
            already = min(check_int("counted", counted, 0), 0xFFFFFFFFFFFFFFFF)
        cdef uint32_t ns = self._namespace_id(namespace, True)
        cdef RadixTree* tree = self._tree.get()
        cdef InsertOutcome out = tree.insert(ns, data, value_data, n, prio, already)
        cdef uint64_t total = tree.total_size()
        # Out of the core before any object is made: the slots this call freed
        # for capacity, and the namespaces it emptied (or did not create).
        cdef vector[int64_t]* freed
        evicted = None
        if tree.pending_evicted_mutable().size():
            freed = new vector[int64_t]()
            freed.swap(tree.pending_evicted_mutable())
            try:
                evicted = _adopt_int64(freed)
            except BaseException:
                del freed
                raise
        # Not only when slots were freed: a cache without values frees none, yet
        # its capacity eviction may empty namespaces all the same.
        self._release_dropped_namespaces()
        if ns != 0:
            self._release_namespace(ns)
        if self._log is not None:
            self._recycle_retired()
        if not out.fits:
            raise CacheFullError(
                f"cannot fit {out.new_tokens} new tokens under capacity {self._capacity}: "
                f"{total} cached, {out.evictable} evictable"
            )
        if self._on_evict is None:
            self._last_evicted = evicted
        elif evicted is not None:
            self._on_evict(evicted)
        return out.prefix_length

    def path_values(self, node):
        """The KV slots of the path from the root to ``node`` (int64, ``node.length`` of them).

        What ``match_prefix`` gathers, for a node matched earlier with
        ``values=False``. Complexity: O(nodes on the path + node.length).
        """
        cdef uint32_t index = self._node_index(node)
        self._need_values("path_values()")
        cdef cnp.ndarray out = _new_int64(self._tree.get().node(index).depth)
        # Making the array can run code that uses this cache (a collection's
        # finalizers): check the handle again before reading the tree.
        index = self._node_index(node)
        if cnp.PyArray_DIM(out, 0):
            self._tree.get().path_values(index, <int64_t*>cnp.PyArray_DATA(out))
        return out

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
        cdef uint64_t done
        cdef EvictResult result
        if not self._store_values:  # nothing to hand back: count the tokens only
            done = tree.evict(want, NULL)
            self._release_dropped_namespaces()
            if self._log is not None:
                self._recycle_retired()
            result = EvictResult.__new__(EvictResult)
            result.values = None
            result.count = done
            return result
        cdef vector[int64_t]* freed = new vector[int64_t]()
        try:
            # One reservation: eviction overshoots the request by at most one leaf.
            freed.reserve(min(want, tree.evictable_size()))
            tree.evict(want, freed)
            values = _adopt_int64(freed)
        except BaseException:
            del freed
            raise
        self._release_dropped_namespaces()
        if self._log is not None:
            self._recycle_retired()
        result = EvictResult.__new__(EvictResult)
        result.values = values
        result.count = len(values)
        return result

    def take_evicted(self):
        """Deprecated: the slots the most recent insert freed for capacity, not yet taken."""
        self._need_values("take_evicted()")
        warnings.warn(TAKE_EVICTED_DEPRECATION, DeprecationWarning, stacklevel=2)
        taken = self._last_evicted
        self._last_evicted = None
        return _new_int64(0) if taken is None else taken

    def reset(self):
        """Empty the cache and its counters; every existing handle becomes stale. O(n).

        With ``on_evict``, every slot the cache held is handed to it afterwards.
        """
        cdef vector[int64_t]* held = new vector[int64_t]()
        try:
            if self._on_evict is not None:  # namespace by namespace, in namespaces() order
                for ns in self._namespaces.ids.values():
                    self._tree.get().values_in_order(ns, held)
            self._tree.get().reset()
            self._namespaces.forget(self._log_seq())
            self._recycle_retired()
            self._last_evicted = None
            slots = _adopt_int64(held)
        except BaseException:
            del held
            raise
        if len(slots):
            self._on_evict(slots)

    def items(self, *, namespace=None):
        """Every leaf's full prefix and values, in lexicographic order of the prefix."""
        self._need_values("items()")
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

    def snapshot(self):
        """The records that rebuild this cache: one ``Stored`` per node, a node before its
        children, namespace by namespace, all stamped with the log's latest sequence number.

        A consumer that fell off the log (``LogTruncatedError``) clears the worker,
        applies these, then reads on after their ``seq``. Complexity: O(n + tokens of
        all paths).
        """
        if self._log is None:
            raise InvalidInputError("snapshot() needs an event log: pass event_log= to RadixCache")
        cdef RadixTree* tree = self._tree.get()
        cdef vector[EventRecord] picked
        cdef vector[uint32_t] tokens
        cdef vector[pair[uint32_t, uint32_t]] nodes
        cdef EventRecord r
        cdef size_t old
        r.kind = 0
        r.seq = 0
        for ns in self._namespaces.ids.values():
            nodes = tree.structure(ns)
            for entry in nodes:
                r.ns = ns
                r.length = tree.node(entry.first).depth
                r.start = r.length - tree.node(entry.first).length
                old = tokens.size()
                tokens.resize(old + r.length)
                tree.path_tokens(entry.first, tokens.data() + old)
                picked.push_back(r)
        return self._log._records(picked, tokens, <int64_t>self._log._ring.get().next_seq() - 1)

    def namespaces(self):
        """Namespaces that hold a page, in order of creation (None, the default, always listed)."""
        cdef RadixTree* tree = self._tree.get()
        return [ns for ns, i in self._namespaces.ids.items() if tree.root_of(i) != kNoNode]

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
include "_scan_core.pxi"


# -- batch prefixes --------------------------------------------------------------------

cdef extern from "radixmeta/prefix_partners.hpp" namespace "radixmeta" nogil:
    cdef cppclass PrefixPartners:
        @staticmethod
        void compute(const uint32_t* const* keys, const uint64_t* lengths, uint32_t count,
                     uint32_t page, int64_t* partner, int64_t* shared) except +
        @staticmethod
        void groups(const uint32_t* const* keys, const uint64_t* lengths, uint32_t count,
                    uint32_t page, double ratio, int64_t* first, int64_t* shared,
                    int64_t* partner_out, int64_t* common_out) except +
        @staticmethod
        uint32_t runs(const int64_t* first, const int64_t* shared, const int64_t* common,
                      const uint64_t* lengths, uint32_t count, int64_t* order, int64_t* offsets,
                      int64_t* own) except +


cdef list _batch_keys(object keys, vector[const uint32_t*]* pointers, vector[uint64_t]* lengths):
    """Every key of a batch as a checked uint32 array (before any is read), and their data."""
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        raise InputTypeError(f"keys must be a sequence of keys, got {type(keys).__name__}")
    owned = [_owned_tokens(k) for k in keys]
    cdef Py_ssize_t i
    cdef cnp.ndarray arr
    pointers.resize(len(owned))
    lengths.resize(len(owned))
    for i in range(len(owned)):
        arr = <cnp.ndarray>owned[i]
        pointers[0][i] = <const uint32_t*>cnp.PyArray_DATA(arr)
        lengths[0][i] = cnp.PyArray_DIM(arr, 0)
    return owned


def prefix_partners(keys, page_size):
    """Per key of a batch: the first earlier key sharing the most whole pages with it (-1 for
    none) and how many tokens; two ``int64`` arrays. One trie over the batch, O(total tokens)."""
    cdef uint32_t page = check_page_size(page_size)
    cdef vector[const uint32_t*] pointers
    cdef vector[uint64_t] lengths
    owned = _batch_keys(keys, &pointers, &lengths)
    cdef Py_ssize_t count = len(owned)
    cdef cnp.ndarray partner = _new_int64(count)
    cdef cnp.ndarray shared = _new_int64(count)
    PrefixPartners.compute(pointers.data(), lengths.data(), <uint32_t>count, page,
                           <int64_t*>cnp.PyArray_DATA(partner), <int64_t*>cnp.PyArray_DATA(shared))
    return partner, shared


def prefix_groups(keys, page_size, ratio):
    """The batch's shared-prefix groups from ``prefix_partners``'s links (see
    ``radixmeta._reference.prefix_groups``): per key its group's first key, and per first key
    the tokens its group shares; two ``int64`` arrays."""
    first, shared, _, _ = prefix_links(keys, page_size, ratio)
    return first, shared


def prefix_links(keys, page_size, ratio):
    """``prefix_groups`` and ``prefix_partners`` from one trie: (first, shared, partner,
    common), four ``int64`` arrays (see ``radixmeta._reference.prefix_links``)."""
    cdef uint32_t page = check_page_size(page_size)
    cdef double share = ratio
    cdef vector[const uint32_t*] pointers
    cdef vector[uint64_t] lengths
    owned = _batch_keys(keys, &pointers, &lengths)
    cdef Py_ssize_t count = len(owned)
    cdef cnp.ndarray first = _new_int64(count)
    cdef cnp.ndarray shared = _new_int64(count)
    cdef cnp.ndarray partner = _new_int64(count)
    cdef cnp.ndarray common = _new_int64(count)
    PrefixPartners.groups(pointers.data(), lengths.data(), <uint32_t>count, page, share,
                          <int64_t*>cnp.PyArray_DATA(first), <int64_t*>cnp.PyArray_DATA(shared),
                          <int64_t*>cnp.PyArray_DATA(partner), <int64_t*>cnp.PyArray_DATA(common))
    return first, shared, partner, common


def prefix_group_runs(keys, page_size, ratio):
    """The batch's groups, ready to hand out, and its links by batch index:
    ``(runs, partner, common, own)`` as ``radixmeta._reference.prefix_group_runs`` gives
    them. ``runs`` is per group, in order of its first key, ``(members, shared)``;
    ``partner``, ``common`` and ``own`` are flat lists over the whole batch, so that
    a group of one costs one list and one tuple here (a large batch of distinct
    prompts is mostly such groups). One trie, O(total tokens)."""
    cdef uint32_t page = check_page_size(page_size)
    cdef double share = ratio
    cdef vector[const uint32_t*] pointers
    cdef vector[uint64_t] lengths
    owned = _batch_keys(keys, &pointers, &lengths)
    cdef uint32_t count = <uint32_t>len(owned)
    cdef vector[int64_t] first, shared, partner, common, order, offsets, own
    first.resize(count)
    shared.resize(count)
    partner.resize(count)
    common.resize(count)
    order.resize(count)
    offsets.resize(count + 1)
    own.resize(count)
    PrefixPartners.groups(pointers.data(), lengths.data(), count, page, share, first.data(),
                          shared.data(), partner.data(), common.data())
    cdef uint32_t groups = PrefixPartners.runs(first.data(), shared.data(), common.data(),
                                               lengths.data(), count, order.data(),
                                               offsets.data(), own.data())
    cdef uint32_t g
    cdef int64_t j, k
    cdef list runs = [None] * groups
    cdef list partner_of = [None] * count
    cdef list common_of = [None] * count
    cdef list own_of = [None] * count
    for g in range(groups):
        members = [order[j] for j in range(offsets[g], offsets[g + 1])]
        runs[g] = (members, shared[order[offsets[g]]])
        for j in range(offsets[g], offsets[g + 1]):
            k = order[j]
            partner_of[k] = partner[k]
            common_of[k] = common[k]
            own_of[k] = own[j]
    return runs, partner_of, common_of, own_of


# -- policy scans ----------------------------------------------------------------------

cdef extern from "radixmeta/extremes.hpp" namespace "radixmeta" nogil:
    cdef struct Extremes:
        int64_t low
        size_t low_at
        int64_t high
        size_t high_at
        size_t high_count
    Extremes scan_extremes "radixmeta::extremes"(const int64_t* values, size_t n)


def extremes(values):
    """``(low, low_at, high, high_at, high_count)`` of a non-empty sequence of numbers: its
    smallest and largest value, the first position of each, and how many hold the largest.

    One pass in C for a list or tuple of ints (what the router's views hold); anything else
    gives the same answer through ``min``, ``max``, ``index`` and ``count``
    (``radixmeta._reference.extremes``).
    """
    cdef int64_t stack[64]
    cdef vector[int64_t] heap
    cdef int64_t* row = stack
    cdef Py_ssize_t i, n
    cdef int overflow = 0
    cdef Extremes e
    if type(values) is list or type(values) is tuple:
        n = len(values)
        if 0 < n:
            if n > 64:
                heap.resize(n)
                row = heap.data()
            for i in range(n):
                item = values[i]
                if type(item) is not int:
                    break
                row[i] = PyLong_AsLongLongAndOverflow(item, &overflow)
                if overflow:
                    break
            else:
                e = scan_extremes(row, n)
                return e.low, e.low_at, e.high, e.high_at, e.high_count
    return _generic_extremes(values)


cdef tuple _generic_extremes(object values):
    row = list(values)
    if not row:
        raise InvalidInputError("extremes of an empty sequence")
    low = min(row)
    high = max(row)
    return low, row.index(low), high, row.index(high), row.count(high)


# -- wire helpers ----------------------------------------------------------------------

cdef extern from "radixmeta/msgpack_ints.hpp" namespace "radixmeta" nogil:
    cdef struct MsgpackArrayHeader:
        bint ok
        uint64_t count
        size_t offset
    MsgpackArrayHeader msgpack_array_header(const uint8_t* data, size_t size)
    bint msgpack_read_tokens(const uint8_t* data, size_t size, MsgpackArrayHeader h,
                             uint32_t* out)


def msgpack_tokens(const unsigned char[::1] raw not None):
    """The uint32 array encoded in ``raw`` (one msgpack array of ints in [0, 2**32)), or None.

    For the wire codecs: token ids read with no Python object per token. None
    means "not that shape" (a nested array, a negative or large int, trailing
    bytes), and the caller decodes the slow way.
    """
    cdef size_t size = raw.shape[0]
    cdef const uint8_t* data = <const uint8_t*>&raw[0] if size else NULL
    cdef MsgpackArrayHeader h = msgpack_array_header(data, size)
    if not h.ok or h.count > size:  # each element takes at least one byte
        return None
    cdef cnp.ndarray out = _new_uint32(h.count)
    if not msgpack_read_tokens(data, size, h, <uint32_t*>cnp.PyArray_DATA(out)):
        return None
    return out
