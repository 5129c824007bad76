// CudaBackend (cuda_backend.h): RoPE, the KV cache writes, attention, and the MoE router and experts.
#include "backend/cuda/cuda_backend.h"

namespace g4::cuda_impl {

void CudaBackend::attention(const Buf& q_b, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                            const Buf& out_b) {
  // A held attn_prep of these rows is done by this launch when it takes every row on the decode
  // kernel (checked below); otherwise it goes first.
  cuda::PendingAttnPrep prep;
  if (prep_ && prep_.a.q == q_b.data && prep_.a.H == H) std::swap(prep, prep_);
  flush_held();  // older than this op
  const void* q = q_b.data;
  void* out = out_b.data;
  const DType t = act_type({&q_b, &out_b});
  // Prefill-sized sequences: the tensor-core kernel, one launch each; the rest (decode rows):
  // one launch over all of them.
  std::vector<AttnSeq> batch;
  for (const AttnSeq& sq : seqs) {
    const KvBuffer& kv = sq.kv;
    G4_CHECK(kv.head_dim <= 512 && "cuda attention: head_dim above 512");
    G4_CHECK(kv.quantized() || act_type({&kv.k, &kv.v}) == t);
    cuda::AttnArgs a{};  // value-initialized: its bytes are part of the step's key
    a.row0 = sq.row0;
    a.n = sq.n;
    a.k = kv.k.data;
    a.v = kv.v.data;
    a.capacity = kv.capacity;
    a.n_kv_heads = kv.n_kv_heads;
    a.head_dim = kv.head_dim;
    a.window = kv.window;
    a.table = kv.table;
    a.block_shift = block_shift(kv);
    a.quant = quant_args(kv);
    a.t = t;
    // Row-exact: a prompt chunk's rows on the decode kernel too, so a row's bits do not depend
    // on the chunk it came in (a prefix-cache hit moves the chunk boundaries).
    if (!cuda::flash_attention_applies(a) || (opt_.row_exact && sq.n <= kRowExactMaxRows)) {
      batch.push_back(sq);
      continue;
    }
    launch_prep(prep);  // not every row on the decode kernel: attn_prep's launch first, as held
    a.pos0 = rec_->dyn(sq.pos0);
    a.blocks = sq.blocks ? seqs_->blocks(sq.blocks, sq.n) : nullptr;
    launch("flash_attention", cuda::flash_attention, q, H, a, scale, out);
  }
  if (batch.empty()) return;
  if (batch.size() != seqs.size() || batch[0].kv.quantized()) launch_prep(prep);
  const KvBuffer& kv0 = batch[0].kv;
  cuda::AttnBatch a{};
  a.tab = seqs_->table(batch);
  a.rows = cuda::batch_rows(batch);
  a.n_kv_heads = kv0.n_kv_heads;
  a.head_dim = kv0.head_dim;
  a.quant_bits = kv0.quant.bits;
  a.t = t;
  // Splits from static bounds (capacity, window), so a recorded step replays at any position.
  // An image block can reach past a sliding window (never past the ring, which holds the call).
  int max_visible = 1;
  for (const AttnSeq& sq : batch) {
    const KvBuffer& kv = sq.kv;
    G4_CHECK(kv.n_kv_heads == kv0.n_kv_heads && kv.head_dim == kv0.head_dim && kv.quantized() == kv0.quantized());
    max_visible = std::max(max_visible, kv.window > 0 && !sq.blocks ? std::min(kv.window, kv.capacity) : kv.capacity);
  }
  // Row-exact: one split count for every row whatever its batch (the batch's largest cache, which
  // sets the count otherwise, changes with the batch).
  const int splits = opt_.row_exact ? cuda::kAttnMaxSplits
                                    : cuda::attention_splits(a.rows, H, max_visible, opt_.attn_split_positions,
                                                             cuda::attention_resident_blocks(a.head_dim, t, a.quant_bits > 0));
  const int D = a.head_dim;
  float* partial = splits > 1 ? static_cast<float*>(partial_.get(mem_, size_t(a.rows) * H * splits * (D + 2) * 4, dev_)) : nullptr;
  unsigned* counters = splits > 1 ? static_cast<unsigned*>(counters_.get(mem_, size_t(a.rows) * H * sizeof(unsigned), dev_, true)) : nullptr;
  const cuda::PendingAttention h{q, H, splits, a, scale, a.rows, partial, counters, out, prep.a};
  // Every row of the forward in this launch, on the int8 decode path (one row, or row-exact rows):
  // held back for the output projection, which may read its output's int8 form (take_prepared).
  const int64_t cols = int64_t(H) * D;
  const bool int8_rows = a.rows == 1 || (opt_.row_exact && a.rows <= kRowExactMaxRows);
  if (opt_.fuse_decode_ops && int8_rows && q8_.q && q8_out_.q && batch.size() == seqs.size() && D % 32 == 0 &&
      cols <= cuda::kQ8MaxCols && int64_t(a.rows) * cols <= cuda::kQ8MaxValues) {
    attn_ = h;
    return;
  }
  launch_attention(h, cuda::Q8Act{});
}

void CudaBackend::attn_prep(const Buf& q_b, int H, const Buf& k_b, const Buf& v_b, int Hk, int head_dim, const float* q_norm_w,
                            const float* k_norm_w, bool v_norm, float eps, const std::vector<AttnSeq>& seqs, const RopeTable& t,
                            ActPrecision P) {
  if (seqs.empty()) return;
  const bool has_k = bool(k_b);
  const DType at = act_type({&q_b, &k_b, &v_b});
  for (const AttnSeq& sq : seqs) {
    const KvBuffer& kv = sq.kv;
    if (!has_k) continue;
    if (!kv.quantized()) G4_CHECK(act_type({&kv.k, &kv.v}) == at);
    G4_CHECK(kv.n_kv_heads == Hk && kv.head_dim == head_dim);
    if (kv.quantized()) G4_CHECK(head_dim <= 512 && head_dim % kv.quant.group_size == 0);
  }
  cuda::AttnPrepArgs a{};
  a.t = at;
  a.q = q_b.data;
  a.k = has_k ? k_b.data : nullptr;
  a.v = has_k ? v_b.data : nullptr;
  a.H = H;
  a.Hk = has_k ? Hk : 0;
  a.head_dim = head_dim;
  a.q_norm_w = q_norm_w;
  a.k_norm_w = k_norm_w;
  a.v_norm = v_norm;
  a.eps = eps;
  a.inv_freq = tables_.inv_freq(t.inv_freq);
  a.position_scale = t.position_scale;
  a.tab = seqs_->table(seqs);
  const int rows = cuda::batch_rows(seqs);
  if (has_k)
    for (const AttnSeq& sq : seqs) record_positions(sq);
  // Decode rows (one per sequence, unquantized caches, no image blocks): held for the attention
  // launch to do (cuda_pending.h PendingAttnPrep).
  bool fold = opt_.fold_attn_prep && rows == int(seqs.size()) && head_dim <= 512;
  for (const AttnSeq& sq : seqs) fold = fold && sq.n == 1 && !sq.blocks && !sq.kv.quantized();
  if (fold) {
    flush_pending();  // older than the held launch
    prep_ = cuda::PendingAttnPrep{a, rows};
    return;
  }
  launch("attn_prep", cuda::attn_prep, a, rows);
}

void CudaBackend::router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision P,
                              const Buf& idx, const Buf& weights) {
  if (cuda::router_topk_applies(E, k)) {
    const void* sc = scores.data;
    const DType st = act_type({&scores});
    launch("router_topk", cuda::router_topk, sc, st, rows, E, k, per_expert_scale, I(idx), F(weights));
    return;
  }
  std::vector<float> hs(size_t(rows) * E), hp(static_cast<size_t>(E)), hw(size_t(rows) * k);
  std::vector<int32_t> hi(size_t(rows) * k);
  to_host(scores, hs.size(), hs.data());
  to_host(per_expert_scale, hp.size(), hp.data());
  host_ops_->router_topk(hs.data(), rows, E, k, hp.data(), P, hi.data(), hw.data());  // the reference's rule
  from_host(hi.data(), hi.size(), idx);
  from_host(hw.data(), hw.size(), weights);
}

