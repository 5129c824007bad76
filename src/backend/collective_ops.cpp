// The defaults of the tensor-parallel ops of backend.h (all_reduce, all_gather, place_cols): the
// group's blocking collectives on host memory, or on host copies of device buffers when a host
// group serves ranks whose buffers are device memory (ranks sharing one GPU, for checks).
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "parallel/communicator.h"

namespace g4 {

void Backend::all_reduce(Communicator& c, const Buf& y, size_t n) {
  G4_CHECK(!c.on_device() && "Backend::all_reduce: a device group needs a device backend's own all_reduce");
  if (!on_device()) {
    sync();  // the collective reads what the backend wrote
    return c.all_reduce_sum(y.data, n, y.dtype);
  }
  std::vector<uint8_t> h(n * dtype_size(y.dtype));
  read_bytes(y, h.size(), h.data());  // waits for the writes before it
  c.all_reduce_sum(h.data(), n, y.dtype);
  write_bytes(h.data(), h.size(), y);
}

void Backend::all_gather(Communicator& c, const Buf& send, size_t n, const Buf& recv) {
  G4_CHECK(!c.on_device() && "Backend::all_gather: a device group needs a device backend's own all_gather");
  if (!on_device()) {
    sync();
    return c.all_gather(send.data, n, send.dtype, recv.data);
  }
  const size_t bytes = n * dtype_size(send.dtype);
  std::vector<uint8_t> mine(bytes), all(bytes * size_t(c.size()));
  read_bytes(send, bytes, mine.data());
  c.all_gather(mine.data(), n, send.dtype, all.data());
  write_bytes(all.data(), all.size(), recv);
}

void Backend::place_cols(const Buf& src, int rows, int n, const Buf& dst, int dst_dim, int off) {
  G4_CHECK(src.dtype == dst.dtype && off >= 0 && off + n <= dst_dim && "Backend::place_cols: shapes or dtypes");
  const size_t es = dtype_size(src.dtype), row = size_t(n) * es, drow = size_t(dst_dim) * es;
  if (rows <= 0 || n <= 0) return;
  if (!on_device()) {
    for (int r = 0; r < rows; ++r)
      std::memcpy(dst.as<uint8_t>() + size_t(r) * drow + size_t(off) * es, src.as<uint8_t>() + size_t(r) * row, row);
    return;
  }
  std::vector<uint8_t> s(row * size_t(rows)), d(drow * size_t(rows));
  read_bytes(src, s.size(), s.data());
  read_bytes(dst, d.size(), d.data());
  for (int r = 0; r < rows; ++r)
    std::memcpy(d.data() + size_t(r) * drow + size_t(off) * es, s.data() + size_t(r) * row, row);
  write_bytes(d.data(), d.size(), dst);
}

}  // namespace g4
