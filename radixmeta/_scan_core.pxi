# Included by _core.pyx: the binding of csrc/include/radixmeta/msgpack_batch.hpp,
# the engines' map-era event batches read with no Python object per token or hash,
# and the structure check every wire decoder runs before msgspec.

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint16_t
from libcpp.string cimport string


cdef extern from "radixmeta/msgpack_batch.hpp" namespace "radixmeta::msgpack" nogil:
    cdef enum class FieldKind(uint8_t):
        kHashesU64
        kHashesI64
        kHashU64OrNil
        kHashI64OrNil
        kTokens
        kSize
        kIntOrNil
        kStrOrNil
        kNil

    cdef cppclass FieldSpec:
        string name
        FieldKind kind
        bint required

    cdef cppclass EventSpec:
        string tag
        vector[FieldSpec] fields

    cdef cppclass FieldValue:
        bint present
        uint64_t value
        size_t begin
        size_t count

    cdef cppclass ScannedBatch:
        double ts
        bint has_rank
        int64_t rank
        vector[uint16_t] types
        vector[size_t] first
        vector[FieldValue] values
        vector[uint64_t] hashes
        vector[uint32_t] tokens

    cdef cppclass BatchScanner:
        BatchScanner(vector[EventSpec] specs, uint32_t max_depth) except +
        bint scan(const uint8_t* data, size_t size, ScannedBatch& out)

    cdef enum class Problem(uint8_t):
        kNone
        kTruncated
        kTooLong
        kTooDeep
        kInvalidByte
        kInvalidUtf8
        kTrailing

    cdef cppclass Check:
        Problem problem
        size_t offset
        uint64_t claimed
        uint8_t header

    Check check_message(const uint8_t* data, size_t size, uint32_t max_depth)


# The names msgpack_check answers with (radixmeta._reference_msgpack answers the same).
_PROBLEMS = {
    <int>Problem.kTruncated: "truncated",
    <int>Problem.kTooLong: "too_long",
    <int>Problem.kTooDeep: "too_deep",
    <int>Problem.kInvalidByte: "invalid_byte",
    <int>Problem.kInvalidUtf8: "invalid_utf8",
    <int>Problem.kTrailing: "trailing",
}


def msgpack_check(const unsigned char[::1] data not None, max_depth):
    """Why ``data`` is not one well-formed msgpack value, or None when it is.

    ``(problem, offset, claimed, header)``: ``problem`` one of ``"truncated"``,
    ``"too_long"`` (a header claims more than the bytes left hold; ``claimed`` is
    its count of items, entries or bytes), ``"too_deep"`` (arrays and maps nested
    more than ``max_depth`` deep), ``"invalid_byte"`` (0xC1), ``"invalid_utf8"``
    (a str, map keys included) or ``"trailing"``; ``offset`` the header at fault
    (the data's length when it is truncated) and ``header`` its byte (0 when there
    is none). One pass, no allocation per value
    (``radixmeta._reference_msgpack.msgpack_check``).
    """
    cdef uint32_t limit = max_depth
    cdef size_t size = data.shape[0]
    cdef const uint8_t* start = <const uint8_t*>&data[0] if size else NULL
    cdef Check c
    with nogil:
        c = check_message(start, size, limit)
    if c.problem == Problem.kNone:
        return None
    return (_PROBLEMS[<int>c.problem], c.offset, c.claimed, c.header)


_FIELD_KINDS = {
    "hashes_u64": FieldKind.kHashesU64,
    "hashes_i64": FieldKind.kHashesI64,
    "hash_u64_or_nil": FieldKind.kHashU64OrNil,
    "hash_i64_or_nil": FieldKind.kHashI64OrNil,
    "tokens": FieldKind.kTokens,
    "size": FieldKind.kSize,
    "int_or_nil": FieldKind.kIntOrNil,
    "str_or_nil": FieldKind.kStrOrNil,
    "nil": FieldKind.kNil,
}


