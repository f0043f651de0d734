// The children of one node, keyed by the first token of each child's label.
//
// Most nodes have one or two children, so those live inline in the node (no
// allocation, no extra cache miss). Beyond that the children move to a hash
// multimap. The key is only the first token: with pages of P > 1 tokens two
// children may share a first token and differ later in their first page, so a
// lookup returns candidates and the caller confirms the whole first page.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace radixmeta {

class Children {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  Children() = default;
  ~Children() { delete table_; }
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  Children(Children&& other) noexcept { steal(other); }
  Children& operator=(Children&& other) noexcept {
    if (this != &other) {
      delete table_;
      steal(other);
    }
    return *this;
  }

  uint32_t size() const { return table_ != nullptr ? static_cast<uint32_t>(table_->size()) : inline_count_; }
  bool empty() const { return size() == 0; }

  // First child whose key is `first` and for which confirm(child) holds, or kNone.
  template <class Confirm>
  uint32_t find(uint32_t first, Confirm&& confirm) const {
    if (table_ == nullptr) {
      for (uint32_t i = 0; i < inline_count_; ++i)
        if (first_[i] == first && confirm(node_[i])) return node_[i];
      return kNone;
    }
    auto range = table_->equal_range(first);
    for (auto it = range.first; it != range.second; ++it)
      if (confirm(it->second)) return it->second;
    return kNone;
  }

  void add(uint32_t first, uint32_t node) {
    if (table_ == nullptr && inline_count_ < kInline) {
      first_[inline_count_] = first;
      node_[inline_count_] = node;
      ++inline_count_;
      return;
    }
    if (table_ == nullptr) {
      table_ = new Table();
      for (uint32_t i = 0; i < inline_count_; ++i) table_->emplace(first_[i], node_[i]);
      inline_count_ = 0;
    }
    table_->emplace(first, node);
  }

  // Removes the entry (first, node); returns false when it is absent.
  bool remove(uint32_t first, uint32_t node) {
    if (table_ == nullptr) {
      for (uint32_t i = 0; i < inline_count_; ++i) {
        if (first_[i] == first && node_[i] == node) {
          --inline_count_;
          first_[i] = first_[inline_count_];
          node_[i] = node_[inline_count_];
          return true;
        }
      }
      return false;
    }
    auto range = table_->equal_range(first);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == node) {
        table_->erase(it);
        if (table_->empty()) {
          delete table_;
          table_ = nullptr;
        }
        return true;
      }
    }
    return false;
  }

  // Points the entry (first, old_node) at new_node; returns false when absent.
  bool replace(uint32_t first, uint32_t old_node, uint32_t new_node) {
    if (table_ == nullptr) {
      for (uint32_t i = 0; i < inline_count_; ++i) {
        if (first_[i] == first && node_[i] == old_node) {
          node_[i] = new_node;
          return true;
        }
      }
      return false;
    }
    auto range = table_->equal_range(first);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == old_node) {
        it->second = new_node;
        return true;
      }
    }
    return false;
  }

  template <class F>
  void for_each(F&& f) const {
    if (table_ == nullptr) {
      for (uint32_t i = 0; i < inline_count_; ++i) f(first_[i], node_[i]);
    } else {
      for (const auto& entry : *table_) f(entry.first, entry.second);
    }
  }

  void clear() {
    delete table_;
    table_ = nullptr;
    inline_count_ = 0;
  }

  // Estimated heap bytes of the overflow table (node-based hash map).
  size_t heap_bytes() const {
    if (table_ == nullptr) return 0;
    return sizeof(Table) + table_->size() * 32 + table_->bucket_count() * sizeof(void*);
  }

 private:
  static constexpr uint32_t kInline = 2;
  using Table = std::unordered_multimap<uint32_t, uint32_t>;

  void steal(Children& other) {
    inline_count_ = other.inline_count_;
    for (uint32_t i = 0; i < kInline; ++i) {
      first_[i] = other.first_[i];
      node_[i] = other.node_[i];
    }
    table_ = other.table_;
    other.table_ = nullptr;
    other.inline_count_ = 0;
  }

  uint32_t first_[kInline] = {0, 0};
  uint32_t node_[kInline] = {0, 0};
  uint32_t inline_count_ = 0;
  Table* table_ = nullptr;
};

}  // namespace radixmeta
