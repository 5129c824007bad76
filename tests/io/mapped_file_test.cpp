// MappedFile under each weight residency: the same bytes whether mapped or copied into huge
// pages, clear errors for paths that are not regular files.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/mapped_file.h"
#include "io_test_util.h"

namespace {

using g4::MappedFile;
using g4::WeightResidency;

// Restores the process-wide residency when a test ends.
struct ResidencyScope {
  explicit ResidencyScope(WeightResidency r) { g4::set_weight_residency(r); }
  ~ResidencyScope() { g4::set_weight_residency(WeightResidency::Auto); }
};

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

TEST(MappedFile, CopyAndMmapHoldTheSameBytes) {
  g4test::TempDir dir;
  // Crosses two 2 MiB boundaries and ends mid-page, so the last piece of the copy is short.
  const auto bytes = random_bytes((size_t(5) << 20) + 12345, 7);
  const std::string path = dir.file("w.bin");
  g4test::write_bytes(path, bytes);
  for (WeightResidency r : {WeightResidency::Mmap, WeightResidency::Copy, WeightResidency::Auto}) {
    ResidencyScope scope(r);
    auto f = MappedFile::open(path);
    ASSERT_TRUE(f.is_ok()) << f.message();
    const auto& m = *f.value();
    ASSERT_EQ(m.size(), bytes.size());
    EXPECT_EQ(std::memcmp(m.data(), bytes.data(), bytes.size()), 0);
    EXPECT_EQ(m.copied(), r != WeightResidency::Mmap);  // 5 MiB is well under Auto's limits
    if (m.copied()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % (2u << 20), 0u);
    }
  }
}

TEST(MappedFile, EmptyFileHasNoBytes) {
  g4test::TempDir dir;
  const std::string path = dir.file("empty.bin");
  g4test::write_bytes(path, {});
  for (WeightResidency r : {WeightResidency::Mmap, WeightResidency::Copy}) {
    ResidencyScope scope(r);
    auto f = MappedFile::open(path);
    ASSERT_TRUE(f.is_ok()) << f.message();
    EXPECT_EQ(f.value()->size(), 0u);
  }
}

TEST(MappedFile, ErrorsNameThePath) {
  g4test::TempDir dir;
  for (WeightResidency r : {WeightResidency::Mmap, WeightResidency::Copy}) {
    ResidencyScope scope(r);
    auto missing = MappedFile::open(dir.file("nope.bin"));
    ASSERT_FALSE(missing.is_ok());
    EXPECT_NE(missing.message().find("nope.bin: cannot open"), std::string::npos) << missing.message();
    auto directory = MappedFile::open(dir.path());
    ASSERT_FALSE(directory.is_ok());
    EXPECT_NE(directory.message().find("not a regular file"), std::string::npos) << directory.message();
  }
}

TEST(MappedFile, ParsesResidencyNames) {
  EXPECT_EQ(g4::parse_weight_residency("auto"), WeightResidency::Auto);
  EXPECT_EQ(g4::parse_weight_residency("mmap"), WeightResidency::Mmap);
  EXPECT_EQ(g4::parse_weight_residency("copy"), WeightResidency::Copy);
  EXPECT_FALSE(g4::parse_weight_residency("Copy").has_value());
  EXPECT_FALSE(g4::parse_weight_residency("").has_value());
}

}  // namespace