cdef class MapBatchScanner:
    """Reads one engine's map-era batches into per-event value tuples, or says it cannot.

    Parameters
    ----------
    specs : sequence of (str, sequence of (str, str, bool))
        Per event type, its tag and its fields in order: name, kind (a key of
        ``FIELD_KINDS``) and whether an event without it is malformed.
    max_depth : int
        The nesting limit of ``msgpack_check`` (at least 4): a batch the scanner
        takes always passes ``msgpack_check(data, max_depth)``.

    ``scan(data)`` returns ``(ts, dp_rank, types, values)``: per event the index
    of its spec and a tuple of its field values in spec order (hash and token
    arrays as uint64 and uint32 numpy arrays, ints, str, or None for an absent
    or nil field). It returns None for any batch outside the shapes the native
    reader takes (see the header), which the caller then decodes exactly.
    """

    cdef unique_ptr[BatchScanner] _scanner
    cdef tuple _kinds  # per spec, per field: its FieldKind, to convert values

    FIELD_KINDS = tuple(_FIELD_KINDS)

    def __cinit__(self, specs, max_depth):
        cdef vector[EventSpec] native
        cdef EventSpec event
        cdef FieldSpec field
        kinds = []
        for tag, fields in specs:
            event.tag = tag.encode()
            event.fields.clear()
            per_field = []
            for name, kind, required in fields:
                if kind not in _FIELD_KINDS:
                    raise ValueError(f"unknown field kind {kind!r}; known: {', '.join(_FIELD_KINDS)}")
                field.name = name.encode()
                field.kind = _FIELD_KINDS[kind]
                field.required = bool(required)
                event.fields.push_back(field)
                per_field.append(<int>_FIELD_KINDS[kind])
            native.push_back(event)
            kinds.append(tuple(per_field))
        cdef uint32_t limit = max_depth
        try:
            self._scanner.reset(new BatchScanner(native, limit))
        except ValueError as exc:  # std::invalid_argument: one name, two kinds; a low limit
            raise ValueError(str(exc)) from None
        self._kinds = tuple(kinds)

    def scan(self, const unsigned char[::1] data not None):
        # A scan of its own per call: building the result creates objects, and
        # whatever a collection then runs may scan again on this same scanner.
        cdef ScannedBatch batch
        cdef size_t size = data.shape[0]
        if size == 0:
            return None
        if not self._scanner.get().scan(<const uint8_t*>&data[0], size, batch):
            return None
        # Strings are decoded from the bytes scanned, so keep a reference to them.
        cdef const char* raw = <const char*>&data[0]
        cdef size_t e, f, base, n_fields
        cdef FieldValue v
        cdef int kind
        cdef cnp.ndarray arr
        cdef cnp.npy_intp dims
        types = []
        values = []
        try:
            for e in range(batch.types.size()):
                kinds = <tuple>self._kinds[batch.types[e]]
                base = batch.first[e]
                row = []
                n_fields = <size_t>len(kinds)
                for f in range(n_fields):
                    v = batch.values[base + f]
                    kind = <int>kinds[f]
                    if not v.present:
                        row.append(None)
                    elif kind == <int>FieldKind.kHashesU64 or kind == <int>FieldKind.kHashesI64:
                        dims = <cnp.npy_intp>v.count
                        arr = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_UINT64, 0)
                        if v.count:
                            memcpy(cnp.PyArray_DATA(arr), batch.hashes.data() + v.begin,
                                   v.count * sizeof(uint64_t))
                        row.append(arr)
                    elif kind == <int>FieldKind.kTokens:
                        arr = _new_uint32(v.count)
                        if v.count:
                            memcpy(cnp.PyArray_DATA(arr), batch.tokens.data() + v.begin,
                                   v.count * sizeof(uint32_t))
                        row.append(arr)
                    elif kind == <int>FieldKind.kStrOrNil:
                        row.append(PyUnicode_DecodeUTF8(raw + v.begin, v.count, NULL))
                    elif kind == <int>FieldKind.kIntOrNil:
                        row.append(<int64_t>v.value)
                    else:  # unsigned hashes (signed ones are normalised) and sizes
                        row.append(v.value)
                types.append(batch.types[e])
                values.append(tuple(row))
        except UnicodeDecodeError:  # the scanner checked UTF-8: only if Python's rule differs
            # then the exact path names the string.
            return None
        return (batch.ts, batch.rank if batch.has_rank else None, types, values)
