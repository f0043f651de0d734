// The router's meta-tree: one radix tree over every worker's cache, where each
// node records the set of workers that hold all of its pages.
//
// Header-only C++17 with no Python dependency. The rules are those of
// docs/metatree.md and radixmeta/_reference_meta.py, which the tests compare
// with this core step by step:
//  * Keys are cut down to whole pages. A node is cut at a page boundary only
//    when two parts of it must differ (a key diverging inside it, or one
//    worker's mark or recency changing on part of it). The upper part is the
//    new node; the lower part keeps its id. Nodes never merge, and a node with
//    no holders and no children is freed at once.
//  * A page named by a block hash is a node of exactly one page, so it is
//    never cut again and the hash -> node maps never need fixing.
//  * Block hashes are per worker in meaning, but stored once where workers
//    agree (the common case: engines hash pages deterministically): a node
//    keeps one shared hash, the set of workers that name it by that hash, and
//    a tree-wide map shared hash -> node. A worker that names a page by some
//    other hash keeps that pair in its own small maps. So a (worker, page)
//    pair costs bits, not hash-table entries.
//  * Per worker: the nodes it ever marked (a lazy list, compacted when stale
//    entries dominate) for clearing it in O(held). A worker with a capacity
//    ("approximate") also keeps a stamp per held node and a lazy min-heap of
//    (stamp, -depth), and is trimmed to its capacity after each insert or
//    stored event, least recent and deepest first.
//  * A match walks once, ANDing each node's holder bits into the set of
//    workers still matching, and records for each worker the depth at which
//    it dropped out: O(nodes on the path x active words) plus O(workers).
//  * Namespaces (dense ids from the binding; 0 is the default) each have a
//    root of their own, so their pages never share a node. A namespace other
//    than the default has a root only while it holds a page: the first page
//    creates it, and pruning its last node frees it (the id is then reported
//    by take_dropped_namespaces, for the binding to recycle). Block hashes
//    stay per worker across namespaces: removals carry no namespace.
//  * A page may carry a 64-bit extra tag (what the engine hashed besides the
//    tokens: multimodal inputs), 0 for none, and is identified by its tokens
//    and its tag. A tagged page is always a node of one page, holding its tag;
//    a node of several pages is untagged. Children are filed under a key of
//    their first page mixed with its tag, and a lookup compares both, so a
//    tree whose tags are all 0 pays one compare per node for them. Every key
//    argument takes its tags as an array of one per page, or null (all 0).
//  * A worker holds a page on the device (tier 0, `holders`) and/or the host
//    (tier 1, `host`), each marked and unmarked on its own. A match gives the
//    device lengths, and on request the lengths of pages held on either tier;
//    a tree with no host marks is never asked for them. An approximate
//    worker's capacity, recency and eviction concern its device pages only.
//    A worker names a page by its hash while it holds it on any tier.
//  * Holds (the router's optimistic marks) are apart from the marks above: a
//    hold says "worker w is about to hold every page of this key" for a
//    request in flight, and ends with release(). Each node a hold covers keeps
//    a count per worker in a side table (only nodes with holds have an entry,
//    flagged in the node), so marks, dumps, block maps and held tokens never
//    see a hold, while a match may count them. A hold covers whole nodes from
//    the root to the node that ends at its key's end, which keeps its id for
//    as long as the hold lives (a cut makes a new upper node), so release
//    walks parent links from there: no per-hold list of nodes.
//  * A match may leave its walk in a MatchPath; insert_along and hold_along
//    continue from it instead of walking the key again from the root. The
//    walk stays true while no node was freed since and every node on it keeps
//    its length (a cut shortens the lower part, which keeps the id); nodes
//    added since can only extend it, so the mark resumes the walk where it
//    ended. Checking that costs a read per node on the path, no label compare.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "children.hpp"
#include "flat_map.hpp"
#include "label_arena.hpp"
#include "location_set.hpp"
#include "node_pool.hpp"
#include "paging.hpp"
#include "sentinels.hpp"

namespace radixmeta {

// 128 bytes, aligned to cache lines: a walk reads the first line (label,
// tag, children) of each node it passes and the second (holders) of those it
// counts.
struct alignas(64) MetaNode {
  const Token* label = nullptr;  // inside arena chunk `chunk`
  uint64_t extra = 0;            // the tag of the node's one page (0: an untagged node)
  uint32_t length = 0;           // tokens on the edge into this node
  uint32_t parent = kNoNode;     // kNoNode for the roots
  uint32_t depth = 0;            // tokens from the root to the end of this node
  uint32_t chunk = 0;
  Children children;
  LocationSet holders;  // worker indices holding the node on the device (tier 0)
  LocationSet host;     // ... and on the host (tier 1)
  // Holders (on any tier) that do not name this node by its shared hash. Kept as the
  // exception rather than the rule: in a fleet whose engines hash alike it
  // stays empty, and costs no allocation however many workers there are.
  LocationSet unnamed;
  uint64_t hash = 0;    // the shared block hash, when `shared`
  uint32_t ns = 0;      // the namespace of the tree the node is in
  bool shared = false;  // some holder names this (one-page) node by `hash`
  bool alive = false;
  bool overlaid = false;  // some hold covers this node (its counts are in the side table)
  uint8_t gen = 0;        // advanced when the node is freed: a kept walk tells a reused id
};

// Where a match walked: the nodes it entered, in order, with their lengths
// then, and how far into the last one it got when the key ended or left the
// tree inside it. See MetaTree::refresh for when it still holds.
struct MatchPath {
  uint64_t frees = UINT64_MAX;  // the tree's count of freed nodes then (never a live count: unset)
  uint32_t ns = 0;
  uint64_t n = 0;        // the key's whole-page tokens
  uint64_t partial = 0;  // tokens matched inside the last node, when the walk ended inside it
  std::vector<uint32_t> nodes;
  std::vector<uint32_t> lengths;
  std::vector<uint8_t> gens;
};

// Outcome of validating a stored event against the tree (nothing changed yet).
struct StoredCheck {
  enum Code : uint8_t { kOk = 0, kUnknownParent, kCycle, kRepeated, kOtherPage, kRenamed };
  Code code = kOk;
  uint32_t index = 0;  // the offending block, for the last four codes
  uint64_t other = 0;  // kRenamed: the hash the worker already names that page by
};

class MetaTree {
 public:
  explicit MetaTree(uint32_t page_size) : page_size_(page_size), arena_(false) {
    if (page_size == 0) throw std::invalid_argument("radixmeta: page_size must be >= 1");
    root_ = nodes_.allocate();
    nodes_[root_].alive = true;
  }

  // ---- namespaces ----------------------------------------------------------

  // The root of namespace ns, or kNoNode while the namespace holds nothing.
  uint32_t root_of(uint32_t ns) const {
    if (ns == 0) return root_;
    const auto it = roots_.find(ns);
    return it == roots_.end() ? kNoNode : it->second.node;
  }

  // Namespaces that have a root, in order of creation (the default first).
  std::vector<uint32_t> namespace_ids() const {
    std::vector<std::pair<uint64_t, uint32_t>> by_serial;
    for (const auto& entry : roots_) by_serial.emplace_back(entry.second.serial, entry.first);
    std::sort(by_serial.begin(), by_serial.end());
    std::vector<uint32_t> out{0};
    for (const auto& entry : by_serial) out.push_back(entry.second);
    return out;
  }

  bool has_dropped_namespaces() const { return !dropped_namespaces_.empty(); }
  // Ids of the namespaces whose roots were freed since the last call.
  std::vector<uint32_t> take_dropped_namespaces() { return std::exchange(dropped_namespaces_, {}); }

  uint32_t page_size() const { return page_size_; }
  uint32_t node_count() const { return node_count_; }

  // ---- workers -----------------------------------------------------------

  // Registers worker index w (a fresh index or a free one; the binding owns
  // the name <-> index registry).
  void add_worker(uint32_t w, uint64_t capacity) {
    if (w >= workers_.size()) {
      workers_.resize(size_t{w} + 1);
      live_mask_.resize(workers_.size() / 64 + 1, 0);
    }
    Worker& wk = workers_[w];
    if (wk.live) throw std::logic_error("radixmeta: worker index already live");
    wk = Worker{};
    wk.live = true;
    wk.capacity = capacity;
    live_mask_[w / 64] |= uint64_t{1} << (w % 64);
    if (wk.approximate()) approximate_.push_back(w);
  }

  // Drops the marks of worker w on the tiers in `tiers` (bit 0: device, bit
  // 1: host); returns the tokens unmarked. O(nodes it held).
  uint64_t clear_worker(uint32_t w, uint32_t tiers = kAllTiers) {
    Worker& wk = workers_[w];
    uint64_t tokens = 0;
    std::vector<uint32_t> nodes = held_nodes(w);
    for (uint32_t x : nodes) {
      for (uint32_t tier = 0; tier < 2; ++tier) {
        if ((tiers >> tier & 1) != 0 && holds(w, x, tier)) {
          tokens += nodes_[x].length;
          unmark(w, x, tier);
        }
      }
    }
    if (tiers == kAllTiers) wk.marked.clear();
    if ((tiers & 1) != 0) {
      wk.stamps.clear();
      wk.lru.clear();
    }
    for (uint32_t x : nodes) prune(x);
    maybe_compact();
    return tokens;
  }

