// The fused ops' defaults (backend.h): the same ops, one after the other, as the model ran them
// before the fused forms existed, so host backends compute exactly what they did; the host
// fallbacks of argmax and top_k; and the typed host copies over the backends' raw byte copies.
#include "backend/backend.h"
#include "backend/dropout_mask.h"
#include "backend/draw_top_arrays.h"
#include "core/token_mask.h"
#include "sampling/top_draw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace g4 {

void Backend::to_host(const Buf& src, size_t n, float* dst) {
  if (!n) return;
  if (src.dtype == DType::F32) return read_bytes(src, n * 4, dst);
  G4_CHECK((src.dtype == DType::BF16 || src.dtype == DType::F16) && "to_host(float*): not a float buffer");
  std::vector<uint16_t> h(n);
  read_bytes(src, n * 2, h.data());
  for (size_t i = 0; i < n; ++i) dst[i] = src.dtype == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
}
void Backend::to_host(const Buf& src, size_t n, int32_t* dst) {
  G4_CHECK(src.dtype == DType::I32 && "to_host(int32_t*): not an I32 buffer");
  if (n) read_bytes(src, n * 4, dst);
}
void Backend::from_host(const float* src, size_t n, const Buf& dst) {
  if (!n) return;
  if (dst.dtype == DType::F32) return write_bytes(src, n * 4, dst);
  G4_CHECK((dst.dtype == DType::BF16 || dst.dtype == DType::F16) && "from_host(float*): not a float buffer");
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = dst.dtype == DType::BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
  write_bytes(h.data(), n * 2, dst);
}
void Backend::from_host(const int32_t* src, size_t n, const Buf& dst) {
  G4_CHECK(dst.dtype == DType::I32 && "from_host(int32_t*): not an I32 buffer");
  if (n) write_bytes(src, n * 4, dst);
}
void Backend::copy(const Buf& src, size_t n, const Buf& dst) {
  G4_CHECK(src.dtype == dst.dtype && "copy between buffers of different dtypes");
  if (n) copy_bytes(src, n * src.elem_bytes(), dst);
}

void Backend::queue_read(const Buf& src, size_t bytes, int slot) {
  G4_CHECK(slot >= 0 && slot < kReadSlots && bytes <= kQueuedReadBytes && "queue_read: slot or size");
  read_slots_[slot].resize(bytes);
  if (bytes) read_bytes(src, bytes, read_slots_[slot].data());
}
void Backend::take_read(int slot, size_t bytes, void* dst) {
  G4_CHECK(slot >= 0 && slot < kReadSlots && bytes <= read_slots_[slot].size() && "take_read: slot or size");
  if (bytes) std::memcpy(dst, read_slots_[slot].data(), bytes);
}

bool dropout_keeps(uint64_t seed, uint64_t i, float p) { return dropout_mask_keeps(seed, i, p); }

void Backend::dropout(const Buf& x, size_t n, float p, uint64_t seed, const Buf& y) {
  std::vector<float> h(n);
  to_host(x, n, h.data());
  const float s = 1.f / (1.f - p);
  for (size_t i = 0; i < n; ++i) h[i] = dropout_keeps(seed, i, p) ? h[i] * s : 0.f;
  from_host(h.data(), n, y);
}

void Backend::add_lora(const LoraApply* lora, const Buf& x, const Buf& y, ActPrecision P) {
  if (!lora) return;
  for (const LoraRun& r : lora->runs) {
    const LoraDelta* d = r.delta;
    if (!d) continue;
    const int64_t in = d->a.cols, out = d->b.rows;
    Buf xr = x.at(int64_t(r.row0) * in);
    if (lora->dropout_seed != 0 && d->dropout > 0.f) {  // training: the module's own mask
      dropout(xr, size_t(r.rows) * size_t(in), d->dropout, lora->dropout_seed * 0x100000001B3ull + d->id, lora->xd);
      xr = lora->xd;
    }
    lora_delta(xr, r.rows, *d, lora->t, lora->z, y.at(int64_t(r.row0) * out), P);
  }
}

void Backend::lora_delta(const Buf& x, int M, const LoraDelta& d, const Buf& t, const Buf& z, const Buf& y,
                         ActPrecision P) {
  const size_t n = size_t(M) * size_t(d.b.rows);
  matmul(x, M, d.a, ActPrecision::F32, t);  // f32 products, as MLX promotes them
  matmul(t, M, d.b, ActPrecision::F32, z);
  scale(z, d.scale, n, P, z);  // (scale * z).astype(x.dtype)
  add(y, z, n, P, y);
}

void Backend::norm_add(const Buf& x, const Buf& o, int rows, int dim, const float* w, float eps, ActPrecision P) {
  rms_norm(o, rows, dim, w, eps, P, o);
  add(x, o, size_t(rows) * size_t(dim), P, x);
}

