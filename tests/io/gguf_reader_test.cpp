// GGUF reader: every value type, tensor infos, alignment, and hostile files (truncation at every
// offset, counts that overflow, bad offsets/types/dims). Files are built byte by byte here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>

#include "gguf_builder.h"
#include "io/gguf.h"

namespace g4 {
namespace {

using namespace g4::test;

template <class T>
T val(Result<T> r) {
  EXPECT_TRUE(r.is_ok()) << r.message();
  if (!r.is_ok()) return T{};
  return std::move(r).value();
}

Result<std::shared_ptr<const GgufFile>> parse_bytes(std::vector<uint8_t> bytes,
                                                    const std::string& name = "mem.gguf") {
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  return GgufFile::parse(owner, owner->data(), owner->size(), name);
}

// A small valid file using every metadata type and three tensor types.
GgufImage valid_image(size_t alignment = 64) {
  GgufImage im;
  im.alignment = alignment;
  GgufBytes& k = im.kv;
  k.str("t.u8"); k.u32(T_U8); k.u8(200); ++im.n_kv;
  k.str("t.i8"); k.u32(T_I8); k.put<int8_t>(-5); ++im.n_kv;
  k.str("t.u16"); k.u32(T_U16); k.put<uint16_t>(60000); ++im.n_kv;
  k.str("t.i16"); k.u32(T_I16); k.put<int16_t>(-30000); ++im.n_kv;
  kv_u32(im, "t.u32", 4000000000u);
  k.str("t.i32"); k.u32(T_I32); k.put<int32_t>(-2000000000); ++im.n_kv;
  kv_f32(im, "t.f32", 1.5f);
  kv_bool(im, "t.bool", true);
  kv_str(im, "t.string", "hello");
  k.str("t.u64"); k.u32(T_U64); k.u64(1ull << 40); ++im.n_kv;
  k.str("t.i64"); k.u32(T_I64); k.i64(-(1ll << 40)); ++im.n_kv;
  k.str("t.f64"); k.u32(T_F64); k.put<double>(0.25); ++im.n_kv;
  k.str("t.arr_i32"); k.u32(T_ARRAY); k.u32(T_I32); k.u64(3);
  k.put<int32_t>(1); k.put<int32_t>(-2); k.put<int32_t>(3); ++im.n_kv;
  kv_str_array(im, "t.arr_str", {"a", "", "ccc"});
  // array of 2 arrays: [[1,2],[true]] (u8 then bool)
  k.str("t.nested"); k.u32(T_ARRAY); k.u32(T_ARRAY); k.u64(2);
  k.u32(T_U8); k.u64(2); k.u8(1); k.u8(2);
  k.u32(T_BOOL); k.u64(1); k.u8(1);
  ++im.n_kv;
  k.str("t.arr_f32"); k.u32(T_ARRAY); k.u32(T_F32); k.u64(2); k.put(0.5f); k.put(-1.f); ++im.n_kv;
  k.str("general.alignment"); k.u32(T_U32); k.u32(uint32_t(alignment)); ++im.n_kv;
  im.tensors.push_back({"w.f32", 0, {4}, filled(16, 1)});
  im.tensors.push_back({"w.q8", 8, {64, 2}, filled(2 * 2 * 34, 3)});  // 2 blocks per row, 2 rows
  im.tensors.push_back({"w.f16", 1, {3, 2, 1}, filled(12, 9)});
  return im;
}

TEST(GgufReader, ReadsEveryValueTypeAndTensor) {
  GgufImage im = valid_image();
  std::vector<uint8_t> bytes = im.build();
  auto r = parse_bytes(bytes);
  ASSERT_TRUE(r.is_ok()) << r.message();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.metadata().size(), im.n_kv);
  EXPECT_EQ(val(f.get_int("t.u8")), 200);
  EXPECT_EQ(val(f.get_int("t.i8")), -5);
  EXPECT_EQ(val(f.get_int("t.u16")), 60000);
  EXPECT_EQ(val(f.get_int("t.i16")), -30000);
  EXPECT_EQ(val(f.get_u32("t.u32")), 4000000000u);
  EXPECT_EQ(val(f.get_int("t.i32")), -2000000000);
  EXPECT_EQ(val(f.get_f32("t.f32")), 1.5f);
  EXPECT_EQ(val(f.get_bool("t.bool")), true);
  EXPECT_EQ(val(f.get_string("t.string")), "hello");
  EXPECT_EQ(val(f.get_u64("t.u64")), 1ull << 40);
  EXPECT_EQ(val(f.get_int("t.i64")), -(1ll << 40));
  EXPECT_EQ(val(f.get_f64("t.f64")), 0.25);
  EXPECT_EQ(val(f.get_int_array("t.arr_i32")), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(val(f.get_string_array("t.arr_str")), (std::vector<std::string_view>{"a", "", "ccc"}));
  EXPECT_EQ(val(f.get_f32_array("t.arr_f32")), (std::vector<float>{0.5f, -1.f}));
  const GgufArray* n = f.get_array("t.nested");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->elem_type, GgufType::ARRAY);
  ASSERT_EQ(n->arrays.size(), 2u);
  EXPECT_EQ(n->arrays[0].arr->elem_type, GgufType::U8);
  EXPECT_EQ(n->arrays[0].arr->at(1).u, 2u);
  EXPECT_EQ(n->arrays[1].arr->elem_type, GgufType::BOOL);
  EXPECT_EQ(n->arrays[1].arr->at(0).u, 1u);

