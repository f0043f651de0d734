# The worker-side event log: the native EventLogCore behind radixmeta.EventLog.
# Included into _core.pyx; the ring itself is csrc/include/radixmeta/event_ring.hpp.

from radixmeta._log_settings import checked_hashes, discard_past, log_settings, truncated
from radixmeta._records import make_record


cdef extern from "radixmeta/event_ring.hpp" namespace "radixmeta" nogil:
    cdef struct EventRecord:
        uint64_t seq
        uint32_t length
        uint32_t start
        uint32_t ns
        uint8_t kind

    cdef cppclass EventRing(TreeObserver):
        EventRing(uint64_t capacity, uint64_t max_tokens) except +
        uint64_t capacity()
        uint64_t max_tokens()
        uint64_t held_tokens()
        uint64_t size()
        uint64_t next_seq()
        uint64_t oldest_seq()
        uint64_t index_of(uint64_t start)
        const EventRecord& at(uint64_t i)
        void copy_path(uint64_t i, uint32_t* out)
        uint64_t discard_through(uint64_t through)

    void chain_hashes(const uint32_t* tokens, uint64_t n_pages, uint32_t page, uint64_t* hashes)


cdef class EventLogCore:
    """Native implementation of the worker's event log (see ``radixmeta.EventLog``)."""

    cdef unique_ptr[EventRing] _ring
    cdef readonly str form
    cdef readonly str worker
    cdef readonly object dp_rank
    cdef object _scheme  # None: the native chain; else a callable (tokens, page_size, namespace)
    cdef object _hash_name
    cdef object _names  # the attached cache's namespace id -> namespace (None until attached)
    cdef uint32_t _page

    def __cinit__(self, capacity=65536, *, max_tokens=2**22, form="path", hash=None, worker="",
                  dp_rank=0):
        capacity, max_tokens, self.form, self._hash_name, self._scheme, self.worker, \
            self.dp_rank = log_settings(capacity, max_tokens, form, hash, worker, dp_rank)
        self._ring.reset(new EventRing(<uint64_t>min(capacity, 2**63),
                                       <uint64_t>min(max_tokens, 2**63)))
        self._names = None

    def __reduce__(self):
        raise TypeError(f"cannot pickle or copy {type(self).__name__!r} object")

    @property
    def capacity(self):
        """Records the ring holds; older ones are dropped."""
        return self._ring.get().capacity()

    @property
    def max_tokens(self):
        """Tokens the records' paths may hold in all; older records are dropped past it."""
        return self._ring.get().max_tokens()

    @property
    def held_tokens(self):
        """Tokens the held records' paths take."""
        return self._ring.get().held_tokens()

    @property
    def hash(self):
        """The block-hash scheme (``"chain"``, ``"sglang"`` or the callable), None in path form."""
        return self._hash_name

    @property
    def next_seq(self):
        """The sequence number the next record will take."""
        return self._ring.get().next_seq()

    @property
    def oldest_seq(self):
        """The oldest sequence number still held (``next_seq`` when empty)."""
        return self._ring.get().oldest_seq()

    @property
    def attached(self):
        """Whether a cache writes to this log."""
        return self._names is not None

    def __len__(self):
        return self._ring.get().size()

    cdef int _attach(self, dict names, uint32_t page) except -1:
        if self._names is not None:
            raise InvalidInputError("this event log is already attached to a cache")
        self._names = names
        self._page = page
        return 0

    def read(self, after=None, *, max_records=None):
        """The records that follow sequence number ``after`` (all held, if None), in order.

        Raises ``LogTruncatedError`` if records after ``after`` were dropped.
        Complexity: O(records + their paths' tokens).
        """
        cdef EventRing* ring = self._ring.get()
        cdef uint64_t first = ring.oldest_seq()
        if after is not None:
            after = check_int("after", after, -1)
            if after + 1 < first:
                raise truncated(after, first, ring.capacity())
            first = after + 1
        cdef uint64_t begin = ring.index_of(first), end = ring.size(), k
        if max_records is not None:
            end = min(end, begin + check_int("max_records", max_records, 0))
        # Copy out first: creating objects may run code that changes the cache and the ring.
        cdef vector[EventRecord] picked
        cdef vector[uint32_t] tokens
        cdef size_t total = 0
        for k in range(begin, end):
            picked.push_back(ring.at(k))
            total += ring.at(k).length
        tokens.resize(total)  # one fill, then each path put together in place
        total = 0
        for k in range(begin, end):
            ring.copy_path(k, tokens.data() + total)
            total += ring.at(k).length
        return self._records(picked, tokens, None)

    def discard(self, through_seq):
        """Drop every held record with ``seq <= through_seq``; returns how many went.

        For a producer that knows what every consumer has applied: the ring then
        holds, and its buffers span, only what is still to be read. ``-1`` drops
        nothing; a sequence number older than the oldest held one drops nothing
        more. A later ``read(after=s)`` for an ``s`` before the oldest held
        record raises ``LogTruncatedError``, as for records the bounds dropped.
        Complexity: O(records dropped) (their segments amortised O(1) each).
        """
        through = check_int("through_seq", through_seq, -1)
        cdef EventRing* ring = self._ring.get()
        if through >= <object>ring.next_seq():
            raise discard_past(through, ring.next_seq())
        if through < 0:
            return 0
        return ring.discard_through(<uint64_t>through)

    cdef list _records(self, const vector[EventRecord]& picked, const vector[uint32_t]& tokens,
                       object stamp):
        """Record objects of what was copied out of the ring (or the tree, with a ``stamp``)."""
        out = []
        cdef size_t i, at = 0
        cdef EventRecord r
        names = self._names
        for i in range(picked.size()):
            r = picked[i]
            path = _uint32_copy(tokens, at, at + r.length)
            at += r.length
            namespace = names.get(r.ns) if r.ns else None
            hashes = (self._hashes(path, namespace)
                      if self.form == "blocks" and r.kind != 2 else None)
            out.append(make_record(r.kind, self.worker, self.dp_rank,
                                   r.seq if stamp is None else stamp,
                                   namespace, path, r.start, self._page, hashes))
        return out

    cdef object _hashes(self, cnp.ndarray path, object namespace):
        cdef uint64_t pages = cnp.PyArray_DIM(path, 0) // self._page
        if self._scheme is not None:
            return checked_hashes(self._scheme(path, self._page, namespace), pages)
        cdef cnp.npy_intp dims = <cnp.npy_intp>pages
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_UINT64, 0)
        chain_hashes(<const uint32_t*>cnp.PyArray_DATA(path), pages, self._page,
                     <uint64_t*>cnp.PyArray_DATA(out))
        return out

    def __repr__(self):
        return (f"EventLog(worker={self.worker!r}, dp_rank={self.dp_rank}, form={self.form!r}, "
                f"records={len(self)}, next_seq={self.next_seq})")


def native_chain_hashes(cnp.ndarray tokens not None, page_size):
    """The default block-hash chain (``hash="chain"``) of each whole page of ``tokens``.

    ``tokens`` is a 1-D uint32 array; the result has one uint64 per whole page,
    the values :func:`radixmeta._hashing.chain_hashes` computes, in C++.
    Complexity: O(len(tokens)).
    """
    cdef uint32_t page = check_page_size(page_size)
    if tokens.ndim != 1 or tokens.dtype != np.uint32:
        raise InvalidInputError("tokens must be a 1-D uint32 array")
    cdef cnp.ndarray data = np.ascontiguousarray(tokens)
    cdef cnp.npy_intp dims = <cnp.npy_intp>(cnp.PyArray_DIM(data, 0) // page)
    cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_UINT64, 0)
    chain_hashes(<const uint32_t*>cnp.PyArray_DATA(data), <uint64_t>dims, page,
                 <uint64_t*>cnp.PyArray_DATA(out))
    return out