void Backend::moe_norms(const Buf& f, const Buf& x, int rows, int dim, const float* w_f, const float* w_r,
                        const float* w_x, float eps, ActPrecision P, const Buf& h1, const Buf& xr, const Buf& xn) {
  rms_norm(f, rows, dim, w_f, eps, P, h1);
  rms_norm(x, rows, dim, w_r, eps, P, xr);
  rms_norm(x, rows, dim, w_x, eps, P, xn);
}

void Backend::moe_exit(const Buf& x, const Buf& h1, const Buf& h2, int rows, int dim, const float* w2,
                       const float* w, float eps, float s, ActPrecision P, const Buf& f) {
  const size_t n = size_t(rows) * size_t(dim);
  rms_norm(h2, rows, dim, w2, eps, P, h2);
  add(h1, h2, n, P, f);
  norm_add(x, f, rows, dim, w, eps, P);
  if (s != 1.f) scale(x, s, n, P, x);
}

void Backend::matmul_norm_add(const Buf& x, int M, const WeightView& W, const Buf& y_scratch, const Buf& x_resid,
                              const float* w, float eps, ActPrecision P, const LoraApply* lora) {
  linear(x, M, W, lora, P, y_scratch);
  norm_add(x_resid, y_scratch, M, int(W.rows), w, eps, P);
}

void Backend::norm_rope(const Buf& x, int heads, int head_dim, const float* w, float eps,
                        const std::vector<AttnSeq>& seqs, const RopeTable& t, ActPrecision P) {
  int rows = 0;
  for (const AttnSeq& s : seqs) rows += s.n;
  rms_norm(x, rows * heads, head_dim, w, eps, P, x);
  for (const AttnSeq& s : seqs) rope(x.at(int64_t(s.row0) * heads * head_dim), s.n, heads, head_dim, s.pos0, t, P);
}

void Backend::attn_prep(const Buf& q, int H, const Buf& k, const Buf& v, int Hk, int head_dim, const float* q_norm_w,
                        const float* k_norm_w, bool v_norm, float eps, const std::vector<AttnSeq>& seqs,
                        const RopeTable& t, ActPrecision P) {
  auto norm_rope_or_rope = [&](const Buf& x, int heads, const float* w) {
    if (w) {
      norm_rope(x, heads, head_dim, w, eps, seqs, t, P);
      return;
    }
    for (const AttnSeq& s : seqs) rope(x.at(int64_t(s.row0) * heads * head_dim), s.n, heads, head_dim, s.pos0, t, P);
  };
  norm_rope_or_rope(q, H, q_norm_w);
  if (!k) return;
  int rows = 0;
  for (const AttnSeq& s : seqs) rows += s.n;
  if (v_norm) rms_norm(v, rows * Hk, head_dim, nullptr, eps, P, v);
  norm_rope_or_rope(k, Hk, k_norm_w);
  for (const AttnSeq& s : seqs) kv_write(s, k, v);
}

namespace {
// The input the projections read: x itself, or its norm in norm.scratch.
Buf normed_input(Backend& be, const Buf& x, int M, int cols, const InputNorm& norm, ActPrecision P) {
  if (!norm.w) return x;
  be.rms_norm(x, M, cols, norm.w, norm.eps, P, norm.scratch);
  return norm.scratch;
}
}  // namespace

void Backend::norm_matmuls(const Buf& x, int M, const InputNorm& norm, std::initializer_list<MatOut> outs,
                           ActPrecision P) {
  if (outs.size() == 0) return;
  const Buf xn = normed_input(*this, x, M, int(outs.begin()->w->cols), norm, P);
  for (const MatOut& o : outs) linear(xn, M, *o.w, o.lora, P, o.y);
}

void Backend::gate_up_gelu(const Buf& x, int M, const InputNorm& norm, const WeightView& G, const WeightView& U,
                           bool ggml_table, ActPrecision P, const Buf& gate_out, const Buf& up_scratch,
                           const LoraApply* lora_gate, const LoraApply* lora_up) {
  const Buf xn = normed_input(*this, x, M, int(G.cols), norm, P);
  linear(xn, M, G, lora_gate, P, gate_out);
  linear(xn, M, U, lora_up, P, up_scratch);
  const size_t n = size_t(M) * size_t(G.rows);
  if (ggml_table && P == ActPrecision::F32) gelu_mul_ggml(gate_out, up_scratch, n, gate_out);
  else gelu_mul(gate_out, up_scratch, n, P, gate_out);
}

void Backend::argmax(const Buf& x, int rows, int n, const Buf& out) {
  std::vector<float> h(size_t(rows) * size_t(n));
  to_host(x, h.size(), h.data());
  std::vector<int32_t> ids(size_t(rows), 0);
  for (int r = 0; r < rows; ++r) {
    const float* row = h.data() + size_t(r) * size_t(n);
    int best = -1;
    for (int i = 0; i < n; ++i)
      if (!std::isnan(row[i]) && (best < 0 || row[i] > row[best])) best = i;
    ids[size_t(r)] = best < 0 ? 0 : best;
  }
  from_host(ids.data(), ids.size(), out);
}

