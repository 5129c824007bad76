// GGUF v2/v3 reader over a read-only memory map (mirrors ggml/src/gguf.cpp `gguf_init_from_file_impl`).
//
// Layout (little-endian): "GGUF" | u32 version | u64 n_tensors | u64 n_kv | n_kv x (string key,
// u32 type, value) | n_tensors x (string name, u32 n_dims, n_dims x i64 ne, u32 ggml_type,
// u64 offset) | padding to `general.alignment` (default 32) | data section.
// A string is u64 length + bytes (no terminator). An array is u32 element type + u64 count +
// elements (arrays of arrays allowed).
//
// Everything is validated when the file is opened: truncation, counts that cannot fit in the
// file, string lengths past EOF, unknown value / tensor types, dims whose product overflows,
// tensor data out of range, misaligned or overlapping, duplicate keys / tensor names. Errors are
// one line naming the file and the key or tensor. Nothing is copied out of the mapping: strings
// and tensor data are views that live as long as the GgufFile (which owns the mapping).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace g4 {

class MappedFile;

// ggml tensor types (ggml.h `enum ggml_type`; ids are part of the file format).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// Block geometry of a ggml type: `block_elems` consecutive row elements take `block_bytes`.
struct GgmlTypeInfo {
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
};
// nullptr for ids that are not (or no longer) ggml types.
const GgmlTypeInfo* ggml_type_info(uint32_t type);
// "Q4_K", or "type#N" for unknown ids.
std::string ggml_type_name(uint32_t type);

// GGUF metadata value types (gguf.h `enum gguf_type`).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8,
  ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view gguf_type_name(GgufType t);

struct GgufArray;

// One metadata value. Scalars are decoded at open time; strings are views into the mapping.
struct GgufValue {
  GgufType type = GgufType::U8;
  uint64_t u = 0;     // unsigned integer types and BOOL
  int64_t i = 0;      // signed integer types
  double f = 0.0;     // F32 / F64
  std::string_view str;                 // STRING
  std::shared_ptr<const GgufArray> arr;  // ARRAY

  bool is_integer() const;
  bool is_float() const { return type == GgufType::F32 || type == GgufType::F64; }
};

// An array value. Fixed-size elements stay packed in the mapping (`data`, little-endian,
// possibly unaligned); strings and nested arrays are decoded.
struct GgufArray {
  GgufType elem_type = GgufType::U8;
  uint64_t count = 0;
  const uint8_t* data = nullptr;          // fixed-size element types
  std::vector<std::string_view> strings;  // STRING elements
  std::vector<GgufValue> arrays;          // ARRAY elements (each has .arr set)

  // Element `k` of a numeric/bool array as a scalar value (k < count, elem_type fixed-size).
  GgufValue at(uint64_t k) const;
};

struct GgufTensor {
  std::string name;
  uint32_t type = 0;             // ggml type id (see GgmlType)
  std::vector<int64_t> ne;       // ggml order: ne[0] = row length (contiguous), 1..4 dims
  uint64_t offset = 0;           // from the start of the data section
  const uint8_t* data = nullptr; // into the mapping
  uint64_t nbytes = 0;
  int64_t n_elements = 0;

  int n_dims() const { return int(ne.size()); }
  // ne[1] * ne[2] * ne[3]: number of rows of ne[0] elements.
  int64_t n_rows() const { return ne.empty() ? 0 : n_elements / (ne[0] ? ne[0] : 1); }
  // Bytes of one row of ne[0] elements.
  int64_t row_bytes() const;
};

class GgufFile {
 public:
  // Maps and validates `path`.
  static Result<std::shared_ptr<const GgufFile>> open(const std::string& path);
  // Validates an in-memory image; `owner` keeps `data` alive; `name` is used in errors.
  static Result<std::shared_ptr<const GgufFile>> parse(std::shared_ptr<const void> owner,
                                                       const uint8_t* data, size_t size,
                                                       std::string name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  size_t file_size() const { return size_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const GgufValue* find(std::string_view key) const;

  // Typed getters: an error names the file and key when it is missing or of another type.
  // Integer getters accept any integer type whose value fits; float getters accept F32/F64.
  Result<int64_t> get_int(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<double> get_f64(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string_view> get_string(std::string_view key) const;
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;    // F32/F64 elements
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;  // integer/BOOL elements
  // Raw array (nullptr when missing or not an array).
  const GgufArray* get_array(std::string_view key) const;

  // Tensors in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  Status parse_all();

  std::shared_ptr<const void> owner_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace g4
