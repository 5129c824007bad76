// Tensor-parallel shards of weight matrices (quant/weight.h: [rows, cols] = [out, in], any WFormat).
//
// Column-parallel (q/k/v, gate/up, the vocabulary head): each rank holds a slice of the OUTPUT rows,
// computes its slice of y = x · Wᵀ from the full x, and nothing is exchanged (or the slices are
// gathered). shard_rows returns a zero-copy view of rows [r0, r1).
// Row-parallel (o_proj, down_proj): each rank holds a slice of the INPUT columns, multiplies the
// matching slice of x (the column-parallel layer's output, already local), and the partial
// products are summed with Communicator::all_reduce_sum. A view cannot express a column slice
// (kernels read a row's blocks and scales contiguously), so shard_cols returns a packed copy.
//
// How a dimension is split (shard_range): into whole units (a row or a head for rows; the format's
// block or group for columns: col_split_unit), contiguous and in rank order; with u units over
// n ranks, every rank gets u / n units and the first u % n ranks one unit more. Splits that leave a
// rank without a unit, or cut a block, are refused with an error naming the tensor, its shape and
// format, the unit and the rank count, e.g.
//   "ffn_down [64, 512] q4_k columns: 512 in units of 256 is 2 units, fewer than the 3 ranks"
// Consistency: every function splits a dimension through shard_range, so two matrices whose split
// dimensions have the same length and unit get matching slices. For a gated MLP, shard gate and up
// rows with unit = col_split_unit(down) and down with shard_cols: rank r's gate/up rows are then
// exactly its down columns. Stacked projections (q|k|v, gate|up in one matrix) are split part by
// part (shard_rows_stacked), never as one block of rows.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/shard_range.h"
#include "core/status.h"
#include "quant/weight.h"

namespace g4 {

// The smallest MLX group the kernels take (quant/matmul.cpp: 32, 64 or 128).
constexpr int64_t kMinMlxGroup = 32;

// The finest column split a format allows without regrouping: 1 for F32/F16/BF16, group_size for
// MlxAffine, the block size for GGUF formats (32; 256 for the K-quants).
int64_t col_split_unit(const WeightView& w);

// A weight matrix that owns its packed storage (64-byte aligned host memory): view() stays valid
// while the object lives, moves included. A device backend copies it with place_weight.
class PackedWeight {
 public:
  // Uninitialised storage for a matrix laid out as `layout` (format, shape, row_bytes, MLX bits,
  // group size and scale dtype; its pointers are ignored): rows * row_bytes bytes of data and, for
  // MlxAffine, rows * cols / group_size scales and as many biases.
  static PackedWeight allocate(const WeightView& layout);
  const WeightView& view() const { return view_; }
  uint8_t* data() { return data_.get(); }
  uint8_t* scales() { return scales_.get(); }
  uint8_t* biases() { return biases_.get(); }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_, scales_, biases_;
  WeightView view_;
};

// Column-parallel shard: rows [r0, r1) of w, r0/r1 = shard_range(w.rows, unit, rank, size) (unit:
// rows per indivisible unit: head_dim to split q/k/v by heads, col_split_unit(down) for gate/up).
// Zero-copy: points into w's storage (MlxAffine scales and biases offset too), valid while it is;
// a device backend's place_weight then copies only these rows.
Result<WeightView> shard_rows(const WeightView& w, int rank, int size, const char* name, int64_t unit = 1);

// Row-parallel shard: columns [c0, c1) of every row, c0/c1 = shard_range(w.cols, unit, rank, size),
// packed as a [w.rows, c1 - c0] matrix of w's format (GGUF blocks and MLX words copied, never
// requantized: the shard's values are exactly w's). unit: 0 means col_split_unit(w); otherwise a
// multiple of it (head_dim to split o_proj by heads; an error names the format's block if not).
// MLX affine alone may be cut inside a group: a unit that is a multiple of kMinMlxGroup but not of
// the group regroups the shard to gcd(unit, group_size) columns, each new group taking its source
// group's scale and bias (the same dequantized values; one head of 32 columns from groups of 64).
Result<PackedWeight> shard_cols(const WeightView& w, int rank, int size, const char* name, int64_t unit = 0);

// Column-parallel shard of a stacked projection: w is parts.size() matrices stacked along rows
// (part i: parts[i] rows, e.g. {H*D, Hk*D, Hk*D} for q|k|v or {I, I} for gate|up). Each part is
// split on its own with shard_range(parts[i], unit, rank, size), and the result stacks the parts'
// slices in part order (a packed copy, as the slices are not contiguous in w). A part with fewer
// units than ranks is an error: replicating it (KV heads on layers with fewer KV heads than
// ranks) is the caller's choice.
Result<PackedWeight> shard_rows_stacked(const WeightView& w, const std::vector<int64_t>& parts, int rank,
                                        int size, const char* name, int64_t unit = 1);

}  // namespace g4
