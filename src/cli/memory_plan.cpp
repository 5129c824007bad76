#include "cli/memory_plan.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "model/kv_pool.h"
#include "parallel/tp_model.h"
#include "parallel/tp_source.h"

namespace g4::cli {
namespace {

// Tokenizer tables, thread pool, code and allocator slack: measured on the starter model (peak
// RSS of a one-token `gemma4 run`, 318 MiB, minus its weights, KV and scratch: ~70 MiB; its
// 262k-entry vocabulary dominates) and rounded up.
constexpr uint64_t kRuntimeBytes = 96ull << 20;
// A CUDA context with its kernels, as the CUDA backend makes it, and the prefill GEMMs' fixed
// scratch (cuda_blas.h: bf16 weight chunk, normed input rows, gate/up products, cuBLAS workspace,
// 224 MiB) with cuBLAS's own handle.
constexpr uint64_t kCudaContextBytes = (512ull + 256ull) << 20;

uint64_t full_layer_slots(int64_t context) {
  int64_t cap = 256;
  while (cap < context) cap *= 2;
  return uint64_t(std::max<int64_t>(cap, 256));
}

uint64_t read_u64_file(const char* path, bool* ok) {
  std::ifstream f(path);
  std::string s;
  *ok = bool(f >> s) && s != "max";
  return *ok ? std::stoull(s) : 0;
}

}  // namespace

void PlanInput::place(const BackendOptions& o) {
  ranks = o.tensor_parallel;
  devices = rank_devices(o);
}

uint64_t kv_elements(const ModelConfig& c, int64_t context, bool full_only) {
  uint64_t n = 0;
  for (const LayerSpec& L : c.layers) {
    if (L.kv_source >= 0 || (full_only && L.kind == AttnKind::Sliding)) continue;
    int64_t tokens = L.kind == AttnKind::Sliding && L.window > 0 ? std::min<int64_t>(context, L.window) : context;
    n += uint64_t(tokens) * uint64_t(L.n_kv_heads) * uint64_t(L.head_dim) * 2;  // K and V
  }
  return n;
}

uint64_t paged_kv_bytes(const ModelConfig& c, int64_t context, int parallel, int chunk, int block, int elem_bytes) {
  uint64_t b = 0;
  for (int g = 0; g < KvPool::kGroups; ++g)
    b += uint64_t(KvPool::sequence_blocks(c, KvPool::Group(g), block, context, chunk)) *
         KvPool::block_bytes(c, KvPool::Group(g), block, elem_bytes);
  return b * uint64_t(std::max(1, parallel));
}

uint64_t kv_cache_bytes(const ModelConfig& c, int64_t context, int kv_bits, int kv_group, int chunk, int elem_bytes) {
  uint64_t bytes = 0;
  for (const LayerSpec& L : c.layers) {
    if (L.kv_source >= 0) continue;
    const uint64_t row = uint64_t(L.n_kv_heads) * uint64_t(L.head_dim) * 2;  // K and V elements per slot
    if (L.kind == AttnKind::Sliding && L.window > 0) {
      bytes += uint64_t(L.window + chunk - 1) * row * uint64_t(elem_bytes);
    } else if (kv_bits > 0) {
      const uint64_t e = full_layer_slots(context) * row;
      bytes += e * uint64_t(kv_bits) / 8 + e / uint64_t(std::max(1, kv_group)) * 8;
    } else {
      bytes += full_layer_slots(context) * row * uint64_t(elem_bytes);
    }
  }
  return bytes;
}

uint64_t view_bytes(const WeightView& v) {
  uint64_t n = uint64_t(v.rows) * uint64_t(v.row_bytes);
  if (v.fmt == WFormat::MlxAffine && v.group_size > 0)
    n += 2ull * uint64_t(v.rows) * uint64_t(v.cols / v.group_size) * dtype_size(v.scale_dtype);
  return n;
}

Result<uint64_t> stored_weight_bytes(const ModelConfig& c, const WeightSource& w, const ShardedWeightSource* rank) {
  uint64_t bytes = 0;
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (t.optional && !w.has(t.name)) continue;
    if (!t.matrix) {
      G4_ASSIGN_OR_RETURN(auto v, w.vector(t.name, t.rows));
      (void)v;
      bytes += uint64_t(t.rows) * 4;
      continue;
    }
    if (t.count > 0) {  // routed experts: a rank holds each whole or not at all (0-row views)
      const WeightSource& from = rank ? static_cast<const WeightSource&>(*rank) : w;
      for (int64_t e = 0; e < t.count; ++e) {
        G4_ASSIGN_OR_RETURN(WeightView v, from.stacked_matrix(t.name, e, t.count, t.rows, t.cols));
        bytes += view_bytes(v);
      }
      continue;
    }
    G4_ASSIGN_OR_RETURN(WeightView v, w.matrix(t.name, t.rows, t.cols));
    bytes += rank ? uint64_t(double(view_bytes(v)) * rank->held_fraction(t.name) + 0.5) : view_bytes(v);
  }
  return bytes;
}

