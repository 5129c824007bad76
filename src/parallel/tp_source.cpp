#include "parallel/tp_source.h"

#include <charconv>
#include <string>

namespace g4 {
namespace {

// "layers.{i}.{rest}" -> (i, rest); (-1, module) for a module outside the layers.
std::pair<int, std::string_view> split_layer(std::string_view module) {
  constexpr std::string_view kPrefix = "layers.";
  if (module.substr(0, kPrefix.size()) != kPrefix) return {-1, module};
  const std::string_view rest = module.substr(kPrefix.size());
  int layer = -1;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
  if (ec != std::errc() || end == rest.data() + rest.size() || *end != '.') return {-1, module};
  return {layer, rest.substr(size_t(end - rest.data()) + 1)};
}

// Query heads per rank: H / n, refused when it does not divide.
Result<int> heads_per_rank(const ModelConfig& c, int size) {
  if (c.n_heads % size != 0)
    return err("tensor parallel over %d ranks: the model's %d query heads do not split evenly", size, c.n_heads);
  return c.n_heads / size;
}

// A layer's KV heads per rank: split when there are at least `size` of them, else one (replicated).
Result<int> kv_heads_per_rank(const ModelConfig& c, int layer, int size) {
  const int hk = c.layers[size_t(layer)].n_kv_heads;
  if (hk >= size) {
    if (hk % size != 0)
      return err("tensor parallel over %d ranks: layer %d's %d KV heads do not split evenly", size, layer, hk);
    return hk / size;
  }
  if (size % hk != 0)
    return err("tensor parallel over %d ranks: layer %d has %d KV heads; replicating them needs a rank count "
               "that is a multiple of it", size, layer, hk);
  return 1;
}

}  // namespace

Result<std::shared_ptr<ShardedWeightSource>> ShardedWeightSource::make(std::shared_ptr<const WeightSource> base,
                                                                       const ModelConfig& global, int rank,
                                                                       int size) {
  if (size < 1 || rank < 0 || rank >= size)
    return err("tensor parallel: rank %d of %d ranks is not a rank of the group", rank, size);
  std::shared_ptr<ShardedWeightSource> s(new ShardedWeightSource());
  s->base_ = std::move(base);
  s->global_ = s->local_ = global;
  s->rank_ = rank;
  s->size_ = size;
  G4_ASSIGN_OR_RETURN(s->local_.n_heads, heads_per_rank(global, size));
  for (int l = 0; l < global.n_layers; ++l) {
    LayerSpec& ls = s->local_.layers[size_t(l)];
    G4_ASSIGN_OR_RETURN(ls.n_kv_heads, kv_heads_per_rank(global, l, size));
    // The intermediate dimension splits at down_proj's column blocks; MLX regroups to 32 columns
    // when its groups are fewer than the ranks.
    const std::string down = "layers." + std::to_string(l) + ".mlp.down_proj";
    G4_ASSIGN_OR_RETURN(WeightView w, s->base_->matrix(down, global.hidden, ls.mlp_width));
    int64_t unit = col_split_unit(w);
    if (w.fmt == WFormat::MlxAffine && w.cols / unit < size && w.cols % kMinMlxGroup == 0) unit = kMinMlxGroup;
    G4_ASSIGN_OR_RETURN(ShardRange r, shard_range(w.cols, unit, rank, size, (down + " columns").c_str()));
    ls.mlp_width = int(r.size());
    s->mlp_unit_.push_back(unit);
  }
  if (global.n_experts > 0) {
    G4_ASSIGN_OR_RETURN(s->experts_, shard_range(global.n_experts, 1, rank, size, "routed experts"));
  }
  return s;
}

WeightView ShardedWeightSource::keep(PackedWeight p) const {
  std::lock_guard<std::mutex> lock(mu_);
  packed_.push_back(std::move(p));  // the storage stays put when the vector grows
  return packed_.back().view();
}

Result<WeightView> ShardedWeightSource::matrix(std::string_view module, int64_t rows, int64_t cols) const {
  const auto [l, part] = split_layer(module);
  if (l < 0 || l >= global_.n_layers) return base_->matrix(module, rows, cols);
  const std::string name(module);
  const LayerSpec& g = global_.layers[size_t(l)];
  const int d = global_.hidden, D = g.head_dim, H = global_.n_heads, Hk = g.n_kv_heads;
  const int hq = local_.n_heads, hk = local_.layers[size_t(l)].n_kv_heads;
  Result<WeightView> out = Error{""};
  if (part == "self_attn.q_proj") {
    G4_ASSIGN_OR_RETURN(WeightView w, base_->matrix(module, int64_t(H) * D, d));
    out = shard_rows(w, rank_, size_, name.c_str(), int64_t(hq) * D);
  } else if (part == "self_attn.k_proj" || part == "self_attn.v_proj") {
    G4_ASSIGN_OR_RETURN(WeightView w, base_->matrix(module, int64_t(Hk) * D, d));
    // Replicated KV: the one head rank r's query heads read, head r / (n / Hk).
    out = Hk >= size_ ? shard_rows(w, rank_, size_, name.c_str(), int64_t(hk) * D)
                      : shard_rows(w, rank_ / (size_ / Hk), Hk, name.c_str(), D);
  } else if (part == "self_attn.o_proj") {
    G4_ASSIGN_OR_RETURN(WeightView w, base_->matrix(module, d, int64_t(H) * D));
    G4_ASSIGN_OR_RETURN(PackedWeight p, shard_cols(w, rank_, size_, name.c_str(), int64_t(hq) * D));
    out = keep(std::move(p));
  } else if (part == "mlp.gate_proj" || part == "mlp.up_proj") {
    G4_ASSIGN_OR_RETURN(WeightView w, base_->matrix(module, g.mlp_width, d));
    out = shard_rows(w, rank_, size_, name.c_str(), mlp_unit_[size_t(l)]);
  } else if (part == "mlp.down_proj") {
    G4_ASSIGN_OR_RETURN(WeightView w, base_->matrix(module, d, g.mlp_width));
    G4_ASSIGN_OR_RETURN(PackedWeight p, shard_cols(w, rank_, size_, name.c_str(), mlp_unit_[size_t(l)]));
    out = keep(std::move(p));
  } else {
    return base_->matrix(module, rows, cols);  // replicated
  }
  if (!out) return out;
  if (out.value().rows != rows || out.value().cols != cols)  // the loader asked with the local config
    return err("%s: rank %d's shard is [%lld, %lld], the rank-local config expects [%lld, %lld]", name.c_str(),
               rank_, (long long)out.value().rows, (long long)out.value().cols, (long long)rows, (long long)cols);
  return out;
}

Result<WeightView> ShardedWeightSource::stacked_matrix(std::string_view module, int64_t index, int64_t count,
                                                       int64_t rows, int64_t cols) const {
  G4_ASSIGN_OR_RETURN(WeightView w, base_->stacked_matrix(module, index, count, rows, cols));
  if (index >= experts_.begin && index < experts_.end) return w;
  w.rows = 0;  // held by another rank (Backend::moe_experts skips it)
  w.data = w.scales = w.biases = nullptr;
  return w;
}

std::string ShardedWeightSource::describe() const {
  return base_->describe() + " (tensor-parallel rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")";
}

}  // namespace g4
