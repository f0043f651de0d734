// Tests of the meta-tree core with g++ alone (no Python): `make -C csrc test`.
// A fixed-seed generator drives random operations against a brute-force model
// (per worker, the set of page paths it holds), with the invariant check after
// every step; the sanitizers catch memory errors on the way.
#include <radixmeta/meta_tree.hpp>

#include "check.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

using radixmeta::kNoCapacity;
using radixmeta::MetaTree;
using radixmeta::StoredCheck;
using radixmeta::Token;

// A page: its namespace id, its full path from the namespace's root, then the
// tags of the path's pages (small numbers in the tests).
using Page = std::vector<uint64_t>;
using Tags = std::vector<uint64_t>;  // one per page of a key; empty: all 0

static Page page_of(uint32_t ns, const std::vector<Token>& key, const Tags& tags, size_t end,
                    uint32_t page_size) {
  Page p{ns};
  p.insert(p.end(), key.begin(), key.begin() + end);
  for (size_t i = 0; i < end / page_size; ++i) p.push_back(tags.empty() ? 0 : tags[i]);
  return p;
}

// Model: pages held per worker on each tier; match = leading pages held, page
// by page (on the device, or with `either` on the device or the host).
struct Model {
  uint32_t page;
  std::vector<std::set<Page>> held;  // device
  std::vector<std::set<Page>> host;

  int64_t length(uint32_t w, uint32_t ns, const std::vector<Token>& key, const Tags& tags,
                 bool either = false) const {
    int64_t n = 0;
    for (size_t end = page; end <= key.size(); end += page) {
      const Page p = page_of(ns, key, tags, end, page);
      if (!held[w].count(p) && !(either && host[w].count(p))) break;
      n = static_cast<int64_t>(end);
    }
    return n;
  }
  uint64_t mark(uint32_t w, uint32_t ns, const std::vector<Token>& key, const Tags& tags,
                size_t start, bool on, uint32_t tier = 0) {
    std::set<Page>& pages = tier == 0 ? held[w] : host[w];
    uint64_t changed = 0;
    for (size_t end = start + page; end <= key.size() - key.size() % page; end += page) {
      const Page p = page_of(ns, key, tags, end, page);
      changed += on ? pages.insert(p).second : pages.erase(p);
    }
    return changed;
  }
  // Namespaces holding some page (a root each), the default always.
  std::set<uint32_t> namespaces() const {
    std::set<uint32_t> out{0};
    for (const auto* tier : {&held, &host})
      for (const auto& pages : *tier)
        for (const Page& p : pages) out.insert(p[0]);
    return out;
  }
};

static void test_example_from_the_docs() {
  MetaTree t(2);
  t.add_worker(0, kNoCapacity);
  t.add_worker(1, kNoCapacity);
  const std::vector<Token> a{1, 2, 3, 4, 5, 6}, b{1, 2, 3, 4, 9, 9}, q{1, 2, 3, 4, 5, 6, 7, 8};
  CHECK(t.insert(0, a.data(), a.size(), nullptr, 0, 0, 0) == 3);
  CHECK(t.insert(0, b.data(), b.size(), nullptr, 1, 0, 0) == 3);
  int64_t lengths[2];
  CHECK(t.match(0, q.data(), q.size(), nullptr, false, lengths, nullptr, 2) == 6);
  CHECK(lengths[0] == 6 && lengths[1] == 4);
  // The gap rule: worker 0 drops its middle page; its last one no longer counts.
  CHECK(t.remove(0, a.data(), 4, nullptr, 0, 2, 0) == 1);
  t.match(0, q.data(), q.size(), nullptr, false, lengths, nullptr, 2);
  CHECK(lengths[0] == 2 && lengths[1] == 4);
  CHECK(t.insert(0, a.data(), 4, nullptr, 0, 0, 0) == 1);  // the gap is filled again
  t.match(0, q.data(), q.size(), nullptr, false, lengths, nullptr, 2);
  CHECK(lengths[0] == 6);
  t.check_invariants();
}

