// The `ggml` backend's own ops (rms_norm, rope, attention: backend/ggml/ggml_ops.h) against the
// reference backend's plain scalar versions. They differ only by f32 rounding (and, for rope, by
// ggml building the angle's power by repeated multiplication), so the bounds here are loose-f32;
// bit-exactness against llama.cpp is checked end to end on the starter model
// (tests/python/test_llamacpp_parity.py). Skips with a printed reason where the CPU cannot run it.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace g4 {
namespace {

std::unique_ptr<Backend> ggml_or_skip() {
  std::string why;
  auto be = make_ggml_backend(&why);
  if (!be) std::printf("SKIP: ggml backend unavailable: %s\n", why.c_str());
  return be;
}

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(GgmlBackend, NameAndUnknownFallback) {
  auto be = ggml_or_skip();
  if (!be) GTEST_SKIP();
  EXPECT_EQ(be->name(), "ggml");
  EXPECT_NE(make_backend("ggml"), nullptr);
}

TEST(GgmlBackend, RmsNormMatchesReference) {
  auto be = ggml_or_skip();
  if (!be) GTEST_SKIP();
  auto ref = make_reference_backend();
  const int rows = 5, dim = 640;
  const auto x = randn(size_t(rows * dim), 1, 3.f), w = randn(size_t(dim), 2);
  for (const float* wp : {w.data(), static_cast<const float*>(nullptr)}) {
    std::vector<float> a(x.size()), b(x.size());
    be->rms_norm(x.data(), rows, dim, wp, 1e-6f, ActPrecision::F32, a.data());
    ref->rms_norm(x.data(), rows, dim, wp, 1e-6f, ActPrecision::F32, b.data());
    EXPECT_LE(max_abs_diff(a, b), 2e-5f);
  }
}

TEST(GgmlBackend, RopeMatchesReference) {
  auto be = ggml_or_skip();
  if (!be) GTEST_SKIP();
  auto ref = make_reference_backend();
  const int rows = 9, heads = 2, D = 256;
  for (RopeSpec spec : {RopeSpec{RopeKind::Default, 10000.f, 1.f, 1.f},
                        RopeSpec{RopeKind::Default, 1e6f, 1.f, 1.f},
                        RopeSpec{RopeKind::Linear, 1e6f, 1.f, 8.f}}) {
    const RopeTable t = make_rope_table(spec, D);
    auto a = randn(size_t(rows * heads * D), 3), b = a;
    be->rope(a.data(), rows, heads, D, 40, t, ActPrecision::F32);
    ref->rope(b.data(), rows, heads, D, 40, t, ActPrecision::F32);
    // Angles up to ~50 rad; ggml's repeated-product power and ours differ by a few f32 ulps.
    EXPECT_LE(max_abs_diff(a, b), 5e-4f) << "theta " << spec.theta;
  }
}

// One sequence of n new rows after pos0 cached ones, GQA 4:1, optionally windowed.
void attention_case(Backend& be, Backend& ref, int pos0, int n, int window) {
  const int H = 4, Hk = 1, D = 256, cap = window > 0 ? window + n : pos0 + n;
  const auto q = randn(size_t(n * H * D), 10 + pos0 + n);
  const auto kall = randn(size_t((pos0 + n) * Hk * D), 20 + n), vall = randn(size_t((pos0 + n) * Hk * D), 30 + n);
  std::vector<float> out_a(q.size()), out_b(q.size());
  for (Backend* b : {&be, &ref}) {
    std::vector<float> k(size_t(cap * Hk * D)), v(k.size());
    std::vector<int32_t> pos(size_t(cap), -1);
    AttnSeq s;
    s.kv = KvBuffer{k.data(), v.data(), pos.data(), cap, Hk, D, window};
    for (int p = 0; p < pos0 + n; ++p) {  // fill the cache position by position (rings wrap)
      AttnSeq one = s;
      one.row0 = p;
      one.n = 1;
      one.pos0 = p;
      b->kv_write(one, kall.data(), vall.data());
    }
    s.row0 = 0;
    s.n = n;
    s.pos0 = pos0;
    b->attention(q.data(), H, {s}, 0.0625f, ActPrecision::F32, b == &be ? out_a.data() : out_b.data());
  }
  EXPECT_LE(max_abs_diff(out_a, out_b), 1e-5f) << "pos0 " << pos0 << " n " << n << " window " << window;
}

TEST(GgmlBackend, AttentionMatchesReference) {
  auto be = ggml_or_skip();
  if (!be) GTEST_SKIP();
  auto ref = make_reference_backend();
  attention_case(*be, *ref, 0, 1, 0);    // one row: ggml_vec_dot_f32 kqv
  attention_case(*be, *ref, 0, 19, 0);   // a prompt: tinyBLAS kqv
  attention_case(*be, *ref, 70, 1, 0);   // decode after 70 cached positions (several chunks)
  attention_case(*be, *ref, 40, 7, 16);  // sliding window (ring buffer)
}

}  // namespace
}  // namespace g4
