// The batch scanner takes what it should, refuses the rest, and never reads out
// of bounds: every prefix and thousands of mutations of valid batches run under
// ASan/UBSan here.
#include "radixmeta/msgpack_batch.hpp"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"

using radixmeta::msgpack::BatchScanner;
using radixmeta::msgpack::Check;
using radixmeta::msgpack::check_message;
using radixmeta::msgpack::Problem;
using radixmeta::msgpack::EventSpec;
using radixmeta::msgpack::FieldKind;
using radixmeta::msgpack::ScannedBatch;

namespace {

using Bytes = std::vector<uint8_t>;
constexpr uint32_t kDepth = 64;  // the wire codecs' limit (radixmeta.wire.MAX_DEPTH)

void put(Bytes& b, std::initializer_list<int> v) {
  for (int x : v) b.push_back(static_cast<uint8_t>(x));
}
void put_str(Bytes& b, const std::string& s) {
  b.push_back(static_cast<uint8_t>(0xA0 | s.size()));
  b.insert(b.end(), s.begin(), s.end());
}
void put_u64(Bytes& b, uint64_t v) {
  b.push_back(0xCF);
  for (int i = 7; i >= 0; --i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_token(Bytes& b, uint32_t v) {
  if (v < 0x80) {
    b.push_back(static_cast<uint8_t>(v));
  } else if (v < 0x100) {
    put(b, {0xCC, static_cast<int>(v)});
  } else if (v < 0x10000) {
    put(b, {0xCD, static_cast<int>(v >> 8), static_cast<int>(v & 0xFF)});
  } else {
    put(b, {0xCE, static_cast<int>(v >> 24), static_cast<int>((v >> 16) & 0xFF),
            static_cast<int>((v >> 8) & 0xFF), static_cast<int>(v & 0xFF)});
  }
}

BatchScanner vllm_like() {
  return BatchScanner({
      {"BlockStored",
       {{"block_hashes", FieldKind::kHashesU64, true},
        {"parent_block_hash", FieldKind::kHashU64OrNil, false},
        {"token_ids", FieldKind::kTokens, true},
        {"block_size", FieldKind::kSize, true},
        {"medium", FieldKind::kStrOrNil, false},
        {"extra_keys", FieldKind::kNil, false}}},
      {"BlockRemoved",
       {{"block_hashes", FieldKind::kHashesU64, true}, {"medium", FieldKind::kStrOrNil, false}}},
      {"AllBlocksCleared", {}},
  }, kDepth);
}

// [ts, [stored, removed, cleared], 3] with the stored event's type key last and
// an unknown nested field in the middle.
Bytes sample(const std::vector<uint32_t>& tokens) {
  Bytes b;
  put(b, {0x93, 0xCB, 0x3F, 0xF8, 0, 0, 0, 0, 0, 0});  // 1.5
  put(b, {0x93});
  put(b, {0x86});
  put_str(b, "block_hashes");
  put(b, {0x92});
  put_u64(b, 0x1111111111111111ULL);
  put_u64(b, 0xF000000000000001ULL);
  put_str(b, "parent_block_hash");
  put(b, {0xC0});
  put_str(b, "future_field");
  put(b, {0x82, 0xA1, 'a', 0x91, 0xC4, 0x02, 1, 2, 0xA1, 'b', 0xD6, 0x01, 1, 2, 3, 4});
  put_str(b, "token_ids");
  put(b, {0xDC, 0, static_cast<int>(tokens.size())});
  for (uint32_t t : tokens) put_token(b, t);
  put_str(b, "block_size");
  put(b, {0x02});
  put_str(b, "type");
  put_str(b, "BlockStored");
  put(b, {0x83});
  put_str(b, "type");
  put_str(b, "BlockRemoved");
  put_str(b, "block_hashes");
  put(b, {0x91, 0x05});
  put_str(b, "medium");
  put_str(b, "GPU");
  put(b, {0x81});
  put_str(b, "type");
  put_str(b, "AllBlocksCleared");
  put(b, {0x03});
  return b;
}

void test_reads_a_batch() {
  const BatchScanner scanner = vllm_like();
  const std::vector<uint32_t> tokens = {0, 127, 128, 255, 256, 65535, 65536, 151935};
  const Bytes b = sample(tokens);
  ScannedBatch out;
  CHECK(scanner.scan(b.data(), b.size(), out));
  CHECK(out.ts == 1.5);
  CHECK(out.has_rank && out.rank == 3);
  CHECK(out.types.size() == 3 && out.types[0] == 0 && out.types[1] == 1 && out.types[2] == 2);
  const auto& hashes = out.values[out.first[0] + 0];
  CHECK(hashes.present && hashes.count == 2);
  CHECK(out.hashes[hashes.begin] == 0x1111111111111111ULL);
  CHECK(out.hashes[hashes.begin + 1] == 0xF000000000000001ULL);
  CHECK(!out.values[out.first[0] + 1].present);  // nil parent
  const auto& toks = out.values[out.first[0] + 2];
  CHECK(toks.present && toks.count == tokens.size());
  for (size_t i = 0; i < tokens.size() && toks.present; ++i)
    CHECK(out.tokens[toks.begin + i] == tokens[i]);
  CHECK(out.values[out.first[0] + 3].value == 2);
  const auto& medium = out.values[out.first[1] + 1];
  CHECK(medium.present && medium.count == 3 &&
        std::string(reinterpret_cast<const char*>(b.data()) + medium.begin, 3) == "GPU");
}

void test_refuses_every_prefix() {
  const BatchScanner scanner = vllm_like();
  const Bytes b = sample({1, 300, 70000});
  ScannedBatch out;
  for (size_t n = 0; n < b.size(); ++n) CHECK(!scanner.scan(b.data(), n, out));
  Bytes longer = b;
  longer.push_back(0xC0);  // trailing bytes
  CHECK(!scanner.scan(longer.data(), longer.size(), out));
}

void test_refuses_what_it_does_not_take() {
  const BatchScanner scanner = vllm_like();
  ScannedBatch out;
  auto refuses = [&](Bytes b) { return !scanner.scan(b.data(), b.size(), out); };
  // An unknown event type, a missing required field, a nil where none is allowed,
  // a duplicate key, a non-nil "nil only" field, a negative hash, a token >= 2**32.
  Bytes b;
  put(b, {0x92, 0x00, 0x91, 0x81});
  put_str(b, "type");
  put_str(b, "Mystery");
  CHECK(refuses(b));
  b.clear();
  put(b, {0x92, 0x00, 0x91, 0x81});
  put_str(b, "type");
  put_str(b, "BlockRemoved");
  CHECK(refuses(b));  // no block_hashes
  b.clear();
  put(b, {0x92, 0x00, 0x91, 0x82});
  put_str(b, "type");
  put_str(b, "BlockRemoved");
  put_str(b, "block_hashes");
  put(b, {0xC0});
  CHECK(refuses(b));
  b.clear();
  put(b, {0x92, 0x00, 0x91, 0x83});
  put_str(b, "type");
  put_str(b, "BlockRemoved");
  put_str(b, "block_hashes");
  put(b, {0x90});
  put_str(b, "block_hashes");
  put(b, {0x90});
  CHECK(refuses(b));
  b.clear();
  put(b, {0x92, 0x00, 0x91, 0x82});
  put_str(b, "type");
  put_str(b, "BlockRemoved");
  put_str(b, "block_hashes");
  put(b, {0x91, 0xFF});  // -1
  CHECK(refuses(b));
  b.clear();
  put(b, {0x92, 0x00, 0x91, 0x85});
  put_str(b, "type");
  put_str(b, "BlockStored");
  put_str(b, "block_hashes");
  put(b, {0x90});
  put_str(b, "token_ids");
  put(b, {0x91, 0xCF, 0, 0, 0, 1, 0, 0, 0, 0});  // 2**32
  put_str(b, "block_size");
  put(b, {0x01});
  put_str(b, "extra_keys");
  put(b, {0xC0});
  CHECK(refuses(b));
  // The same event with a token of 2**32 - 1 and extra_keys nil is taken.
  b.clear();
  put(b, {0x92, 0x00, 0x91, 0x85});
  put_str(b, "type");
  put_str(b, "BlockStored");
  put_str(b, "block_hashes");
  put(b, {0x90});
  put_str(b, "token_ids");
  put(b, {0x91, 0xCF, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF});
  put_str(b, "block_size");
  put(b, {0x01});
  put_str(b, "extra_keys");
  put(b, {0xC0});
  CHECK(!refuses(b));
  CHECK(out.tokens.size() == 1 && out.tokens[0] == 0xFFFFFFFFu);
  b.back() = 0x90;  // extra_keys = [] is not nil
  CHECK(refuses(b));
}

void test_two_kinds_for_one_name_throw() {
  bool threw = false;
  try {
    BatchScanner({{"A", {{"x", FieldKind::kSize, false}}},
                  {"B", {{"x", FieldKind::kStrOrNil, false}}}}, kDepth);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  threw = false;
  try {
    BatchScanner({{"A", {}}}, 3);  // below the batch's own nesting
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

// UTF-8 by code points: each sequence decoded by its lead byte's length, then
// refused if it is overlong, a surrogate or above U+10FFFF.
bool reference_utf8(const uint8_t* s, size_t n) {
  for (size_t i = 0; i < n;) {
    const uint8_t c = s[i];
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || n - i < len) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += len;
  }
  return true;
}

// A recursive reading of the msgpack spec, the simple way: the definition
// check_message must agree with (whether the bytes are one well-formed value).
bool reference_value(const Bytes& b, size_t& at, uint32_t depth) {
  if (at >= b.size()) return false;
  const uint8_t t = b[at];
  auto take = [&](size_t n) {  // n more bytes after the header byte
    if (b.size() - at - 1 < n) return false;
    at += 1 + n;
    return true;
  };
  auto big_endian = [&](size_t n, uint64_t& v) {
    if (b.size() - at - 1 < n) return false;
    v = 0;
    for (size_t i = 1; i <= n; ++i) v = (v << 8) | b[at + i];
    return true;
  };
  auto text = [&](size_t head, uint64_t n) {  // a str of n bytes after a head-byte header
    if (b.size() - at < head || b.size() - at - head < n) return false;
    if (!reference_utf8(b.data() + at + head, static_cast<size_t>(n))) return false;
    at += head + n;
    return true;
  };
  auto items = [&](uint64_t n) {
    if (depth + 1 > kDepth) return false;
    for (uint64_t i = 0; i < n; ++i)
      if (!reference_value(b, at, depth + 1)) return false;
    return true;
  };
  uint64_t n = 0;
  if (t <= 0x7F || t >= 0xE0 || t == 0xC0 || t == 0xC2 || t == 0xC3) return take(0);
  if (t >= 0xA0 && t <= 0xBF) return text(1, t & 0x1F);
  if (t >= 0x90 && t <= 0x9F) return take(0) && items(t & 0x0F);
  if (t >= 0x80 && t <= 0x8F) return take(0) && items(2 * (t & 0x0F));
  switch (t) {
    case 0xCA: return take(4);
    case 0xCB: return take(8);
    case 0xCC: case 0xD0: return take(1);
    case 0xCD: case 0xD1: return take(2);
    case 0xCE: case 0xD2: return take(4);
    case 0xCF: case 0xD3: return take(8);
    case 0xD4: return take(2);
    case 0xD5: return take(3);
    case 0xD6: return take(5);
    case 0xD7: return take(9);
    case 0xD8: return take(17);
    case 0xD9: return big_endian(1, n) && text(2, n);
    case 0xDA: return big_endian(2, n) && text(3, n);
    case 0xDB: return big_endian(4, n) && text(5, n);
    case 0xC4: return big_endian(1, n) && take(1 + n);
    case 0xC5: return big_endian(2, n) && take(2 + n);
    case 0xC6: return big_endian(4, n) && take(4 + n);
    case 0xC7: return big_endian(1, n) && take(2 + n);
    case 0xC8: return big_endian(2, n) && take(3 + n);
    case 0xC9: return big_endian(4, n) && take(5 + n);
    case 0xDC: return big_endian(2, n) && take(2) && items(n);
    case 0xDD: return big_endian(4, n) && take(4) && items(n);
    case 0xDE: return big_endian(2, n) && take(2) && items(2 * n);
    case 0xDF: return big_endian(4, n) && take(4) && items(2 * n);
    default: return false;  // 0xC1
  }
}

bool reference_message(const Bytes& b) {
  size_t at = 0;
  return reference_value(b, at, 0) && at == b.size();
}

Bytes nested(uint32_t levels, uint8_t header) {
  Bytes b(levels, header);  // each a one-item array (0x91) or one-entry map key-first
  b.push_back(0xC0);
  return b;
}

void test_check_message_says_why() {
  auto check = [](const Bytes& b) { return check_message(b.data(), b.size(), kDepth); };
  const Bytes good = sample({1, 300, 70000});
  CHECK(check(good).ok());
  // Truncated: every prefix fails, a cut header at the end of the data.
  for (size_t n = 0; n < good.size(); ++n) {
    const Bytes cut(good.begin(), good.begin() + static_cast<long>(n));
    const Check c = check(cut);
    CHECK(c.problem == Problem::kTruncated || c.problem == Problem::kTooLong);
    if (c.problem == Problem::kTruncated) CHECK(c.offset == n);
  }
  // A length bomb: 2**32 - 1 items claimed in 10 bytes, refused at its header.
  Bytes bomb = {0x92, 0xCB, 0, 0, 0, 0, 0, 0, 0, 0, 0xDD, 0xFF, 0xFF, 0xFF, 0xFF};
  Check c = check(bomb);
  CHECK(c.problem == Problem::kTooLong && c.offset == 10 && c.claimed == 0xFFFFFFFFull &&
        c.header == 0xDD);
  bomb = {0x91, 0xDB, 0x7F, 0xFF, 0xFF, 0xFF, 'a'};  // a str32 of 2**31 - 1 bytes
  c = check(bomb);
  CHECK(c.problem == Problem::kTooLong && c.offset == 1 && c.claimed == 0x7FFFFFFFull);
  bomb = {0x83, 0x01, 0x02, 0x03, 0x04, 0x05};  // 3 entries need 6 bytes, 5 are left
  c = check(bomb);
  CHECK(c.problem == Problem::kTooLong && c.offset == 0 && c.claimed == 3);
  // Depth: 64 nested arrays (or maps) are taken, 65 are not; the 65th header is named.
  CHECK(check(nested(kDepth, 0x91)).ok());
  c = check(nested(kDepth + 1, 0x91));
  CHECK(c.problem == Problem::kTooDeep && c.offset == kDepth && c.header == 0x91);
  Bytes maps;
  for (uint32_t i = 0; i <= kDepth; ++i) put(maps, {0x81, 0x00});  // {0: {0: ...}}
  maps.push_back(0xC0);
  c = check(maps);
  CHECK(c.problem == Problem::kTooDeep && c.offset == 2 * kDepth);
  // An empty array at depth 65 is still too deep.
  Bytes empty = nested(kDepth, 0x91);
  empty.back() = 0x90;
  CHECK(check(empty).problem == Problem::kTooDeep);
  // The unused byte and trailing bytes.
  c = check(Bytes{0x92, 0x01, 0xC1});
  CHECK(c.problem == Problem::kInvalidByte && c.offset == 2);
  c = check(Bytes{0x91, 0x01, 0x02});
  CHECK(c.problem == Problem::kTrailing && c.offset == 2);
  // Exts and bins are sized by their headers; a fixext by its byte.
  CHECK(check(Bytes{0x93, 0xC7, 0x02, 0x05, 0xAA, 0xBB, 0xD4, 0x01, 0x07, 0xC4, 0x00}).ok());
  // Strings are UTF-8 (keys too), bins need not be; the str's header is named.
  CHECK(check(Bytes{0x92, 0xA2, 0xC3, 0xA9, 0xC4, 0x02, 0xFF, 0xFE}).ok());  // "é", a bin
  c = check(Bytes{0x81, 0x01, 0xA2, 0xC3, 0x28});
  CHECK(c.problem == Problem::kInvalidUtf8 && c.offset == 2);
  c = check(Bytes{0x81, 0xD9, 0x01, 0xFF, 0x01});
  CHECK(c.problem == Problem::kInvalidUtf8 && c.offset == 1);
}

// The UTF-8 rule, against the code-point definition, on every 1- and 2-byte
// string and on random 3- and 4-byte ones biased towards the edges.
void test_utf8_matches_the_definition() {
  using radixmeta::msgpack::detail::valid_utf8;
  int agreed = 0, total = 0;
  for (int a = 0; a < 256; ++a) {
    const uint8_t one[1] = {static_cast<uint8_t>(a)};
    agreed += valid_utf8(one, 1) == reference_utf8(one, 1);
    ++total;
    for (int b = 0; b < 256; ++b) {
      const uint8_t two[2] = {static_cast<uint8_t>(a), static_cast<uint8_t>(b)};
      agreed += valid_utf8(two, 2) == reference_utf8(two, 2);
      ++total;
    }
  }
  std::mt19937 rng(5);
  const uint8_t edges[] = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2,
                           0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
  for (int i = 0; i < 200000; ++i) {
    uint8_t s[4];
    const size_t n = 3 + rng() % 2;
    for (size_t k = 0; k < n; ++k)
      s[k] = rng() % 2 ? edges[rng() % sizeof edges] : static_cast<uint8_t>(rng());
    agreed += valid_utf8(s, n) == reference_utf8(s, n);
    ++total;
  }
  CHECK(agreed == total);
}

// check_message agrees with the recursive definition on damaged batches, and
// every batch the scanner takes passes it.
void test_check_message_matches_the_definition() {
  const BatchScanner scanner = vllm_like();
  const Bytes base = sample({1, 2, 300, 70000, 5, 6});
  std::mt19937 rng(11);
  ScannedBatch out;
  int agreed = 0;
  for (int i = 0; i < 20000; ++i) {
    Bytes b = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] = static_cast<uint8_t>(rng()); break;
        case 1: b.insert(b.begin() + static_cast<long>(at), static_cast<uint8_t>(rng())); break;
        default: b.erase(b.begin() + static_cast<long>(at)); break;
      }
      if (b.empty()) b.push_back(0x90);
    }
    const bool ok = check_message(b.data(), b.size(), kDepth).ok();
    agreed += ok == reference_message(b);
    if (scanner.scan(b.data(), b.size(), out)) CHECK(ok);
  }
  CHECK(agreed == 20000);
  // Deep values the scanner skips: an unknown field inside the event's map (at
  // depth 3) may hold 61 nested arrays, not 62.
  for (uint32_t levels : {kDepth - 3, kDepth - 2}) {
    Bytes b;
    put(b, {0x92, 0x00, 0x91, 0x83});
    put_str(b, "type");
    put_str(b, "BlockRemoved");
    put_str(b, "block_hashes");
    put(b, {0x90});
    put_str(b, "future");
    const Bytes deep = nested(levels, 0x91);
    b.insert(b.end(), deep.begin(), deep.end());
    const bool taken = scanner.scan(b.data(), b.size(), out);
    CHECK(taken == (levels == kDepth - 3));
    CHECK(taken == check_message(b.data(), b.size(), kDepth).ok());
  }
}

void test_mutations_stay_in_bounds() {
  const BatchScanner scanner = vllm_like();
  const Bytes base = sample({1, 2, 300, 70000, 5, 6});
  std::mt19937 rng(7);
  ScannedBatch out;
  for (int i = 0; i < 20000; ++i) {
    Bytes b = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    b.resize(rng() % (b.size() + 1));
    scanner.scan(b.data(), b.size(), out);  // only ASan/UBSan judge this
  }
  for (int i = 0; i < 20000; ++i) {
    Bytes b(rng() % 64);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    if (!b.empty()) b[0] = static_cast<uint8_t>(0x90 | (rng() % 4));
    scanner.scan(b.data(), b.size(), out);
  }
}

}  // namespace

int main() {
  test_reads_a_batch();
  test_refuses_every_prefix();
  test_refuses_what_it_does_not_take();
  test_two_kinds_for_one_name_throw();
  test_mutations_stay_in_bounds();
  test_check_message_says_why();
  test_check_message_matches_the_definition();
  test_utf8_matches_the_definition();
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("msgpack batch tests: all checks passed\n");
  return 0;
}
