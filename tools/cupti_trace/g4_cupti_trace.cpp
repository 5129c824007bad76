// A kernel trace of any CUDA program, loaded with LD_PRELOAD, for GPU machines without Nsight
// Systems (the lent machines' image has no nsys). CUPTI's activity API records every kernel with
// its start and end on the device, kernels replayed inside CUDA graphs one by one (each node is a
// record), so the trace shows how a decode step's kernels overlap and wait inside its graph.
//
//   G4_CUPTI_TRACE=trace.csv LD_PRELOAD=libg4_cupti_trace.so gemma4 bench ...
//
// writes one row per kernel in the columns `nsys stats -r cuda_gpu_trace -f csv` uses ("Start
// (ns)", "Duration (ns)", "Name": the demangled name), so tools/cuda_step_trace.py reads either.
// Build: tools/cupti_trace/build.sh (CUPTI from the pinned nvidia-cuda-cupti wheel). Written by
// hand: CUPTI is NVIDIA's only interface to these records.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

std::mutex mu;
const char* path = nullptr;  // G4_CUPTI_TRACE
FILE* out = nullptr;         // the CSV, opened at the first kernel record (see start())
size_t written = 0;
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

// CUPTI hands a buffer back when it is full, at a flush, or when its context is destroyed (the
// program's CUDA teardown at exit comes before this library's atexit handler): its kernel
// records go to the file at once, in the order they come (the summarizer sorts them by start).
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (path && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (k->start == 0 && k->end == 0) continue;  // no timestamps collected
    if (!out) {
      out = std::fopen(path, "w");
      if (!out) {
        std::fprintf(stderr, "g4_cupti_trace: cannot write %s; not tracing\n", path);
        path = nullptr;
        break;
      }
      std::fprintf(out, "Start (ns),Duration (ns),Name\n");
    }
    std::string q;  // CSV: the name quoted, quotes doubled
    for (char c : demangle(k->name)) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    std::fprintf(out, "%llu,%llu,\"%s\"\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end - k->start), q.c_str());
    ++written;
  }
  if (out) std::fflush(out);
  std::free(buffer);
}

void finish() {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(mu);
  if (!out) return;
  const long bytes = std::ftell(out);
  const int failed = std::fclose(out);
  out = nullptr;
  std::fprintf(stderr, "g4_cupti_trace: %zu kernels written to %s (process %d, %ld bytes%s)\n", written, path,
               int(getpid()), bytes, failed ? ", closing it failed" : "");
}

// Before main (and before the program's first CUDA call): kernel records enabled. The file is
// opened (and truncated) only when the first kernel record arrives, so that a process that runs no
// kernel (a wrapper such as `timeout` that LD_PRELOAD also reaches) leaves it alone.
__attribute__((constructor)) void start() {
  path = std::getenv("G4_CUPTI_TRACE");
  if (!path || !*path) {
    std::fprintf(stderr, "g4_cupti_trace: G4_CUPTI_TRACE (the CSV to write) is not set; not tracing\n");
    path = nullptr;
    return;
  }
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  std::atexit(finish);
}

}  // namespace
