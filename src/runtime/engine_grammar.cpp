// Constrained decoding where the logits are (Engine::device_masks, grammar_accept; runtime/engine.h):
// the host fills each constrained row's allowed-token bitmask before the forward (XGrammar's
// next-token mask), the backend applies it to that row's logits before its argmax or top k
// (Backend::mask_logits), and only the sampled ids come back. A step thus copies 4 bytes a row
// and 32 KiB of mask a constrained row (at a 262k vocabulary) instead of 1 MiB of logits a row;
// unconstrained rows take no mask.
#include <chrono>

#include "core/token_mask.h"
#include "runtime/engine_slot.h"

namespace g4 {

const TokenMasks* Engine::device_masks(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch) {
  bool any = false;
  for (const Slot* s : in_batch) any = any || s->matcher != nullptr;
  if (!any) return nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const int V = model_.config().vocab, W = token_mask_words(V);
  // One mask per sampling constrained sequence, for its last logit row; filled one after another on
  // this thread (in parallel on the thread pool they took 2-4x longer at 48 rows on the H200: the
  // pool's spinning workers contend with the server's threads).
  mask_rows_.clear();
  size_t row = 0;  // the first logit row of sequence i
  for (size_t i = 0; i < batch.size(); row += batch[i].all_logits ? size_t(batch[i].n) : 1, ++i) {
    Slot& s = *in_batch[i];
    const bool samples = s.consumed + batch[i].n >= int(s.req->spec.prompt.size());  // not a mid-prompt chunk
    if (!s.matcher || !samples) continue;
    const size_t at = mask_rows_.size() * size_t(W);
    if (allow_.size() < at + size_t(W)) allow_.resize(at + size_t(W));
    s.mask_refused = !s.matcher->allowed(allow_.data() + at, V);
    if (!s.mask_refused) mask_rows_.push_back(int32_t(row + (batch[i].all_logits ? size_t(batch[i].n) - 1 : 0)));
  }
  masks_ = TokenMasks{allow_.data(), mask_rows_.data(), int(mask_rows_.size())};
  std::lock_guard<std::mutex> lk(mu_);
  stats_.grammar_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return masks_.count > 0 ? &masks_ : nullptr;
}

bool Engine::grammar_accept(Slot& s, int32_t tok, double mask_seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = s.matcher->accept(tok);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.grammar_seconds += mask_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.grammar_tokens;
  return ok;
}

}  // namespace g4