// A worker registered after the caller sized its lengths array is not written
// (nor, with touch, read), and a key too long for 32-bit depths is refused.
static void test_match_stays_inside_the_lengths_array() {
  MetaTree t(1);
  for (uint32_t w = 0; w < 3; ++w) t.add_worker(w, w == 2 ? 16 : kNoCapacity);
  const std::vector<Token> key{4, 5, 6};
  for (uint32_t w = 0; w < 3; ++w) t.insert(0, key.data(), key.size(), nullptr, w, 0, 0);
  int64_t lengths[3] = {-1, -1, -7};
  CHECK(t.match(0, key.data(), key.size(), nullptr, true, lengths, nullptr, 2) == 3);
  CHECK(lengths[0] == 3 && lengths[1] == 3 && lengths[2] == -7);
  bool refused = false;
  try {
    t.match(0, key.data(), uint64_t{1} << 32, nullptr, false, lengths, nullptr, 2);
  } catch (const std::length_error&) {
    refused = true;
  }
  CHECK(refused);
  t.check_invariants();
}

// A stored event the way the binding applies one: checked, then applied.
static uint64_t store(MetaTree& t, uint32_t w, uint32_t ns, bool has_parent, uint64_t parent,
                      const uint64_t* hashes, uint32_t n, const Token* tokens,
                      const uint64_t* tags = nullptr, uint32_t tier = 0) {
  if (t.check_stored(w, ns, has_parent, parent, hashes, n, tokens, tags).code != StoredCheck::kOk)
    return UINT64_MAX;
  return t.apply_stored(w, ns, has_parent, parent, hashes, n, tokens, tags, tier);
}

static void test_block_events() {
  MetaTree t(2);
  t.add_worker(0, kNoCapacity);
  const std::vector<Token> tokens{1, 2, 3, 4, 5, 6};
  const uint64_t hashes[] = {100, 101, 102};
  CHECK(t.check_stored(0, 0, false, 0, hashes, 3, tokens.data(), nullptr).code == StoredCheck::kOk);
  CHECK(store(t, 0, 0, false, 0, hashes, 3, tokens.data()) == 3);
  CHECK(t.node_count() == 3);  // one node per named page
  CHECK(store(t, 0, 0, false, 0, hashes, 3, tokens.data()) == 0);  // idempotent
  const uint64_t child[] = {103};
  const std::vector<Token> more{7, 8};
  CHECK(t.check_stored(0, 0, true, 999, child, 1, more.data(), nullptr).code == StoredCheck::kUnknownParent);
  const uint64_t cyc[] = {102};
  CHECK(t.check_stored(0, 0, true, 102, cyc, 1, more.data(), nullptr).code == StoredCheck::kCycle);
  const uint64_t other[] = {100};
  CHECK(t.check_stored(0, 0, true, 102, other, 1, more.data(), nullptr).code == StoredCheck::kOtherPage);
  const uint64_t twice[] = {104, 104};
  const std::vector<Token> two{7, 8, 9, 9};
  CHECK(t.check_stored(0, 0, true, 102, twice, 2, two.data(), nullptr).code == StoredCheck::kRepeated);
  const uint64_t second[] = {200};  // page 1 under a second hash: refused, not renamed
  const StoredCheck renamed = t.check_stored(0, 0, false, 0, second, 1, tokens.data(), nullptr);
  CHECK(renamed.code == StoredCheck::kRenamed && renamed.index == 0 && renamed.other == 100);
  t.add_worker(1, kNoCapacity);  // another worker may name the page by another hash
  CHECK(store(t, 1, 0, false, 0, second, 1, tokens.data()) == 1);
  CHECK(t.clear_worker(1) == 2);
  CHECK(store(t, 0, 0, true, 102, child, 1, more.data()) == 1);
  const uint64_t gone[] = {101, 555};
  CHECK(t.apply_removed(0, gone, 2, 0) == 1);
  CHECK(t.check_stored(0, 0, true, 101, child, 1, more.data(), nullptr).code == StoredCheck::kUnknownParent);
  t.check_invariants();
  CHECK(t.clear_worker(0) == 6);
  CHECK(t.node_count() == 0);
  t.check_invariants();
}