static Result<uint64_t> column_shard_bytes(const ModelConfig& c, const WeightSource& w, const ShardedWeightSource& rank) {
  uint64_t bytes = 0;
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (!t.matrix || t.count > 0 || !rank.copies(t.name) || (t.optional && !w.has(t.name))) continue;
    G4_ASSIGN_OR_RETURN(WeightView v, w.matrix(t.name, t.rows, t.cols));
    bytes += view_bytes(v);
  }
  return bytes;
}

MemoryNeed memory_need(const ModelConfig& c, uint64_t weight_bytes, const PlanInput& in, bool on_gpu) {
  MemoryNeed n;
  n.weights = weight_bytes;
  const int elem = in.kv_elem_bytes > 0 ? in.kv_elem_bytes : (on_gpu ? 2 : 4);
  n.kv = in.kv_pool_bytes > 0 ? in.kv_pool_bytes
                               : kv_cache_bytes(c, in.context, in.kv_bits, in.kv_group, in.chunk, elem) *
                                     uint64_t(std::max(1, in.parallel));
  // One step's rows: every sequence's prompt chunk, within the step's row bound. Per row: residual,
  // normed input, q, k, v, attention output, gate, up and the MLP product, in f32; plus one logits
  // row per sequence.
  int q_dim = 0, kv_dim = 0, mlp = 0;
  for (const LayerSpec& L : c.layers) {
    q_dim = std::max(q_dim, c.n_heads * L.head_dim);
    kv_dim = std::max(kv_dim, L.n_kv_heads * L.head_dim);
    mlp = std::max(mlp, L.mlp_width);
  }
  uint64_t rows = uint64_t(std::max(1, in.chunk)) * uint64_t(std::max(1, in.parallel));
  if (in.step_tokens > 0) rows = std::min(rows, uint64_t(std::max(in.step_tokens, in.chunk)));
  // MoE: each routed (row, expert) item's gated hidden row and expert output (the device MoE's scratch).
  const uint64_t moe = uint64_t(c.top_k_experts) * uint64_t(c.moe_width + c.hidden);
  const uint64_t per_row = (uint64_t(3 * c.hidden + 2 * q_dim + 2 * kv_dim + 3 * mlp) + moe) * 4;
  n.scratch = rows * per_row + uint64_t(std::max(1, in.parallel)) * uint64_t(c.vocab) * 4;
  if (!on_gpu && in.ranks > 1) {  // a host group: every rank's caches and scratch in the one memory
    n.kv *= uint64_t(in.ranks);
    n.scratch *= uint64_t(in.ranks);
  }
  n.runtime = kRuntimeBytes + (on_gpu ? kCudaContextBytes : 0);
  n.extra = in.extra_bytes;
  return n;
}

