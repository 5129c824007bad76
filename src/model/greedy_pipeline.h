// Greedy decoding of a batch of sequences with the host one step ahead of the backend.
//
// A plain greedy step waits for its token before the host starts the next one, so on a device the
// host's work for every step (recording it, launching its graph, reading the id back) leaves the
// device idle. Here the step that feeds token t is queued before token t is read: its input is the
// previous step's argmax, still on the device (SeqInput::token_on_device), and its own argmax is
// queued for a read slot (Model::forward_queued); slots alternate, so one step's read is pending
// while the next one's is queued. The tokens are those plain greedy steps give: the same forward,
// the same argmax.
//
//   GreedyPipeline g(model, {cache}, P);
//   g.start({first});                       // queues the step that feeds `first`
//   while (...) tok = g.next(more)[0];      // the next token; with `more` the step feeding it is queued first
//
// When next(false) has returned, nothing is queued and each cache holds the tokens fed so far (every
// token returned but the last, which the caller feeds itself if it goes on). A pipeline left with
// a step queued (the caller stops early) must be closed by finish() (the destructor calls it), which
// waits for that step and takes its token back out of each cache. While a step is queued, nothing
// else may run a forward of the model: the next step reads the model's own argmax rows.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace g4 {

class GreedyPipeline {
 public:
  // Whether it pays and may run: a device backend (host backends finish each step before the
  // next is queued anyway), and a model that can queue forwards (Model::can_queue_forwards).
  static bool usable(Model& model) { return model.backend().on_device() && model.can_queue_forwards(); }

  GreedyPipeline(Model& model, std::vector<KvCache*> caches, ActPrecision P);
  ~GreedyPipeline();
  GreedyPipeline(const GreedyPipeline&) = delete;
  GreedyPipeline& operator=(const GreedyPipeline&) = delete;

  // Queues the step that feeds tokens[i] to cache i (one token a sequence).
  void start(const std::vector<int32_t>& tokens);
  // The tokens the oldest queued step computed, one a sequence. With `more`, the step that feeds
  // them is queued before they are read.
  const std::vector<int32_t>& next(bool more);
  // Whether a step is queued (start or next(true) since the last next(false) / finish).
  bool queued() const { return queued_; }
  // Waits for a queued step and takes its fed token back out of each cache (nothing when none is
  // queued).
  void finish();

 private:
  Model& model_;
  std::vector<KvCache*> caches_;
  ActPrecision P_;
  int slot_ = 0;  // the read slot of the oldest queued step
  bool queued_ = false;
  std::vector<int32_t> out_;
};

}  // namespace g4
