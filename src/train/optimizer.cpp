#include "train/optimizer.h"

#include <cmath>

namespace g4::train {

Result<Optimizer> Optimizer::create(const std::string& name, float learning_rate, float weight_decay) {
  if (name != "adam" && name != "adamw" && name != "sgd")
    return err("--optimizer %s: expected adam, adamw or sgd", name.c_str());
  if (!(learning_rate > 0.f) || !std::isfinite(learning_rate))
    return err("--learning-rate %g: must be a positive number", double(learning_rate));
  Optimizer o;
  o.name_ = name;
  o.lr_ = learning_rate;
  o.wd_ = weight_decay;
  return o;
}

void Optimizer::update(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                       std::vector<float>& v) {
  if (name_ == "sgd") {
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr_ * g[i];
    return;
  }
  if (m.empty()) {
    m.assign(w.size(), 0.f);
    v.assign(w.size(), 0.f);
  }
  if (name_ == "adamw")
    for (float& x : w) x *= 1.f - lr_ * wd_;
  for (size_t i = 0; i < w.size(); ++i) {
    m[i] = b1_ * m[i] + (1.f - b1_) * g[i];
    v[i] = b2_ * v[i] + (1.f - b2_) * g[i] * g[i];
    w[i] -= lr_ * m[i] / (std::sqrt(v[i]) + eps_);
  }
}

void Optimizer::step(LoraParams& p) {
  const size_t n = p.modules().size() * 2;
  if (m_.size() != n) {
    m_.assign(n, {});
    v_.assign(n, {});
  }
  size_t i = 0;
  for (LoraModule& mod : p.modules()) {
    update(mod.a, mod.ga, m_[i], v_[i]);
    ++i;
    update(mod.b, mod.gb, m_[i], v_[i]);
    ++i;
  }
}

}  // namespace g4::train
