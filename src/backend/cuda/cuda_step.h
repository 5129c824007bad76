// Recording of one forward step's device work, replayed as a CUDA graph when the same step comes
// again (decode: every token runs the same kernels on the same buffers, only positions differ).
//
// Contract (backend.h begin_step/end_step): between begin() and end() the backend does not
// launch; each op adds a launch closure and the words that identify it (its key: the backend
// derives them from the launch's name and every argument the closure passes to its launcher,
// cuda_backend.h launch()), and takes its per-step scalars (positions) through dyn() and its
// per-step tables (a batch's sequences: caches, positions) through dyn_bytes(). Both live in a
// pinned host area that is copied to the device as the step's first node, so kernels read them
// through device pointers and a graph recorded at one position (or for other sequences of the same
// shape) replays at any other.
// Host data for from_host is staged in pinned memory at offsets fixed by the op order, copied to
// a device mirror by the step's second node, and from there to each destination by a kernel
// (cuda::copy_bytes) at the op's place: a graph's only copy nodes are those two, between buffers
// the recorder owns, so no graph keeps a reference to memory freed while it lives. end() then:
//   - replays the graph recorded for this key (the common decode case), or
//   - captures the closures into a new graph when this key was seen before (a one-off
//     step, e.g. a prefill, is never captured) and there is room for one, or
//   - runs the closures directly on the stream.
// With graphs off (BackendOptions::graphs, `--cuda-graphs off`) every step runs directly (A/B
// measurements).
// flush() runs what was logged so far directly and leaves step mode (to_host inside a step,
// a staging overflow). Nothing of a step may be freed before the step's work finished (callers
// free buffers only outside steps; the allocator's frees wait for the device).
// Two sets of scalar and staging areas take steps in turn, so a step can be logged while the one
// before it still runs: begin() waits only for the last step that used the same set (the one two
// steps back), and a graph is recorded per set.
// At most kMaxGraphs (cuda_step.cu) graphs are recorded, and none is destroyed before the
// recorder: past that, a step of a new key runs directly.
// Debug switch (docs/cuda-notes.md): G4_CUDA_GRAPH_DEBUG=N holds up to N recorded graphs
// (default 64) and prints the counts to stderr when the recorder ends.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

// N of G4_CUDA_GRAPH_DEBUG, or 0 when unset.
int graph_debug();

class StepRecorder {
 public:
  StepRecorder(cudaStream_t stream, bool graphs);
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  bool active() const { return active_; }
  // Whether steps may be replayed as graphs (else every step runs directly).
  bool graphs() const { return graphs_enabled_; }
  void begin();
  void end();
  void flush();

  // In a step: records `value` as the step's next scalar and returns its device slot (value 0, so
  // that the Dyn's bytes are the same at every position); outside one: the value itself.
  Dyn dyn(int value);
  // In a step: copies n bytes into the step's scalar area and returns their device address (16-byte
  // aligned; the size joins the key, the bytes do not); null outside a step or when the area is
  // full (the step was flushed: the caller uploads the bytes itself).
  const void* dyn_bytes(const void* src, size_t n);
  // Appends an identifying word to the step's key.
  void key(uint64_t word) { key_.push_back(word); }
  // Adds one op's launch (run with the step's stream, in order, when the step ends).
  void add(std::function<void(cudaStream_t)> launch) { ops_.push_back(std::move(launch)); }
  // Copies n bytes of host data into the step's pinned staging area and logs the copy to dst.
  // Returns false (nothing logged) when the staging area is full: the caller flushes and copies
  // directly.
  bool stage_copy(const void* src, size_t n, void* dst);

  // Steps replayed from a graph / captured into one / run directly (for tests and benches).
  struct Counts {
    long replayed = 0, captured = 0, direct = 0;
  };
  Counts counts() const { return counts_; }

 private:
  struct Graph {
    std::vector<uint64_t> key;
    uint64_t hash = 0;  // of key (a quick first test)
    cudaGraphExec_t exec = nullptr;
  };
  void run_direct();
  void reset();
  uint64_t hash() const;

  cudaStream_t stream_;
  bool graphs_enabled_ = true;
  size_t max_graphs_;
  bool active_ = false;
  std::vector<std::function<void(cudaStream_t)>> ops_;
  std::vector<uint64_t> key_;
  // One set of pinned scalars and tables (host) and their device copy, and pinned staging for
  // from_host data; `done` marks the end of the last step that used them.
  struct Area {
    uint8_t* dyn_host = nullptr;
    uint8_t* dyn_dev = nullptr;
    uint8_t* stage = nullptr;
    uint8_t* stage_dev = nullptr;
    cudaEvent_t done = nullptr;
    bool used = false;  // done has been recorded
  };
  void ran();  // marks the current area's step as queued
  Area areas_[2];
  int cur_ = 0;  // the area of the step being logged
  const Area& area() const { return areas_[cur_]; }
  size_t dyn_used_ = 0;
  size_t stage_used_ = 0;
  std::unordered_map<uint64_t, int> seen_;  // key hash -> steps seen (capture on the 2nd)
  std::list<Graph> graphs_;                 // most recently used first (found sooner)
  Counts counts_;
};

}  // namespace g4::cuda
