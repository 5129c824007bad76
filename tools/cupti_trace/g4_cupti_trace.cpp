// A kernel trace of any CUDA program, loaded with LD_PRELOAD, for GPU machines without Nsight
// Systems (the lent machines' image has no nsys). CUPTI's activity API records every kernel with
// its start and end on the device, kernels replayed inside CUDA graphs one by one (each node is a
// record), so the trace shows how a decode step's kernels overlap and wait inside its graph.
//
//   G4_CUPTI_TRACE=trace.csv LD_PRELOAD=libg4_cupti_trace.so gemma4 bench ...
//
// writes, when the program exits, one row per kernel in the columns `nsys stats -r cuda_gpu_trace
// -f csv` uses ("Start (ns)", "Duration (ns)", "Name": the demangled name), sorted by start, so
// tools/cuda_step_trace.py reads either. Build: tools/cupti_trace/build.sh (CUPTI from the pinned
// nvidia-cuda-cupti wheel). Written by hand: CUPTI is NVIDIA's only interface to these records.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Kernel {
  uint64_t start, end;
  std::string name;
};

std::mutex mu;
std::vector<Kernel> kernels;
const char* out_path = nullptr;
constexpr size_t kBufferBytes = size_t(8) << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "g4_cupti_trace: %s: %s\n", what, s ? s : "unknown error");
}

std::string demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<Kernel> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (k->start == 0 && k->end == 0) continue;  // no timestamps collected
    got.push_back({k->start, k->end, demangle(k->name)});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(mu);
  kernels.insert(kernels.end(), got.begin(), got.end());
}

void write_trace() {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(mu);
  std::sort(kernels.begin(), kernels.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
  FILE* f = std::fopen(out_path, "w");
  if (!f) {
    std::fprintf(stderr, "g4_cupti_trace: cannot write %s\n", out_path);
    return;
  }
  std::fprintf(f, "Start (ns),Duration (ns),Name\n");
  for (const Kernel& k : kernels) {
    std::string q;  // CSV: the name quoted, quotes doubled
    for (char c : k.name) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    std::fprintf(f, "%llu,%llu,\"%s\"\n", static_cast<unsigned long long>(k.start),
                 static_cast<unsigned long long>(k.end - k.start), q.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "g4_cupti_trace: %zu kernels written to %s\n", kernels.size(), out_path);
}

// Before main (and before the program's first CUDA call): enable the kernel records.
__attribute__((constructor)) void start() {
  out_path = std::getenv("G4_CUPTI_TRACE");
  if (!out_path || !*out_path) {
    std::fprintf(stderr, "g4_cupti_trace: G4_CUPTI_TRACE (the CSV to write) is not set; not tracing\n");
    return;
  }
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  std::atexit(write_trace);
}

}  // namespace
