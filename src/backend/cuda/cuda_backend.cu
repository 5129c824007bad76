// CudaBackend (cuda_backend.h): memory, steps, collectives and the small ops; the factory.
#include "backend/cuda/cuda_backend.h"

namespace g4::cuda_impl {

WeightView CudaBackend::place_weight(const WeightView& w) {
  WeightView d = w;
  place_stack({&d}, StackUse::Outputs);
  return d;
}

namespace {

// Whether two weights have one layout (format, width, row size, bits, group, scale type): parts
// that one launch of the int8 GEMVs takes with one unit.
bool same_layout(const WeightView& a, const WeightView& b) {
  return a.fmt == b.fmt && a.cols == b.cols && a.row_bytes == b.row_bytes && a.bits == b.bits &&
         a.group_size == b.group_size && a.scale_dtype == b.scale_dtype;
}

// Each part's bytes start 256-byte aligned in a stack's allocation, as cudaMalloc would place
// them alone: the kernels' alignment rules (q8_gemv_supports) see each part as they would alone.
constexpr size_t kStackAlign = 256;
size_t stack_offset(size_t bytes) { return (bytes + kStackAlign - 1) / kStackAlign * kStackAlign; }

}  // namespace

void CudaBackend::place_stack(std::initializer_list<WeightView*> parts, StackUse use) {
  dev_.make_current();
  std::vector<WeightView*> held;
  for (WeightView* w : parts)
    if (w->data) held.push_back(w);
  // Runs of one layout, each copied into one allocation (data; MLX scales and biases each in one
  // more), parts back to back.
  for (size_t i = 0; i < held.size();) {
    size_t j = i + 1;
    while (j < held.size() && same_layout(*held[i], *held[j])) ++j;
    size_t data_bytes = 0, scale_bytes = 0;
    for (size_t k = i; k < j; ++k) {
      data_bytes = stack_offset(data_bytes) + view_data_bytes(*held[k]);
      scale_bytes = stack_offset(scale_bytes) + view_scale_bytes(*held[k]);
    }
    // 16 bytes of slack after the last part, as DeviceAllocator::upload leaves.
    uint8_t* data = static_cast<uint8_t*>(mem_.alloc(data_bytes + 16));
    uint8_t* scales = scale_bytes ? static_cast<uint8_t*>(mem_.alloc(scale_bytes + 16)) : nullptr;
    uint8_t* biases = scale_bytes ? static_cast<uint8_t*>(mem_.alloc(scale_bytes + 16)) : nullptr;
    size_t d_off = 0, s_off = 0;
    for (size_t k = i; k < j; ++k) {
      WeightView& w = *held[k];
      d_off = stack_offset(d_off);
      s_off = stack_offset(s_off);
      if (const size_t n = view_data_bytes(w)) G4_CUDA(cudaMemcpy(data + d_off, w.data, n, cudaMemcpyHostToDevice));
      if (const size_t n = view_scale_bytes(w)) {
        G4_CUDA(cudaMemcpy(scales + s_off, w.scales, n, cudaMemcpyHostToDevice));
        G4_CUDA(cudaMemcpy(biases + s_off, w.biases, n, cudaMemcpyHostToDevice));
        w.scales = scales + s_off;
        w.biases = biases + s_off;
      }
      w.data = data + d_off;
      d_off += view_data_bytes(w);
      s_off += view_scale_bytes(w);
    }
    i = j;
  }
  // The plans of the launches the op makes: norm_matmuls launches each run of one format and width
  // (at most 3 weights) together, gate_up_gelu the gate with its up; and each part alone (an
  // adapted module's separate launch, a matmul of the weight by itself).
  if (use == StackUse::Gated && held.size() == 2 && same_layout(*held[0], *held[1])) {
    cuda::MatArgs a{};
    a.n = 1;
    a.w[0] = dev(*held[0]);
    a.w2 = dev(*held[1]);
    plans_.add(plan_gemv(a));
  }
  for (size_t i = 0; use == StackUse::Outputs && i < held.size();) {
    size_t j = i + 1;
    while (j < held.size() && j - i < 3 && same_layout(*held[i], *held[j])) ++j;
    cuda::MatArgs a{};
    a.n = int(j - i);
    for (size_t k = i; k < j; ++k) a.w[k - i] = dev(*held[k]);
    plans_.add(plan_gemv(a));
    i = j;
  }
  for (WeightView* w : held) {
    cuda::MatArgs one{};
    one.n = 1;
    one.w[0] = dev(*w);
    plans_.add(plan_gemv(one));
  }
}

ExpertStack CudaBackend::place_experts(const ExpertStack& s) {
  if (s.held == 0) return s;  // another rank holds them all
  dev_.make_current();
  ExpertStack d = s;
  const size_t eb = size_t(s.expert_bytes()), sb = size_t(s.expert_scale_bytes()), n = size_t(s.held);
  d.base.data = mem_.upload_blocks(s.base.data, eb, size_t(s.stride), n);
  if (sb) {
    d.base.scales = mem_.upload_blocks(s.base.scales, sb, size_t(s.scale_stride), n);
    d.base.biases = mem_.upload_blocks(s.base.biases, sb, size_t(s.scale_stride), n);
  }
  d.stride = int64_t(eb);
  d.scale_stride = int64_t(sb);
  experts_.table(d);  // the MoE kernels' expert array, made here once
  return d;
}

void CudaBackend::release_weight(const WeightView& w) {
  dev_.make_current();
  flush_pending();
  rec_->flush();
  dev_.sync();  // no launch in flight reads it
  if (blas_) blas_->forget(w.data, size_t(w.rows) * size_t(w.cols), mem_);
  plans_.forget(w.data);
  for (const void* p : {w.data, w.scales, w.biases}) mem_.free(const_cast<void*>(p), /*deferred=*/false);
}

void CudaBackend::read_bytes(const Buf& src_b, size_t bytes, void* dst) {
  dev_.make_current();
  flush_pending();
  rec_->flush();
  if (!bytes) return;
  if (bytes > bounce_n_) {  // pinned bounce buffer: a full-speed copy, then a host memcpy
    if (bounce_) G4_CUDA(cudaFreeHost(bounce_));
    G4_CUDA(cudaMallocHost(&bounce_, bytes));
    bounce_n_ = bytes;
  }
  G4_CUDA(cudaMemcpyAsync(bounce_, src_b.data, bytes, cudaMemcpyDeviceToHost, dev_.stream()));
  dev_.sync();
  std::memcpy(dst, bounce_, bytes);
  if (timer_) timer_->output_read();
}

void CudaBackend::queue_read(const Buf& src_b, size_t bytes, int slot) {
  G4_CHECK(slot >= 0 && slot < kReadSlots && bytes <= kQueuedReadBytes && "queue_read: slot or size");
  dev_.make_current();
  flush_pending();
  rec_->flush();
  if (!reads_) {
    G4_CUDA(cudaMallocHost(&reads_, size_t(kReadSlots) * kQueuedReadBytes));
    for (cudaEvent_t& e : read_done_) G4_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  uint8_t* at = reads_ + size_t(slot) * kQueuedReadBytes;
  if (bytes) G4_CUDA(cudaMemcpyAsync(at, src_b.data, bytes, cudaMemcpyDeviceToHost, dev_.stream()));
  G4_CUDA(cudaEventRecord(read_done_[slot], dev_.stream()));
}

void CudaBackend::take_read(int slot, size_t bytes, void* dst) {
  G4_CHECK(slot >= 0 && slot < kReadSlots && bytes <= kQueuedReadBytes && reads_ && "take_read: slot, size, or no read");
  dev_.make_current();
  G4_CUDA(cudaEventSynchronize(read_done_[slot]));
  std::memcpy(dst, reads_ + size_t(slot) * kQueuedReadBytes, bytes);
  if (timer_) timer_->output_read();
}

void CudaBackend::write_bytes(const void* src, size_t bytes, const Buf& dst_b) {
  dev_.make_current();
  flush_pending();
  void* dst = dst_b.data;
  if (!bytes || rec_->stage_copy(src, bytes, dst)) return;
  rec_->flush();
  G4_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, dev_.stream()));
  dev_.sync();  // src may go away when this returns
}

