// Scanning an engine's KV-event batch (map era) into flat arrays, with no object
// per token or per hash.
//
// A batch is the msgpack array [ts, [event, ...], dp_rank, ...] that vLLM (0.24
// and later) and SGLang (0.5.20 and later) publish, each event a map with a
// "type" key and one value per field. Decoding that with a general msgpack
// library makes a Python int for every token and hash, which costs more than
// applying the blocks to a tree. This reader walks the bytes once and writes
// every event's hashes and tokens into two shared arrays and its other fields
// into fixed slots; the binding then makes one object per event.
//
// The reader is a fast path, not a validator of record: it accepts only the
// well-formed shapes it fully understands (every event a map of a known type,
// every field of the kind its schema says, no duplicate keys) and refuses
// anything else by returning false, so the caller decodes that batch the exact
// way, which names the error or keeps an unknown event. It never reads out of
// bounds on any input.
//
// check_message is that exact path's first step: it walks any message once,
// without decoding, and says why it is not one well-formed msgpack value
// (truncated, a length the bytes left cannot hold, nested deeper than a limit,
// the unused byte 0xC1, a str that is not UTF-8, trailing bytes), so a decoder
// that runs after it never recurses past the limit nor allocates for a length
// bomb, and every batch the scanner takes passes it.
//
// Header-only C++17 with no Python dependency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace radixmeta {
namespace msgpack {

// What a field's value must be for the fast path to take it.
enum class FieldKind : uint8_t {
  kHashesU64,     // array of ints in [0, 2**64)
  kHashesI64,     // array of ints in [-2**63, 2**63), kept as two's complement
  kHashU64OrNil,  // an int in [0, 2**64), or nil
  kHashI64OrNil,  // an int in [-2**63, 2**63), or nil
  kTokens,        // array of ints in [0, 2**32)
  kSize,          // an int in [0, 2**63)
  kIntOrNil,      // an int in [-2**63, 2**63), or nil
  kStrOrNil,      // a UTF-8 string, or nil
  kNil,           // nil only: any other value sends the batch to the exact path
};

struct FieldSpec {
  std::string name;
  FieldKind kind;
  bool required = false;  // an event without it is malformed: the exact path says so
};

struct EventSpec {
  std::string tag;
  std::vector<FieldSpec> fields;
};

// One field of one event. Arrays name a range of ScannedBatch::hashes or
// ::tokens; strings a range of the input bytes; ints and single hashes their value.
struct FieldValue {
  bool present = false;  // false: absent or nil
  uint64_t value = 0;    // ints (two's complement for negatives) and single hashes
  size_t begin = 0;      // arrays and strings
  size_t count = 0;
};

struct ScannedBatch {
  double ts = 0.0;
  bool has_rank = false;
  int64_t rank = 0;
  std::vector<uint16_t> types;     // per event, its index in the scanner's specs
  std::vector<size_t> first;       // per event, where its fields start in values
  std::vector<FieldValue> values;  // per event, one per field of its spec
  std::vector<uint64_t> hashes;
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> seen;  // scratch of the scanner: which keys an event had

  void clear() {
    ts = 0.0;
    has_rank = false;
    rank = 0;
    types.clear();
    first.clear();
    values.clear();
    hashes.clear();
    tokens.clear();
  }
};

namespace detail {

struct Reader {
  const uint8_t* data;
  size_t size;
  size_t at = 0;

