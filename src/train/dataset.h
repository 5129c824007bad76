// Fine-tuning data as `mlx_lm.lora --data DIR` reads it: DIR/{train,valid,test}.jsonl, one JSON
// object per line, in one of mlx-lm's formats (picked from the first record, as mlx-lm does):
//   {"prompt": ..., "completion": ...}  a user turn and the assistant's answer, rendered through the
//                                        chat template (+ optional "tools")
//   {"messages": [...]}                  a chat (+ optional "tools"), rendered through the template
//   {"text": ...}                        raw text as HF's tokenizer.encode gives it (BOS when the
//                                        tokenizer adds one), EOS appended unless already last
// mask_prompt (chat / completions): only the last message (the answer) is a target; the offset is
// the length of the rendering of the messages before it, with the generation prompt when the last
// message is the assistant's.
//
// Batches follow mlx-lm's iterate_batches: records sorted by mlx-lm's key (the number of fields of
// each record, a stable sort: file order in practice), cut into batches of batch_size (a short
// tail dropped), visited in the order of numpy's legacy np.random.permutation under one generator
// seeded with --seed, shared by the training and the validation batches in mlx-lm's order of
// draws. So the same data and seed give mlx-lm's batches.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/bundle.h"
#include "train/lora_train_model.h"

namespace g4::train {

struct DatasetOptions {
  bool mask_prompt = false;
  // The template's enable_thinking. Unset: as mlx-lm's TokenizerWrapper sets it, true when the
  // vocabulary has thinking markers (<think> </think>, <|channel> <channel|>, ...: every Gemma 4
  // tokenizer), so that the same records give mlx-lm's tokens.
  std::optional<bool> enable_thinking;
  std::string prompt_feature = "prompt", completion_feature = "completion";
  std::string text_feature = "text", chat_feature = "messages";
};

struct Dataset {
  std::string path;
  std::vector<Example> examples;
  std::vector<int> fields;  // number of fields of each record (mlx-lm's sort key)
  size_t size() const { return examples.size(); }
};

// mlx-lm's rule for the default of enable_thinking (DatasetOptions).
bool vocabulary_has_thinking(const Tokenizer& t);

// Reads and tokenizes one .jsonl file; a missing file gives an empty dataset. Errors name the file
// and line: malformed JSON, a record that is not an object, an unknown format, a missing or
// non-string field, a chat format without a chat template, mask_prompt on text records.
Result<Dataset> load_jsonl(const std::string& path, const ModelBundle& bundle, const DatasetOptions& opt);

// numpy.random.RandomState (MT19937, legacy seeding): permutation(n) exactly as numpy draws it.
class NumpyLegacyRng {
 public:
  explicit NumpyLegacyRng(uint32_t seed) : mt_(seed) {}
  std::vector<int> permutation(int n);
  // The generator's whole state as text, and back (false: not such a text); for resuming a run.
  std::string save() const;
  bool load(const std::string& state);

 private:
  uint32_t interval(uint32_t max);
  std::mt19937 mt_;
};

// mlx-lm's iterate_batches over one dataset: next() gives the next batch's example indices.
// loop: after the last batch, draw a new permutation (training); else stop (validation).
class BatchIterator {
 public:
  // Errors when the dataset has fewer than batch_size examples.
  static Result<BatchIterator> create(const Dataset& d, int batch_size, NumpyLegacyRng* rng, bool loop);
  // False when a non-looping iterator is exhausted.
  bool next(std::vector<int>* batch);
  // Where the iterator is in its order (for resuming a run); restore refuses an order that is not a
  // permutation of this iterator's batches.
  struct Position {
    std::vector<int> order;
    size_t pos = 0;
    bool started = false;
  };
  Position position() const { return {order_, pos_, started_}; }
  Status restore(const Position& p);

 private:
  std::vector<std::vector<int>> batches_;
  std::vector<int> order_;
  size_t pos_ = 0;
  bool started_ = false, loop_ = false;
  NumpyLegacyRng* rng_ = nullptr;
};

}  // namespace g4::train