void CudaBackend::sync() {
  dev_.make_current();
  flush_pending();
  rec_->flush();
  dev_.sync();
  mem_.collect();
}

void CudaBackend::begin_step() {
  dev_.make_current();   // the calling thread's GPU (a tensor-parallel rank runs on a thread of its own)
  flush_pending();       // nothing held back from before joins the step
  if (profile_) return;  // profiled ops run one by one
  rec_->begin();         // waits for the step two back (cuda_step.h)
  seqs_->begin_step();
  mem_.collect();
  if (timer_) timer_->step_begin();
}

void CudaBackend::end_step() {
  dev_.make_current();
  seqs_->end_step();
  flush_pending();
  if (timer_) timer_->step_logged(dev_.stream());
  rec_->end();
  if (timer_) timer_->step_launched(dev_.stream());
}

void CudaBackend::all_reduce(Communicator& c, const Buf& y_b, size_t n) {
  if (!c.on_device()) return Backend::all_reduce(c, y_b, n);
  Communicator* comm = &c;
  void* y = y_b.data;
  const DType t = y_b.dtype;
  launch("all_reduce", cuda::collective_all_reduce, comm, y, n, t);
}

void CudaBackend::all_gather(Communicator& c, const Buf& send_b, size_t n, const Buf& recv_b) {
  if (!c.on_device()) return Backend::all_gather(c, send_b, n, recv_b);
  Communicator* comm = &c;
  const void* send = send_b.data;
  void* recv = recv_b.data;
  const DType t = send_b.dtype;
  launch("all_gather", cuda::collective_all_gather, comm, send, n, t, recv);
}

