// A small fixed thread pool for data-parallel loops in CPU kernels.
// parallel_for(n, fn) splits [0, n) into contiguous chunks, runs fn(begin, end) on the pool's
// threads plus the caller, and returns when all are done. No allocation per call.
// Idle workers spin briefly (G4_SPIN_US, default 2000 µs) and then sleep on a futex, so regions
// issued back to back wake in well under a microsecond. A parallel_for called from inside fn runs
// inline on the calling thread.
#pragma once
#include <cstdint>
#include <functional>

namespace g4 {

// Number of threads used by parallel_for (including the caller). Default: hardware concurrency,
// or the G4_THREADS environment variable. Must be set before the first parallel_for call.
void set_num_threads(int n);
int num_threads();

// fn is called with disjoint [begin, end) ranges covering [0, n). `min_chunk` keeps tiny loops
// on one thread.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

}  // namespace g4
