# The router's meta-tree: the native MetaCore behind radixmeta.MetaTree.
# Included into _core.pyx, whose argument converters it shares.

from radixmeta._meta_tree cimport (
    MatchPath,
    MetaTree,
    StoredCheck,
    kAllTiers,
    kCycle,
    kOtherPage,
    kRenamed,
    kRepeated,
    kStoredOk,
    kUnknownParent,
)

from radixmeta import _blocks, _holds
from radixmeta._blocks import BlockStatus
from radixmeta._keys import PER_BLOCK as _PER_BLOCK, PER_PAGE as _PER_PAGE, check_namespace
from radixmeta._keys import per_key_tags as _per_key_tags, tags as _checked_tags
from radixmeta._types import DumpRecord, MetaItem
from radixmeta._workers import WorkerId, WorkerTable, resolve_in

import threading

cdef object _HASH_LIMIT = 2**64
cdef object _WorkerId = WorkerId


cdef inline bint _is_live(tuple slots, object worker):
    """Fast path of resolve_in: the very WorkerId object the table handed out."""
    cdef Py_ssize_t index
    if type(worker) is not _WorkerId:
        return False
    index = worker.index
    return 0 <= index < len(slots) and slots[index] is worker


cdef object _load_hashes(object hashes, vector[uint64_t]* scratch, const uint64_t** data,
                         size_t* n):
    """Point *data at block hashes as uint64; returns the object owning the memory."""
    cdef Py_ssize_t i, length
    cdef cnp.ndarray arr
    if cnp.PyArray_Check(hashes):
        arr = <cnp.ndarray>hashes
        if (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_ITEMSIZE(arr) == 8
                and (arr.descr.kind == b'i' or arr.descr.kind == b'u')
                and cnp.PyArray_ISNOTSWAPPED(arr) and cnp.PyArray_IS_C_CONTIGUOUS(arr)
                and cnp.PyArray_ISALIGNED(arr)):
            data[0] = <const uint64_t*>cnp.PyArray_DATA(arr)
            n[0] = cnp.PyArray_DIM(arr, 0)
            return arr  # signed hashes are read as their two's complement, in place
    elif _exact_list_or_tuple(hashes):
        length = PySequence_Fast_GET_SIZE(hashes)  # an exact list or tuple: the size is true
        scratch.resize(length)
        if rm_exact_hashes(PySequence_Fast_ITEMS(hashes), length, scratch.data()) == length:
            data[0] = scratch.data()
            n[0] = length
            return hashes
    # Anything else (subclasses, other dtypes, large or bad values): the shared
    # converter applies the input rules and raises the reference's errors.
    converted = _blocks.block_hashes(hashes)
    scratch.resize(len(converted))
    for i, item in enumerate(converted):
        scratch[0][i] = <uint64_t>item
    data[0] = scratch.data()
    n[0] = len(converted)
    return None


cdef object _load_tags(object extras, size_t count, str per, vector[uint64_t]* scratch,
                       const uint64_t** data):
    """Point *data at one extra tag per page, or at NULL when all are 0 (or extras is None)."""
    data[0] = NULL
    if extras is None:
        return None
    cdef cnp.ndarray arr
    cdef const uint64_t* p
    cdef size_t i
    cdef Py_ssize_t length
    if cnp.PyArray_Check(extras):
        arr = <cnp.ndarray>extras
        if (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_TYPE(arr) == cnp.NPY_UINT64
                and <size_t>cnp.PyArray_DIM(arr, 0) == count and cnp.PyArray_ISNOTSWAPPED(arr)
                and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISALIGNED(arr)):
            p = <const uint64_t*>cnp.PyArray_DATA(arr)
            for i in range(count):
                if p[i] != 0:
                    data[0] = p
                    break
            return arr
    elif _exact_list_or_tuple(extras) and <size_t>PySequence_Fast_GET_SIZE(extras) == count:
        length = count
        scratch.resize(count)
        # Hashes read negatives as two's complement (>= 2**63): those are bad
        # tags, and so are left, with tags of 2**63 and up, to the converter.
        if rm_exact_hashes(PySequence_Fast_ITEMS(extras), length, scratch.data()) == length:
            tagged = False
            for i in range(count):
                if scratch[0][i] >= 0x8000000000000000u:
                    break
                tagged = tagged or scratch[0][i] != 0
            else:
                if tagged:
                    data[0] = scratch.data()
                return extras
    # Anything else: the shared converter applies the input rules and raises
    # the reference's errors.
    converted = _checked_tags(extras, count, per)
    if converted is not None:
        scratch.resize(count)
        for i in range(count):
            scratch[0][i] = <uint64_t>converted[i]
        data[0] = scratch.data()
    return None


cdef object _owned_tags(object extras, size_t count, str per, str name):
    """Extra tags as a uint64 array of their own, or None when all are 0."""
    if extras is None:
        return None
    converted = _checked_tags(extras, count, per, name)
    return None if converted is None else np.array(converted, dtype=np.uint64)


cdef inline const uint64_t* _tags_of(object owned):
    """The data of an _owned_tags result (NULL for None)."""
    if owned is None:
        return NULL
    return <const uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>owned)


cdef uint32_t _tier_mask(object tier) except? 0xFFFFFFFF:
    """clear_worker's tiers (bit 0: device, bit 1: host) for apply_cleared's ``tier``."""
    if tier is None:
        return kAllTiers
    cdef uint32_t mask = 0
    for t in _blocks.check_tiers(tier):
        mask |= 1u << <uint32_t>t
    return mask


