// Sampler chain; see sampler.h for the contract and the mlx-lm functions each block mirrors.
#include "sampling/sampler.h"

#include "sampling/top_draw.h"
#include "sampling/vec_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace g4 {

SamplingParams generation_defaults(const ModelConfig& cfg) {
  SamplingParams s;
  if (cfg.gen_temperature >= 0) s.temperature = cfg.gen_temperature;
  if (cfg.gen_top_k > 0) s.top_k = cfg.gen_top_k;
  if (cfg.gen_top_p > 0) s.top_p = cfg.gen_top_p;
  return s;
}
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Orders (logprob, id) by descending logprob, then ascending id (our tie rule).
struct DescByValue {
  bool operator()(const std::pair<float, int>& a, const std::pair<float, int>& b) const {
    if (a.first != b.first) return a.first > b.first;
    return a.second < b.second;
  }
};

// Python's tokens[-c:] for an int c (c == 0 -> whole list, c < 0 -> tokens[|c|:]).
std::span<const int> tail_window(std::span<const int> h, int c) {
  size_t n = h.size();
  if (c == 0) return h;
  if (c > 0) return h.subspan(n - std::min<size_t>(n, size_t(c)));
  size_t skip = std::min<size_t>(n, size_t(-(int64_t)c));
  return h.subspan(skip);
}

std::vector<int> unique_ids(std::span<const int> w, int V) {
  std::vector<int> u;
  u.reserve(w.size());
  for (int t : w)
    if (t >= 0 && t < V) u.push_back(t);
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  return u;
}

// max over non-NaN entries and its first index; (-inf, -1) if none.
std::pair<float, int> max_entry(const float* x, int V) {
  float m = kNegInf;
  int idx = -1;
  for (int i = 0; i < V; ++i) {
    float v = x[i];
    if (v > m || (idx < 0 && v == m)) {
      m = v;
      idx = i;
    }
  }
  return {m, idx};
}

// x <- x - logsumexp(x) (fp32; NaN -> -inf), returns lse; *mass = sum exp(new x) in double;
// *best = first index of the maximum of the new x (mx.argmax of the logprobs).
float log_softmax_impl(float* x, int V, double* mass, int* best) {
  bool has_nan = false;
  const float m = vec::max_skip_nan(x, V, &has_nan);
  if (mass) *mass = 0;
  if (best) *best = 0;
  if (!std::isfinite(m)) {
    if (best) *best = std::max(0, max_entry(x, V).second);
    return m;
  }
  if (has_nan)
    for (int i = 0; i < V; ++i)
      if (std::isnan(x[i])) x[i] = kNegInf;
  const double s = vec::sum_exp_shifted(x, V, m);
  const float lse = float(double(m) + std::log(s));
  for (int i = 0; i < V; ++i) x[i] -= lse;
  const float top = m - lse;  // the maximum after the shift
  if (best) {
    int i = 0;
    while (i < V && x[i] != top) ++i;
    *best = i < V ? i : std::max(0, max_entry(x, V).second);
  }
  if (mass) *mass = s * std::exp(double(m) - double(lse));
  return lse;
}

}  // namespace

Status validate(const SamplingParams& p, int vocab_size) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    return err("sampling: temperature must be a finite number >= 0, got %g", double(p.temperature));
  if (p.top_k < 0) return err("sampling: top_k must be >= 0, got %d", p.top_k);
  if (!(p.top_p >= 0 && p.top_p <= 1))
    return err("sampling: top_p must be in [0, 1], got %g", double(p.top_p));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    return err("sampling: min_p must be in [0, 1], got %g", double(p.min_p));
  if (p.min_tokens_to_keep < 1)
    return err("sampling: min_tokens_to_keep must be >= 1, got %d", p.min_tokens_to_keep);
  if (!(p.repetition_penalty >= 0) || !std::isfinite(p.repetition_penalty))
    return err("sampling: repetition_penalty must be a finite number >= 0, got %g",
               double(p.repetition_penalty));
  if (!std::isfinite(p.presence_penalty))
    return err("sampling: presence_penalty must be finite");
  if (!std::isfinite(p.frequency_penalty))
    return err("sampling: frequency_penalty must be finite");
  if (!(p.xtc_probability >= 0 && p.xtc_probability <= 1))
    return err("sampling: xtc_probability must be in [0, 1], got %g", double(p.xtc_probability));
  if (!(p.xtc_threshold >= 0 && p.xtc_threshold <= 0.5f))
    return err("sampling: xtc_threshold must be in [0, 0.5], got %g", double(p.xtc_threshold));
  for (auto& [id, b] : p.logit_bias) {
    if (id < 0 || id >= vocab_size)
      return err("sampling: logit_bias token id %d is outside the vocabulary [0, %d)", id,
                 vocab_size);
    if (std::isnan(b)) return err("sampling: logit_bias for token %d is NaN", id);
  }
  return Status::ok();
}

