#include "model/greedy_pipeline.h"

#include "backend/backend.h"
#include "core/status.h"

namespace g4 {

GreedyPipeline::GreedyPipeline(Model& model, std::vector<KvCache*> caches, ActPrecision P)
    : model_(model), caches_(std::move(caches)), P_(P), out_(caches_.size()) {
  G4_CHECK(!caches_.empty() && caches_.size() * sizeof(int32_t) <= Backend::kQueuedReadBytes &&
           "GreedyPipeline: one to kQueuedReadBytes / 4 sequences");
}

GreedyPipeline::~GreedyPipeline() { finish(); }

void GreedyPipeline::start(const std::vector<int32_t>& tokens) {
  G4_CHECK(!queued_ && tokens.size() == caches_.size() && "GreedyPipeline::start: a token a sequence, nothing queued");
  std::vector<SeqInput> batch;
  for (size_t i = 0; i < caches_.size(); ++i) batch.push_back(SeqInput{caches_[i], &tokens[i], 1, false});
  model_.forward_queued(batch, P_, slot_);
  queued_ = true;
}

const std::vector<int32_t>& GreedyPipeline::next(bool more) {
  G4_CHECK(queued_ && "GreedyPipeline::next: no step queued (start first)");
  if (more) {  // the step that feeds the tokens about to be read, queued before they are
    std::vector<SeqInput> batch;
    for (KvCache* c : caches_) {
      SeqInput in{c, nullptr, 1, false};
      in.token_on_device = true;
      batch.push_back(in);
    }
    model_.forward_queued(batch, P_, slot_ ^ 1);
  }
  model_.backend().take_read(slot_, out_.size() * sizeof(int32_t), out_.data());
  slot_ ^= 1;
  queued_ = more;
  return out_;
}

void GreedyPipeline::finish() {
  if (!queued_) return;
  model_.backend().take_read(slot_, out_.size() * sizeof(int32_t), out_.data());
  queued_ = false;
  for (KvCache* c : caches_) G4_CHECK(c->truncate(c->size() - 1) && "GreedyPipeline::finish: the cache refused a one-step rollback");
}

}  // namespace g4
