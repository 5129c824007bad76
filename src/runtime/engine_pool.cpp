// The serving engine's KV pool (runtime/engine.h, EngineOptions::kv_pool_bytes): sizing,
// admission by free blocks, and each step's batch cut to what the pool holds.
#include <algorithm>
#include <cstdio>

#include "model/drafter.h"
#include "runtime/engine.h"
#include "runtime/engine_slot.h"

namespace g4 {

void Engine::open_pool() {
  const ModelConfig& cfg = model_.config();
  Backend& be = model_.backend();
  G4_CHECK(model_.kv_options().quant.bits == 0 && "Engine: a KV pool holds unquantized KV only");
  const int elem = int(dtype_size(be.activation_dtype()));
  const auto blocks =
      KvPool::blocks_for_bytes(cfg, opt_.kv_block, elem, opt_.kv_pool_bytes, opt_.max_context, opt_.prefill_chunk);
  // Positions past max_context: a speculative round's drafts are written before they are checked.
  constexpr int kDraftRoom = 64;
  pool_ = std::make_shared<KvPool>(cfg, be, opt_.kv_block, blocks, opt_.max_context + kDraftRoom);
  model_.set_kv_pool(pool_);
  std::fprintf(stderr, "[gemma4] KV pool: %.1f MiB, %lld full-attention + %lld sliding-window blocks of %d positions\n",
               double(pool_->bytes()) / double(1 << 20), (long long)blocks[KvPool::kFull],
               (long long)blocks[KvPool::kSliding], opt_.kv_block);
  publish_cache_stats();
}

std::array<int64_t, KvPool::kGroups> Engine::pool_need(const GenerationSpec& spec) const {
  std::array<int64_t, KvPool::kGroups> need{};
  const int64_t tokens = int64_t(spec.prompt.size()) + spec.max_tokens;
  const int chunk = std::min<int64_t>(opt_.prefill_chunk, int64_t(spec.prompt.size()));
  for (int g = 0; g < KvPool::kGroups; ++g)
    if (pool_->has_group(KvPool::Group(g)))
      need[size_t(g)] = KvPool::sequence_blocks(model_.config(), KvPool::Group(g), pool_->block(), tokens, chunk);
  return need;
}

bool Engine::pool_room(const std::array<int64_t, KvPool::kGroups>& need) {
  for (;;) {
    bool room = true;
    for (int g = 0; g < KvPool::kGroups; ++g) {
      const auto grp = KvPool::Group(g);
      int64_t promised = 0;  // blocks running sequences may still take
      for (const auto& sp : slots_)
        if (sp->req && sp->cache) promised += std::max<int64_t>(0, sp->kv_need[size_t(g)] - sp->cache->blocks_held(grp));
      room = room && pool_->free_blocks(grp) - promised >= need[size_t(g)];
    }
    if (room) return true;
    if (!prefix_.evict_oldest()) return false;  // prefix-cache entries give their blocks back first
  }
}

bool Engine::pool_fits(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch) {
  if (!pool_) return true;
  const int extra = model_.drafter() ? model_.drafter()->draft_tokens() : 0;  // a speculative round's rows
  for (;;) {
    std::array<int64_t, KvPool::kGroups> want{};
    for (size_t i = 0; i < batch.size(); ++i) {
      const bool decoding = in_batch[i]->consumed >= int(in_batch[i]->req->spec.prompt.size());
      const auto n = batch[i].cache->blocks_to_map(batch[i].n + (decoding ? extra : 0));
      for (int g = 0; g < KvPool::kGroups; ++g) want[size_t(g)] += n[size_t(g)];
    }
    bool fits = true;
    for (int g = 0; g < KvPool::kGroups; ++g) fits = fits && want[size_t(g)] <= pool_->free_blocks(KvPool::Group(g));
    if (fits) return true;
    if (!prefix_.evict_oldest()) return false;
  }
}

void Engine::fit_pool(std::vector<SeqInput>& batch, std::vector<Slot*>& in_batch) {
  if (!pool_) return;
  while (!pool_fits(batch, in_batch)) {
    // The youngest request gives way: a prompt chunk waits for a later step; a decoding sequence
    // (only when admission's promise failed) ends with an error rather than the process.
    size_t y = batch.size();
    bool prompt = false;  // whether in_batch[y] is prefilling
    for (size_t i = 0; i < batch.size(); ++i) {
      const Slot& s = *in_batch[i];
      const bool p = s.consumed < int(s.req->spec.prompt.size());
      if (y == batch.size() || (p && !prompt) || (p == prompt && s.req->id > in_batch[y]->req->id)) {
        y = i;
        prompt = p;
      }
    }
    Slot* s = in_batch[y];
    batch.erase(batch.begin() + long(y));
    in_batch.erase(in_batch.begin() + long(y));
    if (!prompt) finish(*s, FinishReason::Error, "the KV cache pool has no free block for this sequence");
  }
}

}  // namespace g4
