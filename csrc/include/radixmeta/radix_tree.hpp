// radixmeta's core: the worker's KV cache, a compressed radix tree over
// uint32 token ids with values per token, locks and eviction.
//
// Header-only C++17 with no Python dependency. The router's meta-tree is a
// class of its own (meta_tree.hpp) built from the same parts: label arena,
// node pool, children tables and page helpers.
//
// Rules shared with the pure-Python reference (radixmeta/_reference.py); the
// tests drive both side by side and require identical results:
//  * Keys are cut down to whole pages of page_size tokens before use.
//  * A logical clock advances by one at the start of every match_prefix and
//    insert; nodes on the walked path take that stamp as their last access.
//  * Hit counts (kept only under LFU, the one order that reads them) count
//    inserts, as SGLang's trees do: an insert adds one to every node on its
//    walked path that ends past its first `counted` tokens, and its new leaf
//    starts at one (zero if the key ends within `counted`). match_prefix
//    counts nothing.
//  * match_prefix splits the edge where the match ends inside it. A match of
//    length 0 names node 0, the default namespace's root, whatever the
//    namespace.
//  * A namespace other than the default has a root only while it holds a
//    page: an insert of no whole page creates none, and the eviction of its
//    last leaf frees the root (its id is reported by take_dropped_namespaces).
//  * Every new node (a new leaf, or the upper half of a split) takes the next
//    serial number. The upper half of a split copies the lock count, hit
//    count, last access, creation stamp and priority of the node it was cut
//    from (the creation stamp as SGLang's default UnifiedRadixCache keeps it;
//    its legacy RadixCache stamps the upper half as new); the lower half keeps
//    its id (so handles to it stay valid) and the locks taken on it.
//  * unlock(id) releases a lock taken on that very node; a count that only
//    comes from locked descendants is not its to release.
//  * The eviction order is ascending by key: lru (last access, serial),
//    lfu (hit count, last access, serial), fifo (creation, serial), priority
//    (priority, last access, serial). Serials are unique, so ties cannot occur.
//
// There is no clock, randomness or callback into foreign code besides an
// optional TreeObserver that sees stored and removed nodes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "children.hpp"
#include "evict_heap.hpp"
#include "label_arena.hpp"
#include "node_pool.hpp"
#include "paging.hpp"
#include "sentinels.hpp"
#include "tokens.hpp"

