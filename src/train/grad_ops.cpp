// GradBackend's ops (grad_backend.h): each computes its forward in f32 (train/dense_ops.h where
// the model's function has one) and records its backward: the gradient of what it wrote is taken
// (read and cleared), and its vector-Jacobian product added into the gradients of what it read.
// State a backward needs is saved only when the forward runs with keep (the recomputation).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "train/dense_ops.h"
#include "train/grad_backend.h"

namespace g4::train {
namespace {

using Floats = std::shared_ptr<AlignedVector<float>>;
Floats floats() { return std::make_shared<AlignedVector<float>>(); }
void keep_copy(const Floats& s, const float* p, size_t n) { s->assign(p, p + n); }
void drop(const Floats& s) { AlignedVector<float>().swap(*s); }
void add_into(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

void GradBackend::embed(const WeightView& E, const Buf& ids, int n, float scale, ActPrecision, const Buf& out) {
  const size_t m = size_t(n) * size_t(E.cols);
  exec({{region(ids, size_t(n))}, {region(out, m)},
        [this, E, ids, n, scale, out](bool) { HostBackend::embed(E, ids, n, scale, ActPrecision::F32, out); },
        [this, out, m] { take_grad(out, m); }});  // the embeddings are not trained
}

void GradBackend::matmul(const Buf& x, int M, const WeightView& W, ActPrecision, const Buf& y) {
  const auto p = params_.find(W.data);
  float* gW = p == params_.end() ? nullptr : p->second;
  if (gW && armed_ && !recording_) start_recording();
  const size_t nx = size_t(M) * size_t(W.cols), ny = size_t(M) * size_t(W.rows);
  Floats xs = floats();
  exec({{region(x, nx)}, {region(y, ny)},
        [=, this](bool keep) {
          if (keep && gW) keep_copy(xs, x.f32(), nx);
          matmul_wt(x.f32(), M, W, y.f32());
        },
        [=, this] {
          const AlignedVector<float> dy = take_grad(y, ny);
          if (!dy.empty()) {
            if (float* dx = grad(x, true)) matmul_w_acc(dy.data(), M, W, dx);
            if (gW) gemm_tn_acc(dy.data(), xs->data(), gW, M, int(W.rows), int(W.cols));
          }
          drop(xs);
        }});
}

void GradBackend::rms_norm(const Buf& x, int rows, int dim, const float* w, float eps, ActPrecision, const Buf& y) {
  const size_t n = size_t(rows) * size_t(dim);
  Floats xs = floats(), inv = floats();  // kept: the input and its rows' 1 / rms
  exec({{region(x, n)}, {region(y, n)},
        [=, this](bool keep) {
          if (keep) keep_copy(xs, x.f32(), n);
          inv->resize(size_t(rows));
          rms_norm_fwd(x.f32(), rows, dim, w, eps, y.f32(), inv->data());
          if (!keep) drop(inv);
        },
        [=, this] {
          const AlignedVector<float> dy = take_grad(y, n);
          if (!dy.empty())
            if (float* dx = grad(x, true)) rms_norm_bwd(xs->data(), inv->data(), rows, dim, w, dy.data(), dx);
          drop(xs);
          drop(inv);
        }});
}

void GradBackend::rope(const Buf& x, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision) {
  const size_t n = size_t(rows) * size_t(heads) * size_t(head_dim);
  const RopeTable* tab = &t;  // the model's, alive for the model's life
  exec({{region(x, n)}, {region(x, n)},
        [=, this](bool) { rope_fwd(x.f32(), rows, heads, head_dim, pos0, *tab); },
        [=, this] {
          if (float* g = grad(x, false)) rope_bwd(g, rows, heads, head_dim, pos0, *tab);
        }});
}

void GradBackend::kv_write(const AttnSeq& s, const Buf& k, const Buf& v) {
  G4_CHECK(!s.kv.quantized() && !s.kv.paged() && "GradBackend: f32 per-sequence KV caches only");
  const size_t row = s.kv.row_floats(), n = size_t(s.n) * row;
  Op op{{region(k.at(int64_t(s.row0) * int64_t(row)), n), region(v.at(int64_t(s.row0) * int64_t(row)), n)},
        cache_rows(s.kv, false, s.pos0, s.n),
        [this, s, k, v](bool) { HostBackend::kv_write(s, k, v); },
        [this, s, k, v, row] {
          for (int t = 0; t < s.n; ++t) {
            const int64_t slot = kv_slot(s.kv, s.pos0 + t), at = int64_t(s.row0 + t) * int64_t(row);
            for (const auto& [cache, src] : {std::pair{s.kv.k, k}, std::pair{s.kv.v, v}}) {
              const AlignedVector<float> g = take_grad(cache.at(slot * int64_t(row)), row);
              if (!g.empty())
                if (float* d = grad(src.at(at), true)) add_into(d, g.data(), row);
            }
          }
        }};
  for (const Region& r : cache_rows(s.kv, true, s.pos0, s.n)) op.writes.push_back(r);
  exec(std::move(op));
}

void GradBackend::attention(const Buf& q, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                            const Buf& out) {
  bool plain = true;  // every sequence from position 0: the training form
  int rows = 0;
  for (const AttnSeq& s : seqs) {
    plain = plain && s.pos0 == 0 && !s.blocks && !s.kv.quantized() && !s.kv.paged();
    rows = std::max(rows, s.row0 + s.n);
  }
  if (!plain) {
    G4_CHECK(!recording_ && "GradBackend: a recorded attention starts each sequence at position 0");
    return HostBackend::attention(q, H, seqs, scale, P, out);
  }
  const int D = seqs.empty() ? 0 : seqs[0].kv.head_dim;
  const size_t qn = size_t(rows) * size_t(H) * size_t(D);
  Op op{{region(q, qn)}, {region(out, qn)}, nullptr, nullptr};
  for (const AttnSeq& s : seqs)
    for (bool value : {false, true})
      for (const Region& r : cache_rows(s.kv, value, 0, s.n)) op.reads.push_back(r);
  // Per sequence: its keys and values gathered [n, Hk, D], and (kept) its attention weights.
  struct Kept {
    AlignedVector<float> q, k, v, probs;
  };
  auto kept = std::make_shared<std::vector<Kept>>(seqs.size());
  auto gather = [](const AttnSeq& s, bool value, AlignedVector<float>& dst) {
    const size_t row = s.kv.row_floats();
    dst.resize(size_t(s.n) * row);
    const float* base = (value ? s.kv.v : s.kv.k).f32();
    for (int t = 0; t < s.n; ++t) std::memcpy(dst.data() + size_t(t) * row, base + kv_slot(s.kv, t) * row, row * 4);
  };
  op.fwd = [=, this](bool keep) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      const AttnSeq& s = seqs[i];
      Kept& kp = (*kept)[i];
      AlignedVector<float> probs;
      gather(s, false, kp.k);
      gather(s, true, kp.v);
      probs.resize(size_t(H) * size_t(s.n) * size_t(s.n));
      const size_t q0 = size_t(s.row0) * size_t(H) * size_t(D);
      attention_fwd(q.f32() + q0, kp.k.data(), kp.v.data(), s.n, H, s.kv.n_kv_heads, D, s.kv.window, scale,
                    probs.data(), out.f32() + q0);
      if (keep) {
        kp.q.assign(q.f32() + q0, q.f32() + q0 + size_t(s.n) * H * D);
        kp.probs = std::move(probs);
      } else {
        kp = Kept{};
      }
    }
  };
  op.bwd = [=, this] {
    const AlignedVector<float> dout = take_grad(out, qn);
    for (size_t i = 0; i < seqs.size() && !dout.empty(); ++i) {
      const AttnSeq& s = seqs[i];
      const Kept& kp = (*kept)[i];
      const size_t row = s.kv.row_floats(), q0 = size_t(s.row0) * size_t(H) * size_t(D);
      AlignedVector<float> dq(size_t(s.n) * H * D, 0.f), dk(size_t(s.n) * row, 0.f), dv(dk.size(), 0.f);
      attention_bwd(kp.q.data(), kp.k.data(), kp.v.data(), kp.probs.data(), dout.data() + q0, s.n, H,
                    s.kv.n_kv_heads, D, s.kv.window, scale, dq.data(), dk.data(), dv.data());
      if (float* g = grad(q.at(int64_t(q0)), true)) add_into(g, dq.data(), dq.size());
      for (int t = 0; t < s.n; ++t) {
        const int64_t at = kv_slot(s.kv, t) * int64_t(row);
        if (float* g = grad(s.kv.k.at(at), true)) add_into(g, dk.data() + size_t(t) * row, row);
        if (float* g = grad(s.kv.v.at(at), true)) add_into(g, dv.data() + size_t(t) * row, row);
      }
    }
    for (Kept& kp : *kept) kp = Kept{};
  };
  exec(std::move(op));
}

void GradBackend::gelu_mul(const Buf& gate, const Buf& up, size_t n, ActPrecision, const Buf& out) {
  Floats gs = floats(), us = floats();
  exec({{region(gate, n), region(up, n)}, {region(out, n)},
        [=, this](bool keep) {
          if (keep) keep_copy(gs, gate.f32(), n), keep_copy(us, up.f32(), n);
          gelu_mul_fwd(gate.f32(), up.f32(), n, out.f32());
        },
        [=, this] {
          const AlignedVector<float> dy = take_grad(out, n);
          if (!dy.empty()) {
            AlignedVector<float> dg(n, 0.f), du(n, 0.f);
            gelu_mul_bwd(gs->data(), us->data(), dy.data(), n, dg.data(), du.data());
            if (float* g = grad(gate, true)) add_into(g, dg.data(), n);
            if (float* g = grad(up, true)) add_into(g, du.data(), n);
          }
          drop(gs);
          drop(us);
        }});
}

void GradBackend::gelu_mul_ggml(const Buf& gate, const Buf& up, size_t n, const Buf& out) {
  gelu_mul(gate, up, n, ActPrecision::F32, out);
}

void GradBackend::add(const Buf& a, const Buf& b, size_t n, ActPrecision, const Buf& y) {
  exec({{region(a, n), region(b, n)}, {region(y, n)},
        [=, this](bool) {
          for (size_t i = 0; i < n; ++i) y.f32()[i] = a.f32()[i] + b.f32()[i];
        },
        [=, this] {
          const AlignedVector<float> dy = take_grad(y, n);
          if (dy.empty()) return;
          if (float* g = grad(a, true)) add_into(g, dy.data(), n);
          if (float* g = grad(b, true)) add_into(g, dy.data(), n);
        }});
}

void GradBackend::scale(const Buf& a, float s, size_t n, ActPrecision, const Buf& y) {
  exec({{region(a, n)}, {region(y, n)},
        [=, this](bool) {
          for (size_t i = 0; i < n; ++i) y.f32()[i] = a.f32()[i] * s;
        },
        [=, this] {
          const AlignedVector<float> dy = take_grad(y, n);
          if (dy.empty()) return;
          if (float* g = grad(a, true))
            for (size_t i = 0; i < n; ++i) g[i] += s * dy[i];
        }});
}

void GradBackend::softcap(const Buf& x, size_t n, float cap, ActPrecision) {
  Floats xs = floats();
  exec({{region(x, n)}, {region(x, n)},
        [=, this](bool keep) {
          if (keep) keep_copy(xs, x.f32(), n);
          for (size_t i = 0; i < n; ++i) x.f32()[i] = std::tanh(x.f32()[i] / cap) * cap;
        },
        [=, this] {
          if (float* g = grad(x, false))
            for (size_t i = 0; i < n; ++i) {
              const float t = std::tanh((*xs)[i] / cap);
              g[i] *= 1.f - t * t;
            }
          drop(xs);
        }});
}

void GradBackend::gather_rows(const Buf& src, const Buf& idx, int n, int dim, const Buf& dst) {
  int rows = 0;  // the source rows read (for the checkpoint's inputs)
  for (int i = 0; i < n; ++i) rows = std::max(rows, idx.i32()[i] + 1);
  auto is = std::make_shared<std::vector<int32_t>>();
  const size_t m = size_t(n) * size_t(dim);
  exec({{region(idx, size_t(n)), region(src, size_t(rows) * size_t(dim))}, {region(dst, m)},
        [=, this](bool keep) {
          if (keep) is->assign(idx.i32(), idx.i32() + n);
          HostBackend::gather_rows(src, idx, n, dim, dst);
        },
        [=, this] {
          const AlignedVector<float> dy = take_grad(dst, m);
          float* g = dy.empty() ? nullptr : grad(src, true);
          for (int i = 0; g && i < n; ++i)
            add_into(g + size_t((*is)[size_t(i)]) * dim, dy.data() + size_t(i) * dim, size_t(dim));
          std::vector<int32_t>().swap(*is);
        }});
}

void GradBackend::copy_cols(const Buf& src, int rows, int src_dim, int off, int n, const Buf& dst) {
  const size_t m = size_t(rows) * size_t(n);
  exec({{region(src, size_t(rows) * size_t(src_dim))}, {region(dst, m)},
        [=, this](bool) { HostBackend::copy_cols(src, rows, src_dim, off, n, dst); },
        [=, this] {
          const AlignedVector<float> dy = take_grad(dst, m);
          float* g = dy.empty() ? nullptr : grad(src, true);
          for (int r = 0; g && r < rows; ++r)
            add_into(g + size_t(r) * src_dim + off, dy.data() + size_t(r) * n, size_t(n));
        }});
}

void GradBackend::dropout(const Buf& x, size_t n, float p, uint64_t seed, const Buf& y) {
  const float s = 1.f / (1.f - p);
  exec({{region(x, n)}, {region(y, n)},
        [=, this](bool) {
          for (size_t i = 0; i < n; ++i) y.f32()[i] = dropout_keeps(seed, i, p) ? x.f32()[i] * s : 0.f;
        },
        [=, this] {
          const AlignedVector<float> dy = take_grad(y, n);
          float* g = dy.empty() ? nullptr : grad(x, true);
          for (size_t i = 0; g && i < n; ++i)
            if (dropout_keeps(seed, i, p)) g[i] += dy[i] * s;
        }});
}

void GradBackend::router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision,
                              const Buf& idx, const Buf& weights) {
  const size_t ns = size_t(rows) * size_t(E), nk = size_t(rows) * size_t(k);
  Floats ss = floats();
  auto is = std::make_shared<std::vector<int32_t>>();
  exec({{region(scores, ns)}, {region(idx, nk), region(weights, nk)},
        [=, this](bool keep) {
          HostBackend::router_topk(scores, rows, E, k, per_expert_scale, ActPrecision::F32, idx, weights);
          if (keep) keep_copy(ss, scores.f32(), ns), is->assign(idx.i32(), idx.i32() + nk);
        },
        [=, this] {
          // w_j = p_j · scale[e_j], p = softmax of the selected scores: ds[e_j] += p_j (dp_j - Σ p_i dp_i).
          const AlignedVector<float> dw = take_grad(weights, nk);
          float* g = dw.empty() ? nullptr : grad(scores, true);
          AlignedVector<float> pr(static_cast<size_t>(k)), dp(static_cast<size_t>(k));
          for (int r = 0; g && r < rows; ++r) {
            const float* s = ss->data() + size_t(r) * E;
            const int32_t* e = is->data() + size_t(r) * k;
            float mx = -INFINITY, sum = 0.f, dot = 0.f;
            for (int j = 0; j < k; ++j) mx = std::max(mx, s[e[j]]);
            for (int j = 0; j < k; ++j) sum += (pr[size_t(j)] = std::exp(s[e[j]] - mx));
            for (int j = 0; j < k; ++j) {
              pr[size_t(j)] /= sum;
              dp[size_t(j)] = dw[size_t(r) * k + j] * per_expert_scale[e[j]];
              dot += pr[size_t(j)] * dp[size_t(j)];
            }
            for (int j = 0; j < k; ++j) g[size_t(r) * E + e[j]] += pr[size_t(j)] * (dp[size_t(j)] - dot);
          }
          drop(ss);
          std::vector<int32_t>().swap(*is);
        }});
}

