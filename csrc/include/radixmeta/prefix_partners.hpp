// The shared prefixes within one batch of keys, for the router's batch path.
//
// For each key i of a batch: the longest whole-page prefix it shares with an
// earlier key of the batch, and the first earlier key that shares that much
// (its "partner"). Requests of a batch that share long prefixes are grouped
// from these pairs. One compressed trie over the batch, built once: each key is
// compared with the trie's labels (stored as ranges of the keys themselves,
// never copied) once along its path, so the cost is O(total tokens), not the
// O(k log k x shared length) of sorting keys that share long prefixes.
//
// Why the partner is the first such key: a trie node's tokens are those of the
// key that created it (its owner, the first key through its first page), and a
// key that stops in or at the end of a node shares that much with the owner;
// any earlier key sharing as much passes through the node's first page, so it
// is the owner. Cuts keep the owner on both parts.
//
// A node's children are filed by their first page (children.hpp, keyed by
// detail::page_key), so finding the child to follow is O(1) however many
// children a node has: a batch of distinct prompts gives the root one child per
// prompt, and a scan of those made the whole batch quadratic (100,000 requests
// took 30-50 s).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "children.hpp"
#include "paging.hpp"

namespace radixmeta {

class PrefixPartners {
 public:
  // keys[i] points at lengths[i] tokens (a tail shorter than a page is
  // ignored). partner[i] gets the first earlier key sharing the most whole
  // pages with key i (-1 when none shares a page), shared[i] how many tokens.
  static void compute(const Token* const* keys, const uint64_t* lengths, uint32_t count,
                      uint32_t page, int64_t* partner, int64_t* shared) {
    PrefixPartners trie(keys, page);
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t n = lengths[i] - lengths[i] % page;
      const uint64_t depth = trie.insert(i, n, &partner[i]);
      shared[i] = static_cast<int64_t>(depth);
    }
  }

  // The batch's shared-prefix groups: key i joins its partner's group when
  // they share at least one page and at least `ratio` of the shorter key's
  // whole pages. first[i] gets the first key of i's group; shared[f], for the
  // first key f of a group, the tokens every key of the group shares (the
  // smallest link, since lcp(a, c) >= min(lcp(a, b), lcp(b, c))), 0 for a key
  // alone. A partner comes before its key, so one pass settles every group.
  // With partner_out and common_out, also what compute() gives (one trie for both).
  static void groups(const Token* const* keys, const uint64_t* lengths, uint32_t count,
                     uint32_t page, double ratio, int64_t* first, int64_t* shared,
                     int64_t* partner_out = nullptr, int64_t* common_out = nullptr) {
    std::vector<int64_t> partner(count), common(count);
    compute(keys, lengths, count, page, partner.data(), common.data());
    if (partner_out != nullptr) std::copy(partner.begin(), partner.end(), partner_out);
    if (common_out != nullptr) std::copy(common.begin(), common.end(), common_out);
    for (uint32_t i = 0; i < count; ++i) {
      first[i] = i;
      shared[i] = 0;
      const int64_t j = partner[i];
      if (j < 0) continue;
      const uint64_t a = lengths[i] - lengths[i] % page, b = lengths[j] - lengths[j] % page;
      const double shorter = static_cast<double>(std::min(a, b));
      if (common[i] < static_cast<int64_t>(page) || static_cast<double>(common[i]) < ratio * shorter)
        continue;
      const int64_t f = first[j];
      first[i] = f;
      shared[f] = shared[f] == 0 ? common[i] : std::min(shared[f], common[i]);
    }
  }

