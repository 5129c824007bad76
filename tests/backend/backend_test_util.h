// Helpers shared by the backend tests: random data, host <-> backend copies, error measures, and
// one attention scenario run on any backend (host or device memory alike).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "model/kv_cache.h"

namespace g4::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// An f32 KV buffer over the given memory (pos: host bookkeeping).
inline KvBuffer f32_kv(const Buf& k, const Buf& v, int32_t* pos, int capacity, int n_kv_heads, int head_dim, int window) {
  KvBuffer b;
  b.k = k;
  b.v = v;
  b.pos = pos;
  b.capacity = capacity;
  b.n_kv_heads = n_kv_heads;
  b.head_dim = head_dim;
  b.window = window;
  return b;
}

// A two-layer config for KV-cache tests: a sliding layer (window `window`) then a full layer,
// Hk KV heads of head_dim D, 4 query heads.
inline ModelConfig sliding_and_full(int Hk, int D, int window) {
  ModelConfig c;
  c.n_layers = 2;
  c.n_heads = 4;
  LayerSpec s;
  s.kind = AttnKind::Sliding;
  s.window = window;
  s.n_kv_heads = Hk;
  s.head_dim = D;
  LayerSpec f = s;
  f.kind = AttnKind::Full;
  f.window = 0;
  c.layers = {s, f};
  return c;
}

// Writes rows [from, to) of k/v (backend buffers, row r = position r) into both layers of `c`,
// `chunk` rows per call, as Model::forward does (reserve, kv_write, advance); `steps` brackets
// each call as a recorded step (begin_step / end_step).
inline void feed_cache(Backend& be, KvCache& c, const Buf& k, const Buf& v, int from, int to, int chunk,
                       bool steps = false) {
  for (int p = from; p < to; p += chunk) {
    const int n = std::min(chunk, to - p);
    c.reserve(n);
    if (steps) be.begin_step();
    for (int l = 0; l < 2; ++l) {
      AttnSeq s;
      s.row0 = p;
      s.n = n;
      s.pos0 = p;
      s.kv = c.layer(l);
      be.kv_write(s, k, v);
    }
    if (steps) be.end_step();
    c.advance(n);
  }
}

// Attention of one query row q [H, head_dim] at the cache's last position over both layers of a
// sliding_and_full cache: [2, H, head_dim], scale `scale`, f32.
inline std::vector<float> attend_last(Backend& be, const KvCache& c, const std::vector<float>& q, int H,
                                      float scale) {
  const size_t hd = size_t(c.layer(0).head_dim);
  std::vector<float> out(size_t(H) * hd * 2);
  for (int l = 0; l < 2; ++l) {
    AttnSeq s;
    s.row0 = 0;
    s.n = 1;
    s.pos0 = c.size() - 1;
    s.kv = c.layer(l);
    be.attention(q.data(), H, {s}, scale, ActPrecision::F32, out.data() + size_t(l) * H * hd);
  }
  return out;
}

// The options of the CUDA backend's fast decode mode (bf16 activations, int8 dots), row-exact or
// not.
inline BackendOptions cuda_int8_options(bool row_exact = false) {
  BackendOptions opt;
  opt.activations = DType::BF16;
  opt.int8_dots = true;
  opt.row_exact = row_exact;
  return opt;
}
// The CUDA backend in that mode; null with the reason in *why where the build or the machine has
// no CUDA.
inline std::unique_ptr<Backend> cuda_int8_backend(bool row_exact, std::string* why) {
  return make_cuda_backend(why, cuda_int8_options(row_exact));
}

// A backend copy of host data / a host copy of backend data.
inline Buf upload(Backend& be, const std::vector<float>& h) {
  Buf d = be.alloc_f32(h.size());
  be.from_host(h.data(), h.size(), d);
  return d;
}
// h with every value rounded to bf16 (what a bf16 device buffer of h holds).
inline std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}
// The same in the backend's activation dtype (bf16 storage on a bf16 device backend: rounded).
inline Buf upload_act(Backend& be, const std::vector<float>& h) {
  Buf d = be.alloc_act(h.size());
  be.from_host(h.data(), h.size(), d);
  return d;
}
inline std::vector<float> download(Backend& be, const Buf& d, size_t n) {
  std::vector<float> h(n);
  be.to_host(d, n, h.data());
  return h;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}
// max |a - b| / max |b| (infinite when a has a non-finite value)
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    e = std::max(e, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return e / std::max(m, 1e-30);
}

// One sequence with pos0 cached positions then n new query rows; 4 query heads over 1 KV head of
// 256; a sliding window (ring buffer) when window > 0. Fills the cache position by position with
// kv_write, runs attention with scale 1/16 and returns the output [n, 4, 256].
// blocks: bidirectional image blocks [start, end) (absolute positions within [pos0, pos0 + n)).
inline std::vector<float> attention_scenario(Backend& b, int pos0, int n, int window,
                                             const std::vector<std::pair<int, int>>& blocks = {}, int D = 256,
                                             int Hk = 1) {
  const int H = 4, cap = window > 0 ? window + n : pos0 + n;
  const auto q = randn(size_t(n * H * D), uint32_t(10 + pos0 + n));
  const auto kall = randn(size_t((pos0 + n) * Hk * D), uint32_t(20 + n));
  const auto vall = randn(size_t((pos0 + n) * Hk * D), uint32_t(30 + n));
  Buf k = b.alloc_act(size_t(cap * Hk * D));  // the backend's activation dtype throughout
  Buf v = b.alloc_act(size_t(cap * Hk * D));
  std::vector<int32_t> pos(size_t(cap), -1);  // host bookkeeping on every backend
  Buf dk = upload_act(b, kall);
  Buf dv = upload_act(b, vall);
  Buf dq = upload_act(b, q);
  Buf dout = b.alloc_act(q.size());
  AttnSeq s;
  s.kv = f32_kv(k, v, pos.data(), cap, Hk, D, window);
  for (int p = 0; p < pos0 + n; ++p) {
    AttnSeq one = s;
    one.row0 = p;
    one.n = 1;
    one.pos0 = p;
    b.kv_write(one, dk, dv);
  }
  s.row0 = 0;
  s.n = n;
  s.pos0 = pos0;
  std::vector<int32_t> blk(size_t(n) * 2, 0);
  for (auto [lo, hi] : blocks)
    for (int p = lo; p < hi; ++p) {
      blk[size_t(p - pos0) * 2] = lo;
      blk[size_t(p - pos0) * 2 + 1] = hi;
    }
  if (!blocks.empty()) s.blocks = blk.data();
  b.attention(dq, H, {s}, 0.0625f, ActPrecision::F32, dout);
  std::vector<float> out = download(b, dout, q.size());
  for (const Buf& p : {k, v, dk, dv, dq, dout}) b.free(p);
  return out;
}

}  // namespace g4::test
