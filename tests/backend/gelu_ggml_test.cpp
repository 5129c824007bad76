// Backend::gelu_mul_ggml against ggml's definition restated here: ggml_vec_geglu_f32 with
// GGML_GELU_FP16 (x <= -10 -> 0; x >= 10 -> x * g; else f16 table of ggml_gelu_f32 at f16(x)),
// with the one fma the llama.cpp build's compiler puts in ggml_gelu_f32.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace {

float ggml_geglu_one(float x, float g) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x * g;
  const float h = g4::round_f16(x);
  const float gelu = 0.5f * h * (1.0f + std::tanh(0.79788456080286535587989211986876f * h * std::fma(0.044715f * h, h, 1.0f)));
  return g4::round_f16(gelu) * g;
}

std::vector<float> run(g4::Backend& be, const std::vector<float>& gate, const std::vector<float>& up) {
  const size_t n = gate.size();
  g4::Buf dg = be.alloc_f32(n);
  g4::Buf du = be.alloc_f32(n);
  g4::Buf out = be.alloc_f32(n);
  be.from_host(gate.data(), n, dg);
  be.from_host(up.data(), n, du);
  be.gelu_mul_ggml(dg, du, n, out);
  std::vector<float> h(n);
  be.to_host(out, n, h.data());
  return h;
}

TEST(GeluGgml, MatchesGgmlTableOnEveryBackend) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 4.f);
  std::vector<float> gate, up;
  for (float x : {-10.5f, -10.0f, -9.999f, -0.0f, 0.0f, 1e-8f, 0.5f, 9.999f, 10.0f, 12.0f}) {
    gate.push_back(x);
    up.push_back(1.5f);
  }
  for (int i = 0; i < 4096; ++i) {
    gate.push_back(nd(rng));
    up.push_back(nd(rng));
  }
  for (auto make : {g4::make_reference_backend, g4::make_cpu_backend}) {
    auto be = make();
    const auto got = run(*be, gate, up);
    for (size_t i = 0; i < gate.size(); ++i)
      ASSERT_EQ(got[i], ggml_geglu_one(gate[i], up[i])) << "gate " << gate[i] << " up " << up[i];
  }
}

// The entry where the fused and unfused gelu differ after f16 rounding, with the value llama.cpp
// 0.3.36 produced for it (ffn_geglu of the starter model, gate -1.99897 -> f16 0xbfff).
TEST(GeluGgml, TableEntryMatchesLlamaCpp) {
  for (auto make : {g4::make_reference_backend, g4::make_cpu_backend}) {
    auto be = make();
    const std::vector<float> gate = {g4::f16_to_f32(0xbfff)}, up = {1.0f};
    EXPECT_EQ(run(*be, gate, up)[0], -0.045501708984375f);
  }
}

TEST(GeluGgml, DiffersFromExactTanhOnlyByF16Rounding) {
  auto be = g4::make_reference_backend();
  std::vector<float> gate, up;
  for (float x = -8.f; x <= 8.f; x += 0.01f) {
    gate.push_back(x);
    up.push_back(1.f);
  }
  const auto got = run(*be, gate, up);
  for (size_t i = 0; i < gate.size(); ++i) {
    const double x = gate[i];
    const double exact = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    // f16 rounding of the input (slope <= 1.13) and of the output: 2^-11 relative each.
    EXPECT_NEAR(got[i], exact, 2e-3 * std::fabs(x) + 1e-6) << "x " << x;
  }
}

}  // namespace
