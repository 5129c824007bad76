// Batch-invariant numerics on the CUDA backend (BackendOptions::row_exact, `--batch-invariant on`):
// every op of a decode step computes each of up to 64 rows with the bits that row gets alone
// (M = 1), whatever the rows beside it. Checked bit for bit, row by row, against the same op run on
// each row by itself: the int8 GEMVs over several prepared rows (every format they take, with an
// input norm, several weights, both gelu forms), the deferred post-norm and layer scalar fused into
// the next op's prepare or launched alone, the routed experts, and batched decode attention over
// caches of different lengths. Each case also reports how many rows differ without row_exact (the
// kernels a batch takes by default), to show what the mode buys. Skips, printing why, when the
// build has no CUDA or the machine no GPU (CI).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../quant/gguf_test_util.h"
#include "../quant/quant_test_util.h"
#include "backend/backend.h"
#include "backend_test_util.h"
#include "moe_test_experts.h"

namespace g4 {
namespace {
using test::bf16_rounded;
using test::randn;

// Row i of a [rows, n] host matrix.
std::vector<float> row_of(const std::vector<float>& m, int64_t n, int i) {
  return std::vector<float>(m.begin() + int64_t(i) * n, m.begin() + int64_t(i + 1) * n);
}

// How many of the M rows of `together` ([M, n]) differ in any bit from `alone` (row i run by itself).
int rows_differing(const std::vector<float>& together, const std::vector<std::vector<float>>& alone, int64_t n) {
  int bad = 0;
  for (size_t i = 0; i < alone.size(); ++i)
    if (row_of(together, n, int(i)) != alone[i]) ++bad;
  return bad;
}

class CudaRowExactTest : public ::testing::Test {
 public:
  void SetUp() override {
    std::string why;
    cu = test::cuda_int8_backend(true, &why);
    if (!cu) {
      std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
      GTEST_SKIP() << "no CUDA";
    }
    plain = test::cuda_int8_backend(false, &why);
    ASSERT_TRUE(plain) << why;
  }
  std::unique_ptr<Backend> cu, plain;  // row_exact on / off
};

// One weight of each format the int8 GEMVs take, 300 x 512 (odd row count, several units a row).
struct Weights {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<test::OwnedWeight> owned;
  std::vector<std::pair<std::string, WeightView>> all;
};
Weights make_weights(int64_t rows, int64_t cols, uint32_t seed) {
  Weights w;
  std::mt19937 rng(seed);
  w.blocks.reserve(8);
  w.owned.reserve(8);
  for (WFormat f : {WFormat::GgufQ4_K, WFormat::GgufQ6_K, WFormat::GgufQ8_0, WFormat::GgufQ5_0}) {
    w.blocks.push_back(test::random_blocks(f, rows, cols, rng));
    w.all.push_back({std::string(wformat_name(f)), WeightView{f, rows, cols, w.blocks.back().data(), gguf_row_bytes(f, cols)}});
  }
  for (auto [bits, group] : {std::pair{4, 64}, std::pair{3, 32}}) {
    w.owned.push_back(test::random_mlx(rows, cols, bits, group, DType::BF16, seed++));
    w.all.push_back({"mlx" + std::to_string(bits) + "g" + std::to_string(group), w.owned.back().view});
  }
  w.owned.push_back(test::random_float(rows, cols, WFormat::BF16, seed++));
  w.all.push_back({"bf16", w.owned.back().view});
  return w;
}

// matmul (f32 out), norm_matmuls (two weights, input norm) and gate_up_gelu (both gelu forms) on M
// rows, against each row alone.
TEST_F(CudaRowExactTest, MatmulsComputeEachRowAsAlone) {
  const int64_t R = 300, C = 512;
  const Weights w = make_weights(R, C, 7);
  const auto nw = randn(size_t(C), 8);
  for (Backend* be : {cu.get(), plain.get()}) {
    const bool exact = be == cu.get();
    Buf dnw = be->alloc_f32(C);
    be->from_host(nw.data(), nw.size(), dnw);
    for (const auto& [name, W] : w.all) {
      const WeightView dW = be->place_weight(W);
      for (int M : {2, 8, 9, 33, 64}) {
        const auto x = bf16_rounded(randn(size_t(M * C), uint32_t(M + 100), 1.5f));
        // The three ops on M rows at once (op 0: matmul, 1: norm_matmuls, 2-3: gate_up_gelu tanh / ggml).
        auto run = [&](const std::vector<float>& xs, int rows, int op) {
          Buf dx = test::upload_act(*be, xs), scratch = be->alloc_act(size_t(rows * C));
          Buf y = op == 0 ? be->alloc_f32(size_t(rows * R)) : be->alloc_act(size_t(rows * R));
          Buf y2 = be->alloc_act(size_t(rows * R));
          const InputNorm norm{dnw.f32(), 1e-6f, scratch};
          if (op == 0) be->matmul(dx, rows, dW, ActPrecision::BF16, y);
          if (op == 1) be->norm_matmuls(dx, rows, norm, {{&dW, y}, {&dW, y2}}, ActPrecision::BF16);
          if (op >= 2) be->gate_up_gelu(dx, rows, norm, dW, dW, op == 3, ActPrecision::BF16, y, y2);
          std::vector<float> out = test::download(*be, y, size_t(rows * R));
          if (op == 1) {
            const auto o2 = test::download(*be, y2, size_t(rows * R));
            out.insert(out.end(), o2.begin(), o2.end());
          }
          for (const Buf& p : {dx, scratch, y, y2}) be->free(p);
          return out;
        };
        for (int op = 0; op < 4; ++op) {
          const auto together = run(x, M, op);
          std::vector<std::vector<float>> alone;
          for (int i = 0; i < M; ++i) alone.push_back(run(row_of(x, C, i), 1, op));
          // norm_matmuls returns [2][M, R]: compare each weight's rows.
          int bad = 0;
          if (op == 1) {
            std::vector<std::vector<float>> a0, a1;
            for (const auto& a : alone) {
              a0.push_back(std::vector<float>(a.begin(), a.begin() + R));
              a1.push_back(std::vector<float>(a.begin() + R, a.end()));
            }
            bad = rows_differing(std::vector<float>(together.begin(), together.begin() + M * R), a0, R) +
                  rows_differing(std::vector<float>(together.begin() + M * R, together.end()), a1, R);
          } else {
            bad = rows_differing(together, alone, R);
          }
          const char* ops[] = {"matmul", "norm_matmuls", "gate_up_gelu", "gate_up_gelu (ggml)"};
          if (exact) {
            EXPECT_EQ(bad, 0) << name << " " << ops[op] << " M=" << M << ": rows differ from the row alone";
          } else if (bad) {
            std::printf("without row_exact: %s %s M=%d: %d rows differ from alone\n", name.c_str(), ops[op], M, bad);
          }
        }
      }
    }
    be->free(dnw);
  }
}

// A matmul_norm_add of M rows leaves its post-norm pending: a layer scalar joins it and the next
// norm_matmuls fuses both into its prepare, or a read launches it alone. The residual and the
// next op's output of each row equal that row's alone.
TEST_F(CudaRowExactTest, DeferredPostNormPerRow) {
  const int64_t C = 1536, O = 768;
  std::mt19937 rng(80);
  auto db = test::random_blocks(WFormat::GgufQ4_K, C, O, rng), gb = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
  const WeightView D{WFormat::GgufQ4_K, C, O, db.data(), gguf_row_bytes(WFormat::GgufQ4_K, O)};
  const WeightView G{WFormat::GgufQ4_K, O, C, gb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const WeightView dD = cu->place_weight(D), dG = cu->place_weight(G);
  const auto pw = randn(size_t(C), 81), nw = randn(size_t(C), 82);
  Buf dpw = cu->alloc_f32(C), dnw = cu->alloc_f32(C);
  cu->from_host(pw.data(), pw.size(), dpw);
  cu->from_host(nw.data(), nw.size(), dnw);
  for (int M : {3, 17, 64}) {
    const auto h = bf16_rounded(randn(size_t(M * O), uint32_t(83 + M))),
               res = bf16_rounded(randn(size_t(M * C), uint32_t(84 + M), 3.f));
    for (bool next_op : {true, false}) {
      // resid and (next_op) the next projection's output, for `rows` rows.
      auto run = [&](const std::vector<float>& hs, const std::vector<float>& rs, int rows) {
        Buf dh = test::upload_act(*cu, hs), dr = test::upload_act(*cu, rs), dys = cu->alloc_act(size_t(rows * C)),
            dxn = cu->alloc_act(size_t(rows * C)), dout = cu->alloc_act(size_t(rows * O));
        cu->matmul_norm_add(dh, rows, dD, dys, dr, dpw.f32(), 1e-6f, ActPrecision::BF16);
        cu->scale(dr, 0.5f, size_t(rows * C), ActPrecision::BF16, dr);
        std::vector<float> out;
        if (next_op) {
          cu->norm_matmuls(dr, rows, InputNorm{dnw.f32(), 1e-6f, dxn}, {{&dG, dout}}, ActPrecision::BF16);
          out = test::download(*cu, dout, size_t(rows * O));
        }
        const auto r = test::download(*cu, dr, size_t(rows * C));
        out.insert(out.end(), r.begin(), r.end());
        for (const Buf& p : {dh, dr, dys, dxn, dout}) cu->free(p);
        return out;
      };
      const auto together = run(h, res, M);
      int bad = 0;
      const int64_t per = (next_op ? O : 0) + C;
      for (int i = 0; i < M; ++i) {
        const auto a = run(row_of(h, O, i), row_of(res, C, i), 1);
        std::vector<float> t;
        if (next_op) t.insert(t.end(), together.begin() + int64_t(i) * O, together.begin() + int64_t(i + 1) * O);
        const int64_t r0 = (next_op ? M * O : 0) + int64_t(i) * C;
        t.insert(t.end(), together.begin() + r0, together.begin() + r0 + C);
        if (t != a) ++bad;
        ASSERT_EQ(int64_t(a.size()), per);
      }
      EXPECT_EQ(bad, 0) << "M=" << M << (next_op ? " (fused into the next prepare)" : " (launched alone)");
    }
  }
  for (const Buf& p : {dpw, dnw}) cu->free(p);
}

// The routed experts of M rows (past the 8-row decode bound of the default mode) against each
// row alone, Q4_K and MLX mixed-precision experts.
TEST_F(CudaRowExactTest, RoutedExpertsPerRow) {
  const int E = 8, k = 2, d = 512, I = 256;
  std::mt19937 rng(60);
  for (int M : {5, 12, 64}) {
    const auto scores = randn(size_t(M) * E, uint32_t(61 + M)), pes = randn(size_t(E), 62);
    std::vector<int32_t> ri(size_t(M) * k);
    std::vector<float> rw(ri.size());
    auto ref = make_reference_backend();
    ref->router_topk(scores.data(), M, E, k, pes.data(), ActPrecision::F32, ri.data(), rw.data());
    const auto x = bf16_rounded(randn(size_t(M) * d, uint32_t(63 + M)));
    for (bool mixed : {false, true}) {
      const test::TestExperts ex = test::make_test_experts(*cu, E, I, d, mixed, 70, rng);
      auto run = [&](const std::vector<float>& xs, const int32_t* idx, const float* wts, int rows) {
        Buf dx = test::upload_act(*cu, xs), dout = cu->alloc_act(size_t(rows) * d), di = cu->alloc_i32(size_t(rows) * k),
            dw = cu->alloc_f32(size_t(rows) * k);
        cu->from_host(idx, size_t(rows) * k, di);
        cu->from_host(wts, size_t(rows) * k, dw);
        cu->moe_experts(dx, rows, d, di, dw, k, ex.dev_gate, ex.dev_up, ex.dev_down, ActPrecision::BF16, dout);
        const auto out = test::download(*cu, dout, size_t(rows) * d);
        for (const Buf& p : {dx, dout, di, dw}) cu->free(p);
        return out;
      };
      const auto together = run(x, ri.data(), rw.data(), M);
      std::vector<std::vector<float>> alone;
      for (int i = 0; i < M; ++i) alone.push_back(run(row_of(x, d, i), ri.data() + i * k, rw.data() + i * k, 1));
      EXPECT_EQ(rows_differing(together, alone, d), 0) << (mixed ? "MLX mixed" : "Q4_K") << " experts, M=" << M;
    }
  }
}

// Decode attention of four sequences in one launch against each sequence alone: caches of
// different capacities (the batch's largest sets the split count by default) at positions 100,
// 700 and 1500, and a sliding window of 512 in a ring of 600 slots at position 1000.
TEST_F(CudaRowExactTest, DecodeAttentionPerSequence) {
  const int H = 8, Hk = 2, D = 256;
  const std::vector<int> pos = {100, 700, 1500, 1000}, caps = {2048, 800, 4096, 600}, windows = {0, 0, 0, 512};
  for (Backend* be : {cu.get(), plain.get()}) {
    std::vector<Buf> kc, vc;
    std::vector<std::vector<int32_t>> book;
    for (size_t i = 0; i < pos.size(); ++i) {
      const int cap = caps[i];
      book.push_back(std::vector<int32_t>(size_t(cap), -1));
      kc.push_back(be->alloc_act(size_t(cap) * Hk * D));
      vc.push_back(be->alloc_act(size_t(cap) * Hk * D));
      const Buf k = test::upload_act(*be, randn(size_t(pos[i]) * Hk * D, uint32_t(40 + i)));
      const Buf v = test::upload_act(*be, randn(size_t(pos[i]) * Hk * D, uint32_t(50 + i)));
      AttnSeq all;
      all.row0 = 0;
      all.n = pos[i];
      all.pos0 = 0;
      all.kv = test::f32_kv(kc[i], vc[i], book[i].data(), cap, Hk, D, windows[i]);
      for (int p = 0; p < pos[i]; ++p) {
        AttnSeq one = all;
        one.row0 = p;
        one.n = 1;
        one.pos0 = p;
        be->kv_write(one, k, v);
      }
      be->free(k);
      be->free(v);
    }
    const int B = int(pos.size());
    const auto q = randn(size_t(B) * H * D, 77);
    auto run = [&](const std::vector<size_t>& which) {
      std::vector<AttnSeq> seqs;
      std::vector<float> qs;
      for (size_t j = 0; j < which.size(); ++j) {
        const size_t i = which[j];
        AttnSeq s;
        s.row0 = int(j);
        s.n = 1;
        s.pos0 = pos[i] - 1;  // the last written position's query
        s.kv = test::f32_kv(kc[i], vc[i], book[i].data(), caps[i], Hk, D, windows[i]);
        seqs.push_back(s);
        const auto r = row_of(q, int64_t(H) * D, int(i));
        qs.insert(qs.end(), r.begin(), r.end());
      }
      Buf dq = test::upload_act(*be, qs), dout = be->alloc_act(qs.size());
      be->attention(dq, H, seqs, 0.0625f, ActPrecision::BF16, dout);
      const auto out = test::download(*be, dout, qs.size());
      be->free(dq);
      be->free(dout);
      return out;
    };
    const auto together = run({0, 1, 2, 3});
    std::vector<std::vector<float>> alone;
    for (size_t i = 0; i < pos.size(); ++i) alone.push_back(run({i}));
    const int bad = rows_differing(together, alone, int64_t(H) * D);
    if (be == cu.get()) EXPECT_EQ(bad, 0) << "sequences differ from alone";
    else if (bad) std::printf("without row_exact: attention: %d of %d sequences differ from alone\n", bad, B);
    for (size_t i = 0; i < pos.size(); ++i) {
      be->free(kc[i]);
      be->free(vc[i]);
    }
  }
}

}  // namespace
}  // namespace g4
