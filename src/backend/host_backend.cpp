#include "backend/host_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/status.h"
#include "quant/affine_quantize.h"
#include "quant/matmul.h"

namespace g4 {

void round_activations(float* p, size_t n, ActPrecision P) {
  if (P != ActPrecision::BF16) return;
  for (size_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
}

HostBackend::~HostBackend() {
  for (void* p : owned_) std::free(p);
}

Buf HostBackend::alloc(DType t, size_t n) {
  void* p = std::aligned_alloc(64, ((n * dtype_size(t) + 63) / 64) * 64 + 64);
  G4_CHECK(p != nullptr);
  std::lock_guard<std::mutex> lk(mu_);
  owned_.insert(p);
  return Buf(p, t, int64_t(n), -1);
}
void HostBackend::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (owned_.erase(p)) std::free(p);
}
void HostBackend::read_bytes(const Buf& src, size_t bytes, void* dst) {
  if (bytes) std::memcpy(dst, src.data, bytes);
}
void HostBackend::write_bytes(const void* src, size_t bytes, const Buf& dst) {
  if (bytes) std::memcpy(dst.data, src, bytes);
}
void HostBackend::copy_bytes(const Buf& src, size_t bytes, const Buf& dst) {
  if (bytes) std::memmove(dst.data, src.data, bytes);
}

void HostBackend::embed(const WeightView& E, const Buf& ids_b, int n, float scale, ActPrecision P,
                        const Buf& out_b) {
  const int32_t* ids = ids_b.i32();
  float* out = out_b.f32();
  const int64_t d = E.cols;
  for (int i = 0; i < n; ++i) {
    float* o = out + int64_t(i) * d;
    if (P == ActPrecision::BF16 && E.fmt == WFormat::MlxAffine) {
      dequant_row_mlx_bf16(E, ids[i], o);  // mx.dequantize in bf16
    } else {
      dequant_row(E, ids[i], o);
    }
    // MLX dequantizes into the scales' dtype: bf16 rows are exact, then x * T(scale).
    for (int64_t c = 0; c < d; ++c) o[c] = rnd(rnd(o[c], P) * scale, P);
  }
}

void dequant_row_mlx_bf16(const WeightView& W, int64_t r, float* out) {
  const int64_t K = W.cols, G = W.group_size;
  // The same packed codes with scale 1 and bias 0 give the raw q values.
  std::vector<float> one_s(static_cast<size_t>(K / G), 1.f), zero_b(static_cast<size_t>(K / G), 0.f);
  WeightView row = W;
  row.scales = one_s.data();
  row.biases = zero_b.data();
  row.scale_dtype = DType::F32;
  row.data = static_cast<const uint8_t*>(W.data) + r * W.row_bytes;
  row.rows = 1;
  dequant_row(row, 0, out);
  const size_t so = size_t(r) * size_t(K / G);
  for (int64_t c = 0; c < K; ++c) {
    const float s = round_bf16(load_float(W.scales, W.scale_dtype, so + size_t(c / G)));
    const float b = round_bf16(load_float(W.biases, W.scale_dtype, so + size_t(c / G)));
    out[c] = round_bf16(round_bf16(s * out[c]) + b);
  }
}

void matmul_mlx_bf16_emulation(const float* x, int M, const WeightView& W, float* y) {
  const int64_t K = W.cols;
  std::vector<float> unit(static_cast<size_t>(K));
  for (int64_t r = 0; r < W.rows; ++r) {
    dequant_row_mlx_bf16(W, r, unit.data());
    for (int m = 0; m < M; ++m) {
      const float* xr = x + int64_t(m) * K;
      float acc = 0.f;
      for (int64_t c = 0; c < K; ++c) acc = round_bf16(acc + round_bf16(xr[c] * unit[size_t(c)]));
      y[int64_t(m) * W.rows + r] = acc;
    }
  }
}

void matmul_mlx_float_bf16_emulation(const float* x, int M, const WeightView& W, float* y) {
  const int64_t K = W.cols;
  std::vector<float> w(static_cast<size_t>(K));
  for (int64_t r = 0; r < W.rows; ++r) {
    dequant_row(W, r, w.data());
    for (int m = 0; m < M; ++m) {
      const float* xr = x + int64_t(m) * K;
      float acc = 0.f;
      for (int64_t c = 0; c < K; ++c) {
        const float p = xr[c] * w[size_t(c)];  // no fma: product rounded to f32, then added
        acc += p;
      }
      y[int64_t(m) * W.rows + r] = round_bf16(acc);
    }
  }
}

void matmul_mlx_bf16_parity(const float* x, int M, const WeightView& W, float* y) {
  if (W.fmt == WFormat::MlxAffine) {
    matmul_mlx_bf16_emulation(x, M, W, y);
  } else {
    matmul_mlx_float_bf16_emulation(x, M, W, y);
  }
}

void HostBackend::matmul(const Buf& x_b, int M, const WeightView& W, ActPrecision P, const Buf& y_b) {
  const float* x = x_b.f32();
  float* y = y_b.f32();
  if (P == ActPrecision::BF16 && is_mlx_parity_format(W.fmt)) {
    matmul_mlx_bf16_parity(x, M, W, y);
    return;
  }
  matmul_ref(x, M, W, y);
  round_activations(y, size_t(M) * W.rows, P);
}

void HostBackend::rms_norm(const Buf& x_b, int rows, int dim, const float* w, float eps, ActPrecision P,
                           const Buf& y_b) {
  const float* x = x_b.f32();
  float* y = y_b.f32();
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + int64_t(r) * dim;
    float* yr = y + int64_t(r) * dim;
    float ss = 0.f;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (int i = 0; i < dim; ++i) {
      float v = rnd(xr[i] * inv, P);
      yr[i] = w ? rnd(v * w[i], P) : v;
    }
  }
}

