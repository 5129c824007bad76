// open_model: dispatch on what the path holds (see model_dir.h).
#include "io/model_dir.h"

#include <filesystem>
#include <vector>

#include "io/gguf_model.h"
#include "io/safetensors_source.h"
#include "io/tensor_store.h"

namespace g4 {

namespace fs = std::filesystem;

namespace {

bool has_ext(const fs::path& p, const char* ext) { return p.extension() == ext; }

Result<OpenedModel> open_gguf(const std::string& file) {
  G4_ASSIGN_OR_RETURN(GgufModel g, open_gguf_model(file));
  OpenedModel m;
  m.config = std::move(g.config);
  m.weights = std::move(g.weights);
  m.gguf = std::move(g.file);
  m.path = file;
  m.format = "gguf";
  return m;
}

}  // namespace

Result<OpenedModel> open_model(const std::string& path) {
  std::error_code ec;
  if (path.empty()) return err("no model path given");
  if (!fs::exists(path, ec)) return err("%s: no such file or directory", path.c_str());
  if (fs::is_regular_file(path, ec)) {
    if (has_ext(path, ".gguf")) return open_gguf(path);
    return err("%s: not a model (expected a model directory with config.json, or a .gguf file)", path.c_str());
  }
  if (!fs::is_directory(path, ec)) return err("%s: not a file or directory", path.c_str());

  if (fs::is_regular_file(fs::path(path) / "config.json", ec)) {
    G4_ASSIGN_OR_RETURN(LoadedConfig cfg, load_config(path));
    G4_ASSIGN_OR_RETURN(auto store, TensorStore::open_dir(path));
    G4_ASSIGN_OR_RETURN(auto src, SafetensorsSource::create(std::move(store), cfg.quant));
    OpenedModel m;
    m.config = std::move(cfg.model);
    m.quant = std::move(cfg.quant);
    m.multimodal_config = cfg.multimodal;
    m.weights = std::shared_ptr<WeightSource>(std::move(src));
    m.path = path;
    m.format = "safetensors";
    return m;
  }

  std::vector<std::string> ggufs;
  bool any_safetensors = false;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (!e.is_regular_file(ec)) continue;
    if (has_ext(e.path(), ".gguf")) ggufs.push_back(e.path().string());
    if (has_ext(e.path(), ".safetensors")) any_safetensors = true;
  }
  if (ggufs.size() == 1) return open_gguf(ggufs[0]);
  if (ggufs.size() > 1)
    return err("%s: %zu .gguf files in the directory; pass the one to use", path.c_str(), ggufs.size());
  if (any_safetensors) return err("%s: has *.safetensors but no config.json", path.c_str());
  return err("%s: no model found (expected config.json + *.safetensors, or a .gguf file)", path.c_str());
}

Status verify_weights(const ModelConfig& c, const WeightSource& w) {
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (t.optional && !w.has(t.name)) continue;
    if (!t.matrix) {
      G4_TRY(w.vector(t.name, t.rows));
    } else if (t.count == 0) {
      G4_TRY(w.matrix(t.name, t.rows, t.cols));
    } else {
      for (int64_t e = 0; e < t.count; ++e) G4_TRY(w.stacked_matrix(t.name, e, t.count, t.rows, t.cols));
    }
  }
  return Status::ok();
}

}  // namespace g4
