// Sharded safetensors checkpoints: see tensor_store.h. Mirrors mlx-lm utils.load_model, which
// globs model*.safetensors; the index (HF sharding) is also checked entry by entry.
#include "io/tensor_store.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace g4 {

namespace fs = std::filesystem;
using nlohmann::json;

StoredTensor TensorStore::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? StoredTensor{} : it->second;
}

uint64_t TensorStore::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [k, v] : by_name_) n += v.info->nbytes;
  return n;
}

Status TensorStore::add_file(std::shared_ptr<SafetensorsFile> f) {
  for (const auto& t : f->tensors()) {
    auto [it, fresh] = by_name_.emplace(t.name, StoredTensor{&t, f.get()});
    if (!fresh)
      return err("%s: tensor '%s' is also in %s", f->path().c_str(), t.name.c_str(), it->second.file->path().c_str());
  }
  files_.push_back(std::move(f));
  return Status::ok();
}

Result<std::shared_ptr<TensorStore>> TensorStore::open_files(const std::vector<std::string>& paths) {
  auto s = std::shared_ptr<TensorStore>(new TensorStore());
  if (!paths.empty()) s->root_ = fs::path(paths[0]).parent_path().string();
  for (const auto& p : paths) {
    G4_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(p));
    G4_TRY(s->add_file(std::move(f)));
  }
  return s;
}

namespace {

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return err("%s: cannot open", path.c_str());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return err("%s: read error", path.c_str());
  return ss.str();
}

}  // namespace

Result<std::shared_ptr<TensorStore>> TensorStore::open_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return err("%s: not a directory", dir.c_str());
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    const std::string ip = index_path.string();
    G4_ASSIGN_OR_RETURN(std::string text, read_text(ip));
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      std::string m = e.what();
      for (char& c : m)
        if (c == '\n') c = ' ';
      return err("%s: not valid JSON: %s", ip.c_str(), m.c_str());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return err("%s: missing object 'weight_map'", ip.c_str());
    const json& wm = j["weight_map"];
    std::vector<std::string> shards;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      if (!it->is_string())
        return err("%s: weight_map entry for '%s' is not a file name", ip.c_str(), it.key().c_str());
      const std::string& shard = it->get_ref<const std::string&>();
      fs::path sp(shard);
      bool bad = shard.empty() || sp.is_absolute();
      for (const auto& part : sp) bad |= (part == "..");
      if (bad)
        return err("%s: weight_map entry for '%s' names an unsafe shard path '%s'", ip.c_str(), it.key().c_str(),
                   shard.c_str());
      if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
    }
    if (shards.empty()) return err("%s: weight_map is empty", ip.c_str());
    std::vector<std::string> paths;
    for (const auto& sh : shards) {
      fs::path p = fs::path(dir) / sh;
      if (!fs::is_regular_file(p, ec))
        return err("%s: shard '%s' listed in the index does not exist", ip.c_str(), sh.c_str());
      paths.push_back(p.string());
    }
    G4_ASSIGN_OR_RETURN(auto store, open_files(paths));
    store->root_ = dir;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      const std::string shard_path = (fs::path(dir) / it->get<std::string>()).string();
      StoredTensor t = store->find(it.key());
      if (!t.info)
        return err("%s: tensor '%s' listed in %s is missing from that shard", shard_path.c_str(), it.key().c_str(),
                   ip.c_str());
      if (t.file->path() != shard_path)
        return err("%s: tensor '%s' is in %s, but the index %s puts it in this shard", shard_path.c_str(),
                   it.key().c_str(), t.file->path().c_str(), ip.c_str());
    }
    return store;
  }

  // No index: mlx-lm's glob, model*.safetensors; else every *.safetensors.
  std::vector<std::string> model_files, any_files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    std::string name = e.path().filename().string();
    if (name.size() < 12 || name.compare(name.size() - 12, 12, ".safetensors") != 0) continue;
    any_files.push_back(e.path().string());
    if (name.rfind("model", 0) == 0) model_files.push_back(e.path().string());
  }
  if (ec) return err("%s: cannot list directory: %s", dir.c_str(), ec.message().c_str());
  auto& files = model_files.empty() ? any_files : model_files;
  if (files.empty()) return err("%s: no *.safetensors files in the directory", dir.c_str());
  std::sort(files.begin(), files.end());
  G4_ASSIGN_OR_RETURN(auto store, open_files(files));
  store->root_ = dir;
  return store;
}

}  // namespace g4
