// Token-page helpers shared by the worker's tree and the router's meta-tree:
// comparing labels and the key a child is filed under.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "children.hpp"
#include "label_arena.hpp"

namespace radixmeta {
namespace detail {

// Both trees store depths and lengths in 32 bits: a longer key is refused
// before it is read (the binding refuses it first, with the library's error).
inline void check_key_length(uint64_t n) {
  if (n > UINT32_MAX) throw std::length_error("radixmeta: keys are limited to 2**32 - 1 tokens");
}

// Length of the common prefix of a[0..n) and b[0..n). Short labels (most
// edges below the top of a tree) are compared inline four tokens at a time;
// long ones with one memcmp, which settles the common full-hit case at memory
// speed, then narrow down by 64-token blocks on a miss.
inline size_t common_prefix(const Token* a, const Token* b, size_t n) {
  size_t i = 0;
  if (n >= 64) {
    if (std::memcmp(a, b, n * sizeof(Token)) == 0) return n;
    constexpr size_t kBlock = 64;
    while (i + kBlock <= n && std::memcmp(a + i, b + i, kBlock * sizeof(Token)) == 0) i += kBlock;
  }
  for (; i + 4 <= n; i += 4) {
    uint64_t x0, x1, y0, y1;
    std::memcpy(&x0, a + i, 8);
    std::memcpy(&x1, a + i + 2, 8);
    std::memcpy(&y0, b + i, 8);
    std::memcpy(&y1, b + i + 2, 8);
    if (((x0 ^ y0) | (x1 ^ y1)) != 0) break;
  }
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// The key children are filed under: the first token at page size 1, else a
// hash of the whole first page. Keying by the first token alone would put
// every child that starts with the same token (chat templates: every turn
// after a page-aligned system prompt) in one probe run.
inline uint32_t page_key(const Token* page, uint32_t page_size) {
  if (page_size == 1) return page[0];
  // Four independent multiply chains: one chain over a 16-token page is 16
  // dependent multiplies, which showed up as +1.5 us on a 128-node walk.
  constexpr uint64_t kMul = 0xFF51AFD7ED558CCDull;
  uint64_t lane[4] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                      0x27D4EB2F165667C5ull};
  uint32_t i = 0;
  for (; i + 4 <= page_size; i += 4)
    for (int j = 0; j < 4; ++j) lane[j] = (lane[j] ^ page[i + j]) * kMul;
  for (; i < page_size; ++i) lane[0] = (lane[0] ^ page[i]) * kMul;
  uint64_t h = lane[0] ^ (lane[1] >> 17 | lane[1] << 47) ^ (lane[2] >> 31 | lane[2] << 33) ^
               (lane[3] >> 43 | lane[3] << 21);
  h = (h ^ (h >> 29)) * kMul;
  return static_cast<uint32_t>(h >> 32);
}

// The child whose label starts with key's first page, or Children::kNone.
// label_of(id) gives a child's label. A node with a single child (a chain:
// most nodes of a tree built from block events) is settled by comparing the
// page, without hashing the key's page first.
template <class LabelOf>
uint32_t find_child(const Children& children, const Token* key, uint32_t page_size,
                    LabelOf&& label_of) {
  const size_t bytes = size_t{page_size} * sizeof(Token);
  const uint32_t only = children.only();
  if (only != Children::kNone && page_size > 1)
    return std::memcmp(label_of(only), key, bytes) == 0 ? only : Children::kNone;
  return children.find(page_key(key, page_size), [&](uint32_t c) {
    return page_size == 1 || std::memcmp(label_of(c), key, bytes) == 0;
  });
}

// Cuts the edge into node c after m tokens, making the fresh node u its upper
// part: u takes c's place under c's parent and c (keeping its id) hangs from
// u. Labels are slices of the arena, so nothing is copied. The node types of
// both trees share these fields; each tree copies the rest of its own.
template <class Pool>
void cut_edge(Pool& nodes, uint32_t c, uint32_t u, uint32_t m, uint32_t page_size) {
  auto& cn = nodes[c];
  auto& un = nodes[u];
  un.parent = cn.parent;
  un.chunk = cn.chunk;
  un.label = cn.label;
  un.length = m;
  un.depth = cn.depth - (cn.length - m);
  const uint32_t upper_key = page_key(cn.label, page_size);
  cn.label += m;
  cn.length -= m;
  cn.parent = u;
  nodes[un.parent].children.replace(upper_key, c, u);
  un.children.add(page_key(cn.label, page_size), c);
}

}  // namespace detail
}  // namespace radixmeta
