#include "train/train_memory.h"

#include <algorithm>

namespace g4::train {

uint64_t training_batch_bytes(const ModelConfig& c, int first_layer, const std::vector<int>& lengths) {
  uint64_t T = 0, sq = 0;
  for (int n : lengths) {
    T += uint64_t(n);
    sq += uint64_t(n) * uint64_t(n);
  }
  const uint64_t d = uint64_t(c.hidden), N = uint64_t(c.n_layers), Pw = uint64_t(c.ple_width);
  uint64_t qd = 0, kd = 0, inter = 0, cache = 0, shared = 0;
  for (const LayerSpec& ls : c.layers) {
    const uint64_t k = uint64_t(ls.n_kv_heads) * uint64_t(ls.head_dim);
    qd = std::max(qd, uint64_t(c.n_heads) * uint64_t(ls.head_dim));
    kd = std::max(kd, k);
    inter = std::max<uint64_t>(inter, uint64_t(std::max(ls.mlp_width, c.moe_width)));
    if (ls.kv_source >= 0) shared += 2 * k;
    else cache += 2 * k;
  }
  const uint64_t adapted = first_layer < int(N) ? N - uint64_t(std::max(first_layer, 0)) : 0;
  // Model scratch (model_scratch.h): 8 rows of d (x, xn, o, f, h1, h2, last, the adapter's output),
  // q and att, k and v, gate and up, the per-layer inputs twice and their gate.
  const uint64_t scratch = T * (8 * d + 2 * qd + 2 * kd + 2 * inter + 2 * N * Pw + Pw);
  const uint64_t kept = adapted * T * (d + Pw) + T * shared;
  // One layer recomputed: the saved inputs of its norms, products with adapters, GeGLU and
  // attention (q, k, v and the weights).
  const uint64_t layer = T * (9 * d + 3 * qd + 4 * kd + 5 * inter + 4 * Pw) + uint64_t(c.n_heads) * sq;
  const uint64_t floats = kept + 2 * (scratch + T * cache) + layer + layer / 2;
  return 4 * floats + floats;  // 4 bytes a float, and a quarter more for the allocator and temporaries
}

}  // namespace g4::train