void GradBackend::moe_experts(const Buf& x, int rows, int d, const Buf& idx, const Buf& w, int k,
                              const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision,
                              const Buf& out) {
  const size_t nx = size_t(rows) * size_t(d), nk = size_t(rows) * size_t(k);
  const ExpertStack G = gate, U = up, Dn = down;  // views of the model's weights, alive for its life
  Floats xs = floats(), ws = floats();
  auto is = std::make_shared<std::vector<int32_t>>();
  // The (row, slot) pairs routed to each expert, in row order.
  auto routed = [=](const int32_t* ix) {
    std::vector<std::vector<int>> by(size_t(G.count));
    for (size_t i = 0; i < nk; ++i) by[size_t(ix[i])].push_back(int(i));
    return by;
  };
  // One expert's rows: X [m, d] gathered, gate / up products, h = gelu(g)·u, y = down(h).
  struct Pass {
    AlignedVector<float> X, g, u, h, y;
  };
  auto expert_pass = [=](int e, const std::vector<int>& slots, const float* xp, Pass& p) {
    const int m = int(slots.size());
    const int64_t I = G.rows();
    p.X.resize(size_t(m) * d);
    for (int i = 0; i < m; ++i)
      std::memcpy(p.X.data() + size_t(i) * d, xp + size_t(slots[size_t(i)] / k) * d, size_t(d) * 4);
    p.g.resize(size_t(m) * I), p.u.resize(p.g.size()), p.h.resize(p.g.size()), p.y.resize(size_t(m) * d);
    matmul_wt(p.X.data(), m, G.expert(e), p.g.data());
    matmul_wt(p.X.data(), m, U.expert(e), p.u.data());
    gelu_mul_fwd(p.g.data(), p.u.data(), p.h.size(), p.h.data());
    matmul_wt(p.h.data(), m, Dn.expert(e), p.y.data());
  };
  exec({{region(x, nx), region(idx, nk), region(w, nk)}, {region(out, nx)},
        [=, this](bool keep) {
          if (keep) keep_copy(xs, x.f32(), nx), keep_copy(ws, w.f32(), nk), is->assign(idx.i32(), idx.i32() + nk);
          std::fill_n(out.f32(), nx, 0.f);
          const auto by = routed(idx.i32());
          Pass p;
          for (size_t e = 0; e < by.size(); ++e) {
            if (by[e].empty() || !G.holds(int(e))) continue;
            expert_pass(int(e), by[e], x.f32(), p);
            for (size_t i = 0; i < by[e].size(); ++i) {
              const int slot = by[e][i];
              const float wt = w.f32()[slot];
              float* o = out.f32() + size_t(slot / k) * d;
              for (int c = 0; c < d; ++c) o[c] += wt * p.y[i * size_t(d) + size_t(c)];
            }
          }
        },
        [=, this] {
          const AlignedVector<float> dout = take_grad(out, nx);
          if (!dout.empty()) {
            float* dx = grad(x, true);
            float* dw = grad(w, true);
            const auto by = routed(is->data());
            Pass p;
            for (size_t e = 0; e < by.size(); ++e) {
              if (by[e].empty() || !G.holds(int(e))) continue;
              expert_pass(int(e), by[e], xs->data(), p);
              const int m = int(by[e].size());
              AlignedVector<float> dy(size_t(m) * d), dh(p.h.size(), 0.f), dg(p.h.size(), 0.f), du(p.h.size(), 0.f),
                  dX(size_t(m) * d, 0.f);
              for (int i = 0; i < m; ++i) {
                const int slot = by[e][size_t(i)];
                const float* go = dout.data() + size_t(slot / k) * d;
                float dot = 0.f;
                for (int c = 0; c < d; ++c) {
                  dot += go[c] * p.y[size_t(i) * d + c];
                  dy[size_t(i) * d + c] = (*ws)[size_t(slot)] * go[c];
                }
                if (dw) dw[slot] += dot;
              }
              matmul_w_acc(dy.data(), m, Dn.expert(int(e)), dh.data());
              gelu_mul_bwd(p.g.data(), p.u.data(), dh.data(), dh.size(), dg.data(), du.data());
              matmul_w_acc(dg.data(), m, G.expert(int(e)), dX.data());
              matmul_w_acc(du.data(), m, U.expert(int(e)), dX.data());
              for (int i = 0; dx && i < m; ++i)
                add_into(dx + size_t(by[e][size_t(i)] / k) * d, dX.data() + size_t(i) * d, size_t(d));
            }
          }
          drop(xs);
          drop(ws);
          std::vector<int32_t>().swap(*is);
        }});
}

}  // namespace g4::train