void CudaBackend::place_cols(const Buf& src_b, int rows, int n, const Buf& dst_b, int dst_dim, int off) {
  G4_CHECK(src_b.dtype == dst_b.dtype && off >= 0 && off + n <= dst_dim && "place_cols: shapes or dtypes");
  const void* src = src_b.data;
  void* dst = dst_b.data;
  const size_t es = dtype_size(src_b.dtype);
  launch("place_cols", cuda::place_cols, src, rows, n, dst, dst_dim, off, es);
}

void CudaBackend::argmax(const Buf& x_b, int rows, int n, const Buf& out_b) {
  const float* x = F(x_b);
  int32_t* out = I(out_b);
  // Per-row 64-bit slots, then per-row counters: zeros that the kernel leaves zero.
  if (size_t(rows) > argmax_rows_) argmax_rows_ = size_t(rows);
  auto* slots = static_cast<unsigned long long*>(argmax_.get(mem_, argmax_rows_ * 12, dev_, true));
  auto* counters = reinterpret_cast<unsigned*>(slots + argmax_rows_);
  launch("argmax", cuda::argmax, x, rows, n, slots, counters, out);
}

void CudaBackend::embed(const WeightView& E, const Buf& ids_b, int n, float scale, ActPrecision P, const Buf& out_b) {
  const int32_t* ids = I(ids_b);
  void* out = out_b.data;
  const DType t = act_type({&out_b});
  const cuda::DevWeight e = dev(E);
  step_rows_ = n;  // every forward step starts with its embedding: the step's row count
  launch("embed", cuda::embed, e, ids, n, scale, out, t);
}

}  // namespace g4::cuda_impl

namespace g4 {

using cuda_impl::CudaBackend;

bool cuda_step_counts(const Backend& be, CudaStepCounts* out) {
  const auto* cb = dynamic_cast<const CudaBackend*>(&be);
  if (!cb) return false;
  const cuda::StepRecorder::Counts c = cb->step_counts();
  *out = CudaStepCounts{c.replayed, c.captured, c.direct};
  return true;
}

bool cuda_prefill_on_blas(const Backend& be) {
  const auto* cb = dynamic_cast<const CudaBackend*>(&be);
  return cb && cb->prefill_on_blas();
}

std::unique_ptr<Backend> make_cuda_backend(std::string* why, const BackendOptions& opt) {
  if (!cuda::device_usable(opt.device, why)) return nullptr;
  if (opt.activations != DType::F32 && opt.activations != DType::BF16) {
    if (why) *why = "activations are stored as f32 or bf16";
    return nullptr;
  }
  return std::make_unique<CudaBackend>(opt);
}

}  // namespace g4