// Namespaces: separate trees, a root only while holding a page, hashes found
// across namespaces by removals but a parent only in its own namespace.
static void test_namespaces() {
  MetaTree t(2);
  t.add_worker(0, kNoCapacity);
  const std::vector<Token> key{1, 2, 3, 4};
  CHECK(t.insert(3, key.data(), key.size(), nullptr, 0, key.size(), 0) == 0);  // nothing to mark: no root
  CHECK(t.root_of(3) == radixmeta::kNoNode && t.node_count() == 0);
  CHECK(t.insert(0, key.data(), key.size(), nullptr, 0, 0, 0) == 2);
  CHECK(t.insert(3, key.data(), key.size(), nullptr, 0, 0, 0) == 2);  // same tokens, another namespace
  CHECK(t.node_count() == 2);
  int64_t len = -1;
  CHECK(t.match(3, key.data(), key.size(), nullptr, false, &len, nullptr, 1) == 4 && len == 4);
  CHECK(t.match(9, key.data(), key.size(), nullptr, false, &len, nullptr, 1) == 0 && len == 0);  // unknown
  const uint64_t h[] = {70};
  const std::vector<Token> next{5, 5};
  CHECK(store(t, 0, 7, false, 0, h, 1, next.data()) == 1);  // creates namespace 7
  CHECK((t.namespace_ids() == std::vector<uint32_t>{0, 3, 7}));
  const uint64_t h2[] = {71};
  CHECK(t.check_stored(0, 0, true, 70, h2, 1, next.data(), nullptr).code == StoredCheck::kUnknownParent);
  CHECK(store(t, 0, 7, true, 70, h2, 1, next.data()) == 1);
  CHECK(t.apply_removed(0, h, 1, 0) == 1);  // a removal finds the hash in any namespace
  CHECK(t.take_dropped_namespaces().empty());  // 71 still holds namespace 7
  CHECK(t.apply_removed(0, h2, 1, 0) == 1);
  CHECK((t.take_dropped_namespaces() == std::vector<uint32_t>{7}) && t.root_of(7) == radixmeta::kNoNode);
  CHECK(t.remove(3, key.data(), key.size(), nullptr, 0, 0, 0) == 2);
  CHECK((t.take_dropped_namespaces() == std::vector<uint32_t>{3}));
  CHECK(t.insert(5, key.data(), key.size(), nullptr, 0, 0, 0) == 2);
  CHECK(t.insert(3, key.data(), key.size(), nullptr, 0, 0, 0) == 2);  // created anew: after 5 now
  CHECK((t.namespace_ids() == std::vector<uint32_t>{0, 5, 3}));
  t.check_invariants();
  CHECK(t.clear_worker(0) == 12);
  CHECK((t.namespace_ids() == std::vector<uint32_t>{0}) && t.node_count() == 0);
  t.check_invariants();
}

// Extra tags: a tagged page is a one-page node of its own, and equal tokens
// with different tags are different pages (issue 8's two images).
static void test_extra_tags() {
  MetaTree t(2);
  t.add_worker(0, kNoCapacity);
  t.add_worker(1, kNoCapacity);
  const std::vector<Token> key{1, 2, 3, 4, 5, 6};
  const uint64_t seven[] = {0, 7, 0}, eight[] = {0, 8, 0};
  CHECK(t.insert(0, key.data(), key.size(), seven, 0, 0, 0) == 3);
  CHECK(t.node_count() == 3);  // [1 2], the tagged [3 4], then [5 6]
  CHECK(t.insert(0, key.data(), key.size(), nullptr, 1, 0, 0) == 3);
  CHECK(t.node_count() == 4);  // untagged [3 4 5 6] beside the tagged page
  int64_t lengths[2];
  CHECK(t.match(0, key.data(), key.size(), seven, false, lengths, nullptr, 2) == 6);
  CHECK(lengths[0] == 6 && lengths[1] == 2);
  CHECK(t.match(0, key.data(), key.size(), nullptr, false, lengths, nullptr, 2) == 6);
  CHECK(lengths[0] == 2 && lengths[1] == 6);
  CHECK(t.match(0, key.data(), key.size(), eight, false, lengths, nullptr, 2) == 2);
  CHECK(lengths[0] == 2 && lengths[1] == 2);
  CHECK(t.remove(0, key.data(), key.size(), seven, 0, 2, 0) == 2);
  CHECK(t.node_count() == 2);
  t.check_invariants();

  // Two images of equal placeholder tokens, then text after the first one.
  MetaTree u(4);
  u.add_worker(0, kNoCapacity);
  const std::vector<Token> img{9, 9, 9, 9}, text{1, 2, 3, 4};
  const uint64_t a[] = {0xA}, a1[] = {0xA1}, b[] = {0xB}, a2[] = {0xA2};
  const uint64_t tag_a[] = {11}, tag_b[] = {12};
  CHECK(store(u, 0, 0, false, 0, a, 1, img.data(), tag_a) == 1);
  CHECK(store(u, 0, 0, true, 0xA, a1, 1, text.data()) == 1);
  CHECK(u.check_stored(0, 0, false, 0, b, 1, img.data(), nullptr).code == StoredCheck::kOk);
  CHECK(store(u, 0, 0, false, 0, b, 1, img.data(), tag_b) == 1);  // another page
  const std::vector<Token> q{9, 9, 9, 9, 1, 2, 3, 4};
  const uint64_t qa[] = {11, 0}, qb[] = {12, 0};
  int64_t len = 0;
  u.match(0, q.data(), q.size(), qa, false, &len, nullptr, 1);
  CHECK(len == 8);
  u.match(0, q.data(), q.size(), qb, false, &len, nullptr, 1);
  CHECK(len == 4);  // B's page, but not A's continuation
  CHECK(u.apply_removed(0, b, 1, 0) == 1);
  u.match(0, q.data(), q.size(), qa, false, &len, nullptr, 1);
  CHECK(len == 8);  // A is left
  CHECK(store(u, 0, 0, true, 0xA, a2, 1, img.data()) == 1);
  u.check_invariants();
}

