// A hash map from unsigned integer keys to small values, for the per-worker
// indexes of the meta-tree (node -> mark, block hash -> node).
//
// Open addressing with linear probing in one flat array: a lookup is one or
// two cache lines, where std::unordered_map costs a pointer chase per entry
// and 30+ bytes of overhead. The all-ones key marks an empty slot; since block
// hashes may take any 64-bit value, a real all-ones key lives in a side slot.
// Deletion shifts the following run back, so there are no tombstones and
// probe runs never degrade.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace radixmeta {

template <class K, class V>
class FlatMap {
 public:
  static constexpr K kEmpty = std::numeric_limits<K>::max();

  size_t size() const { return size_ + (has_sentinel_ ? 1 : 0); }
  bool empty() const { return size() == 0; }

  V* find(K key) {
    if (key == kEmpty) return has_sentinel_ ? &sentinel_value_ : nullptr;
    if (slots_.empty()) return nullptr;
    const size_t mask = slots_.size() - 1;
    for (size_t i = home(key); slots_[i].key != kEmpty; i = (i + 1) & mask)
      if (slots_[i].key == key) return &slots_[i].value;
    return nullptr;
  }
  const V* find(K key) const { return const_cast<FlatMap*>(this)->find(key); }
  bool contains(K key) const { return find(key) != nullptr; }

  // Sets map[key] = value; returns true if the key was new. Pointers returned
  // by find() are invalidated by an insertion.
  bool put(K key, const V& value) {
    if (key == kEmpty) {
      const bool fresh = !has_sentinel_;
      has_sentinel_ = true;
      sentinel_value_ = value;
      return fresh;
    }
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    const size_t mask = slots_.size() - 1;
    size_t i = home(key);
    for (; slots_[i].key != kEmpty; i = (i + 1) & mask) {
      if (slots_[i].key == key) {
        slots_[i].value = value;
        return false;
      }
    }
    slots_[i].key = key;
    slots_[i].value = value;
    ++size_;
    return true;
  }

  bool erase(K key) {
    if (key == kEmpty) return std::exchange(has_sentinel_, false);
    if (slots_.empty()) return false;
    const size_t mask = slots_.size() - 1;
    size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == kEmpty) return false;
      i = (i + 1) & mask;
    }
    // Backward-shift: move later entries of the run into the hole when their
    // home position does not lie cyclically in (hole, their slot].
    size_t hole = i;
    for (size_t j = (i + 1) & mask; slots_[j].key != kEmpty; j = (j + 1) & mask) {
      const size_t h = home(slots_[j].key);
      const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
      if (!stays) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].key = kEmpty;
    --size_;
    return true;
  }

  // f(key, value) for every entry, in no particular order. f must not modify the map.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.key != kEmpty) f(s.key, s.value);
    if (has_sentinel_) f(kEmpty, sentinel_value_);
  }

  void clear() {
    std::vector<Slot>().swap(slots_);
    size_ = 0;
    has_sentinel_ = false;
  }

  size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  struct Slot {
    K key = kEmpty;
    V value{};
  };

  size_t home(K key) const {
    // Fibonacci hashing: engine hashes are random, but test hashes and node
    // ids are small consecutive integers, which must not share a probe run.
    const uint64_t h = static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h >> shift_);
  }

  void grow() {
    const size_t capacity = slots_.empty() ? 8 : slots_.size() * 2;
    std::vector<Slot> old(capacity);
    old.swap(slots_);
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(capacity));
    size_ = 0;
    for (const Slot& s : old)
      if (s.key != kEmpty) put(s.key, s.value);
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
  unsigned shift_ = 61;
  bool has_sentinel_ = false;
  V sentinel_value_{};
};

}  // namespace radixmeta
