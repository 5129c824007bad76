// One safetensors file, memory-mapped and validated (format: 8-byte little-endian header length N,
// N bytes of JSON {name: {dtype, shape, data_offsets:[begin,end]}, "__metadata__": {str: str}},
// then the data block; offsets are relative to the start of the data block).
//
// open() checks everything a hostile or truncated file could get wrong and returns one-line errors
// that name the file (and the tensor): too short, header length past EOF or > 100 MB, invalid JSON,
// duplicate names, unknown dtype, bad shape, offsets out of range, end < begin, overlapping data
// ranges, and nbytes != product(shape) * dtype_size. Tensor data is never copied: TensorInfo::data
// points into the mapping, which lives as long as the SafetensorsFile.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace g4 {

struct TensorInfo {
  std::string name;
  DType dtype = DType::Unknown;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping (may be unaligned only if the writer misaligned it)
  uint64_t nbytes = 0;
  uint64_t offset = 0;            // absolute byte offset in the file

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::string shape_str() const;  // "[2, 3]"
};

class SafetensorsFile {
 public:
  // Largest accepted JSON header (the reference `safetensors` library uses the same limit).
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses an in-memory image (used by open(); `label` names it in errors). `keep` owns the bytes.
  static Result<std::shared_ptr<SafetensorsFile>> parse(const uint8_t* bytes, size_t size,
                                                        const std::string& label,
                                                        std::shared_ptr<MappedFile> keep);

  const std::string& path() const { return path_; }
  // Tensors in file order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return size_; }

 private:
  std::string path_;
  size_t size_ = 0;
  std::shared_ptr<MappedFile> map_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace g4
