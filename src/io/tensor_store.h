// All tensors of a (possibly sharded) safetensors checkpoint, by stored name.
// Shards come from model.safetensors.index.json's weight_map when it exists, otherwise from the
// files matching model*.safetensors (mlx-lm's glob), or any *.safetensors when none match.
// Every file stays memory-mapped for the store's lifetime; lookups return views into it.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"

namespace g4 {

struct StoredTensor {
  const TensorInfo* info = nullptr;
  const SafetensorsFile* file = nullptr;
};

class TensorStore {
 public:
  // Opens the safetensors files of a model directory (see above). Errors: no safetensors files,
  // invalid index JSON, a shard that fails validation, a tensor listed in the index but missing
  // from its shard (names both), the same tensor in two shards.
  static Result<std::shared_ptr<TensorStore>> open_dir(const std::string& dir);
  // Opens exactly these files (no index).
  static Result<std::shared_ptr<TensorStore>> open_files(const std::vector<std::string>& paths);

  // nullptr info when absent.
  StoredTensor find(std::string_view name) const;
  const std::map<std::string, StoredTensor, std::less<>>& all() const { return by_name_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_bytes() const;  // sum of tensor data bytes
  const std::string& root() const { return root_; }

 private:
  Status add_file(std::shared_ptr<SafetensorsFile> f);
  std::string root_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, StoredTensor, std::less<>> by_name_;
};

}  // namespace g4