cdef inline void _append(vector[uint32_t]* dst, const vector[uint32_t]& src):
    cdef size_t old = dst.size()
    dst.resize(old + src.size())
    if src.size():
        memcpy(dst.data() + old, src.data(), src.size() * sizeof(uint32_t))


cdef struct _NodeRecords:
    # What items() and dump() read out of the tree, flat, before any object is made.
    vector[uint32_t] paths
    vector[size_t] ends
    vector[uint64_t] tags  # the path's tags, for the records whose path has one
    vector[size_t] tag_ends
    vector[uint32_t] starts
    vector[uint32_t] namespaces
    vector[uint32_t] tiers  # dump records: the tier of each
    vector[uint32_t] holders  # items: a node's device holders, then its host holders
    vector[size_t] holder_ends
    vector[size_t] host_ends


cdef object _tags_copy(_NodeRecords* records, size_t k):
    """The extras of record k: a uint64 array, or None when its path has no tag."""
    cdef size_t begin = records.tag_ends[k - 1] if k else 0
    cdef size_t end = records.tag_ends[k]
    if begin == end:
        return None
    cdef cnp.npy_intp dims = <cnp.npy_intp>(end - begin)
    cdef cnp.ndarray arr = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_UINT64, 0)
    memcpy(cnp.PyArray_DATA(arr), records.tags.data() + begin, (end - begin) * sizeof(uint64_t))
    return arr


cdef list _records_as_items(_NodeRecords* records, tuple table, dict names):
    out = []
    cdef size_t k, begin = 0, first = 0
    for k in range(records.ends.size()):
        key = _uint32_copy(records.paths, begin, records.ends[k])
        holders = tuple(table[records.holders[i]]
                        for i in range(first, records.holder_ends[k]))
        host = tuple(table[records.holders[i]]
                     for i in range(records.holder_ends[k], records.host_ends[k]))
        ns = names[records.namespaces[k]]
        out.append(MetaItem(key, holders, ns, _tags_copy(records, k), host))
        begin, first = records.ends[k], records.host_ends[k]
    return out


cdef list _records_as_dump(_NodeRecords* records, dict names):
    out = []
    cdef size_t k, begin = 0
    for k in range(records.ends.size()):
        key = _uint32_copy(records.paths, begin, records.ends[k])
        ns = names[records.namespaces[k]]
        tags = _tags_copy(records, k)
        out.append(DumpRecord(key, records.starts[k], ns, tags, records.tiers[k]))
        begin = records.ends[k]
    return out


@cython.freelist(16)
cdef class MetaMatch:
    """Result of ``MetaTree.match``.

    Attributes
    ----------
    lengths : numpy.ndarray
        ``int64`` array indexed by worker index: each worker's matched tokens
        (0 for free indices), counting pages held on the device.
    length_list : list of int
        ``lengths`` as a list (made from the match's own row, with no array).
    host_lengths : numpy.ndarray
        The same, counting pages held on the device or the host.
    tree_length : int
        How much of the key is in the tree at all.
    """

    # The device lengths, written by the match into a row of the object itself
    # (the heap only past 16 worker indices); the array is made when first read,
    # so a caller that takes the list (the router) never pays for one.
    cdef int64_t _small[16]
    cdef vector[int64_t] _large
    cdef int64_t* _row
    cdef uint32_t _count
    cdef object _lengths
    # None when the tree held no host page at the match: the host lengths are
    # then the device lengths, copied on first use rather than on every match.
    cdef object _host_lengths
    cdef object _tree_length
    cdef tuple _slots
    # A cursor (match(..., cursor=True)): the tree, the key and tags as arrays
    # of their own, the namespace object, and the walk (which the core checks
    # and completes before a mark trusts it).
    cdef MetaCore _tree
    cdef object _key
    cdef object _tags
    cdef object _namespace
    cdef MatchPath _path
    cdef object _prefix_key

    def __cinit__(self):
        self._row = self._small  # no lengths until a match writes them
        self._count = 0

    @property
    def lengths(self):
        """``int64`` array indexed by worker index: each worker's matched tokens on the device."""
        cdef cnp.ndarray out
        if self._lengths is None:
            out = _new_int64(self._count)
            if self._count:
                memcpy(cnp.PyArray_DATA(out), self._row, self._count * sizeof(int64_t))
            self._lengths = out
        return self._lengths

    @property
    def length_list(self):
        """``lengths`` as a list of ints (a new list on every read)."""
        cdef uint32_t i
        return [self._row[i] for i in range(self._count)]

    @property
    def host_lengths(self):
        """``int64`` array indexed by worker index: matched tokens held on the device or the host."""
        if self._host_lengths is None:
            self._host_lengths = self.lengths.copy()
        return self._host_lengths

    @property
    def prefix_key(self):
        """A 64-bit key of the longest prefix some live worker matched (None if none did): the
        same prefix (tokens, tags, namespace) always gives the same key."""
        return self._prefix_key

    @property
    def tree_length(self):
        """How much of the key is in the tree at all (held by anyone, or leading to held pages)."""
        return self._tree_length

    def length_of(self, worker, *, tier=0):
        """Matched tokens of ``worker`` (live at the match): on the device, or with ``tier=1``
        on the device or the host."""
        cdef Py_ssize_t index = worker.index if _is_live(self._slots, worker) else resolve_in(
            self._slots, worker)
        if tier is 0 or _blocks.check_tier(tier) == 0:
            return self._row[index]
        return int(self.host_lengths[index])

    def best(self):
        """``(WorkerId, length)`` of the longest match, lowest index on ties; None without workers."""
        cdef const int64_t* data = self._row
        cdef Py_ssize_t i, found = -1
        cdef int64_t top = -1
        cdef tuple slots = self._slots
        for i in range(len(slots)):
            if data[i] > top and slots[i] is not None:
                top = data[i]
                found = i
        return None if found < 0 else (slots[found], int(top))

    def insert(self, worker, *, tier=0):
        """``tree.insert(key, worker, tier=tier, ...)`` of the matched key, continuing from
        the match's walk while it still holds (a cursor match only)."""
        if self._tree is None:
            raise _holds.no_cursor()
        return self._tree._mark_from(self, worker, tier, False)

    def hold(self, worker):
        """``tree.hold(key, worker, ...)`` of the matched key, continuing from the match's
        walk while it still holds (a cursor match only)."""
        if self._tree is None:
            raise _holds.no_cursor()
        return self._tree._mark_from(self, worker, 0, True)

    def __repr__(self):
        return f"MetaMatch(tree_length={self.tree_length}, best={self.best()})"


