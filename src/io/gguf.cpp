// GGUF reader; see gguf.h. Mirrors the checks of ggml/src/gguf.cpp (gguf_init_from_file_impl)
// plus overlap / range checks on tensor data, without ever reading past the mapping.
#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/mapped_file.h"

namespace g4 {

namespace {

constexpr int kMaxArrayDepth = 8;   // nested arrays deeper than this are rejected (stack safety)
constexpr uint32_t kMaxDims = 4;    // GGML_MAX_DIMS
constexpr uint32_t kDefaultAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT

struct TypeRow {
  uint32_t id;
  GgmlTypeInfo info;
};
// ggml type traits (ggml.c `type_traits`: blck_size, type_size).
constexpr TypeRow kTypes[] = {
    {0, {"F32", 1, 4}},        {1, {"F16", 1, 2}},        {2, {"Q4_0", 32, 18}},
    {3, {"Q4_1", 32, 20}},     {6, {"Q5_0", 32, 22}},     {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},     {9, {"Q8_1", 32, 36}},     {10, {"Q2_K", 256, 84}},
    {11, {"Q3_K", 256, 110}},  {12, {"Q4_K", 256, 144}},  {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},  {15, {"Q8_K", 256, 292}},  {16, {"IQ2_XXS", 256, 66}},
    {17, {"IQ2_XS", 256, 74}}, {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},
    {20, {"IQ4_NL", 32, 18}},  {21, {"IQ3_S", 256, 110}}, {22, {"IQ2_S", 256, 82}},
    {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},       {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},       {27, {"I64", 1, 8}},       {28, {"F64", 1, 8}},
    {29, {"IQ1_M", 256, 56}},  {30, {"BF16", 1, 2}},      {34, {"TQ1_0", 256, 54}},
    {35, {"TQ2_0", 256, 66}},  {39, {"MXFP4", 32, 17}},
};

// Size of a fixed-size metadata type, 0 for STRING/ARRAY/unknown.
size_t fixed_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    default: return 0;
  }
}

bool known_type(uint32_t t) { return t <= uint32_t(GgufType::F64); }

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86/ARM little-endian hosts only (as ggml)
  return v;
}

// Decodes a fixed-size scalar at p (validated type, enough bytes).
GgufValue decode_scalar(GgufType t, const uint8_t* p) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::U8: v.u = p[0]; break;
    case GgufType::I8: v.i = int8_t(p[0]); break;
    case GgufType::BOOL: v.u = p[0]; break;
    case GgufType::U16: v.u = load_le<uint16_t>(p); break;
    case GgufType::I16: v.i = load_le<int16_t>(p); break;
    case GgufType::U32: v.u = load_le<uint32_t>(p); break;
    case GgufType::I32: v.i = load_le<int32_t>(p); break;
    case GgufType::F32: v.f = load_le<float>(p); break;
    case GgufType::U64: v.u = load_le<uint64_t>(p); break;
    case GgufType::I64: v.i = load_le<int64_t>(p); break;
    case GgufType::F64: v.f = load_le<double>(p); break;
    default: break;
  }
  return v;
}