  // The groups of groups() as runs, for the router to hand out group by group:
  // order gets the keys group by group (groups in order of their first key,
  // members in batch order), offsets[g] where group g's run starts (count
  // entries past the last one), and own[j] the tokens order[j] does not share
  // with an earlier member of its group (past the group's shared prefix for
  // its first key; a later member shares common[] with its partner). Returns
  // the number of groups. O(count).
  static uint32_t runs(const int64_t* first, const int64_t* shared, const int64_t* common,
                       const uint64_t* lengths, uint32_t count, int64_t* order,
                       int64_t* offsets, int64_t* own) {
    std::vector<uint32_t> group_of(count), size;
    for (uint32_t i = 0; i < count; ++i) {
      const auto f = static_cast<uint32_t>(first[i]);  // f <= i: its group is known
      if (f == i) {
        group_of[i] = static_cast<uint32_t>(size.size());
        size.push_back(0);
      }
      group_of[i] = group_of[f];
      ++size[group_of[i]];
    }
    const auto groups = static_cast<uint32_t>(size.size());
    std::vector<int64_t> next(groups);
    int64_t at = 0;
    for (uint32_t g = 0; g < groups; ++g) {
      offsets[g] = next[g] = at;
      at += size[g];
    }
    offsets[groups] = at;
    for (uint32_t i = 0; i < count; ++i) {
      const int64_t j = next[group_of[i]]++;
      order[j] = i;
      const bool leads = first[i] == static_cast<int64_t>(i);
      own[j] = static_cast<int64_t>(lengths[i]) - (leads ? shared[i] : common[i]);
    }
    return groups;
  }

 private:
  struct Node {
    uint32_t owner;  // the key whose tokens [start, end) label this node
    uint64_t start;
    uint64_t end;
    Children children;  // by the key of each child's first page
  };

  PrefixPartners(const Token* const* keys, uint32_t page) : keys_(keys), page_(page) {
    nodes_.push_back(Node{0, 0, 0, {}});  // the root: no label
  }

  const Token* label(const Node& x) const { return keys_[x.owner] + x.start; }
  const Token* label(uint32_t x) const { return label(nodes_[x]); }

  // The child of node x whose first page is key[pos, pos + page), or 0 (the root is never one).
  uint32_t child(uint32_t x, const Token* key, uint64_t pos) const {
    const uint32_t c = detail::find_child(nodes_[x].children, key + pos, page_,
                                          [this](uint32_t id) { return label(id); });
    return c == Children::kNone ? 0 : c;
  }

  // Files child x (its label already set) under its parent.
  void link(uint32_t parent, uint32_t x) {
    nodes_[parent].children.add(detail::page_key(label(x), page_), x);
  }

  uint32_t add(uint32_t parent, uint32_t owner, uint64_t start, uint64_t end) {
    nodes_.push_back(Node{owner, start, end, {}});
    const uint32_t x = static_cast<uint32_t>(nodes_.size() - 1);
    link(parent, x);
    return x;
  }

  // Adds key i (n whole-page tokens); returns the tokens it shares with the
  // keys before it, and sets *partner (-1 when it shares none).
  uint64_t insert(uint32_t i, uint64_t n, int64_t* partner) {
    const Token* key = keys_[i];
    *partner = -1;
    uint32_t x = 0;
    uint64_t pos = 0;
    while (pos < n) {
      const uint32_t c = child(x, key, pos);
      if (c == 0) break;
      const uint64_t len = nodes_[c].end - nodes_[c].start;
      const uint64_t limit = std::min(len, n - pos);
      uint64_t m = page_ + detail::common_prefix(label(nodes_[c]) + page_, key + pos + page_,
                                                 limit - page_);
      m -= m % page_;
      *partner = nodes_[c].owner;
      if (m < len) {
        // The key ends or leaves the trie inside c. Only a branch needs a cut
        // (a key that ends inside shares c's owner's tokens as it is).
        if (pos + m < n) {
          // The cut keeps c filed under its parent (its first page is unchanged).
          const uint32_t lower = static_cast<uint32_t>(nodes_.size());
          nodes_.push_back(Node{nodes_[c].owner, nodes_[c].start + m, nodes_[c].end, {}});
          nodes_[lower].children = std::move(nodes_[c].children);
          nodes_[c].end = nodes_[c].start + m;
          link(c, lower);
          add(c, i, pos + m, n);
        }
        return pos + m;
      }
      pos += len;
      x = c;
    }
    if (pos < n) add(x, i, pos, n);
    return pos;
  }

  const Token* const* keys_;
  uint32_t page_;
  std::vector<Node> nodes_;
};

}  // namespace radixmeta
