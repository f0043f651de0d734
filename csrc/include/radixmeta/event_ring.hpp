// A worker's eviction log: a bounded ring of what its RadixTree stores,
// removes and clears, in order, numbered by a sequence per record.
//
// Header-only C++17 with no Python dependency. The ring is the tree's
// observer, so every node the cache stores (a new leaf) or removes (an evicted
// leaf) becomes one record while the tree changes, with no second walk. A
// record keeps the node's full path and where the node's own pages start: what
// a MetaTree's insert/remove(key, worker, start=) take. Splits record nothing:
// they change no cached page. Records turn into Python objects only when read.
//
// Tokens of all records live in one buffer addressed by absolute offsets, so a
// record costs no allocation of its own; the buffer is compacted once its dead
// head outgrows its live part (amortised O(1) per token), and keeps its memory,
// so a ring in steady state neither allocates nor faults pages in. The ring is
// bounded twice: by records and by the tokens their paths hold.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "radix_tree.hpp"

namespace radixmeta {

// Record kinds (plain values: the binding reads them as small ints).
inline constexpr uint8_t kEventStored = 0, kEventRemoved = 1, kEventCleared = 2;

struct EventRecord {
  uint64_t seq;
  uint64_t offset;  // absolute offset of the path in the ring's token buffer
  uint32_t length;  // tokens in the path (0 for a clear)
  uint32_t start;   // where the node's own pages start within the path
  uint32_t ns;      // the tree's namespace id
  uint8_t kind;  // kEventStored, kEventRemoved or kEventCleared
};

namespace detail {

// An allocator that leaves new elements uninitialised: the ring's token buffer
// is always overwritten right after it grows, so zero-filling it is wasted work.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

}  // namespace detail

class EventRing final : public TreeObserver {
 public:
  EventRing(uint64_t capacity, uint64_t max_tokens)
      : capacity_(capacity == 0 ? 1 : capacity), max_tokens_(max_tokens) {}

  void stored(const RadixTree& tree, uint32_t node) override {
    push(kEventStored, tree, node);
  }
  void removed(const RadixTree& tree, uint32_t node) override {
    push(kEventRemoved, tree, node);
  }
  void cleared(const RadixTree&) override {
    records_.push_back({next_seq_++, token_base_ + tokens_.size(), 0, 0, 0, kEventCleared});
    trim();
  }

  uint64_t capacity() const { return capacity_; }
  uint64_t max_tokens() const { return max_tokens_; }
  uint64_t held_tokens() const { return held_tokens_; }
  uint64_t size() const { return records_.size(); }
  // The sequence number the next record will take.
  uint64_t next_seq() const { return next_seq_; }
  // The oldest sequence number still held (next_seq() when empty).
  uint64_t oldest_seq() const { return records_.empty() ? next_seq_ : records_.front().seq; }

  // Index into the held records of the first one with seq >= from.
  uint64_t index_of(uint64_t from) const {
    const uint64_t oldest = oldest_seq();
    return from <= oldest ? 0 : from - oldest;  // sequence numbers are contiguous
  }
  const EventRecord& at(uint64_t i) const { return records_[i]; }
  const Token* path(const EventRecord& r) const { return tokens_.data() + (r.offset - token_base_); }

 private:
  void push(uint8_t kind, const RadixTree& tree, uint32_t node) {
    const Node& n = tree.node(node);
    const uint64_t offset = token_base_ + tokens_.size();
    tokens_.resize(tokens_.size() + n.depth);
    // The path, copied bottom up in one walk that ends at the namespace's root.
    Token* out = tokens_.data() + (offset - token_base_);
    uint32_t x = node;
    for (size_t end = n.depth; tree.node(x).parent != kNoNode; x = tree.node(x).parent) {
      const Node& part = tree.node(x);
      end -= part.length;
      std::memcpy(out + end, part.label, size_t{part.length} * sizeof(Token));
    }
    records_.push_back({next_seq_++, offset, n.depth, n.depth - n.length, tree.node(x).ns, kind});
    held_tokens_ += n.depth;
    trim();
  }

  void trim() {
    // The newest record always stays, however long its path.
    while (records_.size() > capacity_ || (records_.size() > 1 && held_tokens_ > max_tokens_)) {
      held_tokens_ -= records_.front().length;
      records_.pop_front();
    }
    const uint64_t live_from = records_.empty() ? token_base_ + tokens_.size() : records_.front().offset;
    const uint64_t dead = live_from - token_base_;
    if (dead > 4096 && dead * 2 > tokens_.size()) {
      tokens_.erase(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(dead));
      token_base_ = live_from;
    }
  }

  uint64_t capacity_;
  uint64_t max_tokens_;
  uint64_t held_tokens_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t token_base_ = 0;  // absolute offset of tokens_[0]
  std::deque<EventRecord> records_;
  std::vector<Token, detail::UninitAllocator<Token>> tokens_;
};

// The default block hash of an event log in block form: a 64-bit chain over
// each page's tokens (FNV-1a over the token words, finished with splitmix64),
// seeded by the previous page's hash. Cheap, not cryptographic: it names pages
// for one router. hashes[i] covers page i of tokens[0, n_pages * page).
inline void chain_hashes(const Token* tokens, uint64_t n_pages, uint32_t page, uint64_t* hashes) {
  uint64_t h = 0x9E3779B97F4A7C15ull;  // the root's "hash"
  for (uint64_t p = 0; p < n_pages; ++p) {
    uint64_t x = h;
    for (uint32_t i = 0; i < page; ++i) x = (x ^ tokens[p * page + i]) * 0x100000001B3ull;
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    h = x ^ (x >> 31);
    hashes[p] = h;
  }
}

}  // namespace radixmeta