void CudaBackend::moe_experts(const Buf& x, int rows, int d, const Buf& idx, const Buf& w_b, int k,
                              const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision P,
                              const Buf& out_b) {
  if (gate.fmt() == up.fmt() && moe_experts_on_device(x, rows, d, idx, w_b, k, gate, up, down, out_b))
    return;
  const Buf y = host_moe_.run(*this, x, rows, d, idx, k, gate, up, down, P);
  const void* yv = y.data;
  const float* w = F(w_b);
  void* out = out_b.data;
  const DType t = act_type({&y, &out_b});
  launch("moe_combine", cuda::moe_combine, yv, w, rows, k, d, out, t);
}

bool CudaBackend::moe_experts_on_device(const Buf& x, int rows, int d, const Buf& idx, const Buf& w_b, int k,
                                        const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down,
                                        const Buf& out_b) {
  const int items = rows * k, E = gate.count;
  const int64_t hidden = gate.rows();
  if (hidden == 0) return false;  // no expert held here: the host-routed path's zeros
  const DType t = act_type({&x, &out_b});
  void* h = moe_h_.get(mem_, size_t(items) * size_t(hidden) * dtype_size(t), dev_);
  void* y = moe_dy_.get(mem_, size_t(items) * size_t(d) * dtype_size(t), dev_);
  const bool decode = rows <= (opt_.row_exact ? kRowExactMaxRows : kMoeDeviceRows);
  cuda::MoeMatArgs a{};
  a.x = x.data;
  a.xt = t;
  a.x_div = k;
  a.w = experts_.table(gate);
  a.w2 = experts_.table(up);
  a.idx = I(idx);
  a.y = h;
  a.w0 = dev(gate.base);
  a.w20 = dev(up.base);
  a.q8 = decode ? q8_ : cuda::Q8Act{};
  a.ahead = opt_.gemv_ahead;
  cuda::MoeMatArgs b{};
  b.x = h;
  b.xt = t;
  b.x_div = 1;
  b.w = experts_.table(down);
  b.idx = I(idx);
  b.y = y;
  b.w0 = dev(down.base);
  b.q8 = a.q8;
  b.ahead = a.ahead;
  if (decode) {
    launch("moe_gate_up", cuda::moe_matmul, a, items, k, hidden, gate.fmt(), true);
    launch("moe_down", cuda::moe_matmul, b, items, k, int64_t(d), down.fmt(), false);
  } else {
    if (!cuda::moe_grouped_applies(a, E, hidden) || !cuda::moe_grouped_applies(b, E, d)) return false;
    a.rows16 = rows16(gate) && rows16(up);  // the grouped kernels' Q4_K word loads (prefill only)
    b.rows16 = rows16(down);
    const size_t slots = cuda::moe_group_slots(items, E), blocks = size_t(cuda::moe_group_max_blocks(items, E));
    auto* g0 = static_cast<int32_t*>(moe_groups_.get(mem_, (slots + blocks + 1) * sizeof(int32_t), dev_));
    const cuda::MoeGroups g{g0, g0 + slots, g0 + slots + blocks};
    launch("moe_group", cuda::moe_group, static_cast<const int32_t*>(I(idx)), items, E, g);
    if (profile_) label_ = "moe_gate_up grouped M=" + std::to_string(rows);
    launch("moe_gate_up", cuda::moe_grouped_matmul, a, g, items, E, hidden, gate.fmt(), true);
    if (profile_) label_ = "moe_down grouped M=" + std::to_string(rows);
    launch("moe_down", cuda::moe_grouped_matmul, b, g, items, E, int64_t(d), down.fmt(), false);
  }
  // The combination is left pending: moe_exit takes it into its kernel (else the next launch
  // runs it first, flush_pending).
  combine_ = cuda::PendingCombine{y, F(w_b), out_b.data, rows, k, d, t};
  return true;
}

