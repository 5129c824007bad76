// Timing of gguf_matmul_fast (disabled by default; it is a measurement, not a check):
//   G4_THREADS=2 build-x/bin/test_quant --gtest_also_run_disabled_tests --gtest_filter='*GgufBench*'
// Prints GB/s of weight bytes streamed for M=1 (decode) and rows of x per second for M=64
// (prefill "tokens-equivalent" for that one matrix), on the starter model's matrix shapes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/gguf_amx.h"
#include "quant/gguf_quant.h"

namespace g4 {
namespace {

struct Bench {
  WFormat fmt;
  int64_t rows, cols;
};

std::vector<uint8_t> fill(WFormat f, int64_t rows, int64_t cols) {
  const int64_t rb = gguf_row_bytes(f, cols), n = rb * rows;
  std::vector<uint8_t> d(static_cast<size_t>(n));
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    const uint64_t v = s * 2685821657736338717ull;
    std::memcpy(&d[size_t(i)], &v, 8);
  }
  // Finite f16 scales: clear the exponent's top bit of every f16 field so |d| < 2.
  const int bb = gguf_block_bytes(f);
  const std::vector<int> offs = f == WFormat::GgufQ6_K ? std::vector<int>{208}
                                : (f == WFormat::GgufQ4_K || f == WFormat::GgufQ5_K) ? std::vector<int>{0, 2}
                                                                                     : std::vector<int>{0};
  for (int64_t b = 0; b < n / bb; ++b)
    for (int o : offs) d[size_t(b * bb + o + 1)] &= 0x3b;
  return d;
}

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Seconds per call: wall clock, or (G4_BENCH_CPU=1) process CPU time divided by the thread count,
// which is steadier on a machine shared with other jobs.
double time_call(const float* x, int64_t M, const WeightView& w, float* y, double min_s) {
  static const bool cpu = std::getenv("G4_BENCH_CPU") != nullptr;
  gguf_matmul_fast(x, M, w, y);  // warm-up
  int iters = 0;
  auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_now();
  double el = 0;
  do {
    gguf_matmul_fast(x, M, w, y);
    ++iters;
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (el < min_s);
  if (cpu) return (cpu_now() - c0) / num_threads() / iters;
  return el / iters;
}

// AMX vs VNNI around the switch-over size gguf::amx_min_rows(fmt).
TEST(GgufBench, DISABLED_SmallM) {
  const Bench cases[] = {{WFormat::GgufQ5_0, 2048, 640}, {WFormat::GgufQ4_K, 640, 2048}, {WFormat::GgufQ6_K, 640, 2048},
                         {WFormat::GgufQ8_0, 1024, 640}};
  for (const Bench& b : cases) {
    auto data = fill(b.fmt, b.rows, b.cols);
    WeightView w{b.fmt, b.rows, b.cols, data.data(), gguf_row_bytes(b.fmt, b.cols)};
    std::vector<float> x(size_t(16 * b.cols), 0.5f), y(size_t(16 * b.rows));
    gguf::set_amx_min_rows(1);
    for (int64_t M : {1, 2, 4, 6, 8, 12, 16}) {
      gguf::set_amx_enabled(false);
      const double tv = time_call(x.data(), M, w, y.data(), 0.1);
      gguf::set_amx_enabled(true);
      const double ta = time_call(x.data(), M, w, y.data(), 0.1);
      std::printf("%-5s %5lld x %5lld M=%2lld  vnni %7.1f us  amx %7.1f us\n", std::string(wformat_name(b.fmt)).c_str(),
                  (long long)b.rows, (long long)b.cols, (long long)M, tv * 1e6, ta * 1e6);
    }
    gguf::set_amx_min_rows(0);
  }
}

// The matrix products of one gemma-3-270m-q4_k_m token (tensor types as in the starter GGUF:
// 18 layers of q/k/gate/up Q5_0, v Q8_0 or Q5_0, o Q4_K, down Q6_K or Q4_K; tied Q8_0 lm head),
// each layer with its own weights so that nothing is served from a warm L2.
TEST(GgufBench, DISABLED_StarterModelToken) {
  struct Mat {
    std::vector<uint8_t> data;
    WeightView w;
  };
  auto make = [](WFormat f, int64_t rows, int64_t cols) {
    Mat m{fill(f, rows, cols), {}};
    m.w = WeightView{f, rows, cols, m.data.data(), gguf_row_bytes(f, cols)};
    return m;
  };
  std::vector<Mat> layers;
  double layer_bytes = 0;
  for (int l = 0; l < 18; ++l) {
    layers.push_back(make(WFormat::GgufQ5_0, 1024, 640));                                  // q
    layers.push_back(make(WFormat::GgufQ5_0, 256, 640));                                   // k
    layers.push_back(make(l % 2 ? WFormat::GgufQ8_0 : WFormat::GgufQ5_0, 256, 640));      // v
    layers.push_back(make(WFormat::GgufQ4_K, 640, 1024));                                  // o
    layers.push_back(make(WFormat::GgufQ5_0, 2048, 640));                                  // gate
    layers.push_back(make(WFormat::GgufQ5_0, 2048, 640));                                  // up
    layers.push_back(make(l % 2 ? WFormat::GgufQ6_K : WFormat::GgufQ4_K, 640, 2048));     // down
  }
  for (auto& m : layers) layer_bytes += double(m.w.row_bytes) * double(m.w.rows);
  Mat head = make(WFormat::GgufQ8_0, 262144, 640);
  const double head_bytes = double(head.w.row_bytes) * double(head.w.rows);
  std::vector<float> x(size_t(64 * 2048), 0.25f), y(size_t(262144));
  std::vector<float> y64(size_t(64 * 2048));
  auto run_layers = [&](int64_t M, float* out) {
    for (auto& m : layers) gguf_matmul_fast(x.data(), M, m.w, out);
  };
  auto timed = [&](auto&& f, double min_s) {
    static const bool cpu = std::getenv("G4_BENCH_CPU") != nullptr;
    f();
    int it = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    double el = 0;
    do {
      f();
      ++it;
      el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (el < min_s);
    return cpu ? (cpu_now() - c0) / num_threads() / it : el / it;
  };
  const double t_layers = timed([&] { run_layers(1, y.data()); }, 1.0);
  const double t_head = timed([&] { gguf_matmul_fast(x.data(), 1, head.w, y.data()); }, 1.0);
  const double t_pre = timed([&] { run_layers(64, y64.data()); }, 1.0);
  std::printf("threads=%d decode M=1: layers %.2f ms (%.1f GB/s, %.1f MB), lm head %.2f ms (%.1f GB/s), "
              "%.1f tokens/s (matmuls only)\n", num_threads(), t_layers * 1e3, layer_bytes / t_layers / 1e9,
              layer_bytes / 1e6, t_head * 1e3, head_bytes / t_head / 1e9, 1.0 / (t_layers + t_head));
  std::printf("prefill M=64: layers %.2f ms -> %.0f tokens/s (matmuls only, lm head for the last token not counted)\n",
              t_pre * 1e3, 64.0 / t_pre);
}

TEST(GgufBench, DISABLED_Throughput) {
  const Bench cases[] = {
      {WFormat::GgufQ4_K, 640, 2048},    {WFormat::GgufQ6_K, 640, 2048},
      {WFormat::GgufQ5_0, 2048, 640},    {WFormat::GgufQ8_0, 256, 640},
      {WFormat::GgufQ4_K, 640, 1024},    {WFormat::GgufQ5_0, 1024, 640},
      // K-quants need cols % 256 == 0, so 262144 x 640 cannot be Q4_K/Q6_K (the starter GGUF
      // stores that matrix as Q8_0); a large K-quant matrix of similar size instead:
      {WFormat::GgufQ4_K, 65536, 2048},  {WFormat::GgufQ6_K, 65536, 2048},
      {WFormat::GgufQ8_0, 262144, 640},  {WFormat::GgufQ5_0, 262144, 640},
  };
  std::printf("threads=%d\n", num_threads());
  for (const Bench& b : cases) {
    auto data = fill(b.fmt, b.rows, b.cols);
    WeightView w{b.fmt, b.rows, b.cols, data.data(), gguf_row_bytes(b.fmt, b.cols)};
    std::vector<float> x(size_t(64 * b.cols)), y(size_t(64 * b.rows));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f;
    const double bytes = double(w.row_bytes) * double(w.rows);
    const double t1 = time_call(x.data(), 1, w, y.data(), 0.3);
    const double t64 = time_call(x.data(), 64, w, y.data(), 0.3);
    std::printf("%-5s %7lld x %5lld  %7.2f MB  M=1: %8.1f us %6.1f GB/s  M=64: %9.1f us %8.0f rows/s %6.1f GMAC/s\n",
                std::string(wformat_name(b.fmt)).c_str(), (long long)b.rows, (long long)b.cols, bytes / 1e6,
                t1 * 1e6, bytes / t1 / 1e9, t64 * 1e6, 64 / t64, 64.0 * b.rows * b.cols / t64 / 1e9);
  }
}

}  // namespace
}  // namespace g4