  // Forgets worker w: its holds, then its marks. Returns the tokens it held.
  uint64_t remove_worker(uint32_t w) {
    drop_holds(w);  // before the index can be reused, no count of w may remain
    const uint64_t tokens = clear_worker(w, kAllTiers);
    workers_[w].live = false;
    live_mask_[w / 64] &= ~(uint64_t{1} << (w % 64));
    approximate_.erase(std::remove(approximate_.begin(), approximate_.end(), w), approximate_.end());
    return tokens;
  }

  // Gives approximate worker w another capacity (not kNoCapacity: a worker's
  // mode is fixed when it is added). A smaller one trims it at once by the
  // insert-time rule, least recent and deepest first; a larger one keeps every
  // page. Returns the device tokens the trim unmarked. O(pages dropped * log held).
  uint64_t set_capacity(uint32_t w, uint64_t capacity) {
    Worker& wk = workers_[w];
    if (!wk.live || !wk.approximate() || capacity == kNoCapacity)
      throw std::logic_error("radixmeta: set_capacity needs a live approximate worker");
    const uint64_t before = wk.held_tokens;
    wk.capacity = capacity;
    evict(w);
    return before - wk.held_tokens;
  }

  bool worker_live(uint32_t w) const { return w < workers_.size() && workers_[w].live; }
  uint64_t held_tokens(uint32_t w, uint32_t tier) const {
    return tier == 0 ? workers_[w].held_tokens : workers_[w].host_tokens;
  }
  uint64_t capacity(uint32_t w) const { return workers_[w].capacity; }
  bool holds(uint32_t w, uint32_t x, uint32_t tier) const {
    return (tier == 0 ? nodes_[x].holders : nodes_[x].host).test(w);
  }
  bool holds_any(uint32_t w, uint32_t x) const {
    return nodes_[x].holders.test(w) || nodes_[x].host.test(w);
  }
  // (worker, node) marks on the host tier, tree-wide: while 0, every page is
  // held on the device or not at all.
  uint64_t host_marks() const { return host_marks_; }

  // ---- token-path operations ---------------------------------------------

  // Marks the pages of key[start, n) in namespace ns (tags: one per page of
  // the key, or null) as held by w on `tier`; returns the pages newly marked.
  uint64_t insert(uint32_t ns, const Token* key, uint64_t n, const uint64_t* tags, uint32_t w,
                  uint64_t start, uint32_t tier) {
    detail::check_key_length(n);
    n -= n % page_size_;
    ++clock_;
    // Recency and capacity are the device's: host marks neither cut nor evict.
    const bool approximate = workers_[w].approximate() && tier == 0;
    uint64_t newly = 0;
    uint32_t node = root_of(ns);
    if (node == kNoNode) {
      if (start >= n) return 0;  // nothing to mark: an empty namespace costs nothing
      node = make_root(ns);
    }
    uint64_t pos = 0;
    while (pos < n) {
      uint32_t c = find_child(node, key + pos, tag_at(tags, pos));
      if (c == kNoNode) {
        if (start >= n) break;  // nothing to mark: never add structure for nothing
        if (pos < start) {
          node = add_path(node, key, pos, start, tags, kNoWorker, tier);
          pos = start;
        }
        add_path(node, key, pos, n, tags, w, tier);
        newly += (n - pos) / page_size_;
        pos = n;
        break;
      }
      const uint64_t m = common(c, key, pos, n, tags);
      if (m < nodes_[c].length && pos + m < n) {
        if (start >= n) {
          // Nothing will hang from a cut, so only recency may need one: the
          // key's pages of a node the approximate worker holds get refreshed.
          if (approximate && holds(w, c, 0)) split(c, static_cast<uint32_t>(m));
          break;
        }
        c = split(c, static_cast<uint32_t>(m));
      }
      const uint64_t end = pos + nodes_[c].length;
      if (!holds(w, c, tier)) {
        const uint64_t lo = std::max(start, pos), hi = std::min(n, end);
        if (lo < hi) {
          uint32_t target = c;
          if (lo > pos) split(c, static_cast<uint32_t>(lo - pos));
          if (hi < end) target = split(c, static_cast<uint32_t>(hi - lo));
          mark(w, target, tier);
          newly += (hi - lo) / page_size_;
        }
      } else if (approximate && n < end) {
        split(c, static_cast<uint32_t>(nodes_[c].length - (end - n)));  // recency differs
      }
      if (n < end) break;
      node = c;
      pos = end;
    }
    if (approximate) {
      refresh_path(w, root_of(ns), key, n, tags);
      evict(w);
    }
    return newly;
  }

  // Unmarks the pages of key[start, n) in namespace ns (tags as for insert)
  // held by w on `tier`; returns how many.
  uint64_t remove(uint32_t ns, const Token* key, uint64_t n, const uint64_t* tags, uint32_t w,
                  uint64_t start, uint32_t tier) {
    detail::check_key_length(n);
    n -= n % page_size_;
    uint64_t removed = 0;
    uint32_t node = root_of(ns);
    uint64_t pos = 0;
    uint32_t deepest = kNoNode;
    while (node != kNoNode && pos < n) {
      uint32_t c = find_child(node, key + pos, tag_at(tags, pos));
      if (c == kNoNode) break;
      const uint64_t m = common(c, key, pos, n, tags);
      const uint64_t end = pos + nodes_[c].length;
      if (holds(w, c, tier)) {
        const uint64_t lo = std::max(start, pos), hi = pos + m;
        if (lo < hi) {
          uint32_t target = c;
          if (lo > pos) split(c, static_cast<uint32_t>(lo - pos));
          if (hi < end) target = split(c, static_cast<uint32_t>(hi - lo));
          unmark(w, target, tier);
          removed += (hi - lo) / page_size_;
          deepest = target;
        }
      }
      if (pos + m < end) break;
      node = c;
      pos = end;
    }
    if (deepest != kNoNode) {
      prune(deepest);
      maybe_compact();
    }
    return removed;
  }

  // Per-worker matched lengths of key in namespace ns (tags as for insert)
  // into lengths[0, slots) (slots >= the number of worker indices), counting
  // device pages; unless null, host_lengths[0, slots) gets the lengths that
  // count pages held on either tier. Returns how much of the key is in the tree.
  //
  // With `overlay`, a page also counts for the workers that have a hold on it.
  // Unless null, *path gets the walk (for insert_along and hold_along).
  uint64_t match(uint32_t ns, const Token* key, uint64_t n, const uint64_t* tags, bool touch,
                 int64_t* lengths, int64_t* host_lengths, uint32_t slots, bool overlay = true,
                 MatchPath* path = nullptr) {
    detail::check_key_length(n);
    n -= n % page_size_;
    const uint32_t words = static_cast<uint32_t>(std::min<size_t>(live_mask_.size(), (slots + 63) / 64));
    alive_.assign(live_mask_.begin(), live_mask_.begin() + words);
    // Only indices below slots have room in lengths: a worker registered
    // after the caller sized the array is not written.
    if (words != 0 && slots % 64 != 0) alive_[words - 1] &= (uint64_t{1} << (slots % 64)) - 1;
    active_.clear();
    for (uint32_t i = 0; i < words; ++i)
      if (alive_[i] != 0) active_.push_back(i);
    // Live workers get their length written exactly once below (when they
    // drop out, or at the end); only the free indices need a zero.
    for (uint32_t i = 0; i < words; ++i) {
      const uint32_t base = i * 64, in_word = std::min<uint32_t>(64, slots - base);
      const uint64_t valid = in_word == 64 ? ~uint64_t{0} : (uint64_t{1} << in_word) - 1;
      for (uint64_t free = ~alive_[i] & valid; free != 0; free &= free - 1)
        lengths[base + __builtin_ctzll(free)] = 0;
    }
    std::fill(lengths + std::min<size_t>(slots, size_t{words} * 64), lengths + slots, 0);
    if (host_lengths != nullptr) {  // the same start: every free index 0, the live ones all in
      std::copy(lengths, lengths + slots, host_lengths);
      host_alive_ = alive_;
      host_active_ = active_;
    }
    path_.clear();
    uint64_t pos = 0;
    uint64_t partial = 0;  // tokens matched inside the last node, when it ends inside
    const uint32_t root = root_of(ns);
    if (n != 0 && root != kNoNode) {
      // A tree and key without tags walk with no tag in sight (not even a compare),
      // and one without holds reads no hold count.
      const bool tagged = tags != nullptr || tagged_nodes_ != 0;
      const bool record = touch || path != nullptr;
      if (overlay && overlaid_nodes_ != 0) {
        if (host_lengths != nullptr)
          match_walk<true, true, true>(root, key, n, tags, record, lengths, host_lengths, &pos,
                                       &partial);
        else if (tagged)
          match_walk<true, false, true>(root, key, n, tags, record, lengths, nullptr, &pos,
                                        &partial);
        else
          match_walk<false, false, true>(root, key, n, nullptr, record, lengths, nullptr, &pos,
                                         &partial);
      } else if (host_lengths != nullptr) {
        match_walk<true, true, false>(root, key, n, tags, record, lengths, host_lengths, &pos,
                                      &partial);
      } else if (tagged) {
        match_walk<true, false, false>(root, key, n, tags, record, lengths, nullptr, &pos,
                                       &partial);
      } else {
        match_walk<false, false, false>(root, key, n, nullptr, record, lengths, nullptr, &pos,
                                        &partial);
      }
    }
    if (path != nullptr) {
      // Before touch_counted, whose cut (if any) shortens a node of it, as refresh sees.
      path->frees = frees_;
      path->ns = ns;
      path->n = n;
      path->partial = partial;
      path->nodes.assign(path_.begin(), path_.end());
      path->lengths.resize(path_.size());
      path->gens.resize(path_.size());
      for (size_t i = 0; i < path_.size(); ++i) {
        path->lengths[i] = nodes_[path_[i]].length;
        path->gens[i] = nodes_[path_[i]].gen;
      }
    }
    for (uint32_t i : active_)
      for (uint64_t bits = alive_[i]; bits != 0; bits &= bits - 1)
        lengths[i * 64 + __builtin_ctzll(bits)] = static_cast<int64_t>(pos + partial);
    if (host_lengths != nullptr)
      for (uint32_t i : host_active_)
        for (uint64_t bits = host_alive_[i]; bits != 0; bits &= bits - 1)
          host_lengths[i * 64 + __builtin_ctzll(bits)] = static_cast<int64_t>(pos + partial);
    if (touch) touch_counted(lengths, slots, pos, partial);
    return pos + partial;
  }

