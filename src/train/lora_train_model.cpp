#include "train/lora_train_model.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "quant/matmul.h"
#include "train/dense_ops.h"

namespace g4::train {

int target_count(const Example& ex, int max_len) {
  const int L = std::min<int>(int(ex.tokens.size()), max_len);
  const int first = std::max(ex.offset, 1);
  return std::max(0, L - first);
}

// The cached activations of one adapted module call.
struct LoraTrainModel::LoraCall {
  std::vector<float> t;   // [T, rank] = xd · a
  std::vector<float> xd;  // [T, in] the dropped-out input (empty without dropout: the input itself)
};

// One layer's intermediates (see layer_forward for the order).
struct LoraTrainModel::Acts {
  std::vector<float> x;  // [T, d] input
  std::vector<float> xn, inv_in, q, inv_q, qr, k, inv_k, kr, v, inv_v, vn, probs, att, o, inv_o, x1;
  std::vector<float> xn2, inv_pre, g, u, act, f, inv_f, x2;
  std::vector<float> pl, pg, pact, pp, inv_pp, x3;
  LoraCall lq, lk, lv, lo, lgate, lup, ldown, lpg, lpp;
};

namespace {
std::vector<float>& sized(std::vector<float>& v, size_t n) {
  v.resize(n);
  return v;
}
// out = resid + rms_norm(y)·w (a post-norm and residual add), rows of width d; inv kept.
void add_normed(const std::vector<float>& resid, const std::vector<float>& y, int T, int d, const float* w,
                float eps, std::vector<float>& inv, std::vector<float>& out) {
  const size_t n = size_t(T) * size_t(d);
  sized(out, n);
  rms_norm_fwd(y.data(), T, d, w, eps, out.data(), sized(inv, size_t(T)).data());
  for (size_t i = 0; i < n; ++i) out[i] += resid[i];
}
}  // namespace

LoraTrainModel::LoraTrainModel(const Model& model, LoraParams& params)
    : cfg_(model.config()), w_(model.weights()), p_(params) {
  donor_.assign(cfg_.layers.size(), false);
  for (const LayerSpec& ls : cfg_.layers) {
    rope_.push_back(make_rope_table(ls.rope, ls.head_dim));
    if (ls.kv_source >= 0) donor_[size_t(ls.kv_source)] = true;
  }
}

void LoraTrainModel::lora_fwd(const LoraModule* m, const float* x, int T, bool train, uint64_t seed, LoraCall& c,
                              float* y) {
  if (!m) return;
  const float p = p_.config().dropout;
  const float* xin = x;
  c.xd.clear();
  if (train && p > 0.f) {  // nn.Dropout: keep with probability 1-p, scale kept values by 1/(1-p)
    std::mt19937_64 rng(seed ^ (uint64_t(m->layer) << 32) ^ std::hash<std::string>{}(m->module));
    std::bernoulli_distribution keep(1.0 - double(p));
    c.xd.resize(size_t(T) * m->in);
    const float s = 1.f / (1.f - p);
    for (size_t i = 0; i < c.xd.size(); ++i) c.xd[i] = keep(rng) ? x[i] * s : 0.f;
    xin = c.xd.data();
  }
  gemm_nn(xin, m->a.data(), sized(c.t, size_t(T) * m->rank).data(), T, m->in, m->rank, false);
  std::vector<float> z(size_t(T) * m->out);
  gemm_nn(c.t.data(), m->b.data(), z.data(), T, m->rank, m->out, false);
  const float s = p_.config().scale;
  for (size_t i = 0; i < z.size(); ++i) y[i] += s * z[i];
}

void LoraTrainModel::lora_bwd(LoraModule* m, const float* x, int T, const LoraCall& c, const float* dy, float* dx) {
  if (!m) return;
  const float s = p_.config().scale;
  const float* xin = c.xd.empty() ? x : c.xd.data();
  // z = t · b, y += s·z:  gb += s · tᵀ·dy;  dt = s · dy·bᵀ;  ga += xinᵀ·dt;  dx += dt·aᵀ (· dropout mask)
  std::vector<float> sdy(size_t(T) * m->out);
  for (size_t i = 0; i < sdy.size(); ++i) sdy[i] = s * dy[i];
  gemm_tn_acc(c.t.data(), sdy.data(), m->gb.data(), T, m->rank, m->out);
  std::vector<float> dt(size_t(T) * m->rank);
  gemm_nt(sdy.data(), m->b.data(), dt.data(), T, m->out, m->rank, false);
  gemm_tn_acc(xin, dt.data(), m->ga.data(), T, m->in, m->rank);
  if (!dx) return;
  std::vector<float> dxin(size_t(T) * m->in);
  gemm_nt(dt.data(), m->a.data(), dxin.data(), T, m->rank, m->in, false);
  const float keep = 1.f - p_.config().dropout;
  for (size_t i = 0; i < dxin.size(); ++i) {
    if (!c.xd.empty()) dxin[i] = c.xd[i] != 0.f ? dxin[i] / keep : 0.f;  // zero where dropped
    dx[i] += dxin[i];
  }
}

void LoraTrainModel::linear(const float* x, int T, const WeightView& W, const LoraModule* m, bool train,
                            uint64_t seed, LoraCall& c, std::vector<float>& y) {
  matmul_wt(x, T, W, y.data());
  lora_fwd(m, x, T, train, seed, c, y.data());
}

void LoraTrainModel::linear_bwd(const float* x, int T, const WeightView& W, LoraModule* m, const LoraCall& c,
                                const float* dy, float* dx) {
  lora_bwd(m, x, T, c, dy, dx);
  if (dx) matmul_w_acc(dy, T, W, dx);
}

void LoraTrainModel::rope_segments(float* x, int heads, int D, const RopeTable& t, bool backward) const {
  for (const Segment& s : segs_) {
    float* p = x + size_t(s.row0) * heads * D;
    if (backward) rope_bwd(p, s.n, heads, D, 0, t);
    else rope_fwd(p, s.n, heads, D, 0, t);
  }
}

void LoraTrainModel::set_segments(const std::vector<int>& lengths) {
  segs_.clear();
  probs_size_ = 0;
  int row = 0;
  for (int n : lengths) {
    segs_.push_back({row, n, probs_size_});
    row += n;
    probs_size_ += size_t(n) * size_t(n);
  }
}

void LoraTrainModel::embed(const int32_t* ids, int T, std::vector<float>& x, std::vector<float>& ple) {
  const int d = cfg_.hidden, N = cfg_.n_layers, Pw = cfg_.ple_width;
  x.resize(size_t(T) * d);
  const float es = float(std::sqrt(double(d)));
  for (int t = 0; t < T; ++t) {
    float* r = x.data() + size_t(t) * d;
    dequant_row(w_.embed, ids[t], r);
    for (int i = 0; i < d; ++i) r[i] *= es;
  }
  ple.clear();
  if (Pw == 0) return;
  // ((rmsnorm(h0 · Wmpᵀ · d^-½) + Eple[ids] · √Pw) · 2^-½, [T, N·Pw]
  const size_t np = size_t(N) * Pw;
  ple.resize(size_t(T) * np);
  matmul_wt(x.data(), T, w_.ple_model_proj, ple.data());
  const float ps = float(std::pow(double(d), -0.5));
  for (float& v : ple) v *= ps;
  std::vector<float> inv(size_t(T) * N);
  rms_norm_fwd(ple.data(), T * N, Pw, w_.ple_proj_norm.data, cfg_.rms_eps, ple.data(), inv.data());
  std::vector<float> row(np);
  const float es2 = float(std::sqrt(double(Pw))), half = float(std::pow(2.0, -0.5));
  for (int t = 0; t < T; ++t) {
    dequant_row(w_.embed_ple, ids[t], row.data());
    float* pr = ple.data() + size_t(t) * np;
    for (size_t i = 0; i < np; ++i) pr[i] = (pr[i] + row[i] * es2) * half;
  }
}

void LoraTrainModel::layer_forward(int l, int T, Acts& a, const std::vector<float>& ple, const float* kv_k,
                                   const float* kv_v, bool train, uint64_t seed, float* out) {
  const LayerSpec& ls = cfg_.layers[size_t(l)];
  const LayerWeights& lw = w_.layers[size_t(l)];
  const LayerModules& lm = p_.layer(l);
  const int d = cfg_.hidden, H = cfg_.n_heads, D = ls.head_dim, Hk = ls.n_kv_heads, I = ls.mlp_width;
  const bool own_kv = ls.kv_source < 0;
  const size_t Td = size_t(T) * d, Tq = size_t(T) * H * D, Tk = size_t(T) * Hk * D, TI = size_t(T) * I;
  const float eps = cfg_.rms_eps;

  // Attention (§2.4): q/k/v from the normed input; norms, RoPE; attention; o_proj, post-norm, residual.
  rms_norm_fwd(a.x.data(), T, d, lw.input_ln.data, eps, sized(a.xn, Td).data(), sized(a.inv_in, T).data());
  linear(a.xn.data(), T, lw.q, lm.q, train, seed, a.lq, sized(a.q, Tq));
  a.qr = a.q;
  if (cfg_.qk_norm)
    rms_norm_fwd(a.q.data(), T * H, D, lw.q_norm.data, eps, a.qr.data(), sized(a.inv_q, size_t(T) * H).data());
  rope_segments(a.qr.data(), H, D, rope_[size_t(l)], false);
  if (own_kv) {
    linear(a.xn.data(), T, lw.k, lm.k, train, seed, a.lk, sized(a.k, Tk));
    if (ls.k_eq_v) {
      a.v = a.k;  // V is the raw K projection (before k_norm)
    } else {
      linear(a.xn.data(), T, lw.v, lm.v, train, seed, a.lv, sized(a.v, Tk));
    }
    a.kr = a.k;
    if (cfg_.qk_norm)
      rms_norm_fwd(a.k.data(), T * Hk, D, lw.k_norm.data, eps, a.kr.data(), sized(a.inv_k, size_t(T) * Hk).data());
    rope_segments(a.kr.data(), Hk, D, rope_[size_t(l)], false);
    a.vn = a.v;
    if (cfg_.v_norm) rms_norm_fwd(a.v.data(), T * Hk, D, nullptr, eps, a.vn.data(), sized(a.inv_v, size_t(T) * Hk).data());
    kv_k = a.kr.data();
    kv_v = a.vn.data();
  }
  sized(a.probs, probs_size_ * H);
  sized(a.att, Tq);
  for (const Segment& s : segs_) {
    attention_fwd(a.qr.data() + size_t(s.row0) * H * D, kv_k + size_t(s.row0) * Hk * D,
                  kv_v + size_t(s.row0) * Hk * D, s.n, H, Hk, D, ls.window, cfg_.query_scale,
                  a.probs.data() + s.probs0 * H, a.att.data() + size_t(s.row0) * H * D);
  }
  linear(a.att.data(), T, lw.o, lm.o, train, seed, a.lo, sized(a.o, Td));
  add_normed(a.x, a.o, T, d, lw.post_attn_ln.data, eps, a.inv_o, a.x1);

  // Dense MLP (§2.7): gelu(gate) * up, down, post-norm, residual.
  rms_norm_fwd(a.x1.data(), T, d, lw.pre_ffw_ln.data, eps, sized(a.xn2, Td).data(), sized(a.inv_pre, T).data());
  linear(a.xn2.data(), T, lw.gate, lm.gate, train, seed, a.lgate, sized(a.g, TI));
  linear(a.xn2.data(), T, lw.up, lm.up, train, seed, a.lup, sized(a.u, TI));
  gelu_mul_fwd(a.g.data(), a.u.data(), TI, sized(a.act, TI).data());
  linear(a.act.data(), T, lw.down, lm.down, train, seed, a.ldown, sized(a.f, Td));
  add_normed(a.x1, a.f, T, d, lw.post_ffw_ln.data, eps, a.inv_f, a.x2);

  // Per-layer input (§2.9): x += rmsnorm(proj(gelu(gate(x)) * ple_l)).
  const float* xo = a.x2.data();
  const int Pw = cfg_.ple_width;
  if (Pw > 0) {
    const size_t TP = size_t(T) * Pw, np = size_t(cfg_.n_layers) * Pw;
    sized(a.pl, TP);
    for (int t = 0; t < T; ++t)
      std::copy_n(ple.data() + size_t(t) * np + size_t(l) * Pw, Pw, a.pl.data() + size_t(t) * Pw);
    linear(a.x2.data(), T, lw.ple_gate, lm.ple_gate, train, seed, a.lpg, sized(a.pg, TP));
    gelu_mul_fwd(a.pg.data(), a.pl.data(), TP, sized(a.pact, TP).data());
    linear(a.pact.data(), T, lw.ple_proj, lm.ple_proj, train, seed, a.lpp, sized(a.pp, Td));
    add_normed(a.x2, a.pp, T, d, lw.post_ple_ln.data, eps, a.inv_pp, a.x3);
    xo = a.x3.data();
  }
  for (size_t i = 0; i < Td; ++i) out[i] = xo[i] * lw.layer_scalar;
}

void LoraTrainModel::layer_backward(int l, int T, Acts& a, const float* kv_k, const float* kv_v,
                                    std::vector<float>& dx, float* dk_src, float* dv_src, const float* dk_own,
                                    const float* dv_own) {
  const LayerSpec& ls = cfg_.layers[size_t(l)];
  const LayerWeights& lw = w_.layers[size_t(l)];
  const LayerModules& lm = p_.layer(l);
  const int d = cfg_.hidden, H = cfg_.n_heads, D = ls.head_dim, Hk = ls.n_kv_heads, I = ls.mlp_width;
  const bool own_kv = ls.kv_source < 0;
  const bool need_dx = l > p_.first_layer();  // the lowest adapted layer's input gradient is unused
  const size_t Td = size_t(T) * d, Tq = size_t(T) * H * D, Tk = size_t(T) * Hk * D, TI = size_t(T) * I;

  for (size_t i = 0; i < Td; ++i) dx[i] *= lw.layer_scalar;  // d/d(x3) (or x2)

  // Per-layer input branch.
  const int Pw = cfg_.ple_width;
  if (Pw > 0) {
    const size_t TP = size_t(T) * Pw;
    std::vector<float> dpp(Td, 0.f), dpact(TP, 0.f), dpg(TP, 0.f), dpl(TP, 0.f);
    rms_norm_bwd(a.pp.data(), a.inv_pp.data(), T, d, lw.post_ple_ln.data, dx.data(), dpp.data());
    linear_bwd(a.pact.data(), T, lw.ple_proj, lm.ple_proj, a.lpp, dpp.data(), dpact.data());
    gelu_mul_bwd(a.pg.data(), a.pl.data(), dpact.data(), TP, dpg.data(), dpl.data());
    linear_bwd(a.x2.data(), T, lw.ple_gate, lm.ple_gate, a.lpg, dpg.data(), dx.data());  // dx now d/d(x2)
  }

  // MLP branch: x2 = x1 + rmsnorm(f).
  {
    std::vector<float> df(Td, 0.f), dact(TI, 0.f), dg(TI, 0.f), du(TI, 0.f), dxn2(Td, 0.f);
    rms_norm_bwd(a.f.data(), a.inv_f.data(), T, d, lw.post_ffw_ln.data, dx.data(), df.data());
    linear_bwd(a.act.data(), T, lw.down, lm.down, a.ldown, df.data(), dact.data());
    gelu_mul_bwd(a.g.data(), a.u.data(), dact.data(), TI, dg.data(), du.data());
    linear_bwd(a.xn2.data(), T, lw.gate, lm.gate, a.lgate, dg.data(), dxn2.data());
    linear_bwd(a.xn2.data(), T, lw.up, lm.up, a.lup, du.data(), dxn2.data());
    rms_norm_bwd(a.x1.data(), a.inv_pre.data(), T, d, lw.pre_ffw_ln.data, dxn2.data(), dx.data());  // d/d(x1)
  }

  // Attention branch: x1 = x + rmsnorm(o).
  std::vector<float> datt(Tq, 0.f), dqr(Tq, 0.f), dkr(Tk, 0.f), dvn(Tk, 0.f);
  {
    std::vector<float> dO(Td, 0.f);
    rms_norm_bwd(a.o.data(), a.inv_o.data(), T, d, lw.post_attn_ln.data, dx.data(), dO.data());
    linear_bwd(a.att.data(), T, lw.o, lm.o, a.lo, dO.data(), datt.data());
  }
  const float* keys = own_kv ? a.kr.data() : kv_k;
  const float* vals = own_kv ? a.vn.data() : kv_v;
  for (const Segment& s : segs_) {
    const size_t q0 = size_t(s.row0) * H * D, k0 = size_t(s.row0) * Hk * D;
    attention_bwd(a.qr.data() + q0, keys + k0, vals + k0, a.probs.data() + s.probs0 * H, datt.data() + q0, s.n, H,
                  Hk, D, ls.window, cfg_.query_scale, dqr.data() + q0, dkr.data() + k0, dvn.data() + k0);
  }
  if (!own_kv) {  // the donor's K/V: their gradients go to it
    if (dk_src)
      for (size_t i = 0; i < Tk; ++i) dk_src[i] += dkr[i];
    if (dv_src)
      for (size_t i = 0; i < Tk; ++i) dv_src[i] += dvn[i];
  } else if (dk_own) {  // KV-shared layers above read this layer's K/V
    for (size_t i = 0; i < Tk; ++i) dkr[i] += dk_own[i];
    for (size_t i = 0; i < Tk; ++i) dvn[i] += dv_own[i];
  }
  std::vector<float> dxn(Td, 0.f);
  {
    std::vector<float> dq(Tq, 0.f);
    rope_segments(dqr.data(), H, D, rope_[size_t(l)], true);
    if (cfg_.qk_norm) rms_norm_bwd(a.q.data(), a.inv_q.data(), T * H, D, lw.q_norm.data, dqr.data(), dq.data());
    else dq = dqr;
    linear_bwd(a.xn.data(), T, lw.q, lm.q, a.lq, dq.data(), need_dx ? dxn.data() : nullptr);
  }
  if (own_kv) {
    std::vector<float> dk(Tk, 0.f), dv(Tk, 0.f);
    rope_segments(dkr.data(), Hk, D, rope_[size_t(l)], true);
    if (cfg_.qk_norm) rms_norm_bwd(a.k.data(), a.inv_k.data(), T * Hk, D, lw.k_norm.data, dkr.data(), dk.data());
    else dk = dkr;
    if (cfg_.v_norm) rms_norm_bwd(a.v.data(), a.inv_v.data(), T * Hk, D, nullptr, dvn.data(), dv.data());
    else dv = dvn;
    if (ls.k_eq_v) {  // v is the raw k
      for (size_t i = 0; i < Tk; ++i) dk[i] += dv[i];
    } else {
      linear_bwd(a.xn.data(), T, lw.v, lm.v, a.lv, dv.data(), need_dx ? dxn.data() : nullptr);
    }
    linear_bwd(a.xn.data(), T, lw.k, lm.k, a.lk, dk.data(), need_dx ? dxn.data() : nullptr);
  }
  if (need_dx) rms_norm_bwd(a.x.data(), a.inv_in.data(), T, d, lw.input_ln.data, dxn.data(), dx.data());
}

void LoraTrainModel::forward_pass(const int32_t* ids, int T, int keep_from, bool train, uint64_t seed, Pass& ps,
                                  Acts& a) {
  const int N = cfg_.n_layers;
  embed(ids, T, a.x, ps.ple);
  ps.inputs.assign(size_t(N), {});
  ps.don_k.assign(size_t(N), {});
  ps.don_v.assign(size_t(N), {});
  std::vector<float> out(a.x.size());
  for (int l = 0; l < N; ++l) {
    if (l >= keep_from) ps.inputs[size_t(l)] = a.x;
    layer_forward(l, T, a, ps.ple, ps.donor_k(cfg_, l), ps.donor_v(cfg_, l), train, seed, out.data());
    if (donor_[size_t(l)]) {
      ps.don_k[size_t(l)] = a.kr;
      ps.don_v[size_t(l)] = a.vn;
    }
    a.x.swap(out);
  }
}

SeqLoss LoraTrainModel::run(const std::vector<const Example*>& batch, int max_len, float grad_weight,
                            uint64_t dropout_seed) {
  SeqLoss res;
  // Pack the sequences with targets into one set of rows: sequence s contributes L_s - 1 rows
  // (positions 0..L_s-2), row t predicting token t+1.
  std::vector<int32_t> ids, targets;
  std::vector<int> lengths;
  for (const Example* ex : batch) {
    const int L = std::min<int>(int(ex->tokens.size()), max_len);
    const int count = target_count(*ex, max_len);
    if (count == 0) continue;
    res.count += count;
    lengths.push_back(L - 1);
    for (int t = 0; t + 1 < L; ++t) {
      ids.push_back(ex->tokens[size_t(t)]);
      targets.push_back(t + 1 >= ex->offset ? ex->tokens[size_t(t) + 1] : -1);
    }
  }
  if (res.count == 0) return res;
  set_segments(lengths);
  const int T = int(ids.size()), d = cfg_.hidden, N = cfg_.n_layers;
  const size_t Td = size_t(T) * d;
  const bool train = grad_weight != 0.f;
  const int first = train ? p_.first_layer() : N;

  Pass ps;
  Acts a;
  forward_pass(ids.data(), T, first, train, dropout_seed, ps, a);
  std::vector<float> xf(Td), inv_f(static_cast<size_t>(T));
  rms_norm_fwd(a.x.data(), T, d, w_.final_norm.data, cfg_.rms_eps, xf.data(), inv_f.data());
  std::vector<float> dxf;
  if (train) dxf.assign(Td, 0.f);
  res.sum = lm_head_loss(xf.data(), T, w_.lm_head, cfg_.final_softcap, targets.data(), grad_weight,
                         train ? dxf.data() : nullptr);
  if (!train || first >= N) return res;

  // Backward, one recomputed layer at a time.
  std::vector<float> dx(Td, 0.f), out(Td);
  rms_norm_bwd(a.x.data(), inv_f.data(), T, d, w_.final_norm.data, dxf.data(), dx.data());
  std::vector<std::vector<float>> dk_acc(static_cast<size_t>(N)), dv_acc(static_cast<size_t>(N));
  Acts la;  // reused layer after layer: its buffers keep their capacity
  for (int l = N - 1; l >= first; --l) {
    const int src = cfg_.layers[size_t(l)].kv_source;
    la.x = std::move(ps.inputs[size_t(l)]);
    layer_forward(l, T, la, ps.ple, ps.donor_k(cfg_, l), ps.donor_v(cfg_, l), true, dropout_seed, out.data());
    float *dks = nullptr, *dvs = nullptr;
    if (src >= first) {  // the donor is adapted too: collect the gradient of its K/V
      const size_t Tk = size_t(T) * cfg_.layers[size_t(src)].n_kv_heads * cfg_.layers[size_t(src)].head_dim;
      if (dk_acc[size_t(src)].empty()) dk_acc[size_t(src)].assign(Tk, 0.f), dv_acc[size_t(src)].assign(Tk, 0.f);
      dks = dk_acc[size_t(src)].data();
      dvs = dv_acc[size_t(src)].data();
    }
    layer_backward(l, T, la, ps.donor_k(cfg_, l), ps.donor_v(cfg_, l), dx, dks, dvs,
                   dk_acc[size_t(l)].empty() ? nullptr : dk_acc[size_t(l)].data(),
                   dv_acc[size_t(l)].empty() ? nullptr : dv_acc[size_t(l)].data());
  }
  return res;
}

std::vector<float> LoraTrainModel::logits(const std::vector<int32_t>& tokens) {
  const int T = int(tokens.size()), d = cfg_.hidden, N = cfg_.n_layers;
  set_segments({T});
  Pass ps;
  Acts a;
  forward_pass(tokens.data(), T, N, false, 0, ps, a);
  std::vector<float> xf(size_t(T) * d), inv(static_cast<size_t>(T)), z(size_t(T) * cfg_.vocab);
  rms_norm_fwd(a.x.data(), T, d, w_.final_norm.data, cfg_.rms_eps, xf.data(), inv.data());
  matmul_wt(xf.data(), T, w_.lm_head, z.data());
  if (cfg_.final_softcap > 0)
    for (float& v : z) v = std::tanh(v / cfg_.final_softcap) * cfg_.final_softcap;
  return z;
}

}  // namespace g4::train