void HostBackend::rope(const Buf& x_b, int rows, int heads, int head_dim, int pos0, const RopeTable& t,
                       ActPrecision P) {
  float* x = x_b.f32();
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const float pos = float(pos0 + r) * t.position_scale;
    for (int h = 0; h < heads; ++h) {
      float* v = x + (int64_t(r) * heads + h) * head_dim;
      for (int j = 0; j < half; ++j) {
        if (t.inv_freq[j] == 0.f) continue;
        const float th = pos * t.inv_freq[j];
        const float a = v[j], b = v[j + half];
        if (P == ActPrecision::BF16) {
          // MLX CPU rope in bf16: cos/sin cast to bf16, every product and sum rounded.
          const float c = round_bf16(std::cos(th)), s = round_bf16(std::sin(th));
          v[j] = round_bf16(round_bf16(a * c) - round_bf16(b * s));
          v[j + half] = round_bf16(round_bf16(a * s) + round_bf16(b * c));
        } else {
          const float c = std::cos(th), s = std::sin(th);
          v[j] = a * c - b * s;
          v[j + half] = a * s + b * c;
        }
      }
    }
  }
}

void HostBackend::kv_write(const AttnSeq& s, const Buf& k_b, const Buf& v_b) {
  const float* k = k_b.f32();
  const float* v = v_b.f32();
  const KvBuffer& kv = s.kv;
  const size_t row = kv.row_floats();
  for (int t = 0; t < s.n; ++t) {
    const int pos = s.pos0 + t;
    const int64_t slot = kv_slot(kv, pos);
    G4_CHECK(slot >= 0 && slot < kv.stored_slots());
    const float* ks = k + size_t(s.row0 + t) * row;
    const float* vs = v + size_t(s.row0 + t) * row;
    if (kv.quantized()) {
      const KvQuant& q = kv.quant;
      const size_t cb = kv.row_code_bytes(), ng = kv.row_groups();
      affine_quantize(ks, row, q.bits, q.group_size, q.bf16_params, kv.kq + slot * cb, kv.ks + slot * ng,
                      kv.kb + slot * ng);
      affine_quantize(vs, row, q.bits, q.group_size, q.bf16_params, kv.vq + slot * cb, kv.vs + slot * ng,
                      kv.vb + slot * ng);
    } else {
      std::memcpy(kv.k.f32() + slot * row, ks, row * 4);
      std::memcpy(kv.v.f32() + slot * row, vs, row * 4);
    }
    kv.pos[slot] = pos;
  }
}

