// GradArith's default LoRA delta (grad_arith.h): the products and elementwise ops of
// Backend::lora_delta's composition, in its order, so an arithmetic without a fused form computes
// what the recorded composition did.
#include "backend/grad_arith.h"

namespace g4 {

void GradArith::lora_fwd(const float* x, int M, const WeightView& A, const WeightView& B, float s, float* t,
                         float* y) {
  const size_t n = size_t(M) * size_t(B.rows);
  matmul_wt(x, M, A, t);
  const ArithBlock z(*this, n * 4, false);
  matmul_wt(t, M, B, z.f32());
  scale(z.f32(), s, n, z.f32());
  add(y, z.f32(), n, y);
}

void GradArith::lora_bwd(const float* x, const float* t, const float* dy, int M, const WeightView& A,
                         const WeightView& B, float s, float* gA, float* gB, float* dx) {
  const size_t n = size_t(M) * size_t(B.rows);
  const ArithBlock dz(*this, n * 4, false), dt(*this, size_t(M) * size_t(A.rows) * 4, true);
  scale(dy, s, n, dz.f32());
  matmul_w_acc(dz.f32(), M, B, dt.f32());
  gemm_tn_acc(dz.f32(), t, gB, M, int(B.rows), int(B.cols));
  if (dx) matmul_w_acc(dt.f32(), M, A, dx);
  gemm_tn_acc(dt.f32(), x, gA, M, int(A.rows), int(A.cols));
}

}  // namespace g4