  // ---- holds: the router's optimistic marks --------------------------------

  // The walk of key[0, n) in namespace ns, as match leaves it, without
  // reading any holder.
  void walk(uint32_t ns, const Token* key, uint64_t n, const uint64_t* tags, MatchPath* path) {
    n -= n % page_size_;
    path->frees = frees_;
    path->ns = ns;
    path->n = n;
    path->partial = 0;
    path->nodes.clear();
    path->lengths.clear();
    path->gens.clear();
    walk_on(path, root_of(ns), 0, key, tags);
  }

  // Makes `path` (a walk of key[0, n) in namespace ns, tags as for insert)
  // describe the tree as it is now, if it still can: every node on it not
  // freed since (a freed id may have been reused elsewhere) and as long as it
  // was (a node cut since is shorter). A node's 8-bit generation advances
  // when it is freed, so while fewer than 256 nodes were freed in all, an
  // unchanged generation proves the node was not; past that, only a tree
  // that freed nothing is trusted. Nodes added since can only extend a walk
  // that ended at a node's end, so it walks on from there. Returns false
  // when the path cannot be trusted (then walk from the root).
  bool refresh(MatchPath* path, uint32_t ns, const Token* key, uint64_t n, const uint64_t* tags) {
    if (path->frees == UINT64_MAX || path->ns != ns || path->n != n) return false;
    if (frees_ - path->frees >= 256) return false;
    const bool freed = frees_ != path->frees;
    for (size_t i = 0; i < path->nodes.size(); ++i) {
      const MetaNode& x = nodes_[path->nodes[i]];
      if (x.length != path->lengths[i] || (freed && x.gen != path->gens[i])) return false;
    }
    if (path->partial != 0) return true;  // it ended inside its last node, which is unchanged
    const uint32_t from = path->nodes.empty() ? root_of(ns) : path->nodes.back();
    walk_on(path, from, path->nodes.empty() ? 0 : nodes_[from].depth, key, tags);
    return true;
  }

  // Holds every page of key[0, n) in namespace ns (tags as for insert) for
  // exact worker w until release(); returns the hold's id. The key's pages
  // that are not in the tree yet enter it, held by nobody else.
  uint64_t hold(uint32_t ns, const Token* key, uint64_t n, const uint64_t* tags, uint32_t w) {
    walk(ns, key, n, tags, &scratch_path_);
    return hold_path(scratch_path_, key, tags, w);
  }

  // hold(), continuing from the walk in `path` (of this key, namespace and
  // tags; refreshed first, see refresh) instead of walking from the root.
  uint64_t hold_along(MatchPath* path, uint32_t ns, const Token* key, uint64_t n,
                      const uint64_t* tags, uint32_t w) {
    n -= n % page_size_;
    if (!refresh(path, ns, key, n, tags)) return hold(ns, key, n, tags, w);
    return hold_path(*path, key, tags, w);
  }

  // insert(ns, key, n, tags, w, 0, tier), continuing from the walk in `path`
  // (of this key, namespace and tags; refreshed first, see refresh):
  // O(nodes on the path + new pages), with no child lookup or label
  // comparison for the part the match already walked.
  uint64_t insert_along(MatchPath* path_in, uint32_t ns, const Token* key, uint64_t n,
                        const uint64_t* tags, uint32_t w, uint32_t tier) {
    detail::check_key_length(n);
    n -= n % page_size_;
    if (n == 0 || root_of(ns) == kNoNode || !refresh(path_in, ns, key, n, tags))
      return insert(ns, key, n, tags, w, 0, tier);
    const MatchPath& path = *path_in;
    ++clock_;
    const bool approximate = workers_[w].approximate() && tier == 0;
    uint64_t newly = 0;
    uint32_t node = root_of(ns);
    uint32_t inside = kNoNode;  // the deepest node on the path that ends within the key
    uint64_t pos = 0;
    bool ended = false;  // the key ends inside a node of the path
    // The body of insert's loop (start = 0), on the nodes the match found.
    for (size_t i = 0; i < path.nodes.size(); ++i) {
      uint32_t c = path.nodes[i];
      const bool last = i + 1 == path.nodes.size();
      const uint64_t m = last && path.partial != 0 ? path.partial : nodes_[c].length;
      if (m < nodes_[c].length && pos + m < n) c = split(c, static_cast<uint32_t>(m));
      const uint64_t end = pos + nodes_[c].length;
      if (!holds(w, c, tier)) {
        const uint64_t hi = std::min(n, end);
        uint32_t target = c;
        if (hi < end) target = split(c, static_cast<uint32_t>(hi - pos));
        mark(w, target, tier);
        newly += (hi - pos) / page_size_;
        if (hi < end) inside = target;
      } else if (approximate && n < end) {
        inside = split(c, static_cast<uint32_t>(nodes_[c].length - (end - n)));
      }
      if (n < end) {
        ended = true;
        break;
      }
      node = c;
      inside = c;
      pos = end;
    }
    if (!ended && pos < n) {
      inside = add_path(node, key, pos, n, tags, w, tier);
      newly += (n - pos) / page_size_;
    }
    if (approximate) {
      refresh_chain(w, inside);
      evict(w);
    }
    return newly;
  }

  bool has_hold(uint64_t id) const { return holds_.contains(id); }
  uint32_t hold_worker(uint64_t id) const { return holds_.find(id)->worker; }

  // Ends hold `id` (which must exist); returns the pages its worker no
  // longer holds by any hold. O(nodes from the root to the hold's end).
  uint64_t release(uint64_t id) {
    const Hold h = *holds_.find(id);
    holds_.erase(id);
    --workers_[h.worker].holds;
    if (h.node == kNoNode) return 0;
    uint64_t pages = 0;
    for (uint32_t x = h.node; nodes_[x].parent != kNoNode; x = nodes_[x].parent) {
      const uint32_t slot = *overlay_of_.find(x);
      auto& counts = overlays_[slot].counts;
      auto it = std::find_if(counts.begin(), counts.end(),
                             [&](const std::pair<uint32_t, uint32_t>& e) { return e.first == h.worker; });
      if (--it->second != 0) continue;
      counts.erase(it);
      overlays_[slot].workers.reset(h.worker);
      workers_[h.worker].hold_tokens -= nodes_[x].length;
      pages += nodes_[x].length / page_size_;
      if (counts.empty()) free_overlay(x, slot);
    }
    prune(h.node);
    maybe_compact();
    return pages;
  }

  // Ends every hold of worker w, oldest first; returns how many.
  uint64_t drop_holds(uint32_t w) {
    if (workers_[w].holds == 0) return 0;
    std::vector<uint64_t> ids;
    holds_.for_each([&](uint64_t id, const Hold& h) {
      if (h.worker == w) ids.push_back(id);
    });
    std::sort(ids.begin(), ids.end());
    for (uint64_t id : ids) release(id);
    return ids.size();
  }

  uint64_t hold_count() const { return holds_.size(); }
  // Tokens of the pages that worker w holds by some hold.
  uint64_t hold_tokens(uint32_t w) const { return workers_[w].hold_tokens; }
  // Workers holding node x by some hold, with their counts (for items and tests).
  std::vector<std::pair<uint32_t, uint32_t>> hold_counts(uint32_t x) const {
    if (!nodes_[x].overlaid) return {};
    return overlays_[*overlay_of_.find(x)].counts;
  }

  // ---- engine block operations -------------------------------------------

