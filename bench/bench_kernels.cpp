// Kernel benchmarks (Google Benchmark): matmul_fast on MLX-affine / GGUF / float weights for decode (M=1)
// and prefill (M=64) shapes, and the thread pool's per-region overhead.
// Threads: G4_THREADS (default 2 here, the CI machine's core count). Counters: GB/s of weight
// bytes streamed (the decode bound) and GFLOP/s (2*M*rows*cols per call).
//   build-x/bin/bench_kernels --benchmark_filter=Mlx4
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/matmul.h"

namespace g4 {
namespace {

uint64_t next(uint64_t& s) {  // xorshift64*: fast fill for big matrices
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * 2685821657736338717ull;
}

struct Matrix {
  std::vector<uint8_t> data, scales, biases;
  WeightView view;
  int64_t weight_bytes() const { return int64_t(data.size() + scales.size() + biases.size()); }
};

Matrix make_matrix(WFormat f, int64_t rows, int64_t cols, int bits = 4, int group = 64) {
  Matrix m;
  uint64_t s = 0x9E3779B97F4A7C15ull;
  WeightView& v = m.view;
  v.fmt = f;
  v.rows = rows;
  v.cols = cols;
  if (f == WFormat::MlxAffine) {
    v.row_bytes = cols * bits / 8;
    m.data.resize(size_t(rows * v.row_bytes));
    for (size_t i = 0; i + 8 <= m.data.size(); i += 8) {
      uint64_t r = next(s);
      std::memcpy(&m.data[i], &r, 8);
    }
    const size_t ng = size_t(rows * (cols / group));
    m.scales.resize(ng * 2);
    m.biases.resize(ng * 2);
    for (size_t i = 0; i < ng; ++i) {
      uint16_t sc = f32_to_bf16(0.01f * float(int(next(s) % 200) - 100) / 100.f);
      uint16_t bi = f32_to_bf16(float(int(next(s) % 200) - 100) / 100.f);
      std::memcpy(&m.scales[2 * i], &sc, 2);
      std::memcpy(&m.biases[2 * i], &bi, 2);
    }
    v.bits = bits;
    v.group_size = group;
    v.scales = m.scales.data();
    v.biases = m.biases.data();
    v.scale_dtype = DType::BF16;
  } else if (f == WFormat::GgufQ4_K || f == WFormat::GgufQ6_K || f == WFormat::GgufQ8_0) {
    // GGUF blocks: random codes, f16 scales of magnitude 1e-3..2e-2 at the format's offsets.
    const bool q4k = f == WFormat::GgufQ4_K, q6k = f == WFormat::GgufQ6_K;
    const int64_t per = q4k || q6k ? 256 : 32, bb = q4k ? 144 : q6k ? 210 : 34;
    v.row_bytes = cols / per * bb;
    m.data.resize(size_t(rows * v.row_bytes));
    for (size_t i = 0; i + 8 <= m.data.size(); i += 8) {
      uint64_t r = next(s);
      std::memcpy(&m.data[i], &r, 8);
    }
    const std::vector<size_t> scale_at = q4k ? std::vector<size_t>{0, 2} : q6k ? std::vector<size_t>{208} : std::vector<size_t>{0};
    for (size_t b = 0; b < m.data.size() / size_t(bb); ++b) {
      for (size_t off : scale_at) {
        uint16_t h = f32_to_f16(1e-3f + 1e-5f * float(next(s) % 1900));
        std::memcpy(&m.data[b * size_t(bb) + off], &h, 2);
      }
    }
  } else {
    const int64_t es = f == WFormat::F32 ? 4 : 2;
    v.row_bytes = cols * es;
    m.data.resize(size_t(rows * v.row_bytes));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float x = float(int(next(s) % 2000) - 1000) / 1000.f;
      if (f == WFormat::F32) std::memcpy(&m.data[size_t(i) * 4], &x, 4);
      else {
        uint16_t h = f == WFormat::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
        std::memcpy(&m.data[size_t(i) * 2], &h, 2);
      }
    }
  }
  v.data = m.data.data();
  return m;
}

void init_threads() {
  static bool done = [] {
    const char* e = std::getenv("G4_THREADS");
    set_num_threads(e ? std::atoi(e) : 2);
    return true;
  }();
  (void)done;
}

void run_matmul(benchmark::State& st, WFormat f, int bits, int64_t rows, int64_t cols) {
  init_threads();
  const int64_t M = st.range(0);
  static std::unique_ptr<Matrix> cache;  // big matrices are built once per shape
  static int64_t crow = 0, ccol = 0;
  static int cbits = 0;
  static WFormat cfmt = WFormat::F32;
  if (!cache || crow != rows || ccol != cols || cbits != bits || cfmt != f) {
    cache.reset();
    cache = std::make_unique<Matrix>(make_matrix(f, rows, cols, bits));
    crow = rows, ccol = cols, cbits = bits, cfmt = f;
  }
  std::vector<float> x(size_t(M * cols)), y(size_t(M * rows));
  uint64_t s = 42;
  for (auto& v : x) v = float(int(next(s) % 2000) - 1000) / 1000.f;
  for (auto _ : st) {
    matmul_fast(x.data(), M, cache->view, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["threads"] = num_threads();
  st.counters["GB/s"] = benchmark::Counter(double(cache->weight_bytes()) * double(st.iterations()),
                                           benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(M * rows * cols) * double(st.iterations()) * 1e-9,
                                              benchmark::Counter::kIsRate);
}

#define G4_MATMUL_BENCH(name, fmt, bits, rows, cols)                                  \
  void name(benchmark::State& st) { run_matmul(st, fmt, bits, rows, cols); }        \
  BENCHMARK(name)->Arg(1)->Arg(8)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime()

G4_MATMUL_BENCH(Mlx4_2048x2048, WFormat::MlxAffine, 4, 2048, 2048);
G4_MATMUL_BENCH(Mlx8_2048x2048, WFormat::MlxAffine, 8, 2048, 2048);
G4_MATMUL_BENCH(Mlx6_2048x2048, WFormat::MlxAffine, 6, 2048, 2048);
G4_MATMUL_BENCH(Mlx3_2048x2048, WFormat::MlxAffine, 3, 2048, 2048);
G4_MATMUL_BENCH(Bf16_2048x2048, WFormat::BF16, 0, 2048, 2048);
G4_MATMUL_BENCH(F32_2048x2048, WFormat::F32, 0, 2048, 2048);
G4_MATMUL_BENCH(Mlx4_Head262144x1536, WFormat::MlxAffine, 4, 262144, 1536);
// Gemma 4 E2B in a Q4_K_M GGUF: the tied Q6_K lm head and a Q4_K MLP projection.
G4_MATMUL_BENCH(GgufQ6K_Head262144x1536, WFormat::GgufQ6_K, 0, 262144, 1536);
G4_MATMUL_BENCH(GgufQ4K_6144x1536, WFormat::GgufQ4_K, 0, 6144, 1536);
G4_MATMUL_BENCH(GgufQ6K_6144x1536, WFormat::GgufQ6_K, 0, 6144, 1536);
G4_MATMUL_BENCH(GgufQ4K_Stream131072x1536, WFormat::GgufQ4_K, 0, 131072, 1536);  // 113 MB: from DRAM
G4_MATMUL_BENCH(GgufQ4K_1536x6144, WFormat::GgufQ4_K, 0, 1536, 6144);
G4_MATMUL_BENCH(GgufQ8_0_6144x1536, WFormat::GgufQ8_0, 0, 6144, 1536);

// Cost of one parallel region with trivial work (decode issues ~300 of these per token).
void PoolRegion(benchmark::State& st) {
  init_threads();
  std::vector<int64_t> sink(64, 0);
  for (auto _ : st) {
    parallel_for(num_threads(), [&](int64_t b, int64_t e) { sink[size_t(b) * 8] += e; });
  }
  benchmark::DoNotOptimize(sink.data());
}
BENCHMARK(PoolRegion)->UseRealTime();

}  // namespace
}  // namespace g4

BENCHMARK_MAIN();
