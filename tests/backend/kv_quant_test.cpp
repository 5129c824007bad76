// Quantized KV caches (backend.h KvBuffer::quant, model/kv_cache.h): attention over a quantized
// cache is attention over the dequantized rows (reference backend, exactly that computation), the
// fast CPU kernel agrees with it, and KvCache converts, grows, copies and truncates quantized
// layers without losing rows.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/host_backend.h"
#include "backend_test_util.h"
#include "model/kv_cache.h"
#include "quant/affine_quantize.h"
#include "quant/matmul.h"

namespace g4 {
namespace {

using test::randn;

constexpr int kH = 4, kHk = 2, kD = 128;

// Writes positions 0..n-1 of k/v into `kv` (one kv_write per position, as decode does), then runs
// attention for the last `q_rows` positions. Returns the output [q_rows, kH, kD].
std::vector<float> run_attention(Backend& be, KvBuffer kv, const std::vector<float>& k,
                                 const std::vector<float>& v, const std::vector<float>& q, int n,
                                 int q_rows, ActPrecision P) {
  for (int p = 0; p < n; ++p) {
    AttnSeq one;
    one.row0 = p;
    one.n = 1;
    one.pos0 = p;
    one.kv = kv;
    be.kv_write(one, k.data(), v.data());
  }
  AttnSeq s;
  s.row0 = 0;
  s.n = q_rows;
  s.pos0 = n - q_rows;
  s.kv = kv;
  std::vector<float> out(size_t(q_rows) * kH * kD);
  be.attention(q.data(), kH, {s}, 0.09f, P, out.data());
  return out;
}

struct HostKv {  // a KvBuffer in plain host vectors (host backends' memory is host memory)
  std::vector<float> k, v, ks, kb, vs, vb;
  std::vector<uint8_t> kq, vq;
  std::vector<int32_t> pos;
  KvBuffer buf;
  HostKv(int cap, int window, KvQuant q) {
    buf.capacity = cap;
    buf.n_kv_heads = kHk;
    buf.head_dim = kD;
    buf.window = window;
    buf.quant = q;
    pos.assign(size_t(cap), -1);
    buf.pos = pos.data();
    const size_t row = size_t(kHk) * kD;
    if (q.bits == 0) {
      k.resize(cap * row);
      v.resize(cap * row);
      buf.k = k.data();
      buf.v = v.data();
    } else {
      kq.resize(cap * buf.row_code_bytes());
      vq.resize(cap * buf.row_code_bytes());
      for (auto* a : {&ks, &kb, &vs, &vb}) a->resize(cap * buf.row_groups());
      buf.kq = kq.data();
      buf.vq = vq.data();
      buf.ks = ks.data();
      buf.kb = kb.data();
      buf.vs = vs.data();
      buf.vb = vb.data();
    }
  }
};

// Rows through mx.quantize semantics and back: what a quantized cache holds, as f32 rows.
std::vector<float> quantize_roundtrip(const std::vector<float>& x, int bits, int group) {
  const size_t n = x.size();
  std::vector<uint8_t> codes(n * bits / 8);
  std::vector<float> s(n / group), b(n / group), out(n);
  affine_quantize(x.data(), n, bits, group, false, codes.data(), s.data(), b.data());
  const WeightView w = mlx_affine_view(codes.data(), int64_t(n / kD), kD, bits, group, s.data(), b.data(), DType::F32);
  for (size_t r = 0; r < n / kD; ++r) dequant_row(w, int64_t(r), out.data() + r * kD);
  return out;
}

TEST(KvQuant, AttentionIsAttentionOverDequantizedRows) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  for (int bits : {3, 4, 8}) {
    for (int window : {0, 8}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " window " + std::to_string(window));
      const int n = 21, q_rows = 5, cap = window ? window + q_rows : n;
      const auto k = randn(size_t(n) * kHk * kD, 1 + bits), v = randn(size_t(n) * kHk * kD, 2 + bits);
      const auto q = randn(size_t(q_rows) * kH * kD, 3);
      const KvQuant quant{bits, 64, false};
      HostKv plain(cap, window, KvQuant{}), qr(cap, window, quant), qc(cap, window, quant);
      // The oracle: f32 attention over the rows the quantizer keeps.
      const auto want = run_attention(*ref, plain.buf, quantize_roundtrip(k, bits, 64),
                                      quantize_roundtrip(v, bits, 64), q, n, q_rows, ActPrecision::F32);
      const auto got_ref = run_attention(*ref, qr.buf, k, v, q, n, q_rows, ActPrecision::F32);
      const auto got_cpu = run_attention(*cpu, qc.buf, k, v, q, n, q_rows, ActPrecision::F32);
      EXPECT_EQ(got_ref, want);  // the same scalar computation on the same values
      EXPECT_LE(test::rel_err(got_cpu, want), 2e-6);
      // And quantization did change something (a 3-bit cache is far from the f32 one).
      HostKv plain2(cap, window, KvQuant{});
      const auto f32 = run_attention(*ref, plain2.buf, k, v, q, n, q_rows, ActPrecision::F32);
      EXPECT_GT(test::max_abs_diff(f32, want), 1e-4);
    }
  }
}

