// PromptStore (runtime/prompt_store.h): entries written by one store are read back by the next
// (newest first, within a budget), whole and checked; files that are cut short, corrupted or of
// another key are skipped with a warning and left on disk; the disk bound removes the oldest,
// and an entry whose tokens begin a newer one's is removed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/prompt_store.h"

namespace g4 {
namespace {
namespace fs = std::filesystem;

struct Dir {
  fs::path path;
  Dir() {
    path = fs::temp_directory_path() / ("g4_prompt_store_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                        "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
  }
  ~Dir() { fs::remove_all(path); }
  std::vector<fs::path> files() const {
    std::vector<fs::path> f;
    for (const auto& e : fs::directory_iterator(path)) f.push_back(e.path());
    return f;
  }
};

std::vector<uint8_t> state_of(int n, uint8_t seed) {
  std::vector<uint8_t> s(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) s[size_t(i)] = uint8_t(seed + 7 * i);
  return s;
}

using Loaded = std::vector<std::pair<std::vector<int32_t>, std::vector<uint8_t>>>;
Loaded load_all(PromptStore& st, size_t budget = size_t(1) << 30) {
  Loaded got;
  st.load(budget, [&](std::vector<int32_t> t, std::vector<uint8_t> s) {
    got.emplace_back(std::move(t), std::move(s));
    return true;
  });
  return got;
}

TEST(PromptEntry, RoundTripsAndRefusesWhatIsNotWhole) {
  const std::vector<int32_t> tokens{2, 10, 11, 12};
  const auto state = state_of(300, 3);
  const std::string bytes = encode_prompt_entry("key A", tokens, state);
  std::vector<int32_t> t;
  std::vector<uint8_t> s;
  std::string why;
  ASSERT_TRUE(decode_prompt_entry(bytes, "key A", &t, &s, &why)) << why;
  EXPECT_EQ(t, tokens);
  EXPECT_EQ(s, state);
  EXPECT_FALSE(decode_prompt_entry(bytes, "key B", &t, &s, &why));
  EXPECT_NE(why.find("another model"), std::string::npos) << why;
  for (size_t n : {size_t(0), size_t(5), size_t(12), size_t(30), bytes.size() - 1}) {
    EXPECT_FALSE(decode_prompt_entry(bytes.substr(0, n), "key A", &t, &s, &why)) << n;
  }
  std::string flipped = bytes;
  flipped[bytes.size() - 10] ^= 0x20;  // a state byte
  EXPECT_FALSE(decode_prompt_entry(flipped, "key A", &t, &s, &why));
  EXPECT_NE(why.find("checksum"), std::string::npos) << why;
  flipped = bytes;
  flipped[8] = 9;  // the format version
  EXPECT_FALSE(decode_prompt_entry(flipped, "key A", &t, &s, &why));
  EXPECT_NE(why.find("version"), std::string::npos) << why;
}

TEST(PromptStore, ARestartedStoreReadsItsEntriesNewestFirst) {
  Dir d;
  std::vector<std::string> warnings;
  auto warn = [&](const std::string& m) { warnings.push_back(m); };
  {
    PromptStore st(d.path.string(), "k", size_t(1) << 20, warn);
    st.save({1, 2, 3}, state_of(100, 1));
    st.save({7, 8}, state_of(50, 2));
    st.flush();
    EXPECT_EQ(st.entries(), 2u);
  }
  PromptStore st(d.path.string(), "k", size_t(1) << 20, warn);
  const Loaded got = load_all(st);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(got[0].second, state_of(50, 2));
  EXPECT_EQ(got[1].first, (std::vector<int32_t>{1, 2, 3}));
  // A budget for the newest alone.
  const Loaded newest = load_all(st, encode_prompt_entry("k", {7, 8}, state_of(50, 2)).size());
  ASSERT_EQ(newest.size(), 1u);
  EXPECT_EQ(newest[0].first, (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(warnings.empty());
}

TEST(PromptStore, SkipsBrokenAndForeignFilesAndLeavesThem) {
  Dir d;
  std::vector<std::string> warnings;
  auto warn = [&](const std::string& m) { warnings.push_back(m); };
  {
    PromptStore st(d.path.string(), "mine", size_t(1) << 20, warn);
    st.save({1, 2, 3}, state_of(100, 1));
    st.save({4, 5}, state_of(100, 2));
    st.flush();
  }
  {
    PromptStore other(d.path.string(), "theirs", size_t(1) << 20, warn);
    other.save({9, 9, 9}, state_of(80, 3));
    other.flush();
  }
  // Corrupt one of ours (a state byte), cut the other short, and add a file that is no entry.
  std::vector<fs::path> ours;
  for (const fs::path& f : d.files()) {
    std::ifstream in(f, std::ios::binary);
    std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (b.find("mine") != std::string::npos) ours.push_back(f);
  }
  ASSERT_EQ(ours.size(), 2u);
  {
    std::fstream f(ours[0], std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(-5, std::ios::end);
    f.put('\x55');
  }
  fs::resize_file(ours[1], fs::file_size(ours[1]) - 20);
  std::ofstream(d.path / "junk.g4kv") << "hello";
  warnings.clear();
  PromptStore st(d.path.string(), "mine", size_t(1) << 20, warn);
  EXPECT_TRUE(load_all(st).empty());
  EXPECT_EQ(warnings.size(), 3u);  // junk (at the scan), then the two of ours
  EXPECT_EQ(d.files().size(), 4u);  // nothing removed
  // The other key's entry is still whole for its own store.
  PromptStore theirs(d.path.string(), "theirs", size_t(1) << 20, warn);
  EXPECT_EQ(load_all(theirs).size(), 1u);
}

TEST(PromptStore, TheDiskBoundRemovesTheOldestAndExtendedPrefixesGo) {
  Dir d;
  auto warn = [](const std::string&) {};
  const size_t one = encode_prompt_entry("k", {1, 2}, state_of(1000, 0)).size();
  PromptStore st(d.path.string(), "k", 2 * one + one / 2, warn);  // room for two entries
  st.save({1, 2}, state_of(1000, 1));
  st.save({3, 4}, state_of(1000, 2));
  st.save({5, 6}, state_of(1000, 3));
  st.flush();
  EXPECT_EQ(st.entries(), 2u);
  EXPECT_LE(st.bytes(), 2 * one + one / 2);
  Loaded got = load_all(st);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(got[1].first, (std::vector<int32_t>{3, 4}));
  // {3, 4, 9} extends {3, 4}: the shorter entry goes, not the older {5, 6}.
  st.save({3, 4, 9}, state_of(1000, 4));
  st.flush();
  got = load_all(st);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, (std::vector<int32_t>{3, 4, 9}));
  EXPECT_EQ(got[1].first, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(d.files().size(), 2u);
}

}  // namespace
}  // namespace g4