namespace radixmeta {


enum class EvictionPolicy : uint8_t { kLru = 0, kLfu = 1, kFifo = 2, kPriority = 3 };

// 128 bytes, aligned to cache lines. The first line holds everything a walk
// down (match, insert) or up (lock, unlock, path values) reads, so a step
// costs one line; the second holds what eviction order and handles need.
struct alignas(64) Node {
  const Token* label = nullptr;  // the edge's tokens, inside arena chunk `chunk`
  uint32_t length = 0;           // tokens on the edge into this node
  uint32_t parent = kNoNode;     // kNoNode exactly for roots
  Children children;
  uint32_t lock_count = 0;
  uint32_t chunk = 0;
  uint64_t last_access = 0;
  // -- second cache line --
  uint64_t generation = 0;  // bumped when freed: 64 bits never wrap in practice
  int64_t priority = 0;
  uint64_t created = 0;
  uint64_t serial = 0;
  uint32_t ns = 0;         // a root's namespace id
  uint32_t hit_count = 0;  // inserts through it; kept only under LFU (its one reader); saturates
  uint32_t depth = 0;      // tokens from the root to the end of this node
  uint32_t own_locks = 0;  // locks taken on this node itself (lock_count adds descendants')
  bool alive = false;
  bool is_root = false;
};
static_assert(sizeof(Node) == 128, "Node should stay two cache lines");

struct MatchOutcome {
  uint32_t node;
  uint64_t length;
};

struct InsertOutcome {
  uint64_t prefix_length = 0;  // tokens that were already cached
  bool fits = true;            // false: capacity could not be met, nothing changed
  uint64_t new_tokens = 0;     // tokens the insert would add
  uint64_t evictable = 0;      // when !fits: evictable tokens besides the insert's own path
};

struct TreeStats {
  uint64_t lookups = 0;
  uint64_t hit_tokens = 0;
  uint64_t inserted_tokens = 0;
  uint64_t evicted_tokens = 0;
};

class RadixTree;

// Sees every node that becomes cached (after it is linked) and every node
// about to be removed (while its path can still be read), and resets.
class TreeObserver {
 public:
  virtual ~TreeObserver() = default;
  virtual void stored(const RadixTree& tree, uint32_t node) = 0;
  virtual void removed(const RadixTree& tree, uint32_t node) = 0;
  virtual void cleared(const RadixTree& tree) = 0;
};

namespace detail {

// Copies n elements; an inline loop for the short runs typical of edges
// (a libc memcpy call costs more than copying a few dozen values).
inline void copy_short(const Value* src, size_t n, Value* dst) {
  if (n > 64) {
    copy_values(src, dst, n);
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}

}  // namespace detail

class RadixTree {
 public:
  RadixTree(uint32_t page_size, EvictionPolicy policy, bool store_values = true,
            uint64_t capacity = kNoCapacity)
      : page_size_(page_size), policy_(policy), capacity_(capacity), arena_(store_values) {
    if (page_size == 0) throw std::invalid_argument("radixmeta: page_size must be >= 1");
    make_root(0);
  }

  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  // -- configuration and counters -------------------------------------------
  uint32_t page_size() const { return page_size_; }
  EvictionPolicy policy() const { return policy_; }
  bool store_values() const { return arena_.with_values(); }
  uint64_t capacity() const { return capacity_; }
  // When a match or insert splits a node, whether the lower half (the tokens
  // past the cut) also takes the walk's access stamp. Off by default.
  bool refresh_split_tail() const { return refresh_split_tail_; }
  void set_refresh_split_tail(bool on) { refresh_split_tail_ = on; }
  uint64_t epoch() const { return epoch_; }
  uint64_t clock() const { return clock_; }
  uint64_t evictable_size() const { return evictable_; }
  uint64_t protected_size() const { return protected_; }
  uint64_t total_size() const { return evictable_ + protected_; }
  uint64_t node_count() const { return node_count_; }
  const TreeStats& stats() const { return stats_; }
  // How many times the label arena was compacted (for tests and diagnostics).
  uint64_t evacuations() const { return evacuations_; }
  void set_observer(TreeObserver* observer) { observer_ = observer; }

  // -- node access --------------------------------------------------------------
  // A handle (id, generation, epoch) still names the node it was made for.
  // reset() frees every node block, so generations restart: the epoch tells
  // handles from before a reset apart.
  bool is_valid(uint32_t id, uint64_t generation, uint64_t epoch) const {
    return epoch == epoch_ && id < nodes_.size() && nodes_[id].alive &&
           nodes_[id].generation == generation;
  }
  const Node& node(uint32_t id) const { return nodes_[id]; }
  const Token* label_tokens(uint32_t id) const {
    const Node& n = nodes_[id];
    return n.label;
  }
  // The root of namespace ns, or kNoNode if nothing was ever inserted there.
  uint32_t root_of(uint32_t ns) const {
    if (ns == 0) return 0;
    auto it = roots_.find(ns);
    return it == roots_.end() ? kNoNode : it->second;
  }

  // Writes the values of the whole path root..id (node(id).depth of them).
  void path_values(uint32_t id, Value* out) const {
    if (!store_values()) throw std::logic_error("radixmeta: this tree stores no values");
    size_t end = nodes_[id].depth;
    for (uint32_t w = id; nodes_[w].parent != kNoNode; w = nodes_[w].parent) {
      const Node& n = nodes_[w];
      end -= n.length;
      detail::copy_short(arena_.values_for(n.chunk, n.label), n.length, out + end);
    }
  }
  void path_tokens(uint32_t id, Token* out) const {
    size_t end = nodes_[id].depth;
    for (uint32_t w = id; nodes_[w].parent != kNoNode; w = nodes_[w].parent) {
      const Node& n = nodes_[w];
      end -= n.length;
      std::memcpy(out + end, n.label, size_t{n.length} * sizeof(Token));
    }
  }

