// Per-step device tables of the CUDA backend's attention launches (the CudaBackend files only): the
// sequence table a batched attention / attn_prep launch reads (cuda::SeqTable), and the image-block
// arrays (AttnSeq::blocks) uploaded once per host array and step.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_alloc.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_step.h"

namespace g4::cuda {

// Rows of a batch of sequences (the sum of their n).
int batch_rows(const std::vector<AttnSeq>& seqs);

class SeqTables {
 public:
  // upload_i32(host, count, dev): copies count int32 from host to the device array dev the way
  // the backend writes host data (staged with a step being recorded, else at once).
  using UploadI32 = std::function<void(const int32_t* host, size_t count, int32_t* dev)>;
  SeqTables(StepRecorder& rec, DeviceAllocator& mem, UploadI32 upload)
      : rec_(rec), mem_(mem), upload_(std::move(upload)) {}

  // The device table of a launch over seqs: staged with the step (its bytes are not part of the
  // key), or uploaded outside one. A table equal to the step's previous one (attention after
  // attn_prep over the same sequences) is reused.
  SeqTable table(const std::vector<AttnSeq>& seqs);
  // A sequence's image blocks (n pairs) on the device, uploaded once per host array and step
  // (every layer's attention passes the same array).
  const int32_t* blocks(const int32_t* host, int n);
  // A step begins: its first table is staged anew.
  void begin_step() { last_table_.clear(); }
  // A step's launches are logged: its block arrays are forgotten (the next step's may reuse the
  // host addresses) and freed once its work is done.
  void end_step();

 private:
  StepRecorder& rec_;
  DeviceAllocator& mem_;
  UploadI32 upload_;
  std::vector<std::pair<const int32_t*, int32_t*>> blocks_;  // this step's block arrays
  std::vector<uint8_t> last_table_;  // the step's last staged table and its device address
  const uint8_t* last_table_dev_ = nullptr;
};

}  // namespace g4::cuda