bool is_signed(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

// Bounds-checked cursor over the file image. Every read reports the offset where it failed.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  Status need(size_t n, const char* what, std::string_view ctx) const {
    if (n > remaining())
      return err("%s: truncated at offset %zu reading %s%s%.*s (need %zu bytes, %zu left)",
                 path_.c_str(), pos_, what, ctx.empty() ? "" : " of ", int(ctx.size()),
                 ctx.data(), n, remaining());
    return {};
  }
  template <class T>
  Result<T> read(const char* what, std::string_view ctx) {
    G4_TRY(need(sizeof(T), what, ctx));
    T v = load_le<T>(base_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  Result<std::string_view> read_string(const char* what, std::string_view ctx) {
    G4_ASSIGN_OR_RETURN(uint64_t n, read<uint64_t>(what, ctx));
    if (n > remaining())
      return err("%s: %s%s%.*s at offset %zu has length %llu past end of file (%zu bytes left)",
                 path_.c_str(), what, ctx.empty() ? "" : " of ", int(ctx.size()), ctx.data(),
                 pos_ - 8, (unsigned long long)n, remaining());
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  const uint8_t* here() const { return base_ + pos_; }
  void skip(size_t n) { pos_ += n; }  // caller checked need()

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

// Reads one value of type t (already validated as known) for key `key`.
Result<GgufValue> read_value(Cursor& c, GgufType t, const std::string& path, std::string_view key,
                             int depth) {
  if (size_t sz = fixed_size(t)) {
    G4_TRY(c.need(sz, "value", key));
    GgufValue v = decode_scalar(t, c.here());
    if (t == GgufType::BOOL && v.u > 1)
      return err("%s: metadata key %.*s: bool value %llu is not 0 or 1", path.c_str(),
                 int(key.size()), key.data(), (unsigned long long)v.u);
    c.skip(sz);
    return v;
  }
  GgufValue v;
  v.type = t;
  if (t == GgufType::STRING) {
    G4_ASSIGN_OR_RETURN(v.str, c.read_string("string value", key));
    return v;
  }
  // ARRAY
  if (depth >= kMaxArrayDepth)
    return err("%s: metadata key %.*s: arrays nested deeper than %d", path.c_str(),
               int(key.size()), key.data(), kMaxArrayDepth);
  G4_ASSIGN_OR_RETURN(uint32_t et, c.read<uint32_t>("array element type", key));
  if (!known_type(et))
    return err("%s: metadata key %.*s: unknown array element type %u", path.c_str(),
               int(key.size()), key.data(), et);
  G4_ASSIGN_OR_RETURN(uint64_t n, c.read<uint64_t>("array count", key));
  auto arr = std::make_shared<GgufArray>();
  arr->elem_type = GgufType(et);
  arr->count = n;
  // Smallest encoding of one element: its fixed size, 8 (string length), 12 (nested array header).
  size_t min_elem = fixed_size(arr->elem_type);
  if (!min_elem) min_elem = arr->elem_type == GgufType::STRING ? 8 : 12;
  if (n > c.remaining() / min_elem)
    return err("%s: metadata key %.*s: array count %llu of %s does not fit in the %zu bytes left",
               path.c_str(), int(key.size()), key.data(), (unsigned long long)n,
               std::string(gguf_type_name(arr->elem_type)).c_str(), c.remaining());
  if (size_t sz = fixed_size(arr->elem_type)) {
    arr->data = c.here();
    if (arr->elem_type == GgufType::BOOL) {
      for (uint64_t k = 0; k < n; ++k)
        if (arr->data[k] > 1)
          return err("%s: metadata key %.*s: bool element %llu is %u, not 0 or 1", path.c_str(),
                     int(key.size()), key.data(), (unsigned long long)k, arr->data[k]);
    }
    c.skip(size_t(n) * sz);
  } else if (arr->elem_type == GgufType::STRING) {
    arr->strings.reserve(size_t(std::min<uint64_t>(n, 1u << 20)));
    for (uint64_t k = 0; k < n; ++k) {
      G4_ASSIGN_OR_RETURN(std::string_view s, c.read_string("array string", key));
      arr->strings.push_back(s);
    }
  } else {
    arr->arrays.reserve(size_t(std::min<uint64_t>(n, 1u << 16)));
    for (uint64_t k = 0; k < n; ++k) {
      G4_ASSIGN_OR_RETURN(GgufValue e, read_value(c, GgufType::ARRAY, path, key, depth + 1));
      arr->arrays.push_back(std::move(e));
    }
  }
  v.arr = std::move(arr);
  return v;
}

std::string key_str(std::string_view k) { return std::string(k); }

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  for (const auto& r : kTypes)
    if (r.id == type) return &r.info;
  return nullptr;
}

std::string ggml_type_name(uint32_t type) {
  if (const GgmlTypeInfo* t = ggml_type_info(type)) return t->name;
  return "type#" + std::to_string(type);
}

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  return fixed_size(type) && type != GgufType::BOOL && !is_float();
}

GgufValue GgufArray::at(uint64_t k) const {
  size_t sz = fixed_size(elem_type);
  G4_CHECK(sz && data && k < count);
  return decode_scalar(elem_type, data + k * sz);
}

int64_t GgufTensor::row_bytes() const {
  const GgmlTypeInfo* t = ggml_type_info(type);
  if (!t || ne.empty()) return 0;
  return ne[0] / t->block_elems * t->block_bytes;
}

Result<std::shared_ptr<const GgufFile>> GgufFile::open(const std::string& path) {
  G4_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> m, MappedFile::open(path));
  const uint8_t* data = m->data();
  size_t size = m->size();
  return parse(std::shared_ptr<const void>(m, m.get()), data, size, path);
}

