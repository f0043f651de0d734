// The children of one node, keyed by a 32-bit key of each child's first page:
// the first token itself at page size 1, a hash of the whole first page above
// it (detail::page_key in paging.hpp).
//
// Most nodes have one or two children, so those live inline in the node (no
// allocation, no extra cache miss). Beyond that the children move to an
// open-addressing hash table (linear probing, multiplicative hash, load at
// most 1/2), whose keys and ids sit together in one allocation. Above page
// size 1 two different first pages may hash to one key, so a lookup walks
// every entry with that key and the caller confirms the whole first page.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>

namespace radixmeta {

class Children {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  Children() = default;
  ~Children() { std::free(table_); }
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  Children(Children&& other) noexcept { steal(other); }
  Children& operator=(Children&& other) noexcept {
    if (this != &other) {
      std::free(table_);
      steal(other);
    }
    return *this;
  }

  uint32_t size() const { return count_; }
  // The child of a node that has exactly one, else kNone.
  uint32_t only() const { return count_ == 1 && table_ == nullptr ? node_[0] : kNone; }
  bool empty() const { return count_ == 0; }

  // First child whose key is `first` and for which confirm(child) holds, or kNone.
  template <class Confirm>
  uint32_t find(uint32_t first, Confirm&& confirm) const {
    if (table_ == nullptr) {
      for (uint32_t i = 0; i < count_; ++i)
        if (first_[i] == first && confirm(node_[i])) return node_[i];
      return kNone;
    }
    const uint32_t mask = capacity_ - 1;
    for (uint32_t i = home(first); table_[i].node != kNone; i = (i + 1) & mask)
      if (table_[i].first == first && confirm(table_[i].node)) return table_[i].node;
    return kNone;
  }

  void add(uint32_t first, uint32_t node) {
    if (table_ == nullptr && count_ < kInline) {
      first_[count_] = first;
      node_[count_] = node;
      ++count_;
      return;
    }
    if (table_ == nullptr || (count_ + 1) * 2 > capacity_) rehash(capacity_ == 0 ? 8 : capacity_ * 2);
    place(first, node);
    ++count_;
  }

  // Removes the entry (first, node); returns false when it is absent.
  bool remove(uint32_t first, uint32_t node) {
    if (table_ == nullptr) {
      for (uint32_t i = 0; i < count_; ++i) {
        if (first_[i] == first && node_[i] == node) {
          --count_;
          first_[i] = first_[count_];
          node_[i] = node_[count_];
          return true;
        }
      }
      return false;
    }
    const uint32_t mask = capacity_ - 1;
    uint32_t i = home(first);
    while (table_[i].node != kNone && !(table_[i].first == first && table_[i].node == node))
      i = (i + 1) & mask;
    if (table_[i].node == kNone) return false;
    // Backward-shift deletion: pull later entries of the probe run into the
    // hole when that keeps them reachable from their home slot.
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & mask; table_[j].node != kNone; j = (j + 1) & mask) {
      const uint32_t h = home(table_[j].first);
      const bool reachable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
      if (reachable) {
        table_[hole] = table_[j];
        hole = j;
      }
    }
    table_[hole].node = kNone;
    --count_;
    if (count_ == 0) clear();
    return true;
  }

  // Points the entry (first, old_node) at new_node; returns false when absent.
  bool replace(uint32_t first, uint32_t old_node, uint32_t new_node) {
    if (table_ == nullptr) {
      for (uint32_t i = 0; i < count_; ++i) {
        if (first_[i] == first && node_[i] == old_node) {
          node_[i] = new_node;
          return true;
        }
      }
      return false;
    }
    const uint32_t mask = capacity_ - 1;
    for (uint32_t i = home(first); table_[i].node != kNone; i = (i + 1) & mask) {
      if (table_[i].first == first && table_[i].node == old_node) {
        table_[i].node = new_node;
        return true;
      }
    }
    return false;
  }

  template <class F>
  void for_each(F&& f) const {
    if (table_ == nullptr) {
      for (uint32_t i = 0; i < count_; ++i) f(first_[i], node_[i]);
    } else {
      for (uint32_t i = 0; i < capacity_; ++i)
        if (table_[i].node != kNone) f(table_[i].first, table_[i].node);
    }
  }

  void clear() {
    std::free(table_);
    table_ = nullptr;
    capacity_ = count_ = 0;
  }

  size_t heap_bytes() const { return size_t{capacity_} * sizeof(Slot); }

 private:
  static constexpr uint32_t kInline = 2;

  struct Slot {
    uint32_t first;
    uint32_t node;  // kNone marks an empty slot
  };

  uint32_t home(uint32_t first) const {
    // Fibonacci hashing: the high bits of a multiplicative hash.
    return static_cast<uint32_t>((uint64_t{first} * 0x9E3779B97F4A7C15ull) >> 32) & (capacity_ - 1);
  }

  void place(uint32_t first, uint32_t node) {
    const uint32_t mask = capacity_ - 1;
    uint32_t i = home(first);
    while (table_[i].node != kNone) i = (i + 1) & mask;
    table_[i] = Slot{first, node};
  }

  void rehash(uint32_t capacity) {
    Slot* old = table_;
    const uint32_t old_capacity = capacity_;
    const bool was_inline = old == nullptr;
    table_ = static_cast<Slot*>(std::malloc(size_t{capacity} * sizeof(Slot)));
    if (table_ == nullptr) throw std::bad_alloc();
    capacity_ = capacity;
    for (uint32_t i = 0; i < capacity; ++i) table_[i].node = kNone;
    if (was_inline) {
      for (uint32_t i = 0; i < count_; ++i) place(first_[i], node_[i]);
    } else {
      for (uint32_t i = 0; i < old_capacity; ++i)
        if (old[i].node != kNone) place(old[i].first, old[i].node);
      std::free(old);
    }
  }

  void steal(Children& other) {
    count_ = other.count_;
    capacity_ = other.capacity_;
    for (uint32_t i = 0; i < kInline; ++i) {
      first_[i] = other.first_[i];
      node_[i] = other.node_[i];
    }
    table_ = other.table_;
    other.table_ = nullptr;
    other.count_ = other.capacity_ = 0;
  }

  uint32_t first_[kInline] = {0, 0};
  uint32_t node_[kInline] = {0, 0};
  uint32_t count_ = 0;
  uint32_t capacity_ = 0;  // table slots (a power of two), 0 while inline
  Slot* table_ = nullptr;
};

}  // namespace radixmeta