  // -- the operations -------------------------------------------------------------
  // Longest cached prefix of key[0..n) (cut to whole pages) in namespace ns.
  MatchOutcome match_prefix(uint32_t ns, const Token* key, size_t n) {
    n -= n % page_size_;
    detail::check_key_length(n);
    ++clock_;
    ++stats_.lookups;
    const uint32_t root = root_of(ns);
    if (root == kNoNode) return {0, 0};
    const Walk w = walk<WalkMode::kMatch>(root, key, n, 0, 0);
    stats_.hit_tokens += w.length;
    // Namespace roots never escape as handles, so an emptied one can be freed.
    return w.length == 0 ? MatchOutcome{0, 0} : MatchOutcome{w.node, w.length};
  }

  // Stores key[0..n) (cut to whole pages) with its values (null: the tokens
  // themselves). Returns how much was already cached. With a capacity, first
  // evicts to make room; if that is impossible, returns fits=false unchanged.
  // `counted`: leading tokens of key whose nodes an earlier insert by the same
  // caller already counted as a hit (SGLang's inserted_len); see the file comment.
  InsertOutcome insert(uint32_t ns, const Token* key, const Value* values, size_t n,
                       int64_t priority, uint64_t counted = 0) {
    n -= n % page_size_;
    detail::check_key_length(n);
    InsertOutcome out;
    if (capacity_ != kNoCapacity && !make_room(ns, key, n, &out)) return out;
    ++clock_;
    uint32_t root = root_of(ns);
    if (root == kNoNode) {
      if (n == 0) return out;  // an empty namespace costs nothing
      root = make_root(ns);
    }
    const Walk w = walk<WalkMode::kInsert>(root, key, n, priority, counted);
    out.prefix_length = w.length;
    if (w.length < n) {
      add_leaf(w.node, key + w.length, values == nullptr ? nullptr : values + w.length,
               static_cast<uint32_t>(n - w.length), priority,
               policy_ == EvictionPolicy::kLfu && n > counted ? 1 : 0);
    }
    return out;
  }

  // Adds a lock on id and every ancestor below the root.
  void lock(uint32_t id) {
    if (!nodes_[id].is_root) ++nodes_[id].own_locks;
    for (uint32_t w = id; nodes_[w].parent != kNoNode; w = nodes_[w].parent) {
      Node& n = nodes_[w];
      if (n.lock_count == 0) {
        evictable_ -= n.length;
        protected_ += n.length;
        // Only a leaf can be in the heap; testing that first saves a lookup
        // in the heap's position array (a cache miss) for every inner node.
        if (n.children.empty() && heap_.contains(w)) heap_.remove(w);
      }
      ++n.lock_count;
    }
  }

  void unlock(uint32_t id) {
    // Only a lock taken on this very node may be released through it: a
    // count that comes from a locked descendant is not this node's to drop.
    if (!nodes_[id].is_root && nodes_[id].own_locks == 0)
      throw std::logic_error("radixmeta: node is not locked");
    if (!nodes_[id].is_root) --nodes_[id].own_locks;
    for (uint32_t w = id; nodes_[w].parent != kNoNode; w = nodes_[w].parent) {
      Node& n = nodes_[w];
      if (--n.lock_count == 0) {
        evictable_ += n.length;
        protected_ -= n.length;
        if (n.children.empty()) heap_.push(w, key_of(n));
      }
    }
  }

  // Frees unlocked leaves in eviction order until at least num_tokens are
  // freed or nothing is evictable; appends their values to *freed if given.
  uint64_t evict(uint64_t num_tokens, std::vector<Value>* freed) {
    uint64_t done = 0;
    while (done < num_tokens && !heap_.empty()) {
      const uint32_t x = heap_.top();
      heap_.remove(x);
      if (observer_ != nullptr) observer_->removed(*this, x);
      Node& xn = nodes_[x];
      if (freed != nullptr && store_values()) {
        const Value* v = arena_.values_for(xn.chunk, xn.label);
        freed->insert(freed->end(), v, v + xn.length);
      }
      const uint32_t p = xn.parent;
      nodes_[p].children.remove(page_key(xn.label), x);
      evictable_ -= xn.length;
      done += xn.length;
      free_node(x);
      Node& pn = nodes_[p];
      if (!pn.is_root && pn.lock_count == 0 && pn.children.empty()) heap_.push(p, key_of(pn));
      if (pn.is_root && p != 0 && pn.children.empty()) drop_root(p);
    }
    stats_.evicted_tokens += done;
    maybe_compact();
    return done;
  }

