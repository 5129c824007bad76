// GradBackend's ops (grad_backend.h): each computes its forward in f32 (the arith's, grad_arith.h,
// where the model's function has one; the base backend's otherwise) and records its backward: the
// gradient of what it wrote is taken (read and cleared), and its vector-Jacobian product added
// into the gradients of what it read. State a backward needs is kept only when the forward runs
// with keep (the recomputation).
#include <algorithm>
#include <memory>

#include "train/grad_backend.h"

namespace g4::train {

void GradBackend::embed(const WeightView& E, const Buf& ids, int n, float scale, ActPrecision, const Buf& out) {
  const size_t m = size_t(n) * size_t(E.cols);
  exec({{region(ids, size_t(n))}, {region(out, m)},
        [this, E, ids, n, scale, out](bool) { base_.embed(E, ids, n, scale, ActPrecision::F32, out); },
        [this, out, m] { take_grad(out, m); }});  // the embeddings are not trained
}

void GradBackend::matmul(const Buf& x, int M, const WeightView& W, ActPrecision, const Buf& y) {
  const auto p = params_.find(W.data);
  float* gW = p == params_.end() ? nullptr : p->second;
  if (gW && armed_ && !recording_) start_recording();
  const size_t nx = size_t(M) * size_t(W.cols), ny = size_t(M) * size_t(W.rows);
  Kept xs = kept();
  exec({{region(x, nx)}, {region(y, ny)},
        [=, this](bool keeping) {
          if (keeping && gW) keep(xs, x.f32(), nx);
          arith_.matmul_wt(x.f32(), M, W, y.f32());
        },
        [=, this] {
          const ArithBlock dy = take_grad(y, ny);
          if (!dy.empty()) {
            if (float* dx = grad(x, true)) arith_.matmul_w_acc(dy.f32(), M, W, dx);
            if (gW) arith_.gemm_tn_acc(dy.f32(), xs->f32(), gW, M, int(W.rows), int(W.cols));
          }
          xs->reset();
        }});
}

void GradBackend::lora_delta(const Buf& x, int M, const LoraDelta& d, const Buf& t, const Buf& z, const Buf& y,
                             ActPrecision P) {
  const auto pa = params_.find(d.a.data), pb = params_.find(d.b.data);
  if (pa == params_.end() || pb == params_.end()) return Backend::lora_delta(x, M, d, t, z, y, P);
  float *gA = pa->second, *gB = pb->second;
  if (armed_ && !recording_) start_recording();
  const size_t nx = size_t(M) * size_t(d.a.cols), ny = size_t(M) * size_t(d.b.rows), nt = size_t(M) * size_t(d.a.rows);
  const WeightView A = d.a, B = d.b;
  const float s = d.scale;
  Kept xs = kept(), ts = kept();  // kept: the input and x·Aᵀ
  exec({{region(x, nx), region(y, ny)}, {region(y, ny)},
        [=, this](bool keeping) {
          ArithBlock tb(arith_, nt * 4, false);
          arith_.lora_fwd(x.f32(), M, A, B, s, tb.f32(), y.f32());
          if (keeping) keep(xs, x.f32(), nx), *ts = std::move(tb);
        },
        [=, this] {
          // y's gradient passes to the y it added into unchanged (read, not taken).
          if (const float* dy = grad(y, false))
            arith_.lora_bwd(xs->f32(), ts->f32(), dy, M, A, B, s, gA, gB, grad(x, true));
          xs->reset();
          ts->reset();
        }});
}

void GradBackend::rms_norm(const Buf& x, int rows, int dim, const float* w, float eps, ActPrecision, const Buf& y) {
  const size_t n = size_t(rows) * size_t(dim);
  Kept xs = kept(), inv = kept();  // kept: the input and its rows' 1 / rms
  exec({{region(x, n)}, {region(y, n)},
        [=, this](bool keeping) {
          if (keeping) keep(xs, x.f32(), n);
          *inv = zeros(size_t(rows));
          arith_.rms_norm_fwd(x.f32(), rows, dim, w, eps, y.f32(), inv->f32());
          if (!keeping) inv->reset();
        },
        [=, this] {
          const ArithBlock dy = take_grad(y, n);
          if (!dy.empty())
            if (float* dx = grad(x, true)) arith_.rms_norm_bwd(xs->f32(), inv->f32(), rows, dim, w, dy.f32(), dx);
          xs->reset();
          inv->reset();
        }});
}

void GradBackend::rope(const Buf& x, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision) {
  const size_t n = size_t(rows) * size_t(heads) * size_t(head_dim);
  const RopeTable* tab = &t;  // the model's, alive for the model's life
  exec({{region(x, n)}, {region(x, n)},
        [=, this](bool) { arith_.rope_fwd(x.f32(), rows, heads, head_dim, pos0, *tab); },
        [=, this] {
          if (float* g = grad(x, false)) arith_.rope_bwd(g, rows, heads, head_dim, pos0, *tab);
        }});
}

void GradBackend::kv_write(const AttnSeq& s, const Buf& k, const Buf& v) {
  G4_CHECK(!s.kv.quantized() && !s.kv.paged() && "GradBackend: f32 per-sequence KV caches only");
  const size_t row = s.kv.row_floats(), n = size_t(s.n) * row;
  Op op{{region(k.at(int64_t(s.row0) * int64_t(row)), n), region(v.at(int64_t(s.row0) * int64_t(row)), n)},
        cache_rows(s.kv, false, s.pos0, s.n),
        [this, s, k, v](bool) { base_.kv_write(s, k, v); },
        [this, s, k, v, row, n] {
          const std::vector<int64_t> slots = cache_slots(s.kv, s.pos0, s.n);
          const int64_t at = int64_t(s.row0) * int64_t(row);
          for (const auto& [cache, src] : {std::pair{s.kv.k, k}, std::pair{s.kv.v, v}}) {
            float* g = grad(cache, false);
            if (!g) continue;
            float* d = grad(src.at(at), true);
            ArithBlock sink = d ? ArithBlock() : zeros(n);  // the rows' gradient is taken either way
            arith_.take_rows_acc(g, slots, row, d ? d : sink.f32());
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
    return base_.attention(q, H, seqs, scale, P, out);
  }
  const int D = seqs.empty() ? 0 : seqs[0].kv.head_dim;
  const size_t qn = size_t(rows) * size_t(H) * size_t(D);
  Op op{{region(q, qn)}, {region(out, qn)}, nullptr, nullptr};
  for (const AttnSeq& s : seqs)
    for (bool value : {false, true})
      for (const Region& r : cache_rows(s.kv, value, 0, s.n)) op.reads.push_back(r);
  // Per sequence: its keys and values gathered [n, Hk, D], and (kept) its queries and attention
  // weights.
  struct SeqKept {
    ArithBlock q, k, v, probs;
  };
  auto kept_seqs = std::make_shared<std::vector<SeqKept>>(seqs.size());
  op.fwd = [=, this](bool keeping) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      const AttnSeq& s = seqs[i];
      SeqKept& kp = (*kept_seqs)[i];
      const size_t row = s.kv.row_floats(), nq = size_t(s.n) * size_t(H) * size_t(D);
      const std::vector<int64_t> slots = cache_slots(s.kv, 0, s.n);
      kp.k = ArithBlock(arith_, size_t(s.n) * row * 4, false);
      kp.v = ArithBlock(arith_, size_t(s.n) * row * 4, false);
      arith_.gather_rows(s.kv.k.f32(), slots, row, kp.k.f32());
      arith_.gather_rows(s.kv.v.f32(), slots, row, kp.v.f32());
      ArithBlock probs(arith_, size_t(H) * size_t(s.n) * size_t(s.n) * 4, false);
      const size_t q0 = size_t(s.row0) * size_t(H) * size_t(D);
      arith_.attention_fwd(q.f32() + q0, kp.k.f32(), kp.v.f32(), s.n, H, s.kv.n_kv_heads, D, s.kv.window, scale,
                           probs.f32(), out.f32() + q0);
      if (keeping) {
        kp.q = ArithBlock(arith_, nq * 4, false);
        arith_.copy(kp.q.data(), q.f32() + q0, nq * 4);
        kp.probs = std::move(probs);
      } else {
        kp = SeqKept{};
      }
    }
  };
  op.bwd = [=, this] {
    const ArithBlock dout = take_grad(out, qn);
    for (size_t i = 0; i < seqs.size() && !dout.empty(); ++i) {
      const AttnSeq& s = seqs[i];
      const SeqKept& kp = (*kept_seqs)[i];
      const size_t row = s.kv.row_floats(), q0 = size_t(s.row0) * size_t(H) * size_t(D),
                   nq = size_t(s.n) * size_t(H) * size_t(D);
      const ArithBlock dq = zeros(nq), dk = zeros(size_t(s.n) * row), dv = zeros(size_t(s.n) * row);
      arith_.attention_bwd(kp.q.f32(), kp.k.f32(), kp.v.f32(), kp.probs.f32(), dout.f32() + q0, s.n, H,
                           s.kv.n_kv_heads, D, s.kv.window, scale, dq.f32(), dk.f32(), dv.f32());
      if (float* g = grad(q.at(int64_t(q0)), true)) arith_.axpy_acc(1.f, dq.f32(), nq, g);
      const std::vector<int64_t> slots = cache_slots(s.kv, 0, s.n);
      if (float* g = grad(s.kv.k, true)) arith_.scatter_rows_acc(dk.f32(), slots, row, g);
      if (float* g = grad(s.kv.v, true)) arith_.scatter_rows_acc(dv.f32(), slots, row, g);
    }
    for (SeqKept& kp : *kept_seqs) kp = SeqKept{};
  };
  exec(std::move(op));
}

void GradBackend::gelu_mul(const Buf& gate, const Buf& up, size_t n, ActPrecision, const Buf& out) {
  Kept gs = kept(), us = kept();
  exec({{region(gate, n), region(up, n)}, {region(out, n)},
        [=, this](bool keeping) {
          if (keeping) keep(gs, gate.f32(), n), keep(us, up.f32(), n);
          arith_.gelu_mul_fwd(gate.f32(), up.f32(), n, out.f32());
        },
        [=, this] {
          const ArithBlock dy = take_grad(out, n);
          if (!dy.empty()) {
            // Into the inputs' gradients directly where both have one (a sink otherwise).
            float *dg = grad(gate, true), *du = grad(up, true);
            const ArithBlock sink = dg && du ? ArithBlock() : zeros(n);
            arith_.gelu_mul_bwd(gs->f32(), us->f32(), dy.f32(), n, dg ? dg : sink.f32(), du ? du : sink.f32());
          }
          gs->reset();
          us->reset();
        }});
}

void GradBackend::gelu_mul_ggml(const Buf& gate, const Buf& up, size_t n, const Buf& out) {
  gelu_mul(gate, up, n, ActPrecision::F32, out);
}

void GradBackend::add(const Buf& a, const Buf& b, size_t n, ActPrecision, const Buf& y) {
  exec({{region(a, n), region(b, n)}, {region(y, n)},
        [=, this](bool) { arith_.add(a.f32(), b.f32(), n, y.f32()); },
        [=, this] {
          const ArithBlock dy = take_grad(y, n);
          if (dy.empty()) return;
          if (float* g = grad(a, true)) arith_.axpy_acc(1.f, dy.f32(), n, g);
          if (float* g = grad(b, true)) arith_.axpy_acc(1.f, dy.f32(), n, g);
        }});
}

void GradBackend::scale(const Buf& a, float s, size_t n, ActPrecision, const Buf& y) {
  exec({{region(a, n)}, {region(y, n)},
        [=, this](bool) { arith_.scale(a.f32(), s, n, y.f32()); },
        [=, this] {
          const ArithBlock dy = take_grad(y, n);
          if (dy.empty()) return;
          if (float* g = grad(a, true)) arith_.axpy_acc(s, dy.f32(), n, g);
        }});
}

void GradBackend::softcap(const Buf& x, size_t n, float cap, ActPrecision) {
  Kept xs = kept();
  exec({{region(x, n)}, {region(x, n)},
        [=, this](bool keeping) {
          if (keeping) keep(xs, x.f32(), n);
          arith_.softcap_fwd(x.f32(), n, cap);
        },
        [=, this] {
          if (float* g = grad(x, false)) arith_.softcap_bwd(xs->f32(), n, cap, g);
          xs->reset();
        }});
}

void GradBackend::gather_rows(const Buf& src, const Buf& idx, int n, int dim, const Buf& dst) {
  auto rows_of = [this, idx, n] {  // the source rows read, from the index list
    const std::vector<int32_t> ids = arith_.read_i32(idx.i32(), size_t(n));
    return std::vector<int64_t>(ids.begin(), ids.end());
  };
  int64_t rows = 0;  // how many source rows are read (for the checkpoint's inputs)
  if (recording_)
    for (int64_t r : rows_of()) rows = std::max(rows, r + 1);
  auto is = std::make_shared<std::vector<int64_t>>();
  const size_t m = size_t(n) * size_t(dim);
  exec({{region(idx, size_t(n)), region(src, size_t(rows) * size_t(dim))}, {region(dst, m)},
        [=, this](bool keeping) {
          if (keeping) *is = rows_of();
          base_.gather_rows(src, idx, n, dim, dst);
        },
        [=, this] {
          const ArithBlock dy = take_grad(dst, m);
          if (float* g = dy.empty() ? nullptr : grad(src, true)) arith_.scatter_rows_acc(dy.f32(), *is, size_t(dim), g);
          std::vector<int64_t>().swap(*is);
        }});
}

void GradBackend::copy_cols(const Buf& src, int rows, int src_dim, int off, int n, const Buf& dst) {
  const size_t m = size_t(rows) * size_t(n);
  exec({{region(src, size_t(rows) * size_t(src_dim))}, {region(dst, m)},
        [=, this](bool) { base_.copy_cols(src, rows, src_dim, off, n, dst); },
        [=, this] {
          const ArithBlock dy = take_grad(dst, m);
          if (float* g = dy.empty() ? nullptr : grad(src, true)) arith_.cols_acc(dy.f32(), rows, n, src_dim, off, g);
        }});
}

void GradBackend::dropout(const Buf& x, size_t n, float p, uint64_t seed, const Buf& y) {
  exec({{region(x, n)}, {region(y, n)},
        [=, this](bool) { arith_.dropout_fwd(x.f32(), n, p, seed, y.f32()); },
        [=, this] {
          const ArithBlock dy = take_grad(y, n);
          if (float* g = dy.empty() ? nullptr : grad(x, true)) arith_.dropout_bwd(dy.f32(), n, p, seed, g);
        }});
}

void GradBackend::router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision,
                              const Buf& idx, const Buf& weights) {
  const size_t ns = size_t(rows) * size_t(E), nk = size_t(rows) * size_t(k);
  Kept ss = kept();
  auto is = std::make_shared<std::vector<int32_t>>();
  exec({{region(scores, ns)}, {region(idx, nk), region(weights, nk)},
        [=, this](bool keeping) {
          base_.router_topk(scores, rows, E, k, per_expert_scale, ActPrecision::F32, idx, weights);
          if (keeping) keep(ss, scores.f32(), ns), *is = arith_.read_i32(idx.i32(), nk);
        },
        [=, this] {
          const ArithBlock dw = take_grad(weights, nk);
          if (float* g = dw.empty() ? nullptr : grad(scores, true))
            arith_.router_bwd(ss->f32(), *is, dw.f32(), rows, E, k, per_expert_scale, g);
          ss->reset();
          std::vector<int32_t>().swap(*is);
        }});
}

