// Tests of the batch prefix trie with g++ alone: random batches of keys that
// share prefixes of every length, against the brute-force definition.
#include <radixmeta/prefix_partners.hpp>

#include "check.hpp"

#include <algorithm>
#include <cstdio>
#include <random>
#include <unordered_map>
#include <vector>

using radixmeta::PrefixPartners;
using radixmeta::Token;

// The definition: the longest whole-page common prefix with any earlier key,
// and the first earlier key with that much (-1 when it is 0).
static void brute_force(const std::vector<std::vector<Token>>& keys, uint32_t page,
                        std::vector<int64_t>* partner, std::vector<int64_t>* shared) {
  for (size_t i = 0; i < keys.size(); ++i) {
    int64_t best = 0, who = -1;
    for (size_t j = 0; j < i; ++j) {
      const size_t n = std::min(keys[i].size(), keys[j].size());
      size_t m = 0;
      while (m < n && keys[i][m] == keys[j][m]) ++m;
      m -= m % page;
      if (static_cast<int64_t>(m) > best) {
        best = static_cast<int64_t>(m);
        who = static_cast<int64_t>(j);
      }
    }
    (*partner)[i] = who;
    (*shared)[i] = best;
  }
}

static void test_random_batches(uint32_t page, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int round = 0; round < 300; ++round) {
    std::vector<std::vector<Token>> keys;
    const size_t count = 1 + rng() % 24;
    for (size_t i = 0; i < count; ++i) {
      std::vector<Token> key;
      if (!keys.empty() && rng() % 3 != 0) {
        key = keys[rng() % keys.size()];
        key.resize(rng() % (key.size() + 1));  // a prefix of an earlier key, cut anywhere
      }
      const size_t more = rng() % (6 * page + 1);
      for (size_t j = 0; j < more; ++j) key.push_back(rng() % 3);
      keys.push_back(key);
    }
    std::vector<const Token*> ptrs;
    std::vector<uint64_t> lengths;
    for (const auto& k : keys) {
      ptrs.push_back(k.data());
      lengths.push_back(k.size());
    }
    std::vector<int64_t> partner(count), shared(count), want_partner(count), want_shared(count);
    PrefixPartners::compute(ptrs.data(), lengths.data(), static_cast<uint32_t>(count), page,
                            partner.data(), shared.data());
    brute_force(keys, page, &want_partner, &want_shared);
    CHECK(partner == want_partner);
    CHECK(shared == want_shared);
    // Groups: the links that pass the ratio, joined into their partners' groups.
    const double ratio = (rng() % 4) / 4.0;
    std::vector<int64_t> first(count), group_shared(count), want_first(count), want_group(count, 0);
    PrefixPartners::groups(ptrs.data(), lengths.data(), static_cast<uint32_t>(count), page, ratio,
                           first.data(), group_shared.data());
    for (size_t i = 0; i < count; ++i) {
      want_first[i] = static_cast<int64_t>(i);
      const int64_t j = want_partner[i];
      if (j < 0) continue;
      const size_t a = keys[i].size() / page * page, b = keys[j].size() / page * page;
      if (want_shared[i] < page || want_shared[i] < ratio * static_cast<double>(std::min(a, b)))
        continue;
      const int64_t f = want_first[j];
      want_first[i] = f;
      want_group[f] = want_group[f] == 0 ? want_shared[i] : std::min(want_group[f], want_shared[i]);
    }
    CHECK(first == want_first);
    CHECK(group_shared == want_group);
    // Runs: the groups one after another, each in batch order, in order of their
    // first key; own is the key's length less what it shares (its group's prefix
    // for the first key, its partner's share for the others).
    std::vector<int64_t> order(count), offsets(count + 1), own(count);
    const uint32_t runs = PrefixPartners::runs(first.data(), group_shared.data(), shared.data(),
                                               lengths.data(), static_cast<uint32_t>(count),
                                               order.data(), offsets.data(), own.data());
    std::vector<int64_t> want_order, want_offsets, want_own;
    for (size_t f = 0; f < count; ++f) {
      if (want_first[f] != static_cast<int64_t>(f)) continue;
      want_offsets.push_back(static_cast<int64_t>(want_order.size()));
      for (size_t i = f; i < count; ++i) {
        if (want_first[i] != static_cast<int64_t>(f)) continue;
        want_order.push_back(static_cast<int64_t>(i));
        const int64_t less = i == f ? want_group[f] : want_shared[i];
        want_own.push_back(static_cast<int64_t>(keys[i].size()) - less);
      }
    }
    CHECK(runs == want_offsets.size());
    want_offsets.push_back(static_cast<int64_t>(count));
    offsets.resize(runs + 1);
    CHECK(order == want_order);
    CHECK(offsets == want_offsets);
    CHECK(own == want_own);
    if (failures > 0) return;
  }
}