const float* kv_head_row(const KvBuffer& kv, bool value, int slot, int g, float* buf) {
  const int64_t r = int64_t(slot) * kv.n_kv_heads + g;
  if (!kv.quantized()) return (value ? kv.v : kv.k).f32() + r * kv.head_dim;
  dequant_row(value ? kv.v_view() : kv.k_view(), r, buf);
  return buf;
}

// exp() as MLX's CPU kernels compute it (Cephes-style: 2^round(x·log2 e) times a degree-6
// polynomial in the fractional part, evaluated with fma), so that bf16 parity mode reproduces
// MLX's softmax bit for bit.
static float mlx_exp(float x0) {
  if (std::isnan(x0)) return x0;
  if (x0 > 88.f) return INFINITY;
  if (x0 < -88.f) return 0.f;
  float x = x0 * 1.442695f;
  const float ip = std::floor(x + 0.5f);
  const float fp = x - ip;
  float p = 1.535336188319500e-4f;
  p = std::fma(p, fp, 1.339887440266574e-3f);
  p = std::fma(p, fp, 9.618437357674640e-3f);
  p = std::fma(p, fp, 5.550332471162809e-2f);
  p = std::fma(p, fp, 2.402264791363012e-1f);
  p = std::fma(p, fp, 6.931472028550421e-1f);
  p = std::fma(p, fp, 1.0f);
  const int32_t e = (int32_t(ip) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, 4);
  return scale * p;
}

void HostBackend::attend_one(const float* q, const KvBuffer& kv, int g, KeyRange keys, float scale,
                             ActPrecision P, float* scores, float* out) {
  const int D = kv.head_dim;
  const int first = keys.lo;
  const int n = keys.hi - keys.lo + 1;
  thread_local std::vector<float> deq;  // a dequantized row of a quantized cache
  if (kv.quantized() && deq.size() < size_t(D)) deq.resize(size_t(D));
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const int p = first + j;
    const int64_t slot = kv_slot(kv, p);
    G4_CHECK(kv.pos[slot] == p);
    const float* kr = kv_head_row(kv, false, slot, g, deq.data());
    float s = 0.f;
    for (int i = 0; i < D; ++i) s += q[i] * kr[i];
    s = rnd(s * scale, P);
    scores[j] = s;
    mx = std::max(mx, s);
  }
  float sum = 0.f;
  for (int j = 0; j < n; ++j) {
    scores[j] = P == ActPrecision::BF16 ? mlx_exp(scores[j] - mx) : std::exp(scores[j] - mx);
    sum += scores[j];
  }
  const float inv = 1.f / sum;
  for (int i = 0; i < D; ++i) out[i] = 0.f;
  for (int j = 0; j < n; ++j) {
    const int p = first + j;
    const int64_t slot = kv_slot(kv, p);
    const float pj = rnd(scores[j] * inv, P);
    const float* vr = kv_head_row(kv, true, slot, g, deq.data());
    for (int i = 0; i < D; ++i) out[i] += pj * vr[i];
  }
  for (int i = 0; i < D; ++i) out[i] = rnd(out[i], P);
}

void HostBackend::attention(const Buf& q_b, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                            const Buf& out_b) {
  const float* q = q_b.f32();
  float* out = out_b.f32();
  std::vector<float> scores;
  for (const AttnSeq& s : seqs) {
    const int D = s.kv.head_dim, group = H / s.kv.n_kv_heads;
    scores.resize(size_t(s.pos0 + s.n) + 1);
    for (int t = 0; t < s.n; ++t) {
      for (int h = 0; h < H; ++h) {
        const size_t off = (size_t(s.row0 + t) * H + h) * D;
        attend_one(q + off, s.kv, h / group, visible_keys(s, t), scale, P, scores.data(), out + off);
      }
    }
  }
}