Result<std::shared_ptr<const GgufFile>> GgufFile::parse(std::shared_ptr<const void> owner,
                                                        const uint8_t* data, size_t size,
                                                        std::string name) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->owner_ = std::move(owner);
  f->base_ = data;
  f->size_ = size;
  f->path_ = std::move(name);
  G4_TRY(f->parse_all());
  return std::shared_ptr<const GgufFile>(std::move(f));
}

Status GgufFile::parse_all() {
  const char* P = path_.c_str();
  Cursor c(base_, size_, path_);
  G4_TRY(c.need(4, "magic", ""));
  if (std::memcmp(base_, "GGUF", 4) != 0) return err("%s: not a GGUF file (bad magic)", P);
  c.skip(4);
  G4_ASSIGN_OR_RETURN(version_, c.read<uint32_t>("version", ""));
  if (version_ == 1) return err("%s: GGUF version 1 is not supported (only v2/v3)", P);
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xffff) == 0)
      return err("%s: GGUF version %u looks byte-swapped (big-endian file?)", P, version_);
    return err("%s: unsupported GGUF version %u (only v2/v3)", P, version_);
  }
  G4_ASSIGN_OR_RETURN(uint64_t n_tensors, c.read<uint64_t>("tensor count", ""));
  G4_ASSIGN_OR_RETURN(uint64_t n_kv, c.read<uint64_t>("metadata count", ""));
  // Each kv takes >= 8 (key length) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13)
    return err("%s: metadata count %llu cannot fit in a %zu-byte file", P,
               (unsigned long long)n_kv, size_);
  if (n_tensors > c.remaining() / 32)
    return err("%s: tensor count %llu cannot fit in a %zu-byte file", P,
               (unsigned long long)n_tensors, size_);

  kv_.reserve(size_t(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string idx = "metadata key #" + std::to_string(k);
    G4_ASSIGN_OR_RETURN(std::string_view key, c.read_string("name", idx));
    if (key.empty()) return err("%s: %s has an empty name", P, idx.c_str());
    G4_ASSIGN_OR_RETURN(uint32_t t, c.read<uint32_t>("value type", key));
    if (!known_type(t))
      return err("%s: metadata key %s has unknown value type %u", P, key_str(key).c_str(), t);
    G4_ASSIGN_OR_RETURN(GgufValue v, read_value(c, GgufType(t), path_, key, 0));
    std::string ks(key);
    if (!kv_index_.emplace(ks, kv_.size()).second)
      return err("%s: duplicate metadata key %s", P, ks.c_str());
    kv_.emplace_back(std::move(ks), std::move(v));
  }

  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::U32)
      return err("%s: metadata key general.alignment has type %s, expected u32", P,
                 std::string(gguf_type_name(a->type)).c_str());
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      return err("%s: general.alignment %llu is not a power of two", P,
                 (unsigned long long)a->u);
    alignment_ = uint32_t(a->u);
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    std::string idx = "tensor #" + std::to_string(k);
    GgufTensor t;
    G4_ASSIGN_OR_RETURN(std::string_view name, c.read_string("name", idx));
    if (name.empty()) return err("%s: %s has an empty name", P, idx.c_str());
    t.name = std::string(name);
    const char* N = t.name.c_str();
    G4_ASSIGN_OR_RETURN(uint32_t nd, c.read<uint32_t>("n_dims", name));
    if (nd < 1 || nd > kMaxDims)
      return err("%s: tensor %s has %u dims (expected 1..%u)", P, N, nd, kMaxDims);
    int64_t n_el = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      G4_ASSIGN_OR_RETURN(int64_t ne, c.read<int64_t>("dim", name));
      if (ne < 0) return err("%s: tensor %s has negative dim ne[%u] = %lld", P, N, d, (long long)ne);
      if (ne != 0 && n_el > std::numeric_limits<int64_t>::max() / ne)
        return err("%s: tensor %s: element count overflows (dims product too large)", P, N);
      n_el *= ne;
      t.ne.push_back(ne);
    }
    t.n_elements = n_el;
    G4_ASSIGN_OR_RETURN(t.type, c.read<uint32_t>("type", name));
    const GgmlTypeInfo* ti = ggml_type_info(t.type);
    if (!ti) return err("%s: tensor %s has unknown ggml type %u", P, N, t.type);
    if (t.ne[0] % ti->block_elems != 0)
      return err("%s: tensor %s: row length %lld is not a multiple of the %s block size %lld", P,
                 N, (long long)t.ne[0], ti->name, (long long)ti->block_elems);
    // nbytes = blocks * block_bytes; blocks = n_el / block_elems (exact: ne[0] divisible).
    int64_t blocks = n_el / ti->block_elems;
    if (blocks > std::numeric_limits<int64_t>::max() / ti->block_bytes)
      return err("%s: tensor %s: byte size overflows", P, N);
    t.nbytes = uint64_t(blocks * ti->block_bytes);
    G4_ASSIGN_OR_RETURN(t.offset, c.read<uint64_t>("data offset", name));
    if (t.offset % alignment_ != 0)
      return err("%s: tensor %s: data offset %llu is not a multiple of the alignment %u", P, N,
                 (unsigned long long)t.offset, alignment_);
    if (!tensor_index_.emplace(t.name, tensors_.size()).second)
      return err("%s: duplicate tensor name %s", P, N);
    tensors_.push_back(std::move(t));
  }

  // Data section: after the tensor infos, padded to the alignment.
  uint64_t end = c.pos();
  data_offset_ = (end + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > size_)
    return err("%s: truncated: data section starts at %llu past end of file (%zu bytes)", P,
               (unsigned long long)data_offset_, size_);
  uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (GgufTensor& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      return err("%s: tensor %s: data [%llu, +%llu) lies past the end of the data section "
                 "(%llu bytes; file truncated?)",
                 P, t.name.c_str(), (unsigned long long)t.offset, (unsigned long long)t.nbytes,
                 (unsigned long long)data_size);
    t.data = base_ + data_offset_ + t.offset;
  }
  // No two tensors may share bytes.
  std::vector<const GgufTensor*> by_off;
  by_off.reserve(tensors_.size());
  for (const GgufTensor& t : tensors_) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_off.size(); ++k) {
    const GgufTensor* a = by_off[k - 1];
    const GgufTensor* b = by_off[k];
    if (a->nbytes && b->nbytes && a->offset + a->nbytes > b->offset)
      return err("%s: tensor %s overlaps tensor %s in the data section", P, b->name.c_str(),
                 a->name.c_str());
  }
  return {};
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensor* GgufFile::tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Error missing(const std::string& path, std::string_view key) {
  return err("%s: metadata key %.*s is missing", path.c_str(), int(key.size()), key.data());
}
Error wrong_type(const std::string& path, std::string_view key, const GgufValue& v,
                 const char* expected) {
  std::string got(gguf_type_name(v.type));
  if (v.type == GgufType::ARRAY && v.arr) got += " of " + std::string(gguf_type_name(v.arr->elem_type));
  return err("%s: metadata key %.*s has type %s, expected %s", path.c_str(), int(key.size()),
             key.data(), got.c_str(), expected);
}

