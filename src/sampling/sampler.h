// Sampler chain for one sequence, mirroring mlx-lm sample_utils.py (spec §5.1).
//
// Order of operations (identical to mlx-lm generate_step + make_sampler):
//   1. logits processors (make_logits_processors): logit_bias (scatter-add), repetition penalty
//      (last `repetition_context_size` tokens, once per unique token, l<0 ? l*p : l/p), presence
//      penalty (-p once per unique token), frequency penalty (-p per occurrence).
//   2. logprobs = logits - logsumexp(logits).
//   3. temperature == 0 -> argmax (first index among ties, like mx.argmax).
//   4. otherwise the filters run on the temperature-1 logprobs, in this order, each removing
//      tokens (-inf): top_p (if 0 < p < 1), min_p (if != 0), XTC (if probability > 0),
//      top_k (if > 0).
//   5. draw from softmax(logprobs / temperature) restricted to the surviving tokens.
//
// Filters match mlx-lm exactly (checked against recordings in tests/fixtures/sampler), except:
//   - which of several EQUAL logprobs survive at a top_k / min_tokens_to_keep boundary
//     (mlx argpartition leaves it unspecified; we keep the lowest index),
//   - top_p's masses are summed in a different float order (mlx: fp32 cumsum over the sorted
//     vocabulary; here: double total, and for heads of > 4096 tokens double sums per 1/64-nat
//     logprob bucket so that only the bucket holding the cut is sorted). A cut that falls within
//     rounding of the boundary may move by a few tokens of negligible mass (tests bound it).
// The random draw does NOT reproduce MLX's threefry bits: we use xoshiro256** (seeded with
// splitmix64) and an inverse-CDF draw in double precision over the survivors, which samples
// the same distribution. XTC's coin flip uses the same generator. Same seed -> same tokens.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/status.h"

namespace g4 {

struct SamplingParams {
  float temperature = 0.f;     // 0 -> greedy
  int top_k = 0;               // 0 -> off; >= vocab -> off (mlx-lm raises; we treat as no-op)
  float top_p = 1.f;           // active only when 0 < top_p < 1
  float min_p = 0.f;           // active when != 0; must be in [0, 1]
  int min_tokens_to_keep = 1;  // for min_p; >= 1
  float repetition_penalty = 1.f;  // 0 or 1 -> no effect; must be >= 0
  int repetition_context_size = 20;
  float presence_penalty = 0.f;
  int presence_context_size = 20;
  float frequency_penalty = 0.f;
  int frequency_context_size = 20;
  std::vector<std::pair<int, float>> logit_bias;  // (token id, additive bias); duplicates add up
  float xtc_probability = 0.f;  // [0, 1]; 0 -> off
  float xtc_threshold = 0.1f;   // [0, 0.5]
  std::vector<int> xtc_special_tokens;  // exempt from XTC removal
  uint64_t seed = 0;
  bool has_seed = false;  // false -> seeded from std::random_device
};

// The model's own sampling defaults (generation_config.json: temperature, top_k, top_p) where it
// has them, else greedy (mlx-lm's default): what `run` and `serve` sample with when a flag or a
// request leaves a parameter out.
SamplingParams generation_defaults(const ModelConfig& cfg);

// Whether any logits processor (penalties, biases) is active, i.e. sampling needs the history and
// may reorder the logits.
inline bool has_logits_processors(const SamplingParams& p) {
  return !(p.repetition_penalty == 0 || p.repetition_penalty == 1) || p.presence_penalty != 0 ||
         p.frequency_penalty != 0 || !p.logit_bias.empty();
}
// Whether sampling with p is the logits' argmax: greedy with no logits processor that could
// change the order.
inline bool plain_greedy(const SamplingParams& p) { return p.temperature <= 0 && !has_logits_processors(p); }

// The mlx-lm argument checks (ValueError there), as one-line errors naming the field.
Status validate(const SamplingParams& p, int vocab_size);

// ---- Reference building blocks (full-vocabulary, simple; the tests compare them against
// mlx-lm recordings, and the fast Sampler against them). All arrays are fp32 [V]. ----

// mlx-lm make_logits_processors applied in order; `history` = the prompt tokens fed to the model
// in this request followed by the generated tokens (mlx-lm 0.32.2 generate_step concatenates
// every prefill chunk and each sampled token; only the last *_context_size tokens matter).
// Token ids outside [0, V) are ignored.
void apply_logits_processors(const SamplingParams& p, float* logits, int V,
                             std::span<const int> history);
// x <- x - logsumexp(x) (NaN entries become -inf). Returns logsumexp. If no entry is finite the
// array is left unchanged.
float log_softmax_inplace(float* x, int V);
// mlx-lm apply_top_p / apply_min_p / apply_top_k / apply_xtc: removed entries set to -inf.
void ref_apply_top_p(float* logprobs, int V, float top_p);
void ref_apply_min_p(float* logprobs, int V, float min_p, int min_tokens_to_keep);
void ref_apply_top_k(float* logprobs, int V, int top_k);
// `coin` is the uniform draw mlx-lm compares against xtc_probability (apply when coin <= prob).
void ref_apply_xtc(float* logprobs, int V, float probability, float threshold,
                   std::span<const int> special_tokens, float coin);
// First index of the maximum (mx.argmax). NaN entries are skipped; returns 0 if none is a number.
int argmax(const float* x, int V);

// The n highest entries of logprobs [V] as (token, logprob), descending, lowest id among ties
// (for OpenAI-style top_logprobs; pass the array sample() left behind). O(V + n log n).
std::vector<std::pair<int, float>> top_logprobs(const float* logprobs, int V, int n);

// xoshiro256** seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1), 53 random bits
 private:
  uint64_t s_[4];
};

