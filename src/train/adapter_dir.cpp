#include "train/adapter_dir.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/json_bounded.h"

namespace g4::train {
namespace fs = std::filesystem;

namespace {

// The existing adapter's LoRA settings against this run's.
Status check_same_settings(const std::string& cfg_path, const LoraConfig& lc) {
  std::ifstream f(cfg_path);
  if (!f) return err("%s: cannot read (needed to --resume this adapter)", cfg_path.c_str());
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string why;
  auto j = parse_json_bounded<nlohmann::json>(text, JsonLimits{}, why);
  if (!j || !j->is_object()) return err("%s: not a JSON object%s%s", cfg_path.c_str(), why.empty() ? "" : ": ", why.c_str());
  const nlohmann::json lp = j->value("lora_parameters", nlohmann::json::object());
  auto number = [](const nlohmann::json& o, const char* k) -> std::optional<double> {
    if (!o.is_object() || !o.contains(k) || !o[k].is_number()) return std::nullopt;
    return o[k].get<double>();
  };
  struct Field {
    const char* name;
    const char* flag;
    std::optional<double> saved;
    double now;
  };
  for (const Field& fd : {Field{"num_layers", "--num-layers", number(*j, "num_layers"), double(lc.num_layers)},
                          Field{"lora_parameters.rank", "--rank", number(lp, "rank"), double(lc.rank)},
                          Field{"lora_parameters.scale", "--scale", number(lp, "scale"), double(lc.scale)}}) {
    if (!fd.saved) return err("%s: %s is missing", cfg_path.c_str(), fd.name);
    if (std::fabs(*fd.saved - fd.now) > 1e-6 * std::max(1.0, std::fabs(fd.now)))
      return err("%s: the adapter was trained with %s %g, this run has %g (pass %s %g to resume it)", cfg_path.c_str(),
                 fd.name, *fd.saved, fd.now, fd.flag, *fd.saved);
  }
  return Status::ok();
}

}  // namespace

Result<std::optional<std::string>> prepare_adapter_dir(const std::string& dir, ExistingAdapter mode,
                                                       const LoraConfig& lc) {
  const fs::path d(dir);
  const fs::path cfg = d / "adapter_config.json", weights = d / "adapters.safetensors";
  std::error_code ec;
  const bool has_cfg = fs::exists(cfg, ec), has_weights = fs::exists(weights, ec);
  if (fs::exists(d, ec) && !fs::is_directory(d, ec)) return err("%s: exists and is not a directory", dir.c_str());
  if (!has_cfg && !has_weights) {
    if (mode == ExistingAdapter::Resume)
      return err("%s: --resume: there is no adapter here to resume (adapters.safetensors)", dir.c_str());
    fs::create_directories(d, ec);
    if (ec) return err("%s: cannot create: %s", dir.c_str(), ec.message().c_str());
    return std::optional<std::string>();
  }
  switch (mode) {
    case ExistingAdapter::Refuse:
      return err("%s already holds an adapter (%s%s%s): pass --resume to continue training it, --overwrite to "
                 "replace it, or another --adapter-path", dir.c_str(), has_cfg ? "adapter_config.json" : "",
                 has_cfg && has_weights ? ", " : "", has_weights ? "adapters.safetensors" : "");
    case ExistingAdapter::Resume:
      if (!has_weights) return err("%s: --resume: adapters.safetensors is missing", dir.c_str());
      if (Status s = check_same_settings(cfg.string(), lc); !s) return Error{s.message()};
      return std::optional<std::string>(weights.string());
    case ExistingAdapter::Overwrite:
      fs::remove(weights, ec);
      if (ec) return err("%s: cannot remove: %s", weights.string().c_str(), ec.message().c_str());
      return std::optional<std::string>();
  }
  return std::optional<std::string>();
}

}  // namespace g4::train