  ASSERT_EQ(f.tensors().size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    const GgufTensor& t = f.tensors()[k];
    const TensorSpec& s = im.tensors[k];
    EXPECT_EQ(t.name, s.name);
    EXPECT_EQ(t.type, s.type);
    EXPECT_EQ(t.ne, s.ne);
    EXPECT_EQ(t.nbytes, s.data.size());
    EXPECT_EQ(t.offset % 64, 0u);
    EXPECT_EQ(0, std::memcmp(t.data, s.data.data(), s.data.size())) << t.name;
    EXPECT_EQ(uint64_t(t.data - f.tensors()[0].data), t.offset - f.tensors()[0].offset);
  }
  const GgufTensor* q8 = f.tensor("w.q8");
  ASSERT_NE(q8, nullptr);
  EXPECT_EQ(q8->row_bytes(), 68);
  EXPECT_EQ(q8->n_rows(), 2);
  EXPECT_EQ(f.tensor("nope"), nullptr);
}

TEST(GgufReader, OpensFromDiskAndDefaultAlignment) {
  GgufImage im = valid_image(32);
  std::vector<uint8_t> bytes = im.build();
  std::string path = ::testing::TempDir() + "gguf_reader_disk.gguf";
  { std::ofstream(path, std::ios::binary).write((const char*)bytes.data(), bytes.size()); }
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ((*r)->path(), path);
  EXPECT_EQ((*r)->alignment(), 32u);
  EXPECT_EQ((*r)->file_size(), bytes.size());
  std::remove(path.c_str());
  auto missing = GgufFile::open(path);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find(path), std::string::npos);
}

TEST(GgufReader, TypedGettersNameTheKey) {
  auto r = parse_bytes(valid_image().build(), "typed.gguf");
  ASSERT_TRUE(r.is_ok()) << r.message();
  const GgufFile& f = **r;
  auto m = f.get_int("no.such.key");
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.message().find("typed.gguf"), std::string::npos);
  EXPECT_NE(m.message().find("no.such.key"), std::string::npos);
  auto s = f.get_string("t.u32");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("t.u32"), std::string::npos);
  EXPECT_NE(s.message().find("u32"), std::string::npos);
  EXPECT_FALSE(f.get_u32("t.i8").is_ok());   // negative
  EXPECT_FALSE(f.get_u32("t.u64").is_ok());  // > u32
  EXPECT_FALSE(f.get_f32("t.u32").is_ok());
  EXPECT_FALSE(f.get_bool("t.u8").is_ok());
  EXPECT_FALSE(f.get_string_array("t.arr_i32").is_ok());
  EXPECT_FALSE(f.get_int_array("t.arr_str").is_ok());
  EXPECT_FALSE(f.get_f32_array("t.arr_i32").is_ok());
}

TEST(GgufReader, EveryTruncationFails) {
  std::vector<uint8_t> bytes = valid_image().build();
  ASSERT_TRUE(parse_bytes(bytes).is_ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(n));
    auto r = parse_bytes(cut, "cut.gguf");
    ASSERT_FALSE(r.is_ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(r.message().rfind("cut.gguf: ", 0), 0u) << r.message();
    EXPECT_EQ(r.message().find('\n'), std::string::npos);
  }
}

// Hostile headers: build a file whose kv section is `kv` (n_kv entries) and expect an error that
// mentions every string in `want`.
void expect_kv_error(const std::function<void(GgufImage&)>& make,
                     const std::vector<std::string>& want) {
  GgufImage im;
  make(im);
  auto r = parse_bytes(im.build(), "bad.gguf");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.message().rfind("bad.gguf: ", 0), 0u) << r.message();
  for (const auto& w : want) EXPECT_NE(r.message().find(w), std::string::npos) << r.message();
}

