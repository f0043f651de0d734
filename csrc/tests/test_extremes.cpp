// Tests of the extremes scan with g++ alone: random rows against the
// definition (first position of the smallest and of the largest, how many
// hold the largest), with many ties and the int64 limits.
#include <radixmeta/extremes.hpp>

#include "check.hpp"

#include <cstdio>
#include <limits>
#include <random>
#include <vector>

using radixmeta::Extremes;
using radixmeta::extremes;

static Extremes definition(const std::vector<int64_t>& v) {
  Extremes e;
  e.low = e.high = v[0];
  for (int64_t x : v) {
    if (x < e.low) e.low = x;
    if (x > e.high) e.high = x;
  }
  bool low_seen = false, high_seen = false;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == e.low && !low_seen) {
      e.low_at = i;
      low_seen = true;
    }
    if (v[i] == e.high) {
      if (!high_seen) e.high_at = i;
      high_seen = true;
      ++e.high_count;
    }
  }
  return e;
}

int main() {
  std::mt19937_64 rng(7);
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  for (int round = 0; round < 20000; ++round) {
    const std::size_t n = 1 + rng() % 70;
    const int spread = static_cast<int>(rng() % 4);  // 0: all ties ... 3: wide values
    std::vector<int64_t> v(n);
    for (auto& x : v) {
      switch (spread) {
        case 0: x = 5; break;
        case 1: x = static_cast<int64_t>(rng() % 3); break;
        case 2: x = static_cast<int64_t>(rng() % 1000) - 500; break;
        default: x = rng() % 8 == 0 ? (rng() % 2 ? lo : hi) : static_cast<int64_t>(rng());
      }
    }
    const Extremes got = extremes(v.data(), n), want = definition(v);
    CHECK(got.low == want.low);
    CHECK(got.low_at == want.low_at);
    CHECK(got.high == want.high);
    CHECK(got.high_at == want.high_at);
    CHECK(got.high_count == want.high_count);
  }
  if (failures != 0) return 1;
  std::puts("extremes tests: all checks passed");
  return 0;
}