ModelConfig two_layers() { return test::sliding_and_full(kHk, kD, 4); }

// feed_cache over host vectors (host backends' buffers are host memory).
void feed(Backend& be, KvCache& c, const std::vector<float>& k, const std::vector<float>& v, int from, int to,
          int chunk) {
  test::feed_cache(be, c, k.data(), v.data(), from, to, chunk);
}

std::vector<float> attend_last(Backend& be, const KvCache& c, const std::vector<float>& q) {
  return test::attend_last(be, c, q, kH, 0.09f);
}

TEST(KvQuant, CacheConvertsAtStartGrowsCopiesAndTruncates) {
  auto be = make_cpu_backend();
  const ModelConfig cfg = two_layers();
  const int total = 300;  // past the first growth (256 slots) after the conversion
  const auto k = randn(size_t(total) * kHk * kD, 11), v = randn(size_t(total) * kHk * kD, 12);
  const auto q = randn(size_t(kH) * kD, 13);
  KvCacheOptions opt;
  opt.quant = KvQuant{4, 64, false};
  opt.quantized_start = 10;
  ASSERT_TRUE(validate_kv_options(opt, cfg, *be));

  KvCache c(cfg, *be, opt);
  feed(*be, c, k, v, 0, 7, 7);
  EXPECT_FALSE(c.quantized());  // 7 < 10
  const size_t f32_bytes = c.bytes();
  feed(*be, c, k, v, 7, 12, 5);  // reaches 12 >= 10 after this call: converted
  EXPECT_TRUE(c.quantized());
  EXPECT_TRUE(c.layer(1).quantized());
  EXPECT_FALSE(c.layer(0).quantized());  // the sliding ring keeps f32 rows
  EXPECT_LT(c.bytes(), f32_bytes);
  feed(*be, c, k, v, 12, total, 1);  // decode on, through a growth of the quantized layer
  EXPECT_GE(c.layer(1).capacity, total);

  // The same rows quantized from the start (start 0) give the same full-layer attention: the
  // conversion quantizes the rows it holds exactly as writing them quantized would.
  KvCacheOptions opt0 = opt;
  opt0.quantized_start = 0;
  KvCache c0(cfg, *be, opt0);
  feed(*be, c0, k, v, 0, total, 64);
  const auto a = attend_last(*be, c, q), b = attend_last(*be, c0, q);
  EXPECT_EQ(a, b);

  // copy_from into a fresh (f32) cache adopts the quantized layout.
  KvCache d(cfg, *be, opt);
  d.copy_from(c);
  EXPECT_TRUE(d.quantized());
  EXPECT_EQ(attend_last(*be, d, q), a);

  // Truncate, then write the same tail again: same result.
  ASSERT_TRUE(d.truncate(total - 3));
  feed(*be, d, k, v, total - 3, total, 1);
  EXPECT_EQ(attend_last(*be, d, q), a);

  // Memory: the full layer's 4-bit g64 rows take (4/8 + 2*4/64) / 4 = 0.156 of f32 rows.
  KvCache plain(cfg, *be, KvCacheOptions{});
  feed(*be, plain, k, v, 0, total, 64);
  EXPECT_NEAR(double(c.layer(1).row_code_bytes() + 8 * c.layer(1).row_groups()) / (4.0 * kHk * kD), 0.15625, 1e-9);
  EXPECT_LT(c.bytes(), plain.bytes() / 2);
}

TEST(KvQuant, OptionsAreChecked) {
  auto cpu = make_cpu_backend();
  const ModelConfig cfg = two_layers();
  KvCacheOptions o;
  EXPECT_TRUE(validate_kv_options(o, cfg, *cpu));  // f32
  o.quant.bits = 7;
  EXPECT_FALSE(validate_kv_options(o, cfg, *cpu));
  o.quant.bits = 4;
  o.quant.group_size = 256;
  EXPECT_FALSE(validate_kv_options(o, cfg, *cpu));  // not an MLX group size
  ModelConfig narrow = cfg;
  narrow.layers[1].head_dim = 96;  // a full layer whose head_dim 64 does not divide
  o.quant.group_size = 64;
  Status s = validate_kv_options(o, narrow, *cpu);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("does not divide the head_dim 96 of layer 1"), std::string::npos) << s.message();
  o.quantized_start = -1;
  EXPECT_FALSE(validate_kv_options(o, cfg, *cpu));
}

}  // namespace
}  // namespace g4
