// A token drawn from a row's largest logits: Sampler::sample_top's path (top_k, then top_p and
// min_p on the sorted head, then an inverse-CDF draw) as a pure function of the candidates, the
// row's parameters and the draw's 53 random bits. The host sampler and Backend::draw_top share it
// (host backends call it; the CUDA kernel, cuda_sampling.cu, does the same float and double
// operations in the same order), so a draw made where the logits are, queued before the host has
// read the previous token (runtime/engine_ahead.cpp), gives the token the host would draw from the
// same bits, up to the rounding of the device's expf / logf against the host's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace g4 {

struct SamplingParams;

// One row's parameters. temperature <= 0: greedy (the largest value, lowest id among ties).
struct TopDraw {
  int top_k = 1;             // candidates kept first (>= 1)
  float top_p = 1.f;         // active when 0 < top_p < 1
  int min_keep = 0;          // min_p active when > 0: min_tokens_to_keep
  float min_p_log = 0.f;     // float(log(double(min_p))) (min_p's threshold below the maximum)
  float temperature = 0.f;
  uint64_t bits = 0;         // the draw's 53 random bits: u = bits * 2^-53 (Rng::uniform)
};

// A row's parameters as Backend::draw_top's buffers hold them: 4 floats (top_p, min_p_log,
// temperature, 0) and 4 ints (top_k, min_keep, the bits' high 21 and low 32, as int32).
constexpr int kTopDrawFields = 4;
void pack_top_draw(const TopDraw& d, float* f, int32_t* i);
TopDraw unpack_top_draw(const float* f, const int32_t* i);

// The parameters of p (top_k_sampleable or plain greedy) without the random bits.
TopDraw top_draw_params(const SamplingParams& p);

// Candidates (logprob, id), sorted by descending logprob, lowest id among ties.
using TopCandidates = std::vector<std::pair<float, int>>;

// The token drawn from a row's n >= d.top_k largest logits (vals / ids, any order) and the row's
// log-sum-exp lse. *cand (scratch) holds the surviving candidates afterwards, sorted.
int draw_top(const float* vals, const int32_t* ids, int n, float lse, const TopDraw& d, TopCandidates* cand);

// The steps of draw_top, shared with Sampler's whole-row path. On a sorted list: the length of
// the head top_p keeps (the shortest whose float running mass from the top reaches target, plus
// the ties of its last value; at least 1; the whole list when the mass never reaches it, and then
// *reached = false); and min_p's cut of a list whose maximum is max_lp
// (every value >= max_lp + min_p_log, or the first min_keep when fewer survive).
size_t top_p_head(const TopCandidates& sorted, float target, bool* reached = nullptr);
void cut_min_p_sorted(TopCandidates& sorted, float max_lp, float min_p_log, int min_keep);
// The inverse-CDF draw from softmax(logprob / temperature) over cand (any order; double sums of
// float weights) at u in [0, 1): an index into cand, or -1 when no candidate has weight.
int draw_index(const TopCandidates& cand, float temperature, double u);

}  // namespace g4
