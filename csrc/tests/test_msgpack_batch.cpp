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
using radixmeta::msgpack::EventSpec;
using radixmeta::msgpack::FieldKind;
using radixmeta::msgpack::ScannedBatch;

namespace {

using Bytes = std::vector<uint8_t>;

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
  });
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
                  {"B", {{"x", FieldKind::kStrOrNil, false}}}});
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
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
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("msgpack batch tests: all checks passed\n");
  return 0;
}
