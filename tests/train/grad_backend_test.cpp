// GradBackend (train/grad_backend.h) op by op where the model-level finite differences cannot
// reach: the routed experts. A top-k router is discontinuous where two scores cross, so the model's
// loss has jumps a finite difference may straddle; here every direction is checked only where the
// routing stays the same over the stencil, on a loss L = Σ c ⊙ experts(x, router(x)), x = x0·Pᵀ
// with P the registered parameter. Its gradient reaches P through the experts' GeGLU and down
// projection and through the router's softmax over the selected scores and its per-expert scales.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "train/grad_backend.h"

namespace g4::train {
namespace {

TEST(GradBackend, RoutedExpertsMatchFiniteDifferencesWhereRoutingHolds) {
  const int rows = 5, d = 12, E = 6, K = 2, I = 8;
  std::mt19937 r(7);
  std::normal_distribution<float> nd;
  auto randv = [&](size_t n, float s) {
    std::vector<float> v(n);
    for (float& x : v) x = s * nd(r);
    return v;
  };
  std::vector<float> x0 = randv(size_t(rows) * d, 1.f), P = randv(size_t(d) * d, 0.3f), R = randv(size_t(E) * d, 0.5f);
  std::vector<float> scale(static_cast<size_t>(E)), c = randv(size_t(rows) * d, 1.f);
  for (int e = 0; e < E; ++e) scale[size_t(e)] = 0.5f + 0.2f * float(e);
  std::vector<std::vector<float>> mats;
  for (int p = 0; p < 3; ++p) mats.push_back(randv(size_t(E) * I * d, 0.4f));  // [E, I, d] / [E, d, I]
  const ExpertStack gate = ExpertStack::of_matrix(f32_view(mats[0].data(), int64_t(E) * I, d), E),
                    up = ExpertStack::of_matrix(f32_view(mats[1].data(), int64_t(E) * I, d), E),
                    down = ExpertStack::of_matrix(f32_view(mats[2].data(), int64_t(E) * d, I), E);
  const WeightView Pw = f32_view(P.data(), d, d), Rw = f32_view(R.data(), E, d);

  GradBackend be;
  std::vector<float> gP(P.size(), 0.f);
  be.add_param(P.data(), gP.data());
  Buf xin = be.alloc_f32(x0.size()), x = be.alloc_f32(x0.size()), scores = be.alloc_f32(size_t(rows) * E),
      w = be.alloc_f32(size_t(rows) * K), out = be.alloc_f32(x0.size());
  Buf idx = be.alloc_i32(size_t(rows) * K);
  // Returns the loss and the routing it took.
  auto loss = [&](bool record, std::vector<int32_t>* routing) {
    if (record) be.arm();
    be.from_host(x0.data(), x0.size(), xin);
    be.matmul(xin, rows, Pw, ActPrecision::F32, x);
    be.matmul(x, rows, Rw, ActPrecision::F32, scores);
    be.router_topk(scores, rows, E, K, scale.data(), ActPrecision::F32, idx, w);
    be.moe_experts(x, rows, d, idx, w, K, gate, up, down, ActPrecision::F32, out);
    routing->resize(size_t(rows) * K);
    be.to_host(idx, routing->size(), routing->data());
    std::vector<float> o(x0.size());
    be.to_host(out, o.size(), o.data());
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += double(c[i]) * o[i];
    return l;
  };
  std::vector<int32_t> routing0;
  loss(true, &routing0);
  be.seed_grad(out, c.data(), c.size());
  be.backward();

  int checked = 0;
  for (int dir = 0; dir < 20; ++dir) {
    const std::vector<float> u = randv(P.size(), 1.f), P0 = P;
    double analytic = 0;
    for (size_t i = 0; i < P.size(); ++i) analytic += double(gP[i]) * u[i];
    const float eps = 2e-3f;
    bool same = true;
    auto at = [&](float t) {
      for (size_t i = 0; i < P.size(); ++i) P[i] = P0[i] + t * u[i];
      std::vector<int32_t> rt;
      const double l = loss(false, &rt);
      same = same && rt == routing0;
      return l;
    };
    const double numeric = (8.0 * (at(eps) - at(-eps)) - (at(2 * eps) - at(-2 * eps))) / (12.0 * eps);
    P = P0;
    if (!same) continue;  // the stencil crossed a routing boundary
    EXPECT_NEAR(numeric, analytic, 2e-3 * std::max(1.0, std::fabs(analytic))) << "direction " << dir;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

}  // namespace
}  // namespace g4::train
