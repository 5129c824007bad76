// attn_prep folded into the decode attention on the CUDA backend (BackendOptions::fold_attn_prep;
// cuda_pending.h PendingAttnPrep): two sequences of one decode row each (a full cache, a sliding
// ring), their caches filled before the row's own position, then attn_prep and attention. The
// attention output and both caches must have the bits of the two launches (fold off), with and
// without v_norm, at a one-split and a many-split cache length, for bf16 and f32 activations, and
// for a KV-shared layer (q only, the row's own K/V already in the cache). Skips, printing why,
// without CUDA or a GPU (CI).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend_test_util.h"
#include "core/config.h"
#include "core/dtype.h"

namespace g4 {
namespace {
using test::bf16_rounded;
using test::randn;

struct DecodeResult {
  std::vector<float> out, kc0, vc0, kc1, vc1;
};

// One decode step of a layer on backend options (dtype, fold): the caches hold positions
// 0 .. pos - 1 (written by kv_write), then attn_prep and attention of the row at pos.
DecodeResult decode_row(DType dt, bool fold, bool v_norm, bool with_k, int len, std::string* why) {
  BackendOptions opt;
  opt.activations = dt;
  opt.fold_attn_prep = fold;
  std::unique_ptr<Backend> cu = make_cuda_backend(why, opt);
  if (!cu) return {};
  const int H = 4, Hk = 2, D = 256, window = 8;
  const int cap0 = len + 1, cap1 = window + 1;
  const RopeTable t = make_rope_table(RopeSpec{RopeKind::Proportional, 1e6f, 0.25f, 1.f}, D);
  const auto qw = randn(size_t(D), 80), kw = randn(size_t(D), 81);
  auto act = [&](const std::vector<float>& h) { return test::upload_act(*cu, bf16_rounded(h)); };
  auto zeros = [&](size_t n) { return act(std::vector<float>(n, 0.f)); };
  Buf kc0 = zeros(size_t(cap0) * Hk * D), vc0 = zeros(size_t(cap0) * Hk * D), kc1 = zeros(size_t(cap1) * Hk * D),
      vc1 = zeros(size_t(cap1) * Hk * D);
  std::vector<int32_t> p0(size_t(cap0), -1), p1(size_t(cap1), -1);
  const KvBuffer kv0 = test::f32_kv(kc0, vc0, p0.data(), cap0, Hk, D, 0), kv1 = test::f32_kv(kc1, vc1, p1.data(), cap1, Hk, D, window);
  const int pos[2] = {len, len + 3};  // the rows' own positions (sequence 1's ring has wrapped)
  for (int s = 0; s < 2; ++s) {       // the cache before the row (and, for a KV-shared layer, the row's own K/V)
    const int n = with_k ? pos[s] : pos[s] + 1;
    AttnSeq all;
    all.row0 = 0;
    all.n = n;
    all.pos0 = 0;
    all.kv = s == 0 ? kv0 : kv1;
    if (s == 1) {  // a ring: only the last `window` positions are kept, written in order
      all.pos0 = n - window;
      all.n = window;
    }
    Buf k = act(randn(size_t(all.n) * Hk * D, uint32_t(90 + s), 2.f)), v = act(randn(size_t(all.n) * Hk * D, uint32_t(92 + s), 2.f));
    cu->kv_write(all, k, v);
    cu->free(k);
    cu->free(v);
  }
  std::vector<AttnSeq> seqs(2);
  for (int s = 0; s < 2; ++s) {
    seqs[size_t(s)].row0 = s;
    seqs[size_t(s)].n = 1;
    seqs[size_t(s)].pos0 = pos[s];
    seqs[size_t(s)].kv = s == 0 ? kv0 : kv1;
  }
  Buf q = act(randn(size_t(2) * H * D, 94, 2.f)), k = act(randn(size_t(2) * Hk * D, 95, 2.f)),
      v = act(randn(size_t(2) * Hk * D, 96, 2.f)), out = zeros(size_t(2) * H * D);
  Buf dqw = test::upload(*cu, qw), dkw = test::upload(*cu, kw);
  const ActPrecision P = dt == DType::BF16 ? ActPrecision::BF16 : ActPrecision::F32;
  cu->attn_prep(q, H, with_k ? k : Buf(), v, Hk, D, dqw.f32(), dkw.f32(), v_norm, 1e-6f, seqs, t, P);
  cu->attention(q, H, seqs, 0.0625f, P, out);
  DecodeResult r;
  r.out = test::download(*cu, out, size_t(2) * H * D);
  r.kc0 = test::download(*cu, kc0, size_t(cap0) * Hk * D);
  r.vc0 = test::download(*cu, vc0, size_t(cap0) * Hk * D);
  r.kc1 = test::download(*cu, kc1, size_t(cap1) * Hk * D);
  r.vc1 = test::download(*cu, vc1, size_t(cap1) * Hk * D);
  for (const Buf& b : {kc0, vc0, kc1, vc1, q, k, v, out, dqw, dkw}) cu->free(b);
  return r;
}

TEST(CudaAttnPrepFold, SameBitsAsAttnPrepThenAttention) {
  for (DType dt : {DType::BF16, DType::F32})
    for (int len : {12, 300})  // one split; many (attention_splits)
      for (bool v_norm : {false, true})
        for (bool with_k : {true, false}) {
          std::string why;
          const DecodeResult apart = decode_row(dt, false, v_norm, with_k, len, &why);
          if (apart.out.empty()) {
            std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
            GTEST_SKIP() << "no CUDA";
          }
          const DecodeResult folded = decode_row(dt, true, v_norm, with_k, len, &why);
          const std::string what = std::string(dt == DType::BF16 ? "bf16" : "f32") + ", " + std::to_string(len) +
                                   " positions, v_norm " + (v_norm ? "on" : "off") + (with_k ? "" : ", q only");
          EXPECT_EQ(folded.out, apart.out) << what << ": attention output";
          EXPECT_EQ(folded.kc0, apart.kc0) << what << ": full cache K";
          EXPECT_EQ(folded.vc0, apart.vc0) << what << ": full cache V";
          EXPECT_EQ(folded.kc1, apart.kc1) << what << ": ring K";
          EXPECT_EQ(folded.vc1, apart.vc1) << what << ": ring V";
        }
}

}  // namespace
}  // namespace g4