void Backend::mask_logits(const Buf& x, int n, const Buf& allow, const Buf& rows, int count) {
  if (count <= 0) return;
  const int W = token_mask_words(n);
  std::vector<int32_t> words(size_t(count) * size_t(W));
  std::vector<int32_t> ids(static_cast<size_t>(count));
  to_host(allow, words.size(), words.data());
  to_host(rows, ids.size(), ids.data());
  std::vector<float> row;
  for (int i = 0; i < count; ++i) {
    const auto* mask = reinterpret_cast<const uint32_t*>(words.data()) + size_t(i) * size_t(W);
    const Buf r = x.at(int64_t(ids[size_t(i)]) * n);
    if (r.on_host()) {  // the host backends' logits: in place
      apply_token_mask(r.f32(), n, mask);
      continue;
    }
    row.resize(size_t(n));  // elsewhere: only the masked rows travel
    to_host(r, row.size(), row.data());
    apply_token_mask(row.data(), n, mask);
    from_host(row.data(), row.size(), r);
  }
}

void Backend::top_k(const Buf& x, int rows, int n, int k, const Buf& vals, const Buf& idx, const Buf& lse) {
  std::vector<float> h(size_t(rows) * size_t(n));
  to_host(x, h.size(), h.data());
  std::vector<float> v(size_t(rows) * size_t(k));
  std::vector<float> l(static_cast<size_t>(rows));
  std::vector<int32_t> ids(size_t(rows) * size_t(k));
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int r = 0; r < rows; ++r) {
    const float* row = h.data() + size_t(r) * size_t(n);
    auto key = [row](int32_t i) { return std::isnan(row[i]) ? -INFINITY : row[i]; };
    for (int i = 0; i < n; ++i) order[size_t(i)] = i;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return key(a) != key(b) ? key(a) > key(b) : a < b;
    });
    double m = -INFINITY;
    for (int i = 0; i < n; ++i) m = std::max(m, double(key(i)));
    double sum = 0;
    if (std::isfinite(m))
      for (int i = 0; i < n; ++i) sum += std::exp(double(key(i)) - m);
    l[size_t(r)] = std::isfinite(m) ? float(m + std::log(sum)) : float(m);
    for (int j = 0; j < k; ++j) {
      ids[size_t(r) * k + j] = order[size_t(j)];
      v[size_t(r) * k + j] = row[order[size_t(j)]];
    }
  }
  from_host(v.data(), v.size(), vals);
  from_host(ids.data(), ids.size(), idx);
  from_host(l.data(), l.size(), lse);
}

void Backend::draw_top(const Buf& vals, const Buf& idx, const Buf& lse, int rows, int k, const Buf& fparams,
                       const Buf& iparams, const Buf& out) {
  const size_t rk = size_t(rows) * size_t(k), rp = size_t(rows) * kTopDrawFields;
  std::vector<float> v(rk), l(static_cast<size_t>(rows)), f(rp);
  std::vector<int32_t> ids(rk), p(rp), tok(static_cast<size_t>(rows));
  to_host(vals, rk, v.data());
  to_host(idx, rk, ids.data());
  to_host(lse, l.size(), l.data());
  to_host(fparams, rp, f.data());
  to_host(iparams, rp, p.data());
  TopCandidates cand;
  for (size_t r = 0; r < size_t(rows); ++r) {
    const TopDraw d = unpack_top_draw(f.data() + r * kTopDrawFields, p.data() + r * kTopDrawFields);
    tok[r] = g4::draw_top(v.data() + r * size_t(k), ids.data() + r * size_t(k), k, l[r], d, &cand);
  }
  from_host(tok.data(), tok.size(), out);
}

std::vector<int32_t> draw_top_arrays(Backend& be, const std::vector<float>& vals, const std::vector<int32_t>& ids,
                                     const std::vector<float>& lse, int k, const std::vector<float>& fparams,
                                     const std::vector<int32_t>& iparams) {
  const int rows = int(lse.size());
  const Buf v = be.alloc_f32(vals.size()), l = be.alloc_f32(lse.size()), f = be.alloc_f32(fparams.size());
  const Buf i = be.alloc_i32(ids.size()), p = be.alloc_i32(iparams.size()), o = be.alloc_i32(lse.size());
  be.from_host(vals.data(), vals.size(), v);
  be.from_host(lse.data(), lse.size(), l);
  be.from_host(fparams.data(), fparams.size(), f);
  be.from_host(ids.data(), ids.size(), i);
  be.from_host(iparams.data(), iparams.size(), p);
  be.draw_top(v, i, l, rows, k, f, p, o);
  std::vector<int32_t> out(lse.size());
  be.to_host(o, out.size(), out.data());
  for (const Buf& b : {v, l, f, i, p, o}) be.free(b);
  return out;
}

}  // namespace g4
