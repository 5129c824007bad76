// Names of weight storage formats (for messages and benchmarks).
#include "quant/weight.h"

namespace g4 {

std::string_view wformat_name(WFormat f) {
  switch (f) {
    case WFormat::F32: return "f32";
    case WFormat::F16: return "f16";
    case WFormat::BF16: return "bf16";
    case WFormat::MlxAffine: return "mlx_affine";
    case WFormat::GgufQ4_0: return "q4_0";
    case WFormat::GgufQ5_0: return "q5_0";
    case WFormat::GgufQ8_0: return "q8_0";
    case WFormat::GgufQ4_K: return "q4_k";
    case WFormat::GgufQ5_K: return "q5_k";
    case WFormat::GgufQ6_K: return "q6_k";
  }
  return "unknown";
}

}  // namespace g4
