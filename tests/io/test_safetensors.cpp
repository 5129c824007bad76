// SafetensorsFile: a valid file round-trips; every malformed-file case gives one error line that
// names the file (and the tensor when there is one).
#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "io_test_util.h"

using namespace g4;
using namespace g4test;

namespace {

Result<std::shared_ptr<SafetensorsFile>> open_image(const TempDir& d, const std::vector<uint8_t>& img) {
  std::string p = d.file("x.safetensors");
  write_bytes(p, img);
  return SafetensorsFile::open(p);
}

// Expects failure whose single-line message contains every fragment.
void expect_error(const Result<std::shared_ptr<SafetensorsFile>>& r, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.message().find('\n'), std::string::npos) << r.message();
  for (const char* p : parts) EXPECT_NE(r.message().find(p), std::string::npos) << "'" << p << "' not in: " << r.message();
}

std::vector<uint8_t> hdr(const std::string& json, size_t data_bytes) { return raw_file(json, pattern(data_bytes)); }

}  // namespace

TEST(Safetensors, ReadsValidFile) {
  TempDir d;
  std::vector<float> a = {1.f, -2.5f, 3.25f, 0.f, 7.f, 8.f};
  auto img = st_image({T{"a", "F32", {2, 3}, f32_bytes(a)}, pat("b", "BF16", {5}), pat("c.weight", "U32", {4, 2}, 7),
                       T{"empty", "F16", {0, 4}, {}}},
                      {{"format", "mlx"}});
  auto r = open_image(d, img);
  ASSERT_TRUE(r.is_ok()) << r.message();
  const auto& f = **r;
  EXPECT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.metadata().at("format"), "mlx");
  const TensorInfo* ta = f.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, DType::F32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->nbytes, 24u);
  float got[6];
  std::memcpy(got, ta->data, 24);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], a[i]);
  const TensorInfo* tc = f.find("c.weight");
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(tc->dtype, DType::U32);
  auto pc = pattern(32, 7);
  EXPECT_EQ(std::memcmp(tc->data, pc.data(), 32), 0);
  EXPECT_EQ(tc->data - ta->data, 24 + 10);  // contiguous data block, in writing order
  const TensorInfo* te = f.find("empty");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->nbytes, 0u);
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, EmptyHeaderObjectIsValid) {
  TempDir d;
  auto r = open_image(d, raw_file("{}      ", {}));
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_TRUE((*r)->tensors().empty());
}

TEST(Safetensors, NullMetadataIsAccepted) {
  TempDir d;
  auto r = open_image(d, hdr(R"({"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2));
  ASSERT_TRUE(r.is_ok()) << r.message();
}

TEST(Safetensors, MissingFile) {
  auto r = SafetensorsFile::open("/nonexistent/dir/model.safetensors");
  expect_error(r, {"/nonexistent/dir/model.safetensors"});
}

TEST(Safetensors, TooShort) {
  TempDir d;
  expect_error(open_image(d, {}), {"x.safetensors", "too short", "0 bytes"});
  expect_error(open_image(d, {1, 0, 0, 0, 0, 0, 0}), {"x.safetensors", "too short", "7 bytes"});
}

TEST(Safetensors, HeaderLengthPastEof) {
  TempDir d;
  auto img = u64le(100);
  std::string h = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  img.insert(img.end(), h.begin(), h.end());
  expect_error(open_image(d, img), {"x.safetensors", "header length 100", "past the end"});
}

TEST(Safetensors, HeaderLengthAbsurd) {
  TempDir d;
  auto img = u64le(~0ull);
  img.resize(64, ' ');
  expect_error(open_image(d, img), {"x.safetensors", "exceeds"});
  img = u64le(SafetensorsFile::kMaxHeaderBytes + 1);
  img.resize(64, ' ');
  expect_error(open_image(d, img), {"x.safetensors", "exceeds"});
}

TEST(Safetensors, InvalidJson) {
  TempDir d;
  expect_error(open_image(d, hdr(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})", 1)),
               {"x.safetensors", "not valid JSON"});
  expect_error(open_image(d, hdr("[1,2,3]", 0)), {"x.safetensors", "expected an object"});
  expect_error(open_image(d, hdr(std::string("{\"a\":\xff}"), 0)), {"x.safetensors", "not valid JSON"});
}

TEST(Safetensors, DuplicateTensorName) {
  TempDir d;
  expect_error(open_image(d, hdr(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                 R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                 2)),
               {"x.safetensors", "'a'", "twice"});
}

