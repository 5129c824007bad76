// LoRA training on the GPU (LoraTrainModel over make_cuda_grad_arith) against the same model on the
// host arithmetic, on the generated fixtures (tools/make_fixtures.py): every format (bf16, MLX
// 4-bit g64, 8-bit g32, mixed) of the dense K=V, E-style (per-layer inputs, KV sharing) and MoE
// kinds, every module adapted, a masked prompt, with and without dropout. In f32 the two differ
// only in summation order: the losses agree within 1e-5 relative and every adapter gradient within
// 1e-3 of its tensor's largest entry (measured on an H100: losses within 1e-6, gradients within
// 4e-5). With the products on bf16 operands (--dtype bf16): the losses within 1e-2 relative (issue
// 22's bound against mlx-lm; measured: up to 4.2e-3); the gradients are printed, not bounded (the
// largest entry-wise difference measured 0.09 to 0.63 of a tensor's largest entry: rounding the
// operands of every product moves these small random-weight models' adapter gradients that much). Skips, saying why, without a CUDA build, a GPU or the fixtures
// (G4_FIXTURE_DIR overrides tests/fixtures/generated).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../model/model_test_util.h"
#include "train/lora_train_model.h"
#include "train_test_util.h"

namespace g4::train {
namespace {

using train_test::tokens;

struct TrainRun {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per module: ga then gb
};

TrainRun train_once(const Model& m, LoraConfig lc, std::unique_ptr<GradArith> arith) {
  const ModelConfig& cfg = m.config();
  auto pr = LoraParams::create(cfg, lc, lora_layer_prefix(cfg), 11);
  EXPECT_TRUE(pr) << pr.message();
  LoraParams& p = pr.value();
  train_test::randomize_b(p, 12);
  LoraTrainModel tm(m, p, std::move(arith));
  const Example a{tokens(cfg.vocab, 23, 5), 4}, b{tokens(cfg.vocab, 14, 6), 0};
  p.zero_grads();
  TrainRun out;
  out.loss = tm.run({&a, &b}, 1 << 20, 1.f, 99).sum;
  for (const LoraModule& mod : p.modules()) out.grads.push_back(mod.ga), out.grads.push_back(mod.gb);
  return out;
}

class CudaLoraTrain : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaLoraTrain, MatchesTheHostArithmetic) {
  std::string why;
  if (!make_cuda_grad_arith(&why, BackendOptions{})) GTEST_SKIP() << "no CUDA training arithmetic here: " << why;
  std::string skip;
  const std::unique_ptr<Model> m = test::fixture_model(GetParam(), "cpu", &skip);
  if (!m) GTEST_SKIP() << skip;
  for (const float dropout : {0.f, 0.25f}) {
    LoraConfig lc;
    lc.num_layers = -1;
    lc.rank = 4;
    lc.scale = 2.f;
    lc.dropout = dropout;
    const TrainRun host = train_once(*m, lc, nullptr);
    for (const DType products : {DType::F32, DType::BF16}) {
      BackendOptions opt;
      opt.activations = products;
      const bool bf16 = products == DType::BF16;
      const TrainRun gpu = train_once(*m, lc, make_cuda_grad_arith(&why, opt));
      const char* mode = bf16 ? "bf16 products" : "f32";
      EXPECT_NEAR(gpu.loss, host.loss, (bf16 ? 1e-2 : 1e-5) * std::fabs(host.loss))
          << GetParam() << " " << mode << " dropout " << dropout;
      ASSERT_EQ(gpu.grads.size(), host.grads.size());
      double worst = 0;
      for (size_t t = 0; t < host.grads.size(); ++t) {
        double mx = 1e-12, diff = 0;
        for (size_t i = 0; i < host.grads[t].size(); ++i) {
          mx = std::max(mx, double(std::fabs(host.grads[t][i])));
          diff = std::max(diff, double(std::fabs(gpu.grads[t][i] - host.grads[t][i])));
        }
        worst = std::max(worst, diff / mx);
      }
      if (!bf16) {  // bf16 operands bound the loss only (see above)
        EXPECT_LE(worst, 1e-3) << GetParam() << " dropout " << dropout << ": worst gradient difference (relative)";
      }
      std::printf("%s %s dropout %.2f: loss %.7g (host %.7g), worst gradient difference %.2e of the tensor's largest\n",
                  GetParam(), mode, double(dropout), gpu.loss, host.loss, worst);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaLoraTrain,
                         ::testing::Values("dense-bf16", "dense-q4g64", "dense-mixed", "estyle-q8g32", "estyle-mixed",
                                           "moe-bf16", "moe-q4g64"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace g4::train
