// Tests of the header-only core with g++ alone (no Python): `make -C csrc test`.
// Deterministic: a fixed-seed generator drives the randomized part.
#include <radixmeta/location_set.hpp>
#include <radixmeta/radix_tree.hpp>

#include "check.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <vector>

using radixmeta::EvictionPolicy;
using radixmeta::RadixTree;
using radixmeta::Token;
using radixmeta::Value;

static std::vector<Value> path_values(const RadixTree& t, uint32_t node) {
  std::vector<Value> out(t.node(node).depth);
  t.path_values(node, out.data());
  return out;
}

static void test_insert_match_split() {
  RadixTree t(1, EvictionPolicy::kLru);
  const std::vector<Token> a{1, 2, 3, 4};
  const std::vector<Value> av{10, 11, 12, 13};
  CHECK(t.insert(0, a.data(), av.data(), a.size(), 0).prefix_length == 0);
  CHECK(t.node_count() == 1);
  const std::vector<Token> q{1, 2, 3, 9};
  auto m = t.match_prefix(0, q.data(), q.size());
  CHECK(m.length == 3);
  CHECK(t.node_count() == 2);  // the match split [1 2 3 4] into [1 2 3] + [4]
  CHECK((path_values(t, m.node) == std::vector<Value>{10, 11, 12}));
  CHECK(t.insert(0, a.data(), av.data(), a.size(), 0).prefix_length == 4);
  t.check_invariants();
}

