// What running a model needs in memory, from what can be known before loading it: the stored
// weights, the KV cache (from the model's geometry, as model/kv_cache.h allocates it) and the
// scratch of a forward step; and what this machine has free (host RAM, or VRAM on a CUDA device).
// Used by `gemma4 fit`, and by run and serve to refuse up front what cannot fit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"
#include "backend/backend.h"
#include "io/weight_source.h"

namespace g4 {
class ShardedWeightSource;  // parallel/tp_source.h
}

namespace g4::cli {

struct PlanInput {
  int64_t context = 8192;     // tokens per sequence (prompt + answer)
  int parallel = 1;           // sequences held at once
  int kv_bits = 0;            // 0: unquantized KV cache
  int kv_elem_bytes = 0;      // bytes of an unquantized KV element; 0: the backend's default (cuda: bf16, 2; host: f32, 4)
  int kv_group = 64;
  int chunk = 256;            // prompt tokens per sequence per forward step
  int step_tokens = 0;        // rows per forward step at most (EngineOptions::step_tokens); 0: no bound
  uint64_t extra_bytes = 0;   // e.g. serve's prompt-prefix cache
  uint64_t kv_pool_bytes = 0; // > 0: the KV cache is one pool of this size (serve's paged KV), not per sequence
  // Tensor parallelism (--tensor-parallel, --devices): the plan is of one rank (rank 0, the one
  // holding the most) on each GPU of the group. devices: rank r's GPU (empty: GPU 0).
  int ranks = 1;
  std::vector<int> devices;
  // The group (or single GPU) a model load with these options makes (parallel/tp_model.h
  // rank_devices).
  void place(const BackendOptions& o);
};

struct MemoryNeed {
  uint64_t weights = 0;   // stored tensors (as read from the files)
  uint64_t kv = 0;        // all sequences' KV caches at the full context
  uint64_t scratch = 0;   // activations and logits of one forward step
  uint64_t runtime = 0;   // tokenizer, thread pool, code: a fixed estimate; + the CUDA context on a GPU
  uint64_t extra = 0;     // PlanInput::extra_bytes
  uint64_t total() const { return weights + kv + scratch + runtime + extra; }
};

// K+V elements one sequence caches for `context` tokens (only layers that own a cache; sliding
// layers keep at most their window). full_only: the full-attention layers alone.
uint64_t kv_elements(const ModelConfig& c, int64_t context, bool full_only = false);
// One sequence's KV-cache bytes as model/kv_cache.h allocates them for `context` tokens: full
// layers grown by doubling from 256 slots, sliding layers window + chunk - 1 slots; with
// --kv-bits the full layers' codes plus an f32 scale and bias per group.
uint64_t kv_cache_bytes(const ModelConfig& c, int64_t context, int kv_bits, int kv_group, int chunk,
                        int elem_bytes = 4);
// A paged KV pool (model/kv_pool.h) holding `parallel` sequences of `context` tokens at once,
// fed `chunk` prompt rows a step, in blocks of `block` positions of elem_bytes elements.
uint64_t paged_kv_bytes(const ModelConfig& c, int64_t context, int parallel, int chunk, int block, int elem_bytes);
// Bytes the stored tensors of the model take (packed matrices with their scales, vectors). With
// `rank`: the bytes that tensor-parallel rank holds (its share of each split matrix, its routed
// experts, every replicated tensor whole), from the checkpoint's views without reading a shard.
Result<uint64_t> stored_weight_bytes(const ModelConfig& c, const WeightSource& w,
                                     const ShardedWeightSource* rank = nullptr);
// Bytes one view occupies in the file (packed data + MLX scales/biases).
uint64_t view_bytes(const WeightView& v);

MemoryNeed memory_need(const ModelConfig& c, uint64_t weight_bytes, const PlanInput& in, bool on_gpu);
// The largest context (a multiple of 256, at most the model's positions) whose need fits in
// `available` bytes; 0 when not even 256 tokens fit.
int64_t largest_fitting_context(const ModelConfig& c, uint64_t weight_bytes, PlanInput in, bool on_gpu,
                                uint64_t available);

struct FreeMemory {
  uint64_t bytes = 0;
  std::string source;  // where the number comes from ("MemAvailable", "cgroup memory.max", "NVIDIA H200")
};
// Host memory this process can still use: /proc/meminfo's MemAvailable, or the cgroup's limit
// minus its use when that is smaller.
FreeMemory host_free_memory();
// Free memory of CUDA device `device`, through the CUDA runtime (libcudart, loaded when present)
// or NVML; the error says why there is none (no CUDA library, no such CUDA device).
Result<FreeMemory> cuda_free_memory(int device = 0);

// "1.23 GiB" / "456.7 MiB".
std::string human_bytes(uint64_t b);

}  // namespace g4::cli

namespace g4::cli {

// The plan of one model on one backend: what it needs and what the machine has.
struct FitReport {
  std::string model;          // display name
  ModelConfig config;         // the model's, or rank 0's under tensor parallelism (PlanInput::ranks)
  PlanInput input;
  bool on_gpu = false;
  MemoryNeed need;
  bool free_known = false;    // false: no CUDA device (free_error says why)
  FreeMemory free;
  std::string free_error;
  int64_t largest_context = 0;  // that fits the free memory (0: none, or unknown)
  bool fits() const { return free_known && need.total() <= free.bytes; }
  // "needs 1.2 GiB (weights ..., KV cache ... for P x C tokens, scratch ..., runtime ...); 3.4 GiB free (SOURCE)"
  std::string summary() const;
};

// Opens `model_path` ("" : the starter model) without loading its weights and plans `in` on
// `backend` (cuda: device memory; anything else: host memory). in.context 0: the model's positions.
// A context beyond the model's positions is an error naming both when `context_given`, else
// lowered to them.
Result<FitReport> plan_fit(const std::string& model_path, const std::string& backend, PlanInput in,
                           bool context_given = true);

// For run and serve: an error with the numbers and the largest context that fits when the plan
// does not fit the machine; ok when it fits or when the free memory cannot be known.
Status refuse_if_not_fitting(const FitReport& r, const char* context_flag);
// serve's `--kv-pool-mb auto` on a paged engine: a pool holding `parallel` sequences at r's full
// context when that fits the free memory; else half of what the weights, scratch and runtime leave
// free (the rest keeps bf16 weight copies), and at least one sequence's worth. Sets
// r.input.kv_pool_bytes and r.need.
void size_auto_kv_pool(FitReport& r, int parallel, int block);

}  // namespace g4::cli
