#include "parallel/tp_lora.h"

#include <algorithm>
#include <string>

namespace g4 {
namespace {

// Rows [r0, r1) and columns [c0, c1) of a host f32 matrix view, as a new [r1 - r0, c1 - c0] matrix.
std::vector<float> sub_matrix(const WeightView& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const auto* src = static_cast<const float*>(w.data);
  std::vector<float> out(size_t((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r)
    std::copy(src + r * w.cols + c0, src + r * w.cols + c1, out.begin() + (r - r0) * (c1 - c0));
  return out;
}

}  // namespace

Result<std::unique_ptr<LoraAdapter>> shard_lora_adapter(const LoraAdapter& whole, const ShardedWeightSource& src,
                                                        Backend& be) {
  auto ad = std::make_unique<LoraAdapter>();
  ad->path = whole.path;
  ad->rank = whole.rank;
  ad->scale = whole.scale;
  ad->num_layers = whole.num_layers;
  ad->layers.resize(whole.layers.size());
  for (size_t l = 0; l < whole.layers.size(); ++l) {
    for (const char* module : kLoraModules) {
      const LoraDelta* d = lora_slot(whole.layers[l], std::string(module));
      if (!d) continue;
      if (d->a.fmt != WFormat::F32 || d->b.fmt != WFormat::F32)
        return err("%s: layers.%zu.%s: the adapter's matrices are not host f32 (load it on a host backend)",
                   whole.path.c_str(), l, module);
      const ShardedWeightSource::Split sp = src.split_of(int(l), module);
      const int64_t r = d->a.rows, in = d->a.cols, out = d->b.rows;
      using K = ShardedWeightSource::Split::Kind;
      const ShardRange rows = sp.kind == K::Rows ? sp.range : ShardRange{0, out};
      const ShardRange cols = sp.kind == K::Cols ? sp.range : ShardRange{0, in};
      if (rows.end > out || cols.end > in)
        return err("%s: layers.%zu.%s is [%lld, %lld], the rank's split wants %lld rows and %lld columns",
                   whole.path.c_str(), l, module, (long long)out, (long long)in, (long long)rows.end,
                   (long long)cols.end);
      ad->host.push_back(sub_matrix(d->a, 0, r, cols.begin, cols.end));  // [r, in part]
      const WeightView a = f32_view(ad->host.back().data(), r, cols.size());
      ad->host.push_back(sub_matrix(d->b, rows.begin, rows.end, 0, r));  // [out part, r]
      const WeightView b = f32_view(ad->host.back().data(), rows.size(), r);
      LoraDelta nd;
      nd.scale = d->scale;
      nd.a = be.place_weight(a);
      nd.b = be.place_weight(b);
      nd.id = uint32_t(ad->deltas.size());
      ad->deltas.push_back(nd);
      lora_slot(ad->layers[l], std::string(module)) = &ad->deltas.back();
      ad->max_out = std::max(ad->max_out, int(b.rows));
      ad->max_in = std::max(ad->max_in, int(a.cols));
      ++ad->modules;
    }
  }
  return ad;
}

}  // namespace g4
