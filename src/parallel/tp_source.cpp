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

ShardedWeightSource::Split ShardedWeightSource::split_of(int l, std::string_view part) const {
  using K = Split::Kind;
  const LayerSpec& g = global_.layers[size_t(l)];
  const int64_t D = g.head_dim, hq = local_.n_heads, hk = local_.layers[size_t(l)].n_kv_heads;
  auto range = [](int64_t begin, int64_t n) { return ShardRange{begin, begin + n}; };
  if (part == "self_attn.q_proj") return {K::Rows, range(rank_ * hq * D, hq * D)};
  if (part == "self_attn.o_proj") return {K::Cols, range(rank_ * hq * D, hq * D)};
  if (part == "self_attn.k_proj" || part == "self_attn.v_proj") {
    if (g.n_kv_heads >= size_) return {K::Rows, range(rank_ * hk * D, hk * D)};
    return {K::Rows, range(int64_t(rank_ / (size_ / g.n_kv_heads)) * D, D)};  // the replicated head
  }
  if (part == "mlp.gate_proj" || part == "mlp.up_proj" || part == "mlp.down_proj") {
    const ShardRange r = shard_range(g.mlp_width, mlp_unit_[size_t(l)], rank_, size_, "mlp").value();  // checked in make
    return {part == "mlp.down_proj" ? K::Cols : K::Rows, r};
  }
  return {K::Whole, {}};
}

double ShardedWeightSource::held_fraction(std::string_view module) const {
  if (module == "lm_head")
    return double(shard_range(global_.vocab, 1, rank_, size_, "vocabulary").value().size()) / double(global_.vocab);
  const auto [l, part] = split_layer(module);
  if (l < 0 || l >= global_.n_layers) return 1.0;
  const Split sp = split_of(l, part);
  if (sp.kind == Split::Kind::Whole) return 1.0;
  return double(sp.range.size()) / double(split_dim(l, part));
}

bool ShardedWeightSource::copies(std::string_view module) const {
  const auto [l, part] = split_layer(module);
  return l >= 0 && l < global_.n_layers && split_of(l, part).kind == Split::Kind::Cols;
}

int64_t ShardedWeightSource::split_dim(int l, std::string_view part) const {
  const LayerSpec& g = global_.layers[size_t(l)];
  if (part == "self_attn.q_proj" || part == "self_attn.o_proj") return int64_t(global_.n_heads) * g.head_dim;
  if (part.substr(0, 10) == "self_attn.") return int64_t(g.n_kv_heads) * g.head_dim;
  return int64_t(g.mlp_width);
}

Result<WeightView> ShardedWeightSource::matrix(std::string_view module, int64_t rows, int64_t cols) const {
  const auto [l, part] = split_layer(module);
  if (l < 0 || l >= global_.n_layers) return base_->matrix(module, rows, cols);
  const std::string name(module);
  const Split sp = split_of(l, part);
  if (sp.kind == Split::Kind::Whole) return base_->matrix(module, rows, cols);  // replicated
  // The checkpoint's shape: rows split ([out, d]) or columns split ([d, in]).
  const int64_t whole = split_dim(l, part);
  const int64_t d = global_.hidden;
  Result<WeightView> out = Error{""};
  const bool mlp = part.substr(0, 4) == "mlp.";
  if (sp.kind == Split::Kind::Rows) {
    G4_ASSIGN_OR_RETURN(WeightView w, base_->matrix(module, whole, d));
    // MLP ranks may hold unequal widths: split as make() did. Heads split into equal units, so the
    // range is rank begin / size of whole / size units (a replicated KV head: head j of Hk).
    out = mlp ? shard_rows(w, rank_, size_, name.c_str(), mlp_unit_[size_t(l)])
              : shard_rows(w, int(sp.range.begin / sp.range.size()), int(whole / sp.range.size()), name.c_str(),
                           sp.range.size());
  } else {
    G4_ASSIGN_OR_RETURN(WeightView w, base_->matrix(module, d, whole));
    G4_ASSIGN_OR_RETURN(PackedWeight p, shard_cols(w, rank_, size_, name.c_str(),
                                                   mlp ? mlp_unit_[size_t(l)] : sp.range.size()));
    out = keep(std::move(p));
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
