#include "backend/cuda/cuda_seq_tables.h"

#include "backend/cuda/cuda_backend_args.h"

namespace g4::cuda {

int batch_rows(const std::vector<AttnSeq>& seqs) {
  int rows = 0;
  for (const AttnSeq& sq : seqs) rows += sq.n;
  return rows;
}

SeqTable SeqTables::table(const std::vector<AttnSeq>& seqs) {
  const size_t head = (seqs.size() * sizeof(SeqKv) + 15) & ~size_t(15);
  std::vector<uint8_t> bytes(head + size_t(batch_rows(seqs)) * sizeof(int32_t), 0);
  SeqKv* e = reinterpret_cast<SeqKv*>(bytes.data());
  int32_t* row_seq = reinterpret_cast<int32_t*>(bytes.data() + head);
  int first = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttnSeq& sq = seqs[i];
    SeqKv& k = e[i];
    k.row0 = sq.row0;
    k.first = first;
    k.pos0 = sq.pos0;
    k.capacity = sq.kv.capacity;
    k.window = sq.kv.window;
    k.k = sq.kv.k.data;
    k.v = sq.kv.v.data;
    k.quant = cuda_args::quant_args(sq.kv);
    k.blocks = sq.blocks ? blocks(sq.blocks, sq.n) : nullptr;
    k.table = sq.kv.table;
    k.block_shift = cuda_args::block_shift(sq.kv);
    for (int t = 0; t < sq.n; ++t) row_seq[first + t] = int32_t(i);
    first += sq.n;
  }
  const uint8_t* dev = nullptr;
  if (rec_.active() && bytes == last_table_) {
    dev = last_table_dev_;
  } else if (const void* d = rec_.dyn_bytes(bytes.data(), bytes.size())) {
    dev = static_cast<const uint8_t*>(d);
    last_table_ = bytes;
    last_table_dev_ = dev;
  } else {  // outside a step: a copy freed once this step's work is done
    void* d2 = mem_.upload(bytes.data(), bytes.size());
    mem_.free(d2, /*deferred=*/true);
    dev = static_cast<const uint8_t*>(d2);
  }
  return SeqTable{reinterpret_cast<const SeqKv*>(dev), reinterpret_cast<const int32_t*>(dev + head)};
}

const int32_t* SeqTables::blocks(const int32_t* host, int n) {
  for (const auto& b : blocks_)
    if (b.first == host) return b.second;
  int32_t* d = static_cast<int32_t*>(mem_.alloc(size_t(n) * 2 * sizeof(int32_t)));
  upload_(host, size_t(n) * 2, d);
  blocks_.push_back({host, d});
  return d;
}

void SeqTables::end_step() {
  for (const auto& b : blocks_) mem_.free(b.second, /*deferred=*/true);
  blocks_.clear();
}

}  // namespace g4::cuda
