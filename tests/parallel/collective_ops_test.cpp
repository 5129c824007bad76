// The backend's tensor-parallel ops (backend.h all_reduce, all_gather, place_cols) over the
// in-process group, on host memory and through the host-staged path a device backend takes with a
// host group (ranks sharing a GPU): a backend that reports its buffers as device memory while they
// are host RAM runs that path here, so CI checks it without a GPU. Oracle: the group's own
// collectives on plain host copies, and a per-row copy for place_cols.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backend/host_backend.h"
#include "parallel/inproc_communicator.h"
#include "parallel_test_util.h"

namespace g4 {
namespace {

// Host RAM that says it is device memory: Backend's defaults then copy through read_bytes /
// write_bytes (the staged path), and count them.
class StagedBackend final : public HostBackend {
 public:
  std::string name() const override { return "staged"; }
  bool on_device() const override { return true; }
  void read_bytes(const Buf& src, size_t bytes, void* dst) override {
    ++reads;
    HostBackend::read_bytes(src, bytes, dst);
  }
  void write_bytes(const void* src, size_t bytes, const Buf& dst) override {
    ++writes;
    HostBackend::write_bytes(src, bytes, dst);
  }
  int reads = 0, writes = 0;
};

std::vector<float> rank_values(int r, size_t n) {
  std::mt19937 rng(uint32_t(7 + r));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng) * float(1 + r);
  return v;
}

class CollectiveOps : public ::testing::TestWithParam<bool> {};  // param: staged (device-like) backend

TEST_P(CollectiveOps, AllReduceAndGatherEqualTheGroupsOwnCollectives) {
  const bool staged = GetParam();
  constexpr int kRanks = 3;
  constexpr size_t kN = 37;
  auto group = make_inproc_group(kRanks);
  auto oracle = make_inproc_group(kRanks);
  std::vector<std::vector<float>> reduced(kRanks), want_reduced(kRanks), gathered(kRanks), want_gathered(kRanks);
  std::vector<int> staged_copies(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<HostBackend> be = staged ? std::make_unique<StagedBackend>() : nullptr;
      std::unique_ptr<Backend> plain = staged ? nullptr : make_reference_backend();
      Backend& b = staged ? static_cast<Backend&>(*be) : *plain;
      const std::vector<float> mine = rank_values(r, kN);
      Buf y = b.alloc_f32(kN), all = b.alloc_f32(kN * kRanks);
      b.from_host(mine.data(), kN, y);
      b.all_reduce(*group[size_t(r)], y, kN);
      reduced[size_t(r)].resize(kN);
      b.to_host(y, kN, reduced[size_t(r)].data());
      b.from_host(mine.data(), kN, y);
      b.all_gather(*group[size_t(r)], y, kN, all);
      gathered[size_t(r)].resize(kN * kRanks);
      b.to_host(all, kN * kRanks, gathered[size_t(r)].data());
      b.free(y);
      b.free(all);
      // The oracle: the group's collectives on host vectors.
      want_reduced[size_t(r)] = mine;
      oracle[size_t(r)]->all_reduce_sum(want_reduced[size_t(r)].data(), kN, DType::F32);
      want_gathered[size_t(r)].resize(kN * kRanks);
      oracle[size_t(r)]->all_gather(mine.data(), kN, DType::F32, want_gathered[size_t(r)].data());
      if (staged) staged_copies[size_t(r)] = static_cast<StagedBackend&>(*be).reads;
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(0, std::memcmp(reduced[size_t(r)].data(), want_reduced[size_t(r)].data(), kN * 4)) << "rank " << r;
    EXPECT_EQ(gathered[size_t(r)], want_gathered[size_t(r)]) << "rank " << r;
    EXPECT_EQ(0, std::memcmp(reduced[size_t(r)].data(), reduced[0].data(), kN * 4)) << "every rank the same bits";
    if (staged) {
      EXPECT_GE(staged_copies[size_t(r)], 2) << "the staged path read the buffers back";
    }
  }
}

TEST_P(CollectiveOps, PlaceColsWritesOneShardsColumnsOfEveryRow) {
  const bool staged = GetParam();
  std::unique_ptr<Backend> b = staged ? std::unique_ptr<Backend>(new StagedBackend()) : make_reference_backend();
  constexpr int kRows = 3, kDim = 11, kOff = 4, kN = 5;
  std::vector<float> dst(kRows * kDim), src(kRows * kN);
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = -float(i);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 100.f + float(i);
  Buf d = b->alloc_f32(dst.size()), s = b->alloc_f32(src.size());
  b->from_host(dst.data(), dst.size(), d);
  b->from_host(src.data(), src.size(), s);
  b->place_cols(s, kRows, kN, d, kDim, kOff);
  std::vector<float> got(dst.size());
  b->to_host(d, got.size(), got.data());
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kDim; ++c) {
      const float want = c >= kOff && c < kOff + kN ? src[size_t(r * kN + c - kOff)] : dst[size_t(r * kDim + c)];
      EXPECT_EQ(got[size_t(r * kDim + c)], want) << "row " << r << " column " << c;
    }
  b->free(d);
  b->free(s);
}

INSTANTIATE_TEST_SUITE_P(HostAndStaged, CollectiveOps, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "staged" : "host"); });

}  // namespace
}  // namespace g4
