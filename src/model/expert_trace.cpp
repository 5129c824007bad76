// The expert trace's writer and its summary (expert_trace.h).
#include "model/expert_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

namespace g4 {

Result<std::unique_ptr<ExpertTrace>> ExpertTrace::open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return err("--trace-experts %s: cannot open for appending: %s", path.c_str(), std::strerror(errno));
  return std::unique_ptr<ExpertTrace>(new ExpertTrace(path, f));
}

ExpertTrace::~ExpertTrace() {
  if (f_) std::fclose(f_);
}

void ExpertTrace::record(int n_experts, int top_k, const std::vector<int>& moe_layers, const std::vector<Row>& rows,
                         const int32_t* idx, const float* w) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  if (steps_ == 0) {
    out += "{\"trace\":\"gemma4-experts\",\"version\":1,\"n_experts\":" + std::to_string(n_experts) +
           ",\"top_k\":" + std::to_string(top_k) + ",\"moe_layers\":[";
    for (size_t i = 0; i < moe_layers.size(); ++i) out += (i ? "," : "") + std::to_string(moe_layers[i]);
    out += "]}\n";
  }
  const size_t R = rows.size(), L = moe_layers.size(), K = size_t(top_k);
  char num[32];
  for (size_t r = 0; r < R; ++r) {
    out += "{\"step\":" + std::to_string(steps_) + ",\"seq\":" + std::to_string(rows[r].seq) +
           ",\"pos\":" + std::to_string(rows[r].pos) + ",\"token\":" + std::to_string(rows[r].token) +
           ",\"experts\":[";
    for (size_t l = 0; l < L; ++l) {
      out += l ? ",[" : "[";
      for (size_t k = 0; k < K; ++k) out += (k ? "," : "") + std::to_string(idx[(l * R + r) * K + k]);
      out += "]";
    }
    out += "],\"weights\":[";
    for (size_t l = 0; l < L; ++l) {
      out += l ? ",[" : "[";
      for (size_t k = 0; k < K; ++k) {
        std::snprintf(num, sizeof num, "%s%.6g", k ? "," : "", double(w[(l * R + r) * K + k]));
        out += num;
      }
      out += "]";
    }
    out += "]}\n";
  }
  ++steps_;
  std::fwrite(out.data(), 1, out.size(), f_);
  std::fflush(f_);
}

namespace {

// One run of a trace file: its header's geometry and the routed counts per (layer, expert).
struct TraceRun {
  int n_experts = 0, top_k = 0;
  std::vector<int> layers;
  std::vector<std::vector<int64_t>> counts;  // [layer][expert]
  int64_t tokens = 0;
};

struct LayerStats {
  int64_t slots = 0;
  int used = 0;
  double imbalance = 0;
  std::vector<std::pair<int, double>> hottest;  // (expert, share of slots), at most 3
};

LayerStats layer_stats(const std::vector<int64_t>& c) {
  LayerStats s;
  s.slots = std::accumulate(c.begin(), c.end(), int64_t(0));
  s.used = int(std::count_if(c.begin(), c.end(), [](int64_t v) { return v > 0; }));
  if (s.slots == 0) return s;
  std::vector<int> order(c.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c[size_t(a)] > c[size_t(b)]; });
  s.imbalance = double(c[size_t(order[0])]) * double(c.size()) / double(s.slots);
  for (size_t i = 0; i < std::min<size_t>(3, order.size()) && c[size_t(order[i])] > 0; ++i)
    s.hottest.emplace_back(order[i], double(c[size_t(order[i])]) / double(s.slots));
  return s;
}