// Integer scalar as a (sign, magnitude) pair checked into [lo, hi].
bool int_in_range(const GgufValue& v, long double lo, long double hi, long double* out) {
  long double x = is_signed(v.type) ? (long double)v.i : (long double)v.u;
  if (x < lo || x > hi) return false;
  *out = x;
  return true;
}

}  // namespace

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (!v->is_integer()) return wrong_type(path_, key, *v, "an integer");
  if (is_signed(v->type)) return v->i;
  if (v->u > uint64_t(std::numeric_limits<int64_t>::max()))
    return err("%s: metadata key %.*s value %llu is out of range", path_.c_str(), int(key.size()),
               key.data(), (unsigned long long)v->u);
  return int64_t(v->u);
}

Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (!v->is_integer()) return wrong_type(path_, key, *v, "an integer");
  long double x;
  if (!int_in_range(*v, 0, 4294967295.0L, &x))
    return err("%s: metadata key %.*s value is out of the u32 range", path_.c_str(),
               int(key.size()), key.data());
  return uint32_t(x);
}

Result<uint64_t> GgufFile::get_u64(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (!v->is_integer()) return wrong_type(path_, key, *v, "an integer");
  if (is_signed(v->type)) {
    if (v->i < 0)
      return err("%s: metadata key %.*s value %lld is negative", path_.c_str(), int(key.size()),
                 key.data(), (long long)v->i);
    return uint64_t(v->i);
  }
  return v->u;
}

