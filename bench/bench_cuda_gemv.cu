// Per-kernel decode GEMV benchmark on the GPU (issue 16 item 1): every weight format the int8
// decode path takes, on Gemma 4's real decode shapes (E4B and 31B projections, the 262144-row tied
// head), against the device's measured copy bandwidth.
//
//   build-cuda/bin/bench_cuda_gemv [--filter SUBSTR]... [--quick] [--lanes N] [--rows M] [--stage] [--ahead]
//
// Each case times the GEMV launch alone (the activation row prepared once before; the prepare
// launch is also timed alone per width), then the two launches of a one-row matmul (prepare and
// GEMV: "+prep"); at the gate shapes also gate and up in the one fused launch a decode step makes
// ("+up": two weights' bytes). Launches run as a CUDA graph of back-to-back
// launches, with PDL as a decode step has it, over enough copies of the weight that the graph
// reads at least 4x the L2 size between two reads of one copy: each launch streams its weight
// from DRAM, as it does once per decode step. Printed per case: the weight bytes one launch reads
// (codes and scales), the median time per launch over 7 replays, the rate, and that rate as a
// share of the copy bandwidth (cudaMemcpy device to device, read + write bytes, best of 10).
// Weight bytes are random (the values do not change the work); correctness is the CUDA op tests'
// job (tests/backend/cuda_q8_test.cpp), not this program's. --lanes N times the GEMV alone with N
// lanes per weight row (4, 8, 16, 32) instead of the launch's rule.
// --rows M (2..64: a speculative verify forward's rows) times the GEMV alone over M prepared rows,
// the dp4a GEMV against the int8 MMA GEMV wherever it handles the format (cuda_gemv_mma.h; "*"
// marks the launches the backend's rule gives it), and checks
// that the two give the same bits (exit status 1 if not: the MMA GEMV's contract).
// --stage (one row) also times the GEMV with its blocks' rows staged in shared memory
// (MatArgs::row_fetch kFetchShared; "-" where a block's rows exceed kStageMaxBytes) and checks
// that it gives the same bits (exit status 1 if not). --ahead (one row) likewise times the GEMV
// whose lanes fetch their next unit before dotting the current one (kFetchAhead).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_gemv_mma.h"
#include "backend/cuda/cuda_gemv_q8.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_matmul_common.cuh"
#include "quant/gguf_quant.h"

namespace g4::cuda {
namespace {

#define CK(call)                                                                              \
  do {                                                                                        \
    const cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

__global__ void fill_random(uint32_t* p, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = h;
  }
}

void* dev_random(size_t bytes, uint32_t seed) {
  void* p = nullptr;
  CK(cudaMalloc(&p, bytes + 256));  // slack past the end, as placed weights have
  fill_random<<<1024, 256>>>(static_cast<uint32_t*>(p), (bytes + 256) / 4, seed);
  CK(cudaGetLastError());
  return p;
}

// Bytes a device-to-device copy moves per second (read + write), best of 10 copies of 1 GiB.
double copy_bandwidth(cudaStream_t s) {
  const size_t n = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int i = 0; i < 11; ++i) {
    CK(cudaEventRecord(e0, s));
    CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0) best = std::min(best, ms);
  }
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * double(n) / (double(best) * 1e-3);
}

struct Case {
  std::string shape;
  int64_t rows, cols;
};
struct Format {
  std::string name;
  WFormat fmt;
  int bits = 0, group = 0;
};

int64_t row_bytes(const Format& f, int64_t cols) {
  switch (f.fmt) {
    case WFormat::MlxAffine: return cols * f.bits / 8;
    case WFormat::BF16:
    case WFormat::F16: return cols * 2;
    case WFormat::F32: return cols * 4;
    default: return gguf_row_bytes(f.fmt, cols);
  }
}

// One weight copy on the device and the bytes a GEMV reads from it.
struct DevCopy {
  DevWeight w;
  size_t bytes;
};
DevCopy make_copy(const Format& f, int64_t rows, int64_t cols, uint32_t seed) {
  DevCopy c{};
  c.w.rows = rows;
  c.w.cols = cols;
  c.w.fmt = f.fmt;
  c.w.bits = f.bits;
  c.w.group_size = f.group;
  c.w.row_bytes = row_bytes(f, cols);
  c.w.scale_dtype = DType::BF16;
  c.bytes = size_t(rows * c.w.row_bytes);
  c.w.data = static_cast<const uint8_t*>(dev_random(c.bytes, seed));
  if (f.fmt == WFormat::MlxAffine) {
    const size_t sb = size_t(rows * (cols / f.group)) * 2;
    c.w.scales = dev_random(sb, seed + 1);
    c.w.biases = dev_random(sb, seed + 2);
    c.bytes += 2 * sb;
  }
  return c;
}
void free_copy(DevCopy& c) {
  CK(cudaFree(const_cast<uint8_t*>(c.w.data)));
  if (c.w.scales) CK(cudaFree(const_cast<void*>(c.w.scales)));
  if (c.w.biases) CK(cudaFree(const_cast<void*>(c.w.biases)));
}

