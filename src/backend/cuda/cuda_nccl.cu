// NCCL communicators (parallel/nccl_communicator.h) and the CUDA backend's collective launchers
// (cuda_collectives.h). libnccl.so.2 is opened with dlopen at the first group, so binaries run
// where it is missing (only a GPU group then fails, with a message that says where to put it).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_collectives.h"
#include "backend/cuda/cuda_device.h"
#include "parallel/nccl_communicator.h"

namespace g4 {
namespace {

// The entry points this file calls, resolved once.
struct NcclLib {
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  int version = 0;
};

// The loaded library, or null with *why.
const NcclLib* nccl_lib(std::string* why) {
  static std::once_flag once;
  static NcclLib lib;
  static std::string failure;
  std::call_once(once, [] {
    void* h = nullptr;
    for (const char* name : {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2"})
      if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (!h) {
      failure = "libnccl.so.2 not found (it comes with the CUDA toolkit, or with pip's nvidia-nccl-cu13: put "
                "the directory that holds it on LD_LIBRARY_PATH)";
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      return fn != nullptr;
    };
    if (!sym(lib.get_version, "ncclGetVersion") || !sym(lib.comm_init_all, "ncclCommInitAll") ||
        !sym(lib.comm_destroy, "ncclCommDestroy") || !sym(lib.all_reduce, "ncclAllReduce") ||
        !sym(lib.all_gather, "ncclAllGather") || !sym(lib.error_string, "ncclGetErrorString")) {
      failure = "libnccl.so.2 lacks an entry point this build calls";
      return;
    }
    lib.get_version(&lib.version);
  });
  if (!failure.empty()) {
    if (why) *why = failure;
    return nullptr;
  }
  return &lib;
}

ncclDataType_t nccl_type(DType t, const char* what) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    default: break;
  }
  std::fprintf(stderr, "nccl %s: dtype %s cannot be summed\n", what, std::string(dtype_name(t)).c_str());
  std::abort();
}

// One rank of a group: its GPU, its NCCL communicator, and a stream and word of its own for the
// blocking collectives and the barrier.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclLib& lib, ncclComm_t comm, int rank, int size, int device)
      : lib_(lib), comm_(comm), rank_(rank), size_(size), device_(device) {
    G4_CUDA(cudaSetDevice(device_));
    G4_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    G4_CUDA(cudaMalloc(&word_, 4));
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    lib_.comm_destroy(comm_);
    cudaFree(word_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool on_device() const override { return true; }

  void all_reduce_sum(void* data, size_t count, DType dtype) override {
    all_reduce_sum_on(stream_, data, count, dtype);
    G4_CUDA(cudaStreamSynchronize(stream_));
  }
  void all_gather(const void* send, size_t count, DType dtype, void* recv) override {
    all_gather_on(stream_, send, count, dtype, recv);
    G4_CUDA(cudaStreamSynchronize(stream_));
  }
  void barrier() override {
    all_reduce_sum_on(stream_, word_, 1, DType::F32);
    G4_CUDA(cudaStreamSynchronize(stream_));
  }
  void all_reduce_sum_on(void* stream, void* data, size_t count, DType dtype) override {
    if (!count) return;
    G4_CUDA(cudaSetDevice(device_));
    check(lib_.all_reduce(data, data, count, nccl_type(dtype, "all_reduce_sum"), ncclSum, comm_,
                          static_cast<cudaStream_t>(stream)),
          "ncclAllReduce");
  }
  void all_gather_on(void* stream, const void* send, size_t count, DType dtype, void* recv) override {
    const size_t bytes = count * dtype_size(dtype);
    G4_CHECK(dtype_size(dtype) > 0 && "NcclCommunicator::all_gather: a dtype without an element size");
    if (!bytes) return;
    G4_CUDA(cudaSetDevice(device_));
    check(lib_.all_gather(send, recv, bytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)), "ncclAllGather");
  }

 private:
  void check(ncclResult_t r, const char* what) const {
    if (r == ncclSuccess) return;
    std::fprintf(stderr, "%s (rank %d of %d, GPU %d): %s\n", what, rank_, size_, device_, lib_.error_string(r));
    std::abort();
  }

  const NcclLib& lib_;
  ncclComm_t comm_;
  int rank_, size_, device_;
  cudaStream_t stream_ = nullptr;
  void* word_ = nullptr;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<int>& devices) {
  if (devices.empty()) return err("NCCL group: no GPU given");
  std::set<int> seen;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return err("NCCL group: no usable CUDA device");
  for (int d : devices) {
    if (d < 0 || d >= count)
      return err("NCCL group: --devices names GPU %d, and this machine has %d CUDA device%s (0..%d)", d, count,
                 count == 1 ? "" : "s", count - 1);
    if (!seen.insert(d).second)
      return err("NCCL group: GPU %d is listed twice; NCCL takes one GPU per rank (ranks that share a GPU "
                 "exchange through the host: --collectives host)", d);
  }
  std::string why;
  const NcclLib* lib = nccl_lib(&why);
  if (!lib) return err("NCCL group: %s", why.c_str());
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink multicast off unless the environment says otherwise
  std::vector<ncclComm_t> comms(devices.size());
  int prev = 0;
  cudaGetDevice(&prev);
  const ncclResult_t r = lib->comm_init_all(comms.data(), int(devices.size()), devices.data());
  cudaSetDevice(prev);
  if (r != ncclSuccess) return err("NCCL group over %zu GPUs: ncclCommInitAll: %s", devices.size(), lib->error_string(r));
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < devices.size(); ++i)
    out.push_back(std::make_unique<NcclCommunicator>(*lib, comms[i], int(i), int(devices.size()), devices[i]));
  cudaSetDevice(prev);
  return Result<std::vector<std::unique_ptr<Communicator>>>(std::move(out));
}

namespace cuda {

void collective_all_reduce(cudaStream_t s, Communicator* c, void* data, size_t n, DType t) {
  c->all_reduce_sum_on(s, data, n, t);
}
void collective_all_gather(cudaStream_t s, Communicator* c, const void* send, size_t n, DType t, void* recv) {
  c->all_gather_on(s, send, n, t, recv);
}
void place_cols(cudaStream_t s, const void* src, int rows, int n, void* dst, int dst_dim, int off, size_t es) {
  if (rows <= 0 || n <= 0) return;
  G4_CUDA(cudaMemcpy2DAsync(static_cast<uint8_t*>(dst) + size_t(off) * es, size_t(dst_dim) * es, src, size_t(n) * es,
                            size_t(n) * es, size_t(rows), cudaMemcpyDeviceToDevice, s));
}

}  // namespace cuda
}  // namespace g4