// mlx-lm make_logits_processors: bias, repetition, presence, frequency (in that order).
void apply_logits_processors(const SamplingParams& p, float* logits, int V,
                             std::span<const int> history) {
  for (auto& [id, b] : p.logit_bias)  // logit_bias_processor: logits.at[:, ids].add(values)
    if (id >= 0 && id < V) logits[id] += b;
  if (history.empty()) return;
  if (p.repetition_penalty != 0 && p.repetition_penalty != 1) {  // make_repetition_penalty
    const float pen = p.repetition_penalty;
    for (int t : unique_ids(tail_window(history, p.repetition_context_size), V)) {
      float l = logits[t];
      logits[t] = l < 0 ? l * pen : l / pen;
    }
  }
  if (p.presence_penalty != 0) {  // make_presence_penalty: logits[:, tokens] -= p (once)
    for (int t : unique_ids(tail_window(history, p.presence_context_size), V))
      logits[t] -= p.presence_penalty;
  }
  if (p.frequency_penalty != 0) {  // make_frequency_penalty: .at[tokens].subtract(p) (per count)
    for (int t : tail_window(history, p.frequency_context_size))
      if (t >= 0 && t < V) logits[t] -= p.frequency_penalty;
  }
}

float log_softmax_inplace(float* x, int V) { return log_softmax_impl(x, V, nullptr, nullptr); }

int argmax(const float* x, int V) {
  bool has_nan = false;
  const float m = vec::max_skip_nan(x, V, &has_nan);
  for (int i = 0; i < V; ++i)
    if (x[i] == m) return i;
  return 0;  // empty or all NaN
}

// mlx-lm apply_top_p: sort ascending, fp32 reverse exclusive cumsum, drop tokens whose mass
// above is >= top_p * total, keep every token >= the first kept value.
void ref_apply_top_p(float* lp, int V, float top_p) {
  if (V <= 0) return;
  std::vector<float> s(lp, lp + V);
  std::sort(s.begin(), s.end());
  std::vector<float> probs(V), above(V);
  for (int i = 0; i < V; ++i) probs[i] = std::exp(s[i]);
  float acc = 0.f;
  for (int i = V - 1; i >= 0; --i) {
    above[i] = acc;
    acc += probs[i];
  }
  float total = above[0] + probs[0];
  float target = top_p * total;
  int dropped = 0;
  for (int i = 0; i < V; ++i) dropped += above[i] >= target;
  float thr = s[std::min(dropped, V - 1)];
  for (int i = 0; i < V; ++i)
    if (lp[i] < thr) lp[i] = kNegInf;
}

// mlx-lm apply_min_p.
void ref_apply_min_p(float* lp, int V, float min_p, int min_tokens_to_keep) {
  if (V <= 0) return;
  float top = max_entry(lp, V).first;
  float scaled = top + float(std::log(double(min_p)));
  std::vector<char> remove(V);
  for (int i = 0; i < V; ++i) remove[i] = lp[i] < scaled;
  if (min_tokens_to_keep > 1) {
    std::vector<std::pair<float, int>> v(V);
    for (int i = 0; i < V; ++i) v[i] = {lp[i], i};
    int m = std::min(min_tokens_to_keep, V);
    std::partial_sort(v.begin(), v.begin() + m, v.end(), DescByValue{});
    for (int j = 0; j < m; ++j) remove[v[j].second] = 0;
  }
  for (int i = 0; i < V; ++i)
    if (remove[i]) lp[i] = kNegInf;
}

// mlx-lm apply_top_k (argpartition of -logprobs; ties resolved by lowest index here).
void ref_apply_top_k(float* lp, int V, int top_k) {
  if (!(top_k > 0 && top_k < V)) return;
  std::vector<std::pair<float, int>> v(V);
  for (int i = 0; i < V; ++i) v[i] = {lp[i], i};
  std::nth_element(v.begin(), v.begin() + (top_k - 1), v.end(), DescByValue{});
  for (int j = top_k; j < V; ++j) lp[v[j].second] = kNegInf;
}

