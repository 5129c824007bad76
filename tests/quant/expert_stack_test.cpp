// ExpertStack: expert views of one [E, rows, cols] tensor, and stacks checked from per-expert views.
#include "quant/expert_stack.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "quant_test_util.h"

namespace g4 {
namespace {

const uint8_t* at(const void* p, int64_t off) { return static_cast<const uint8_t*>(p) + off; }

// Expert e's view of an MLX stack points into the tensor at e's codes, scales and biases.
TEST(ExpertStack, ExpertViewsOfOneMlxTensor) {
  const int E = 4;
  const int64_t rows = 8, cols = 64;
  const test::OwnedWeight all = test::random_mlx(E * rows, cols, 4, 32, DType::BF16, 3);
  const ExpertStack s = ExpertStack::of_matrix(all.view, E);
  EXPECT_EQ(s.rows(), rows);
  EXPECT_EQ(s.expert_bytes(), rows * cols / 2);
  EXPECT_EQ(s.expert_scale_bytes(), rows * (cols / 32) * 2);
  EXPECT_TRUE(s.back_to_back());
  for (int e = 0; e < E; ++e) {
    const WeightView w = s.expert(e);
    EXPECT_EQ(w.rows, rows);
    EXPECT_EQ(w.data, at(all.view.data, e * s.expert_bytes()));
    EXPECT_EQ(w.scales, at(all.view.scales, e * s.expert_scale_bytes()));
    EXPECT_EQ(w.biases, at(all.view.biases, e * s.expert_scale_bytes()));
  }
  EXPECT_EQ(s.as_matrix().rows, E * rows);
}

// Per-expert views at an even stride (HF's gate_up_proj: gate rows of each expert, its up rows
// between them) make a stack that is not back to back; the held range of an expert-parallel rank
// is kept, and the others read as 0-row views.
TEST(ExpertStack, StackFromStridedViewsAndAHeldRange) {
  const int E = 5;
  const int64_t rows = 3, cols = 4;
  std::vector<float> gate_up(size_t(E) * 2 * rows * cols);
  std::vector<WeightView> views(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    views[size_t(e)] = f32_view(gate_up.data() + size_t(e) * 2 * rows * cols, rows, cols);
    if (e < 1 || e > 3) views[size_t(e)].rows = 0, views[size_t(e)].data = nullptr;  // other ranks'
  }
  auto r = stack_experts(views, "layers.0.experts.gate_proj");
  ASSERT_TRUE(r) << r.message();
  const ExpertStack s = r.value();
  EXPECT_EQ(s.count, E);
  EXPECT_EQ(s.first, 1);
  EXPECT_EQ(s.held, 3);
  EXPECT_EQ(s.stride, 2 * rows * cols * 4);
  EXPECT_FALSE(s.back_to_back());
  EXPECT_FALSE(s.holds(0));
  EXPECT_FALSE(s.holds(4));
  EXPECT_EQ(s.expert(0).rows, 0);
  EXPECT_EQ(s.expert(3).data, views[3].data);
}

TEST(ExpertStack, UnevenOrMixedExpertsAreRefusedByName) {
  std::vector<float> a(64), b(64);
  std::vector<WeightView> views{f32_view(a.data(), 2, 4), f32_view(a.data() + 8, 2, 4), f32_view(b.data(), 2, 4)};
  auto r = stack_experts(views, "layers.3.experts.down_proj");
  ASSERT_FALSE(r);
  EXPECT_NE(r.message().find("layers.3.experts.down_proj"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("stride"), std::string::npos) << r.message();

  views = {f32_view(a.data(), 2, 4), f32_view(a.data() + 8, 2, 8)};
  r = stack_experts(views, "layers.3.experts.up_proj");
  ASSERT_FALSE(r);
  EXPECT_NE(r.message().find("shape"), std::string::npos) << r.message();

  views = {f32_view(a.data(), 2, 4), f32_view(a.data() + 8, 2, 4), f32_view(a.data() + 16, 2, 4)};
  views[1].rows = 0;  // a gap in the held range
  r = stack_experts(views, "layers.3.experts.gate_proj");
  ASSERT_FALSE(r);
  EXPECT_NE(r.message().find("one range"), std::string::npos) << r.message();
}

}  // namespace
}  // namespace g4
