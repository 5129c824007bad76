// draw_top and its steps; see top_draw.h. The CUDA kernel (cuda_sampling.cu, draw_top_kernel)
// mirrors these loops operation for operation: change both together.
#include "sampling/top_draw.h"

#include <algorithm>
#include <cmath>

#include "sampling/sampler.h"

namespace g4 {
namespace {

// Descending value, then ascending id (the samplers' tie rule).
bool desc_by_value(const std::pair<float, int>& a, const std::pair<float, int>& b) {
  if (a.first != b.first) return a.first > b.first;
  return a.second < b.second;
}

}  // namespace

TopDraw top_draw_params(const SamplingParams& p) {
  TopDraw d;
  d.temperature = p.temperature;
  d.top_k = std::max(1, p.top_k);
  if (p.top_p > 0 && p.top_p < 1) d.top_p = p.top_p;
  if (p.min_p != 0) {
    d.min_keep = std::max(1, p.min_tokens_to_keep);
    d.min_p_log = float(std::log(double(p.min_p)));
  }
  return d;
}

void pack_top_draw(const TopDraw& d, float* f, int32_t* i) {
  f[0] = d.top_p;
  f[1] = d.min_p_log;
  f[2] = d.temperature;
  f[3] = 0.f;
  i[0] = d.top_k;
  i[1] = d.min_keep;
  i[2] = int32_t(uint32_t(d.bits >> 32));
  i[3] = int32_t(uint32_t(d.bits & 0xffffffffu));
}

TopDraw unpack_top_draw(const float* f, const int32_t* i) {
  TopDraw d;
  d.top_p = f[0];
  d.min_p_log = f[1];
  d.temperature = f[2];
  d.top_k = i[0];
  d.min_keep = i[1];
  d.bits = (uint64_t(uint32_t(i[2])) << 32) | uint64_t(uint32_t(i[3]));
  return d;
}

size_t top_p_head(const TopCandidates& c, float target, bool* reached) {
  const size_t n = c.size();
  float acc = 0.f;
  size_t r = n;
  bool hit = false;
  for (size_t j = 0; j < n; ++j) {
    if (acc >= target) {
      r = j;
      hit = true;
      break;
    }
    acc += std::exp(c[j].first);
  }
  if (reached) *reached = hit || acc >= target;
  r = std::max<size_t>(r, 1);
  if (n == 0) return 0;
  const float thr = c[r - 1].first;
  while (r < n && c[r].first >= thr) ++r;  // ties of the threshold value survive
  return r;
}

void cut_min_p_sorted(TopCandidates& c, float max_lp, float min_p_log, int min_keep) {
  const float thr = max_lp + min_p_log;
  const size_t m = size_t(min_keep);
  size_t keep = 0;
  for (const auto& x : c) keep += x.first >= thr;
  if (keep >= m || keep == c.size()) {
    c.erase(std::remove_if(c.begin(), c.end(), [thr](const std::pair<float, int>& x) { return x.first < thr; }),
            c.end());
    return;
  }
  c.resize(std::min(m, c.size()));
}

int draw_index(const TopCandidates& cand, float temperature, double u01) {
  // Each weight is computed twice (sum, then the walk) rather than stored: the same float
  // expression gives the same value, and the draw allocates nothing.
  const float inv_t = 1.0f / temperature;
  float m = -INFINITY;
  for (const auto& c : cand) m = std::max(m, c.first);
  auto weight = [&](size_t j) { return std::exp((cand[j].first - m) * inv_t); };
  double sum = 0;
  for (size_t j = 0; j < cand.size(); ++j) sum += weight(j);
  const double u = u01 * sum;
  double acc = 0;
  int last = -1;
  for (size_t j = 0; j < cand.size(); ++j) {
    const float w = weight(j);
    if (w <= 0) continue;
    last = int(j);
    acc += w;
    if (u < acc) return int(j);
  }
  return last;
}

int draw_top(const float* vals, const int32_t* ids, int n, float lse, const TopDraw& d, TopCandidates* cand) {
  TopCandidates& c = *cand;
  c.resize(size_t(n));
  for (int i = 0; i < n; ++i) {  // logprobs (NaN as -inf, as log_softmax_inplace makes it)
    const float lp = vals[i] - lse;
    c[size_t(i)] = {std::isnan(lp) ? -INFINITY : lp, ids[i]};
  }
  std::sort(c.begin(), c.end(), desc_by_value);
  c.resize(size_t(std::min(n, std::max(1, d.top_k))));
  const float max_lp = c[0].first;
  if (!(d.temperature > 0) || !std::isfinite(max_lp)) return c[0].second;
  if (d.top_p > 0 && d.top_p < 1) c.resize(top_p_head(c, d.top_p));  // the whole row's mass is 1
  if (d.min_keep > 0) cut_min_p_sorted(c, max_lp, d.min_p_log, d.min_keep);
  const int j = draw_index(c, d.temperature, double(d.bits) * 0x1.0p-53);
  return c[size_t(j < 0 ? 0 : j)].second;
}

}  // namespace g4