  // Values freed by capacity-driven eviction in insert, not yet taken. The
  // binding swaps them out after every insert, so they never outlive a call.
  const std::vector<Value>& pending_evicted() const { return pending_evicted_; }
  std::vector<Value>& pending_evicted_mutable() { return pending_evicted_; }

  // Ids of the namespaces whose roots eviction freed since the last call
  // (the binding recycles them). An id may have a root again by now.
  std::vector<uint32_t> take_dropped_namespaces() { return std::exchange(dropped_namespaces_, {}); }

  // Appends the values of every node of namespace ns to *out, in key order
  // (a node before its children).
  void values_in_order(uint32_t ns, std::vector<Value>* out) const {
    if (!store_values()) throw std::logic_error("radixmeta: this tree stores no values");
    visit_sorted(ns, [&](uint32_t id, uint32_t) {
      const Node& n = nodes_[id];
      const Value* v = arena_.values_for(n.chunk, n.label);
      out->insert(out->end(), v, v + n.length);
    });
  }

  // Forgets everything; handles from before are told apart by the epoch.
  void reset() {
    if (observer_ != nullptr) observer_->cleared(*this);
    nodes_.clear();
    heap_.clear();
    arena_.clear();
    roots_.clear();
    pending_evicted_.clear();
    dropped_namespaces_.clear();
    ++epoch_;
    clock_ = serial_ = 0;
    evictable_ = protected_ = node_count_ = 0;
    stats_ = TreeStats{};
    make_root(0);
  }

  // Leaves of namespace ns, in lexicographic order of their paths.
  std::vector<uint32_t> leaves_in_order(uint32_t ns) const {
    std::vector<uint32_t> out;
    visit_sorted(ns, [&](uint32_t id, uint32_t) {
      if (nodes_[id].children.empty()) out.push_back(id);
    });
    return out;
  }

  // (node, level) for every node below the root of ns, depth first, siblings
  // in lexicographic order.
  std::vector<std::pair<uint32_t, uint32_t>> structure(uint32_t ns) const {
    std::vector<std::pair<uint32_t, uint32_t>> out;
    visit_sorted(ns, [&](uint32_t id, uint32_t level) { out.emplace_back(id, level); });
    return out;
  }

  std::vector<uint32_t> namespace_ids() const {
    std::vector<uint32_t> out{0};
    for (const auto& entry : roots_) out.push_back(entry.first);
    std::sort(out.begin(), out.end());
    return out;
  }

  // Bytes held by the tree: node blocks, label arena, heap, side tables.
  size_t memory_usage() const {
    size_t bytes = sizeof(*this) + nodes_.memory_bytes() + arena_.memory_bytes() +
                   heap_.memory_bytes() +
                   pending_evicted_.capacity() * sizeof(Value) +
                   roots_.size() * 32 + roots_.bucket_count() * sizeof(void*);
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
      const Node& n = nodes_[i];
      if (n.alive) bytes += n.children.heap_bytes();
    }
    return bytes;
  }

