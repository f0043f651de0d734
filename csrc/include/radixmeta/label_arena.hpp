// Storage for edge labels (tokens) and their per-token values.
//
// Labels are written once and never modified: splitting an edge only changes
// which slice of the arena each of the two nodes points at, so a split costs
// no copy. Storage comes in fixed-size chunks (not one growing vector) so that
// reserved-but-unused memory stays bounded by one chunk, and a chunk whose
// labels were all freed is returned at once. Freed slices inside a chunk that
// still has live labels are garbage until the owner evacuates the sparse
// chunks (see RadixTree::maybe_compact), which keeps garbage below the live
// tokens. A few freed chunks are kept for reuse: a fresh chunk costs a page
// fault per 4 KiB on first touch, which dominates a compaction on a VM.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace radixmeta {

using Token = uint32_t;
using Value = int64_t;

struct LabelRef {
  uint32_t chunk = 0;
  uint32_t offset = 0;
};

class LabelArena {
 public:
  static constexpr uint32_t kDefaultChunkTokens = 1u << 16;

  explicit LabelArena(bool with_values, uint32_t chunk_tokens = kDefaultChunkTokens)
      : with_values_(with_values), chunk_tokens_(chunk_tokens) {}

  bool with_values() const { return with_values_; }

  // Copies n tokens (and n values when the arena stores them; values may be
  // null, in which case the tokens themselves are stored as values).
  LabelRef allocate(const Token* tokens, const Value* values, uint32_t n) {
    if (n == 0) throw std::invalid_argument("radixmeta: empty label");
    uint32_t chunk;
    if (n > chunk_tokens_ / 4) {
      chunk = new_chunk(n);  // long labels get a chunk of their own
    } else {
      if (current_ == kNone || chunks_[current_].capacity - chunks_[current_].used < n) {
        retire_current();
        current_ = new_chunk(chunk_tokens_);
      }
      chunk = current_;
    }
    Chunk& c = chunks_[chunk];
    const uint32_t offset = c.used;
    std::memcpy(c.tokens.get() + offset, tokens, size_t{n} * sizeof(Token));
    if (with_values_) {
      Value* dst = c.values.get() + offset;
      if (values != nullptr) {
        std::memcpy(dst, values, size_t{n} * sizeof(Value));
      } else {
        for (uint32_t i = 0; i < n; ++i) dst[i] = static_cast<Value>(tokens[i]);
      }
    }
    c.used += n;
    c.live += n;
    live_ += n;
    if (chunk != current_) retire(chunk);
    return LabelRef{chunk, offset};
  }

  // Marks n tokens of a chunk as no longer referenced by any node.
  void release(uint32_t chunk, uint32_t n) {
    Chunk& c = chunks_[chunk];
    c.live -= n;
    live_ -= n;
    garbage_ += n;
    if (c.live == 0 && chunk != current_) free_chunk(chunk);
  }

  const Token* tokens(uint32_t chunk, uint32_t offset) const {
    return chunks_[chunk].tokens.get() + offset;
  }
  // The values that sit beside the tokens at `label` in the same chunk (the
  // arena must store values).
  const Value* values_for(uint32_t chunk, const Token* label) const {
    const Chunk& c = chunks_[chunk];
    return c.values.get() + (label - c.tokens.get());
  }

  size_t live_tokens() const { return live_; }
  size_t garbage_tokens() const { return garbage_; }

  size_t memory_bytes() const {
    const size_t per_token = sizeof(Token) + (with_values_ ? sizeof(Value) : 0);
    return (reserved_ + spares_.size() * chunk_tokens_) * per_token +
           chunks_.capacity() * sizeof(Chunk) +
           free_slots_.capacity() * sizeof(uint32_t);
  }

  // Flags every chunk (but the one being filled) whose live labels take less
  // than seven eighths of what it used; returns how many were flagged. Their
  // labels should then be moved (allocate + release); a chunk whose last
  // label leaves is freed. Chunks created meanwhile are never flagged.
  size_t begin_evacuation() {
    size_t flagged = 0;
    for (uint32_t i = 0; i < chunks_.size(); ++i) {
      Chunk& c = chunks_[i];
      c.evacuating = i != current_ && c.capacity != 0 && size_t{c.live} * 8 < size_t{c.used} * 7;
      flagged += c.evacuating ? 1 : 0;
    }
    return flagged;
  }
  bool evacuating(uint32_t chunk) const { return chunks_[chunk].evacuating; }

  void clear() {
    spares_.clear();
    chunks_.clear();
    free_slots_.clear();
    current_ = kNone;
    live_ = garbage_ = reserved_ = 0;
  }

  // Consistency of the chunk counters; returns false on a violation.
  bool counters_consistent() const {
    size_t live = 0, reserved = 0;
    for (const Chunk& c : chunks_) {
      if (c.used > c.capacity || c.live > c.used) return false;
      live += c.live;
      reserved += c.capacity;
    }
    return live == live_ && reserved == reserved_;
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Chunk {
    std::unique_ptr<Token[]> tokens;
    std::unique_ptr<Value[]> values;
    uint32_t capacity = 0;
    uint32_t used = 0;
    uint32_t live = 0;
    bool evacuating = false;  // its labels are being moved out (see begin_evacuation)
  };

  struct Spare {
    std::unique_ptr<Token[]> tokens;
    std::unique_ptr<Value[]> values;
  };
  static constexpr size_t kMaxSpares = 4;

  uint32_t new_chunk(uint32_t capacity) {
    uint32_t index;
    if (!free_slots_.empty()) {
      index = free_slots_.back();
      free_slots_.pop_back();
    } else {
      index = static_cast<uint32_t>(chunks_.size());
      chunks_.emplace_back();
    }
    Chunk& c = chunks_[index];
    if (capacity == chunk_tokens_ && !spares_.empty()) {
      c.tokens = std::move(spares_.back().tokens);
      c.values = std::move(spares_.back().values);
      spares_.pop_back();
    } else {
      // new T[] without () leaves the memory untouched, so the OS maps pages
      // only as labels are written.
      c.tokens.reset(new Token[capacity]);
      if (with_values_) c.values.reset(new Value[capacity]);
    }
    c.capacity = capacity;
    c.used = c.live = 0;
    c.evacuating = false;
    reserved_ += capacity;
    return index;
  }

  void free_chunk(uint32_t index) {
    Chunk& c = chunks_[index];
    garbage_ -= c.used;  // live is zero: everything it held was garbage
    reserved_ -= c.capacity;
    if (c.capacity == chunk_tokens_ && spares_.size() < kMaxSpares) {
      spares_.push_back(Spare{std::move(c.tokens), std::move(c.values)});
    } else {
      c.tokens.reset();
      c.values.reset();
    }
    c.capacity = c.used = c.live = 0;
    c.evacuating = false;
    free_slots_.push_back(index);
  }

  // A chunk that takes no more labels: its unused tail counts as garbage.
  void retire(uint32_t index) {
    Chunk& c = chunks_[index];
    garbage_ += c.capacity - c.used;
    c.used = c.capacity;
    if (c.live == 0) free_chunk(index);
  }

  void retire_current() {
    if (current_ != kNone) retire(current_);
    current_ = kNone;
  }

  bool with_values_;
  uint32_t chunk_tokens_;
  std::vector<Chunk> chunks_;
  std::vector<uint32_t> free_slots_;
  std::vector<Spare> spares_;
  uint32_t current_ = kNone;
  size_t live_ = 0;
  size_t garbage_ = 0;
  size_t reserved_ = 0;
};

}  // namespace radixmeta