// Tiers: a worker holds a page on the device, the host, or both; removals and
// clears by tier; the host never counts against an approximate capacity.
static void test_tiers() {
  MetaTree t(2);
  t.add_worker(0, kNoCapacity);
  t.add_worker(1, 4);  // approximate: 4 device tokens
  const std::vector<Token> key{1, 2, 3, 4, 5, 6};
  const uint64_t h[] = {10, 11, 12};
  CHECK(store(t, 0, 0, false, 0, h, 3, key.data()) == 3);          // device
  CHECK(store(t, 0, 0, false, 0, h, 3, key.data(), nullptr, 1) == 3);  // and host, same names
  CHECK(t.held_tokens(0, 0) == 6 && t.held_tokens(0, 1) == 6 && t.host_marks() == 3);
  const uint64_t mid[] = {11};
  CHECK(t.apply_removed(0, mid, 1, 0) == 1);  // the device copy goes; the host's stays
  CHECK(t.apply_removed(0, mid, 1, 0) == 0);
  int64_t dev[2], either[2];
  t.match(0, key.data(), key.size(), nullptr, false, dev, either, 2);
  CHECK(dev[0] == 2 && either[0] == 6);
  const uint64_t next[] = {13};
  const std::vector<Token> more{7, 7};
  CHECK(store(t, 0, 0, true, 11, next, 1, more.data()) == 1);  // 11 still names the page
  CHECK(t.insert(0, key.data(), key.size(), nullptr, 1, 0, 1) == 3);  // host: no eviction
  CHECK(t.held_tokens(1, 1) == 6 && t.held_tokens(1, 0) == 0);
  CHECK(t.insert(0, key.data(), key.size(), nullptr, 1, 0, 0) == 3);  // device: trimmed to 4
  CHECK(t.held_tokens(1, 0) == 4 && t.held_tokens(1, 1) == 6);
  t.match(0, key.data(), key.size(), nullptr, false, dev, either, 2);
  CHECK(dev[1] == 4 && either[1] == 6);
  t.check_invariants();
  CHECK(t.clear_worker(0, 2) == 6);  // host only: 2 pages are left on the device, and 13
  CHECK(t.held_tokens(0, 1) == 0 && t.held_tokens(0, 0) == 6);
  CHECK(t.clear_worker(1, MetaTree::kAllTiers) == 10);
  CHECK(t.host_marks() == 0);
  t.check_invariants();
}

static void test_approximate_worker_keeps_to_capacity() {
  MetaTree t(1);
  t.add_worker(0, 4);
  const std::vector<Token> a{1, 2, 3}, b{1, 2, 7, 8, 9};
  t.insert(0, a.data(), a.size(), nullptr, 0, 0, 0);
  t.insert(0, b.data(), b.size(), nullptr, 0, 0, 0);  // holds 6 > 4: the oldest leaf (3) and then 9 go
  CHECK(t.held_tokens(0, 0) == 4);
  int64_t len = 0;
  t.match(0, a.data(), a.size(), nullptr, false, &len, nullptr, 1);
  CHECK(len == 2);
  t.match(0, b.data(), b.size(), nullptr, false, &len, nullptr, 1);
  CHECK(len == 4);
  t.check_invariants();
}

