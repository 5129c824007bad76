// Helpers of the tensor-parallel model tests (tp_model_test.cpp, tp_cuda_test.cpp): a group's
// options, a prompt scored at every position plus greedy steps, and the logits' comparison with
// the single-rank model.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace g4::tp_test {

inline BackendOptions ranks_opt(int ranks) {
  BackendOptions o;
  o.tensor_parallel = ranks;
  return o;
}

constexpr int kDecodeSteps = 3;

// max |got - ref| and max |ref|, and whether they meet the contract: within 2e-5 of max(1, max |ref|).
// The ranks' partial sums change only the f32 summation order. Without AMX the fixtures measure up to
// 3.3e-6 of max |logit|; with the AMX prefill kernel (CPUs with AMX-BF16, matmul_amx_avx512.cpp:
// tiles of 32 columns, x in three bf16 parts) up to 1.2e-5 (estyle-q4g64), as far as one rank with
// AMX is from one rank without it (1.6e-5 of max |logit| on that fixture).
struct Diff {
  float max_diff = 0, max_ref = 0;
  bool within_contract() const { return max_diff <= 2e-5f * std::max(1.f, max_ref); }
};
inline Diff compare(const std::vector<float>& ref, const std::vector<float>& got) {
  Diff d;
  for (size_t i = 0; i < ref.size(); ++i) {
    d.max_ref = std::max(d.max_ref, std::abs(ref[i]));
    d.max_diff = std::max(d.max_diff, std::abs(ref[i] - got[i]));
  }
  return d;
}

// Logits of `prompt` at every position, then of kDecodeSteps greedy steps, on one model.
inline std::vector<float> score(Model& m, const std::vector<int32_t>& prompt, std::vector<int32_t>* picked) {
  const int V = m.config().vocab, L = int(prompt.size());
  std::vector<float> out(size_t(L + kDecodeSteps) * size_t(V));
  auto cache = m.new_cache();
  m.forward({SeqInput{cache.get(), prompt.data(), L, true}}, ActPrecision::F32, out.data());
  int32_t next = int32_t(std::max_element(out.begin() + size_t(L - 1) * V, out.begin() + size_t(L) * V) -
                         (out.begin() + size_t(L - 1) * V));
  for (int s = 0; s < kDecodeSteps; ++s) {
    picked->push_back(next);
    int32_t am = 0;
    m.forward({SeqInput{cache.get(), &next, 1, false}}, ActPrecision::F32, out.data() + size_t(L + s) * V, &am);
    next = am;
  }
  return out;
}

}  // namespace g4::tp_test