  // O(n) consistency check; throws std::logic_error naming the first violation.
  void check_invariants() const {
    uint64_t evictable = 0, protected_tokens = 0, nodes = 0, label_tokens = 0, alive = 0;
    uint64_t heap_members = 0;
    std::vector<uint32_t> stack;
    for (uint32_t i = 0; i < nodes_.size(); ++i) alive += nodes_[i].alive ? 1 : 0;
    for (uint32_t ns : namespace_ids()) {
      const uint32_t root = root_of(ns);
      const Node& r = nodes_[root];
      require(r.alive && r.is_root && r.parent == kNoNode && r.length == 0 && r.depth == 0,
              "a root is malformed");
      require(!heap_.contains(root) && r.lock_count == 0, "a root is locked or evictable");
      require(r.ns == ns && (ns == 0 || !r.children.empty()), "an emptied namespace kept its root");
      stack.push_back(root);
      while (!stack.empty()) {
        const uint32_t id = stack.back();
        stack.pop_back();
        const Node& n = nodes_[id];
        uint64_t child_locks = 0;
        n.children.for_each([&](uint32_t first, uint32_t c) {
          const Node& cn = nodes_[c];
          require(cn.alive && !cn.is_root, "a child is not a live node");
          require(cn.parent == id, "a child's parent link is wrong");
          require(page_key(cn.label) == first, "a child is filed under the wrong key");
          child_locks += cn.lock_count;
          stack.push_back(c);
        });
        if (n.is_root) continue;
        ++nodes;
        label_tokens += n.length;
        require(n.length > 0 && n.length % page_size_ == 0, "a label is not whole pages");
        require(n.depth == nodes_[n.parent].depth + n.length, "a depth is wrong");
        require(n.lock_count == n.own_locks + child_locks,
                "a lock count differs from its own locks plus its children's");
        (n.lock_count > 0 ? protected_tokens : evictable) += n.length;
        const bool evictable_leaf = n.lock_count == 0 && n.children.empty();
        require(evictable_leaf == heap_.contains(id), "heap membership is wrong");
        if (evictable_leaf) {
          require(heap_.key_of(id) == key_of(n), "a heap key is stale");
          ++heap_members;
        }
      }
    }
    require(nodes == node_count_, "node_count is wrong");
    require(alive == nodes + 1 + roots_.size(), "a live node is unreachable");
    require(evictable == evictable_, "evictable_size is wrong");
    require(protected_tokens == protected_, "protected_size is wrong");
    require(label_tokens == arena_.live_tokens(), "arena live count is wrong");
    require(arena_.counters_consistent(), "arena counters are inconsistent");
    require(heap_.consistent(), "the eviction heap is out of order");
    require(heap_members == heap_.size(), "the eviction heap holds a node that is not an evictable leaf");
  }

 private:
  enum class WalkMode { kMatch, kInsert, kDry };

  struct Walk {
    uint32_t node;     // last node fully on the path (after any split)
    uint64_t length;   // tokens matched
    uint32_t deepest;  // last node the walk entered, even partly (kDry's guard)
  };

  static void require(bool ok, const char* what) {
    if (!ok) throw std::logic_error(std::string("radixmeta invariant violated: ") + what);
  }


  uint32_t make_root(uint32_t ns) {
    const uint32_t id = nodes_.allocate();
    Node& r = nodes_[id];
    r.parent = kNoNode;
    r.alive = r.is_root = true;
    r.length = r.depth = 0;
    r.ns = ns;
    if (ns != 0) roots_.emplace(ns, id);
    return id;
  }

  // Frees the root of an emptied namespace (never the default one, node 0).
  void drop_root(uint32_t id) {
    Node& r = nodes_[id];
    roots_.erase(r.ns);
    dropped_namespaces_.push_back(r.ns);
    r.alive = false;
    ++r.generation;
    r.children.clear();
    nodes_.release(id);
  }

  uint32_t page_key(const Token* page) const { return detail::page_key(page, page_size_); }

  uint32_t find_child(const Node& parent, const Token* key) const {
    return detail::find_child(parent.children, key, page_size_,
                              [&](uint32_t c) { return nodes_[c].label; });
  }

  template <WalkMode mode>
  Walk walk(uint32_t root, const Token* key, uint64_t n, int64_t priority, uint64_t counted) {
    uint32_t node = root;
    uint32_t deepest = root;
    uint64_t pos = 0;
    while (pos < n) {
      uint32_t c = find_child(nodes_[node], key + pos);
      if (c == kNoNode) break;
      const Node& cn = nodes_[c];
      const uint32_t len = cn.length;
      uint64_t m = detail::common_prefix(cn.label, key + pos,
                                         std::min<uint64_t>(len, n - pos));
      if (page_size_ != 1) m -= m % page_size_;  // >= one page: find_child confirmed it
      deepest = c;
      if constexpr (mode == WalkMode::kDry) {
        pos += m;
        if (m < len) break;
        node = c;
        continue;
      }
      if (m < len) {
        const uint32_t lower = c;
        c = split(c, static_cast<uint32_t>(m));
        if (refresh_split_tail_) {  // SGLang's trees stamp the cut node before cutting it
          Node& ln = nodes_[lower];
          ln.last_access = clock_;
          if (ln.children.empty() && ln.lock_count == 0) heap_.update(lower, key_of(ln));
        }
      }
      Node& t = nodes_[c];
      t.last_access = clock_;
      if constexpr (mode == WalkMode::kInsert) {
        t.priority = std::max(t.priority, priority);
        // A hit per insert through the node, unless this caller counted it before.
        if (policy_ == EvictionPolicy::kLfu && pos + m > counted && t.hit_count != UINT32_MAX)
          ++t.hit_count;
      }
      // Only an unlocked leaf is in the heap; checking that first skips a
      // lookup in the heap's position array for every inner node.
      if (t.children.empty() && t.lock_count == 0) heap_.update(c, key_of(t));
      node = c;
      pos += m;
      if (m < len) break;
    }
    return {node, pos, deepest};
  }

