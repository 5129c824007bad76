// Safetensors reader: see safetensors.h for the contract. Mirrors the checks of the reference
// `safetensors` Rust crate (Metadata::validate): header size limit, offsets inside the data block,
// size == product(shape) * dtype size; plus overlap and duplicate-name checks.
#include "io/safetensors.h"

#include "io/json_bounded.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

namespace g4 {

using nlohmann::json;

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  G4_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
  const uint8_t* p = map->data();
  size_t n = map->size();
  return parse(p, n, path, std::move(map));
}

namespace {

const char* json_type(const json& j) { return j.type_name(); }

// Parses one entry {dtype, shape, data_offsets}; `data_size` is the size of the data block.
Status parse_entry(const std::string& file, const std::string& name, const json& e, uint64_t data_size,
                   TensorInfo& t) {
  const char* f = file.c_str();
  const char* n = name.c_str();
  if (!e.is_object()) return err("%s: tensor '%s': header entry is a %s, expected an object", f, n, json_type(e));
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) return err("%s: tensor '%s': missing or non-string 'dtype'", f, n);
  const std::string& dts = dt->get_ref<const std::string&>();
  t.dtype = dtype_from_safetensors(dts);
  if (t.dtype == DType::Unknown) return err("%s: tensor '%s': unknown dtype '%s'", f, n, dts.c_str());
  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) return err("%s: tensor '%s': missing or non-array 'shape'", f, n);
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned())  // nlohmann stores non-negative integers as unsigned
      return err("%s: tensor '%s': shape entries must be non-negative integers", f, n);
    uint64_t v = d.get<uint64_t>();
    if (v > uint64_t(INT64_MAX)) return err("%s: tensor '%s': shape entry %llu is too large", f, n, (unsigned long long)v);
    t.shape.push_back(int64_t(v));
    overflow |= __builtin_mul_overflow(numel, v, &numel);
  }
  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return err("%s: tensor '%s': 'data_offsets' must be two non-negative integers", f, n);
  uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
  if (en < b) return err("%s: tensor '%s': data_offsets end %llu < begin %llu", f, n, (unsigned long long)en,
                         (unsigned long long)b);
  if (en > data_size)
    return err("%s: tensor '%s': data_offsets [%llu, %llu) past the end of the data block (%llu bytes)", f, n,
               (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
  uint64_t want = 0;
  overflow |= __builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &want);
  if (overflow) return err("%s: tensor '%s': shape %s overflows", f, n, t.shape_str().c_str());
  if (want != en - b)
    return err("%s: tensor '%s': %llu bytes stored but shape %s of %s needs %llu", f, n,
               (unsigned long long)(en - b), t.shape_str().c_str(), dts.c_str(), (unsigned long long)want);
  t.nbytes = en - b;
  t.offset = b;  // relative for now; made absolute by the caller
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* bytes, size_t size,
                                                                const std::string& label,
                                                                std::shared_ptr<MappedFile> keep) {
  const char* f = label.c_str();
  if (size < 8) return err("%s: too short for a safetensors file (%zu bytes, need at least 8)", f, size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | bytes[i];  // little-endian u64
  if (hlen > kMaxHeaderBytes)
    return err("%s: header length %llu exceeds the %llu-byte limit (not a safetensors file?)", f,
               (unsigned long long)hlen, (unsigned long long)kMaxHeaderBytes);
  if (hlen > size - 8)
    return err("%s: header length %llu runs past the end of the file (%zu bytes)", f, (unsigned long long)hlen,
               size);
  if (hlen < 2) return err("%s: header length %llu is too small for a JSON object", f, (unsigned long long)hlen);

  // Parse the header, rejecting duplicate top-level names (nlohmann would keep the last one).
  const char* hb = reinterpret_cast<const char*>(bytes + 8);
  std::set<std::string> seen;
  std::string dup;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) &&
        depth >= JsonLimits{}.max_depth)
      throw std::runtime_error("nesting deeper than " + std::to_string(JsonLimits{}.max_depth) + " levels");
    if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && dup.empty()) dup = k;
    }
    return true;
  };
  json h;
  try {
    h = json::parse(hb, hb + hlen, cb, /*allow_exceptions=*/true);
  } catch (const std::exception& e) {
    std::string m = e.what();
    for (char& c : m)
      if (c == '\n' || c == '\r') c = ' ';
    return err("%s: header is not valid JSON: %s", f, m.c_str());
  }
  if (!h.is_object()) return err("%s: header is a JSON %s, expected an object", f, h.type_name());
  if (!dup.empty()) return err("%s: tensor '%s' appears twice in the header", f, dup.c_str());

  auto st = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  st->path_ = label;
  st->size_ = size;
  st->map_ = std::move(keep);
  const uint64_t data_start = 8 + hlen;
  const uint64_t data_size = size - data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;
      if (!it->is_object()) return err("%s: '__metadata__' is a %s, expected an object of strings", f, it->type_name());
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return err("%s: '__metadata__' value for '%s' is a %s, expected a string", f, m.key().c_str(),
                     m->type_name());
        st->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorInfo t;
    t.name = it.key();
    G4_TRY(parse_entry(label, t.name, *it, data_size, t));
    t.offset += data_start;
    t.data = bytes + t.offset;
    st->tensors_.push_back(std::move(t));
  }
  // Data ranges must not overlap (zero-sized tensors occupy nothing).
  std::sort(st->tensors_.begin(), st->tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  const TensorInfo* prev = nullptr;
  for (const auto& t : st->tensors_) {
    if (t.nbytes == 0) continue;
    if (prev && t.offset < prev->offset + prev->nbytes)
      return err("%s: tensor '%s' data [%llu, %llu) overlaps tensor '%s' [%llu, %llu)", f, t.name.c_str(),
                 (unsigned long long)(t.offset - data_start), (unsigned long long)(t.offset - data_start + t.nbytes),
                 prev->name.c_str(), (unsigned long long)(prev->offset - data_start),
                 (unsigned long long)(prev->offset - data_start + prev->nbytes));
    prev = &t;
  }
  for (size_t i = 0; i < st->tensors_.size(); ++i) st->index_.emplace(st->tensors_[i].name, i);
  return st;
}

}  // namespace g4