// One sequence's sampler: parameters + its own RNG state. Not thread-safe; use one per sequence.
class Sampler {
 public:
  Sampler(SamplingParams params, int vocab_size);
  const SamplingParams& params() const { return p_; }
  void reseed(uint64_t seed) { rng_.reseed(seed); }

  // logits: fp32 [vocab_size], modified in place: on return it holds the processed logprobs
  // (after the logits processors and log-softmax, BEFORE the filters) -- what mlx-lm yields
  // as `logprobs`, usable for logprob reporting. Returns the sampled token id.
  int sample(float* logits, std::span<const int> history);

  // The most candidates sample_top() takes (the device's top-k width).
  static constexpr int kMaxTopK = 256;
  // Whether sample_top() draws from the same distribution as sample() for these parameters:
  // temperature > 0, 0 < top_k <= kMaxTopK (< vocab), and nothing that needs the whole row
  // (penalties, logit bias, XTC).
  static bool top_k_sampleable(const SamplingParams& p, int vocab_size);
  // sample() for top_k_sampleable parameters from the row's n >= top_k largest logits (vals / ids,
  // any order; equal values: the lower ids are the ones kept) and the log-sum-exp of the whole row:
  // the same top_k -> top_p -> min_p -> draw path and the same RNG draws, so the same seed gives
  // the same token as sample() up to the rounding of lse (computed where the logits are). It is
  // sampling/top_draw.h's draw_top with this sampler's next draw bits, taken on every call (also
  // when the row has no finite logit and the draw is not needed: a draw made on the device, whose
  // bits are taken before the row is known, keeps the same sequence).
  int sample_top(const float* vals, const int32_t* ids, int n, float lse);
  // The next draw's 53 random bits (what sample_top would use), for a draw made elsewhere
  // (Backend::draw_top): the generator advances as sample_top's call would advance it.
  uint64_t take_draw_bits() { return rng_.next() >> 11; }

  // Surviving (token, logprob) candidates of the last non-greedy sample() after all filters,
  // sorted by descending logprob when a filter sorted them (for tests and debugging).
  const std::vector<std::pair<float, int>>& last_candidates() const { return cand_; }
  bool last_all_survived() const { return all_alive_; }

 private:
  void top_p(const float* lp, float max_lp);
  bool cut_top_p(bool complete);
  bool top_p_bucketed(const float* lp, float max_lp);
  static constexpr size_t kExactSortLimit = 4096;
  void min_p(const float* lp, float max_lp);
  void xtc(const float* lp);
  void top_k(const float* lp);
  void select_top(const float* lp, size_t k);
  void sort_desc();
  void collect_at_least(const float* lp, float thr);
  int draw(const float* lp, float max_lp);

  SamplingParams p_;
  int V_;
  Rng rng_;
  std::vector<std::pair<float, int>> cand_;  // (logprob, id) survivors when !all_alive_
  bool all_alive_ = true;
  bool sorted_ = false;
  float total_mass_ = 1.f;  // sum of exp(logprobs), computed in double (mlx: fp32 cumsum)
  std::vector<float> scratch_;
  std::vector<double> bin_mass_;
  std::vector<std::pair<float, int>> edge_;
};

}  // namespace g4
