// How one dimension is split over the ranks of a tensor-parallel group: into whole units (a row,
// a head, a format's block), contiguous and in rank order; with u units over n ranks every rank
// gets u / n units and the first u % n ranks one unit more. In core/ because the model (the
// vocabulary shards of its logits) and parallel/ (weight shards) both split by it.
#pragma once
#include <cstdint>

#include "core/status.h"

namespace g4 {

// A contiguous range [begin, end) of a split dimension.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Rank `rank`'s range of a dimension of n elements split over `size` ranks in whole units of `unit`
// elements (the rule above). `what` names the dimension in errors ("ffn_down [64, 512] q4_k
// columns"). Errors: size < 1, rank outside [0, size), unit < 1, n not a multiple of unit, fewer
// units than ranks.
Result<ShardRange> shard_range(int64_t n, int64_t unit, int rank, int size, const char* what);

}  // namespace g4