static void test_long_shared_prefixes() {
  // 64 keys of 2,048 tokens in 4 groups of a 1,024-token prefix each.
  const uint32_t page = 16;
  std::vector<std::vector<Token>> keys;
  for (uint32_t i = 0; i < 64; ++i) {
    std::vector<Token> key(1024, 1000 + i % 4);
    for (uint32_t j = 0; j < 1024; ++j) key.push_back(i * 7919 + j);
    keys.push_back(key);
  }
  std::vector<const Token*> ptrs;
  std::vector<uint64_t> lengths;
  for (const auto& k : keys) {
    ptrs.push_back(k.data());
    lengths.push_back(k.size());
  }
  std::vector<int64_t> partner(64), shared(64);
  PrefixPartners::compute(ptrs.data(), lengths.data(), 64, page, partner.data(), shared.data());
  for (int i = 0; i < 4; ++i) CHECK(partner[i] == -1 && shared[i] == 0);
  for (int i = 4; i < 64; ++i) CHECK(partner[i] == i % 4 && shared[i] == 1024);
}

// Many children under one node: the root (distinct prompts) and one level
// down (a shared system page). Every lookup goes through the node's hash table;
// the answers are known by construction, so no brute force is needed.
static void test_wide_nodes(uint32_t page) {
  const uint32_t count = 50000, length = 4 * page;
  std::vector<std::vector<Token>> keys(count);
  for (uint32_t i = 0; i < count; ++i) {
    keys[i].assign(length, 0);
    for (uint32_t j = 0; j < length; ++j) keys[i][j] = i * length + j + 1;  // all distinct
  }
  std::vector<const Token*> ptrs;
  std::vector<uint64_t> lengths;
  for (const auto& k : keys) {
    ptrs.push_back(k.data());
    lengths.push_back(k.size());
  }
  std::vector<int64_t> partner(count), shared(count);
  PrefixPartners::compute(ptrs.data(), lengths.data(), count, page, partner.data(), shared.data());
  bool alone = true;
  for (uint32_t i = 0; i < count; ++i) alone = alone && partner[i] == -1 && shared[i] == 0;
  CHECK(alone);
  // The same keys, each also sent again later with its last page changed: the
  // repeat's partner is the original, sharing all but that page.
  for (uint32_t i = 0; i < count; ++i) {
    keys.push_back(keys[i]);
    keys.back()[length - 1] = 0;
  }
  // A shared first page: every key then branches one level down.
  for (uint32_t i = 0; i < count; ++i) {
    keys.push_back(keys[i]);
    std::fill(keys.back().begin(), keys.back().begin() + page, Token{7});
  }
  ptrs.clear();
  lengths.clear();
  for (const auto& k : keys) {
    ptrs.push_back(k.data());
    lengths.push_back(k.size());
  }
  const uint32_t total = static_cast<uint32_t>(keys.size());
  partner.assign(total, 0);
  shared.assign(total, 0);
  PrefixPartners::compute(ptrs.data(), lengths.data(), total, page, partner.data(), shared.data());
  bool repeats = true, branches = true;
  for (uint32_t i = 0; i < count; ++i) {
    repeats = repeats && partner[count + i] == i && shared[count + i] == length - page;
    const uint32_t k = 2 * count + i;
    branches = branches && (i == 0 ? partner[k] == -1 && shared[k] == 0
                                   : partner[k] == 2 * count && shared[k] == page);
  }
  CHECK(repeats);
  CHECK(branches);
}

// Two different first pages with the same 32-bit child key (page_key) under one
// node: the lookup must confirm the whole page, never take the other child.
static void test_colliding_page_keys() {
  const uint32_t page = 2;
  std::unordered_map<uint32_t, Token> seen;  // page_key of the page [t, t + 1] -> t
  Token a = 0, b = 0;
  for (Token t = 1; a == b; ++t) {
    const Token pg[2] = {t, t + 1};
    const auto found = seen.emplace(radixmeta::detail::page_key(pg, page), t);
    if (!found.second) {
      a = found.first->second;
      b = t;
    }
  }
  // Keys: a's page then x, b's page then x, and each again (they must find themselves).
  const std::vector<std::vector<Token>> keys = {
      {a, a + 1, 5, 5}, {b, b + 1, 5, 5}, {b, b + 1, 5, 6}, {a, a + 1, 5, 6}, {9, 9}};
  std::vector<const Token*> ptrs;
  std::vector<uint64_t> lengths;
  for (const auto& k : keys) {
    ptrs.push_back(k.data());
    lengths.push_back(k.size());
  }
  std::vector<int64_t> partner(keys.size()), shared(keys.size());
  PrefixPartners::compute(ptrs.data(), lengths.data(), static_cast<uint32_t>(keys.size()), page,
                          partner.data(), shared.data());
  CHECK((partner == std::vector<int64_t>{-1, -1, 1, 0, -1}));
  CHECK((shared == std::vector<int64_t>{0, 0, 2, 2, 0}));
}

int main() {
  test_random_batches(1, 1);
  test_random_batches(4, 2);
  test_long_shared_prefixes();
  test_wide_nodes(1);
  test_wide_nodes(16);
  test_colliding_page_keys();
  if (failures != 0) {
    std::fprintf(stderr, "%d prefix-partner check(s) failed\n", failures);
    return 1;
  }
  std::printf("prefix-partner tests: all checks passed\n");
  return 0;
}
