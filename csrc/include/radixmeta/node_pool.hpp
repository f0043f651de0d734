// Stable storage for tree nodes, addressed by dense 32-bit ids.
//
// Nodes live in fixed-size blocks rather than one std::vector, for two reasons:
// growing never moves existing nodes (so a Node& stays valid while new nodes
// are created, which the split and insert paths rely on), and the memory
// reserved beyond what is used is bounded by one block instead of doubling.
// Freed ids are reused last-in first-out; each reuse is told apart from the
// previous life of the id by the node's generation counter.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace radixmeta {

template <class T>
class NodePool {
 public:
  static constexpr uint32_t kBlockBits = 12;
  static constexpr uint32_t kBlockSize = 1u << kBlockBits;

  T& operator[](uint32_t id) { return blocks_[id >> kBlockBits][id & (kBlockSize - 1)]; }
  const T& operator[](uint32_t id) const {
    return blocks_[id >> kBlockBits][id & (kBlockSize - 1)];
  }

  // Number of ids ever handed out (live or free).
  uint32_t size() const { return size_; }

  // Returns an id whose slot holds a default-constructed T, except that a
  // reused slot keeps whatever the caller left in it when freeing.
  uint32_t allocate() {
    if (!free_.empty()) {
      const uint32_t id = free_.back();
      free_.pop_back();
      return id;
    }
    if ((size_ & (kBlockSize - 1)) == 0) blocks_.emplace_back(new T[kBlockSize]);
    return size_++;
  }

  void release(uint32_t id) { free_.push_back(id); }

  void clear() {
    blocks_.clear();
    free_.clear();
    size_ = 0;
  }

  // Bytes of all blocks (constructing a block touches all of it).
  size_t memory_bytes() const {
    return blocks_.size() * kBlockSize * sizeof(T) + blocks_.capacity() * sizeof(void*) +
           free_.capacity() * sizeof(uint32_t);
  }

 private:
  std::vector<std::unique_ptr<T[]>> blocks_;
  std::vector<uint32_t> free_;
  uint32_t size_ = 0;
};

}  // namespace radixmeta
