// Constrained decoding where the logits are (Engine::device_masks, grammar_accept; runtime/engine.h):
// the host fills each constrained row's allowed-token bitmask before the forward (XGrammar's
// next-token mask), the backend applies it to the logits before its argmax or top k
// (Backend::mask_logits), and only the sampled ids come back. A step thus copies 4 bytes a row
// and 32 KiB of mask a constrained row (at a 262k vocabulary) instead of 1 MiB of logits a row.
#include <chrono>

#include "core/token_mask.h"
#include "runtime/engine_slot.h"

namespace g4 {

const uint32_t* Engine::device_masks(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch) {
  bool any = false;
  for (const Slot* s : in_batch) any = any || s->matcher != nullptr;
  if (!any) return nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const int V = model_.config().vocab, W = token_mask_words(V);
  allow_.assign(size_t(Model::logit_rows(batch)) * size_t(W), 0xffffffffu);  // open rows by default
  size_t row = 0;  // the sampled (last) logit row of sequence i
  for (size_t i = 0; i < batch.size(); row += batch[i].all_logits ? size_t(batch[i].n) : 1, ++i) {
    Slot& s = *in_batch[i];
    const size_t last = row + (batch[i].all_logits ? size_t(batch[i].n) - 1 : 0);
    const bool samples = s.consumed + batch[i].n >= int(s.req->spec.prompt.size());  // not a mid-prompt chunk
    if (s.matcher && samples) s.mask_refused = !s.matcher->allowed(allow_.data() + last * size_t(W), V);
  }
  std::lock_guard<std::mutex> lk(mu_);
  stats_.grammar_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return allow_.data();
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
