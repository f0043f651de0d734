// A worker's eviction log: a bounded ring of what its RadixTree stores,
// removes and clears, in order, numbered by a sequence per record.
//
// Header-only C++17 with no Python dependency. The ring is the tree's
// observer, so every node the cache stores (a new leaf) or removes (an evicted
// leaf) becomes one record while the tree changes, with no second walk. A
// record stands for the node's full path and where the node's own pages start:
// what a MetaTree's insert/remove(key, worker, start=) take. Splits record
// nothing: they change no cached page. Records turn into Python objects only
// when read.
//
// Paths are not copied whole. A record is a list of segments, runs of the
// ring's token buffer that spell the path root first. The ring remembers, per
// tree node, where it last copied that node's label; a later record through
// the same node names that run instead of copying it again. So a record copies
// only the labels the ring does not hold yet: a stored leaf its own label, and
// a removed leaf usually nothing (its stored record copied its label, and its
// ancestors were copied by earlier records). Adjacent runs merge into one
// segment. Labels shorter than kMinShared tokens are always copied, so a
// segment never costs more than the tokens it stands for.
//
// Why a named run holds the right tokens: the run [end - length, end) noted
// for a node holds its label for as long as the node lives. A split keeps the
// lower half's id and cuts its label from the front (the end stays); the upper
// half is a new id; a freed id's generation changes, and the note is checked
// against it; reset() reuses ids from scratch, and clears the notes. The
// buffer is a circular array addressed by absolute offsets, appended to only:
// an offset never changes meaning while held, and the array keeps at least
// every token from the lowest one a held record reads (the minimum of the held
// records' bases) to the end. A record may name only runs at or above
//   floor = max(that minimum, end - held_tokens)
// and copies everything else from the tree, so the fallback is always exact.
//
// Bounds. Records are dropped exactly as if every path were copied whole: by
// count (capacity) and by the tokens their paths spell (held_tokens, at most
// max_tokens), the newest always staying; the ones a new record pushes out go
// before it is written. Memory: a record names nothing further back than the
// tokens held before it, and copies at most its path, so the buffer's live
// part spans at most the tokens held when the furthest-reaching held record
// was written plus those held now: twice the most ever held, so at most
// 2 * max_tokens (a single longer path aside), and in practice less than one
// max_tokens, since most of a path is named. The array (a power of two)
// doubles when the live part would not fit, so it stays under twice the
// largest live part (2 * max_tokens itself when that is a power of two, as by
// default), and never moves a token otherwise. Segments take 16 bytes, at most two for each kMinShared tokens
// named plus one per record; their list is compacted once its dead head
// outgrows its live part (amortised O(1) per segment). Both keep their memory,
// so in steady state they neither allocate nor fault pages in. The per-node
// notes take 16 bytes per node id the tree has used.
#pragma once

#include <algorithm>
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
  uint64_t first_segment;  // absolute index of its first segment (its last: the next's first - 1)
  uint32_t length;         // tokens in the path (0 for a clear)
  uint32_t start;          // where the node's own pages start within the path
  uint32_t ns;             // the tree's namespace id
  uint8_t kind;            // kEventStored, kEventRemoved or kEventCleared
};

// A run of the ring's token buffer: tokens [offset, offset + length), absolute.
struct EventSegment {
  uint64_t offset;
  uint64_t length;
};

namespace detail {

// An allocator that leaves new elements uninitialised: the ring's buffers are
// always overwritten right after they grow, so zero-filling them is wasted work.
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

// Erases the dead head of a buffer addressed from *base once it outgrows the
// live part (and a page's worth), so each element is moved amortised O(1) times.
template <class Vec>
void compact_head(Vec& v, uint64_t* base, uint64_t live_from) {
  const uint64_t dead = live_from - *base;
  if (dead > 4096 && dead * 2 > v.size()) {
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(dead));
    *base = live_from;
  }
}

// The ring's token buffer: a circular array addressed by absolute offsets
// (offset & mask), so dropping old tokens costs nothing and nothing is ever
// moved in steady state. The caller keeps the live tokens [low, end()) within
// the capacity through reserve(), which grows the array (doubling, copying the
// live tokens to their places in the new one) when they would not fit.
class TokenRing {
 public:
  static constexpr uint64_t kInitialTokens = 64;

  uint64_t end() const { return end_; }
  uint64_t capacity() const { return mask_ + 1; }

