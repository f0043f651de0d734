# Declarations of csrc/include/radixmeta/radix_tree.hpp for Cython (one block per header).
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libcpp cimport bool
from libcpp.pair cimport pair
from libcpp.vector cimport vector


cdef extern from "radixmeta/radix_tree.hpp" namespace "radixmeta" nogil:
    const uint32_t kNoNode
    const uint64_t kNoCapacity

    cdef enum class EvictionPolicy(unsigned char):
        kLru
        kLfu
        kFifo
        kPriority

    cdef cppclass Node:
        uint32_t parent
        uint64_t generation
        uint32_t length
        uint32_t lock_count
        uint32_t own_locks
        uint32_t depth
        bool is_root

    cdef struct MatchOutcome:
        uint32_t node
        uint64_t length

    cdef struct InsertOutcome:
        uint64_t prefix_length
        bool fits
        uint64_t new_tokens
        uint64_t evictable

    cdef struct TreeStats:
        uint64_t lookups
        uint64_t hit_tokens
        uint64_t inserted_tokens
        uint64_t evicted_tokens

    cdef cppclass TreeObserver:
        pass

    cdef cppclass RadixTree:
        RadixTree(uint32_t page_size, EvictionPolicy policy, bool store_values,
                  uint64_t capacity) except +
        uint32_t page_size()
        uint64_t capacity()
        bool refresh_split_tail()
        void set_refresh_split_tail(bool on)
        uint64_t epoch()
        uint64_t evictable_size()
        uint64_t protected_size()
        uint64_t total_size()
        uint64_t node_count()
        const TreeStats& stats()
        bool is_valid(uint32_t id, uint64_t generation, uint64_t epoch)
        const Node& node(uint32_t id)
        const uint32_t* label_tokens(uint32_t id)
        uint32_t root_of(uint32_t ns)
        void path_values(uint32_t id, int64_t* out) except +
        void path_tokens(uint32_t id, uint32_t* out)
        MatchOutcome match_prefix(uint32_t ns, const uint32_t* key, size_t n) except +
        InsertOutcome insert(uint32_t ns, const uint32_t* key, const int64_t* values,
                             size_t n, int64_t priority, uint64_t counted) except +
        void lock(uint32_t id)
        void unlock(uint32_t id) except +
        uint64_t evict(uint64_t num_tokens, vector[int64_t]* freed) except +
        vector[int64_t]& pending_evicted_mutable "pending_evicted_mutable"()
        vector[uint32_t] take_dropped_namespaces()
        void values_in_order(uint32_t ns, vector[int64_t]* out) except +
        void reset() except +
        vector[uint32_t] leaves_in_order(uint32_t ns) except +
        vector[pair[uint32_t, uint32_t]] structure(uint32_t ns) except +
        void set_observer(TreeObserver* observer)
        size_t memory_usage()
        void check_invariants() except +