TEST(Safetensors, BadEntries) {
  TempDir d;
  expect_error(open_image(d, hdr(R"({"w":[1]})", 0)), {"x.safetensors", "'w'", "expected an object"});
  expect_error(open_image(d, hdr(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1)), {"'w'", "dtype"});
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1)),
               {"x.safetensors", "'w'", "unknown dtype 'Q4'"});
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1)), {"'w'", "shape"});
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1)),
               {"'w'", "non-negative"});
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1)),
               {"'w'", "non-negative"});
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1)),
               {"'w'", "data_offsets"});
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1)),
               {"'w'", "data_offsets"});
  expect_error(open_image(d, hdr(R"({"__metadata__":{"k":1}})", 0)), {"x.safetensors", "__metadata__", "'k'"});
  expect_error(open_image(d, hdr(R"({"__metadata__":[1]})", 0)), {"x.safetensors", "__metadata__"});
}

TEST(Safetensors, OffsetsOutOfRange) {
  TempDir d;
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 3)),
               {"x.safetensors", "'w'", "past the end of the data block (3 bytes)"});
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551612,18446744073709551615]}})", 4)),
               {"x.safetensors", "'w'"});
}

TEST(Safetensors, EndBeforeBegin) {
  TempDir d;
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[3,1]}})", 4)),
               {"x.safetensors", "'w'", "end 1 < begin 3"});
}

TEST(Safetensors, SizeMismatch) {
  TempDir d;
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24)),
               {"x.safetensors", "'w'", "20 bytes", "[2, 3]", "24"});
  expect_error(open_image(d, hdr(R"({"w":{"dtype":"BF16","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", 8)),
               {"x.safetensors", "'w'", "overflows"});
}

TEST(Safetensors, OverlappingRanges) {
  TempDir d;
  expect_error(open_image(d, hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                                 6)),
               {"x.safetensors", "overlaps", "'a'", "'b'"});
  // Identical ranges overlap too.
  expect_error(open_image(d, hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                                 4)),
               {"overlaps"});
  // Adjacent ranges and zero-sized tensors at the same offset are fine.
  auto ok = open_image(d, hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("z":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                              R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                              8));
  EXPECT_TRUE(ok.is_ok()) << ok.message();
}

// Truncating a valid file at every length never crashes and never succeeds with bad ranges.
TEST(Safetensors, EveryTruncationIsAnErrorOrConsistent) {
  TempDir d;
  auto img = st_image({pat("a", "F32", {3, 5}), pat("b", "BF16", {7}), pat("c", "U32", {2, 2})});
  for (size_t n = 0; n < img.size(); ++n) {
    std::vector<uint8_t> cut(img.begin(), img.begin() + n);
    auto r = SafetensorsFile::parse(cut.data(), cut.size(), "cut.safetensors", nullptr);
    EXPECT_FALSE(r.is_ok()) << "length " << n;
  }
  EXPECT_TRUE(open_image(d, img).is_ok());
}

// Random byte and length mutations of a valid file (seeded): open() must return (ok or one-line
// error) without crashing or reading out of bounds (this test also runs under ASan/UBSan), and
// every tensor of an accepted file must lie inside it.
TEST(Safetensors, MutatedFilesNeverCrash) {
  TempDir d;
  const auto img = st_image({pat("a", "F32", {3, 5}), pat("bb", "BF16", {7}), pat("c", "U32", {2, 2})},
                            {{"format", "mlx"}});
  uint64_t s = 0x9e3779b97f4a7c15ull;
  auto rnd = [&]() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  int accepted = 0;
  for (int it = 0; it < 2000; ++it) {
    auto m = img;
    const int edits = 1 + int(rnd() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rnd() % std::min<size_t>(m.size(), 8 + 200);  // mostly the length and header
      static const char digits[] = "0123456789,:[]{}\" -";
      m[pos] = (rnd() & 1) ? uint8_t(digits[rnd() % (sizeof digits - 1)]) : uint8_t(rnd());
    }
    auto r = SafetensorsFile::parse(m.data(), m.size(), "mutated.safetensors", nullptr);
    if (r.is_ok()) {
      ++accepted;
      for (const auto& t : (*r)->tensors()) EXPECT_LE(t.offset + t.nbytes, m.size());
    } else {
      EXPECT_EQ(r.message().find('\n'), std::string::npos);
    }
  }
  EXPECT_LT(accepted, 2000);
}