  // Makes room for n more tokens after end() while keeping [low, end()).
  void reserve(uint64_t low, uint64_t n) {
    const uint64_t need = end_ - low + n;
    if (need <= capacity() && buf_ != nullptr) return;
    uint64_t cap = buf_ == nullptr ? kInitialTokens : capacity() * 2;
    while (cap < need) cap *= 2;
    TokenRing next;
    next.buf_.reset(new Token[cap]);  // left uninitialised
    next.mask_ = cap - 1;
    next.end_ = low;
    for (uint64_t at = low; at < end_;) {  // at most two pieces on each side
      const uint64_t idx = at & mask_;
      const uint64_t run = std::min(end_ - at, capacity() - idx);
      next.append(buf_.get() + idx, run);
      at += run;
    }
    *this = std::move(next);
  }
  // Appends n tokens (room must have been reserved).
  void append(const Token* src, uint64_t n) {
    const uint64_t idx = end_ & mask_;
    const uint64_t first = std::min(n, capacity() - idx);
    std::memcpy(buf_.get() + idx, src, first * sizeof(Token));
    if (first < n) std::memcpy(buf_.get(), src + first, (n - first) * sizeof(Token));
    end_ += n;
  }
  // Copies the n tokens from absolute offset `offset` (still held) to out.
  void read(uint64_t offset, uint64_t n, Token* out) const {
    const uint64_t idx = offset & mask_;
    const uint64_t first = std::min(n, capacity() - idx);
    std::memcpy(out, buf_.get() + idx, first * sizeof(Token));
    if (first < n) std::memcpy(out + first, buf_.get(), (n - first) * sizeof(Token));
  }

 private:
  std::unique_ptr<Token[]> buf_;
  uint64_t mask_ = 0;
  uint64_t end_ = 0;
};

}  // namespace detail

class EventRing final : public TreeObserver {
 public:
  // Labels shorter than this are copied rather than named: a segment (16
  // bytes) then never costs more than the tokens it stands for.
  static constexpr uint32_t kMinShared = 8;

  EventRing(uint64_t capacity, uint64_t max_tokens)
      : capacity_(capacity == 0 ? 1 : capacity), max_tokens_(max_tokens) {}

