// Reading a msgpack array of token ids straight into uint32, with no object per
// token: the engines' KV events carry token_ids as msgpack arrays of ints, and
// making a Python int of each costs most of a block's decode.
//
// Header-only C++17 with no Python dependency. The reader accepts exactly one
// msgpack array (fixarray, array 16 or array 32) of non-negative integers below
// 2**32 in any msgpack integer encoding, and nothing after it. Anything else (a
// negative or larger int, a nested array such as SGLang's bigram pairs, a
// float, truncated bytes) is refused, and the caller decodes the slow way.
#pragma once

#include <cstddef>
#include <cstdint>

namespace radixmeta {

struct MsgpackArrayHeader {
  bool ok = false;
  uint64_t count = 0;  // elements
  size_t offset = 0;   // where the first element starts
};

inline MsgpackArrayHeader msgpack_array_header(const uint8_t* data, size_t size) {
  MsgpackArrayHeader h;
  if (size == 0) return h;
  const uint8_t tag = data[0];
  if ((tag & 0xF0) == 0x90) {
    h = {true, uint64_t{tag & 0x0Fu}, 1};
  } else if (tag == 0xDC && size >= 3) {
    h = {true, (uint64_t{data[1]} << 8) | data[2], 3};
  } else if (tag == 0xDD && size >= 5) {
    h = {true,
         (uint64_t{data[1]} << 24) | (uint64_t{data[2]} << 16) | (uint64_t{data[3]} << 8) |
             data[4],
         5};
  }
  return h;
}

// Writes the header's count of tokens from data[offset..size) into out; returns
// false (out partly written) unless the bytes hold exactly that many valid ids.
inline bool msgpack_read_tokens(const uint8_t* data, size_t size, MsgpackArrayHeader h,
                                uint32_t* out) {
  size_t at = h.offset;
  for (uint64_t i = 0; i < h.count; ++i) {
    if (at >= size) return false;
    const uint8_t tag = data[at];
    if (tag <= 0x7F) {  // positive fixint
      out[i] = tag;
      at += 1;
    } else if (tag == 0xCC && at + 2 <= size) {  // uint 8
      out[i] = data[at + 1];
      at += 2;
    } else if (tag == 0xCD && at + 3 <= size) {  // uint 16
      out[i] = (uint32_t{data[at + 1]} << 8) | data[at + 2];
      at += 3;
    } else if (tag == 0xCE && at + 5 <= size) {  // uint 32
      out[i] = (uint32_t{data[at + 1]} << 24) | (uint32_t{data[at + 2]} << 16) |
               (uint32_t{data[at + 3]} << 8) | data[at + 4];
      at += 5;
    } else if (tag == 0xCF && at + 9 <= size) {  // uint 64: valid only below 2**32
      for (int b = 1; b <= 4; ++b)
        if (data[at + b] != 0) return false;
      out[i] = (uint32_t{data[at + 5]} << 24) | (uint32_t{data[at + 6]} << 16) |
               (uint32_t{data[at + 7]} << 8) | data[at + 8];
      at += 9;
    } else if (tag >= 0xD0 && tag <= 0xD3) {  // int 8..64: other encoders may use these
      const size_t width = size_t{1} << (tag - 0xD0);
      if (at + 1 + width > size || (data[at + 1] & 0x80) != 0) return false;  // negative
      uint64_t v = 0;
      for (size_t b = 1; b <= width; ++b) v = (v << 8) | data[at + b];
      if (v > UINT32_MAX) return false;
      out[i] = static_cast<uint32_t>(v);
      at += 1 + width;
    } else {
      return false;  // negative, float, nested, or truncated
    }
  }
  return at == size;
}

}  // namespace radixmeta