// set_capacity: a smaller capacity trims at once by the insert-time rule, a
// larger one keeps every page; an exact worker has no capacity to set.
static void test_set_capacity_trims_like_an_insert() {
  MetaTree t(1);
  t.add_worker(0, 8);
  t.add_worker(1, kNoCapacity);
  const std::vector<Token> a{1, 2, 3}, b{1, 2, 7, 8, 9};
  t.insert(0, a.data(), a.size(), nullptr, 0, 0, 0);
  t.insert(0, b.data(), b.size(), nullptr, 0, 0, 0);
  t.insert(0, b.data(), b.size(), nullptr, 1, 0, 0);
  CHECK(t.held_tokens(0, 0) == 6);
  CHECK(t.set_capacity(0, 100) == 0 && t.held_tokens(0, 0) == 6 && t.capacity(0) == 100);
  // As test_approximate_worker_keeps_to_capacity: the oldest leaf (3), then 9.
  CHECK(t.set_capacity(0, 4) == 2 && t.held_tokens(0, 0) == 4 && t.capacity(0) == 4);
  int64_t len[2] = {0, 0};
  t.match(0, a.data(), a.size(), nullptr, false, len, nullptr, 2);
  CHECK(len[0] == 2 && len[1] == 2);
  t.match(0, b.data(), b.size(), nullptr, false, len, nullptr, 2);
  CHECK(len[0] == 4 && len[1] == 5);  // the exact worker keeps the page the trim cut off
  t.check_invariants();
  CHECK(t.set_capacity(0, 0) == 4 && t.held_tokens(0, 0) == 0);
  t.insert(0, a.data(), a.size(), nullptr, 0, 0, 0);  // capacity 0 keeps nothing
  CHECK(t.held_tokens(0, 0) == 0);
  t.check_invariants();
  bool refused = false;
  try {
    t.set_capacity(1, 4);
  } catch (const std::logic_error&) {
    refused = true;
  }
  CHECK(refused && t.held_tokens(1, 0) == 5);
  t.remove_worker(1);
  CHECK(t.node_count() == 0);
  t.check_invariants();
}

static void test_random_against_model(uint32_t page, uint32_t workers, uint32_t seed) {
  std::mt19937 rng(seed);
  MetaTree t(page);
  Model model{page, std::vector<std::set<Page>>(workers), std::vector<std::set<Page>>(workers)};
  for (uint32_t w = 0; w < workers; ++w) t.add_worker(w, kNoCapacity);
  std::vector<std::vector<Token>> pool;
  for (int i = 0; i < 12; ++i) {
    std::vector<Token> key;
    if (!pool.empty() && rng() % 2) key = pool[rng() % pool.size()];
    key.resize(key.size() / 2);
    const size_t extra = 1 + rng() % (4 * page);
    for (size_t j = 0; j < extra; ++j) key.push_back(rng() % 3);
    pool.push_back(key);
  }
  std::vector<int64_t> lengths(workers), either(workers);
  for (int step = 0; step < 3000; ++step) {
    const auto& key = pool[rng() % pool.size()];
    const uint32_t w = rng() % workers;
    const uint32_t ns = rng() % 4 == 0 ? 1 + rng() % 2 : 0;  // mostly the default namespace
    const size_t whole = key.size() - key.size() % page;
    const size_t start = page * (rng() % (whole / page + 1));
    Tags tags;  // mostly untagged keys; else a tag on some pages
    if (rng() % 3 == 0)
      for (size_t i = 0; i < whole / page; ++i) tags.push_back(rng() % 4 == 0 ? 1 + rng() % 2 : 0);
    const uint64_t* tp = tags.empty() ? nullptr : tags.data();
    const uint32_t tier = rng() % 4 == 0 ? 1 : 0;  // mostly the device
    switch (rng() % 3) {
      case 0:
        CHECK(t.insert(ns, key.data(), key.size(), tp, w, start, tier) ==
              model.mark(w, ns, key, tags, start, true, tier));
        break;
      case 1:
        CHECK(t.remove(ns, key.data(), key.size(), tp, w, start, tier) ==
              model.mark(w, ns, key, tags, start, false, tier));
        break;
      default: {
        int64_t* host = tier == 0 ? nullptr : either.data();
        t.match(ns, key.data(), key.size(), tp, false, lengths.data(), host, workers);
        for (uint32_t v = 0; v < workers; ++v) {
          CHECK(lengths[v] == model.length(v, ns, key, tags));
          if (host != nullptr) CHECK(either[v] == model.length(v, ns, key, tags, true));
        }
      }
    }
    t.take_dropped_namespaces();
    const std::vector<uint32_t> ids = t.namespace_ids();
    const std::set<uint32_t> live(ids.begin(), ids.end());
    CHECK(live == model.namespaces());  // a namespace has a root exactly while it holds a page
    t.check_invariants();
    if (failures > 0) return;
  }
}

