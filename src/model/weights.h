// Every weight of the text model as a named struct member, filled once from a WeightSource
// (one table of canonical names; see weights.cpp). Matrices are views into the mapped files;
// small float vectors (norms, scalars) are copied into backend buffers.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/weight_source.h"
#include "core/config.h"

namespace g4 {

// A float vector held in a backend buffer (norm weights etc.), plus its size.
struct DeviceVec {
  const float* data = nullptr;
  int n = 0;
};

struct LayerWeights {
  WeightView q, k, v, o;  // k/v absent on KV-shared layers; v absent on K=V full layers
  DeviceVec q_norm, k_norm;
  DeviceVec input_ln, post_attn_ln, pre_ffw_ln, post_ffw_ln;
  WeightView gate, up, down;  // dense MLP
  // MoE (spec §2.8)
  WeightView router;
  DeviceVec router_norm_w[2];  // folded scale·d^-0.5, indexed by ActPrecision (F32, BF16)
  std::vector<float> per_expert_scale_host;
  DeviceVec per_expert_scale;
  ExpertStack ex_gate, ex_up, ex_down;  // [E, I, d], [E, I, d], [E, d, I], placed
  DeviceVec pre_ffw_ln2, post_ffw_ln1, post_ffw_ln2;
  // Per-layer inputs (spec §2.2, §2.9)
  WeightView ple_gate, ple_proj;
  DeviceVec post_ple_ln;
  float layer_scalar = 1.f;
};

struct ModelWeights {
  WeightView embed;          // [vocab, d]
  WeightView lm_head;        // = embed when tied
  WeightView embed_ple;      // [ple_vocab, N*P]
  WeightView ple_model_proj; // [N*P, d]
  DeviceVec ple_proj_norm;   // [P]
  DeviceVec final_norm;      // [d]
  std::vector<LayerWeights> layers;
  size_t weight_bytes = 0;   // bytes of the stored matrices (for info / bench)
};

// Resolves every weight the config needs; errors name the missing/mismatched tensor.
Result<ModelWeights> load_weights(const ModelConfig& cfg, const WeightSource& src, Backend& be);

}  // namespace g4
