// SafetensorsSource: canonical names -> stored tensors, and WeightViews into the mapped files.
// See safetensors_source.h for the mapping rules (mlx-lm gemma4 / gemma4_text sanitize).
#include "io/safetensors_source.h"

#include <cstring>

namespace g4 {

namespace {

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

WFormat float_format(DType t) {
  return t == DType::F32 ? WFormat::F32 : t == DType::F16 ? WFormat::F16 : WFormat::BF16;
}

}  // namespace

std::optional<std::string> vision_tensor_name(std::string_view s) {
  if (s.substr(0, 6) == "model.") s = s.substr(6);
  for (std::string_view p : {"vision_tower.", "embed_vision.", "vision_embedder."})
    if (s.substr(0, p.size()) == p) return std::string(s);
  return std::nullopt;
}

Result<std::unique_ptr<SafetensorsSource>> SafetensorsSource::create(std::shared_ptr<TensorStore> store,
                                                                     QuantConfig quant, TensorSet set) {
  std::unique_ptr<SafetensorsSource> s(new SafetensorsSource());
  s->store_ = std::move(store);
  s->quant_ = std::move(quant);
  auto add = [&](const std::string& canon, const StoredTensor& t, int split) -> Status {
    auto [it, fresh] = s->canon_.emplace(canon, Entry{t, split});
    if (!fresh)
      return err("%s: tensors '%s' and '%s' (in %s) both map to '%s'", t.file->path().c_str(), t.info->name.c_str(),
                 it->second.t.info->name.c_str(), it->second.t.file->path().c_str(), canon.c_str());
    return Status::ok();
  };
  for (const auto& [name, t] : s->store_->all()) {
    auto c = set == TensorSet::Text ? canonical_name(name) : vision_tensor_name(name);
    if (!c) continue;
    if (ends_with(*c, ".experts.gate_up_proj")) {  // HF fused experts [E, 2I, d]
      std::string base = c->substr(0, c->size() - std::strlen(".gate_up_proj"));
      G4_TRY(add(base + ".switch_glu.gate_proj.weight", t, 1));
      G4_TRY(add(base + ".switch_glu.up_proj.weight", t, 2));
    } else if (ends_with(*c, ".experts.down_proj")) {
      std::string base = c->substr(0, c->size() - std::strlen(".down_proj"));
      G4_TRY(add(base + ".switch_glu.down_proj.weight", t, 0));
    } else {
      G4_TRY(add(*c, t, 0));
    }
  }
  if (const Entry* e = s->find("embed_tokens.weight")) {
    const std::string& n = e->t.info->name;
    s->naming_ = n.substr(0, n.size() - std::strlen("embed_tokens.weight")) + "*";
  } else {
    s->naming_ = "?";
  }
  return s;
}

const SafetensorsSource::Entry* SafetensorsSource::find(std::string_view canonical) const {
  auto it = canon_.find(canonical);
  return it == canon_.end() ? nullptr : &it->second;
}

bool SafetensorsSource::has(std::string_view canonical) const {
  return find(canonical) || find(std::string(canonical) + ".weight");
}

std::string SafetensorsSource::stored_name(std::string_view canonical) const {
  const Entry* e = find(canonical);
  return e ? e->t.info->name : std::string();
}

uint64_t SafetensorsSource::stored_bytes(std::string_view canonical) const {
  if (const Entry* e = find(canonical)) return e->t.info->nbytes;
  uint64_t n = 0;
  const std::string m(canonical);
  for (const char* suf : {".weight", ".scales", ".biases"})
    if (const Entry* e = find(m + suf)) n += e->split ? e->t.info->nbytes / 2 : e->t.info->nbytes;
  return n;
}

std::string SafetensorsSource::describe() const {
  return "safetensors " + store_->root() + " (" + std::to_string(store_->files().size()) + " file(s), " +
         std::to_string(store_->all().size()) + " tensors, names " + naming_ + ")";
}

Result<WeightView> SafetensorsSource::matrix(std::string_view module, int64_t rows, int64_t cols) const {
  return view(module, -1, 0, rows, cols);
}

Result<WeightView> SafetensorsSource::stacked_matrix(std::string_view module, int64_t index, int64_t count,
                                                     int64_t rows, int64_t cols) const {
  if (count <= 0 || index < 0 || index >= count)
    return err("%s: module '%.*s': expert index %lld out of range [0, %lld)", store_->root().c_str(),
               int(module.size()), module.data(), (long long)index, (long long)count);
  return view(module, index, count, rows, cols);
}

// index < 0: a plain 2-D matrix [rows, cols]; else matrix `index` of a stacked [count, rows, cols].
Result<WeightView> SafetensorsSource::view(std::string_view module, int64_t index, int64_t count, int64_t rows,
                                           int64_t cols) const {
  const std::string m(module);
  const bool stacked = index >= 0;
  if (rows <= 0 || cols <= 0)
    return err("%s: module '%s': requested shape [%lld, %lld] is empty", store_->root().c_str(), m.c_str(),
               (long long)rows, (long long)cols);
  const Entry* w = find(m + ".weight");
  if (!w)
    return err("%s: missing tensor for module '%s' (looked for '%s.weight' with names %s)", store_->root().c_str(),
               m.c_str(), m.c_str(), naming_.c_str());
  const TensorInfo& wt = *w->t.info;
  const char* file = w->t.file->path().c_str();
  const char* wn = wt.name.c_str();
  const Entry* s = find(m + ".scales");
  const Entry* b = find(m + ".biases");
  const ModuleQuant* ov = quant_.find(m);
  const bool quantized = ov ? ov->quantized : s != nullptr;

  // Stored rows per matrix along axis -2 (twice `rows` for a fused HF gate_up_proj).
  const int64_t srows = w->split ? 2 * rows : rows;
  const int64_t row_off = w->split == 2 ? rows : 0;
  auto expect_shape = [&](int64_t last) {
    return stacked ? std::vector<int64_t>{count, srows, last} : std::vector<int64_t>{srows, last};
  };
  auto shape_error = [&](const TensorInfo& t, const char* f, int64_t last) -> Error {
    return err("%s: tensor '%s' has shape %s but module '%s' needs %s", f, t.name.c_str(), t.shape_str().c_str(),
               m.c_str(), shape_str(expect_shape(last)).c_str());
  };
  const size_t ndim = stacked ? 3 : 2;

  WeightView v;
  v.rows = rows;
  v.cols = cols;
  if (!quantized) {
    if (s)
      return err("%s: module '%s' is marked unquantized (false) in config.json's quantization block, but '%s' exists",
                 s->t.file->path().c_str(), m.c_str(), s->t.info->name.c_str());
    if (!is_float(wt.dtype)) {
      if (wt.dtype == DType::U32)
        return err("%s: tensor '%s' is packed U32 but there is no '%s.scales' and config.json does not mark it quantized",
                   file, wn, m.c_str());
      return err("%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", file, wn,
                 std::string(dtype_name(wt.dtype)).c_str());
    }
    if (wt.shape != expect_shape(cols)) return shape_error(wt, file, cols);
    v.fmt = float_format(wt.dtype);
    v.row_bytes = cols * int64_t(dtype_size(wt.dtype));
    const int64_t first_row = (stacked ? index * srows : 0) + row_off;
    v.data = wt.data + first_row * v.row_bytes;
    return v;
  }

  // MLX affine (spec §3.4): weight u32 [.., rows, cols*b/32], scales/biases [.., rows, cols/g].
  if (w->split)
    return err("%s: tensor '%s': quantized fused gate_up_proj is not supported", file, wn);
  if (!s)
    return err("%s: module '%s' is quantized per config.json but '%s.scales' is missing (weight '%s')", file,
               m.c_str(), m.c_str(), wn);
  if (!b)
    return err("%s: module '%s' is quantized but '%s.biases' is missing (weight '%s'); only affine mode is supported",
               file, m.c_str(), m.c_str(), wn);
  const TensorInfo& st = *s->t.info;
  const TensorInfo& bt = *b->t.info;
  const char* sfile = s->t.file->path().c_str();
  if (wt.dtype != DType::U32)
    return err("%s: tensor '%s' of quantized module '%s' has dtype %s, expected U32", file, wn, m.c_str(),
               std::string(dtype_name(wt.dtype)).c_str());
  if (!is_float(st.dtype))
    return err("%s: tensor '%s' has dtype %s, expected BF16, F16 or F32 scales", sfile, st.name.c_str(),
               std::string(dtype_name(st.dtype)).c_str());
  if (bt.dtype != st.dtype)
    return err("%s: tensor '%s' has dtype %s but its scales '%s' are %s", b->t.file->path().c_str(), bt.name.c_str(),
               std::string(dtype_name(bt.dtype)).c_str(), st.name.c_str(), std::string(dtype_name(st.dtype)).c_str());
  if (st.shape.size() != ndim || wt.shape.size() != ndim || st.shape.back() <= 0 || wt.shape.back() <= 0)
    return err("%s: quantized module '%s': weight '%s' %s / scales '%s' %s do not have %zu dims", file, m.c_str(), wn,
               wt.shape_str().c_str(), st.name.c_str(), st.shape_str().c_str(), ndim);
  const int64_t ngroups = st.shape.back();
  const int64_t wcols = wt.shape.back();
  if (cols % ngroups)
    return err("%s: tensor '%s' has %lld groups per row, which does not divide the %lld input columns of '%s'", sfile,
               st.name.c_str(), (long long)ngroups, (long long)cols, m.c_str());
  const int group = int(cols / ngroups);
  if ((wcols * 32) % cols)
    return err("%s: tensor '%s' has %lld u32 words per row, not a whole number of bits for %lld columns", file, wn,
               (long long)wcols, (long long)cols);
  const int bits = int(wcols * 32 / cols);
  if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
    return err("%s: tensor '%s' %s implies %d-bit values for %lld columns (supported: 2, 3, 4, 5, 6, 8)", file, wn,
               wt.shape_str().c_str(), bits, (long long)cols);
  if (group != 32 && group != 64 && group != 128)
    return err("%s: tensor '%s' %s implies group size %d for %lld columns (supported: 32, 64, 128)", sfile,
               st.name.c_str(), st.shape_str().c_str(), group, (long long)cols);
  if (ov && (ov->bits != bits || ov->group_size != group))
    return err("%s: tensor '%s' is stored as %d-bit, group %d but config.json says %d-bit, group %d for '%s'", file, wn,
               bits, group, ov->bits, ov->group_size, m.c_str());
  if (wt.shape != expect_shape(wcols) || (wcols * 32) != cols * bits) return shape_error(wt, file, cols * bits / 32);
  if (st.shape != expect_shape(ngroups)) return shape_error(st, sfile, ngroups);
  if (bt.shape != st.shape) return shape_error(bt, b->t.file->path().c_str(), ngroups);

  v.fmt = WFormat::MlxAffine;
  v.bits = bits;
  v.group_size = group;
  v.row_bytes = wcols * 4;
  v.scale_dtype = st.dtype;
  const int64_t first_row = stacked ? index * rows : 0;
  const int64_t srow_bytes = ngroups * int64_t(dtype_size(st.dtype));
  v.data = wt.data + first_row * v.row_bytes;
  v.scales = st.data + first_row * srow_bytes;
  v.biases = bt.data + first_row * srow_bytes;
  return v;
}

Result<std::vector<float>> SafetensorsSource::vector(std::string_view tensor, int64_t n) const {
  const Entry* e = find(tensor);
  if (!e)
    return err("%s: missing tensor '%.*s' (names %s)", store_->root().c_str(), int(tensor.size()), tensor.data(),
               naming_.c_str());
  const TensorInfo& t = *e->t.info;
  const char* file = e->t.file->path().c_str();
  if (e->split || !is_float(t.dtype))
    return err("%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", file, t.name.c_str(),
               std::string(dtype_name(t.dtype)).c_str());
  if (t.numel() != n)
    return err("%s: tensor '%s' has shape %s (%lld elements) but %lld are expected", file, t.name.c_str(),
               t.shape_str().c_str(), (long long)t.numel(), (long long)n);
  std::vector<float> out(static_cast<size_t>(n));
  // memcpy per element: the data may be unaligned for its dtype.
  if (t.dtype == DType::F32) {
    std::memcpy(out.data(), t.data, size_t(n) * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[i] = t.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return out;
}

}  // namespace g4
