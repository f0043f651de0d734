// The smallest and the largest of a short row of integers, with where they
// first occur and how often the largest does: the one scan the router's load
// and affinity policies make over their workers on every request.
//
// Python's min, max, index and count each walk the list again through the
// generic object protocol; for eight workers those four walks cost more than
// the rest of a policy's rule. The binding converts the row once and this
// walks it once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace radixmeta {

struct Extremes {
  int64_t low = 0;         // the smallest value
  std::size_t low_at = 0;  // its first position
  int64_t high = 0;        // the largest value
  std::size_t high_at = 0; // its first position
  std::size_t high_count = 0;  // how many positions hold it
};

// values[0..n), n >= 1 (the caller checks). Ties go to the first position,
// as Python's list.index does.
inline Extremes extremes(const int64_t* values, std::size_t n) {
  Extremes e;
  e.low = e.high = values[0];
  e.high_count = 1;
  for (std::size_t i = 1; i < n; ++i) {
    const int64_t v = values[i];
    if (v < e.low) {
      e.low = v;
      e.low_at = i;
    }
    if (v > e.high) {
      e.high = v;
      e.high_at = i;
      e.high_count = 1;
    } else if (v == e.high) {
      ++e.high_count;
    }
  }
  return e;
}

}  // namespace radixmeta
