// Routed experts for the CUDA MoE op tests: stacks of E experts of gate / up [I, d] and down [d, I], either
// GGUF blocks of one format (Q4_K unless asked) or MLX affine with a different bits / group per projection (3/64, 6/32, 5/128: the
// mixed precision mlx-lm writes), as host views for the reference and as the same weights placed
// on the device backend.
#pragma once

#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "../quant/gguf_test_util.h"
#include "../quant/quant_test_util.h"
#include "backend/backend.h"
#include "quant/gguf_quant.h"

namespace g4::test {

struct TestExperts {
  std::vector<std::vector<uint8_t>> store;  // the GGUF blocks the host views read
  std::vector<OwnedWeight> owned;           // the MLX weights the host views read
  ExpertStack gate, up, down;              // host
  ExpertStack dev_gate, dev_up, dev_down;  // placed on the device backend
};

// MLX weights draw seeds seed, seed + 1, ...; GGUF blocks (format gguf) draw from rng.
inline TestExperts make_test_experts(Backend& dev, int E, int64_t I, int64_t d, bool mlx, uint32_t seed,
                                     std::mt19937& rng, WFormat gguf = WFormat::GgufQ4_K) {
  TestExperts t;
  t.owned.reserve(3);
  t.store.reserve(3);
  for (auto [host, rows, cols, placed, bits, group] :
       {std::tuple{&t.gate, I, d, &t.dev_gate, 3, 64}, std::tuple{&t.up, I, d, &t.dev_up, 6, 32},
        std::tuple{&t.down, d, I, &t.dev_down, 5, 128}}) {
    WeightView w;  // [E * rows, cols]: the experts back to back, as checkpoints store them
    if (mlx) {
      t.owned.push_back(random_mlx(E * rows, cols, bits, group, DType::BF16, seed++));
      w = t.owned.back().view;
    } else {
      t.store.push_back(random_blocks(gguf, E * rows, cols, rng));
      w = WeightView{gguf, E * rows, cols, t.store.back().data(), gguf_row_bytes(gguf, cols)};
    }
    *host = ExpertStack::of_matrix(w, E);
    *placed = dev.place_experts(*host);
  }
  return t;
}

}  // namespace g4::test
