// Scalar dequantization of GGUF blocks (mirrors ggml dequantize_row_* and gguf/quants.py
// dequantize_blocks, operation for operation so that results are bit-identical), the format
// table, and the scalar reference matmul.
#include <string>
#include <vector>

#include "quant/gguf_blocks.h"
#include "quant/gguf_quant.h"

namespace g4 {
using namespace gguf;

bool is_gguf_format(WFormat f) { return gguf_block_size(f) != 0; }

int gguf_block_size(WFormat f) {
  switch (f) {
    case WFormat::GgufQ4_0:
    case WFormat::GgufQ5_0:
    case WFormat::GgufQ8_0: return QK;
    case WFormat::GgufQ4_K:
    case WFormat::GgufQ5_K:
    case WFormat::GgufQ6_K: return QKK;
    default: return 0;
  }
}

int gguf_block_bytes(WFormat f) {
  switch (f) {
    case WFormat::GgufQ4_0: return kQ4_0Bytes;
    case WFormat::GgufQ5_0: return kQ5_0Bytes;
    case WFormat::GgufQ8_0: return kQ8_0Bytes;
    case WFormat::GgufQ4_K: return kQ4_KBytes;
    case WFormat::GgufQ5_K: return kQ5_KBytes;
    case WFormat::GgufQ6_K: return kQ6_KBytes;
    default: return 0;
  }
}

int64_t gguf_row_bytes(WFormat f, int64_t cols) {
  int bs = gguf_block_size(f);
  if (bs == 0 || cols <= 0 || cols % bs != 0) return 0;
  return cols / bs * gguf_block_bytes(f);
}

Status gguf_validate(const WeightView& w, const char* name) {
  const int bs = gguf_block_size(w.fmt);
  if (bs == 0) return err("%s: format %s is not a GGUF block format", name, std::string(wformat_name(w.fmt)).c_str());
  if (w.rows <= 0 || w.cols <= 0 || w.cols % bs != 0)
    return err("%s: shape [%lld, %lld] not a whole number of %s blocks of %d", name, (long long)w.rows,
               (long long)w.cols, std::string(wformat_name(w.fmt)).c_str(), bs);
  if (w.row_bytes < gguf_row_bytes(w.fmt, w.cols))
    return err("%s: row_bytes %lld < %lld needed for %lld %s values", name, (long long)w.row_bytes,
               (long long)gguf_row_bytes(w.fmt, w.cols), (long long)w.cols, std::string(wformat_name(w.fmt)).c_str());
  if (!w.data) return err("%s: no data", name);
  return Status::ok();
}

namespace {

void deq_q4_0(const uint8_t* b, float* y) {
  const float d = rdf16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(qs[j] & 0xF) - 8);
    y[j + 16] = d * float(int(qs[j] >> 4) - 8);
  }
}

void deq_q5_0(const uint8_t* b, float* y) {
  const float d = rdf16(b);
  const uint32_t qh = rd32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    int lo = (qs[j] & 0xF) | int((qh >> j) & 1) << 4;
    int hi = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
    y[j] = d * float(lo - 16);
    y[j + 16] = d * float(hi - 16);
  }
}

void deq_q8_0(const uint8_t* b, float* y) {
  const float d = rdf16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = float(qs[j]) * d;
}

void deq_q4_k(const uint8_t* b, float* y) {
  const float d = rdf16(b), dmin = rdf16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    scale_min_k4(s, scales, &sc, &m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s & 1);
    for (int l = 0; l < 32; ++l) {
      float prod = d1 * float((q[l] >> shift) & 0xF);  // separate statements: no FMA contraction
      y[32 * s + l] = prod - m1;
    }
  }
}

void deq_q5_k(const uint8_t* b, float* y) {
  const float d = rdf16(b), dmin = rdf16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    scale_min_k4(s, scales, &sc, &m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s & 1);
    for (int l = 0; l < 32; ++l) {
      int v = ((q[l] >> shift) & 0xF) | ((qh[l] >> s) & 1) << 4;
      float prod = d1 * float(v);
      y[32 * s + l] = prod - m1;
    }
  }
}

void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = rdf16(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        const int e = h * 128 + 32 * s + l;
        int q = (ql[h * 64 + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0xF;
        q |= ((qh[h * 32 + l] >> (2 * s)) & 3) << 4;
        const float ds = d * float(sc[e / 16]);
        y[e] = ds * float(q - 32);
      }
    }
  }
}

}  // namespace

void gguf_dequant_row(const WeightView& w, int64_t r, float* out) {
  const int bs = gguf_block_size(w.fmt), bb = gguf_block_bytes(w.fmt);
  G4_CHECK(gguf_validate(w, "gguf_dequant_row").is_ok());
  void (*fn)(const uint8_t*, float*) = nullptr;
  switch (w.fmt) {
    case WFormat::GgufQ4_0: fn = deq_q4_0; break;
    case WFormat::GgufQ5_0: fn = deq_q5_0; break;
    case WFormat::GgufQ8_0: fn = deq_q8_0; break;
    case WFormat::GgufQ4_K: fn = deq_q4_k; break;
    case WFormat::GgufQ5_K: fn = deq_q5_k; break;
    case WFormat::GgufQ6_K: fn = deq_q6_k; break;
    default: return;
  }
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  const int64_t nb = w.cols / bs;
  for (int64_t i = 0; i < nb; ++i) fn(row + i * bb, out + i * bs);
}

void gguf_matmul_ref(const float* x, int64_t M, const WeightView& w, float* y) {
  G4_CHECK(gguf_validate(w, "gguf_matmul_ref").is_ok());
  std::vector<float> row(size_t(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    gguf_dequant_row(w, r, row.data());
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * w.cols;
      double acc = 0;
      for (int64_t k = 0; k < w.cols; ++k) acc += double(xm[k]) * double(row[k]);
      y[m * w.rows + r] = float(acc);
    }
  }
}

}  // namespace g4
