// load_model: picks the checkpoint reader (safetensors directory or GGUF file), resolves the
// config and weights, and builds the Model on the requested backend.
#include <sys/stat.h>

#include <filesystem>

#include "io/gguf_model.h"
#include "io/model_config.h"
#include "io/safetensors_source.h"
#include "io/tensor_store.h"
#include "model/model.h"

namespace g4 {
namespace fs = std::filesystem;

Result<std::string> resolve_model_path(const std::string& path_in) {
  std::string path = path_in.empty() ? default_model_path() : path_in;
  if (path.empty()) return Error{no_model_message()};
  std::error_code ec;
  if (!fs::exists(path, ec)) return err("%s: no such file or directory", path.c_str());
  if (fs::is_directory(path, ec) && !fs::exists(fs::path(path) / "config.json", ec)) {
    std::string found;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".gguf") {
        if (!found.empty()) return err("%s: several .gguf files; pass one of them", path.c_str());
        found = e.path().string();
      }
    if (found.empty())
      return err("%s: not a model directory (no config.json and no .gguf file)", path.c_str());
    return found;
  }
  return path;
}

Result<std::unique_ptr<Model>> load_model(const std::string& path_in, const std::string& backend) {
  G4_ASSIGN_OR_RETURN(std::string path, resolve_model_path(path_in));
  auto be = make_backend(backend);
  if (!be) return err("unknown backend '%s' (expected cpu or reference)", backend.c_str());
  ModelConfig cfg;
  std::shared_ptr<const WeightSource> src;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    G4_ASSIGN_OR_RETURN(GgufModel gm, open_gguf_model(path));
    cfg = std::move(gm.config);
    src = std::move(gm.weights);
  } else {
    G4_ASSIGN_OR_RETURN(LoadedConfig lc, load_config(path));
    G4_ASSIGN_OR_RETURN(std::shared_ptr<TensorStore> store, TensorStore::open_dir(path));
    G4_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsSource> s,
                        SafetensorsSource::create(std::move(store), std::move(lc.quant)));
    cfg = std::move(lc.model);
    src = std::move(s);
  }
  G4_ASSIGN_OR_RETURN(ModelWeights w, load_weights(cfg, *src, *be));
  return std::make_unique<Model>(std::move(cfg), std::move(w), std::move(src), std::move(be));
}

}  // namespace g4
