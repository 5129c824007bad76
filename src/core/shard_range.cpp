#include "core/shard_range.h"

namespace g4 {

Result<ShardRange> shard_range(int64_t n, int64_t unit, int rank, int size, const char* what) {
  if (size < 1) return err("%s: rank count %d is not positive", what, size);
  if (rank < 0 || rank >= size) return err("%s: rank %d is outside [0, %d)", what, rank, size);
  if (unit < 1) return err("%s: split unit %lld is not positive", what, (long long)unit);
  if (n % unit != 0)
    return err("%s: %lld is not a multiple of the split unit %lld", what, (long long)n, (long long)unit);
  const int64_t units = n / unit;
  if (units < size)
    return err("%s: %lld in units of %lld is %lld units, fewer than the %d ranks", what, (long long)n,
               (long long)unit, (long long)units, size);
  const int64_t base = units / size, extra = units % size;
  const int64_t first = rank * base + (rank < extra ? rank : extra);
  const int64_t count = base + (rank < extra ? 1 : 0);
  return ShardRange{first * unit, (first + count) * unit};
}

}  // namespace g4