  bool has(size_t n) const { return size - at >= n; }  // at <= size always holds
  uint64_t be(size_t offset, size_t width) const {
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) v = (v << 8) | data[at + offset + i];
    return v;
  }
};

// A container header: fixarray/array16/array32 or fixmap/map16/map32.
inline bool read_container(Reader& r, bool map, uint64_t& count) {
  if (!r.has(1)) return false;
  const uint8_t tag = r.data[r.at];
  const uint8_t fix = map ? 0x80 : 0x90;
  const uint8_t b16 = map ? 0xDE : 0xDC;
  if ((tag & 0xF0) == fix) {
    count = tag & 0x0Fu;
    r.at += 1;
  } else if (tag == b16 && r.has(3)) {
    count = r.be(1, 2);
    r.at += 3;
  } else if (tag == b16 + 1 && r.has(5)) {
    count = r.be(1, 4);
    r.at += 5;
  } else {
    return false;
  }
  return true;
}

inline bool read_nil(Reader& r) {
  if (r.has(1) && r.data[r.at] == 0xC0) {
    r.at += 1;
    return true;
  }
  return false;
}

// Any msgpack integer. `negative` tells how to read `bits`: a two's complement
// value below zero, or a value in [0, 2**64).
inline bool read_int(Reader& r, uint64_t& bits, bool& negative) {
  if (!r.has(1)) return false;
  const uint8_t tag = r.data[r.at];
  negative = false;
  if (tag <= 0x7F) {
    bits = tag;
    r.at += 1;
    return true;
  }
  if (tag >= 0xE0) {  // negative fixint
    bits = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(tag)));
    negative = true;
    r.at += 1;
    return true;
  }
  if (tag >= 0xCC && tag <= 0xCF) {  // uint 8..64
    const size_t width = size_t{1} << (tag - 0xCC);
    if (!r.has(1 + width)) return false;
    bits = r.be(1, width);
    r.at += 1 + width;
    return true;
  }
  if (tag >= 0xD0 && tag <= 0xD3) {  // int 8..64
    const size_t width = size_t{1} << (tag - 0xD0);
    if (!r.has(1 + width)) return false;
    uint64_t v = r.be(1, width);
    const unsigned shift = static_cast<unsigned>(64 - 8 * width);
    // Sign-extend from the encoded width.
    bits = shift == 0 ? v : static_cast<uint64_t>(static_cast<int64_t>(v << shift) >> shift);
    negative = (bits >> 63) != 0;
    r.at += 1 + width;
    return true;
  }
  return false;
}

inline bool read_float(Reader& r, double& out) {
  if (!r.has(1)) return false;
  const uint8_t tag = r.data[r.at];
  if (tag == 0xCB && r.has(9)) {
    const uint64_t bits = r.be(1, 8);
    std::memcpy(&out, &bits, sizeof out);
    r.at += 9;
    return true;
  }
  if (tag == 0xCA && r.has(5)) {
    const uint32_t bits = static_cast<uint32_t>(r.be(1, 4));
    float f;
    std::memcpy(&f, &bits, sizeof f);
    out = f;
    r.at += 5;
    return true;
  }
  uint64_t bits;
  bool negative;
  if (!read_int(r, bits, negative)) return false;  // msgspec takes ints for floats
  out = negative ? static_cast<double>(static_cast<int64_t>(bits)) : static_cast<double>(bits);
  return true;
}

// A string's bytes (fixstr, str8, str16, str32).
inline bool read_str(Reader& r, size_t& begin, size_t& length) {
  if (!r.has(1)) return false;
  const uint8_t tag = r.data[r.at];
  size_t head;
  if ((tag & 0xE0) == 0xA0) {
    length = tag & 0x1Fu;
    head = 1;
  } else if (tag >= 0xD9 && tag <= 0xDB) {
    head = 1 + (size_t{1} << (tag - 0xD9));
    if (!r.has(head)) return false;
    length = static_cast<size_t>(r.be(1, head - 1));
  } else {
    return false;
  }
  if (!r.has(head) || r.size - r.at - head < length) return false;
  begin = r.at + head;
  r.at += head + length;
  return true;
}

// Total bytes of each msgpack header byte whose value has a fixed size (ints,
// floats, nil, bools, fixext), 0 for the others (strings, bins, exts, arrays,
// maps, and 0xC1, which msgpack never uses).
struct FixedSizes {
  uint8_t size[256] = {};
  constexpr FixedSizes() {
    for (int t = 0x00; t <= 0x7F; ++t) size[t] = 1;  // positive fixint
    for (int t = 0xE0; t <= 0xFF; ++t) size[t] = 1;  // negative fixint
    size[0xC0] = size[0xC2] = size[0xC3] = 1;        // nil, false, true
    size[0xCA] = 5;                                  // float 32
    size[0xCB] = 9;                                  // float 64
    for (int w = 0; w < 4; ++w) {
      size[0xCC + w] = static_cast<uint8_t>(1 + (1 << w));  // uint 8..64
      size[0xD0 + w] = static_cast<uint8_t>(1 + (1 << w));  // int 8..64
    }
    for (int w = 0; w < 5; ++w) size[0xD4 + w] = static_cast<uint8_t>(2 + (1 << w));  // fixext
  }
};
inline constexpr FixedSizes kFixedSizes{};