  // Validates a stored event of w in namespace ns: parent (when has_parent;
  // it must be a page of that namespace), the blocks' hashes and their pages
  // (tokens holds n_blocks pages; tags one per block, or null). Changes nothing.
  StoredCheck check_stored(uint32_t w, uint32_t ns, bool has_parent, uint64_t parent,
                           const uint64_t* hashes, uint32_t n_blocks, const Token* tokens,
                           const uint64_t* tags) {
    uint32_t node = root_of(ns);  // kNoNode: the namespace is new, every block a new page
    if (has_parent) {
      node = named_node(w, parent);
      if (node == kNoNode || nodes_[node].ns != ns) return refuse(StoredCheck::kUnknownParent, 0);
    }
    mark_repeats(hashes, n_blocks);
    landing_.assign(n_blocks, kNoNode);
    // Dry walk: (node, page) is where block i lies; node == kNoNode once the
    // path leaves the tree (every later block is a new page).
    uint32_t in = kNoNode;  // the node holding block i, page `page` of it
    uint32_t page = 0;
    for (uint32_t i = 0; i < n_blocks; ++i) {
      const Token* tok = tokens + size_t{i} * page_size_;
      const uint64_t tag = tags == nullptr ? 0 : tags[i];
      if (in != kNoNode && tag == 0 && page + 1 < nodes_[in].length / page_size_ &&
          std::memcmp(nodes_[in].label + size_t{page + 1} * page_size_, tok,
                      page_size_ * sizeof(Token)) == 0) {
        ++page;  // the next page of an (untagged) node of several
      } else {
        const uint32_t from = in == kNoNode ? (i == 0 ? node : kNoNode) : in;
        const bool left = in != kNoNode && page + 1 < nodes_[in].length / page_size_;
        in = (from == kNoNode || left) ? kNoNode : find_child(from, tok, tag);
        page = 0;
      }
      if (in != kNoNode && page == 0 && nodes_[in].length == page_size_) landing_[i] = in;
      const uint64_t h = hashes[i];
      if (has_parent && h == parent) return refuse(StoredCheck::kCycle, i);
      if (repeat_[i]) return refuse(StoredCheck::kRepeated, i);
      const bool one_page = in != kNoNode && page == 0 && nodes_[in].length == page_size_;
      const uint32_t bound = named_node(w, h);
      if (bound != kNoNode && !(one_page && in == bound))
        return refuse(StoredCheck::kOtherPage, i);
      // Within a worker a page has one name: a second one is a conflict to
      // report, never a silent rename (it would orphan the old name's children).
      uint64_t old = 0;
      if (bound == kNoNode && one_page && name_of(w, in, &old)) {
        StoredCheck renamed = refuse(StoredCheck::kRenamed, i);
        renamed.other = old;
        return renamed;
      }
    }
    return {};
  }

  // Applies the stored event that check_stored just accepted (same arguments,
  // nothing in between); returns pages newly marked.
  uint64_t apply_stored(uint32_t w, uint32_t ns, bool has_parent, uint64_t parent,
                        const uint64_t* hashes, uint32_t n_blocks, const Token* tokens,
                        const uint64_t* tags, uint32_t tier) {
    require(landing_.size() == n_blocks, "apply_stored without check_stored");
    ++clock_;
    Worker& wk = workers_[w];
    uint32_t node = has_parent ? named_node(w, parent) : root_of(ns);
    if (node == kNoNode && n_blocks != 0) node = make_root(ns);
    uint64_t newly = 0;
    for (uint32_t i = 0; i < n_blocks; ++i) {
      const Token* tok = tokens + size_t{i} * page_size_;
      const uint64_t tag = tags == nullptr ? 0 : tags[i];
      // The check found the one-page nodes already in place; splits and new
      // leaves since then never move or free those.
      uint32_t c = landing_[i] != kNoNode ? landing_[i] : find_child(node, tok, tag);
      if (c == kNoNode) {
        c = add_leaf(node, tok, page_size_, tag);
      } else if (nodes_[c].length > page_size_) {
        c = split(c, page_size_);
      }
      if (!holds(w, c, tier)) {
        // Marking it as named right away spares a worker's bit in `unnamed`
        // (and with it, past 64 workers, an allocation per node).
        const MetaNode& cn = nodes_[c];
        mark(w, c, tier, cn.shared && cn.hash == hashes[i] && own_name(w, hashes[i]) == kNoNode);
        ++newly;
      }
      bind(w, c, hashes[i]);
      node = c;
    }
    landing_.clear();
    // An empty event refreshes nothing; a host event is no use of the device.
    if (wk.approximate() && n_blocks != 0 && tier == 0) {
      for (uint32_t x = node; nodes_[x].parent != kNoNode; x = nodes_[x].parent)
        if (holds(w, x, 0)) stamp(w, x);
      evict(w);
    }
    return newly;
  }

  // Unmarks on `tier` the blocks of w named by hashes (unknown ones, and
  // those w holds on the other tier only, are skipped).
  uint64_t apply_removed(uint32_t w, const uint64_t* hashes, uint32_t n_blocks, uint32_t tier) {
    uint64_t removed = 0;
    for (uint32_t i = 0; i < n_blocks; ++i) {
      const uint32_t node = named_node(w, hashes[i]);
      if (node == kNoNode || !holds(w, node, tier)) continue;
      unmark(w, node, tier);
      prune(node);
      ++removed;
    }
    if (removed != 0) maybe_compact();
    return removed;
  }

  // Names w's page ending at key[n) in namespace ns (tags as for insert; a
  // page w holds) by hash, isolating it as a one-page node. Returns false
  // (changing nothing) if w does not hold it.
  bool bind_hash(uint32_t w, uint32_t ns, const Token* key, uint64_t n, const uint64_t* tags,
                 uint64_t hash) {
    uint32_t node = root_of(ns);
    if (n == 0 || n % page_size_ != 0 || node == kNoNode) return false;
    uint64_t pos = 0;
    while (true) {
      const uint32_t c = find_child(node, key + pos, tag_at(tags, pos));
      if (c == kNoNode) return false;
      const uint64_t m = common(c, key, pos, n, tags);
      const uint64_t end = pos + nodes_[c].length;
      if (pos + m < std::min(n, end)) return false;
      if (n > end) {
        node = c;
        pos = end;
        continue;
      }
      if (!holds_any(w, c)) return false;
      uint32_t target = c;
      if (n < end) target = split(c, static_cast<uint32_t>(n - pos));
      if (nodes_[target].length > page_size_)
        split(target, nodes_[target].length - page_size_);  // target keeps the last page
      const uint32_t old = named_node(w, hash);
      if (old != kNoNode && old != target) unbind(w, old);
      bind(w, target, hash);
      return true;
    }
  }

  // ---- introspection -------------------------------------------------------

  const MetaNode& node(uint32_t x) const { return nodes_[x]; }

  // Every node but the roots: namespace by namespace in namespace_ids()
  // order, each depth first with children in lexicographic order.
  std::vector<uint32_t> nodes_in_order() const {
    std::vector<uint32_t> out, stack, kids;
    for (uint32_t ns : namespace_ids()) append_in_order(root_of(ns), &out, &stack, &kids);
    return out;
  }

  // The nodes w holds on `tier`: on the device of an approximate worker in
  // eviction order (so that replaying them restores its recency), else in
  // nodes_in_order() order.
  std::vector<uint32_t> held_in_order(uint32_t w, uint32_t tier) const {
    const Worker& wk = workers_[w];
    std::vector<uint32_t> out;
    if (!wk.approximate() || tier != 0) {
      for (uint32_t x : nodes_in_order())
        if (holds(w, x, tier)) out.push_back(x);
      return out;
    }
    std::vector<LruEntry> entries;
    wk.stamps.for_each([&](uint32_t x, uint64_t stamp) {
      entries.push_back({stamp, nodes_[x].depth, x});
    });
    std::sort(entries.begin(), entries.end(), [](const LruEntry& a, const LruEntry& b) {
      return LruLater()(b, a);
    });
    for (const LruEntry& e : entries) out.push_back(e.node);
    return out;
  }

  // (hash, node) of every block w names, ascending by hash.
  std::vector<std::pair<uint64_t, uint32_t>> block_entries(uint32_t w) const {
    std::vector<std::pair<uint64_t, uint32_t>> out;
    for (uint32_t x : held_nodes(w))
      if (names_shared(nodes_[x], w)) out.emplace_back(nodes_[x].hash, x);
    workers_[w].own_blocks.for_each([&](uint64_t h, uint32_t x) { out.emplace_back(h, x); });
    std::sort(out.begin(), out.end());
    return out;
  }

  // Tokens from the root to the end of node x.
  void path_tokens(uint32_t x, std::vector<Token>* out) const {
    out->assign(nodes_[x].depth, 0);
    for (; nodes_[x].parent != kNoNode; x = nodes_[x].parent) {
      const MetaNode& n = nodes_[x];
      std::memcpy(out->data() + (n.depth - n.length), n.label, size_t{n.length} * sizeof(Token));
    }
  }

  // The tags of the pages from the root to the end of node x (one per page);
  // returns whether any is not 0.
  bool path_tags(uint32_t x, std::vector<uint64_t>* out) const {
    out->assign(nodes_[x].depth / page_size_, 0);
    bool any = false;
    for (; nodes_[x].parent != kNoNode; x = nodes_[x].parent) {
      const MetaNode& n = nodes_[x];
      if (n.extra == 0) continue;
      (*out)[(n.depth - n.length) / page_size_] = n.extra;  // a tagged node is one page
      any = true;
    }
    return any;
  }

  size_t memory_usage() const {
    size_t total = sizeof(*this) + nodes_.memory_bytes() + arena_.memory_bytes();
    for (uint32_t x : nodes_in_order()) {
      const MetaNode& n = nodes_[x];
      total += n.children.heap_bytes() + n.holders.heap_bytes() + n.host.heap_bytes() +
               n.unnamed.heap_bytes();
    }
    for (uint32_t ns : namespace_ids()) total += nodes_[root_of(ns)].children.heap_bytes();
    total += shared_.memory_bytes() + roots_.size() * (sizeof(RootEntry) + 16) +
             roots_.bucket_count() * sizeof(void*) + dropped_namespaces_.capacity() * 4;
    for (const Worker& wk : workers_) {
      total += wk.marked.capacity() * sizeof(uint32_t) + wk.stamps.memory_bytes() +
               wk.own_blocks.memory_bytes() + wk.own_hash_of.memory_bytes() +
               wk.lru.capacity() * sizeof(LruEntry);
    }
    total += workers_.capacity() * sizeof(Worker) + live_mask_.capacity() * 8;
    total += overlay_of_.memory_bytes() + holds_.memory_bytes() +
             overlays_.capacity() * sizeof(Overlay) + free_overlays_.capacity() * 4;
    for (const Overlay& o : overlays_)
      total += o.counts.capacity() * sizeof(std::pair<uint32_t, uint32_t>) + o.workers.heap_bytes();
    return total;
  }

