// The optimizers `mlx_lm.lora --optimizer` offers that LoRA training here implements, with
// mlx.optimizers' update rules and defaults:
//   sgd:   w -= lr · g                                   (momentum 0, no weight decay)
//   adam:  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;  w -= lr · m / (√v + ε)
//          β = (0.9, 0.999), ε = 1e-8, bias_correction off (MLX's default)
//   adamw: w -= lr·wd·w first (wd 0.01), then adam
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "train/lora_params.h"

namespace g4::train {

class Optimizer {
 public:
  // name: "adam" | "adamw" | "sgd"; error names the flag otherwise.
  static Result<Optimizer> create(const std::string& name, float learning_rate, float weight_decay = 0.01f);
  // One update of every module's a and b from its gradients.
  void step(LoraParams& p);
  float learning_rate() const { return lr_; }
  const std::string& name() const { return name_; }
  // Adam's first and second moments per tensor (a, b of each module in order; empty before the
  // first step and for sgd): saved and restored to resume a run exactly.
  const std::vector<std::vector<float>>& first_moments() const { return m_; }
  const std::vector<std::vector<float>>& second_moments() const { return v_; }
  void set_moments(std::vector<std::vector<float>> m, std::vector<std::vector<float>> v) {
    m_ = std::move(m);
    v_ = std::move(v);
  }

 private:
  void update(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m, std::vector<float>& v);
  std::string name_;
  float lr_ = 1e-5f, wd_ = 0.01f;
  float b1_ = 0.9f, b2_ = 0.999f, eps_ = 1e-8f;
  std::vector<std::vector<float>> m_, v_;  // per tensor (a, b of each module in order)
};

}  // namespace g4::train