void HostBackend::gelu_mul(const Buf& gate_b, const Buf& up_b, size_t n, ActPrecision P, const Buf& out_b) {
  const float *gate = gate_b.f32(), *up = up_b.f32();
  float* out = out_b.f32();
  // mlx nn.gelu_approx: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))), each op in T.
  const float c0 = rnd(0.044715f, P), c1 = rnd(0.7978845608028654f, P);
  for (size_t i = 0; i < n; ++i) {
    const float x = gate[i];
    const float a = rnd(0.5f * x, P);
    float c = rnd(std::pow(x, 3.0f), P);
    c = rnd(c0 * c, P);
    c = rnd(x + c, P);
    c = rnd(c1 * c, P);
    c = rnd(std::tanh(c), P);
    c = rnd(1.f + c, P);
    const float g = rnd(a * c, P);
    out[i] = rnd(g * up[i], P);
  }
}

// ggml_table_gelu_f16 (ggml-cpu.c): for every f16 bit pattern h, f16(ggml_gelu_f32(f32(h))) with
// ggml_gelu_f32(x) = 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x))), as the
// llama.cpp build compiles it: GCC fuses 1.0f + (GELU_COEF_A*x)*x into one fma (seen in the
// disassembly of libggml-cpu's table set-up; without it entry 0xbfff is one f16 ulp off).
const std::vector<uint16_t>& ggml_gelu_f16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    const float kA = 0.044715f, kS = 0.79788456080286535587989211986876f;
    for (uint32_t h = 0; h < t.size(); ++h) {
      const float x = f16_to_f32(uint16_t(h));
      t[h] = f32_to_f16(0.5f * x * (1.0f + std::tanh(kS * x * std::fma(kA * x, x, 1.0f))));
    }
    return t;
  }();
  return table;
}

void HostBackend::gelu_mul_ggml(const Buf& gate_b, const Buf& up_b, size_t n, const Buf& out_b) {
  const float *gate = gate_b.f32(), *up = up_b.f32();
  float* out = out_b.f32();
  const std::vector<uint16_t>& table = ggml_gelu_f16_table();
  for (size_t i = 0; i < n; ++i) {
    const float x = gate[i];
    if (x <= -10.0f) out[i] = 0.0f;
    else if (x >= 10.0f) out[i] = x * up[i];
    else out[i] = f16_to_f32(table[f32_to_f16(x)]) * up[i];
  }
}

void HostBackend::add(const Buf& a_b, const Buf& b_b, size_t n, ActPrecision P, const Buf& y_b) {
  const float *a = a_b.f32(), *b = b_b.f32();
  float* y = y_b.f32();
  for (size_t i = 0; i < n; ++i) y[i] = rnd(a[i] + b[i], P);
}
void HostBackend::scale(const Buf& a_b, float s, size_t n, ActPrecision P, const Buf& y_b) {
  const float* a = a_b.f32();
  float* y = y_b.f32();
  for (size_t i = 0; i < n; ++i) y[i] = rnd(a[i] * s, P);
}
void HostBackend::softcap(const Buf& x_b, size_t n, float cap, ActPrecision P) {
  float* x = x_b.f32();
  for (size_t i = 0; i < n; ++i) x[i] = rnd(rnd(std::tanh(rnd(x[i] / cap, P)), P) * cap, P);
}
void HostBackend::gather_rows(const Buf& src, const Buf& idx_b, int n, int dim, const Buf& dst) {
  const int32_t* idx = idx_b.i32();
  const size_t e = src.elem_bytes();
  for (int i = 0; i < n; ++i)
    std::memcpy(dst.at(int64_t(i) * dim).data, src.at(int64_t(idx[i]) * dim).data, size_t(dim) * e);
}
void HostBackend::copy_cols(const Buf& src, int rows, int src_dim, int off, int n, const Buf& dst) {
  const size_t e = src.elem_bytes();
  for (int r = 0; r < rows; ++r)
    std::memcpy(dst.at(int64_t(r) * n).data, src.at(int64_t(r) * src_dim + off).data, size_t(n) * e);
}

