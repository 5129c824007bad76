// load_model: opens the checkpoint through io/model_dir.h (safetensors directory or GGUF file),
// resolves every weight, and builds the Model on the requested backend.
#include "io/gguf_model.h"
#include "io/model_dir.h"
#include "model/model.h"

namespace g4 {

Result<std::string> resolve_model_path(const std::string& path) {
  if (!path.empty()) return path;
  std::string def = default_model_path();
  if (def.empty()) return Error{no_model_message()};
  return def;
}

Result<std::unique_ptr<Backend>> open_backend(const std::string& backend, const BackendOptions& opt) {
  std::unique_ptr<Backend> be;
  if (backend == "ggml" || backend == "cuda") {
    std::string why;
    be = backend == "ggml" ? make_ggml_backend(&why) : make_cuda_backend(&why, opt);
    if (!be) return err("backend '%s': %s", backend.c_str(), why.c_str());
  } else {
    be = make_backend(backend);
  }
  if (!be) return err("unknown backend '%s' (expected cpu, reference, ggml or cuda)", backend.c_str());
  return be;
}

Result<std::unique_ptr<Model>> build_model(const OpenedModel& om, const std::string& backend,
                                           const BackendOptions& opt) {
  G4_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, open_backend(backend, opt));
  G4_ASSIGN_OR_RETURN(ModelWeights w, load_weights(om.config, *om.weights, *be));
  return std::make_unique<Model>(om.config, std::move(w), om.weights, std::move(be));
}

Result<std::unique_ptr<Model>> load_model(const std::string& path_in, const std::string& backend,
                                          const BackendOptions& opt) {
  G4_ASSIGN_OR_RETURN(std::string path, resolve_model_path(path_in));
  G4_ASSIGN_OR_RETURN(OpenedModel om, open_model(path));
  return build_model(om, backend, opt);
}

}  // namespace g4
