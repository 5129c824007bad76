#include "train/lora_params.h"

#include "core/atomic_file.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "model/lora.h"

namespace g4::train {
namespace fs = std::filesystem;

std::string lora_layer_prefix(const ModelConfig& cfg) {
  return cfg.model_type == "gemma4" ? "language_model.model.layers" : "model.layers";
}

Result<LoraParams> LoraParams::create(const ModelConfig& cfg, const LoraConfig& lc, const std::string& prefix,
                                      uint64_t seed) {
  const int N = cfg.n_layers;
  if (lc.num_layers == 0 || lc.num_layers < -1 || lc.num_layers > N)
    return err("--num-layers %d: the model has %d layers (use 1..%d, or -1 for all)", lc.num_layers, N, N);
  if (lc.rank < 1) return err("--rank %d: must be at least 1", lc.rank);
  if (!(lc.dropout >= 0.f && lc.dropout < 1.f)) return err("--dropout %g: must be in [0, 1)", double(lc.dropout));
  LoraParams p;
  p.lc_ = lc;
  p.layers_.resize(size_t(N));
  p.first_ = lc.num_layers < 0 ? 0 : N - lc.num_layers;
  std::mt19937_64 rng(seed);
  for (int l = p.first_; l < N; ++l) {
    for (const char* m : kLoraModules) {
      const auto [out, in] = lora_module_shape(cfg, l, m);
      if (out == 0) continue;
      LoraModule mod;
      mod.layer = l;
      mod.module = m;
      mod.name = prefix + "." + std::to_string(l) + "." + m;
      mod.in = int(in);
      mod.out = int(out);
      mod.rank = lc.rank;
      const float bound = 1.f / std::sqrt(float(in));
      std::uniform_real_distribution<float> u(-bound, bound);
      mod.a.resize(size_t(in) * size_t(lc.rank));
      for (float& x : mod.a) x = u(rng);
      mod.b.assign(size_t(lc.rank) * size_t(out), 0.f);
      mod.ga.assign(mod.a.size(), 0.f);
      mod.gb.assign(mod.b.size(), 0.f);
      p.modules_.push_back(std::move(mod));
      LoraModule* mp = &p.modules_.back();
      lora_slot(p.layers_[size_t(l)], m) = mp;
    }
  }
  return p;
}

Status LoraParams::load(const std::string& path) {
  G4_ASSIGN_OR_RETURN(auto st, SafetensorsFile::open(path));
  std::map<std::pair<int, std::string>, LoraModule*> by_key;
  for (LoraModule& m : modules_) by_key[{m.layer, m.module}] = &m;
  for (const TensorInfo& t : st->tensors()) {
    int layer = -1;
    std::string module;
    char which = 0;
    if (!parse_lora_tensor_name(t.name, &layer, &module, &which))
      return err("%s: tensor %s: not a LoRA weight (lora_a / lora_b of an attention, MLP or per-layer-input module)",
                 path.c_str(), t.name.c_str());
    auto it = by_key.find({layer, module});
    if (it == by_key.end())
      return err("%s: tensor %s: layer %d's %s is not being trained (--num-layers %d)", path.c_str(), t.name.c_str(),
                 layer, module.c_str(), lc_.num_layers);
    LoraModule& m = *it->second;
    const std::vector<int64_t> want = which == 'a' ? std::vector<int64_t>{m.in, m.rank}
                                                   : std::vector<int64_t>{m.rank, m.out};
    if (t.shape != want)
      return err("%s: tensor %s has shape %s, expected [%lld, %lld] (--rank %d)", path.c_str(), t.name.c_str(),
                 t.shape_str().c_str(), (long long)want[0], (long long)want[1], m.rank);
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
      return err("%s: tensor %s: dtype must be F32, F16 or BF16", path.c_str(), t.name.c_str());
    std::vector<float>& dst = which == 'a' ? m.a : m.b;
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = load_float(t.data, t.dtype, i);
  }
  return Status::ok();
}

Status LoraParams::save(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "mlx"}};
  uint64_t off = 0;
  std::vector<std::pair<const std::vector<float>*, std::string>> order;
  for (const LoraModule& m : modules_) {
    for (char w : {'a', 'b'}) {
      const std::vector<float>& v = w == 'a' ? m.a : m.b;
      const std::string name = m.name + ".lora_" + w;
      const std::vector<int64_t> shape = w == 'a' ? std::vector<int64_t>{m.in, m.rank}
                                                  : std::vector<int64_t>{m.rank, m.out};
      header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + v.size() * 4}}};
      off += v.size() * 4;
      order.emplace_back(&v, name);
    }
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  std::string bytes;
  bytes.reserve(8 + h.size() + off);
  const uint64_t n = h.size();
  bytes.append(reinterpret_cast<const char*>(&n), 8);
  bytes += h;
  for (const auto& [v, name] : order) bytes.append(reinterpret_cast<const char*>(v->data()), v->size() * 4);
  return write_file_atomic(path, bytes);
}

void LoraParams::zero_grads() {
  for (LoraModule& m : modules_) {
    std::fill(m.ga.begin(), m.ga.end(), 0.f);
    std::fill(m.gb.begin(), m.gb.end(), 0.f);
  }
}

size_t LoraParams::parameter_count() const {
  size_t n = 0;
  for (const LoraModule& m : modules_) n += m.a.size() + m.b.size();
  return n;
}

}  // namespace g4::train