// mlx-lm apply_xtc: softmax over current logprobs; remove every token whose prob exceeds the
// smallest prob above `threshold` (special tokens exempt), when coin <= probability.
void ref_apply_xtc(float* lp, int V, float probability, float threshold,
                   std::span<const int> special_tokens, float coin) {
  if (coin > probability || V <= 0) return;
  std::vector<float> pr(lp, lp + V);
  log_softmax_inplace(pr.data(), V);
  for (auto& x : pr) x = std::exp(x);
  float pmin = std::numeric_limits<float>::infinity();
  for (float x : pr)
    if (x > threshold) pmin = std::min(pmin, x);
  std::vector<char> mask(V);
  for (int i = 0; i < V; ++i) mask[i] = pr[i] > pmin;
  for (int t : special_tokens)
    if (t >= 0 && t < V) mask[t] = 0;
  for (int i = 0; i < V; ++i)
    if (mask[i]) lp[i] = kNegInf;
}

std::vector<std::pair<int, float>> top_logprobs(const float* lp, int V, int n) {
  n = std::max(0, std::min(n, V));
  std::vector<std::pair<float, int>> h;
  h.reserve(n);
  const DescByValue better;
  for (int i = 0; i < V; ++i) {
    float v = std::isnan(lp[i]) ? kNegInf : lp[i];
    if (int(h.size()) < n) {
      h.emplace_back(v, i);
      std::push_heap(h.begin(), h.end(), better);
    } else if (n > 0 && v > h.front().first) {
      std::pop_heap(h.begin(), h.end(), better);
      h.back() = {v, i};
      std::push_heap(h.begin(), h.end(), better);
    }
  }
  std::sort_heap(h.begin(), h.end(), better);
  std::vector<std::pair<int, float>> out;
  out.reserve(h.size());
  for (auto& [v, i] : h) out.emplace_back(i, v);
  return out;
}

// ---- RNG ----
void Rng::reseed(uint64_t seed) {
  uint64_t z = seed;
  for (auto& s : s_) {  // splitmix64
    z += 0x9E3779B97F4A7C15ull;
    uint64_t x = z;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    s = x ^ (x >> 31);
  }
}

