// The engine's per-request and per-slot state (runtime/engine.h's Request and Slot), shared by
// the engine's source files; nothing outside runtime/engine*.cpp includes it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/engine.h"

namespace g4 {

// A request's adapter matrices for Model::forward (null: the model's own).
inline const LoraAdapter* lora_of(const GenerationSpec& spec) {
  return spec.adapter ? spec.adapter->lora.get() : nullptr;
}

struct Engine::Request {
  uint64_t id = 0;
  GenerationSpec spec;
  EventFn on_event;
};

struct Engine::Slot {
  std::shared_ptr<Request> req;          // null when free
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> fed;              // tokens whose KV is in the cache
  std::vector<int32_t> history;          // what the logits processors see
  int consumed = 0;                      // prompt tokens fed so far
  int generated = 0;
  int cached = 0;
  int32_t pending = -1;                  // sampled token not yet fed
  float logprob = 0.f;                   // the last sampled token's, and the alternatives
  std::vector<std::pair<int, float>> top;   //   (GenerationSpec::logprobs >= 0)
  std::unique_ptr<GrammarMatcher> matcher;  // GenerationSpec::grammar's state, or null
  bool mask_refused = false;  // this step's mask could not be made (Engine::device_masks): ends after it
  Buf hidden;                            // drafter input: final-normed hidden of the last fed token
  bool has_hidden = false;               //   (backend buffer [hidden]), set by the step that sampled `pending`
  std::array<int64_t, KvPool::kGroups> kv_need{};  // a KV pool's blocks this request may hold at most
};

}  // namespace g4