Result<std::vector<TraceRun>> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return err("%s: cannot read", path.c_str());
  std::vector<TraceRun> runs;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.empty()) continue;
    auto bad = [&](const char* what) { return err("%s:%lld: %s", path.c_str(), static_cast<long long>(no), what); };
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    // An integer field, or 0 when missing or of another type (nlohmann's value() would throw).
    auto int_field = [&](const char* key) -> int64_t {
      return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : 0;
    };
    if (j.contains("trace")) {
      if (!j["trace"].is_string() || j["trace"].get<std::string>() != "gemma4-experts" || int_field("version") != 1)
        return bad("not a version 1 gemma4 expert trace header");
      TraceRun r;
      const int64_t ne = int_field("n_experts"), tk = int_field("top_k");
      if (ne < 1 || ne > 1 << 16 || tk < 1 || tk > ne) return bad("n_experts / top_k out of range");
      r.n_experts = int(ne);
      r.top_k = int(tk);
      if (r.n_experts < 1 || r.n_experts > 1 << 16 || r.top_k < 1 || r.top_k > r.n_experts)
        return bad("n_experts / top_k out of range");
      if (!j.contains("moe_layers") || !j["moe_layers"].is_array() || j["moe_layers"].size() > 4096)
        return bad("moe_layers is not a list of layers");
      for (const auto& l : j["moe_layers"]) {
        if (!l.is_number_integer()) return bad("moe_layers holds a non-integer");
        r.layers.push_back(l.get<int>());
      }
      r.counts.assign(r.layers.size(), std::vector<int64_t>(size_t(r.n_experts), 0));
      runs.push_back(std::move(r));
      continue;
    }
    if (runs.empty()) return bad("a token line before any header");
    TraceRun& r = runs.back();
    if (!j.contains("experts") || !j["experts"].is_array() || j["experts"].size() != r.layers.size())
      return bad("experts is not one list per MoE layer");
    for (size_t l = 0; l < r.layers.size(); ++l) {
      const auto& e = j["experts"][l];
      if (!e.is_array() || e.size() != size_t(r.top_k)) return bad("an experts list is not top_k long");
      for (const auto& x : e) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= r.n_experts)
          return bad("an expert id outside [0, n_experts)");
        ++r.counts[l][size_t(x.get<int64_t>())];
      }
    }
    ++r.tokens;
  }
  if (runs.empty()) return err("%s: no expert trace header (written by --trace-experts)", path.c_str());
  return runs;
}

}  // namespace

Result<std::string> summarize_expert_trace(const std::string& path, bool as_json) {
  G4_ASSIGN_OR_RETURN(std::vector<TraceRun> runs, read_trace(path));
  nlohmann::ordered_json jruns = nlohmann::ordered_json::array();
  std::string text = path + ": " + std::to_string(runs.size()) + (runs.size() == 1 ? " run\n" : " runs\n");
  char buf[256];
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    const TraceRun& r = runs[ri];
    std::snprintf(buf, sizeof buf, "run %zu: %lld tokens, %d experts, top-%d, %zu MoE layers\n", ri + 1,
                  static_cast<long long>(r.tokens), r.n_experts, r.top_k, r.layers.size());
    text += buf;
    text += "  layer  tokens  used  imbalance  cold  hottest (share of routed slots)\n";
    nlohmann::ordered_json jlayers = nlohmann::ordered_json::array();
    int64_t cold_pairs = 0;
    for (size_t l = 0; l < r.layers.size(); ++l) {
      const LayerStats s = layer_stats(r.counts[l]);
      const int cold = r.n_experts - s.used;
      cold_pairs += cold;
      std::string hot;
      nlohmann::ordered_json jhot = nlohmann::ordered_json::array();
      for (const auto& [e, share] : s.hottest) {
        std::snprintf(buf, sizeof buf, "%s%d (%.1f%%)", hot.empty() ? "" : ", ", e, 100.0 * share);
        hot += buf;
        jhot.push_back({{"expert", e}, {"share", share}});
      }
      std::snprintf(buf, sizeof buf, "  %-5d  %-6lld  %-4d  %8.2fx  %-4d  %s\n", r.layers[l],
                    static_cast<long long>(r.tokens), s.used, s.imbalance, cold, hot.c_str());
      text += buf;
      nlohmann::ordered_json jcold = nlohmann::ordered_json::array();
      for (int e = 0; e < r.n_experts; ++e)
        if (r.counts[l][size_t(e)] == 0) jcold.push_back(e);
      jlayers.push_back({{"layer", r.layers[l]},
                         {"tokens", r.tokens},
                         {"experts_used", s.used},
                         {"imbalance", s.imbalance},
                         {"hottest", jhot},
                         {"cold", jcold},
                         {"counts", r.counts[l]}});
    }
    std::snprintf(buf, sizeof buf, "  never chosen: %lld of %lld (layer, expert) pairs\n",
                  static_cast<long long>(cold_pairs), static_cast<long long>(int64_t(r.layers.size()) * r.n_experts));
    text += buf;
    jruns.push_back({{"tokens", r.tokens},
                     {"n_experts", r.n_experts},
                     {"top_k", r.top_k},
                     {"layers", jlayers},
                     {"cold_pairs", cold_pairs}});
  }
  if (as_json) return nlohmann::ordered_json{{"trace", path}, {"runs", jruns}}.dump(1) + "\n";
  return text;
}

}  // namespace g4