uint64_t Rng::next() {  // xoshiro256**
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  uint64_t r = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return r;
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

// ---- Sampler ----
Sampler::Sampler(SamplingParams params, int vocab_size)
    : p_(std::move(params)), V_(vocab_size) {
  uint64_t seed = p_.seed;
  if (!p_.has_seed) {
    std::random_device rd;
    seed = (uint64_t(rd()) << 32) ^ rd();
  }
  rng_.reseed(seed);
}

void Sampler::sort_desc() {
  if (!sorted_) std::sort(cand_.begin(), cand_.end(), DescByValue{});
  sorted_ = true;
}

// cand_ <- every token with lp >= thr (unsorted).
void Sampler::collect_at_least(const float* lp, float thr) {
  cand_.clear();
  for (int i = 0; i < V_; ++i)
    if (lp[i] >= thr) cand_.emplace_back(lp[i], i);
  sorted_ = false;
}

// top_p on a descending-sorted candidate list cand_ that holds the top tokens by value. The
// kept set is the shortest head whose fp32 running mass (accumulated from the top, exactly as
// mlx's reverse cumsum does) reaches top_p * total, plus ties of its last value. Returns false
// when the target is not reached inside the list and `complete` is false (list too short).
bool Sampler::cut_top_p(bool complete) {
  bool reached = false;
  const size_t r = top_p_head(cand_, p_.top_p * total_mass_, &reached);
  if (!reached && !complete) return false;
  cand_.resize(r);
  return true;
}

// top_p on the full vocabulary: sort only the tokens within `delta` nats of the maximum and
// widen delta until the head that reaches the target mass lies inside them. When more than
// kExactSortLimit tokens are involved (high-entropy steps), use the bucketed cut instead.
void Sampler::top_p(const float* lp, float max_lp) {
  for (float delta : {8.f, 16.f, 32.f, 64.f, std::numeric_limits<float>::infinity()}) {
    collect_at_least(lp, max_lp - delta);
    if (cand_.size() > kExactSortLimit && top_p_bucketed(lp, max_lp)) break;
    sort_desc();
    if (cut_top_p(int(cand_.size()) == V_ || std::isinf(delta))) break;
  }
  all_alive_ = false;
}

// Bucketed top_p for large heads: histogram the probability mass by logprob in 1/64-nat bins
// over [max - 64, max] (double sums), find the bin where the running mass reaches the target,
// and sort only that bin. The kept set is the same rule as mlx-lm's; only the summation order
// (double, by bin, instead of an fp32 cumsum over the sorted vocabulary) differs, which moves
// the cut only when it falls within rounding of the boundary. Returns false (nothing changed)
// if the target is not reached inside the range.
bool Sampler::top_p_bucketed(const float* lp, float max_lp) {
  constexpr int kBins = 4096;
  constexpr float kRange = 64.f;
  const float lo = max_lp - kRange, scale = kBins / kRange;
  std::vector<double>& mass = bin_mass_;
  mass.assign(kBins, 0.0);
  for (int i = 0; i < V_; ++i) {
    const float v = lp[i];
    if (!(v >= lo)) continue;
    int b = std::min(kBins - 1, int((max_lp - v) * scale));
    mass[b] += std::exp(v);
  }
  const double target = double(p_.top_p) * double(total_mass_);
  double head = 0;
  int b = 0;
  for (; b < kBins; ++b) {
    if (head + mass[b] >= target) break;
    head += mass[b];
  }
  if (b == kBins) return false;
  // Tokens of bins < b are kept; sort bin b (the cut is inside it) and find the cut there.
  cand_.clear();
  std::vector<std::pair<float, int>>& edge = edge_;
  edge.clear();
  for (int i = 0; i < V_; ++i) {
    const float v = lp[i];
    if (!(v >= lo)) continue;
    int bi = std::min(kBins - 1, int((max_lp - v) * scale));
    if (bi < b) {
      cand_.emplace_back(v, i);
    } else if (bi == b) {
      edge.emplace_back(v, i);
    }
  }
  std::sort(edge.begin(), edge.end(), DescByValue{});
  // mass above position j = head + sum of edge[0..j); the first j reaching the target is cut.
  double acc = head;
  size_t r = 0;
  while (r < edge.size() && acc < target) acc += std::exp(edge[r++].first);
  if (acc < target && r == edge.size()) {  // rounding put the crossing past this bin: keep it
    cand_.insert(cand_.end(), edge.begin(), edge.end());
  } else {
    if (r == 0) r = 1;  // cannot happen (head < target), kept as a guard
    const float thr = edge[r - 1].first;
    while (r < edge.size() && edge[r].first >= thr) ++r;  // ties of the threshold survive
    cand_.insert(cand_.end(), edge.begin(), edge.begin() + r);
  }
  sorted_ = false;
  all_alive_ = false;
  return true;
}

// min_p: keep lp >= max + log(min_p), and at least the top min_tokens_to_keep tokens.
void Sampler::min_p(const float* lp, float max_lp) {
  const float thr = max_lp + float(std::log(double(p_.min_p)));
  const size_t m = size_t(p_.min_tokens_to_keep);
  if (all_alive_) {
    collect_at_least(lp, thr);
    all_alive_ = false;
    if (cand_.size() >= m) return;
    // fewer survivors than m: the top m tokens by value (a superset of the survivors).
    select_top(lp, m);
    return;
  }
  size_t keep = 0;
  for (auto& c : cand_) keep += c.first >= thr;
  if (keep < m && keep < cand_.size()) sort_desc();  // the first m by value survive
  cut_min_p_sorted(cand_, max_lp, float(std::log(double(p_.min_p))), p_.min_tokens_to_keep);
}

// XTC: softmax over the current survivors; drop every token whose prob exceeds the smallest
// prob above the threshold, except special tokens. The coin comes from this sampler's RNG.
void Sampler::xtc(const float* lp) {
  double coin = rng_.uniform();
  if (coin > p_.xtc_probability) return;
  if (all_alive_) {
    cand_.clear();
    cand_.reserve(V_);
    for (int i = 0; i < V_; ++i) cand_.emplace_back(lp[i], i);
    all_alive_ = false;
    sorted_ = false;
  }
  float m = kNegInf;
  for (auto& c : cand_) m = std::max(m, c.first);
  if (!std::isfinite(m)) return;
  double s = 0;
  for (auto& c : cand_) s += std::exp(c.first - m);
  const float lse = float(double(m) + std::log(s));
  auto prob = [lse](float v) { return std::exp(v - lse); };
  float pmin = std::numeric_limits<float>::infinity();
  for (auto& c : cand_) {
    float pr = prob(c.first);
    if (pr > p_.xtc_threshold) pmin = std::min(pmin, pr);
  }
  const auto& sp = p_.xtc_special_tokens;
  auto removed = [&](const std::pair<float, int>& c) {
    return prob(c.first) > pmin && std::find(sp.begin(), sp.end(), c.second) == sp.end();
  };
  cand_.erase(std::remove_if(cand_.begin(), cand_.end(), removed), cand_.end());
}

// cand_ <- the k best tokens (descending logprob, lowest id among ties), sorted. One pass with a
// bounded heap whose top is the worst kept token: O(V) compares plus O(hits * log k).
void Sampler::select_top(const float* lp, size_t k) {
  k = std::min(k, size_t(V_));
  cand_.clear();
  cand_.reserve(k);
  const DescByValue better;
  int i = 0;
  for (; i < V_ && cand_.size() < k; ++i) {
    cand_.emplace_back(lp[i], i);
    std::push_heap(cand_.begin(), cand_.end(), better);
  }
  for (; i < V_; ++i) {
    if (!(lp[i] > cand_.front().first)) continue;  // later ids never win ties
    std::pop_heap(cand_.begin(), cand_.end(), better);
    cand_.back() = {lp[i], i};
    std::push_heap(cand_.begin(), cand_.end(), better);
  }
  std::sort_heap(cand_.begin(), cand_.end(), better);
  sorted_ = true;
  all_alive_ = false;
}

// top_k: keep exactly k tokens (highest logprobs; lowest id among ties).
void Sampler::top_k(const float* lp) {
  const size_t k = size_t(p_.top_k);
  if (all_alive_) return select_top(lp, k);
  if (cand_.size() <= k) return;
  if (!sorted_) {
    std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), DescByValue{});
    sorted_ = true;
  }
  cand_.resize(k);
}

