// Read-only memory map of a whole file. Weights are views into these mappings; opening a model
// never reads all of its bytes into RAM.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace g4 {

class MappedFile {
 public:
  // Maps `path` read-only. Errors name the path and the system reason.
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace g4