TEST(GgufReader, RejectsBadHeaders) {
  std::vector<uint8_t> good = valid_image().build();
  auto with = [&](size_t at, std::vector<uint8_t> patch) {
    std::vector<uint8_t> b = good;
    std::copy(patch.begin(), patch.end(), b.begin() + long(at));
    return parse_bytes(b, "bad.gguf");
  };
  auto r = with(0, {'G', 'G', 'U', 'X'});
  EXPECT_NE(r.message().find("magic"), std::string::npos) << r.message();
  r = with(4, {1, 0, 0, 0});
  EXPECT_NE(r.message().find("version 1"), std::string::npos) << r.message();
  r = with(4, {4, 0, 0, 0});
  EXPECT_NE(r.message().find("version 4"), std::string::npos) << r.message();
  r = with(4, {0, 0, 0, 3});
  EXPECT_NE(r.message().find("big-endian"), std::string::npos) << r.message();
  r = with(8, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});  // tensor count
  EXPECT_NE(r.message().find("tensor count"), std::string::npos) << r.message();
  r = with(16, {0, 0, 0, 0, 0, 0, 0, 0x10});  // kv count
  EXPECT_NE(r.message().find("metadata count"), std::string::npos) << r.message();
  // v2 files parse like v3.
  r = with(4, {2, 0, 0, 0});
  EXPECT_TRUE(r.is_ok()) << r.message();
}

TEST(GgufReader, RejectsBadMetadata) {
  // Key length past EOF.
  expect_kv_error([](GgufImage& im) { im.kv.u64(1ull << 62); im.kv.b.resize(64); im.n_kv = 1; },
                  {"metadata key #0", "past end"});
  // String value past EOF.
  expect_kv_error([](GgufImage& im) { im.kv.str("k.s"); im.kv.u32(T_STRING); im.kv.u64(~0ull); im.kv.b.resize(96); im.n_kv = 1; },
                  {"k.s", "past end"});
  // Unknown value type.
  expect_kv_error([](GgufImage& im) { im.kv.str("k.t"); im.kv.u32(13); im.kv.u32(0); im.n_kv = 1; },
                  {"k.t", "unknown value type 13"});
  // Unknown array element type.
  expect_kv_error([](GgufImage& im) { im.kv.str("k.a"); im.kv.u32(T_ARRAY); im.kv.u32(99); im.kv.u64(0); im.n_kv = 1; },
                  {"k.a", "element type 99"});
  // Array counts that cannot fit (fixed-size, strings, nested; count*size would overflow).
  for (uint32_t et : {T_U32, T_U64, T_STRING, T_ARRAY}) {
    expect_kv_error([et](GgufImage& im) {
      im.kv.str("k.n"); im.kv.u32(T_ARRAY); im.kv.u32(et); im.kv.u64(0x2000000000000001ull);
      im.kv.u64(0); im.n_kv = 1;
    }, {"k.n", "array count"});
  }
  // Deeply nested arrays.
  expect_kv_error([](GgufImage& im) {
    im.kv.str("k.deep"); im.kv.u32(T_ARRAY);
    for (int d = 0; d < 100; ++d) { im.kv.u32(T_ARRAY); im.kv.u64(1); }
    im.kv.u32(T_U8); im.kv.u64(0); im.n_kv = 1;
  }, {"k.deep", "nested"});
  // Bool that is not 0/1.
  expect_kv_error([](GgufImage& im) { im.kv.str("k.b"); im.kv.u32(T_BOOL); im.kv.u8(2); im.n_kv = 1; },
                  {"k.b", "bool"});
  // Duplicate key.
  expect_kv_error([](GgufImage& im) { kv_u32(im, "k.d", 1); kv_u32(im, "k.d", 2); }, {"duplicate", "k.d"});
  // Empty key.
  expect_kv_error([](GgufImage& im) { kv_u32(im, "", 1); }, {"empty name"});
  // Alignment: wrong type, zero, not a power of two.
  expect_kv_error([](GgufImage& im) { kv_f32(im, "general.alignment", 32.f); }, {"general.alignment", "u32"});
  expect_kv_error([](GgufImage& im) { kv_u32(im, "general.alignment", 0); }, {"general.alignment"});
  expect_kv_error([](GgufImage& im) { kv_u32(im, "general.alignment", 48); }, {"general.alignment", "power of two"});
}

