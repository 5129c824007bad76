#include "runtime/adapter_set.h"

#include "core/plain_name.h"
#include "runtime/engine.h"

namespace g4 {
Status AdapterSet::mount(const std::string& name, const std::string& dir) {
  if (!is_plain_name(name, 64))
    return Error{"adapter name '" + name + "': use 1 to 64 letters, digits, '.', '_' or '-'"};
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (mounted_.count(name)) return Error{"adapter '" + name + "' is already mounted (unmount it first)"};
  }
  Result<std::unique_ptr<LoraAdapter>> loaded = Error{"not loaded"};
  Status st = engine_.run_exclusive([&] {
    release_unused();
    loaded = engine_.model().load_adapter(dir);
  });
  if (!st) return st;
  if (!loaded) return Error{"adapter '" + name + "': " + loaded.message()};
  auto m = std::make_shared<MountedAdapter>();
  m->name = name;
  m->path = dir;
  m->lora = std::move(loaded).value();
  std::lock_guard<std::mutex> lk(mu_);
  if (mounted_.count(name)) {  // mounted by another caller meanwhile: this copy waits for release
    unmounted_.push_back(std::move(m));
    return Error{"adapter '" + name + "' is already mounted (unmount it first)"};
  }
  m->serial = next_serial_++;
  mounted_[name] = std::move(m);
  return Status::ok();
}

Status AdapterSet::unmount(const std::string& name) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = mounted_.find(name);
    if (it == mounted_.end()) return Error{"no adapter named '" + name + "' is mounted"};
    unmounted_.push_back(std::move(it->second));
    mounted_.erase(it);
  }
  return engine_.run_exclusive([&] { release_unused(); });
}

void AdapterSet::release_unused() {
  std::vector<std::shared_ptr<MountedAdapter>> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto keep = std::partition(unmounted_.begin(), unmounted_.end(),
                               [](const std::shared_ptr<MountedAdapter>& m) { return m.use_count() > 1; });
    done.assign(std::make_move_iterator(keep), std::make_move_iterator(unmounted_.end()));
    unmounted_.erase(keep, unmounted_.end());
  }
  for (auto& m : done) engine_.model().release_adapter(*m->lora);
}

std::shared_ptr<const MountedAdapter> AdapterSet::find(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = mounted_.find(name);
  return it == mounted_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const MountedAdapter>> AdapterSet::list() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::shared_ptr<const MountedAdapter>> out;
  for (const auto& [n, m] : mounted_) out.push_back(m);
  return out;
}

}  // namespace g4
