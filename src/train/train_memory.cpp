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
  uint64_t qd = 0, kd = 0, inter = 0, donors = 0;
  std::vector<bool> donor(c.layers.size(), false);
  for (const LayerSpec& ls : c.layers) {
    qd = std::max(qd, uint64_t(c.n_heads) * uint64_t(ls.head_dim));
    kd = std::max(kd, uint64_t(ls.n_kv_heads) * uint64_t(ls.head_dim));
    inter = std::max<uint64_t>(inter, uint64_t(std::max(ls.mlp_width, c.moe_width)));
    if (ls.kv_source >= 0) donor[size_t(ls.kv_source)] = true;
  }
  for (bool b : donor) donors += b ? 1 : 0;
  const uint64_t adapted = first_layer < int(N) ? N - uint64_t(std::max(first_layer, 0)) : 0;
  const uint64_t floats_kept = adapted * T * d + donors * T * kd * 2 + T * N * Pw;
  // One layer's intermediates (lora_train_model.cpp Acts): 7 rows of d, 3 of the query width, 4
  // of the KV width, 3 of the intermediate width, 6 of the per-layer input width, and the
  // attention weights. The forward's and the backward's recomputation hold one each, and the
  // backward's gradients half as much again: 5/2 of one.
  const uint64_t layer_floats = T * (7 * d + 3 * qd + 4 * kd + 3 * inter + 6 * Pw) + uint64_t(c.n_heads) * sq;
  const uint64_t tail_floats = 6 * T * d;  // final norm, its gradient, dx, the layer output, the loss rows
  return 4 * (floats_kept + tail_floats) + 10 * layer_floats;  // 4 bytes a float
}

}  // namespace g4::train