  // Verifies every invariant in O(nodes + marks); throws std::logic_error.
  void check_invariants() const {
    std::vector<uint64_t> held(workers_.size(), 0), host(workers_.size(), 0);
    std::vector<uint64_t> covered(workers_.size(), 0), live_holds(workers_.size(), 0);
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> counted, expected;  // (node, worker)
    uint64_t overlaid = 0;
    std::vector<uint64_t> held_count(workers_.size(), 0);
    uint64_t host_count = 0;
    uint32_t count = 0, tagged = 0;
    size_t shared = 0;
    std::vector<uint32_t> stack;
    for (uint32_t ns : namespace_ids()) {
      const MetaNode& r = nodes_[root_of(ns)];
      require(r.alive && r.parent == kNoNode && r.length == 0 && r.depth == 0 && r.ns == ns &&
                  !r.holders.any(),
              "a root is malformed");
      require(ns == 0 || !r.children.empty(), "an emptied namespace kept its root");
      stack.push_back(root_of(ns));
    }
    while (!stack.empty()) {
      const uint32_t x = stack.back();
      stack.pop_back();
      const MetaNode& n = nodes_[x];
      require(n.alive, "a freed node is linked");
      n.children.for_each([&](uint32_t key, uint32_t c) {
        const MetaNode& cn = nodes_[c];
        require(cn.parent == x, "a child's parent link is wrong");
        require(key == child_key(cn.label, cn.extra), "a child is filed under the wrong key");
        require(cn.extra == 0 || cn.length == page_size_, "a tagged page is not a one-page node");
        require(cn.depth == n.depth + cn.length, "a node's depth is wrong");
        require(cn.ns == n.ns, "a node is in another namespace than its parent");
        stack.push_back(c);
      });
      if (n.parent == kNoNode) continue;
      ++count;
      tagged += n.extra != 0;
      require(n.length > 0 && n.length % page_size_ == 0, "a label is not whole pages");
      require(n.holders.any() || n.host.any() || !n.children.empty() || n.overlaid,
              "a node with no holders, no holds and no children");
      if (n.overlaid) {
        ++overlaid;
        const uint32_t* slot = overlay_of_.find(x);
        require(slot != nullptr, "an overlaid node has no hold counts");
        const Overlay& o = overlays_[*slot];
        require(!o.counts.empty() && o.workers.count() == o.counts.size(),
                "a node's hold counts and hold bits differ");
        for (const auto& e : o.counts) {
          require(e.second > 0 && o.workers.test(e.first), "a hold count is not positive");
          require(e.first < workers_.size() && workers_[e.first].live &&
                      !workers_[e.first].approximate(),
                  "a node is held by a hold of a dead or approximate worker");
          counted[{x, e.first}] = e.second;
          covered[e.first] += n.length;
        }
      }
      if (n.shared) {
        ++shared;
        require(n.length == page_size_, "a hashed page is not a one-page node");
        const uint32_t* back = shared_.find(n.hash);
        require(back != nullptr && *back == x, "a node's shared hash does not map back to it");
        require(any_namer(n), "a shared hash that no holder names");
      } else {
        require(!n.unnamed.any(), "unnamed holders of a node without a shared hash");
      }
      n.unnamed.for_each([&](uint32_t w) { require(holds_any(w, x), "a non-holder is listed"); });
      n.holders.for_each([&](uint32_t w) {
        require(w < workers_.size() && workers_[w].live, "a node is held by a dead worker");
        const Worker& wk = workers_[w];
        require(!wk.approximate() || wk.stamps.contains(x), "an approximate holder has no stamp");
        held[w] += n.length;
        ++held_count[w];
      });
      n.host.for_each([&](uint32_t w) {
        require(w < workers_.size() && workers_[w].live, "a node is held by a dead worker");
        host[w] += n.length;
        ++host_count;
        if (!n.holders.test(w)) ++held_count[w];  // a node held on both tiers counts once
      });
    }
    require(count == node_count_, "node_count is wrong");
    require(overlaid == overlaid_nodes_ && overlaid == overlay_of_.size(),
            "the count of nodes with holds is wrong");
    require(overlays_.size() == overlay_of_.size() + free_overlays_.size(),
            "the hold-count table leaks entries");
    holds_.for_each([&](uint64_t id, const Hold& h) {
      require(id < next_hold_, "a hold id was never handed out");
      require(h.worker < workers_.size() && workers_[h.worker].live, "a hold of a dead worker");
      ++live_holds[h.worker];
      if (h.node == kNoNode) return;
      require(nodes_[h.node].alive, "a hold ends at a freed node");
      for (uint32_t x = h.node; nodes_[x].parent != kNoNode; x = nodes_[x].parent)
        ++expected[{x, h.worker}];
    });
    require(counted == expected, "hold counts differ from the holds that cover each node");
    require(tagged == tagged_nodes_, "the count of tagged nodes is wrong");
    require(host_count == host_marks_, "the count of host marks is wrong");
    require(shared == shared_.size(), "the shared hash map names nodes nobody names");
    for (uint32_t w = 0; w < workers_.size(); ++w) {
      const Worker& wk = workers_[w];
      require(wk.held_tokens == held[w], "a worker's held tokens are wrong");
      require(wk.hold_tokens == covered[w], "a worker's hold tokens are wrong");
      require(wk.holds == live_holds[w], "a worker's count of holds is wrong");
      require(wk.host_tokens == host[w], "a worker's host tokens are wrong");
      require(wk.held_count == held_count[w], "a worker's held node count is wrong");
      require(wk.held_tokens <= wk.capacity, "an approximate worker exceeds its capacity");
      if (wk.approximate()) {
        size_t on_device = 0;
        for (uint32_t x : held_nodes(w)) on_device += holds(w, x, 0);
        require(wk.stamps.size() == on_device, "stale stamps");
      }
      for (uint32_t x : held_nodes(w)) require(holds_any(w, x), "held_nodes lists a node not held");
      require(held_nodes(w).size() == held_count[w], "a held node is missing from the list");
      require(wk.own_blocks.size() == wk.own_hash_of.size(), "a worker's own hash maps differ");
      wk.own_blocks.for_each([&](uint64_t h, uint32_t x) {
        const uint64_t* back = wk.own_hash_of.find(x);
        require(back != nullptr && *back == h, "a worker's own hash maps are not inverse");
        require(holds_any(w, x) && nodes_[x].length == page_size_ && !names_shared(nodes_[x], w),
                "a worker's own hash names a node it does not hold as one page");
        const uint32_t* other = shared_.find(h);
        require(other == nullptr || !names_shared(nodes_[*other], w), "a hash names two nodes");
      });
    }
  }

 private:
  static constexpr uint32_t kNoWorker = UINT32_MAX;  // add_path: mark nobody

 public:
  static constexpr uint32_t kAllTiers = 3;  // clear_worker: the device (bit 0) and the host

 private:

  struct LruEntry {
    uint64_t stamp;
    uint32_t depth;
    uint32_t node;
  };
  // Heap order: true when a goes out after b (std heaps put the "largest" on top).
  struct LruLater {
    bool operator()(const LruEntry& a, const LruEntry& b) const {
      if (a.stamp != b.stamp) return a.stamp > b.stamp;
      if (a.depth != b.depth) return a.depth < b.depth;
      return a.node > b.node;
    }
  };
  struct Worker {
    bool live = false;
    uint64_t capacity = kNoCapacity;
    uint64_t held_tokens = 0;               // on the device
    uint64_t host_tokens = 0;
    uint64_t held_count = 0;                // nodes held, on either tier
    uint64_t hold_tokens = 0;               // tokens of the nodes some hold of w covers
    uint64_t holds = 0;                     // live holds of w
    std::vector<uint32_t> marked;           // nodes marked since the last compaction (lazy)
    FlatMap<uint32_t, uint64_t> stamps;     // approximate only: held node -> last access
    std::vector<LruEntry> lru;              // approximate only; stale entries skipped
    FlatMap<uint64_t, uint32_t> own_blocks;  // hashes naming a page other than by its shared hash
    FlatMap<uint32_t, uint64_t> own_hash_of;  // the inverse of own_blocks
    bool approximate() const { return capacity != kNoCapacity; }
  };

  // Appends the nodes below root (itself excluded) to *out, depth first,
  // children in lexicographic order; stack and kids are scratch.
  void append_in_order(uint32_t root, std::vector<uint32_t>* out, std::vector<uint32_t>* stack,
                       std::vector<uint32_t>* kids) const {
    stack->assign(1, root);
    while (!stack->empty()) {
      const uint32_t x = stack->back();
      stack->pop_back();
      if (x != root) out->push_back(x);
      kids->clear();
      nodes_[x].children.for_each([&](uint32_t, uint32_t c) { kids->push_back(c); });
      std::sort(kids->begin(), kids->end(), [&](uint32_t a, uint32_t b) {
        const Token* ta = nodes_[a].label;
        const Token* tb = nodes_[b].label;
        if (std::equal(ta, ta + page_size_, tb)) return nodes_[a].extra < nodes_[b].extra;
        return std::lexicographical_compare(ta, ta + page_size_, tb, tb + page_size_);
      });
      stack->insert(stack->end(), kids->rbegin(), kids->rend());
    }
  }