GgufImage one_tensor(TensorSpec t) {
  GgufImage im;
  im.tensors.push_back(std::move(t));
  return im;
}

void expect_tensor_error(GgufImage im, const std::vector<std::string>& want) {
  auto r = parse_bytes(im.build(), "badt.gguf");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.message().rfind("badt.gguf: ", 0), 0u) << r.message();
  for (const auto& w : want) EXPECT_NE(r.message().find(w), std::string::npos) << r.message();
}

TEST(GgufReader, RejectsBadTensors) {
  expect_tensor_error(one_tensor({"t.nodims", 0, {}, {}}), {"t.nodims", "0 dims"});
  expect_tensor_error(one_tensor({"t.5d", 0, {1, 1, 1, 1, 1}, filled(4, 0)}), {"t.5d", "5 dims"});
  expect_tensor_error(one_tensor({"t.neg", 0, {4, -1}, {}}), {"t.neg", "negative"});
  expect_tensor_error(one_tensor({"t.big", 0, {1ll << 32, 1ll << 32}, {}}), {"t.big", "overflow"});
  // Product fits in int64 but the byte count does not.
  expect_tensor_error(one_tensor({"t.bytes", 0, {1ll << 31, 1ll << 31}, {}}), {"t.bytes", "overflow"});
  expect_tensor_error(one_tensor({"t.type", 31, {4}, filled(4, 0)}), {"t.type", "unknown ggml type 31"});
  expect_tensor_error(one_tensor({"t.type2", 1000, {4}, filled(4, 0)}), {"t.type2", "1000"});
  expect_tensor_error(one_tensor({"t.blk", 8, {30, 1}, filled(34, 0)}), {"t.blk", "block size"});
  // Offset not a multiple of the alignment.
  expect_tensor_error(one_tensor({"t.mis", 0, {4}, filled(16, 0), 8}), {"t.mis", "alignment"});
  // Data past the end of the file: declare more elements than the data written.
  {
    GgufImage im = one_tensor({"t.short", 0, {8}, filled(16, 0)});
    expect_tensor_error(im, {"t.short", "past the end"});
  }
  // Offset near 2^64 (offset + nbytes would wrap).
  expect_tensor_error(one_tensor({"t.wrap", 0, {4}, {}, int64_t(0x7fffffffffffffe0ll)}), {"t.wrap", "past the end"});
  // Overlapping tensors.
  {
    GgufImage im;
    im.tensors.push_back({"t.a", 0, {16}, filled(64, 0), 0});
    im.tensors.push_back({"t.b", 0, {8}, filled(32, 0), 32});
    expect_tensor_error(im, {"overlaps", "t.a", "t.b"});
  }
  // Duplicate names.
  {
    GgufImage im;
    im.tensors.push_back({"t.dup", 0, {4}, filled(16, 0)});
    im.tensors.push_back({"t.dup", 0, {4}, filled(16, 0)});
    expect_tensor_error(im, {"duplicate", "t.dup"});
  }
  // Empty name.
  expect_tensor_error(one_tensor({"", 0, {4}, filled(16, 0)}), {"tensor #0", "empty"});
}

TEST(GgufReader, ZeroTensorFileEndsAnywhereAfterMetadata) {
  GgufImage im;
  kv_str(im, "general.architecture", "x");
  auto r = parse_bytes(im.build());
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_TRUE((*r)->tensors().empty());
}

TEST(GgufReader, TypeTableMatchesGgml) {
  // Block geometry from ggml.c type_traits for the formats we read (independent constants).
  struct Row { uint32_t id; const char* name; int64_t be, bb; };
  for (Row r : {Row{0, "F32", 1, 4}, Row{1, "F16", 1, 2}, Row{30, "BF16", 1, 2},
                Row{2, "Q4_0", 32, 18}, Row{6, "Q5_0", 32, 22}, Row{8, "Q8_0", 32, 34},
                Row{12, "Q4_K", 256, 144}, Row{13, "Q5_K", 256, 176}, Row{14, "Q6_K", 256, 210}}) {
    const GgmlTypeInfo* t = ggml_type_info(r.id);
    ASSERT_NE(t, nullptr) << r.name;
    EXPECT_STREQ(t->name, r.name);
    EXPECT_EQ(t->block_elems, r.be) << r.name;
    EXPECT_EQ(t->block_bytes, r.bb) << r.name;
  }
  for (uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u}) EXPECT_EQ(ggml_type_info(removed), nullptr);
  EXPECT_EQ(ggml_type_name(31), "type#31");
}

}  // namespace
}  // namespace g4