void CudaBackend::kv_write(const AttnSeq& s, const Buf& k_b, const Buf& v_b) {
  const KvBuffer& kv = s.kv;
  const int hk = kv.n_kv_heads, hd = kv.head_dim, row0 = s.row0, n = s.n, cap = kv.capacity, win = kv.window;
  const void *k = k_b.data, *v = v_b.data;
  void *kc = kv.k.data, *vc = kv.v.data;
  const DType t = act_type({&k_b, &v_b, &kv.k, &kv.v});
  const cuda::KvQuantArgs q = quant_args(kv);
  const cuda::Dyn p = rec_->dyn(s.pos0);
  const int32_t* table = kv.table;
  const int shift = block_shift(kv);
  launch("kv_write", cuda::kv_write, k, v, row0, n, p, hk, hd, cap, win, table, shift, kc, vc, q, t);
  record_positions(s);
}

void CudaBackend::norm_rope(const Buf& x_b, int heads, int head_dim, const float* w, float eps, const std::vector<AttnSeq>& seqs,
                            const RopeTable& t, ActPrecision P) {
  const DType at = act_type({&x_b});
  const float* inv = tables_.inv_freq(t.inv_freq);
  const float ps = t.position_scale;
  for (const AttnSeq& sq : seqs) {
    void* xs = x_b.at(int64_t(sq.row0) * heads * head_dim).data;
    const int n = sq.n;
    const cuda::Dyn p = rec_->dyn(sq.pos0);
    launch("norm_rope", cuda::norm_rope, xs, n, heads, head_dim, w, eps, p, inv, ps, at);
  }
}

void CudaBackend::rope(const Buf& x_b, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision P) {
  void* x = x_b.data;
  const DType at = act_type({&x_b});
  const float* inv = tables_.inv_freq(t.inv_freq);
  const float ps = t.position_scale;
  const cuda::Dyn p = rec_->dyn(pos0);
  launch("rope", cuda::rope, x, rows, heads, head_dim, p, inv, ps, at);
}

}  // namespace g4::cuda_impl