void HostBackend::router_topk(const Buf& scores_b, int rows, int E, int k, const float* per_expert_scale,
                              ActPrecision P, const Buf& idx_b, const Buf& weights_b) {
  const float* scores = scores_b.f32();
  int32_t* idx = idx_b.i32();
  float* weights = weights_b.f32();
  std::vector<int> order(E);
  for (int r = 0; r < rows; ++r) {
    const float* s = scores + size_t(r) * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      // mx.argpartition orders by (value, index): among equal scores the
                      // higher expert index is among the top k.
                      [&](int a, int b) { return s[a] > s[b] || (s[a] == s[b] && a > b); });
    float mx = -INFINITY;
    for (int j = 0; j < k; ++j) mx = std::max(mx, s[order[j]]);
    std::vector<float> e(static_cast<size_t>(k));
    if (P == ActPrecision::BF16) {
      // mlx-lm: mx.softmax (not precise) on bf16: exponentials, their running sum and the
      // reciprocal are each rounded to bf16.
      float sum = 0.f;
      for (int j = 0; j < k; ++j) {
        e[size_t(j)] = round_bf16(std::exp(round_bf16(s[order[j]] - mx)));
        sum = round_bf16(sum + e[size_t(j)]);
      }
      const float inv = round_bf16(1.f / sum);
      for (int j = 0; j < k; ++j) e[size_t(j)] = round_bf16(e[size_t(j)] * inv);
    } else {
      float sum = 0.f;
      for (int j = 0; j < k; ++j) sum += (e[size_t(j)] = std::exp(s[order[j]] - mx));
      for (int j = 0; j < k; ++j) e[size_t(j)] /= sum;
    }
    for (int j = 0; j < k; ++j) {
      idx[r * k + j] = order[j];
      weights[r * k + j] = rnd(e[size_t(j)] * per_expert_scale[order[j]], P);
    }
  }
}

void HostBackend::moe_experts(const Buf& x_b, int rows, int d, const Buf& idx_b, const Buf& w_b, int k,
                              const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision P, const Buf& out_b) {
  const float *x = x_b.f32(), *w = w_b.f32();
  const int32_t* idx = idx_b.i32();
  float* out = out_b.f32();
  const int64_t I = gate.rows();
  std::vector<float> g(I), u(I), y(d), acc(d);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * d;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int j = 0; j < k; ++j) {
      const int e = idx[r * k + j];
      if (!gate.holds(e)) continue;  // another rank's expert
      matmul(xr, 1, gate.expert(e), P, g.data());
      matmul(xr, 1, up.expert(e), P, u.data());
      gelu_mul(g.data(), u.data(), size_t(I), P, g.data());
      matmul(g.data(), 1, down.expert(e), P, y.data());
      const float wj = w[r * k + j];
      for (int i = 0; i < d; ++i) acc[i] += rnd(wj * y[i], P);
    }
    for (int i = 0; i < d; ++i) out[size_t(r) * d + i] = rnd(acc[i], P);
  }
}

RopeTable make_rope_table(const RopeSpec& spec, int D) {
  RopeTable t;
  t.spec = spec;
  const int half = D / 2;
  t.inv_freq.assign(half, 0.f);
  if (spec.kind == RopeKind::Proportional) {
    // mlx-lm ProportionalRoPE: freqs = factor * base ** (arange(0, rot, 2) / D), the rest inf.
    const int rot = int(spec.partial_factor * float(D));
    for (int j = 0; 2 * j < rot; ++j) {
      const float e = float(2 * j) / float(D);
      const float f = spec.factor * std::pow(spec.theta, e);
      t.inv_freq[j] = 1.0f / f;
    }
  } else {
    // MLX fast.rope default: inv_freq_j = exp(-j * ln(base) / (D/2)).
    const float lb = std::log(spec.theta) / float(half);
    for (int j = 0; j < half; ++j) t.inv_freq[j] = std::exp(-float(j) * lb);
    if (spec.kind == RopeKind::Linear && spec.factor > 0) t.position_scale = 1.0f / spec.factor;
  }
  return t;
}

}  // namespace g4