  // Cuts node c after m tokens; returns the new upper node.
  uint32_t split(uint32_t c, uint32_t m) {
    const uint32_t u = nodes_.allocate();
    Node& cn = nodes_[c];
    Node& un = nodes_[u];
    un.lock_count = cn.lock_count;  // every lock through c also passes through u
    un.own_locks = 0;
    un.hit_count = cn.hit_count;
    un.last_access = cn.last_access;
    un.created = cn.created;
    un.priority = cn.priority;
    un.serial = ++serial_;
    un.alive = true;
    un.is_root = false;
    detail::cut_edge(nodes_, c, u, m, page_size_);
    ++node_count_;
    return u;
  }

  void add_leaf(uint32_t parent, const Token* key, const Value* values, uint32_t len,
                int64_t priority, uint32_t hit_count) {
    const LabelRef ref = arena_.allocate(key, values, len);
    const uint32_t x = nodes_.allocate();
    Node& xn = nodes_[x];
    Node& pn = nodes_[parent];
    xn.parent = parent;
    xn.chunk = ref.chunk;
    xn.label = arena_.tokens(ref.chunk, ref.offset);
    xn.length = len;
    xn.depth = pn.depth + len;
    xn.lock_count = xn.own_locks = 0;
    xn.hit_count = hit_count;
    xn.last_access = xn.created = clock_;
    xn.priority = priority;
    xn.serial = ++serial_;
    xn.alive = true;
    xn.is_root = false;
    if (heap_.contains(parent)) heap_.remove(parent);  // it stops being a leaf
    pn.children.add(page_key(key), x);
    heap_.push(x, key_of(xn));
    evictable_ += len;
    stats_.inserted_tokens += len;
    ++node_count_;
    if (observer_ != nullptr) observer_->stored(*this, x);
  }

  void free_node(uint32_t x) {
    Node& n = nodes_[x];
    arena_.release(n.chunk, n.length);
    n.alive = false;
    ++n.generation;
    n.children.clear();
    --node_count_;
    nodes_.release(x);
  }

  // Evicts what an insert of key needs under the capacity. Room may come from
  // anything but the matched prefix, which the insert extends: if that is not
  // enough, returns false having changed nothing. Otherwise the node holding
  // the end of the match is cut there (the insert would cut it anyway), so a
  // guard lock covers exactly the matched prefix while evicting.
  bool make_room(uint32_t ns, const Token* key, size_t n, InsertOutcome* out) {
    const uint32_t root = root_of(ns);
    Walk w{root, 0, root};
    if (root != kNoNode) w = walk<WalkMode::kDry>(root, key, n, 0, 0);
    out->new_tokens = n - w.length;
    if (total_size() + out->new_tokens <= capacity_) return true;
    const uint64_t need = total_size() + out->new_tokens - capacity_;
    uint64_t on_path = 0;
    for (uint32_t x = w.deepest; x != kNoNode && nodes_[x].parent != kNoNode; x = nodes_[x].parent) {
      const Node& xn = nodes_[x];
      const uint64_t start = xn.depth - xn.length;
      if (xn.lock_count == 0) on_path += std::min<uint64_t>(xn.depth, w.length) - start;
    }
    out->evictable = evictable_ - on_path;
    out->fits = out->evictable >= need;
    if (!out->fits) return false;
    uint32_t guard = w.deepest;
    if (guard != kNoNode && nodes_[guard].parent != kNoNode) {
      const Node& g = nodes_[guard];
      if (g.depth > w.length)
        guard = split(guard, static_cast<uint32_t>(w.length - (g.depth - g.length)));
      lock(guard);
      evict(need, &pending_evicted_);
      unlock(guard);
    } else {
      evict(need, &pending_evicted_);
    }
    return true;
  }