// Median seconds per replay of graph g over 7 replays (after one warm-up).
double time_graph(cudaGraphExec_t g, cudaStream_t s) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(g, s));
  std::vector<float> t;
  for (int i = 0; i < 7; ++i) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(g, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return double(t[t.size() / 2]) * 1e-3;
}

// How many of the n bf16 outputs at y and y2 differ (after the work queued on s), NaN equal to NaN
// (random scales make some).
size_t differing_bf16(cudaStream_t s, const void* y, const void* y2, size_t n) {
  std::vector<uint16_t> a(n), b(n);
  CK(cudaMemcpyAsync(a.data(), y, n * 2, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(b.data(), y2, n * 2, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  size_t differ = 0;
  for (size_t k = 0; k < n; ++k) differ += a[k] != b[k] && !((a[k] & 0x7fff) > 0x7f80 && (b[k] & 0x7fff) > 0x7f80);
  return differ;
}

// Captures `launches` calls of enqueue(i) on s into a graph, times it: seconds per call.
template <class Fn>
double time_launches(cudaStream_t s, int launches, Fn&& enqueue) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) enqueue(i);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const double t = time_graph(exec, s) / launches;
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return t;
}

int run(int argc, char** argv) {
  std::vector<std::string> filters;  // a case runs when its "shape format" name holds any of them
  bool quick = false;
  int lanes = 0, rows = 1;
  bool stage = false, ahead = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) filters.push_back(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--lanes") && i + 1 < argc) lanes = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) rows = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--stage")) stage = true;
    else if (!std::strcmp(argv[i], "--ahead")) ahead = true;
    else {
      std::fprintf(stderr, "usage: %s [--filter SUBSTR]... [--quick] [--lanes N] [--rows M] [--stage] [--ahead]\n",
                   argv[0]);
      return 2;
    }
  }
  if (rows < 1 || rows > 64) {
    std::fprintf(stderr, "--rows: expected 1 to 64, got %d\n", rows);
    return 2;
  }
  if (lanes != 0 && lanes != 4 && lanes != 8 && lanes != 16 && lanes != 32) {
    std::fprintf(stderr, "--lanes: expected 4, 8, 16 or 32, got %d\n", lanes);
    return 2;
  }
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_bw = copy_bandwidth(s);
  std::printf("device %s, %d SMs, L2 %d MiB; copy bandwidth %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_bw / 1e9);
  set_pdl_launches(true);

  const std::vector<Case> shapes = {
      {"e4b q 2048x2560", 2048, 2560},        {"e4b kv 512x2560", 512, 2560},
      {"e4b o 2560x2048", 2560, 2048},        {"e4b gate 10240x2560", 10240, 2560},
      {"e4b down 2560x10240", 2560, 10240},   {"31b q 8192x5376", 8192, 5376},
      {"31b kv 4096x5376", 4096, 5376},       {"31b o 5376x8192", 5376, 8192},
      {"31b gate 21504x5376", 21504, 5376},   {"31b down 5376x21504", 5376, 21504},
      {"head 262144x2560", 262144, 2560},     {"head 262144x5376", 262144, 5376},
  };
  std::vector<Format> formats = {
      {"Q4_K", WFormat::GgufQ4_K}, {"Q5_K", WFormat::GgufQ5_K}, {"Q6_K", WFormat::GgufQ6_K},
      {"Q8_0", WFormat::GgufQ8_0}, {"Q4_0", WFormat::GgufQ4_0}, {"Q5_0", WFormat::GgufQ5_0},
  };
  for (int bits : {2, 3, 4, 5, 6, 8}) formats.push_back({"mlx" + std::to_string(bits) + "g64", WFormat::MlxAffine, bits, 64});
  for (int group : {32, 128}) formats.push_back({"mlx4g" + std::to_string(group), WFormat::MlxAffine, 4, group});
  formats.push_back({"bf16", WFormat::BF16});
  formats.push_back({"f16", WFormat::F16});

  // The prepared activation row, once per width.
  void* q8base = nullptr;
  CK(cudaMalloc(&q8base, q8_scratch_bytes()));
  const Q8Act q8 = q8_act_in(q8base);
  void* x = dev_random(size_t(kQ8MaxValues) * 2, 7);  // bf16 bit patterns: rewritten below
  {
    std::vector<uint16_t> hx(static_cast<size_t>(kQ8MaxValues));
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = uint16_t(0x3f80 ^ (i * 37 & 0x807f));  // +-(1..2) values
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  }
  const size_t y_bytes = size_t(262144) * 64 * 4;
  void *y = nullptr, *y2 = nullptr;
  CK(cudaMalloc(&y, y_bytes));
  CK(cudaMalloc(&y2, y_bytes));
  int mismatches = 0;

  if (rows > 1)
    std::printf("%d prepared rows: %-10s %10s %10s %9s %7s %10s\n", rows, "format", "MB read", "dp4a us", "GB/s", "copy%",
                "mma us");
  else
    std::printf("%-24s %-10s %10s %10s %9s %7s %10s%s\n", "shape", "format", "MB read", "gemv us", "GB/s", "copy%",
                "+prep us", (std::string(stage ? "  staged us  copy%" : "") + (ahead ? "   ahead us  copy%" : "")).c_str());
  for (int64_t cols : {int64_t(2560), int64_t(5376), int64_t(10240), int64_t(21504)}) {
    const double t = time_launches(s, 64, [&](int) { q8_prepare(s, x, DType::BF16, 1, cols, nullptr, 0.f, q8); });
    std::printf("%-24s %-10s %10s %10.2f\n", ("prepare " + std::to_string(cols)).c_str(), "bf16 row", "-", t * 1e6);
  }
  const size_t l2 = size_t(prop.l2CacheSize);
  for (const Case& c : shapes) {
    for (const Format& f : formats) {
      const std::string name = c.shape + " " + f.name;
      if (!filters.empty() && std::none_of(filters.begin(), filters.end(), [&](const std::string& f) {
            return name.find(f) != std::string::npos;
          }))
        continue;
      const bool head = c.rows == 262144;
      if (quick && f.fmt == WFormat::MlxAffine && f.bits != 4) continue;
      if (c.cols % 256 && (f.fmt == WFormat::GgufQ4_K || f.fmt == WFormat::GgufQ5_K || f.fmt == WFormat::GgufQ6_K)) continue;
      DevCopy first = make_copy(f, c.rows, c.cols, 1000);
      if (!q8_gemv_supports(first.w)) {
        std::printf("%-24s %-10s not taken by the int8 GEMV\n", c.shape.c_str(), f.name.c_str());
        free_copy(first);
        continue;
      }
      const int copies = int(std::min<size_t>(head ? 2 : 64, std::max<size_t>(1, (4 * l2 + first.bytes - 1) / first.bytes)));
      std::vector<DevCopy> w{first};
      for (int i = 1; i < copies; ++i) w.push_back(make_copy(f, c.rows, c.cols, 1000 + 3 * i));
      const int launches = std::max(copies, head ? 6 : 24);
      if (int64_t(rows) * c.cols > kQ8MaxValues) {
        free_copy(first);
        continue;
      }
      q8_prepare(s, x, DType::BF16, rows, c.cols, nullptr, 0.f, q8);  // the rows the GEMV alone reads
      auto args = [&](int i) {
        MatArgs a{};
        a.x = x;
        a.w[0] = w[size_t(i % copies)].w;
        a.y[0] = y;
        a.n = 1;
        a.q8 = q8;
        a.xt = DType::BF16;
        a.yt = DType::BF16;
        return a;
      };
      // --rows: the dp4a GEMV and the MMA GEMV over the prepared rows, timed, and their outputs compared.
      auto report_rows = [&](const char* suffix, int act, size_t bytes, auto&& act_args) {
        auto on = [&](int i, int mma, void* out) {
          MatArgs a = act_args(i);
          a.mma_rows = uint8_t(mma);
          a.y[0] = out;
          return a;
        };
        const double t = time_launches(s, launches, [&](int i) { q8_gemv_prepared(s, on(i, 0, y), rows, act, lanes); });
        std::string mma = "-";
        if (rows > 1 && q8_mma_handles(on(0, kMmaWherePossible, y2), act)) {
          const int K = kMmaWherePossible;
          const double tm = time_launches(s, launches, [&](int i) { q8_gemv_prepared(s, on(i, K, y2), rows, act, lanes); });
          const size_t n = size_t(rows) * size_t(c.rows);
          q8_gemv_prepared(s, on(0, 0, y), rows, act, lanes);
          q8_gemv_prepared(s, on(0, K, y2), rows, act, lanes);
          const size_t differ = differing_bf16(s, y, y2, n);
          char buf[96];
          const bool rule = q8_mma_takes(on(0, kMmaByRule, y2), rows, act);  // "*": the backend takes it
          std::snprintf(buf, sizeof buf, "%.2f%s%s", tm * 1e6, rule ? "*" : "", differ ? " BITS DIFFER" : "");
          mma = buf;
          if (differ) {
            ++mismatches;
            std::printf("  %zu of %zu outputs differ from the dp4a GEMV's\n", differ, n);
          }
        }
        const double bw = double(bytes) / t;
        std::printf("%-24s %-10s %10.2f %10.2f %9.0f %6.1f%% %10s\n", c.shape.c_str(), (f.name + suffix).c_str(),
                    bytes / 1e6, t * 1e6, bw / 1e9, 100.0 * bw / copy_bw, mma.c_str());
        std::fflush(stdout);
      };
      // --stage / --ahead: the GEMV's time and share of copy bandwidth with the fetch bit `bit`, its
      // output compared bit for bit with the plain launch's ("-" where a staged block's rows do not
      // fit the stage).
      auto time_fetch = [&](int act, uint8_t bit, auto&& plain_args) -> std::string {
        auto staged_args = [&](int i) {
          MatArgs a = plain_args(i);
          a.row_fetch |= bit;
          return a;
        };
        if (bit == kFetchShared && q8_stage_bytes_for(staged_args(0), act, lanes) > kStageMaxBytes) return "          -";
        const double t = time_launches(s, launches, [&](int i) { q8_gemv_prepared(s, staged_args(i), 1, act, lanes); });
        const size_t n = size_t(c.rows);
        MatArgs pa = plain_args(0), sa = staged_args(0);
        pa.y[0] = y;
        sa.y[0] = y2;
        q8_gemv_prepared(s, pa, 1, act, lanes);
        q8_gemv_prepared(s, sa, 1, act, lanes);
        const size_t differ = differing_bf16(s, y, y2, n);
        const double bw = double(weight_bytes(sa)) / t;
        char buf[96];
        std::snprintf(buf, sizeof buf, " %10.2f %6.1f%%%s", t * 1e6, 100.0 * bw / copy_bw, differ ? " BITS DIFFER" : "");
        if (differ) ++mismatches;
        return buf;
      };
      // The GEMV alone, then the prepare launch and the GEMV; at the gate shapes also the fused
      // gate/up launch the decode step runs (two weights a lane, gelu(gate) * up: "+up" rows).
      auto report = [&](const char* suffix, int act, size_t bytes) {
        auto act_args = [&](int i) {
          MatArgs a = args(i);
          if (act != kPlain) a.w2 = w[size_t(i + 1) % w.size()].w;
          a.row_fetch = weight_bytes(a) <= int64_t(l2) ? kFetchL2 : 0;  // a launch alone (CudaBackend::plan_row_fetch)
          return a;
        };
        if (rows > 1) {
          report_rows(suffix, act, bytes, act_args);
          return;
        }
        const double t = time_launches(s, launches, [&](int i) { q8_gemv_prepared(s, act_args(i), 1, act, lanes); });
        const double t2 = time_launches(s, launches, [&](int i) { q8_gemv(s, act_args(i), 1, act); });
        const double bw = double(bytes) / t;
        std::string fetched;
        if (stage) fetched = time_fetch(act, kFetchShared, act_args);
        if (ahead) fetched += time_fetch(act, kFetchAhead, act_args);
        std::printf("%-24s %-10s %10.2f %10.2f %9.0f %6.1f%% %10.2f%s\n", c.shape.c_str(), (f.name + suffix).c_str(),
                    bytes / 1e6, t * 1e6, bw / 1e9, 100.0 * bw / copy_bw, t2 * 1e6, fetched.c_str());
        std::fflush(stdout);
      };
      report("", kPlain, first.bytes);
      if (c.shape.find("gate") != std::string::npos && w.size() > 1) report("+up", kGelu, 2 * first.bytes);
      for (DevCopy& d : w) free_copy(d);
    }
  }
  CK(cudaStreamSynchronize(s));
  if (mismatches) std::printf("%d cases: the MMA, staged or fetch-ahead GEMV's bits differ from the dp4a GEMV's\n", mismatches);
  return mismatches ? 1 : 0;
}

}  // namespace
}  // namespace g4::cuda

int main(int argc, char** argv) { return g4::cuda::run(argc, argv); }