  void stored(const RadixTree& tree, uint32_t node) override {
    push(kEventStored, tree, node);
  }
  void removed(const RadixTree& tree, uint32_t node) override {
    push(kEventRemoved, tree, node);
  }
  void cleared(const RadixTree&) override {
    make_room(0);
    add_record({next_seq_, segment_end(), 0, 0, 0, kEventCleared}, tokens_.end());
    where_.clear();  // the tree is about to reuse every node id from its first generation
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
  // Writes the path of held record i (at(i).length tokens) to out.
  void copy_path(uint64_t i, Token* out) const {
    const uint64_t last = i + 1 < records_.size() ? records_[i + 1].first_segment : committed_;
    for (uint64_t s = records_[i].first_segment; s < last; ++s) {
      const EventSegment& seg = segments_[s - segment_base_];
      tokens_.read(seg.offset, seg.length, out);
      out += seg.length;
    }
  }

  // Drops every held record with seq <= through (what all readers have
  // applied), so the ring keeps, and the buffers span, only what is still to
  // be read. Returns how many were dropped. A later read from before the
  // oldest held record is refused as truncated, exactly as for records the
  // bounds dropped. O(records dropped), amortised O(1) per dropped segment.
  uint64_t discard_through(uint64_t through) {
    rollback();
    uint64_t dropped = 0;
    while (!records_.empty() && records_.front().seq <= through) {
      held_tokens_ -= records_.front().length;
      records_.pop_front();
      ++dropped;
    }
    if (dropped != 0) forget_dropped();
    return dropped;
  }

  // For tests and diagnostics: tokens from the lowest one a held record reads
  // to the end (what sharing keeps alive), the token array's size, the
  // segments held.
  uint64_t live_tokens() const { return records_.empty() ? 0 : tokens_.end() - bases_.front().base; }
  uint64_t buffer_tokens() const { return tokens_.capacity(); }
  // Tokens the ring copied since it was made (what it did not name).
  uint64_t copied_tokens() const { return tokens_.end(); }
  uint64_t held_segments() const {
    return records_.empty() ? 0 : committed_ - records_.front().first_segment;
  }

 private:
  // Where the ring last copied a node's label: tokens [end - length, end),
  // while the node's generation is tag - 1 (tag 0: nowhere).
  struct Copied {
    uint64_t tag = 0;
    uint64_t end = 0;
  };
  static constexpr uint64_t kCopy = ~uint64_t{0};
  struct Link {
    uint32_t node;
    uint64_t from;  // the absolute offset its label is named from, or kCopy
  };
  struct Base {
    uint64_t seq;
    uint64_t base;  // the lowest token offset record seq reads
  };

  uint64_t segment_end() const { return segment_base_ + segments_.size(); }

  // Drops segments a push left behind when it threw (out of memory) before
  // its record was added: copy_path reads a record's segments up to the next's.
  void rollback() {
    if (segment_end() != committed_) segments_.resize(committed_ - segment_base_);
  }

  void add_segment(uint64_t offset, uint64_t length) {
    if (segment_end() > committed_) {  // merge with the record's previous run if adjacent
      EventSegment& last = segments_.back();
      if (last.offset + last.length == offset) {
        last.length += length;
        return;
      }
    }
    segments_.push_back({offset, length});
  }

  void push(uint8_t kind, const RadixTree& tree, uint32_t node) {
    const uint64_t held = held_tokens_;
    make_room(tree.node(node).depth);
    const uint64_t end = tokens_.end();
    const uint64_t low = bases_.empty() ? end : bases_.front().base;
    // Runs at or above the floor are safe to name (see the file comment).
    const uint64_t floor = std::max(low, end - std::min(end, held));
    // The path bottom up, deciding per node whether to name or copy its label.
    chain_.clear();
    uint64_t copy_tokens = 0;
    uint32_t x = node;
    for (; tree.node(x).parent != kNoNode; x = tree.node(x).parent) {
      const Node& n = tree.node(x);
      uint64_t from = kCopy;
      if (n.length >= kMinShared && x < where_.size()) {
        const Copied& c = where_[x];
        if (c.tag == n.generation + 1 && c.end - n.length >= floor) from = c.end - n.length;
      }
      if (from == kCopy) copy_tokens += n.length;
      chain_.push_back({x, from});
    }
    const uint32_t ns = tree.node(x).ns;
    if (copy_tokens != 0) tokens_.reserve(low, copy_tokens);
    // Then top down: segments in path order, the copies appended as one run.
    uint64_t base = end;
    for (auto it = chain_.rbegin(); it != chain_.rend(); ++it) {
      const Node& n = tree.node(it->node);
      if (it->from == kCopy) {
        const uint64_t at = tokens_.end();
        tokens_.append(n.label, n.length);
        add_segment(at, n.length);
        if (it->node >= where_.size()) where_.resize(size_t{it->node} + 1);
        where_[it->node] = {n.generation + 1, at + n.length};
      } else {
        add_segment(it->from, n.length);
        base = std::min(base, it->from);
      }
    }
    const Node& n = tree.node(node);
    add_record({next_seq_, committed_, n.depth, n.depth - n.length, ns, kind}, base);
  }

  // Drops the records that adding one of `length` tokens drops (the oldest,
  // past capacity or max_tokens; the newest always stays, however long), so
  // that the token array need hold only what the survivors read.
  void make_room(uint64_t length) {
    rollback();
    while (!records_.empty() &&
           (records_.size() >= capacity_ || held_tokens_ + length > max_tokens_)) {
      held_tokens_ -= records_.front().length;
      records_.pop_front();
    }
    forget_dropped();
  }

  // After records were dropped from the front: the bases and segments only
  // they needed go too.
  void forget_dropped() {
    while (!bases_.empty() && (records_.empty() || bases_.front().seq < records_.front().seq))
      bases_.pop_front();
    detail::compact_head(segments_, &segment_base_,
                         records_.empty() ? committed_ : records_.front().first_segment);
  }

  // Adds a record whose segments were just written (after make_room).
  void add_record(const EventRecord& r, uint64_t base) {
    // bases_ holds the increasing minima of the held records' bases, newest
    // last (a sliding-window minimum): its front is the lowest token any held
    // record reads. Amortised O(1) per record. If adding the record throws,
    // its entry stays: it only keeps more tokens than needed.
    bases_.push_back({r.seq, base});
    for (size_t k = bases_.size(); k > 1 && bases_[k - 2].base >= base; --k) {
      bases_[k - 2] = bases_[k - 1];
      bases_.pop_back();
    }
    records_.push_back(r);
    ++next_seq_;
    committed_ = segment_end();
    held_tokens_ += r.length;
  }

  uint64_t capacity_;
  uint64_t max_tokens_;
  uint64_t held_tokens_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t segment_base_ = 0;  // absolute index of segments_[0]
  uint64_t committed_ = 0;     // absolute end of the held records' segments
  std::deque<EventRecord> records_;
  std::deque<Base> bases_;
  detail::TokenRing tokens_;
  std::vector<EventSegment, detail::UninitAllocator<EventSegment>> segments_;
  std::vector<Copied> where_;  // by tree node id
  std::vector<Link> chain_;    // scratch: the path being recorded, bottom up
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
