// A set of small integer locations attached to each tree node.
//
// In a worker's cache a location is a storage tier (device, host, disk); in the
// router's meta-tree it is a worker index. The first 64 locations live inline,
// so the common case costs one word and no allocation; larger indices spill to
// a heap array that grows on demand.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

namespace radixmeta {

class LocationSet {
 public:
  LocationSet() = default;
  ~LocationSet() { delete[] extra_; }

  LocationSet(const LocationSet& other) : word0_(other.word0_) { copy_extra(other); }
  LocationSet& operator=(const LocationSet& other) {
    if (this != &other) {
      delete[] extra_;
      extra_ = nullptr;
      word0_ = other.word0_;
      copy_extra(other);
    }
    return *this;
  }
  LocationSet(LocationSet&& other) noexcept
      : word0_(other.word0_), extra_(std::exchange(other.extra_, nullptr)) {}
  LocationSet& operator=(LocationSet&& other) noexcept {
    if (this != &other) {
      delete[] extra_;
      word0_ = other.word0_;
      extra_ = std::exchange(other.extra_, nullptr);
    }
    return *this;
  }

  bool test(uint32_t i) const {
    if (i < 64) return (word0_ >> i) & 1u;
    const uint32_t w = i / 64 - 1;
    return extra_ != nullptr && w < extra_words() && ((extra_[w + 1] >> (i % 64)) & 1u);
  }

  void set(uint32_t i) {
    if (i < 64) {
      word0_ |= uint64_t{1} << i;
      return;
    }
    const uint32_t w = i / 64 - 1;
    grow(w + 1);
    extra_[w + 1] |= uint64_t{1} << (i % 64);
  }

  void reset(uint32_t i) {
    if (i < 64) {
      word0_ &= ~(uint64_t{1} << i);
      return;
    }
    const uint32_t w = i / 64 - 1;
    if (extra_ != nullptr && w < extra_words()) extra_[w + 1] &= ~(uint64_t{1} << (i % 64));
  }

  bool any() const {
    if (word0_ != 0) return true;
    for (uint32_t w = 0; extra_ != nullptr && w < extra_words(); ++w)
      if (extra_[w + 1] != 0) return true;
    return false;
  }

  uint32_t count() const {
    uint32_t n = static_cast<uint32_t>(__builtin_popcountll(word0_));
    for (uint32_t w = 0; extra_ != nullptr && w < extra_words(); ++w)
      n += static_cast<uint32_t>(__builtin_popcountll(extra_[w + 1]));
    return n;
  }

  // Words of 64 locations: word(0) covers 0..63, word(1) 64..127, and so on;
  // words beyond word_count() are zero.
  uint32_t word_count() const { return 1 + (extra_ == nullptr ? 0 : extra_words()); }
  uint64_t word(uint32_t w) const { return w == 0 ? word0_ : extra_[w]; }

  // f(location) for every member, ascending.
  template <class F>
  void for_each(F&& f) const {
    const uint32_t words = word_count();
    for (uint32_t w = 0; w < words; ++w)
      for (uint64_t bits = word(w); bits != 0; bits &= bits - 1)
        f(w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits)));
  }

  void clear() {
    word0_ = 0;
    delete[] extra_;
    extra_ = nullptr;
  }

  // Heap bytes owned beyond the object itself.
  size_t heap_bytes() const { return extra_ == nullptr ? 0 : (extra_words() + 1) * 8; }

 private:
  // extra_[0] holds the number of extra words; extra_[1..] hold locations 64 and up.
  uint32_t extra_words() const { return static_cast<uint32_t>(extra_[0]); }

  void grow(uint32_t words) {
    const uint32_t have = extra_ == nullptr ? 0 : extra_words();
    if (words <= have) return;
    const uint32_t target = std::max(words, have * 2);
    auto* bigger = new uint64_t[target + 1]();
    bigger[0] = target;
    if (extra_ != nullptr) std::memcpy(bigger + 1, extra_ + 1, have * 8);
    delete[] extra_;
    extra_ = bigger;
  }

  void copy_extra(const LocationSet& other) {
    if (other.extra_ == nullptr) return;
    const uint32_t n = other.extra_words();
    extra_ = new uint64_t[n + 1];
    std::memcpy(extra_, other.extra_, (n + 1) * 8);
  }

  uint64_t word0_ = 0;
  uint64_t* extra_ = nullptr;
};

}  // namespace radixmeta