  uint32_t make_root(uint32_t ns) {
    const uint32_t x = nodes_.allocate();
    MetaNode& r = nodes_[x];  // a reused slot: every field a root reads is set anew
    r.alive = true;
    r.ns = ns;
    r.parent = kNoNode;
    r.label = nullptr;
    r.length = r.depth = 0;
    r.overlaid = false;
    roots_.emplace(ns, RootEntry{x, ++root_serial_});
    return x;
  }

  // A failed check leaves no landing nodes behind for apply_stored to trust.
  StoredCheck refuse(StoredCheck::Code code, uint32_t index) {
    landing_.clear();
    return {code, index, 0};
  }

  static void require(bool ok, const char* what) {
    if (!ok) throw std::logic_error(std::string("radixmeta meta-tree invariant: ") + what);
  }

  uint32_t page_key(const Token* page) const { return detail::page_key(page, page_size_); }

  // The key a child whose first page is `page`, with extra tag `tag`, is filed
  // under: the page's own key when untagged, else that key mixed with the tag.
  uint32_t child_key(const Token* page, uint64_t tag) const {
    const uint32_t key = page_key(page);
    if (tag == 0) return key;
    return static_cast<uint32_t>(((tag ^ key) * 0x9E3779B97F4A7C15ull) >> 32);
  }

  // The child of parent whose first page is `key`'s first page with tag `tag`:
  // detail::find_child (which a tree without tags uses as it is) with the tag
  // compared too. At page size 1 an untagged key is the token itself, so the
  // key settles the token; a mixed one does not, and the token is compared.
  uint32_t find_child(uint32_t parent, const Token* key, uint64_t tag) const {
    const Children& children = nodes_[parent].children;
    const size_t bytes = size_t{page_size_} * sizeof(Token);
    const auto same = [&](uint32_t c) {
      return nodes_[c].extra == tag && std::memcmp(nodes_[c].label, key, bytes) == 0;
    };
    const uint32_t only = children.only();
    if (only != Children::kNone && page_size_ > 1) return same(only) ? only : kNoNode;
    return children.find(child_key(key, tag), [&](uint32_t c) {
      return page_size_ == 1 && tag == 0 ? nodes_[c].extra == 0 : same(c);
    });
  }

  // The tag of the page at token pos of a key (tags: one per page, or null).
  uint64_t tag_at(const uint64_t* tags, uint64_t pos) const {
    return tags == nullptr ? 0 : tags[pos / page_size_];
  }

  // matched() for the child c that find_child gave for key[pos, n): with
  // tags, also where the key has a tagged page, which the untagged pages
  // after a node's first can never be.
  uint64_t common(uint32_t c, const Token* key, uint64_t pos, uint64_t n,
                  const uint64_t* tags) const {
    const uint64_t m = matched(c, key + pos, n - pos);
    if (tags == nullptr) return m;
    const uint64_t* own = tags + pos / page_size_;
    for (uint64_t k = 1; k * page_size_ < m; ++k)
      if (own[k] != 0) return k * page_size_;
    return m;
  }

  // Whole-page common prefix of child c's label and key[0, n), for a child
  // that find_child returned: its first page is known to match already, so
  // a one-page node (every block-event node) costs no second comparison.
  uint64_t matched(uint32_t c, const Token* key, uint64_t n) const {
    const MetaNode& cn = nodes_[c];
    const uint64_t limit = std::min<uint64_t>(cn.length, n);
    if (limit == page_size_) return limit;  // one-page nodes: nothing left to compare
    const uint64_t m = page_size_ + detail::common_prefix(cn.label + page_size_, key + page_size_,
                                                          limit - page_size_);
    return m - m % page_size_;
  }

  // match's walk down key[0, n) from root: drops the workers that stop
  // holding, and leaves in *pos the tokens of the whole nodes matched and in
  // *partial those matched inside the last one. kTags: the key or the tree
  // has tags (a tree without any never needs a tag compared); kHost: the
  // lengths on either tier are wanted too (a second set of workers still in).
  // kOverlay: holds count too (the tree has some). `record`: path_ gets the
  // nodes entered.
  template <bool kTags, bool kHost, bool kOverlay>
  void match_walk(uint32_t root, const Token* key, uint64_t n, const uint64_t* tags, bool record,
                  int64_t* lengths, int64_t* host_lengths, uint64_t* pos_out,
                  uint64_t* partial) {
    uint64_t pos = 0;
    uint32_t c = child_at<kTags>(root, key, 0, tags);
    while (c != kNoNode) {
      const MetaNode& cn = nodes_[c];
      const uint64_t m = kTags ? common(c, key, pos, n, tags) : matched(c, key + pos, n - pos);
      // Find the next node before reading this one's holders: the two chains
      // of cache misses then overlap instead of queueing one behind the other.
      const bool whole = m == cn.length;
      const uint32_t next = whole && pos + m < n ? child_at<kTags>(c, key, pos + m, tags) : kNoNode;
      const LocationSet* held = kOverlay && cn.overlaid ? &overlays_[*overlay_of_.find(c)].workers
                                                        : nullptr;
      if (!active_.empty()) drop_non_holders<false>(cn, held, pos, lengths, alive_, active_);
      if (kHost && !host_active_.empty())
        drop_non_holders<true>(cn, held, pos, host_lengths, host_alive_, host_active_);
      if (record) path_.push_back(c);
      if (!whole) {
        *partial = m;
        break;
      }
      pos += m;
      c = next;
    }
    *pos_out = pos;
  }

  // The child of parent for the key's page at token pos (tags as for insert).
  template <bool kTags>
  uint32_t child_at(uint32_t parent, const Token* key, uint64_t pos, const uint64_t* tags) const {
    if (kTags) return find_child(parent, key + pos, tag_at(tags, pos));
    return detail::find_child(nodes_[parent].children, key + pos, page_size_,
                              [&](uint32_t c) { return nodes_[c].label; });
  }

  // Workers still matching (alive: a bit per index; active: the nonzero
  // words) that do not hold node n on the device (kEither: nor on the host)
  // stop at depth pos.
  // `held`: the workers with a hold on n, when they count (else null).
  template <bool kEither>
  static void drop_non_holders(const MetaNode& n, const LocationSet* held, uint64_t pos,
                               int64_t* lengths, std::vector<uint64_t>& alive,
                               std::vector<uint32_t>& active) {
    const uint32_t held_words = n.holders.word_count();
    const uint32_t host_words = kEither ? n.host.word_count() : 0;
    const uint32_t hold_words = held == nullptr ? 0 : held->word_count();
    size_t keep = 0;
    for (uint32_t i : active) {
      uint64_t have = i < held_words ? n.holders.word(i) : 0;
      if (kEither && i < host_words) have |= n.host.word(i);
      if (i < hold_words) have |= held->word(i);
      for (uint64_t drop = alive[i] & ~have; drop != 0; drop &= drop - 1)
        lengths[i * 64 + __builtin_ctzll(drop)] = static_cast<int64_t>(pos);
      alive[i] &= have;
      if (alive[i] != 0) active[keep++] = i;
    }
    active.resize(keep);
  }

  // match(touch=True): each approximate worker's counted pages take a new stamp.
  // Workers at slots or above were not matched (see match) and are not refreshed.
  void touch_counted(const int64_t* lengths, uint32_t slots, uint64_t pos, uint64_t partial) {
    ++clock_;
    if (approximate_.empty() || path_.empty()) return;
    if (partial != 0) {
      // The last node is matched only in part; cut it if some approximate
      // worker counts into it, so that only the counted part is refreshed.
      const uint32_t last = path_.back();
      for (uint32_t w : approximate_) {
        if (w < slots && static_cast<uint64_t>(lengths[w]) == pos + partial) {
          path_.back() = split(last, static_cast<uint32_t>(partial));
          break;
        }
      }
    }
    for (uint32_t w : approximate_) {
      if (w >= slots) continue;
      const uint64_t counted = static_cast<uint64_t>(lengths[w]);
      for (uint32_t x : path_) {
        if (nodes_[x].depth > counted) break;
        stamp(w, x);
      }
    }
  }

  // Every node on key[0, n)'s path from root that w holds takes the current stamp.
  void refresh_path(uint32_t w, uint32_t root, const Token* key, uint64_t n,
                    const uint64_t* tags) {
    uint32_t node = root;
    uint64_t pos = 0;
    while (node != kNoNode && pos < n) {
      const uint32_t c = find_child(node, key + pos, tag_at(tags, pos));
      if (c == kNoNode) return;
      // Only whole nodes on the key's path: the insert cut where recency differs.
      if (nodes_[c].depth > n || common(c, key, pos, n, tags) < nodes_[c].length) return;
      if (holds(w, c, 0)) stamp(w, c);
      node = c;
      pos = nodes_[c].depth;
    }
  }

  void stamp(uint32_t w, uint32_t x) {
    Worker& wk = workers_[w];
    *wk.stamps.find(x) = clock_;
    push_lru(wk, x, clock_);
  }

  void push_lru(Worker& wk, uint32_t x, uint64_t stamp) {
    wk.lru.push_back({stamp, nodes_[x].depth, x});
    std::push_heap(wk.lru.begin(), wk.lru.end(), LruLater());
    if (wk.lru.size() > 2 * wk.stamps.size() + 64) {
      // Stale entries (re-stamped or unmarked nodes) are skipped when they
      // surface; rebuilding once they outnumber live ones keeps the heap O(held).
      wk.lru.clear();
      wk.stamps.for_each([&](uint32_t y, uint64_t s) { wk.lru.push_back({s, nodes_[y].depth, y}); });
      std::make_heap(wk.lru.begin(), wk.lru.end(), LruLater());
    }
  }

