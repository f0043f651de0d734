// The order in which evictable leaves are freed: an indexed binary min-heap.
//
// Each entry carries its node's eviction key, so sifting compares entries in
// one contiguous array instead of chasing node records (a cache miss per level
// on a large tree). Positions live in a dense array indexed by node id, which
// makes remove and update O(log n) for any node, not just the top.
#pragma once

#include <cstdint>
#include <vector>

namespace radixmeta {

// Compared lexicographically; smaller is evicted first.
struct EvictKey {
  uint64_t a = 0, b = 0, c = 0;

  bool operator<(const EvictKey& o) const {
    if (a != o.a) return a < o.a;
    if (b != o.b) return b < o.b;
    return c < o.c;
  }
  bool operator==(const EvictKey& o) const { return a == o.a && b == o.b && c == o.c; }
};

class EvictHeap {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  uint32_t top() const { return entries_[0].id; }
  bool contains(uint32_t id) const { return id < pos_.size() && pos_[id] != kAbsent; }

  void push(uint32_t id, const EvictKey& key) {
    if (id >= pos_.size()) pos_.resize(size_t{id} + 1 + pos_.size() / 2, kAbsent);
    entries_.push_back(Entry{key, id});
    sift_up(entries_.size() - 1);
  }

  void remove(uint32_t id) {
    const size_t pos = pos_[id];
    pos_[id] = kAbsent;
    const Entry last = entries_.back();
    entries_.pop_back();
    if (last.id == id) return;
    entries_[pos] = last;
    pos_[last.id] = static_cast<uint32_t>(pos);
    sift_up(pos);
    sift_down(pos_[last.id]);
  }

  // The key of an entry changed.
  void update(uint32_t id, const EvictKey& key) {
    const size_t pos = pos_[id];
    entries_[pos].key = key;
    sift_up(pos);
    sift_down(pos_[id]);
  }

  void clear() {
    entries_.clear();
    pos_.clear();
  }

  const EvictKey& key_of(uint32_t id) const { return entries_[pos_[id]].key; }

  // Heap order and position bookkeeping; false on a violation.
  bool consistent() const {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (pos_[entries_[i].id] != i) return false;
      if (i > 0 && entries_[i].key < entries_[(i - 1) / 2].key) return false;
    }
    return true;
  }

  size_t memory_bytes() const {
    return entries_.capacity() * sizeof(Entry) + pos_.capacity() * sizeof(uint32_t);
  }

 private:
  struct Entry {
    EvictKey key;
    uint32_t id;
  };

  void sift_up(size_t pos) {
    const Entry e = entries_[pos];
    while (pos > 0) {
      const size_t parent = (pos - 1) / 2;
      if (!(e.key < entries_[parent].key)) break;
      entries_[pos] = entries_[parent];
      pos_[entries_[pos].id] = static_cast<uint32_t>(pos);
      pos = parent;
    }
    entries_[pos] = e;
    pos_[e.id] = static_cast<uint32_t>(pos);
  }

  void sift_down(size_t pos) {
    const Entry e = entries_[pos];
    const size_t n = entries_.size();
    while (true) {
      size_t child = 2 * pos + 1;
      if (child >= n) break;
      if (child + 1 < n && entries_[child + 1].key < entries_[child].key) ++child;
      if (!(entries_[child].key < e.key)) break;
      entries_[pos] = entries_[child];
      pos_[entries_[pos].id] = static_cast<uint32_t>(pos);
      pos = child;
    }
    entries_[pos] = e;
    pos_[e.id] = static_cast<uint32_t>(pos);
  }

  std::vector<Entry> entries_;
  std::vector<uint32_t> pos_;  // node id -> index in entries_, or kAbsent
};

}  // namespace radixmeta
