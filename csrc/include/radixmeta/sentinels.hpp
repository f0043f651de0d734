// Sentinel values shared by the worker's tree and the router's meta-tree.
#pragma once

#include <cstdint>

namespace radixmeta {

inline constexpr uint32_t kNoNode = UINT32_MAX;      // "no node": a root's parent, a missing child
inline constexpr uint64_t kNoCapacity = UINT64_MAX;  // no capacity limit

}  // namespace radixmeta
