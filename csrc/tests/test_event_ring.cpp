// Tests of the event ring (event_ring.hpp) with g++ alone: `make -C csrc test`.
//
// Every record the ring holds must spell exactly the path the node had when it
// was recorded, whatever the ring shared, wrapped or dropped. A tee observer
// feeds the ring and an oracle that copies each path whole (as the pure-Python
// reference does); after every operation the two must hold the same records.
// Tiny rings (a few records, a few tokens) make the circular buffer wrap and
// named runs fall below the floor all the time. Deterministic: fixed seeds.
#include <radixmeta/event_ring.hpp>

#include "check.hpp"

#include <cstdio>
#include <deque>
#include <random>
#include <vector>

using radixmeta::EventRing;
using radixmeta::EvictionPolicy;
using radixmeta::RadixTree;
using radixmeta::Token;

namespace {

struct Expected {
  uint64_t seq;
  uint8_t kind;
  uint32_t ns;
  uint32_t start;
  std::vector<Token> path;
};

// The oracle: whole paths, dropped by the same rules as the ring's.
class Tee final : public radixmeta::TreeObserver {
 public:
  Tee(uint64_t capacity, uint64_t max_tokens)
      : ring(capacity, max_tokens), capacity_(capacity), max_tokens_(max_tokens) {}

  void stored(const RadixTree& t, uint32_t node) override {
    ring.stored(t, node);
    add(radixmeta::kEventStored, t, node);
  }
  void removed(const RadixTree& t, uint32_t node) override {
    ring.removed(t, node);
    add(radixmeta::kEventRemoved, t, node);
  }
  void cleared(const RadixTree& t) override {
    ring.cleared(t);
    push({next_seq_++, radixmeta::kEventCleared, 0, 0, {}});
  }

  // A reader is done through `through`: both drop it, and agree on how many.
  void discard(uint64_t through) {
    uint64_t dropped = 0;
    while (!held_.empty() && held_.front().seq <= through) {
      held_tokens_ -= held_.front().path.size();
      held_.pop_front();
      ++dropped;
    }
    CHECK(ring.discard_through(through) == dropped);
  }

  // The ring holds what the oracle holds, token for token.
  void check() const {
    CHECK(ring.size() == held_.size());
    CHECK(ring.next_seq() == next_seq_);
    CHECK(ring.held_tokens() == held_tokens_);
    if (ring.size() != held_.size()) return;
    CHECK(ring.oldest_seq() == (held_.empty() ? next_seq_ : held_.front().seq));
    for (uint64_t i = 0; i < held_.size(); ++i) {
      const auto& r = ring.at(i);
      const Expected& e = held_[i];
      CHECK(r.seq == e.seq);
      CHECK(r.kind == e.kind);
      CHECK(r.ns == e.ns);
      CHECK(r.start == e.start);
      CHECK(r.length == e.path.size());
      if (r.length != e.path.size()) continue;
      std::vector<Token> got(r.length + 1, 0xDEADBEEF);  // one past: no overrun
      ring.copy_path(i, got.data());
      CHECK(got.back() == 0xDEADBEEF);
      got.pop_back();
      CHECK(got == e.path);
    }
    // The memory bound of the file comment: twice the most tokens ever held.
    CHECK(ring.live_tokens() <= 2 * most_held_);
    CHECK(ring.live_tokens() <= ring.buffer_tokens());
    CHECK(ring.buffer_tokens() <= std::max<uint64_t>(64, 4 * most_held_));
  }

  EventRing ring;

 private:
  void add(uint8_t kind, const RadixTree& t, uint32_t node) {
    const auto& n = t.node(node);
    std::vector<Token> path(n.depth);
    t.path_tokens(node, path.data());
    uint32_t root = node;
    while (t.node(root).parent != radixmeta::kNoNode) root = t.node(root).parent;
    push({next_seq_++, kind, t.node(root).ns, n.depth - n.length, std::move(path)});
  }
  void push(Expected e) {
    held_tokens_ += e.path.size();
    held_.push_back(std::move(e));
    while (held_.size() > capacity_ || (held_.size() > 1 && held_tokens_ > max_tokens_)) {
      held_tokens_ -= held_.front().path.size();
      held_.pop_front();
    }
    most_held_ = std::max(most_held_, held_tokens_);
  }