  // Trims an approximate worker to its capacity, least recent and deepest first.
  void evict(uint32_t w) {
    Worker& wk = workers_[w];
    bool freed = false;
    while (wk.held_tokens > wk.capacity) {
      require(!wk.lru.empty(), "an approximate worker's recency heap lost a node");
      const LruEntry e = wk.lru.front();
      std::pop_heap(wk.lru.begin(), wk.lru.end(), LruLater());
      wk.lru.pop_back();
      const uint64_t* stamp = wk.stamps.find(e.node);
      if (stamp == nullptr || *stamp != e.stamp || nodes_[e.node].depth != e.depth)
        continue;  // stale entry
      const uint64_t excess = wk.held_tokens - wk.capacity;
      const uint64_t pages = (excess + page_size_ - 1) / page_size_;
      const uint32_t x = e.node;
      const uint64_t have = nodes_[x].length / page_size_;
      if (have > pages) split(x, static_cast<uint32_t>((have - pages) * page_size_));
      unmark(w, x, 0);
      prune(x);
      freed = true;
    }
    if (freed) maybe_compact();
  }

  // The nodes w holds, each once (the lazy list cleaned on the way).
  std::vector<uint32_t> held_nodes(uint32_t w) const {
    const Worker& wk = workers_[w];
    std::vector<uint32_t> out;
    out.reserve(wk.marked.size());
    for (uint32_t x : wk.marked)
      if (nodes_[x].alive && holds_any(w, x)) out.push_back(x);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // w holds x on `tier` now; `by_shared_hash`: and names it by its shared
  // hash (if it did not hold it on the other tier, whose naming stands).
  void mark(uint32_t w, uint32_t x, uint32_t tier, bool by_shared_hash = false) {
    Worker& wk = workers_[w];
    MetaNode& n = nodes_[x];
    const bool first = !holds_any(w, x);
    if (tier != 0) {
      n.host.set(w);
      wk.host_tokens += n.length;
      ++host_marks_;
    } else {
      n.holders.set(w);
      wk.held_tokens += n.length;
      if (wk.approximate()) {
        wk.stamps.put(x, clock_);
        push_lru(wk, x, clock_);
      }
    }
    if (first) {  // after the mark: compacting the list keeps only what w holds
      if (n.shared && !by_shared_hash) n.unnamed.set(w);
      ++wk.held_count;
      wk.marked.push_back(x);
      if (wk.marked.size() > 2 * wk.held_count + 64) wk.marked = held_nodes(w);
    }
  }

  // w no longer holds x on `tier`; its name for x goes with its last tier.
  void unmark(uint32_t w, uint32_t x, uint32_t tier) {
    Worker& wk = workers_[w];
    MetaNode& n = nodes_[x];
    const bool last = !(tier == 0 ? n.host : n.holders).test(w);
    if (last) unbind(w, x);  // while w still holds x: unbind reads its naming
    if (tier != 0) {
      n.host.reset(w);
      wk.host_tokens -= n.length;
      --host_marks_;
    } else {
      n.holders.reset(w);
      wk.held_tokens -= n.length;
      if (wk.approximate()) wk.stamps.erase(x);
    }
    if (last) {
      n.unnamed.reset(w);
      --wk.held_count;
    }
  }

  // The one-page node that w names by hash, or kNoNode.
  uint32_t named_node(uint32_t w, uint64_t hash) const {
    const uint32_t* x = shared_.find(hash);
    if (x != nullptr && names_shared(nodes_[*x], w)) return *x;
    return own_name(w, hash);
  }
  uint32_t own_name(uint32_t w, uint64_t hash) const {
    const Worker& wk = workers_[w];
    if (wk.own_blocks.empty()) return kNoNode;
    const uint32_t* own = wk.own_blocks.find(hash);
    return own == nullptr ? kNoNode : *own;
  }

  // The hash w names node x by, if any, into *hash.
  bool name_of(uint32_t w, uint32_t x, uint64_t* hash) const {
    if (names_shared(nodes_[x], w)) {
      *hash = nodes_[x].hash;
      return true;
    }
    const Worker& wk = workers_[w];
    const uint64_t* own = wk.own_hash_of.empty() ? nullptr : wk.own_hash_of.find(x);
    if (own == nullptr) return false;
    *hash = *own;
    return true;
  }

  bool names_shared(const MetaNode& n, uint32_t w) const {
    return n.shared && (n.holders.test(w) || n.host.test(w)) && !n.unnamed.test(w);
  }
  bool any_namer(const MetaNode& n) const {
    if (!n.shared) return false;
    // Some holder, on either tier, not listed as unnamed: an early exit, where
    // counting both sets would read every word.
    const uint32_t words = std::max(n.holders.word_count(), n.host.word_count());
    for (uint32_t i = 0; i < words; ++i) {
      const uint64_t dev = i < n.holders.word_count() ? n.holders.word(i) : 0;
      const uint64_t host = i < n.host.word_count() ? n.host.word(i) : 0;
      const uint64_t unnamed = i < n.unnamed.word_count() ? n.unnamed.word(i) : 0;
      if (((dev | host) & ~unnamed) != 0) return true;
    }
    return false;
  }

  // Names one-page node x of w by hash (dropping the name it had before).
  // Uses the node's shared hash when that is free or equal, else a name of
  // w's own. The caller made sure w names no other node by this hash.
  void bind(uint32_t w, uint32_t x, uint64_t hash) {
    MetaNode& n = nodes_[x];
    Worker& wk = workers_[w];
    if (names_shared(n, w) && n.hash == hash) return;
    const uint64_t* own = wk.own_hash_of.empty() ? nullptr : wk.own_hash_of.find(x);
    if (own != nullptr && *own == hash) return;
    unbind(w, x);
    if (!n.shared && !shared_.contains(hash)) {
      n.shared = true;
      n.hash = hash;
      shared_.put(hash, x);
      const auto unnamed = [&](uint32_t v) {
        if (v != w) n.unnamed.set(v);  // they hold it, but never named it so
      };
      n.holders.for_each(unnamed);
      n.host.for_each(unnamed);
      return;
    }
    if (n.shared && n.hash == hash) {
      n.unnamed.reset(w);
      return;
    }
    wk.own_blocks.put(hash, x);
    wk.own_hash_of.put(x, hash);
  }

  // Drops w's block hash for node x, if it has one (w keeps holding x).
  void unbind(uint32_t w, uint32_t x) {
    MetaNode& n = nodes_[x];
    if (names_shared(n, w)) {
      n.unnamed.set(w);
      if (!any_namer(n)) {
        shared_.erase(n.hash);
        n.shared = false;
        n.unnamed.clear();
      }
      return;
    }
    Worker& wk = workers_[w];
    if (wk.own_hash_of.empty()) return;
    const uint64_t* own = wk.own_hash_of.find(x);
    if (own == nullptr) return;
    wk.own_blocks.erase(*own);
    wk.own_hash_of.erase(x);
  }

  // Flags, for mark_repeats' caller, every block whose hash appears earlier in the event.
  void mark_repeats(const uint64_t* hashes, uint32_t n) {
    repeat_.assign(n, 0);
    if (n <= 16) {
      for (uint32_t i = 1; i < n; ++i)
        for (uint32_t j = 0; j < i && !repeat_[i]; ++j) repeat_[i] = hashes[i] == hashes[j];
      return;
    }
    order_.resize(n);
    for (uint32_t i = 0; i < n; ++i) order_[i] = {hashes[i], i};
    std::sort(order_.begin(), order_.end());
    for (uint32_t i = 1; i < n; ++i)
      if (order_[i].first == order_[i - 1].first) repeat_[order_[i].second] = 1;
  }

  // Cuts node c after m tokens; returns the new upper node, which copies c's
  // holders and their stamps. c keeps its id as the lower part.
  uint32_t split(uint32_t c, uint32_t m) {
    const uint32_t u = nodes_.allocate();
    MetaNode& cn = nodes_[c];
    MetaNode& un = nodes_[u];
    un.holders = cn.holders;
    un.host = cn.host;
    un.alive = true;
    un.ns = cn.ns;
    un.extra = 0;  // only untagged nodes have more than one page to cut
    un.overlaid = false;
    detail::cut_edge(nodes_, c, u, m, page_size_);
    ++node_count_;
    if (cn.overlaid) {  // both parts are covered by the same holds
      const uint32_t slot = new_overlay(u);
      overlays_[slot] = overlays_[*overlay_of_.find(c)];
    }
    cn.holders.for_each([&](uint32_t w) {  // c is never shared: named nodes are one page
      Worker& wk = workers_[w];
      ++wk.held_count;
      wk.marked.push_back(u);
      if (wk.approximate()) {
        const uint64_t stamp = *wk.stamps.find(c);
        wk.stamps.put(u, stamp);
        push_lru(wk, u, stamp);
      }
    });
    cn.host.for_each([&](uint32_t w) {
      ++host_marks_;
      if (cn.holders.test(w)) return;  // counted above
      ++workers_[w].held_count;
      workers_[w].marked.push_back(u);
    });
    return u;
  }

  // Adds key[from, to) below parent as new nodes: a run of untagged pages is
  // one node, a tagged page a node of its own (tags: one per page of the
  // key, or null). Marks each for w on `tier` unless w is kNoWorker; returns
  // the last.
  uint32_t add_path(uint32_t parent, const Token* key, uint64_t from, uint64_t to,
                    const uint64_t* tags, uint32_t w, uint32_t tier) {
    while (from < to) {
      const uint64_t tag = tag_at(tags, from);
      uint64_t end = from + page_size_;
      if (tag == 0)
        while (end < to && tag_at(tags, end) == 0) end += page_size_;
      parent = add_leaf(parent, key + from, static_cast<uint32_t>(end - from), tag);
      if (w != kNoWorker) mark(w, parent, tier);
      from = end;
    }
    return parent;
  }

  uint32_t add_leaf(uint32_t parent, const Token* key, uint32_t len, uint64_t tag) {
    const LabelRef ref = arena_.allocate(key, nullptr, len);
    const uint32_t x = nodes_.allocate();
    MetaNode& xn = nodes_[x];
    xn.parent = parent;
    xn.ns = nodes_[parent].ns;
    xn.extra = tag;
    if (tag != 0) ++tagged_nodes_;
    xn.chunk = ref.chunk;
    xn.label = arena_.tokens(ref.chunk, ref.offset);
    xn.length = len;
    xn.depth = nodes_[parent].depth + len;
    xn.alive = true;
    xn.overlaid = false;
    nodes_[parent].children.add(child_key(key, tag), x);
    ++node_count_;
    return x;
  }

  // Frees x and then its ancestors while they have no holders and no
  // children, and then the root they led to if that empties a namespace.
  void prune(uint32_t x) {
    while (nodes_[x].parent != kNoNode && nodes_[x].alive && nodes_[x].children.empty() &&
           !nodes_[x].holders.any() && !nodes_[x].host.any() && !nodes_[x].overlaid) {
      MetaNode& n = nodes_[x];
      const uint32_t p = n.parent;
      nodes_[p].children.remove(child_key(n.label, n.extra), x);
      if (n.extra != 0) --tagged_nodes_;
      arena_.release(n.chunk, n.length);
      n.alive = false;
      n.children.clear();
      n.holders.clear();
      n.host.clear();
      n.unnamed.clear();
      n.shared = false;
      ++n.gen;  // kept walks that name x see it was freed
      nodes_.release(x);
      --node_count_;
      ++frees_;
      x = p;
    }
    MetaNode& r = nodes_[x];
    if (r.alive && r.parent == kNoNode && r.ns != 0 && r.children.empty()) {
      roots_.erase(r.ns);
      dropped_namespaces_.push_back(r.ns);
      r.alive = false;
      r.children.clear();
      ++r.gen;
      nodes_.release(x);
      ++frees_;
    }
  }

  // Walks key[pos, path->n) down from node (kNoNode: nowhere), appending the
  // nodes entered to *path and setting its partial.
  void walk_on(MatchPath* path, uint32_t node, uint64_t pos, const Token* key,
               const uint64_t* tags) {
    const uint64_t n = path->n;
    path->partial = 0;
    while (node != kNoNode && pos < n) {
      const uint32_t c = find_child(node, key + pos, tag_at(tags, pos));
      if (c == kNoNode) break;
      const uint64_t m = common(c, key, pos, n, tags);
      path->nodes.push_back(c);
      path->lengths.push_back(nodes_[c].length);
      path->gens.push_back(nodes_[c].gen);
      if (m < nodes_[c].length) {
        path->partial = m;
        break;
      }
      pos += m;
      node = c;
    }
  }

  // hold() on a walk that describes the tree: cuts the node the key ends or
  // leaves the tree inside, adds the pages missing, then counts the hold on
  // every node from the root to the key's end.
  uint64_t hold_path(const MatchPath& path, const Token* key, const uint64_t* tags, uint32_t w) {
    // An approximate worker's inserts are already the router's model of it.
    if (workers_[w].approximate()) throw std::invalid_argument("radixmeta: a hold needs an exact worker");
    const uint64_t n = path.n;
    uint32_t node = kNoNode;
    if (n != 0) {
      node = root_of(path.ns);
      if (node == kNoNode) node = make_root(path.ns);
      uint64_t pos = 0;
      for (size_t i = 0; i < path.nodes.size(); ++i) {
        uint32_t c = path.nodes[i];
        const bool last = i + 1 == path.nodes.size();
        if (last && path.partial != 0) c = split(c, static_cast<uint32_t>(path.partial));
        node = c;
        pos += nodes_[c].length;
      }
      if (pos < n) node = add_path(node, key, pos, n, tags, kNoWorker, 0);
      for (uint32_t x = node; nodes_[x].parent != kNoNode; x = nodes_[x].parent) {
        const uint32_t* found = overlay_of_.find(x);
        const uint32_t slot = found != nullptr ? *found : new_overlay(x);
        Overlay& o = overlays_[slot];
        auto it = std::find_if(o.counts.begin(), o.counts.end(),
                               [&](const std::pair<uint32_t, uint32_t>& e) { return e.first == w; });
        if (it != o.counts.end()) {
          ++it->second;
          continue;
        }
        o.counts.emplace_back(w, 1);
        o.workers.set(w);
        workers_[w].hold_tokens += nodes_[x].length;
      }
    }
    const uint64_t id = next_hold_++;
    holds_.put(id, Hold{node, w});
    ++workers_[w].holds;
    return id;
  }

  // An empty hold-count entry for node x (which has none); returns its slot.
  uint32_t new_overlay(uint32_t x) {
    uint32_t slot;
    if (!free_overlays_.empty()) {
      slot = free_overlays_.back();
      free_overlays_.pop_back();
    } else {
      slot = static_cast<uint32_t>(overlays_.size());
      overlays_.emplace_back();
    }
    overlay_of_.put(x, slot);
    nodes_[x].overlaid = true;
    ++overlaid_nodes_;
    return slot;
  }

  void free_overlay(uint32_t x, uint32_t slot) {
    overlays_[slot].counts.clear();
    overlays_[slot].workers.clear();
    free_overlays_.push_back(slot);
    overlay_of_.erase(x);
    nodes_[x].overlaid = false;
    --overlaid_nodes_;
  }

  // refresh_path for the nodes from the root down to `deepest` (a node that
  // ends within the key, or kNoNode): each one w holds takes the current
  // stamp, root first, as refresh_path gives them.
  void refresh_chain(uint32_t w, uint32_t deepest) {
    chain_.clear();
    for (uint32_t x = deepest; x != kNoNode && nodes_[x].parent != kNoNode; x = nodes_[x].parent)
      chain_.push_back(x);
    for (auto it = chain_.rbegin(); it != chain_.rend(); ++it)
      if (holds(w, *it, 0)) stamp(w, *it);
  }

  // Moves labels out of sparse arena chunks once garbage outweighs half the
  // live tokens (as RadixTree does): amortised O(1) per freed token.
  void maybe_compact() {
    const size_t garbage = arena_.garbage_tokens();
    if (garbage <= LabelArena::kDefaultChunkTokens || garbage * 2 <= arena_.live_tokens()) return;
    if (arena_.begin_evacuation() == 0) return;
    for (uint32_t x : nodes_in_order()) {
      MetaNode& n = nodes_[x];
      if (!arena_.evacuating(n.chunk)) continue;
      const LabelRef ref = arena_.allocate(n.label, nullptr, n.length);
      arena_.release(n.chunk, n.length);
      n.chunk = ref.chunk;
      n.label = arena_.tokens(ref.chunk, ref.offset);
    }
  }

  uint32_t page_size_;
  LabelArena arena_;
  NodePool<MetaNode> nodes_;
  uint32_t root_ = kNoNode;
  uint32_t node_count_ = 0;
  uint32_t tagged_nodes_ = 0;  // nodes with an extra tag: while 0, matches compare none
  uint64_t host_marks_ = 0;
  uint64_t clock_ = 0;
  std::vector<Worker> workers_;
  std::vector<uint64_t> live_mask_{0};
  std::vector<uint32_t> approximate_;  // indices of live approximate workers
  FlatMap<uint64_t, uint32_t> shared_;  // shared block hash -> the node it names
  struct RootEntry {
    uint32_t node;
    uint64_t serial;  // creation order, for namespace_ids()
  };
  std::unordered_map<uint32_t, RootEntry> roots_;  // namespace id -> root (not the default's)
  uint64_t root_serial_ = 0;
  std::vector<uint32_t> dropped_namespaces_;
  // Scratch reused across calls (no allocation on the hot path).
  std::vector<uint64_t> alive_, host_alive_;
  std::vector<uint32_t> active_, host_active_;
  std::vector<uint32_t> path_;
  std::vector<uint32_t> chain_;
  MatchPath scratch_path_;
  // Holds: per node that some hold covers, the workers' counts (a slot of
  // overlays_, found through overlay_of_; the node's `overlaid` flag says
  // whether to look), and per hold its worker and the node at its key's end.
  struct Overlay {
    LocationSet workers;                                 // those with a count
    std::vector<std::pair<uint32_t, uint32_t>> counts;  // (worker, holds covering the node)
  };
  struct Hold {
    uint32_t node = kNoNode;  // kNoNode: a hold of no whole page
    uint32_t worker = 0;
  };
  FlatMap<uint32_t, uint32_t> overlay_of_;
  std::vector<Overlay> overlays_;
  std::vector<uint32_t> free_overlays_;
  uint64_t overlaid_nodes_ = 0;
  FlatMap<uint64_t, Hold> holds_;
  uint64_t next_hold_ = 0;  // ids are never reused, so a released one stays stale
  uint64_t frees_ = 0;  // nodes (and roots) freed so far: a MatchPath taken before may name reused ids
  std::vector<uint8_t> repeat_;
  std::vector<uint32_t> landing_;  // check_stored -> apply_stored: blocks' existing nodes
  std::vector<std::pair<uint64_t, uint32_t>> order_;
};

}  // namespace radixmeta
