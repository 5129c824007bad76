// The host-routed MoE experts (moe_host_routed.h).
#include "backend/moe_host_routed.h"

namespace g4 {

Buf HostRoutedMoe::run(Backend& be, const Buf& x, int rows, int d, const Buf& idx, int k,
                       const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision P) {
  const int E = gate.count;
  const int64_t I = gate.rows();  // other ranks' experts: their items 0
  std::vector<int32_t> hidx(size_t(rows) * size_t(k));
  be.to_host(idx, hidx.size(), hidx.data());
  // Each expert's (row, slot) items, and where its outputs land in ys_ (expert after expert).
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
  for (int i = 0; i < rows * k; ++i) by_expert[size_t(hidx[size_t(i)])].push_back(i);
  const size_t n = size_t(rows) * size_t(k);
  if (n > cap_) {  // grown outside any recorded step (to_host above left step mode)
    release(be);
    xs_ = be.alloc_act(n * size_t(d));
    g_ = be.alloc_act(n * size_t(I));
    u_ = be.alloc_act(n * size_t(I));
    ys_ = be.alloc_act(n * size_t(d));
    y_ = be.alloc_act(n * size_t(d));
    ids_ = be.alloc_i32(2 * n);
    cap_ = n;
  }
  std::vector<int32_t> rows_of(n), back(n);  // gather source rows; ys_ position of each item
  size_t at = 0;
  for (int e = 0; e < E; ++e)
    for (int32_t item : by_expert[size_t(e)]) {
      rows_of[at] = item / k;
      back[size_t(item)] = int32_t(at);
      ++at;
    }
  be.from_host(rows_of.data(), n, ids_);
  be.from_host(back.data(), n, ids_.at(int64_t(n)));
  be.gather_rows(x, ids_, int(n), d, xs_);
  at = 0;
  for (int e = 0; e < E; ++e) {
    const int m = int(by_expert[size_t(e)].size());
    if (!m) continue;
    if (!gate.holds(e)) {  // another rank's expert: its part of the sum is 0
      const std::vector<float> zeros(size_t(m) * size_t(d), 0.f);
      be.from_host(zeros.data(), zeros.size(), ys_.at(int64_t(at) * d));
      at += size_t(m);
      continue;
    }
    const Buf xe = xs_.at(int64_t(at) * d);
    be.matmul(xe, m, gate.expert(e), P, g_);
    be.matmul(xe, m, up.expert(e), P, u_);
    be.gelu_mul(g_, u_, size_t(m) * size_t(I), P, g_);
    be.matmul(g_, m, down.expert(e), P, ys_.at(int64_t(at) * d));
    at += size_t(m);
  }
  be.gather_rows(ys_, ids_.at(int64_t(n)), int(n), d, y_);  // back to (row, slot) order
  return y_;
}

void HostRoutedMoe::release(Backend& be) {
  for (Buf* p : {&xs_, &g_, &u_, &ys_, &y_, &ids_}) {
    be.free(*p);
    *p = Buf{};
  }
  cap_ = 0;
}

}  // namespace g4
