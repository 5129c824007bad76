// StepRecorder (cuda_step.h): logs a step's launches and replays them as CUDA graphs.
#include "backend/cuda/cuda_step.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace g4::cuda {
namespace {

constexpr size_t kDynBytes = size_t(2) << 20;   // scalars and tables per step
// Staged from_host bytes per step: token ids, gather indices, and the grammar masks of up to 256
// constrained rows at a 262144-token vocabulary (32 KiB each).
constexpr size_t kStageBytes = size_t(9) << 20;
// Recorded graphs held; past it a step of a new key runs directly. None is destroyed while the
// recorder lives: destroying executable graphs recorded with PDL launches made the driver fault in
// a later cuGraphLaunch (docs/cuda-log/stops-40-49.md, stop 41). Decode keys are few (a row bucket each,
// Model::set_decode_padding); the rest is room for prefill shapes that recur.
constexpr size_t kMaxGraphs = 64;
constexpr size_t kMaxSeen = 4096;             // remembered one-off keys before forgetting

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "cuda_step: CUDA error in %s: %s\n", what, cudaGetErrorString(e));
  std::abort();
}

}  // namespace

int graph_debug() {
  static const int n = [] {
    const char* e = std::getenv("G4_CUDA_GRAPH_DEBUG");
    return e ? std::max(0, std::atoi(e)) : 0;
  }();
  return n;
}

StepRecorder::StepRecorder(cudaStream_t stream, bool graphs)
    : stream_(stream), graphs_enabled_(graphs), max_graphs_(graph_debug() > 0 ? size_t(graph_debug()) : kMaxGraphs) {
  for (Area& a : areas_) {
    check(cudaMallocHost(&a.dyn_host, kDynBytes), "cudaMallocHost(scalars)");
    check(cudaMalloc(&a.dyn_dev, kDynBytes), "cudaMalloc(scalars)");
    check(cudaMallocHost(&a.stage, kStageBytes), "cudaMallocHost(staging)");
    check(cudaMalloc(&a.stage_dev, kStageBytes), "cudaMalloc(staging)");
    check(cudaEventCreateWithFlags(&a.done, cudaEventDisableTiming), "cudaEventCreate(step area)");
  }
}

StepRecorder::~StepRecorder() {
  cudaStreamSynchronize(stream_);
  if (graph_debug() > 0)
    std::fprintf(stderr, "cuda_step: %ld replayed, %ld captured, %ld direct (graphs held: %zu of %zu)\n",
                 counts_.replayed, counts_.captured, counts_.direct, graphs_.size(), max_graphs_);
  for (Graph& g : graphs_) cudaGraphExecDestroy(g.exec);
  for (Area& a : areas_) {
    cudaFreeHost(a.dyn_host);
    cudaFree(a.dyn_dev);
    cudaFreeHost(a.stage);
    cudaFree(a.stage_dev);
    cudaEventDestroy(a.done);
  }
}

void StepRecorder::reset() {
  ops_.clear();
  key_.clear();
  dyn_used_ = 0;
  stage_used_ = 0;
}

void StepRecorder::begin() {
  if (active_) flush();
  // The other area's step may still run; the last step that read this area's pinned scalars and
  // staging must have finished before they are written again.
  cur_ ^= 1;
  Area& a = areas_[cur_];
  if (a.used) check(cudaEventSynchronize(a.done), "cudaEventSynchronize(begin step)");
  reset();
  key(0xA4EA0000ull + uint64_t(cur_));  // a graph copies from one area's addresses
  active_ = true;
}

void StepRecorder::ran() {
  check(cudaEventRecord(areas_[cur_].done, stream_), "cudaEventRecord(step area)");
  areas_[cur_].used = true;
}

Dyn StepRecorder::dyn(int value) {
  if (!active_) return Dyn{nullptr, value};
  if (dyn_used_ + sizeof(int32_t) > kDynBytes) {
    flush();
    return Dyn{nullptr, value};
  }
  std::memcpy(area().dyn_host + dyn_used_, &value, sizeof(int32_t));
  Dyn d{};  // value-initialized: a Dyn's bytes are part of the step's key
  d.ptr = reinterpret_cast<const int32_t*>(area().dyn_dev + dyn_used_);
  dyn_used_ += sizeof(int32_t);
  return d;
}

const void* StepRecorder::dyn_bytes(const void* src, size_t n) {
  if (!active_) return nullptr;
  const size_t at = (dyn_used_ + 15) & ~size_t(15);
  if (at + n > kDynBytes) {
    flush();
    return nullptr;
  }
  std::memcpy(area().dyn_host + at, src, n);
  dyn_used_ = at + n;
  key(0xD7B7E500ull);
  key(uint64_t(n));
  return area().dyn_dev + at;
}

bool StepRecorder::stage_copy(const void* src, size_t n, void* dst) {
  if (!active_ || stage_used_ + n > kStageBytes) return false;
  uint8_t* at = area().stage + stage_used_;
  std::memcpy(at, src, n);
  stage_used_ += (n + 15) & ~size_t(15);
  for (uint64_t w : {uint64_t(0x57A6E000ull), uint64_t(reinterpret_cast<uintptr_t>(dst)), uint64_t(at - area().stage),
                     uint64_t(n)})
    key(w);
  const uint8_t* from = area().stage_dev + (at - area().stage);
  add([=](cudaStream_t s) {
    copy_bytes(s, from, n, dst);
    check(cudaGetLastError(), "staged copy");
  });
  return true;
}

void StepRecorder::run_direct() {
  if (dyn_used_ > 0)
    check(cudaMemcpyAsync(area().dyn_dev, area().dyn_host, dyn_used_, cudaMemcpyHostToDevice, stream_), "scalar copy");
  if (stage_used_ > 0)
    check(cudaMemcpyAsync(area().stage_dev, area().stage, stage_used_, cudaMemcpyHostToDevice, stream_), "staging copy");
  for (auto& op : ops_) op(stream_);
}

void StepRecorder::flush() {
  if (!active_) return;
  active_ = false;
  run_direct();
  ran();
  ++counts_.direct;
  reset();
}

uint64_t StepRecorder::hash() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
  for (uint64_t w : key_) h = (h ^ w) * 1099511628211ull;
  return h ^ uint64_t(dyn_used_);
}

void StepRecorder::end() {
  if (!active_) return;
  active_ = false;
  const uint64_t h = hash();
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
    if (it->hash != h || it->key != key_) continue;
    graphs_.splice(graphs_.begin(), graphs_, it);
    check(cudaGraphLaunch(graphs_.front().exec, stream_), "cudaGraphLaunch");
    ran();
    ++counts_.replayed;
    reset();
    return;
  }
  if (seen_.size() > kMaxSeen) seen_.clear();
  // First sighting (a step that may never come again), or no room for another graph: run directly.
  if (!graphs_enabled_ || ++seen_[h] < 2 || graphs_.size() >= max_graphs_) {
    run_direct();
    ran();
    ++counts_.direct;
    reset();
    return;
  }
  cudaGraph_t g = nullptr;
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  run_direct();
  check(cudaStreamEndCapture(stream_, &g), "cudaStreamEndCapture");
  Graph rec;
  rec.key = key_;
  rec.hash = h;
  check(cudaGraphInstantiate(&rec.exec, g, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(g);
  check(cudaGraphLaunch(rec.exec, stream_), "cudaGraphLaunch");
  ran();
  graphs_.push_front(std::move(rec));
  ++counts_.captured;
  reset();
}

}  // namespace g4::cuda