// Whether s[0, n) is well-formed UTF-8 (Unicode table 3-7: no overlong forms,
// no surrogates, nothing above U+10FFFF), as Python's strict decoder has it.
inline bool valid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t extra;
    uint8_t low = 0x80, high = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
      if (c == 0xE0) low = 0xA0;   // no overlong 3-byte forms
      if (c == 0xED) high = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
      if (c == 0xF0) low = 0x90;   // no overlong 4-byte forms
      if (c == 0xF4) high = 0x8F;  // nothing above U+10FFFF
    } else {
      return false;  // a continuation byte first, 0xC0, 0xC1, or 0xF5 and up
    }
    if (n - i <= extra) return false;
    if (s[i + 1] < low || s[i + 1] > high) return false;
    for (size_t k = 2; k <= extra; ++k)
      if ((s[i + k] & 0xC0) != 0x80) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace detail

// Why bytes are not one well-formed msgpack value (check_value, check_message).
enum class Problem : uint8_t {
  kNone,
  kTruncated,    // the data ends inside a header or a value
  kTooLong,      // a header claims more items or bytes than the bytes left can hold
  kTooDeep,      // arrays and maps nested deeper than the limit
  kInvalidByte,  // 0xC1, the one byte msgpack never uses
  kInvalidUtf8,  // a str that is not UTF-8
  kTrailing,     // bytes after the value
};

struct Check {
  Problem problem = Problem::kNone;
  size_t offset = 0;     // the header at fault; the end of the data for kTruncated
  uint64_t claimed = 0;  // kTooLong: the items (arrays), entries (maps) or bytes claimed
  uint8_t header = 0;    // the header byte at `offset` (not for kTruncated, kTrailing)
  bool ok() const { return problem == Problem::kNone; }
};

// Reads one msgpack value at data[at, size) without decoding it: every length
// is checked against the bytes left before it is used (a container must fit
// one byte per item, two per map entry), so no reader that trusts it allocates
// more than a constant times the input; arrays and maps may nest at most
// max_depth deep, counting the containers the value is inside (`depth` of
// them) and itself; every str, map keys included, is UTF-8. Iterative,
// O(bytes). On success `at` is just past the value.
inline Check check_value(const uint8_t* data, size_t size, size_t& at, uint32_t depth,
                         uint32_t max_depth) {
  // left[0..top): per open container, the values still to read in it; left[0]
  // is the value itself. A container is opened only within the depth limit, so
  // the stack never holds more than max_depth - depth + 1 entries.
  constexpr size_t kInline = 72;
  const size_t need = depth >= max_depth ? 1 : size_t{max_depth - depth} + 1;
  uint64_t inline_left[kInline];
  std::vector<uint64_t> heap_left;
  uint64_t* left = inline_left;
  if (need > kInline) {
    heap_left.resize(need);
    left = heap_left.data();
  }
  size_t top = 0;
  left[top++] = 1;
  while (top > 0) {
    // A run of fixed-size values (token ids, hashes) in one tight loop.
    uint64_t n = left[top - 1];
    while (n != 0) {
      if (at >= size) return {Problem::kTruncated, size};
      const uint8_t fixed = detail::kFixedSizes.size[data[at]];
      if (fixed == 0) break;
      if (size - at < fixed) return {Problem::kTruncated, size};
      at += fixed;
      --n;
    }
    if (n == 0) {
      --top;
      continue;
    }
    left[top - 1] = n - 1;  // the value read next is one of them
    const uint8_t tag = data[at];
    const size_t rest = size - at;
    if ((tag & 0xE0) == 0x80 || (tag >= 0xDC && tag <= 0xDF)) {  // array or map
      const bool fix = tag < 0xA0;                  // fixmap 0x8_, fixarray 0x9_
      const bool map = fix ? tag < 0x90 : tag >= 0xDE;
      const size_t head = fix ? 1 : (tag & 1) == 0 ? 3 : 5;  // 16-bit or 32-bit count
      if (rest < head) return {Problem::kTruncated, size};
      uint64_t count = fix ? tag & 0x0Fu : 0;
      for (size_t i = 1; i < head; ++i) count = (count << 8) | data[at + i];
      const uint64_t per = map ? 2 : 1;  // bytes an item takes at the least
      if (count > (rest - head) / per) return {Problem::kTooLong, at, count, tag};
      if (depth + top > max_depth) return {Problem::kTooDeep, at, 0, tag};
      at += head;
      if (count != 0) left[top++] = count * per;
    } else if (tag == 0xC1) {
      return {Problem::kInvalidByte, at, 0, tag};
    } else {  // str (fix, 8, 16, 32), bin 8..32, ext 8..32
      size_t width, head;
      uint64_t length = 0;
      if ((tag & 0xE0) == 0xA0) {
        width = 0;
        head = 1;
        length = tag & 0x1Fu;
      } else {
        const uint8_t first = tag >= 0xD9 ? 0xD9 : tag >= 0xC7 ? 0xC7 : 0xC4;
        width = size_t{1} << (tag - first);
        head = 1 + width + (first == 0xC7 ? 1 : 0);  // an ext also has its type byte
      }
      if (rest < head) return {Problem::kTruncated, size};
      for (size_t i = 1; i <= width; ++i) length = (length << 8) | data[at + i];
      if (length > rest - head) return {Problem::kTooLong, at, length, tag};
      const bool str = tag <= 0xBF || tag >= 0xD9;
      if (str && !detail::valid_utf8(data + at + head, static_cast<size_t>(length)))
        return {Problem::kInvalidUtf8, at, 0, tag};
      at += head + static_cast<size_t>(length);
    }
  }
  return {};
}