// Inverse-CDF draw from softmax(lp / temperature) over the survivors (double precision).
int Sampler::draw(const float* lp, float max_lp) {
  const float inv_t = 1.0f / p_.temperature;
  double sum = 0;
  if (all_alive_) {
    scratch_.resize(V_);
    sum = vec::exp_scaled_into(lp, V_, max_lp, inv_t, scratch_.data());
    double u = rng_.uniform() * sum, c = 0;
    int last = -1;
    for (int i = 0; i < V_; ++i) {
      if (scratch_[i] <= 0) continue;
      last = i;
      c += scratch_[i];
      if (u < c) return i;
    }
    return last < 0 ? argmax(lp, V_) : last;
  }
  if (cand_.empty()) return lp ? argmax(lp, V_) : 0;
  const int j = draw_index(cand_, p_.temperature, rng_.uniform());
  return j < 0 ? (lp ? argmax(lp, V_) : cand_[0].second) : cand_[size_t(j)].second;
}

bool Sampler::top_k_sampleable(const SamplingParams& p, int V) {
  return p.temperature > 0 && p.top_k > 0 && p.top_k <= kMaxTopK && p.top_k < V && p.xtc_probability <= 0 &&
         !has_logits_processors(p);
}

int Sampler::sample_top(const float* vals, const int32_t* ids, int n, float lse) {
  G4_CHECK(top_k_sampleable(p_, V_) && n >= p_.top_k);
  TopDraw d = top_draw_params(p_);
  d.bits = take_draw_bits();
  sorted_ = true;
  all_alive_ = false;
  return draw_top(vals, ids, n, lse, d, &cand_);
}

int Sampler::sample(float* logits, std::span<const int> history) {
  apply_logits_processors(p_, logits, V_, history);
  double mass = 0;
  int best = 0;
  float lse = log_softmax_impl(logits, V_, &mass, &best);
  all_alive_ = true;
  sorted_ = false;
  cand_.clear();
  if (!std::isfinite(lse) || p_.temperature <= 0 || !(mass > 0)) return best;
  const float max_lp = logits[best];
  total_mass_ = float(mass);
  const bool use_top_k = p_.top_k > 0 && p_.top_k < V_;
  if (use_top_k && !(p_.xtc_probability > 0)) {
    // top_p, min_p and top_k each keep a head of the descending order (min_tokens_to_keep
    // too), so the chain's result is the shortest of those heads: select the top k first
    // (O(V)), then run top_p and min_p on that sorted list. Same set as mlx-lm's order.
    top_k(logits);
    if (p_.top_p > 0 && p_.top_p < 1) cut_top_p(/*complete=*/true);
    if (p_.min_p != 0) min_p(logits, max_lp);
    return draw(logits, max_lp);
  }
  if (p_.top_p > 0 && p_.top_p < 1) top_p(logits, max_lp);
  if (p_.min_p != 0) min_p(logits, max_lp);
  if (p_.xtc_probability > 0) xtc(logits);
  if (use_top_k) top_k(logits);
  return draw(logits, max_lp);
}

}  // namespace g4