  uint64_t capacity_, max_tokens_;
  uint64_t next_seq_ = 0, held_tokens_ = 0, most_held_ = 0;
  std::deque<Expected> held_;
};

// Random inserts (sharing stems, so splits and shared ancestors abound),
// matches (which split), evictions, locks and resets, checked after each.
void test_random(uint32_t page, uint64_t capacity, uint64_t max_tokens, uint64_t tree_capacity,
                 uint32_t seed, bool discards = false) {
  std::mt19937 rng(seed);
  RadixTree t(page, EvictionPolicy::kLru, false, tree_capacity);
  Tee tee(capacity, max_tokens);
  t.set_observer(&tee);
  std::vector<std::vector<Token>> stems;
  for (int i = 0; i < 6; ++i) {
    std::vector<Token> s(rng() % 48 + 1);
    for (auto& x : s) x = rng() % 3;
    stems.push_back(s);
  }
  std::vector<uint32_t> locked;
  auto key = [&]() {
    std::vector<Token> k = stems[rng() % stems.size()];
    k.resize(rng() % (k.size() + 1));
    for (uint32_t n = rng() % 40; n > 0; --n) k.push_back(rng() % 4);
    // Now and then a long fresh tail, growing over the run: the token array
    // must grow (and drop what no held record reads) while notes still point
    // below the lowest held run.
    if (rng() % 50 == 0)
      for (uint32_t n = rng() % (k.size() * 4 + 40); n > 0; --n) k.push_back(4 + rng() % 1000);
    return k;
  };
  for (int step = 0; step < 3000; ++step) {
    const uint32_t op = rng() % 100;
    const uint32_t ns = rng() % 3 == 0 ? 1 + rng() % 2 : 0;
    if (op < 55) {
      const auto k = key();
      t.insert(ns, k.data(), nullptr, k.size(), 0);
    } else if (op < 70) {
      const auto k = key();
      const auto m = t.match_prefix(ns, k.data(), k.size());
      if (m.length != 0 && rng() % 4 == 0 && locked.size() < 4) {
        t.lock(m.node);
        locked.push_back(m.node);
      }
    } else if (op < 95) {
      // With discards, a reader now and then done through a recent record (or all).
      if (discards && op >= 88 && tee.ring.next_seq() != 0)
        tee.discard(tee.ring.next_seq() - 1 - rng() % std::min<uint64_t>(tee.ring.next_seq(), 8));
      else
        t.evict(rng() % 64, nullptr);
    } else if (op < 99) {
      if (!locked.empty()) {
        t.unlock(locked.back());
        locked.pop_back();
      }
    } else {
      t.reset();
      locked.clear();
    }
    if (capacity <= 1000 || step % 100 == 0) tee.check();  // a big ring: every record each time is slow
    if (failures > 20) return;
  }
  t.reset();
  tee.check();
}

// A record names the labels earlier records copied. Notes are per node: an
// upper half cut off by a split is a new id, copied again when first recorded;
// the lower half keeps its note, which the cut leaves pointing at its label.
void test_sharing_and_splits() {
  RadixTree t(1, EvictionPolicy::kLru, false);
  Tee tee(1000, 1 << 20);
  t.set_observer(&tee);
  std::vector<Token> a(100), b(100);
  for (Token i = 0; i < 100; ++i) a[i] = b[i] = i;
  b[99] = 7777;
  t.insert(0, a.data(), nullptr, a.size(), 0);  // leaf A: its 100 tokens copied
  CHECK(tee.ring.copied_tokens() == 100);
  t.insert(0, b.data(), nullptr, b.size(), 0);  // A split at 99 into U + A; leaf B under U
  CHECK(tee.ring.copied_tokens() == 200);       // U (a new id) and B copied
  t.match_prefix(0, a.data(), 50);              // U split at 50 into V + U
  t.evict(1, nullptr);                          // A: 1 token (< kMinShared) and V copied, U named
  CHECK(tee.ring.copied_tokens() == 251);
  t.evict(1, nullptr);  // B: its token copied, U and V named
  CHECK(tee.ring.copied_tokens() == 252);
  t.evict(49, nullptr);  // U, named from the copy B's record made before U was cut
  t.evict(50, nullptr);  // V, named from A's removal
  CHECK(tee.ring.copied_tokens() == 252);
  CHECK(t.total_size() == 0);
  tee.check();
}

// The circular buffer wraps (many times) without growing when the ring is small,
// and grows, keeping every live token, when a long path needs room.
void test_wrap_and_growth() {
  RadixTree t(1, EvictionPolicy::kLru, false);
  Tee tee(4, 24);
  t.set_observer(&tee);
  std::vector<Token> k(20);
  for (Token round = 0; round < 200; ++round) {
    for (Token i = 0; i < 20; ++i) k[i] = round * 31 + i;
    t.insert(0, k.data(), nullptr, k.size(), 0);
    if (round % 3 == 2) t.evict(40, nullptr);
    tee.check();
  }
  CHECK(tee.ring.copied_tokens() > 20 * tee.ring.buffer_tokens());  // it wrapped
  CHECK(tee.ring.buffer_tokens() <= 64);
  std::vector<Token> longer(5000);
  for (Token i = 0; i < 5000; ++i) longer[i] = i;
  t.insert(0, longer.data(), nullptr, longer.size(), 0);  // longer than the bound: stays alone
  tee.check();
  CHECK(tee.ring.size() == 1 && tee.ring.buffer_tokens() >= 5000);
  longer[4999] = 1;
  t.insert(0, longer.data(), nullptr, longer.size(), 0);  // a split and a new leaf
  tee.check();
  t.evict(10000, nullptr);
  tee.check();
}

}  // namespace

int main() {
  test_sharing_and_splits();
  test_wrap_and_growth();
  uint32_t seed = 99;
  for (uint32_t page : {1u, 4u})
    for (uint64_t tree_capacity : {radixmeta::kNoCapacity, uint64_t{96}})
      for (auto [capacity, max_tokens] :
           {std::pair<uint64_t, uint64_t>{1, 1}, {3, 8}, {5, 40}, {16, 64}, {1000, 200},
            {2, 1u << 20}, {4, 1u << 20}, {1u << 16, 1u << 22}})
        for (bool discards : {false, true})
          test_random(page, capacity, max_tokens, tree_capacity, ++seed, discards);
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("event ring tests: all checks passed\n");
  return 0;
}