int64_t largest_fitting_context(const ModelConfig& c, uint64_t weight_bytes, PlanInput in, bool on_gpu,
                                uint64_t available) {
  const int64_t top = c.max_positions > 0 ? c.max_positions : int64_t(1) << 20;
  int64_t best = 0;
  for (int64_t lo = 1, hi = top / 256; lo <= hi;) {  // in units of 256 tokens; need grows with context
    const int64_t mid = (lo + hi) / 2;
    in.context = mid * 256;
    if (memory_need(c, weight_bytes, in, on_gpu).total() <= available) {
      best = in.context;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (best > 0 && best + 256 > top) best = top;
  return best;
}

FreeMemory host_free_memory() {
  FreeMemory f;
  std::ifstream mi("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (mi >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      f.bytes = kib * 1024;
      f.source = "MemAvailable in /proc/meminfo";
      break;
    }
  }
  bool has_max = false, has_cur = false;
  const uint64_t max = read_u64_file("/sys/fs/cgroup/memory.max", &has_max);
  const uint64_t cur = read_u64_file("/sys/fs/cgroup/memory.current", &has_cur);
  if (has_max && has_cur && max > cur && max - cur < f.bytes) {
    f.bytes = max - cur;
    f.source = "the cgroup's memory.max minus memory.current";
  }
  return f;
}

Result<FreeMemory> cuda_free_memory(int device) {
  const std::string dev = std::to_string(device);
  // The CUDA runtime's own count and free memory, loaded at run time so that any build can ask.
  for (const char* lib : {"libcudart.so", "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0"}) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    using CountFn = int (*)(int*);
    using SetFn = int (*)(int);
    using MemFn = int (*)(size_t*, size_t*);
    auto count = reinterpret_cast<CountFn>(dlsym(h, "cudaGetDeviceCount"));
    auto set = reinterpret_cast<SetFn>(dlsym(h, "cudaSetDevice"));
    auto mem = reinterpret_cast<MemFn>(dlsym(h, "cudaMemGetInfo"));
    int n = 0;
    if (!count || !set || !mem) continue;
    if (count(&n) != 0 || n == 0) return err("no CUDA device: the CUDA runtime (%s) finds none", lib);
    if (device >= n) return err("no CUDA device %d: this machine has %d (0..%d)", device, n, n - 1);
    size_t free_b = 0, total_b = 0;
    if (set(device) != 0 || mem(&free_b, &total_b) != 0)
      return err("the CUDA runtime (%s) cannot read device %d's memory", lib, device);
    return FreeMemory{free_b, "cudaMemGetInfo on device " + dev + " of " + std::to_string(n)};
  }
  // NVML comes with the driver even where the runtime library is not installed.
  if (void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    struct NvmlMemory { unsigned long long total, free, used; };
    using InitFn = int (*)();
    using CountFn = int (*)(unsigned*);
    using HandleFn = int (*)(unsigned, void**);
    using MemFn = int (*)(void*, NvmlMemory*);
    auto init = reinterpret_cast<InitFn>(dlsym(h, "nvmlInit_v2"));
    auto count = reinterpret_cast<CountFn>(dlsym(h, "nvmlDeviceGetCount_v2"));
    auto handle = reinterpret_cast<HandleFn>(dlsym(h, "nvmlDeviceGetHandleByIndex_v2"));
    auto mem = reinterpret_cast<MemFn>(dlsym(h, "nvmlDeviceGetMemoryInfo"));
    unsigned n = 0;
    void* handle_dev = nullptr;
    NvmlMemory m{};
    if (init && count && handle && mem && init() == 0 && count(&n) == 0) {
      if (n == 0) return err("no CUDA device: NVML finds none");
      if (unsigned(device) >= n) return err("no CUDA device %d: this machine has %u (0..%u)", device, n, n - 1);
      if (handle(unsigned(device), &handle_dev) == 0 && mem(handle_dev, &m) == 0)
        return FreeMemory{m.free, "NVML on device " + dev + " of " + std::to_string(n)};
    }
    return err("no CUDA device: NVML (the NVIDIA driver's library) answers no device memory");
  }
  return err("no CUDA device: neither the CUDA runtime (libcudart) nor the NVIDIA driver (libnvidia-ml) is "
             "installed on this machine");
}

std::string human_bytes(uint64_t b) {
  char s[64];
  if (b >= (1ull << 30)) std::snprintf(s, sizeof s, "%.2f GiB", double(b) / double(1ull << 30));
  else std::snprintf(s, sizeof s, "%.1f MiB", double(b) / double(1ull << 20));
  return s;
}

}  // namespace g4::cli

#include "core/mapped_file.h"
#include "io/model_dir.h"
#include "model/model.h"
#include <filesystem>

namespace g4::cli {

std::string FitReport::summary() const {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "needs %s (weights %s, KV cache %s for %d x %lld tokens, scratch %s, runtime %s%s%s); %s",
                human_bytes(need.total()).c_str(), human_bytes(need.weights).c_str(), human_bytes(need.kv).c_str(),
                input.parallel, (long long)input.context, human_bytes(need.scratch).c_str(),
                human_bytes(need.runtime).c_str(), need.extra ? ", prefix cache " : "",
                need.extra ? human_bytes(need.extra).c_str() : "",
                free_known ? (human_bytes(free.bytes) + " free (" + free.source + ")").c_str()
                           : ("free memory unknown: " + free_error).c_str());
  return buf;
}

