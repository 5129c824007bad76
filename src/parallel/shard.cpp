#include "parallel/shard.h"

#include <cstring>
#include <numeric>
#include <string>

#include "core/dtype.h"
#include "quant/gguf_quant.h"
#include "quant/matmul.h"

namespace g4 {
namespace {

uint8_t* alloc_aligned(int64_t bytes) {
  void* p = std::aligned_alloc(64, size_t((bytes + 63) / 64 * 64 + 64));
  G4_CHECK(p != nullptr);
  return static_cast<uint8_t*>(p);
}

// "name [rows, cols] fmt rows" / "... columns": the dimension named in errors.
std::string dim_name(const WeightView& w, const char* name, const char* dim) {
  return std::string(name) + " [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] " +
         std::string(wformat_name(w.fmt)) + " " + dim;
}

Status check_view(const WeightView& w, const char* name) {
  G4_TRY(validate_weight(w, name));
  if (is_gguf_format(w.fmt)) G4_TRY(gguf_validate(w, name));
  return Status::ok();
}

// Bytes of one MlxAffine scale (or bias); 0 for other formats.
int64_t scale_bytes(const WeightView& w) {
  return w.fmt == WFormat::MlxAffine ? int64_t(dtype_size(w.scale_dtype)) : 0;
}

// Offset of column c within a row's bytes (c at a col_split_unit boundary).
int64_t col_byte(const WeightView& w, int64_t c) {
  switch (w.fmt) {
    case WFormat::F32: return c * 4;
    case WFormat::F16:
    case WFormat::BF16: return c * 2;
    case WFormat::MlxAffine: return c * w.bits / 8;
    default: return c / gguf_block_size(w.fmt) * gguf_block_bytes(w.fmt);
  }
}

// Copies rows [r0, r1) of w (data, and MlxAffine scales/biases) to row `dst_row` of p.
void copy_rows(const WeightView& w, int64_t r0, int64_t r1, PackedWeight& p, int64_t dst_row) {
  const auto* src = static_cast<const uint8_t*>(w.data);
  std::memcpy(p.data() + dst_row * w.row_bytes, src + r0 * w.row_bytes, size_t((r1 - r0) * w.row_bytes));
  if (w.fmt != WFormat::MlxAffine) return;
  const int64_t row_sb = w.cols / w.group_size * scale_bytes(w);
  std::memcpy(p.scales() + dst_row * row_sb, static_cast<const uint8_t*>(w.scales) + r0 * row_sb,
              size_t((r1 - r0) * row_sb));
  std::memcpy(p.biases() + dst_row * row_sb, static_cast<const uint8_t*>(w.biases) + r0 * row_sb,
              size_t((r1 - r0) * row_sb));
}

}  // namespace

int64_t col_split_unit(const WeightView& w) {
  switch (w.fmt) {
    case WFormat::F32:
    case WFormat::F16:
    case WFormat::BF16: return 1;
    case WFormat::MlxAffine: return w.group_size;
    default: return gguf_block_size(w.fmt);
  }
}

PackedWeight PackedWeight::allocate(const WeightView& layout) {
  PackedWeight p;
  p.view_ = layout;
  p.data_.reset(alloc_aligned(layout.rows * layout.row_bytes));
  p.view_.data = p.data_.get();
  p.view_.scales = p.view_.biases = nullptr;
  if (layout.fmt == WFormat::MlxAffine) {
    const int64_t sb = layout.rows * (layout.cols / layout.group_size) * scale_bytes(layout);
    p.scales_.reset(alloc_aligned(sb));
    p.biases_.reset(alloc_aligned(sb));
    p.view_.scales = p.scales_.get();
    p.view_.biases = p.biases_.get();
  }
  return p;
}

Result<WeightView> shard_rows(const WeightView& w, int rank, int size, const char* name, int64_t unit) {
  G4_TRY(check_view(w, name));
  G4_ASSIGN_OR_RETURN(ShardRange r, shard_range(w.rows, unit, rank, size, dim_name(w, name, "rows").c_str()));
  WeightView v = w;
  v.rows = r.size();
  v.data = static_cast<const uint8_t*>(w.data) + r.begin * w.row_bytes;
  if (w.fmt == WFormat::MlxAffine) {
    const int64_t row_sb = w.cols / w.group_size * scale_bytes(w);
    v.scales = static_cast<const uint8_t*>(w.scales) + r.begin * row_sb;
    v.biases = static_cast<const uint8_t*>(w.biases) + r.begin * row_sb;
  }
  return v;
}

Result<PackedWeight> shard_cols(const WeightView& w, int rank, int size, const char* name, int64_t unit) {
  G4_TRY(check_view(w, name));
  const std::string what = dim_name(w, name, "columns");
  int64_t block = col_split_unit(w);
  if (unit == 0) unit = block;
  // MLX affine: a unit that cuts the groups regroups the shard to gcd(unit, group) columns.
  if (w.fmt == WFormat::MlxAffine && unit > 0 && unit % block != 0 && unit % kMinMlxGroup == 0)
    block = std::gcd(unit, block);
  if (unit < 1 || unit % block != 0)
    return err("%s: split unit %lld is not a multiple of the %lld-column %s block", what.c_str(),
               (long long)unit, (long long)block, std::string(wformat_name(w.fmt)).c_str());
  G4_ASSIGN_OR_RETURN(ShardRange c, shard_range(w.cols, unit, rank, size, what.c_str()));

  WeightView layout = w;
  layout.cols = c.size();
  layout.row_bytes = col_byte(w, c.end) - col_byte(w, c.begin);
  if (w.fmt == WFormat::MlxAffine) layout.group_size = int(block);
  PackedWeight p = PackedWeight::allocate(layout);
  const auto* src = static_cast<const uint8_t*>(w.data);
  const int64_t off = col_byte(w, c.begin);
  for (int64_t r = 0; r < w.rows; ++r)
    std::memcpy(p.data() + r * layout.row_bytes, src + r * w.row_bytes + off, size_t(layout.row_bytes));
  if (w.fmt == WFormat::MlxAffine) {
    // New group j of a row takes the scale and bias of the source group holding its columns.
    const int64_t es = scale_bytes(w), ng = w.cols / w.group_size, nng = c.size() / block;
    const auto* sc = static_cast<const uint8_t*>(w.scales);
    const auto* bi = static_cast<const uint8_t*>(w.biases);
    for (int64_t r = 0; r < w.rows; ++r) {
      for (int64_t j = 0; j < nng; ++j) {
        const int64_t s = (r * ng + (c.begin + j * block) / w.group_size) * es, d = (r * nng + j) * es;
        std::memcpy(p.scales() + d, sc + s, size_t(es));
        std::memcpy(p.biases() + d, bi + s, size_t(es));
      }
    }
  }
  return p;
}

Result<PackedWeight> shard_rows_stacked(const WeightView& w, const std::vector<int64_t>& parts, int rank,
                                        int size, const char* name, int64_t unit) {
  G4_TRY(check_view(w, name));
  int64_t total = 0;
  for (int64_t n : parts) total += n;
  if (parts.empty() || total != w.rows)
    return err("%s: the parts' rows add up to %lld, not the matrix's %lld rows", dim_name(w, name, "rows").c_str(),
               (long long)total, (long long)w.rows);
  std::vector<ShardRange> slices;
  int64_t out_rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string what = dim_name(w, name, "rows") + " (part " + std::to_string(i) + ", " +
                             std::to_string(parts[i]) + " rows)";
    G4_ASSIGN_OR_RETURN(ShardRange r, shard_range(parts[i], unit, rank, size, what.c_str()));
    slices.push_back(r);
    out_rows += r.size();
  }
  WeightView layout = w;
  layout.rows = out_rows;
  PackedWeight p = PackedWeight::allocate(layout);
  int64_t part0 = 0, dst = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    copy_rows(w, part0 + slices[i].begin, part0 + slices[i].end, p, dst);
    dst += slices[i].size();
    part0 += parts[i];
  }
  return p;
}

}  // namespace g4