// check_value over a whole message: one value, nothing after it.
inline Check check_message(const uint8_t* data, size_t size, uint32_t max_depth) {
  size_t at = 0;
  Check c = check_value(data, size, at, 0, max_depth);
  if (c.ok() && at != size) c = {Problem::kTrailing, at};
  return c;
}

namespace detail {

// Skips one value of any type inside `depth` containers (see check_value).
inline bool skip_value(Reader& r, uint32_t depth, uint32_t max_depth) {
  return check_value(r.data, r.size, r.at, depth, max_depth).ok();
}

// Token ids of a vocabulary above 65,536 come as a random mix of uint 16 and
// uint 32, so a branch on the encoding mispredicts about every other token.
// This loop reads the uint 8/16/32 encodings without that branch: the width
// comes from a table and the value from one 4-byte load, shifted.
inline bool read_tokens(Reader& r, uint64_t count, uint32_t* out) {
  static constexpr uint8_t kWidth[4] = {1, 2, 4, 0};  // 0xCC, 0xCD, 0xCE; 0xCF is not here
  const uint8_t* p = r.data + r.at;
  const uint8_t* const end = r.data + r.size;
  for (uint64_t i = 0; i < count; ++i) {
    if (end - p < 5) {  // near the end: the careful reader
      r.at = static_cast<size_t>(p - r.data);
      uint64_t bits;
      bool negative;
      if (!read_int(r, bits, negative) || negative || bits > UINT32_MAX) return false;
      out[i] = static_cast<uint32_t>(bits);
      p = r.data + r.at;
      continue;
    }
    const uint8_t tag = *p;
    if (tag <= 0x7F) {
      out[i] = tag;
      p += 1;
      continue;
    }
    const unsigned width = (tag >= 0xCC && tag <= 0xCE) ? kWidth[tag - 0xCC] : 0;
    if (width == 0) {  // any other encoding: the careful reader
      r.at = static_cast<size_t>(p - r.data);
      uint64_t bits;
      bool negative;
      if (!read_int(r, bits, negative) || negative || bits > UINT32_MAX) return false;
      out[i] = static_cast<uint32_t>(bits);
      p = r.data + r.at;
      continue;
    }
    const uint32_t word = (uint32_t{p[1]} << 24) | (uint32_t{p[2]} << 16) |
                          (uint32_t{p[3]} << 8) | uint32_t{p[4]};
    out[i] = word >> (32 - 8 * width);
    p += 1 + width;
  }
  r.at = static_cast<size_t>(p - r.data);
  return true;
}

inline bool read_int_array(Reader& r, FieldKind kind, ScannedBatch& out, FieldValue& v) {
  uint64_t count;
  if (!read_container(r, false, count) || count > r.size - r.at) return false;
  v.count = static_cast<size_t>(count);
  if (kind == FieldKind::kTokens) {
    v.begin = out.tokens.size();
    out.tokens.resize(v.begin + v.count);
    if (!read_tokens(r, count, out.tokens.data() + v.begin)) return false;
    v.present = true;
    return true;
  }
  const bool signed_hashes = kind == FieldKind::kHashesI64;
  v.begin = out.hashes.size();
  out.hashes.resize(v.begin + v.count);
  uint64_t* hashes = out.hashes.data() + v.begin;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t bits;
    bool negative;
    if (!read_int(r, bits, negative)) return false;
    // Unsigned hashes: no negatives. Signed: no value at or above 2**63.
    if (signed_hashes ? (!negative && (bits >> 63) != 0) : negative) return false;
    hashes[i] = bits;
  }
  v.present = true;
  return true;
}