Result<FitReport> plan_fit(const std::string& model_path, const std::string& backend, PlanInput in,
                           bool context_given) {
  G4_ASSIGN_OR_RETURN(std::string path, resolve_model_path(model_path));
  // Planning reads the headers only: the files are mapped, never copied, whatever --weights says.
  const WeightResidency residency = weight_residency();
  set_weight_residency(WeightResidency::Mmap);
  Result<OpenedModel> opened = open_model(path);
  set_weight_residency(residency);
  if (!opened) return err("%s", opened.message().c_str());
  OpenedModel om = std::move(opened).value();
  FitReport r;
  r.model = std::filesystem::path(om.path).filename().string();
  r.config = om.config;
  const int64_t maxpos = om.config.max_positions;
  if (in.context == 0) in.context = maxpos > 0 ? maxpos : 8192;
  if (!context_given && maxpos > 0) in.context = std::min(in.context, maxpos);
  if (maxpos > 0 && in.context > maxpos)
    return err("--context %lld: %s holds at most %lld positions (max_position_embeddings)", (long long)in.context,
               r.model.c_str(), (long long)maxpos);
  r.input = in;
  r.on_gpu = backend == "cuda";
  // Tensor parallelism: rank 0 holds the most (heads and MLP columns split evenly, the most
  // vocabulary rows); on GPUs each rank has a device of its own, so its plan is the group's.
  std::shared_ptr<ShardedWeightSource> rank0;
  if (in.ranks > 1) {
    G4_ASSIGN_OR_RETURN(rank0, ShardedWeightSource::make(om.weights, om.config, 0, in.ranks));
    r.config = rank0->config();
  }
  uint64_t wb = 0;
  if (!rank0 || r.on_gpu) {
    G4_ASSIGN_OR_RETURN(wb, stored_weight_bytes(om.config, *om.weights, rank0.get()));
  } else {  // a host group: the checkpoint mapped once, beside the ranks' packed column shards
    G4_ASSIGN_OR_RETURN(uint64_t whole, stored_weight_bytes(om.config, *om.weights));
    G4_ASSIGN_OR_RETURN(uint64_t copies, column_shard_bytes(om.config, *om.weights, *rank0));
    wb = whole + copies;
  }
  r.need = memory_need(r.config, wb, in, r.on_gpu);
  if (r.on_gpu) {
    // The group's tightest GPU (every rank needs about rank 0's plan); ranks sharing a GPU
    // (--devices 0,0) share its memory.
    const std::vector<int> devices = in.devices.empty() ? std::vector<int>{0} : in.devices;  // rank r's GPU
    std::map<int, int> ranks_on;
    for (int d : devices) ++ranks_on[d];
    r.free_known = true;
    bool first = true;
    for (const auto& [d, k] : ranks_on) {
      auto f = cuda_free_memory(d);
      if (!f) {
        r.free_known = false;
        r.free_error = f.message();
        break;
      }
      FreeMemory share = f.value();
      share.bytes /= uint64_t(k);
      if (k > 1) share.source += ", shared by " + std::to_string(k) + " ranks";
      if (first || share.bytes < r.free.bytes) r.free = share;
      first = false;
    }
  } else {
    r.free = host_free_memory();
    r.free_known = r.free.bytes > 0;
    if (!r.free_known) r.free_error = "/proc/meminfo has no MemAvailable";
  }
  if (r.free_known) r.largest_context = largest_fitting_context(r.config, wb, in, r.on_gpu, r.free.bytes);
  return r;
}

void size_auto_kv_pool(FitReport& r, int parallel, int block) {
  PlanInput& in = r.input;
  const int elem = in.kv_elem_bytes > 0 ? in.kv_elem_bytes : (r.on_gpu ? 2 : 4);
  const int chunk = std::max(1, in.chunk);
  const uint64_t all = paged_kv_bytes(r.config, in.context, parallel, chunk, block, elem);
  const uint64_t one = paged_kv_bytes(r.config, in.context, 1, chunk, block, elem);
  const uint64_t rest = r.need.total() - r.need.kv;  // everything but the KV
  in.kv_pool_bytes = all;
  if (r.free_known && rest + all > r.free.bytes) {
    const uint64_t left = r.free.bytes > rest ? r.free.bytes - rest : 0;
    in.kv_pool_bytes = std::max(one, std::min(all, left / 2));
  }
  r.need = memory_need(r.config, r.need.weights, in, r.on_gpu);
}

Status refuse_if_not_fitting(const FitReport& r, const char* context_flag) {
  if (!r.free_known || r.fits()) return Status::ok();
  std::string hint = r.largest_context > 0
                         ? std::string("; the largest context that fits is ") + std::to_string(r.largest_context) +
                               " tokens (" + context_flag + " " + std::to_string(r.largest_context) + ")"
                         : "; not even a 256-token context fits (the sliding-window layers hold window + chunk "
                           "tokens per sequence whatever the context: lower --parallel)";
  return err("%s does not fit this machine: %s%s", r.model.c_str(), r.summary().c_str(), hint.c_str());
}

}  // namespace g4::cli
