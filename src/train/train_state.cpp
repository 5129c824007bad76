#include "train/train_state.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <type_traits>

#include "core/atomic_file.h"
#include "io/json_bounded.h"

namespace g4::train {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'G', '4', 'T', 'R', 'A', 'I', 'N', '1'};

// The float arrays of a state (const or not) in file order, with their names in the header.
template <class State>
auto arrays(State& s) {
  using Vecs = std::conditional_t<std::is_const_v<State>, const std::vector<std::vector<float>>,
                                  std::vector<std::vector<float>>>;
  return std::vector<std::pair<const char*, Vecs*>>{{"opt_m", &s.opt_m}, {"opt_v", &s.opt_v}, {"grads", &s.grads}};
}

}  // namespace

std::string train_state_path(const std::string& adapter_file) {
  const fs::path p(adapter_file);
  const std::string name = p.filename().string();
  const std::string suffix = "_adapters.safetensors";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return (p.parent_path() / (name.substr(0, name.size() - suffix.size()) + "_training_state.bin")).string();
  return (p.parent_path() / "training_state.bin").string();
}

Status save_train_state(const std::string& path, const TrainState& s) {
  nlohmann::ordered_json h;
  h["iteration"] = s.iteration;
  h["rng"] = s.rng;
  h["batch_order"] = s.batches.order;
  h["batch_pos"] = s.batches.pos;
  h["batch_started"] = s.batches.started;
  h["losses"] = s.losses;
  h["train_time"] = s.train_time;
  h["n_tokens"] = s.n_tokens;
  h["trained_tokens"] = s.trained_tokens;
  h["steps"] = s.steps;
  h["fingerprint"] = s.fingerprint;
  std::string body;
  for (auto& [name, vecs] : arrays(s)) {
    std::vector<size_t> lens;
    for (const auto& v : *vecs) {
      lens.push_back(v.size());
      body.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    }
    h["arrays"][name] = lens;
  }
  const std::string header = h.dump();
  std::string out(kMagic, sizeof kMagic);
  const uint64_t hn = header.size();
  out.append(reinterpret_cast<const char*>(&hn), sizeof hn);
  out += header;
  out += body;
  return write_file_atomic(path, out);
}

Result<TrainState> load_train_state(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return err("%s: cannot read", path.c_str());
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t hn = 0;
  if (data.size() < sizeof kMagic + sizeof hn || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0)
    return err("%s: not a training state file", path.c_str());
  std::memcpy(&hn, data.data() + sizeof kMagic, sizeof hn);
  const size_t at = sizeof kMagic + sizeof hn;
  if (hn > data.size() - at) return err("%s: cut short (its header)", path.c_str());
  TrainState s;
  try {
    std::string why;
    const auto parsed = parse_json_bounded<nlohmann::json>(std::string_view(data).substr(at, size_t(hn)), JsonLimits{},
                                                          why);
    if (!parsed) return err("%s: malformed header: %s", path.c_str(), why.c_str());
    const nlohmann::json& h = *parsed;
    s.iteration = h.at("iteration").get<int>();
    s.rng = h.at("rng").get<std::string>();
    s.batches.order = h.at("batch_order").get<std::vector<int>>();
    s.batches.pos = h.at("batch_pos").get<size_t>();
    s.batches.started = h.at("batch_started").get<bool>();
    s.losses = h.at("losses").get<double>();
    s.train_time = h.at("train_time").get<double>();
    s.n_tokens = h.at("n_tokens").get<long>();
    s.trained_tokens = h.at("trained_tokens").get<long>();
    s.steps = h.at("steps").get<int>();
    s.fingerprint = nlohmann::ordered_json::parse(h.at("fingerprint").dump());
    size_t pos = at + size_t(hn);
    for (auto& [name, vecs] : arrays(s)) {
      for (size_t len : h.at("arrays").at(name).get<std::vector<size_t>>()) {
        if (len > (data.size() - pos) / sizeof(float)) return err("%s: cut short (%s)", path.c_str(), name);
        std::vector<float> v(len);
        std::memcpy(v.data(), data.data() + pos, len * sizeof(float));
        pos += len * sizeof(float);
        vecs->push_back(std::move(v));
      }
    }
    if (pos != data.size()) return err("%s: %zu bytes past its arrays", path.c_str(), data.size() - pos);
  } catch (const std::exception& e) {
    return err("%s: malformed header: %s", path.c_str(), e.what());
  }
  if (s.iteration < 0) return err("%s: iteration %d", path.c_str(), s.iteration);
  return s;
}

}  // namespace g4::train
