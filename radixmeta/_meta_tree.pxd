# Declarations of csrc/include/radixmeta/meta_tree.hpp for Cython.
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libcpp cimport bool
from libcpp.pair cimport pair
from libcpp.vector cimport vector


cdef extern from "radixmeta/meta_tree.hpp" namespace "radixmeta" nogil:
    cdef cppclass LocationSet:
        bool test(uint32_t i)

    cdef cppclass MetaNode:
        uint32_t length
        uint32_t depth
        uint32_t ns
        LocationSet holders
        LocationSet host

    cdef enum StoredCheckCode "radixmeta::StoredCheck::Code":
        kStoredOk "radixmeta::StoredCheck::kOk"
        kUnknownParent "radixmeta::StoredCheck::kUnknownParent"
        kCycle "radixmeta::StoredCheck::kCycle"
        kRepeated "radixmeta::StoredCheck::kRepeated"
        kOtherPage "radixmeta::StoredCheck::kOtherPage"
        kRenamed "radixmeta::StoredCheck::kRenamed"

    cdef struct StoredCheck:
        StoredCheckCode code
        uint32_t index
        uint64_t other

    cdef uint32_t kAllTiers "radixmeta::MetaTree::kAllTiers"

    cdef cppclass MatchPath:
        MatchPath()

    cdef cppclass MetaTree:
        MetaTree(uint32_t page_size) except +
        uint32_t page_size()
        uint32_t node_count()
        uint32_t root_of(uint32_t ns)
        vector[uint32_t] namespace_ids() except +
        bool has_dropped_namespaces()
        vector[uint32_t] take_dropped_namespaces()
        void add_worker(uint32_t w, uint64_t capacity) except +
        uint64_t set_capacity(uint32_t w, uint64_t capacity) except +
        uint64_t clear_worker(uint32_t w, uint32_t tiers) except +
        uint64_t remove_worker(uint32_t w) except +
        uint64_t held_tokens(uint32_t w, uint32_t tier)
        bool holds(uint32_t w, uint32_t x, uint32_t tier)
        uint64_t host_marks()
        uint64_t insert(uint32_t ns, const uint32_t* key, uint64_t n, const uint64_t* tags,
                        uint32_t w, uint64_t start, uint32_t tier) except +
        uint64_t remove(uint32_t ns, const uint32_t* key, uint64_t n, const uint64_t* tags,
                        uint32_t w, uint64_t start, uint32_t tier) except +
        uint64_t match(uint32_t ns, const uint32_t* key, uint64_t n, const uint64_t* tags,
                       bool touch, int64_t* lengths, int64_t* host_lengths,
                       uint32_t slots, bool overlay, MatchPath* path) except +
        uint64_t hold(uint32_t ns, const uint32_t* key, uint64_t n, const uint64_t* tags,
                      uint32_t w) except +
        uint64_t hold_along(MatchPath* path, uint32_t ns, const uint32_t* key, uint64_t n,
                            const uint64_t* tags, uint32_t w) except +
        uint64_t insert_along(MatchPath* path, uint32_t ns, const uint32_t* key,
                              uint64_t n, const uint64_t* tags, uint32_t w,
                              uint32_t tier) except +
        bool has_hold(uint64_t id)
        uint64_t release(uint64_t id) except +
        uint64_t hold_count()
        uint64_t hold_tokens(uint32_t w)
        StoredCheck check_stored(uint32_t w, uint32_t ns, bool has_parent, uint64_t parent,
                                 const uint64_t* hashes, uint32_t n_blocks,
                                 const uint32_t* tokens, const uint64_t* tags) except +
        uint64_t apply_stored(uint32_t w, uint32_t ns, bool has_parent, uint64_t parent,
                              const uint64_t* hashes, uint32_t n_blocks,
                              const uint32_t* tokens, const uint64_t* tags,
                              uint32_t tier) except +
        uint64_t apply_removed(uint32_t w, const uint64_t* hashes, uint32_t n_blocks,
                               uint32_t tier) except +
        bool bind_hash(uint32_t w, uint32_t ns, const uint32_t* key, uint64_t n,
                       const uint64_t* tags, uint64_t hash) except +
        const MetaNode& node(uint32_t x)
        vector[uint32_t] nodes_in_order() except +
        vector[uint32_t] held_in_order(uint32_t w, uint32_t tier) except +
        vector[pair[uint64_t, uint32_t]] block_entries(uint32_t w) except +
        void path_tokens(uint32_t x, vector[uint32_t]* out) except +
        bool path_tags(uint32_t x, vector[uint64_t]* out) except +
        size_t memory_usage() except +
        void check_invariants() except +
