// Checked conversion of caller-supplied token arrays to the core's uint32.
//
// The binding hands numpy int32/int64 buffers straight to these loops. They
// are branch-free so the compiler vectorises them, and on x86-64 with GCC they
// are also built for AVX2 and picked at load time (target_clones), since
// wheels must run on baseline x86-64.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define RADIXMETA_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RADIXMETA_VECTOR_CLONES
#endif

namespace radixmeta {

// Copies the low 32 bits of n 64-bit values; returns false if any value does
// not fit in [0, 2**32) (read as signed int64, a negative value has high bits).
RADIXMETA_VECTOR_CLONES inline bool narrow_to_tokens(const uint64_t* src, uint32_t* dst,
                                                     size_t n) {
  uint64_t high = 0;
  for (size_t i = 0; i < n; ++i) {
    high |= src[i];
    dst[i] = static_cast<uint32_t>(src[i]);
  }
  return (high >> 32) == 0;
}

// True when no int32 value is negative: then the buffer is a valid uint32 key.
RADIXMETA_VECTOR_CLONES inline bool all_non_negative(const int32_t* src, size_t n) {
  uint32_t bits = 0;
  for (size_t i = 0; i < n; ++i) bits |= static_cast<uint32_t>(src[i]);
  return (bits >> 31) == 0;
}

}  // namespace radixmeta