// Holds: counted by a match that asks for them, never by marks, dumps or held
// tokens; refcounted per (node, worker); their nodes stay while they live.
static void test_holds() {
  MetaTree t(2);
  t.add_worker(0, kNoCapacity);
  t.add_worker(1, kNoCapacity);
  t.add_worker(2, 8);  // approximate: no holds
  const std::vector<Token> a{1, 2, 3, 4, 5, 6}, b{1, 2, 3, 4, 9, 9};
  CHECK(t.insert(0, a.data(), a.size(), nullptr, 0, 0, 0) == 3);
  const uint64_t h1 = t.hold(0, b.data(), b.size(), nullptr, 1);
  CHECK(t.node_count() == 3);  // [1 2 3 4] cut from a's node, and b's own page
  int64_t lengths[3];
  t.match(0, b.data(), b.size(), nullptr, false, lengths, nullptr, 3);
  CHECK(lengths[0] == 4 && lengths[1] == 6 && lengths[2] == 0);
  t.match(0, b.data(), b.size(), nullptr, false, lengths, nullptr, 3, false);
  CHECK(lengths[0] == 4 && lengths[1] == 0);  // the marks alone
  CHECK(t.held_tokens(1, 0) == 0 && t.hold_tokens(1) == 6 && t.hold_count() == 1);
  const uint64_t h2 = t.hold(0, b.data(), 4, nullptr, 1);
  CHECK(h2 == h1 + 1 && t.hold_tokens(1) == 6);
  t.check_invariants();
  CHECK(t.release(h1) == 1);  // [9 9]; h2 still covers the rest
  CHECK(!t.has_hold(h1) && t.has_hold(h2) && t.node_count() == 2);
  t.match(0, b.data(), b.size(), nullptr, false, lengths, nullptr, 3);
  CHECK(lengths[1] == 4);
  CHECK(t.release(h2) == 2 && t.hold_tokens(1) == 0 && t.node_count() == 2);  // nodes never merge
  bool refused = false;
  try {
    t.hold(0, a.data(), a.size(), nullptr, 2);
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  CHECK(refused && t.hold_count() == 0);
  const uint64_t empty = t.hold(0, a.data(), 1, nullptr, 1);  // no whole page
  CHECK(t.release(empty) == 0);
  // A hold in a new namespace makes its root; releasing it frees the root.
  const uint64_t h3 = t.hold(4, a.data(), a.size(), nullptr, 1);
  CHECK(t.root_of(4) != radixmeta::kNoNode && t.node_count() == 3);
  CHECK(t.release(h3) == 3 && t.root_of(4) == radixmeta::kNoNode);
  CHECK((t.take_dropped_namespaces() == std::vector<uint32_t>{4}));
  // Removing a worker ends its holds (its index is reused clean).
  t.hold(0, b.data(), b.size(), nullptr, 1);
  t.hold(0, a.data(), a.size(), nullptr, 1);
  CHECK(t.hold_count() == 2);
  t.remove_worker(1);
  CHECK(t.hold_count() == 0 && t.node_count() == 2);
  t.add_worker(1, kNoCapacity);
  t.match(0, b.data(), b.size(), nullptr, false, lengths, nullptr, 3);
  CHECK(lengths[1] == 0);
  t.check_invariants();
  CHECK(t.clear_worker(0) == 6 && t.node_count() == 0);
  t.check_invariants();
}

// A walk kept across a free: the freed node's id comes back elsewhere with the
// same length, and a mark along the old walk must not trust it.
static void test_a_kept_walk_does_not_trust_a_reused_id() {
  MetaTree t(1);
  t.add_worker(0, kNoCapacity);
  const std::vector<Token> a{1, 2, 3}, q{1, 2, 3, 4}, b{7, 8, 9};
  t.insert(0, a.data(), a.size(), nullptr, 0, 0, 0);
  int64_t len = 0;
  radixmeta::MatchPath path;
  t.match(0, q.data(), q.size(), nullptr, false, &len, nullptr, 1, true, &path);
  CHECK(len == 3 && path.nodes.size() == 1);
  t.remove(0, a.data(), a.size(), nullptr, 0, 0, 0);  // frees the node
  t.insert(0, b.data(), b.size(), nullptr, 0, 0, 0);  // which comes back as [7 8 9]
  CHECK(t.node(path.nodes[0]).length == 3);
  t.hold_along(&path, 0, q.data(), q.size(), nullptr, 0);
  t.match(0, q.data(), q.size(), nullptr, false, &len, nullptr, 1);
  CHECK(len == 4);
  t.match(0, b.data(), b.size(), nullptr, false, &len, nullptr, 1, false);
  CHECK(len == 3 && t.hold_tokens(0) == 4);
  t.check_invariants();
  // Past 256 frees an id's generation may have come round: the walk is walked again.
  radixmeta::MatchPath kept;
  const std::vector<Token> c{5, 5, 5, 5};
  t.insert(0, c.data(), c.size(), nullptr, 0, 0, 0);
  t.match(0, c.data(), c.size(), nullptr, false, &len, nullptr, 1, true, &kept);
  for (Token k = 0; k < 300; ++k) {  // a node made and freed 300 times
    const std::vector<Token> d{6, k};
    t.insert(0, d.data(), d.size(), nullptr, 0, 0, 0);
    t.remove(0, d.data(), d.size(), nullptr, 0, 0, 0);
  }
  const uint64_t h = t.hold_along(&kept, 0, c.data(), c.size(), nullptr, 0);
  t.match(0, c.data(), c.size(), nullptr, false, &len, nullptr, 1);
  CHECK(len == 4);
  t.release(h);
  t.check_invariants();
}

// Everything observable of a tree: per node its path, holders on each tier
// and hold counts (per worker below `workers`).
static std::vector<std::vector<uint64_t>> structure(const MetaTree& t, uint32_t workers) {
  std::vector<std::vector<uint64_t>> out;
  std::vector<Token> path;
  for (uint32_t x : t.nodes_in_order()) {
    t.path_tokens(x, &path);
    std::vector<uint64_t> row(path.begin(), path.end());
    row.push_back(UINT64_MAX);
    row.push_back(t.node(x).ns);
    for (uint32_t w = 0; w < workers; ++w) row.push_back(t.holds(w, x, 0) + 2 * t.holds(w, x, 1));
    for (const auto& e : t.hold_counts(x)) {
      row.push_back(e.first);
      row.push_back(e.second);
    }
    out.push_back(row);
  }
  return out;
}

// insert_along and hold_along equal insert and hold, cut for cut, whether the
// path is current or stale; holds count in matches exactly as a model says.
static void test_along_equals_walking(uint32_t page, uint32_t seed) {
  std::mt19937 rng(seed);
  const uint32_t workers = 4;  // 0 and 1 exact, 2 and 3 approximate
  MetaTree walking(page), along(page);
  for (uint32_t w = 0; w < workers; ++w) {
    const uint64_t capacity = w < 2 ? kNoCapacity : (2 + rng() % 6) * page;
    walking.add_worker(w, capacity);
    along.add_worker(w, capacity);
  }
  Model model{page, std::vector<std::set<Page>>(workers), std::vector<std::set<Page>>(workers)};
  std::map<uint64_t, std::pair<uint32_t, std::vector<Page>>> holds;  // id -> (worker, pages)
  std::vector<std::vector<Token>> pool;
  for (int i = 0; i < 10; ++i) {
    std::vector<Token> key;
    if (!pool.empty() && rng() % 2) key = pool[rng() % pool.size()];
    key.resize(key.size() / 2);
    const size_t extra = 1 + rng() % (5 * page);
    for (size_t j = 0; j < extra; ++j) key.push_back(rng() % 3);
    pool.push_back(key);
  }
  std::vector<int64_t> a(workers), b(workers);
  radixmeta::MatchPath path;
  for (int step = 0; step < 2500; ++step) {
    const auto& key = pool[rng() % pool.size()];
    const uint32_t w = rng() % workers;
    const uint32_t ns = rng() % 5 == 0 ? 1 : 0;
    const size_t whole = key.size() - key.size() % page;
    Tags tags;
    if (rng() % 4 == 0)
      for (size_t i = 0; i < whole / page; ++i) tags.push_back(rng() % 4 == 0 ? 1 : 0);
    const uint64_t* tp = tags.empty() ? nullptr : tags.data();
    const uint32_t op = rng() % 6;
    if (op <= 2) {  // a match that leaves its path, maybe something else, then a mark
      along.match(ns, key.data(), key.size(), tp, false, b.data(), nullptr, workers, true, &path);
      if (rng() % 3 == 0) {  // something in between: the path may grow, be cut or go stale
        const auto& other = pool[rng() % pool.size()];
        const uint32_t v = rng() % 2;
        const size_t cut = page * (rng() % (other.size() / page + 1));
        if (rng() % 3 != 0) {
          CHECK(walking.insert(0, other.data(), cut, nullptr, v, 0, 0) ==
                along.insert(0, other.data(), cut, nullptr, v, 0, 0));
          model.mark(v, 0, std::vector<Token>(other.begin(), other.begin() + cut), {}, 0, true);
        } else {  // may free nodes (and a freed id may come back elsewhere)
          CHECK(walking.remove(0, other.data(), other.size(), nullptr, v, cut, 0) ==
                along.remove(0, other.data(), other.size(), nullptr, v, cut, 0));
          model.mark(v, 0, other, {}, cut, false);
          const std::vector<Token> fresh{9, 9, 9, 9, 9, 9, 9, 9};
          CHECK(walking.insert(0, fresh.data(), fresh.size(), nullptr, v, 0, 0) ==
                along.insert(0, fresh.data(), fresh.size(), nullptr, v, 0, 0));
          model.mark(v, 0, fresh, {}, 0, true);
        }
      }
      if (op == 2 && w < 2) {
        const uint64_t id = walking.hold(ns, key.data(), key.size(), tp, w);
        CHECK(along.hold_along(&path, ns, key.data(), key.size(), tp, w) == id);
        std::vector<Page> pages;
        for (size_t end = page; end <= whole; end += page) pages.push_back(page_of(ns, key, tags, end, page));
        holds[id] = {w, pages};
      } else {
        const uint32_t tier = rng() % 5 == 0 ? 1 : 0;
        CHECK(walking.insert(ns, key.data(), key.size(), tp, w, 0, tier) ==
              along.insert_along(&path, ns, key.data(), key.size(), tp, w, tier));
        if (w < 2) model.mark(w, ns, key, tags, 0, true, tier);
      }
    } else if (op == 3 && !holds.empty()) {
      auto it = holds.begin();
      std::advance(it, rng() % holds.size());
      CHECK(walking.release(it->first) == along.release(it->first));
      holds.erase(it);
    } else if (op == 4) {
      const size_t start = page * (rng() % (whole / page + 1));
      CHECK(walking.remove(ns, key.data(), key.size(), tp, w, start, 0) ==
            along.remove(ns, key.data(), key.size(), tp, w, start, 0));
      if (w < 2) model.mark(w, ns, key, tags, start, false);
    } else {
      walking.match(ns, key.data(), key.size(), tp, false, a.data(), nullptr, workers);
      along.match(ns, key.data(), key.size(), tp, false, b.data(), nullptr, workers);
      CHECK(a == b);
      for (uint32_t v = 0; v < 2; ++v) {  // exact workers: marks or holds, page by page
        int64_t n = 0;
        for (size_t end = page; end <= whole; end += page) {
          const Page p = page_of(ns, key, tags, end, page);
          bool held = model.held[v].count(p) != 0;
          for (const auto& h : holds)
            held = held || (h.second.first == v &&
                            std::find(h.second.second.begin(), h.second.second.end(), p) != h.second.second.end());
          if (!held) break;
          n = static_cast<int64_t>(end);
        }
        CHECK(a[v] == n);
      }
    }
    walking.take_dropped_namespaces();
    along.take_dropped_namespaces();
    CHECK(structure(walking, workers) == structure(along, workers));
    for (uint32_t v = 0; v < workers; ++v) {
      CHECK(walking.held_tokens(v, 0) == along.held_tokens(v, 0));
      CHECK(walking.hold_tokens(v) == along.hold_tokens(v));
    }
    walking.check_invariants();
    along.check_invariants();
    if (failures > 0) return;
  }
  for (const auto& h : holds) CHECK(walking.release(h.first) == along.release(h.first));
  for (uint32_t w = 0; w < workers; ++w) {
    walking.remove_worker(w);
    along.remove_worker(w);
  }
  CHECK(walking.node_count() == 0 && along.node_count() == 0 && along.hold_count() == 0);
}

int main() {
  test_example_from_the_docs();
  test_block_events();
  test_match_stays_inside_the_lengths_array();
  test_approximate_worker_keeps_to_capacity();
  test_set_capacity_trims_like_an_insert();
  test_namespaces();
  test_extra_tags();
  test_tiers();
  test_random_against_model(1, 3, 1);
  test_random_against_model(4, 70, 2);  // holder sets cross a 64-bit word
  test_holds();
  test_a_kept_walk_does_not_trust_a_reused_id();
  test_along_equals_walking(1, 3);
  test_along_equals_walking(4, 4);
  if (failures != 0) {
    std::fprintf(stderr, "%d meta-tree check(s) failed\n", failures);
    return 1;
  }
  std::printf("meta-tree tests: all checks passed\n");
  return 0;
}
