// The MoE expert trace (`--trace-experts FILE.jsonl`, every verb that loads a model): the experts
// the router chose for every token at every MoE layer, and their weights, appended to a JSON-lines
// file; `gemma4 info --experts FILE.jsonl` summarizes it (summarize_expert_trace).
//
// Format (version 1). A run starts with one header line:
//   {"trace":"gemma4-experts","version":1,"n_experts":E,"top_k":K,"moe_layers":[l0,l1,...]}
// then one line per token a forward step ran (prefill tokens included), in step order:
//   {"step":S,"seq":I,"pos":P,"token":T,"experts":[[e,...],...],"weights":[[w,...],...]}
// step: the model's forward call count in this run; seq: the sequence's index in that call's
// batch; pos: the token's position in its sequence; experts / weights: one list of K per MoE layer
// (moe_layers' order), in the router's order (largest score first), weights as the experts'
// outputs are scaled (softmax of the chosen scores times per_expert_scale). The file is appended
// to, never truncated: several runs follow one another, each from its header.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace g4 {

class ExpertTrace {
 public:
  // Opens `path` for appending (created if missing); the header is written with the first step.
  static Result<std::unique_ptr<ExpertTrace>> open(const std::string& path);
  ~ExpertTrace();
  ExpertTrace(const ExpertTrace&) = delete;
  ExpertTrace& operator=(const ExpertTrace&) = delete;

  // One token row of a step: its sequence index in the batch, position and token id.
  struct Row {
    int seq, pos, token;
  };
  // One forward step: rows [R]; idx [L, R, K] and w [L, R, K] (L = moe_layers.size()) as the
  // router wrote them. Thread-safe; the lines are flushed before it returns.
  void record(int n_experts, int top_k, const std::vector<int>& moe_layers, const std::vector<Row>& rows,
              const int32_t* idx, const float* w);

  const std::string& path() const { return path_; }

 private:
  ExpertTrace(std::string path, std::FILE* f) : path_(std::move(path)), f_(f) {}
  std::string path_;
  std::FILE* f_;
  std::mutex mu_;
  int64_t steps_ = 0;
};

// The summary of a trace file: per run and MoE layer, the tokens routed, the experts ever chosen,
// the hottest experts' shares of the routed slots, the load imbalance (the hottest expert's count
// over the mean) and the cold experts (never chosen). As text, or JSON when as_json. Errors name
// the file and line of a malformed entry.
Result<std::string> summarize_expert_trace(const std::string& path, bool as_json);

}  // namespace g4