cdef object _prefix_key_of(const int64_t* lengths, tuple slots, const uint32_t* key,
                           const uint64_t* tags, uint32_t page, object namespace):
    """MetaMatch.prefix_key: radixmeta._holds.prefix_key's FNV-1a, in C."""
    cdef Py_ssize_t i
    cdef int64_t top = 0
    for i in range(len(slots)):
        if lengths[i] > top and slots[i] is not None:
            top = lengths[i]
    if top <= 0:
        return None
    cdef uint64_t h = 0xCBF29CE484222325u
    cdef uint64_t prime = 0x100000001B3u
    cdef size_t first = <size_t>top - page, t
    h = (h ^ <uint64_t>top) * prime
    for t in range(first, <size_t>top):
        h = (h ^ <uint64_t>key[t]) * prime
    h = (h ^ (0 if tags == NULL else tags[first // page])) * prime
    h = (h ^ <uint64_t>hash(namespace)) * prime
    return h


cdef class MetaCore:
    """Native implementation of the meta-tree core (see ``radixmeta.MetaTree``)."""

    cdef unique_ptr[MetaTree] _tree
    cdef object _table
    cdef _NamespaceIds _namespaces
    # Calls that take a worker run Python code between resolving it and
    # changing the tree (argument conversion can), and the GIL may pass to
    # another thread there: this lock keeps such calls whole. match reads the
    # registry once and changes the tree in one C++ call, so it needs none.
    # The same thread can still re-enter (an element's __index__ may call the
    # tree), so every call converts into buffers of its own and resolves its
    # worker again after converting, right before the tree changes.
    cdef object _lock

    def __cinit__(self, page_size=1):
        cdef uint32_t page = check_page_size(page_size)
        self._tree.reset(new MetaTree(page))
        self._table = WorkerTable()
        self._namespaces = _NamespaceIds()
        self._lock = threading.RLock()

    # -- workers -------------------------------------------------------------------

    @property
    def page_size(self):
        """Tokens per page: every length is a multiple of it."""
        return self._tree.get().page_size()

    @property
    def node_count(self):
        """Nodes in the tree, the root excluded."""
        return self._tree.get().node_count()

    @property
    def n_workers(self):
        """Length of every ``lengths`` array: the highest worker index ever used, plus one."""
        return len(self._table.slots)

    @property
    def workers(self):
        """The live workers, by index."""
        return self._table.live

    cdef uint32_t _index(self, object worker) except? 0xFFFFFFFF:
        if _is_live(self._table.slots, worker):
            return worker.index
        return self._table.resolve(worker)

    # -- namespaces ---------------------------------------------------------------
    # A call resolves its namespace last among its arguments (a new one gets an
    # id), and settles the ids once the tree has changed: the ids of namespaces
    # the core freed, and the one it asked for if the call created no root.

    cdef inline uint32_t _namespace_id(self, object namespace, bint create) except? 0xFFFFFFFF:
        if namespace is None:  # the common case, before any try block is set up
            return 0
        try:
            return self._namespaces.lookup(namespace, create)
        except TypeError:
            check_namespace(namespace)  # the library's error for an unhashable one
            raise

    cdef inline int _settle_namespaces(self, uint32_t asked) except -1:
        cdef MetaTree* tree = self._tree.get()
        if asked == 0 and not tree.has_dropped_namespaces():
            return 0  # the common case: nothing to recycle
        cdef vector[uint32_t] dropped
        if tree.has_dropped_namespaces():
            dropped = tree.take_dropped_namespaces()
            for ns in dropped:
                if tree.root_of(ns) == kNoNode:
                    self._namespaces.release(ns)
        if asked != 0 and tree.root_of(asked) == kNoNode:
            self._namespaces.release(asked)
        return 0

    def namespaces(self):
        """Namespaces that hold a page, in order of creation (None, the default, always first)."""
        cdef vector[uint32_t] ids
        with self._lock:
            ids = self._tree.get().namespace_ids()
            names = self._namespaces.names
            return [names[ns] for ns in ids]

    def add_worker(self, name, dp_rank=0, *, capacity=None):
        """Register worker ``(name, dp_rank)``; ``capacity`` (tokens) makes it approximate."""
        with self._lock:
            worker = self._table.add(name, dp_rank, capacity)
            capacity = self._table.capacities[worker.index]  # checked and converted to int
            self._tree.get().add_worker(worker.index, kNoCapacity if capacity is None else capacity)
            return worker

    def remove_worker(self, worker):
        """Forget a worker and every mark it had; returns the tokens it held."""
        cdef uint32_t w
        with self._lock:
            w = self._index(worker)
            tokens = self._tree.get().remove_worker(w)
            self._table.remove(worker)
            self._settle_namespaces(0)
            return tokens

    def worker(self, name, dp_rank=0):
        """The ``WorkerId`` registered as ``(name, dp_rank)``."""
        return self._table.lookup(name, dp_rank)

    def capacity_of(self, worker):
        """The worker's capacity in tokens, or None for an exact worker."""
        with self._lock:
            return self._table.capacities[self._index(worker)]

    def set_capacity(self, worker, capacity):
        """Give an approximate worker another capacity; returns the device tokens trimmed."""
        cdef uint32_t w
        with self._lock:
            w = self._table.resize(worker, capacity)  # validated, then recorded
            trimmed = self._tree.get().set_capacity(w, self._table.capacities[w])
            self._settle_namespaces(0)
            return trimmed

    def held_tokens(self, worker, *, tier=0):
        """Tokens the worker holds on ``tier`` (the device by default)."""
        cdef uint32_t w
        with self._lock:
            w = self._index(worker)
            return self._tree.get().held_tokens(w, 0 if tier is 0 else _blocks.check_tier(tier))

    # -- token paths -----------------------------------------------------------------

    cdef uint64_t _start(self, object start, size_t n) except? 0xFFFFFFFFFFFFFFFF:
        cdef uint32_t page = self._tree.get().page_size()
        cdef size_t whole = n - n % page
        if type(start) is int and start == 0:
            return 0
        value = check_int("start", start, 0)
        if value % page:
            raise InvalidInputError(f"start must be a multiple of page_size ({page}), got {value}")
        if value > whole:
            raise InvalidInputError(f"start = {value} is beyond the key's {whole} whole-page tokens")
        return value

    def insert(self, key, worker, *, start=0, tier=0, extras=None, namespace=None):
        """Mark the pages of ``key`` from ``start`` on as held by ``worker``; returns pages newly marked."""
        with self._lock:
            return self._path_op(key, worker, start, tier, extras, namespace, True)

    def remove(self, key, worker, *, start=0, tier=0, extras=None, namespace=None):
        """Unmark the pages of ``key`` from ``start`` on for ``worker``; returns pages unmarked."""
        with self._lock:
            return self._path_op(key, worker, start, tier, extras, namespace, False)

    cdef object _path_op(self, object key, object worker, object start, object tier,
                         object extras, object namespace, bint marking):
        cdef uint32_t w = self._index(worker)  # first: a stale worker is the error to report
        cdef const uint32_t* data
        cdef const uint64_t* tags
        cdef size_t n
        cdef vector[uint32_t] scratch
        cdef vector[uint64_t] tag_scratch
        owner = _load_tokens(key, &scratch, &data, &n)
        cdef uint64_t s = self._start(start, n)
        cdef uint32_t t = 0 if tier is 0 else _blocks.check_tier(tier)
        tags = NULL
        if extras is not None:
            tag_owner = _load_tags(extras, n // self._tree.get().page_size(), _PER_PAGE,
                                   &tag_scratch, &tags)
        cdef uint32_t ns = self._namespace_id(namespace, marking)
        try:
            w = self._index(worker)  # conversion may have run code that removed it
            if marking:
                return self._tree.get().insert(ns, data, n, tags, w, s, t)
            return self._tree.get().remove(ns, data, n, tags, w, s, t)
        finally:
            self._settle_namespaces(ns)

    def match(self, key, *, touch=False, extras=None, namespace=None, optimistic=True,
              cursor=False):
        """Every worker's matched length of ``key`` in one walk (see ``MetaMatch``)."""
        cdef const uint32_t* data
        cdef const uint64_t* tags = NULL
        cdef size_t n
        cdef vector[uint32_t] scratch  # not the shared one: match takes no lock
        cdef vector[uint64_t] tag_scratch
        cdef bint keep = cursor is True
        cdef cnp.ndarray owned
        tag_owner = None
        if keep:  # the cursor keeps the key: an array of its own (a uint32 array as it is)
            owned = _owned_tokens(key)
            owner = owned
            data = <const uint32_t*>cnp.PyArray_DATA(owned)
            n = cnp.PyArray_DIM(owned, 0)
        else:
            owner = _load_tokens(key, &scratch, &data, &n)
        if touch is not False and touch is not True:
            raise InputTypeError(f"touch must be a bool, got {type(touch).__name__}")
        if optimistic is not True and optimistic is not False:
            check_flag("optimistic", optimistic)
        if not keep and cursor is not False:
            check_flag("cursor", cursor)
        if extras is not None:
            if keep:
                tag_owner = _owned_tags(extras, n // self._tree.get().page_size(), _PER_PAGE,
                                        "extras")
                tags = _tags_of(tag_owner)
            else:
                tag_owner = _load_tags(extras, n // self._tree.get().page_size(), _PER_PAGE,
                                       &tag_scratch, &tags)
        cdef uint32_t ns = self._namespace_id(namespace, False)
        cdef tuple slots = self._table.slots
        cdef uint32_t count = len(slots)
        cdef MetaTree* tree = self._tree.get()
        cdef cnp.ndarray host = None
        cdef int64_t* host_data = NULL
        if tree.host_marks():
            host = _new_int64(count)
            host_data = <int64_t*>cnp.PyArray_DATA(host)
        cdef MetaMatch result = MetaMatch.__new__(MetaMatch)
        if count <= 16:
            result._row = result._small
        else:
            result._large.resize(count)
            result._row = result._large.data()
        result._count = count
        cdef uint64_t found = tree.match(
            ns, data, n, tags, touch, result._row, host_data, count,
            optimistic, &result._path if keep else NULL)
        result._host_lengths = host
        result._tree_length = found
        result._slots = slots
        result._prefix_key = _prefix_key_of(result._row, slots, data, tags, tree.page_size(),
                                            namespace)
        if keep:
            result._tree = self
            result._key = owner
            result._tags = tag_owner
            result._namespace = namespace
        return result

    cdef object _mark_from(self, MetaMatch m, object worker, object tier, bint holding):
        """MetaMatch.insert and MetaMatch.hold: the mark, along the kept walk if current."""
        cdef uint32_t w, t = 0, ns
        cdef cnp.ndarray key = <cnp.ndarray>m._key
        cdef const uint32_t* data = <const uint32_t*>cnp.PyArray_DATA(key)
        cdef size_t n = cnp.PyArray_DIM(key, 0)
        cdef const uint64_t* tags = _tags_of(m._tags)
        cdef MetaTree* tree = self._tree.get()
        if m._namespace is None and tier is 0 and _is_live(self._table.slots, worker):
            # The router's hot path: the key is converted already and no Python
            # code runs from resolving the worker to the change (so, under the
            # GIL, no lock is needed); an approximate eviction may still free
            # another namespace's root, which settling recycles.
            w = worker.index
            if holding and self._table.capacities[w] is not None:
                raise _holds.approximate_hold(worker)
            if holding:
                return tree.hold_along(&m._path, 0, data, n, tags, w)
            try:
                return tree.insert_along(&m._path, 0, data, n, tags, w, 0)
            finally:
                self._settle_namespaces(0)
        with self._lock:
            w = self._index(worker)
            if holding:
                if self._table.capacities[w] is not None:
                    raise _holds.approximate_hold(worker)
            elif tier is not 0:
                t = _blocks.check_tier(tier)
            ns = self._namespace_id(m._namespace, True)
            w = self._index(worker)  # a namespace's __hash__ may have run code that removed it
            try:
                if holding:
                    return tree.hold_along(&m._path, ns, data, n, tags, w)
                return tree.insert_along(&m._path, ns, data, n, tags, w, t)
            finally:
                self._settle_namespaces(ns)

    # -- holds ----------------------------------------------------------------------------

    def hold(self, key, worker, *, extras=None, namespace=None):
        """Hold every page of ``key`` for exact ``worker`` until ``release``; returns the id."""
        cdef uint32_t w, ns
        cdef const uint32_t* data
        cdef const uint64_t* tags = NULL
        cdef size_t n
        cdef vector[uint32_t] scratch
        cdef vector[uint64_t] tag_scratch
        with self._lock:
            w = self._index(worker)
            if self._table.capacities[w] is not None:
                raise _holds.approximate_hold(worker)
            owner = _load_tokens(key, &scratch, &data, &n)
            if extras is not None:
                tag_owner = _load_tags(extras, n // self._tree.get().page_size(), _PER_PAGE,
                                       &tag_scratch, &tags)
            ns = self._namespace_id(namespace, True)
            try:
                w = self._index(worker)  # conversion may have run code that removed it
                return self._tree.get().hold(ns, data, n, tags, w)
            finally:
                self._settle_namespaces(ns)

    def release(self, hold):
        """End a hold; returns the pages its worker no longer holds by any hold."""
        if type(hold) is int and 0 <= hold < _holds.HOLD_LIMIT:  # no Python code runs
            if not self._tree.get().has_hold(hold):
                raise _holds.stale_hold(hold)
            try:
                return self._tree.get().release(hold)
            finally:
                self._settle_namespaces(0)
        with self._lock:
            h = _holds.check_hold(hold)
            if h >= _holds.HOLD_LIMIT or not self._tree.get().has_hold(h):
                raise _holds.stale_hold(h)
            try:
                return self._tree.get().release(h)
            finally:
                self._settle_namespaces(0)

    @property
    def has_host_pages(self):
        """Whether some worker holds some page on the host (else ``host_lengths`` are ``lengths``)."""
        return self._tree.get().host_marks() != 0

    @property
    def hold_count(self):
        """Holds not released yet."""
        return self._tree.get().hold_count()

    def hold_tokens(self, worker):
        """Tokens of the pages ``worker`` holds by some hold."""
        with self._lock:
            return self._tree.get().hold_tokens(self._index(worker))

    def match_many(self, keys, *, touch=False, tier=0, extras=None, namespace=None,
                   optimistic=True):
        """Matched lengths of many keys: an int64 array of shape (len(keys), n_workers)."""
        cdef const uint32_t* data
        cdef size_t n
        cdef Py_ssize_t row
        if (isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__")
                or (cnp.PyArray_Check(keys) and cnp.PyArray_NDIM(<cnp.ndarray>keys) == 0)):
            raise InputTypeError(f"keys must be a sequence of keys, got {type(keys).__name__}")
        rows = list(keys)  # a 2-D array gives its rows
        # Every key is converted before any is matched (the reference's order
        # of checks, and a touching match must raise with nothing changed).
        converted = [_owned_tokens(k) for k in rows]
        if touch is not False and touch is not True:
            raise InputTypeError(f"touch must be a bool, got {type(touch).__name__}")
        cdef uint32_t t = 0 if tier is 0 else _blocks.check_tier(tier)
        if optimistic is not True and optimistic is not False:
            check_flag("optimistic", optimistic)
        cdef uint32_t page = self._tree.get().page_size()
        tag_rows = _per_key_tags(extras, len(converted))
        owned_tags = [
            _owned_tags(tag_rows[r], len(converted[r]) // page, _PER_PAGE, f"extras[{r}]")
            for r in range(len(converted))
        ]
        cdef uint32_t ns = self._namespace_id(namespace, False)
        cdef uint32_t count = len(self._table.slots)
        cdef cnp.npy_intp dims[2]
        dims[0] = len(converted)
        dims[1] = count
        cdef cnp.ndarray out = cnp.PyArray_ZEROS(2, dims, cnp.NPY_INT64, 0)
        cdef int64_t* base = <int64_t*>cnp.PyArray_DATA(out)
        cdef vector[uint32_t] scratch
        cdef vector[int64_t] device  # tier 1: the device lengths go here, the rows get the others
        cdef MetaTree* tree = self._tree.get()
        cdef bint either = t == 1 and tree.host_marks() != 0
        if either:
            device.resize(count)
        for row in range(len(converted)):
            owner = _load_tokens(converted[row], &scratch, &data, &n)
            if either:
                tree.match(ns, data, n, _tags_of(owned_tags[row]), touch, device.data(),
                           base + row * count, count, optimistic, NULL)
            else:
                tree.match(ns, data, n, _tags_of(owned_tags[row]), touch, base + row * count,
                           NULL, count, optimistic, NULL)
        return out

    def items(self, worker=None):
        """``(key, holders)`` per node in key order; only nodes ``worker`` holds when given."""
        cdef MetaTree* tree = self._tree.get()
        cdef uint32_t w = 0
        cdef bint only = worker is not None
        cdef vector[uint32_t] nodes, kept
        cdef _NodeRecords records
        cdef size_t k
        with self._lock:
            if only:
                w = self._index(worker)
            table = self._table.slots
            nodes = tree.nodes_in_order()
            for k in range(nodes.size()):
                if not only or tree.holds(w, nodes[k], 0) or tree.holds(w, nodes[k], 1):
                    kept.push_back(nodes[k])
            # Read out under the lock: another thread may change the tree once it is released.
            self._read_records(kept, False, len(table), &records)
            names = dict(self._namespaces.names)
        return _records_as_items(&records, table, names)

    def dump(self, worker):
        """Records ``(key, start)`` that rebuild exactly what ``worker`` holds, via ``insert``."""
        cdef vector[uint32_t] nodes
        cdef _NodeRecords records
        cdef uint32_t w, tier
        with self._lock:
            w = self._index(worker)
            for tier in range(2):  # the device's records first (an approximate one's recency)
                nodes = self._tree.get().held_in_order(w, tier)
                self._read_records(nodes, True, 0, &records)
                records.tiers.resize(records.ends.size(), tier)
            names = dict(self._namespaces.names)
        return _records_as_dump(&records, names)

    cdef void _read_records(self, const vector[uint32_t]& nodes, bint with_start, uint32_t slots,
                            _NodeRecords* out):
        """Paths and starts (or holders below ``slots``) of nodes; makes no Python object."""
        cdef MetaTree* tree = self._tree.get()
        cdef vector[uint32_t] path
        cdef vector[uint64_t] tag_path
        cdef uint32_t i, x
        cdef size_t k
        for k in range(nodes.size()):
            x = nodes[k]
            tree.path_tokens(x, &path)
            _append(&out.paths, path)
            out.ends.push_back(out.paths.size())
            if tree.path_tags(x, &tag_path):
                out.tags.insert(out.tags.end(), tag_path.begin(), tag_path.end())
            out.tag_ends.push_back(out.tags.size())
            out.starts.push_back(tree.node(x).depth - tree.node(x).length)
            out.namespaces.push_back(tree.node(x).ns)
            if not with_start:
                for i in range(slots):
                    if tree.node(x).holders.test(i):
                        out.holders.push_back(i)
                out.holder_ends.push_back(out.holders.size())
                for i in range(slots):
                    if tree.node(x).host.test(i):
                        out.holders.push_back(i)
                out.host_ends.push_back(out.holders.size())

    # -- engine block events -------------------------------------------------------

    def apply_stored(self, worker, parent_hash, block_hashes, token_ids, *, tier=0,
                     extras=None, namespace=None):
        """Apply a KV ``BlockStored`` event atomically; returns pages newly marked."""
        with self._lock:
            return self._stored(worker, tier, parent_hash, block_hashes, token_ids, extras,
                                namespace)

    cdef object _stored(self, object worker, object tier, object parent_hash,
                        object block_hashes, object token_ids, object extras, object namespace):
        cdef uint32_t w = self._index(worker)  # first: a stale worker is the error to report
        cdef vector[uint64_t] hash_scratch, tag_scratch
        cdef vector[uint32_t] token_scratch
        cdef const uint64_t* hashes
        cdef const uint64_t* tags
        cdef const uint32_t* tokens
        cdef size_t n_blocks, n_tokens
        cdef uint32_t t = 0 if tier is 0 else _blocks.check_tier(tier)
        cdef bint has_parent = parent_hash is not None
        cdef uint64_t parent = _parent_value(parent_hash) if has_parent else 0
        hash_owner = _load_hashes(block_hashes, &hash_scratch, &hashes, &n_blocks)
        token_owner = _load_tokens(token_ids, &token_scratch, &tokens, &n_tokens)
        tags = NULL
        if extras is not None:
            tag_owner = _load_tags(extras, n_blocks, _PER_BLOCK, &tag_scratch, &tags)
        cdef uint32_t ns = self._namespace_id(namespace, True)
        try:
            w = self._index(worker)  # conversion may have run code that removed it
            return self._checked_stored(w, ns, has_parent, parent, hashes, n_blocks, tokens,
                                        n_tokens, tags, t)
        finally:
            self._settle_namespaces(ns)

    cdef object _checked_stored(self, uint32_t w, uint32_t ns, bint has_parent, uint64_t parent,
                                const uint64_t* hashes, size_t n_blocks, const uint32_t* tokens,
                                size_t n_tokens, const uint64_t* tags, uint32_t tier):
        """Check converted stored-event arguments against the tree, then apply them whole."""
        cdef MetaTree* tree = self._tree.get()
        cdef uint32_t page = tree.page_size()
        if n_tokens != n_blocks * page:
            raise _blocks.bad_token_count(n_tokens, n_blocks, page)
        cdef StoredCheck check = tree.check_stored(w, ns, has_parent, parent, hashes, n_blocks,
                                                   tokens, tags)
        if check.code != kStoredOk:
            who = self._table.slots[w]
            if check.code == kUnknownParent:
                raise _blocks.unknown_parent(who, parent, self._namespaces.names[ns])
            h = hashes[check.index]
            if check.code == kCycle:
                raise _blocks.cycle(check.index, h)
            if check.code == kRepeated:
                raise _blocks.repeated_hash(check.index, h)
            if check.code == kRenamed:
                raise _blocks.renamed_block(who, check.index, h, check.other)
            raise _blocks.names_other_page(who, check.index, h)
        return tree.apply_stored(w, ns, has_parent, parent, hashes, n_blocks, tokens, tags, tier)

    def apply_removed(self, worker, block_hashes, *, tier=0):
        """Apply a KV ``BlockRemoved`` event; unknown hashes are skipped. Returns pages unmarked."""
        with self._lock:
            return self._removed(worker, tier, block_hashes)

    cdef object _removed(self, object worker, object tier, object block_hashes):
        cdef uint32_t w = self._index(worker)
        cdef const uint64_t* hashes
        cdef size_t n_blocks
        cdef vector[uint64_t] scratch
        cdef uint32_t t = 0 if tier is 0 else _blocks.check_tier(tier)
        owner = _load_hashes(block_hashes, &scratch, &hashes, &n_blocks)
        w = self._index(worker)  # conversion may have run code that removed it
        try:
            return self._tree.get().apply_removed(w, hashes, n_blocks, t)
        finally:
            self._settle_namespaces(0)

    def apply_cleared(self, worker, *, tier=None):
        """Apply a KV ``AllBlocksCleared`` event: the worker holds nothing (on ``tier``, or on
        either when None). Returns tokens unmarked."""
        cdef uint32_t w
        with self._lock:
            w = self._index(worker)
            mask = _tier_mask(tier)
            try:
                return self._tree.get().clear_worker(w, mask)
            finally:
                self._settle_namespaces(0)

    def apply_events(self, records):
        """Apply event records in order, each atomically; returns an int8 status per record.

        Every record is converted first, then all are applied: the code of the
        caller's objects (``__index__``, sequences) runs before the tree
        changes, so an interrupt leaves the tree as it was and any other
        exception becomes that record's status.
        """
        if isinstance(records, (str, bytes)) or not hasattr(records, "__iter__"):
            raise InputTypeError(
                f"records must be a sequence of event records, got {type(records).__name__}"
            )
        records = records if _exact_list_or_tuple(records) else list(records)
        cdef Py_ssize_t i, count = len(records)
        cdef cnp.ndarray status = np.zeros(count, dtype=np.int8)
        cdef signed char* out = <signed char*>cnp.PyArray_DATA(status)
        with self._lock:
            prepared = [None] * count
            # Namespace ids taken while converting stay assigned until the whole
            # batch is applied, so a record never finds its id recycled.
            asked = []
            try:
                for i in range(count):
                    try:
                        prepared[i] = self._prepared_record(records[i], asked)
                    except Exception as exc:  # any failure is that record's status
                        out[i] = _blocks.record_status(exc)
                for i in range(count):
                    if prepared[i] is not None:
                        try:
                            self._apply_prepared(prepared[i])
                        except Exception as exc:  # the tree's checks: raised before any change
                            out[i] = _blocks.record_status(exc)
            finally:
                self._settle_namespaces(0)
                for ns in asked:
                    self._settle_namespaces(ns)
        return status

    cdef tuple _prepared_record(self, object record, list asked):
        """One record's kind, worker and converted arguments (uint64 and uint32 arrays)."""
        if not isinstance(record, (tuple, list)) or len(record) == 0:
            raise InputTypeError("an event record must be a non-empty tuple")
        kind = record[0]
        cdef Py_ssize_t size = len(record)
        cdef uint32_t ns = 0
        if kind == "stored" and (size == 5 or size == 6):
            self._index(record[1])  # first: a stale worker is the error to report
            options = _blocks.record_options(kind, record[5], record) if size == 6 else None
            has_parent = record[2] is not None
            parent = _parent_value(record[2]) if has_parent else 0
            hashes = _owned_hashes(record[3])
            tokens = _owned_tokens(record[4])
            tags = None
            tier = 0
            if options:
                tier = _blocks.check_tier(options.get("tier", 0))
                tags = _owned_tags(options.get("extras"), len(hashes), _PER_BLOCK, "extras")
                ns = self._namespace_id(options.get("namespace"), True)
                asked.append(ns)
            return ("stored", record[1], has_parent, parent, hashes, tokens, ns, tags, tier)
        if kind == "removed" and (size == 3 or size == 4):
            self._index(record[1])
            tier = 0  # the plain record: no Python call on this hot path
            if size == 4:
                options = _blocks.record_options(kind, record[3], record)
                tier = _blocks.check_tier(options.get("tier", 0))
            return ("removed", record[1], _owned_hashes(record[2]), tier)
        if kind == "cleared" and (size == 2 or size == 3):
            self._index(record[1])
            mask = kAllTiers
            if size == 3:
                mask = _tier_mask(_blocks.record_options(kind, record[2], record).get("tier"))
            return ("cleared", record[1], mask)
        raise _blocks.not_a_record(record)

    cdef object _apply_prepared(self, tuple step):
        cdef uint32_t w = self._index(step[1])
        cdef cnp.ndarray hashes, tokens
        if step[0] == "cleared":
            return self._tree.get().clear_worker(w, step[2])
        hashes = <cnp.ndarray>step[2 if step[0] == "removed" else 4]
        if step[0] == "removed":
            return self._tree.get().apply_removed(
                w, <const uint64_t*>cnp.PyArray_DATA(hashes), cnp.PyArray_DIM(hashes, 0), step[3])
        tokens = <cnp.ndarray>step[5]
        return self._checked_stored(
            w, step[6], step[2], step[3], <const uint64_t*>cnp.PyArray_DATA(hashes),
            cnp.PyArray_DIM(hashes, 0), <const uint32_t*>cnp.PyArray_DATA(tokens),
            cnp.PyArray_DIM(tokens, 0), _tags_of(step[7]), step[8])

    # -- whole tree ----------------------------------------------------------------------

    def memory_usage(self):
        """Bytes held by the native tree (nodes, labels, per-worker maps). O(n)."""
        return self._tree.get().memory_usage()

    def check(self):
        """Verify every invariant in O(n + marks); raises AssertionError on a violation."""
        try:
            self._tree.get().check_invariants()
        except RuntimeError as exc:
            raise AssertionError(str(exc)) from None

    def _block_entries(self, worker):
        """(hash, path to the page end, namespace) for every block hash of the worker, by hash."""
        cdef MetaTree* tree = self._tree.get()
        cdef vector[pair[uint64_t, uint32_t]] entries
        cdef vector[uint32_t] nodes
        cdef _NodeRecords records
        cdef size_t k
        with self._lock:  # the paths are read before another thread may change the tree
            entries = tree.block_entries(self._index(worker))
            for k in range(entries.size()):
                nodes.push_back(entries[k].second)
            self._read_records(nodes, True, 0, &records)
            names = dict(self._namespaces.names)
        out = []
        cdef size_t begin = 0
        for k in range(entries.size()):
            key = _uint32_copy(records.paths, begin, records.ends[k])
            ns = names[records.namespaces[k]]
            out.append((entries[k].first, key, ns, _tags_copy(&records, k)))
            begin = records.ends[k]
        return out

    def _bind_hash(self, worker, key, block_hash, namespace=None, extras=None):
        """Name the worker's page ending at the end of ``key`` by ``block_hash``."""
        cdef uint32_t w, ns
        cdef const uint32_t* data
        cdef const uint64_t* tags
        cdef size_t n
        cdef uint64_t h
        cdef vector[uint32_t] scratch
        cdef vector[uint64_t] tag_scratch
        with self._lock:
            w = self._index(worker)
            h = _blocks.block_hash(block_hash, "block_hash")
            owner = _load_tokens(key, &scratch, &data, &n)
            tag_owner = _load_tags(extras, n // self._tree.get().page_size(), _PER_PAGE,
                                   &tag_scratch, &tags)
            ns = self._namespace_id(namespace, False)
            w = self._index(worker)
            if not self._tree.get().bind_hash(w, ns, data, n, tags, h):
                raise InvalidInputError("the worker holds no page ending at the end of key")

    def _worker_state(self):
        """The worker registry's state, for pickling."""
        return self._table.state()

    def _pickle_state(self):
        """Registry, and per live worker its dump and block hashes, read in one locked step."""
        with self._lock:
            workers = [(w.index, self.dump(w), self._block_entries(w)) for w in self._table.live]
            return self._table.state(), workers

    def _adopt_table(self, state):
        """Take over a pickled worker registry (the tree must have no workers yet)."""
        with self._lock:
            if self._table.slots:
                raise RuntimeError("_adopt_table needs a tree without workers")
            table = WorkerTable.from_state(state)
            for worker in table.slots:
                if worker is not None:
                    capacity = table.capacities[worker.index]
                    self._tree.get().add_worker(
                        worker.index, kNoCapacity if capacity is None else capacity)
            self._table = table


cdef object _owned_tokens(object key):
    """key as a checked uint32 array of its own: a 1-D uint32 array as it is, else a copy."""
    cdef cnp.ndarray arr
    if cnp.PyArray_Check(key):
        arr = <cnp.ndarray>key
        if (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_TYPE(arr) == cnp.NPY_UINT32
                and cnp.PyArray_ISNOTSWAPPED(arr) and cnp.PyArray_IS_C_CONTIGUOUS(arr)
                and cnp.PyArray_ISALIGNED(arr)):
            return arr  # every uint32 is a valid token
    cdef vector[uint32_t] scratch
    cdef const uint32_t* data
    cdef size_t n
    owner = _load_tokens(key, &scratch, &data, &n)
    arr = _new_uint32(n)
    if n:
        memcpy(cnp.PyArray_DATA(arr), data, n * sizeof(uint32_t))
    return arr


cdef uint64_t _parent_value(object parent_hash) except? 0xFFFFFFFFFFFFFFFF:
    """A non-None parent hash as uint64."""
    if type(parent_hash) is int and 0 <= parent_hash < _HASH_LIMIT:
        return <uint64_t>parent_hash
    return <uint64_t>_blocks.parent_hash(parent_hash)


cdef cnp.ndarray _owned_hashes(object hashes):
    """Block hashes as a checked uint64 array of their own."""
    cdef vector[uint64_t] scratch
    cdef const uint64_t* data
    cdef size_t n
    owner = _load_hashes(hashes, &scratch, &data, &n)
    cdef cnp.npy_intp dims = <cnp.npy_intp>n
    cdef cnp.ndarray arr = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_UINT64, 0)
    if n:
        memcpy(cnp.PyArray_DATA(arr), data, n * sizeof(uint64_t))
    return arr
