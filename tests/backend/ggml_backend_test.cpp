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
#include "backend_test_util.h"

namespace g4 {
namespace {
using test::max_abs_diff;
using test::randn;

std::unique_ptr<Backend> ggml_or_skip() {
  std::string why;
  auto be = make_ggml_backend(&why);
  if (!be) std::printf("SKIP: ggml backend unavailable: %s\n", why.c_str());
  return be;
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

void attention_case(Backend& be, Backend& ref, int pos0, int n, int window) {
  EXPECT_LE(test::max_abs_diff(test::attention_scenario(be, pos0, n, window), test::attention_scenario(ref, pos0, n, window)),
            1e-5f)
      << "pos0 " << pos0 << " n " << n << " window " << window;
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
