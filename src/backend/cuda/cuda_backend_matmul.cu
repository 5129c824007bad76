// CudaBackend (cuda_backend.h): the matmul family (matmul, the fused norm / epilogue forms, gate / up)
// and the plans that pick a launch for them (int8 GEMVs, the few-row tensor-core kernel, cuBLAS).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemv_mma.h"
#include "backend/cuda/cuda_gemv_q8.h"

namespace g4::cuda_impl {

void CudaBackend::matmul(const Buf& x_b, int M, const WeightView& W, ActPrecision P, const Buf& y_b) {
  const void* x = x_b.data;
  void* y = y_b.data;
  const DType xt = act_type({&x_b}), yt = act_type({&y_b});
  G4_CHECK((yt == xt || yt == DType::F32) && "cuda matmul: y is of x's type or f32");
  const cuda::DevWeight w = dev(W);
  if (profile_) label_ = "matmul " + std::to_string(w.rows) + "x" + std::to_string(w.cols) + " M=" + std::to_string(M);
  // Op 20 ("big_matmul", >= 64Ki rows: the LM head) only to tell it apart in G4_CUDA_SKIP ablations.
  const char* op = w.rows >= 65536 ? "big_matmul" : "matmul";
  const cuda::Q8Act pre = take_prepared(x, M, w);  // x's int8 form, when the attention or gelu_mul before wrote it
  if (pre.q || (q8_rows(M, w) && pending_.y && x == pending_.resid)) {  // or: may take the deferred epilogue
    cuda::MatArgs a = mat_args(x_b, InputNorm{}, M, w);
    a.yt = yt;
    a.n = 1;
    a.w[0] = w;
    a.y[0] = y;
    if (pre.q) {
      a.q8 = pre;
      a.prepared = 1;
      plan_row_fetch(a);
      return launch(op, cuda::matmuls, a, M);
    }
    pending_.take_into(a, M, false);
    if (a.pre_y) {
      plan_row_fetch(a);
      return launch(op, cuda::matmuls, a, M);
    }
  }
  if (M > 1 && blas_ && !q8_rows(M, w)) {
    cuda::MatArgs a = mat_args(x_b, InputNorm{}, M, w);
    a.yt = yt;
    a.n = 1;
    a.w[0] = w;
    a.y[0] = y;
    if (launch_blas(op, a, M, 0)) return;
  }
  cuda::MatArgs a = mat_args(x_b, InputNorm{}, M, w);
  a.yt = yt;
  a.n = 1;
  a.w[0] = w;
  a.y[0] = y;
  plan_row_fetch(a);
  launch(op, cuda::matmuls, a, M);
}

void CudaBackend::matmul_norm_add(const Buf& x_b, int M, const WeightView& W, const Buf& y_b, const Buf& resid_b,
                                  const float* w, float eps, ActPrecision P, const LoraApply* lora) {
  if (lora) {  // the adapters' products between the matmul and the norm: the separate ops
    Backend::matmul_norm_add(x_b, M, W, y_b, resid_b, w, eps, P, lora);
    return;
  }
  const cuda::Q8Act pre = take_prepared(x_b.data, M, dev(W));  // x's int8 form, when the attention or gelu_mul before wrote it
  // Batched decode on the few-row tensor-core kernel or cuBLAS (no fused epilogue): the norm_add
  // is left pending for the next op (the next input norm takes it: PendingPost).
  if (batched_rows(x_b, M, dev(W))) {
    matmul(x_b, M, W, P, y_b);
    pending_ = cuda::PendingPost{y_b.data, resid_b.data, act_type({&x_b, &y_b, &resid_b}), int(W.rows), w, eps, M};
    return;
  }
  // The int8 GEMVs (one row, or the rows of a row-exact launch) leave the post-norm pending.
  const bool defer = q8_rows(M, dev(W)) && cuda::q8_post_deferrable(dev(W));
  // Prefill: the row-parallel norm_add kernel after the matmul.
  if (M > cuda::kEpilogueMaxRows && !defer) {
    Backend::matmul_norm_add(x_b, M, W, y_b, resid_b, w, eps, P);
    return;
  }
  void *y_scratch = y_b.data, *x_resid = resid_b.data;
  cuda::MatArgs a = mat_args(x_b, InputNorm{}, M, dev(W));
  G4_CHECK(act_type({&x_b, &y_b, &resid_b}) == a.xt);
  a.n = 1;
  a.w[0] = dev(W);
  a.y[0] = y_scratch;
  a.resid = x_resid;
  a.post_w = w;
  a.post_eps = eps;
  a.counter = static_cast<unsigned*>(epilogue_counter_.get(mem_, sizeof(unsigned), dev_, true));
  if (profile_) label_ = "matmul_norm_add " + std::to_string(W.rows) + "x" + std::to_string(W.cols) + " M=" +
                    std::to_string(M);
  a.defer_post = defer;
  if (pre.q) {
    a.q8 = pre;
    a.prepared = 1;
  }
  plan_row_fetch(a);
  launch("matmul_norm_add", cuda::matmuls, a, M);
  if (defer) pending_ = cuda::PendingPost{y_scratch, x_resid, a.xt, int(W.rows), w, eps, M, 1.f, true};
}

void CudaBackend::norm_matmuls(const Buf& x_b, int M, const InputNorm& norm, std::initializer_list<MatOut> outs,
                               ActPrecision P) {
  flush_held();  // older than this op, and before it decides on the pending epilogues
  if (outs.size() == 0) return;
  for (const MatOut& o : outs)
    if (o.lora) {  // the adapters read the normed input: the separate ops
      Backend::norm_matmuls(x_b, M, norm, outs, P);
      return;
    }
  const int64_t cols = outs.begin()->w->cols;
  bool q8 = true;  // every weight on the int8 GEMVs (their prepare norms the rows)
  for (const MatOut& o : outs) q8 = q8 && q8_rows(M, dev(*o.w));
  if (!q8 && !blas_rows(x_b, M, cols) && !small_rows(x_b, M, cols) &&
      !norm_fits(norm, M, cols)) {  // too wide to norm in shared memory
    Backend::norm_matmuls(x_b, M, norm, outs, P);
    return;
  }
  // One launch per run of consecutive weights of one format (q/k/v usually share theirs; Q4_K_M
  // files give some layers' v Q6_K). On the int8 GEMVs the later runs read the rows the first
  // run's prepare made (MatArgs::prepared) instead of preparing them again.
  cuda::MatArgs a = normed_args(x_b, M, norm, *outs.begin()->w, P);
  bool prepared = false;
  for (auto it = outs.begin(); it != outs.end(); ++it) {
    G4_CHECK(act_type({&it->y}) == a.xt);
    a.w[a.n] = dev(*it->w);
    a.y[a.n] = it->y.data;
    ++a.n;
    const auto next = it + 1;
    if (next == outs.end() || a.n == 3 || next->w->fmt != it->w->fmt || next->w->cols != it->w->cols) {
      cuda::MatArgs run = a;
      run.prepared = prepared ? 1 : 0;
      launch_matmuls(run, M);
      prepared = prepared || (opt_.fuse_decode_ops && a.q8.q && cuda::q8_gemv_takes(a, cuda::kPlain) &&
                              int64_t(M) * cols <= cuda::kQ8MaxValues);
      a.n = 0;
    }
  }
}

void CudaBackend::gate_up_gelu(const Buf& x_b, int M, const InputNorm& norm, const WeightView& G, const WeightView& U,
                               bool ggml_table, ActPrecision P, const Buf& gate_b, const Buf& up_b, const LoraApply* lora_gate,
                               const LoraApply* lora_up) {
  flush_held();  // older than this op, and before it decides on the pending epilogues
  if (lora_gate || lora_up || G.fmt != U.fmt || G.rows != U.rows || G.cols != U.cols || G.group_size != U.group_size || G.bits != U.bits ||
      G.scale_dtype != U.scale_dtype ||
      (!q8_rows(M, dev(G)) && !blas_rows(x_b, M, G.cols) &&
       !small_rows(x_b, M, G.cols) && !norm_fits(norm, M, G.cols))) {
    Backend::gate_up_gelu(x_b, M, norm, G, U, ggml_table, P, gate_b, up_b, lora_gate, lora_up);  // separate launches
    return;
  }
  void* gate_out = gate_b.data;
  cuda::MatArgs a = normed_args(x_b, M, norm, G, P);
  G4_CHECK(act_type({&gate_b}) == a.xt);
  a.n = 1;
  a.w[0] = dev(G);
  a.w2 = dev(U);
  a.y[0] = gate_out;
  a.table = ggml_table ? tables_.gelu_table() : nullptr;
  pending_.take_into(a, M, true);
  if (profile_) label_ = "gate_up_gelu " + std::to_string(G.rows) + "x" + std::to_string(G.cols) + " M=" + std::to_string(M);
  plan_row_fetch(a);
  if (launch_blas("gate_up_gelu", a, M, a.table ? 2 : 1)) return;
  launch("gate_up_gelu", cuda::gate_up_gelu, a, M);
}

cuda::Q8Act CudaBackend::take_prepared(const void* x, int M, const cuda::DevWeight& w) {
  if (!attn_ && !gelu_) return cuda::Q8Act{};
  const std::string caller_label = std::move(label_);  // the caller's launch comes after the held one
  const bool int8 = q8_rows(M, w) && cuda::q8_gemv_supports(w) && int64_t(M) * w.cols <= cuda::kQ8MaxValues;
  bool joins = false;
  if (attn_) {
    const cuda::PendingAttention h = attn_;
    attn_ = cuda::PendingAttention{};
    joins = int8 && x == h.out && M == h.rows && w.cols == int64_t(h.H) * h.a.head_dim;
    launch_attention(h, joins ? q8_out_ : cuda::Q8Act{});
  } else {
    joins = int8 && x == gelu_.out && gelu_.n == size_t(M) * size_t(w.cols) && w.cols % 32 == 0;
    launch_gelu_mul(joins ? q8_out_ : cuda::Q8Act{}, int(w.cols));
  }
  label_ = caller_label;
  return joins ? q8_out_ : cuda::Q8Act{};
}

cuda::MatArgs CudaBackend::mat_args(const Buf& x, const InputNorm& norm, int M, const cuda::DevWeight& w) const {
  cuda::MatArgs a{};
  a.x = x.data;
  a.xt = act_type({&x});
  a.yt = a.xt;
  a.norm_w = norm.w;
  a.eps = norm.eps;
  if (q8_rows(M, w)) {
    a.q8 = q8_;
    a.mma_rows = opt_.int8_mma_rows ? cuda::kMmaByRule : 0;
  }
  return a;
}

cuda::MatArgs CudaBackend::normed_args(const Buf& x, int M, const InputNorm& norm, const WeightView& W, ActPrecision P) {
  if (norm.w && norm.scratch && batched_rows(x, M, dev(W))) {
    if (pending_.y && !pending_.q8 && pending_.rows == M && pending_.resid == x.data && pending_.n == W.cols &&
        pending_.t == act_type({&x, &norm.scratch})) {  // the pending residual update, then this norm
      const cuda::PendingPost p = pending_;
      pending_ = cuda::PendingPost{};
      void* xn = norm.scratch.data;
      launch("norm_add_norm", cuda::norm_add_norm, p.resid, p.y, p.rows, p.n, p.w, p.eps, p.scale, norm.w, norm.eps,
             xn, p.t);
    } else {
      rms_norm(x, M, int(W.cols), norm.w, norm.eps, P, norm.scratch);
    }
    return mat_args(norm.scratch, InputNorm{}, M, dev(W));
  }
  if (M != 1 || !norm.w || !norm.scratch || (W.fmt != WFormat::GgufQ4_K && W.fmt != WFormat::GgufQ6_K) ||
      (q8_.q && cuda::q8_gemv_supports(dev(W))))
    return mat_args(x, norm, M, dev(W));
  rms_norm(x, 1, int(W.cols), norm.w, norm.eps, P, norm.scratch);
  return mat_args(norm.scratch, InputNorm{}, M, dev(W));
}

void CudaBackend::launch_matmuls(cuda::MatArgs a, int M) {
  pending_.take_into(a, M, false);
  if (profile_) label_ = "matmuls x" + std::to_string(a.n) + " " + std::to_string(a.w[0].rows) + "x" +
                         std::to_string(a.w[0].cols) + " M=" + std::to_string(M);
  plan_row_fetch(a);
  if (launch_blas("norm_matmuls", a, M, 0)) return;
  launch("norm_matmuls", cuda::matmuls, a, M);
}

void CudaBackend::plan_row_fetch(cuda::MatArgs& a) {
  const int64_t bytes = cuda::weight_bytes(a);
  const cuda::GemvPlan* plan = plans_.find(a);  // chosen at placement; else the same rules now
  a.lanes = plan ? uint8_t(plan->lanes) : 0;
  a.row_fetch = plan ? plan->fetch : fixed_row_fetch(a);
  const bool fits = bytes + streamed_bytes_ <= int64_t(dev_.l2_bytes());
  if (opt_.row_fetch != BackendOptions::RowFetch::None && fits) a.row_fetch |= cuda::kFetchL2;
  streamed_bytes_ = bytes;
}

uint8_t CudaBackend::fixed_row_fetch(const cuda::MatArgs& a) const {
  using RF = BackendOptions::RowFetch;
  const bool can_stage = dev_.smem_optin() >= cuda::kStageMaxBytes;
  // Auto stages Q6_K rows where a block's stage is small (its 2-byte aligned units read faster from
  // shared memory than through L1; a large stage leaves too few blocks an SM).
  const bool q6_stage = opt_.row_fetch == RF::Auto && a.w[0].fmt == WFormat::GgufQ6_K &&
                        cuda::q8_stage_bytes_for(a, a.w2.data ? cuda::kGelu : cuda::kPlain) <= cuda::kStageAutoBytes;
  uint8_t fetch = 0;
  if (can_stage && (opt_.row_fetch == RF::Shared || q6_stage)) fetch |= cuda::kFetchShared;
  if (opt_.gemv_ahead) fetch |= cuda::kFetchAhead;
  return fetch;
}

cuda::GemvPlan CudaBackend::plan_gemv(const cuda::MatArgs& a) const {
  cuda::GemvPlan p;
  p.n = a.n;
  for (int i = 0; i < a.n; ++i) p.parts[i] = a.w[i].data;
  p.gated = a.w2.data;
  p.lanes = cuda::q8_gemv_lanes(a, a.w2.data ? cuda::kGelu : cuda::kPlain);
  p.fetch = fixed_row_fetch(a);
  return p;
}

bool CudaBackend::launch_blas(const char* op, const cuda::MatArgs& a, int M, int act) {
  if (a.q8.q) return false;  // the int8 GEMVs' rows (q8_rows)
  const int cached_min = opt_.blas_cached_min_rows > 0 ? opt_.blas_cached_min_rows : cuda::kBlasCachedMinRows;
  if (!blas_ || !blas_->applies(a, M, std::min(cached_min, cuda::kBlasMinRows))) return false;
  if (opt_.bf16_weight_cache_gib > 0)  // before the launch is logged: the copies exist when it runs
    blas_->cache_weights(dev_.stream(), a, act, mem_, size_t(opt_.bf16_weight_cache_gib) << 30);
  if (M < cuda::kBlasMinRows && !blas_->reads_bf16(a, act)) return false;
  launch(op, cuda::blas_matmuls, static_cast<const cuda::Blas*>(blas_.get()), a, M, act);
  return true;
}

}  // namespace g4::cuda_impl
