// Backend::draw_top (a token drawn where the logits are, sampling/top_draw.h): the host default
// gives Sampler::sample_top's tokens for the same seed, and the CUDA kernel the host's, on rows
// with ties, NaNs, an all -inf row, greedy rows and every filter, k from 1 to 256. The CUDA
// kernel's expf may differ from the host's by an ulp or two, which moves a draw only when it
// lands within that rounding of a boundary: at most 1 in 1000 draws may differ (none expected).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/draw_top_arrays.h"
#include "backend_test_util.h"
#include "sampling/sampler.h"
#include "sampling/top_draw.h"

namespace g4 {
namespace {

struct Rows {
  int rows = 0, k = 0;
  std::vector<float> vals, lse, fp;
  std::vector<int32_t> ids, ip;
};

// rows of k candidates: shuffled ids of a vocabulary of 5000, values N(0, sd), every fourth row
// with a tie across its top values, row 5 with NaNs, row 7 all -inf; params per row from `draws`.
Rows make_rows(int rows, int k, uint32_t seed, const std::vector<TopDraw>& draws) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.5f);
  Rows r;
  r.rows = rows;
  r.k = k;
  for (int i = 0; i < rows; ++i) {
    std::vector<int32_t> pool(5000);
    for (int j = 0; j < 5000; ++j) pool[size_t(j)] = j;
    std::shuffle(pool.begin(), pool.end(), rng);
    double m = -INFINITY, s = 0;
    for (int j = 0; j < k; ++j) {
      float v = nd(rng);
      if (i % 4 == 3 && j < 5) v = 4.f;
      if (i == 5 && j % 9 == 4) v = NAN;
      if (i == 7) v = -INFINITY;
      r.vals.push_back(v);
      r.ids.push_back(pool[size_t(j)]);
      if (!std::isnan(v)) m = std::max(m, double(v));
    }
    if (std::isfinite(m))
      for (int j = 0; j < k; ++j)
        if (!std::isnan(r.vals[size_t(i * k + j)])) s += std::exp(double(r.vals[size_t(i * k + j)]) - m);
    r.lse.push_back(std::isfinite(m) ? float(m + std::log(s + 1.5)) : float(m));  // the rest of the row's mass
    float f[kTopDrawFields];
    int32_t p[kTopDrawFields];
    pack_top_draw(draws[size_t(i) % draws.size()], f, p);
    r.fp.insert(r.fp.end(), f, f + kTopDrawFields);
    r.ip.insert(r.ip.end(), p, p + kTopDrawFields);
  }
  return r;
}

std::vector<int32_t> run(Backend& be, const Rows& r) {
  return draw_top_arrays(be, r.vals, r.ids, r.lse, r.k, r.fp, r.ip);
}

SamplingParams params(float t, int top_k, float top_p, float min_p, int keep = 1) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.min_tokens_to_keep = keep;
  p.seed = 77;
  p.has_seed = true;
  return p;
}

const std::vector<SamplingParams>& cases() {
  static const std::vector<SamplingParams> c = {params(1.f, 64, 0.95f, 0.f), params(0.7f, 8, 1.f, 0.f),
                                                params(1.3f, 256, 0.9f, 0.05f), params(0.5f, 40, 0.5f, 0.1f, 3),
                                                params(1.f, 1, 1.f, 0.f), params(2.f, 200, 1.f, 0.3f, 50)};
  return c;
}

// The host default draws what Sampler::sample_top draws with the same seed, draw after draw.
TEST(DrawTop, DefaultGivesTheSamplersTokens) {
  auto be = make_reference_backend();
  const int V = 5000, k = 256;
  for (const SamplingParams& sp : cases()) {
    Sampler host(sp, V), bits(sp, V);
    for (int step = 0; step < 40; ++step) {
      TopDraw d = top_draw_params(sp);
      d.bits = bits.take_draw_bits();
      const Rows r = make_rows(1, k, uint32_t(100 + step), {d});
      const int want = host.sample_top(r.vals.data(), r.ids.data(), k, r.lse[0]);
      EXPECT_EQ(run(*be, r)[0], want) << "top_k " << sp.top_k << " step " << step;
    }
  }
}

TEST(DrawTop, CudaMatchesTheHost) {
  std::string why;
  auto cu = make_cuda_backend(&why, BackendOptions{});
  if (!cu) GTEST_SKIP() << "cuda backend unavailable: " << why;
  auto ref = make_reference_backend();
  std::mt19937_64 bits(5);
  int draws = 0, differ = 0;
  for (int k : {1, 8, 64, 256}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<TopDraw> ds;
      for (const SamplingParams& sp : cases()) {
        TopDraw d = top_draw_params(sp);
        d.top_k = std::min(d.top_k, k);
        d.bits = bits() >> 11;
        ds.push_back(d);
      }
      ds.push_back(TopDraw{});  // greedy
      const Rows r = make_rows(24, k, uint32_t(1000 * k + rep), ds);
      const auto want = run(*ref, r), got = run(*cu, r);
      for (size_t i = 0; i < want.size(); ++i) {
        ++draws;
        differ += want[i] != got[i];
        if (ds[i % ds.size()].temperature <= 0 || i == 7 || k == 1) {  // greedy, all -inf, one candidate: exact
          EXPECT_EQ(got[i], want[i]) << "k " << k << " row " << i;
        }
      }
    }
  }
  EXPECT_LE(differ * 1000, draws) << differ << " of " << draws << " draws differ";
  std::printf("draw_top: %d of %d cuda draws differ from the host's\n", differ, draws);
}

}  // namespace
}  // namespace g4