  // Once garbage exceeds half the live tokens, moves the labels out of every
  // sparse chunk (live < 7/8 of used) so those chunks are freed. Afterwards
  // garbage is at most a seventh of the live tokens, so the next evacuation
  // is at least a third of the live tokens of frees away: the O(n) walk and
  // the copies cost amortised O(1) per freed token, and the arena stays
  // within 1.5 times the live tokens plus a chunk.
  void maybe_compact() {
    const size_t garbage = arena_.garbage_tokens();
    if (garbage <= LabelArena::kDefaultChunkTokens || garbage * 2 <= arena_.live_tokens()) return;
    if (arena_.begin_evacuation() == 0) return;
    ++evacuations_;
    std::vector<uint32_t> stack;
    for (uint32_t ns : namespace_ids()) stack.push_back(root_of(ns));
    while (!stack.empty()) {
      const uint32_t id = stack.back();
      stack.pop_back();
      Node& n = nodes_[id];
      n.children.for_each([&](uint32_t, uint32_t c) { stack.push_back(c); });
      if (n.is_root || !arena_.evacuating(n.chunk)) continue;
      const LabelRef ref = arena_.allocate(
          n.label, arena_.with_values() ? arena_.values_for(n.chunk, n.label) : nullptr, n.length);
      arena_.release(n.chunk, n.length);
      n.chunk = ref.chunk;
      n.label = arena_.tokens(ref.chunk, ref.offset);
    }
  }

  template <class F>
  void visit_sorted(uint32_t ns, F&& f) const {
    const uint32_t root = root_of(ns);
    if (root == kNoNode) return;
    std::vector<std::pair<uint32_t, uint32_t>> stack;  // (node, level)
    std::vector<uint32_t> kids;
    auto push_children = [&](uint32_t id, uint32_t level) {
      kids.clear();
      nodes_[id].children.for_each([&](uint32_t, uint32_t c) { kids.push_back(c); });
      // Siblings differ within their first page, so comparing it orders them.
      std::sort(kids.begin(), kids.end(), [&](uint32_t a, uint32_t b) {
        const Token* ta = label_tokens(a);
        const Token* tb = label_tokens(b);
        return std::lexicographical_compare(ta, ta + page_size_, tb, tb + page_size_);
      });
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) stack.emplace_back(*it, level);
    };
    push_children(root, 0);
    while (!stack.empty()) {
      const auto [id, level] = stack.back();
      stack.pop_back();
      f(id, level);
      push_children(id, level + 1);
    }
  }

  // The eviction key of a node under this tree's policy (see the file comment).
  EvictKey key_of(const Node& n) const {
    switch (policy_) {
      case EvictionPolicy::kLfu:
        return {n.hit_count, n.last_access, n.serial};
      case EvictionPolicy::kFifo:
        return {n.created, n.serial, 0};
      case EvictionPolicy::kPriority:  // flip the sign bit: signed order as unsigned
        return {static_cast<uint64_t>(n.priority) ^ (uint64_t{1} << 63), n.last_access, n.serial};
      case EvictionPolicy::kLru:
      default:
        return {n.last_access, n.serial, 0};
    }
  }

  uint32_t page_size_;
  EvictionPolicy policy_;
  uint64_t capacity_;
  bool refresh_split_tail_ = false;
  LabelArena arena_;
  NodePool<Node> nodes_;
  EvictHeap heap_;
  std::unordered_map<uint32_t, uint32_t> roots_;  // namespace id -> root (ns 0 is node 0)
  std::vector<Value> pending_evicted_;
  std::vector<uint32_t> dropped_namespaces_;
  TreeObserver* observer_ = nullptr;
  TreeStats stats_;
  uint64_t epoch_ = 0;
  uint64_t clock_ = 0;
  uint64_t serial_ = 0;
  uint64_t evictable_ = 0;
  uint64_t protected_ = 0;
  uint64_t node_count_ = 0;
  uint64_t evacuations_ = 0;
};

}  // namespace radixmeta