inline bool read_field(Reader& r, FieldKind kind, ScannedBatch& out, FieldValue& v) {
  if (read_nil(r)) {
    // Nil is a value only where the schema allows one.
    v.present = false;
    return kind == FieldKind::kHashU64OrNil || kind == FieldKind::kHashI64OrNil ||
           kind == FieldKind::kIntOrNil || kind == FieldKind::kStrOrNil ||
           kind == FieldKind::kNil;
  }
  uint64_t bits;
  bool negative;
  switch (kind) {
    case FieldKind::kHashesU64:
    case FieldKind::kHashesI64:
    case FieldKind::kTokens:
      return read_int_array(r, kind, out, v);
    case FieldKind::kHashU64OrNil:
    case FieldKind::kHashI64OrNil:
    case FieldKind::kSize:
    case FieldKind::kIntOrNil:
      if (!read_int(r, bits, negative)) return false;
      if (kind == FieldKind::kHashU64OrNil) {
        if (negative) return false;
      } else if (kind == FieldKind::kSize) {
        if (negative || (bits >> 63) != 0) return false;
      } else if (!negative && (bits >> 63) != 0) {
        return false;  // above the int64 range
      }
      v.present = true;
      v.value = bits;
      return true;
    case FieldKind::kStrOrNil:  // UTF-8 as check_message has it, so what is taken passes it
      v.present = read_str(r, v.begin, v.count) && valid_utf8(r.data + v.begin, v.count);
      return v.present;
    case FieldKind::kNil:
      return false;
  }
  return false;
}

inline bool key_is(const Reader& r, size_t begin, size_t length, const std::string& name) {
  return length == name.size() && std::memcmp(r.data + begin, name.data(), length) == 0;
}

}  // namespace detail

class BatchScanner {
 public:
  // The batch nests its own values at most 4 deep (batch, events, event, an
  // array field), so with max_depth at least that every batch it takes passes
  // check_message(max_depth): a skipped value nested deeper is refused, and the
  // exact decoder then reports the depth.
  static constexpr uint32_t kOwnDepth = 4;

  // Throws std::invalid_argument when two specs give one field name different
  // kinds, when there are more specs than a type index holds, or when
  // max_depth is below kOwnDepth.
  BatchScanner(std::vector<EventSpec> specs, uint32_t max_depth)
      : specs_(std::move(specs)), max_depth_(max_depth) {
    if (specs_.size() > UINT16_MAX) throw std::invalid_argument("too many event specs");
    if (max_depth_ < kOwnDepth) throw std::invalid_argument("max_depth must be at least 4");
    for (size_t a = 0; a < specs_.size(); ++a) {
      for (const auto& fa : specs_[a].fields) {
        ++slots_;
        for (size_t b = a; b < specs_.size(); ++b) {
          for (const auto& fb : specs_[b].fields) {
            if (&fa != &fb && fa.name == fb.name && fa.kind != fb.kind)
              throw std::invalid_argument("field '" + fa.name + "' has two kinds");
          }
        }
      }
    }
  }

  const std::vector<EventSpec>& specs() const { return specs_; }