Result<double> GgufFile::get_f64(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (!v->is_float()) return wrong_type(path_, key, *v, "f32 or f64");
  return v->f;
}

Result<float> GgufFile::get_f32(std::string_view key) const {
  G4_ASSIGN_OR_RETURN(double d, get_f64(key));
  return float(d);
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::BOOL) return wrong_type(path_, key, *v, "bool");
  return v->u != 0;
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::STRING) return wrong_type(path_, key, *v, "string");
  return v->str;
}

const GgufArray* GgufFile::get_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v && v->type == GgufType::ARRAY ? v->arr.get() : nullptr;
}

Result<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::ARRAY || v->arr->elem_type != GgufType::STRING)
    return wrong_type(path_, key, *v, "array of string");
  return v->arr->strings;
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::ARRAY || (v->arr->elem_type != GgufType::F32 &&
                                     v->arr->elem_type != GgufType::F64))
    return wrong_type(path_, key, *v, "array of f32");
  std::vector<float> out(size_t(v->arr->count));
  for (uint64_t k = 0; k < v->arr->count; ++k) out[k] = float(v->arr->at(k).f);
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::ARRAY || !fixed_size(v->arr->elem_type) ||
      v->arr->elem_type == GgufType::F32 || v->arr->elem_type == GgufType::F64)
    return wrong_type(path_, key, *v, "array of integers");
  std::vector<int64_t> out(size_t(v->arr->count));
  for (uint64_t k = 0; k < v->arr->count; ++k) {
    GgufValue e = v->arr->at(k);
    if (is_signed(e.type)) {
      out[k] = e.i;
    } else {
      if (e.u > uint64_t(std::numeric_limits<int64_t>::max()))
        return err("%s: metadata key %.*s element %llu is out of range", path_.c_str(),
                   int(key.size()), key.data(), (unsigned long long)k);
      out[k] = int64_t(e.u);
    }
  }
  return out;
}

}  // namespace g4