static void test_pages() {
  RadixTree t(4, EvictionPolicy::kLru);
  std::vector<Token> a{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // the tail 9 10 is not cached
  CHECK(t.insert(0, a.data(), nullptr, a.size(), 0).prefix_length == 0);
  CHECK(t.total_size() == 8);
  std::vector<Token> q{1, 2, 3, 4, 5, 6, 0, 8};
  CHECK(t.match_prefix(0, q.data(), q.size()).length == 4);  // page aligned
  std::vector<Token> b{1, 2, 3, 4, 5, 6, 7, 99};  // same first token, different page
  CHECK(t.insert(0, b.data(), nullptr, b.size(), 0).prefix_length == 4);
  CHECK(t.total_size() == 12);
  t.check_invariants();
}

static void test_lock_and_evict_order() {
  RadixTree t(1, EvictionPolicy::kLru);
  std::vector<Token> a{1, 2, 3}, b{1, 2, 4}, c{5, 6};
  t.insert(0, a.data(), nullptr, 3, 0);
  t.insert(0, b.data(), nullptr, 3, 0);
  t.insert(0, c.data(), nullptr, 2, 0);
  auto m = t.match_prefix(0, a.data(), 3);  // a becomes most recent
  t.lock(m.node);
  CHECK(t.protected_size() == 3 && t.evictable_size() == 3);
  std::vector<Value> freed;
  CHECK(t.evict(1, &freed) == 1);  // oldest unlocked leaf is [4]
  CHECK((freed == std::vector<Value>{4}));
  freed.clear();
  t.evict(100, &freed);  // then [5 6]; the locked path stays
  CHECK((freed == std::vector<Value>{5, 6}));
  CHECK(t.total_size() == 3);
  t.unlock(m.node);
  freed.clear();
  t.evict(100, &freed);  // children before parents
  CHECK((freed == std::vector<Value>{3, 1, 2}));
  CHECK(t.total_size() == 0 && t.node_count() == 0);
  bool threw = false;
  try {
    t.unlock(0);  // the root: a no-op, never an error
    t.check_invariants();
  } catch (const std::exception&) {
    threw = true;
  }
  CHECK(!threw);
}

// LFU counts inserts through a node (SGLang's rule), never matches; an insert
// skips the nodes within its first `counted` tokens.
static void test_lfu_counts_inserts() {
  RadixTree t(1, EvictionPolicy::kLfu);
  std::vector<Token> a{1, 2}, b{5, 6};
  t.insert(0, a.data(), nullptr, 2, 0);
  for (int i = 0; i < 3; ++i) t.insert(0, b.data(), nullptr, 2, 0);
  for (int i = 0; i < 5; ++i) t.match_prefix(0, a.data(), 2);
  const auto mb = t.match_prefix(0, b.data(), 2);
  CHECK(t.node(mb.node).hit_count == 3);
  std::vector<Value> freed;
  t.evict(1, &freed);  // a: one insert, however many matches
  CHECK((freed == std::vector<Value>{1, 2}));
  // counted: a second insert by the same caller counts only past what it stored.
  std::vector<Token> c{7, 7, 7, 7};
  t.insert(0, c.data(), nullptr, 2, 0);
  t.insert(0, c.data(), nullptr, 4, 0, 2);  // [7 7] already counted by this caller
  const auto upper = t.match_prefix(0, c.data(), 2);
  const auto lower = t.match_prefix(0, c.data(), 4);
  CHECK(t.node(upper.node).hit_count == 1 && t.node(lower.node).hit_count == 1);
  t.insert(0, c.data(), nullptr, 4, 0, 4);  // nothing past what it stored: no hit
  CHECK(t.node(lower.node).hit_count == 1);
  t.insert(0, c.data(), nullptr, 3, 0);  // a split copies the count into the upper half
  const auto mid = t.match_prefix(0, c.data(), 3);
  CHECK(t.node(mid.node).hit_count == 2 && t.node(lower.node).hit_count == 1);
  RadixTree lru(1, EvictionPolicy::kLru);  // kept only under LFU
  lru.insert(0, a.data(), nullptr, 2, 0);
  CHECK(lru.node(lru.match_prefix(0, a.data(), 2).node).hit_count == 0);
  t.check_invariants();
}

static void test_unlock_needs_own_lock() {
  RadixTree t(1, EvictionPolicy::kLru);
  std::vector<Token> a{0, 0, 0, 0};
  t.insert(0, a.data(), nullptr, 4, 0);
  const auto deep = t.match_prefix(0, a.data(), 4);
  t.lock(deep.node);
  const auto upper = t.match_prefix(0, a.data(), 2);  // splits; upper counts the lock below
  CHECK(t.node(upper.node).lock_count == 1);
  bool threw = false;
  try {
    t.unlock(upper.node);
  } catch (const std::logic_error&) {
    threw = true;
  }
  CHECK(threw);
  t.check_invariants();
  t.unlock(deep.node);  // the lock taken on the lower half is still there to release
  CHECK(t.protected_size() == 0);
  t.check_invariants();
}

static void test_capacity() {
  RadixTree t(1, EvictionPolicy::kLru, true, 4);
  std::vector<Token> a{1, 2, 3}, b{7, 8, 9};
  t.insert(0, a.data(), nullptr, 3, 0);
  auto out = t.insert(0, b.data(), nullptr, 3, 0);
  CHECK(out.fits && t.total_size() == 3);
  CHECK((t.pending_evicted() == std::vector<Value>{1, 2, 3}));
  auto m = t.match_prefix(0, b.data(), 3);
  t.lock(m.node);
  out = t.insert(0, a.data(), nullptr, 3, 0);
  CHECK(!out.fits && out.new_tokens == 3 && out.evictable == 0);
  CHECK(t.total_size() == 3);
  t.check_invariants();
}

static void test_namespaces_and_reset() {
  RadixTree t(1, EvictionPolicy::kLru);
  std::vector<Token> a{1, 2, 3};
  t.insert(0, a.data(), nullptr, 3, 0);
  CHECK(t.match_prefix(7, a.data(), 3).length == 0);
  t.insert(7, a.data(), nullptr, 3, 0);
  CHECK(t.match_prefix(7, a.data(), 3).length == 3);
  CHECK(t.node_count() == 2);  // never shared across namespaces
  const uint64_t epoch = t.epoch();
  t.reset();
  CHECK(t.epoch() == epoch + 1 && t.node_count() == 0 && t.total_size() == 0);
  t.check_invariants();
}

static void test_emptied_namespaces_are_freed() {
  RadixTree t(2, EvictionPolicy::kLru);
  std::vector<Token> a{1, 2, 3, 4}, tail{5};
  CHECK(t.insert(9, tail.data(), nullptr, 1, 0).prefix_length == 0);  // no whole page
  CHECK(t.root_of(9) == radixmeta::kNoNode);
  t.insert(9, a.data(), nullptr, 4, 0);
  t.insert(8, a.data(), nullptr, 4, 0);
  const uint32_t root = t.root_of(9);
  CHECK(root != radixmeta::kNoNode && t.match_prefix(9, tail.data(), 0).node == 0);
  t.evict(4, nullptr);  // namespace 9's only leaf: its root goes too
  CHECK(t.root_of(9) == radixmeta::kNoNode && t.root_of(8) != radixmeta::kNoNode);
  CHECK((t.take_dropped_namespaces() == std::vector<uint32_t>{9}));
  CHECK(t.take_dropped_namespaces().empty());
  t.check_invariants();
  t.evict(4, nullptr);
  CHECK(t.root_of(8) == radixmeta::kNoNode && t.root_of(0) == 0);  // the default stays
  t.check_invariants();
  bool refused = false;
  try {
    t.match_prefix(0, a.data(), uint64_t{1} << 32);  // refused before the key is read
  } catch (const std::length_error&) {
    refused = true;
  }
  CHECK(refused);
}

static void test_location_set() {
  radixmeta::LocationSet s;
  s.set(3);
  s.set(64);
  s.set(1023);
  CHECK(s.test(3) && s.test(64) && s.test(1023) && !s.test(65) && s.count() == 3);
  radixmeta::LocationSet copy = s;
  s.reset(1023);
  CHECK(copy.test(1023) && !s.test(1023) && s.count() == 2);
  s.clear();
  CHECK(!s.any());
}

struct CountingObserver : radixmeta::TreeObserver {
  uint64_t stored_tokens = 0, removed_tokens = 0, clears = 0;
  void stored(const RadixTree& t, uint32_t n) override { stored_tokens += t.node(n).length; }
  void removed(const RadixTree& t, uint32_t n) override { removed_tokens += t.node(n).length; }
  void cleared(const RadixTree&) override { ++clears; }
};

// Random operations against a brute-force model: the set of cached pages,
// each named by the whole prefix that ends with it.
static void test_random_against_model(uint32_t page, EvictionPolicy policy, uint32_t seed) {
  RadixTree t(page, policy);
  CountingObserver obs;
  t.set_observer(&obs);
  std::mt19937 rng(seed);
  std::set<std::vector<Token>> model;  // every cached page-aligned prefix
  std::vector<std::vector<Token>> stems;
  for (int i = 0; i < 6; ++i) {
    std::vector<Token> s(rng() % 24);
    for (auto& x : s) x = rng() % 3;
    stems.push_back(s);
  }
  auto random_key = [&]() {
    std::vector<Token> k = stems[rng() % stems.size()];
    const size_t extra = rng() % 12;
    for (size_t i = 0; i < extra; ++i) k.push_back(rng() % 4);
    return k;
  };
  auto model_match = [&](const std::vector<Token>& k) {
    size_t best = 0;
    for (size_t len = page; len <= k.size(); len += page)
      if (model.count(std::vector<Token>(k.begin(), k.begin() + len))) best = len; else break;
    return best;
  };
  for (int step = 0; step < 3000; ++step) {
    const auto k = random_key();
    switch (rng() % 4) {
      case 0:
      case 1: {
        const size_t expect = model_match(k);
        const auto out = t.insert(0, k.data(), nullptr, k.size(), 0);
        CHECK(out.prefix_length == expect);
        for (size_t len = page; len <= k.size(); len += page)
          model.insert(std::vector<Token>(k.begin(), k.begin() + len));
        break;
      }
      case 2: {
        const auto m = t.match_prefix(0, k.data(), k.size());
        CHECK(m.length == model_match(k));
        std::vector<Value> v = path_values(t, m.node);
        for (size_t i = 0; i < v.size(); ++i) CHECK(v[i] == static_cast<Value>(k[i]));
        break;
      }
      default: {
        std::vector<Value> freed;
        t.evict(rng() % 10, &freed);
        // Rebuild the model from the tree's leaves: evicted pages are gone.
        std::set<std::vector<Token>> rebuilt;
        for (uint32_t leaf : t.leaves_in_order(0)) {
          std::vector<Token> path(t.node(leaf).depth);
          t.path_tokens(leaf, path.data());
          for (size_t len = page; len <= path.size(); len += page)
            rebuilt.insert(std::vector<Token>(path.begin(), path.begin() + len));
        }
        for (const auto& p : rebuilt) CHECK(model.count(p) == 1);
        CHECK(model.size() - rebuilt.size() == freed.size() / page);
        model.swap(rebuilt);
      }
    }
    t.check_invariants();
    CHECK(t.total_size() == model.size() * page);
  }
  CHECK(obs.stored_tokens - obs.removed_tokens == t.total_size());
}

// Evicting most of a large tree in scattered order leaves sparse arena chunks;
// the evacuation that follows must move labels and values intact.
static void test_arena_evacuation() {
  RadixTree t(1, EvictionPolicy::kLru);
  std::mt19937 rng(7);
  std::vector<std::vector<Token>> keys;
  for (int i = 0; i < 4000; ++i) {
    std::vector<Token> k(100);
    for (auto& x : k) x = rng() % 50000;
    t.insert(0, k.data(), nullptr, k.size(), 0);
    keys.push_back(k);
  }
  // Touch every third key so LRU eviction frees the others, spread over all chunks.
  for (size_t i = 0; i < keys.size(); i += 3) t.match_prefix(0, keys[i].data(), keys[i].size());
  std::vector<Value> freed;
  t.evict(t.total_size() * 6 / 10, &freed);
  CHECK(t.evacuations() > 0);
  t.check_invariants();
  size_t survivors = 0;
  for (uint32_t leaf : t.leaves_in_order(0)) {
    std::vector<Token> path(t.node(leaf).depth);
    std::vector<Value> values(path.size());
    t.path_tokens(leaf, path.data());
    t.path_values(leaf, values.data());
    for (size_t i = 0; i < path.size(); ++i) CHECK(values[i] == static_cast<Value>(path[i]));
    ++survivors;
  }
  CHECK(survivors > 1000);
  for (size_t i = 0; i < keys.size(); i += 3)
    CHECK(t.match_prefix(0, keys[i].data(), keys[i].size()).length == 100);
}

int main() {
  test_insert_match_split();
  test_pages();
  test_lock_and_evict_order();
  test_lfu_counts_inserts();
  test_unlock_needs_own_lock();
  test_capacity();
  test_namespaces_and_reset();
  test_emptied_namespaces_are_freed();
  test_location_set();
  test_arena_evacuation();
  for (uint32_t page : {1u, 4u})
    for (auto policy : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kFifo,
                        EvictionPolicy::kPriority})
      test_random_against_model(page, policy, 1234 + page);
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("csrc tests: all checks passed\n");
  return 0;
}
