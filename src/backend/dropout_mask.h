// The dropout mask (Backend::dropout, dropout_keeps in backend.h): whether element i survives dropout of probability p under
// `seed`, a counter-based draw (splitmix64 of seed and i, uniform in [0, 1) against p), so every
// backend, a backward pass and a device kernel see the same mask. Usable from host and CUDA code.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define G4_HOST_DEVICE __host__ __device__
#else
#define G4_HOST_DEVICE
#endif

namespace g4 {

G4_HOST_DEVICE inline bool dropout_mask_keeps(uint64_t seed, uint64_t i, float p) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53 >= double(p);
}

}  // namespace g4
