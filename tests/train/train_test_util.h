// Shared by the training tests: random token sequences and a random start for lora_b.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "train/lora_params.h"

namespace g4::train::train_test {

// n token ids in [3, vocab), the first one 2 (BOS), drawn from `seed`.
inline std::vector<int32_t> tokens(int vocab, int n, uint32_t seed) {
  std::mt19937 r(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(3 + r() % uint32_t(vocab - 3));
  t[0] = 2;
  return t;
}

// Random lora_b too (mlx-lm starts it at zero, which would leave every lora_a gradient zero).
inline void randomize_b(LoraParams& p, uint32_t seed) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  for (LoraModule& m : p.modules())
    for (float& x : m.b) x = u(r);
}

}  // namespace g4::train::train_test
