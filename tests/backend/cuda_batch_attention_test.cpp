// Batched decode attention on the CUDA backend: attn_prep and attention over several sequences in
// one launch each (their caches, positions, capacities and windows read from a device table staged
// with the step), against the reference backend, inside recorded steps whose sequences change from
// step to step: the graph recorded for one set of sequences replays for another of the same shape.
// Skips, printing why, when the build has no CUDA or the machine no GPU (CI).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend_test_util.h"

namespace g4 {
namespace {
using test::randn;
using test::rel_err;

std::unique_ptr<Backend> cuda_or_skip(DType act) {
  std::string why;
  BackendOptions opt;
  opt.activations = act;
  auto be = make_cuda_backend(&why, opt);
  if (!be) std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
  return be;
}

// Four sequences, three of which decode together at each step (a different three each time, so
// each step's batch holds other caches at other positions): full caches of 2200 and 2300 slots
// (past kAttnMaxSplits splits of any split length up to 68 positions, so that every batch has the
// same split count) and a ring of 12 slots for a window of 8. Each
// cache is first filled row by row with kv_write; every step then uploads the batch's q/k/v rows,
// runs attn_prep (rope, cache write) and attention for the batch in one step. Returns each step's
// output [3, H, D] and, through pos_out, every cache's position bookkeeping at the end.
struct Cache {
  int cap, window, pos;
};
std::vector<std::vector<float>> rotating_batches(Backend& b, int steps, std::vector<std::vector<int32_t>>* pos_out) {
  const int H = 4, Hk = 2, D = 128, B = 3;
  const RopeTable rt = make_rope_table(RopeSpec{RopeKind::Default, 10000.f, 1.f, 1.f}, D);
  std::vector<Cache> caches = {{2200, 0, 5}, {2300, 0, 37}, {2200, 0, 300}, {12, 8, 20}};
  std::vector<Buf> kc, vc;
  pos_out->assign(caches.size(), {});
  for (size_t i = 0; i < caches.size(); ++i) {
    const Cache& c = caches[i];
    kc.push_back(b.alloc_act(size_t(c.cap) * Hk * D));
    vc.push_back(b.alloc_act(size_t(c.cap) * Hk * D));
    (*pos_out)[i].assign(size_t(c.cap), -1);
    const Buf k = test::upload_act(b, randn(size_t(c.pos) * Hk * D, uint32_t(40 + i)));
    const Buf v = test::upload_act(b, randn(size_t(c.pos) * Hk * D, uint32_t(50 + i)));
    for (int p = 0; p < c.pos; ++p) {
      AttnSeq one;
      one.row0 = p;
      one.n = 1;
      one.pos0 = p;
      one.kv = test::f32_kv(kc[i], vc[i], (*pos_out)[i].data(), c.cap, Hk, D, c.window);
      b.kv_write(one, k, v);
    }
    b.free(k);
    b.free(v);
  }
  Buf q = b.alloc_act(size_t(B) * H * D), k = b.alloc_act(size_t(B) * Hk * D), v = b.alloc_act(size_t(B) * Hk * D),
      out = b.alloc_act(size_t(B) * H * D);
  std::vector<std::vector<float>> outs;
  for (int step = 0; step < steps; ++step) {
    std::vector<AttnSeq> seqs(B);
    for (int j = 0; j < B; ++j) {
      const size_t i = size_t((step + j) % int(caches.size()));
      const Cache& c = caches[i];
      seqs[size_t(j)].row0 = j;
      seqs[size_t(j)].n = 1;
      seqs[size_t(j)].pos0 = c.pos;
      seqs[size_t(j)].kv = test::f32_kv(kc[i], vc[i], (*pos_out)[i].data(), c.cap, Hk, D, c.window);
    }
    b.begin_step();
    const auto hq = randn(size_t(B) * H * D, uint32_t(100 + step));
    const auto hk = randn(size_t(B) * Hk * D, uint32_t(200 + step));
    const auto hv = randn(size_t(B) * Hk * D, uint32_t(300 + step));
    b.from_host(hq.data(), hq.size(), q);
    b.from_host(hk.data(), hk.size(), k);
    b.from_host(hv.data(), hv.size(), v);
    b.attn_prep(q, H, k, v, Hk, D, nullptr, nullptr, false, 1e-6f, seqs, rt, ActPrecision::F32);
    b.attention(q, H, seqs, 0.0883f, ActPrecision::F32, out);
    b.end_step();
    outs.push_back(test::download(b, out, size_t(B) * H * D));
    for (int j = 0; j < B; ++j) ++caches[size_t((step + j) % int(caches.size()))].pos;
  }
  for (const Buf& p : {q, k, v, out}) b.free(p);
  for (size_t i = 0; i < caches.size(); ++i) {
    b.free(kc[i]);
    b.free(vc[i]);
  }
  return outs;
}

void check_rotating_batches(DType act, double bound) {
  auto cu = cuda_or_skip(act);
  if (!cu) GTEST_SKIP() << "no CUDA";
  auto ref = make_reference_backend();
  const int steps = 10;
  std::vector<std::vector<int32_t>> got_pos, want_pos;
  CudaStepCounts before, after;
  ASSERT_TRUE(cuda_step_counts(*cu, &before));
  const auto got = rotating_batches(*cu, steps, &got_pos);
  ASSERT_TRUE(cuda_step_counts(*cu, &after));
  const auto want = rotating_batches(*ref, steps, &want_pos);
  for (int s = 0; s < steps; ++s) EXPECT_LE(rel_err(got[size_t(s)], want[size_t(s)]), bound) << "step " << s;
  EXPECT_EQ(got_pos, want_pos);
  // Every step has the same shape (three one-row sequences), and steps take the recorder's two
  // areas in turn (cuda_step.h): the first of each area runs directly, the second is captured, and
  // every later one replays its area's graph whatever sequences it holds.
  EXPECT_EQ(after.direct - before.direct, 2);
  EXPECT_EQ(after.captured - before.captured, 2);
  EXPECT_EQ(after.replayed - before.replayed, steps - 4);
}

TEST(CudaBatchAttention, RotatingBatchesF32) { check_rotating_batches(DType::F32, 1e-5); }
// bf16 q, k, v and caches against the f32 reference (the activations' rounding): issue 6's bound.
TEST(CudaBatchAttention, RotatingBatchesBf16) { check_rotating_batches(DType::BF16, 2e-2); }

}  // namespace
}  // namespace g4