void GradBackend::moe_experts(const Buf& x, int rows, int d, const Buf& idx, const Buf& w, int k,
                              const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision,
                              const Buf& out) {
  const size_t nx = size_t(rows) * size_t(d), nk = size_t(rows) * size_t(k);
  const ExpertStack G = gate, U = up, Dn = down;  // views of the model's weights, alive for its life
  Kept xs = kept(), ws = kept();
  auto is = std::make_shared<std::vector<int32_t>>();
  // The slots (row · k + j) routed to each expert, in row order.
  auto routed = [=](const std::vector<int32_t>& ix) {
    std::vector<std::vector<int64_t>> by(size_t(G.count));
    for (size_t i = 0; i < nk; ++i) by[size_t(ix[i])].push_back(int64_t(i));
    return by;
  };
  auto rows_of = [k](const std::vector<int64_t>& slots) {
    std::vector<int64_t> r(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) r[i] = slots[i] / k;
    return r;
  };
  // One expert's rows: X [m, d] gathered, gate / up products, h = gelu(g)·u, y = down(h).
  struct Pass {
    ArithBlock X, g, u, h, y;
  };
  auto expert_pass = [=, this](int e, const std::vector<int64_t>& xrows, const float* xp, Pass& p) {
    const size_t m = xrows.size(), I = size_t(G.rows());
    p.X = ArithBlock(arith_, m * size_t(d) * 4, false);
    p.g = ArithBlock(arith_, m * I * 4, false), p.u = ArithBlock(arith_, m * I * 4, false);
    p.h = ArithBlock(arith_, m * I * 4, false), p.y = ArithBlock(arith_, m * size_t(d) * 4, false);
    arith_.gather_rows(xp, xrows, size_t(d), p.X.f32());
    arith_.matmul_wt(p.X.f32(), int(m), G.expert(e), p.g.f32());
    arith_.matmul_wt(p.X.f32(), int(m), U.expert(e), p.u.f32());
    arith_.gelu_mul_fwd(p.g.f32(), p.u.f32(), m * I, p.h.f32());
    arith_.matmul_wt(p.h.f32(), int(m), Dn.expert(e), p.y.f32());
  };
  exec({{region(x, nx), region(idx, nk), region(w, nk)}, {region(out, nx)},
        [=, this](bool keeping) {
          const std::vector<int32_t> ids = arith_.read_i32(idx.i32(), nk);
          if (keeping) keep(xs, x.f32(), nx), keep(ws, w.f32(), nk), *is = ids;
          arith_.zero(out.f32(), nx);
          const auto by = routed(ids);
          Pass p;
          for (size_t e = 0; e < by.size(); ++e) {
            if (by[e].empty() || !G.holds(int(e))) continue;
            const std::vector<int64_t> xrows = rows_of(by[e]);
            expert_pass(int(e), xrows, x.f32(), p);
            arith_.scatter_scaled_acc(p.y.f32(), xrows, w.f32(), by[e], size_t(d), out.f32());
          }
        },
        [=, this] {
          const ArithBlock dout = take_grad(out, nx);
          if (!dout.empty()) {
            float* dx = grad(x, true);
            float* dw = grad(w, true);
            const auto by = routed(*is);
            Pass p;
            for (size_t e = 0; e < by.size(); ++e) {
              if (by[e].empty() || !G.holds(int(e))) continue;
              const std::vector<int64_t> xrows = rows_of(by[e]);
              expert_pass(int(e), xrows, xs->f32(), p);
              const size_t m = xrows.size(), I = size_t(G.rows());
              // dy_i = w_slot · dout_row; dw_slot += dout_row · y_i.
              const ArithBlock dy(arith_, m * size_t(d) * 4, false);
              arith_.gather_scaled(dout.f32(), xrows, ws->f32(), by[e], size_t(d), dy.f32());
              if (dw) arith_.row_dots_acc(dout.f32(), xrows, p.y.f32(), by[e], size_t(d), dw);
              const ArithBlock dh = zeros(m * I), dg = zeros(m * I), du = zeros(m * I), dX = zeros(m * size_t(d));
              arith_.matmul_w_acc(dy.f32(), int(m), Dn.expert(int(e)), dh.f32());
              arith_.gelu_mul_bwd(p.g.f32(), p.u.f32(), dh.f32(), m * I, dg.f32(), du.f32());
              arith_.matmul_w_acc(dg.f32(), int(m), G.expert(int(e)), dX.f32());
              arith_.matmul_w_acc(du.f32(), int(m), U.expert(int(e)), dX.f32());
              if (dx) arith_.scatter_rows_acc(dX.f32(), xrows, size_t(d), dx);
            }
          }
          xs->reset();
          ws->reset();
          std::vector<int32_t>().swap(*is);
        }});
}

}  // namespace g4::train