  // Fills `out` from one batch; false when the batch is not a shape this
  // fast path takes (then `out` holds garbage and the caller decodes exactly).
  bool scan(const uint8_t* data, size_t size, ScannedBatch& out) const {
    out.clear();
    detail::Reader r{data, size};
    uint64_t elements, events;
    if (!detail::read_container(r, false, elements) || elements < 2) return false;
    if (!detail::read_float(r, out.ts)) return false;
    if (!detail::read_container(r, false, events) || events > r.size - r.at) return false;
    out.types.reserve(static_cast<size_t>(events));
    out.first.reserve(static_cast<size_t>(events));
    for (uint64_t e = 0; e < events; ++e) {
      if (!scan_event(r, out)) return false;
    }
    if (elements >= 3) {
      if (!detail::read_nil(r)) {
        uint64_t bits;
        bool negative;
        if (!detail::read_int(r, bits, negative)) return false;
        if (!negative && (bits >> 63) != 0) return false;
        out.has_rank = true;
        out.rank = static_cast<int64_t>(bits);
      }
      for (uint64_t i = 3; i < elements; ++i) {  // later elements are ignored
        if (!detail::skip_value(r, 1, max_depth_)) return false;
      }
    }
    return r.at == r.size;
  }

 private:
  bool scan_event(detail::Reader& r, ScannedBatch& out) const {
    uint64_t entries;
    if (!detail::read_container(r, true, entries) || entries > r.size - r.at) return false;
    // The type may come after the fields, so values are read into the slots
    // of every spec that knows the key, and the type picks one at the end.
    const size_t first = out.values.size();
    const size_t slots = slots_;
    out.values.resize(first + slots);
    int type = -1;
    std::vector<uint8_t>& seen = out.seen;  // per slot, and the type key at the end
    seen.assign(slots + 1, 0);
    for (uint64_t i = 0; i < entries; ++i) {
      size_t kb, kl;
      if (!detail::read_str(r, kb, kl)) return false;  // msgspec maps take string keys
      if (detail::key_is(r, kb, kl, kType)) {
        if (seen[slots]) return false;  // a duplicate key: the exact path decides
        seen[slots] = 1;
        size_t tb, tl;
        if (!detail::read_str(r, tb, tl)) return false;
        for (size_t s = 0; s < specs_.size(); ++s) {
          if (detail::key_is(r, tb, tl, specs_[s].tag)) type = static_cast<int>(s);
        }
        if (type < 0) return false;  // an unknown event: the exact path keeps it
        continue;
      }
      // Where the key's value goes: one slot per spec that declares it (the
      // constructor checks that every spec gives a name the same kind).
      size_t base = 0, read_into = SIZE_MAX;
      for (const auto& spec : specs_) {
        for (size_t f = 0; f < spec.fields.size(); ++f) {
          if (!detail::key_is(r, kb, kl, spec.fields[f].name)) continue;
          if (seen[base + f]) return false;  // a duplicate key: the exact path decides
          seen[base + f] = 1;
          FieldValue& slot = out.values[first + base + f];
          if (read_into == SIZE_MAX) {
            if (!detail::read_field(r, spec.fields[f].kind, out, slot)) return false;
            read_into = first + base + f;
          } else {
            slot = out.values[read_into];
          }
        }
        base += spec.fields.size();
      }
      if (read_into == SIZE_MAX) {  // a field of a later release: ignored, as msgspec does
        for (size_t k = 0; k < kl; ++k) {
          if (r.data[kb + k] >= 0x80) return false;  // leave non-ASCII keys to the exact path
        }
        if (!detail::skip_value(r, 3, max_depth_)) return false;  // inside an event's map
      }
    }
    if (type < 0) return false;  // no type key
    // Keep only the chosen spec's slots, checked for the required fields.
    size_t base = 0;
    for (int s = 0; s < type; ++s) base += specs_[s].fields.size();
    const auto& spec = specs_[type];
    for (size_t f = 0; f < spec.fields.size(); ++f) {
      if (spec.fields[f].required && !seen[base + f]) return false;
      if (spec.fields[f].required && !out.values[first + base + f].present) return false;
    }
    if (base > 0) {
      for (size_t f = 0; f < spec.fields.size(); ++f)
        out.values[first + f] = out.values[first + base + f];
    }
    out.values.resize(first + spec.fields.size());
    out.types.push_back(static_cast<uint16_t>(type));
    out.first.push_back(first);
    return true;
  }

  static inline const std::string kType = "type";
  std::vector<EventSpec> specs_;
  uint32_t max_depth_;
  size_t slots_ = 0;  // fields over all specs
};

}  // namespace msgpack
}  // namespace radixmeta
