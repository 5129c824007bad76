// Named LoRA adapters mounted over the served model (`serve --adapter NAME=DIR`, POST
// /v1/load_lora_adapter): a request picks one by name (GenerationSpec::adapter), and sequences with
// different adapters share each forward (SeqInput::adapter adds each adapter's delta to its own
// sequences' rows). Loading places an adapter's matrices on the model's backend, so mounting runs on
// the engine thread (Engine::run_exclusive); an unmounted adapter's memory goes back to the backend
// at a later mount or unmount, once no request holds it any more.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/lora.h"

namespace g4 {

class Engine;

struct MountedAdapter {
  std::string name, path;
  // Unique per mount (never reused): the prefix cache keeps one mount's KV apart from the base
  // model's and from other mounts' (an adapter on k/v projections changes the cached keys).
  uint64_t serial = 0;
  std::unique_ptr<LoraAdapter> lora;
};

class AdapterSet {
 public:
  explicit AdapterSet(Engine& engine) : engine_(engine) {}
  // Loads the mlx-lm adapter directory `dir` as `name` (letters, digits, '.', '_', '-'; at most 64).
  // Errors name the adapter: a name taken or malformed, the loader's message (model/lora.h).
  Status mount(const std::string& name, const std::string& dir);
  // Error when no adapter of that name is mounted.
  Status unmount(const std::string& name);
  // The mounted adapter of that name, or null.
  std::shared_ptr<const MountedAdapter> find(const std::string& name) const;
  // Every mounted adapter, by name.
  std::vector<std::shared_ptr<const MountedAdapter>> list() const;

 private:
  // On the engine thread: gives back the memory of unmounted adapters no request holds.
  void release_unused();

  Engine& engine_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<MountedAdapter>> mounted_;
  std::vector<std::shared_ptr<MountedAdapter>> unmounted_;  // until no request holds them
  uint64_t next_serial_ = 1;
};

}  // namespace g4
