#include "parallel/inproc_communicator.h"

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>

#include "core/status.h"

namespace g4 {
namespace {

enum class Op : uint8_t { AllReduceSum, AllGather, Barrier };

const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduceSum: return "all_reduce_sum";
    case Op::AllGather: return "all_gather";
    case Op::Barrier: return "barrier";
  }
  return "?";
}

// What one rank posted for the collective in progress.
struct Slot {
  Op op = Op::Barrier;
  size_t count = 0;
  DType dtype = DType::F32;
  const void* send = nullptr;  // all_reduce_sum: the rank's data; all_gather: its send buffer
};

std::string describe(const Slot& s) {
  if (s.op == Op::Barrier) return "barrier()";
  return std::string(op_name(s.op)) + "(count " + std::to_string(s.count) + ", " +
         std::string(dtype_name(s.dtype)) + ")";
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "inproc communicator: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

// out[i] = in[0][i] + in[1][i] + ... (rank order) for i in [b, e), summed in f32; T's values are
// widened with load, the sum narrowed with store once.
template <class T, class Load, class Store>
void reduce_range(const std::vector<Slot>& slots, size_t b, size_t e, void* out, Load load,
                  Store store) {
  T* o = static_cast<T*>(out);
  for (size_t i = b; i < e; ++i) {
    float acc = load(static_cast<const T*>(slots[0].send)[i]);
    for (size_t r = 1; r < slots.size(); ++r) acc += load(static_cast<const T*>(slots[r].send)[i]);
    o[i] = store(acc);
  }
}

class Group {
 public:
  Group(int n, std::chrono::milliseconds limit) : n_(n), limit_(limit), slots_(size_t(n)) {}
  int size() const { return n_; }

  // Posts this rank's slot and blocks until every rank has posted its own for the same step.
  // The last rank to arrive checks that the slots agree and runs on_last, both under the lock.
  void post_and_wait(int rank, uint64_t seq, const Slot& slot, const std::function<void()>& on_last) {
    std::unique_lock<std::mutex> lk(mu_);
    slots_[size_t(rank)] = slot;
    meet(lk, rank, seq, slot, [&] {
      check_same_call(seq);
      if (on_last) on_last();
    });
  }
  // Blocks until every rank has reached this second meeting of the collective (slot: for messages).
  void wait(int rank, uint64_t seq, const Slot& slot) {
    std::unique_lock<std::mutex> lk(mu_);
    meet(lk, rank, seq, slot, [] {});
  }

  const std::vector<Slot>& slots() const { return slots_; }  // stable between the two barriers
  void* scratch() { return scratch_.data(); }
  void resize_scratch(size_t bytes) { scratch_.resize(bytes); }

 private:
  template <class F>
  void meet(std::unique_lock<std::mutex>& lk, int rank, uint64_t seq, const Slot& slot, F on_last) {
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      on_last();
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lk, limit_, [&] { return generation_ != gen; })) {
      die("rank " + std::to_string(rank) + " of " + std::to_string(n_) + " waited more than " +
          std::to_string(limit_.count()) + " ms in " + describe(slot) + " (collective #" +
          std::to_string(seq) + "): " + std::to_string(arrived_) + " of " + std::to_string(n_) +
          " ranks arrived; every rank must call the same collectives in the same order");
    }
  }
  void check_same_call(uint64_t seq) const {
    for (int r = 1; r < n_; ++r) {
      const Slot &a = slots_[0], &b = slots_[size_t(r)];
      if (a.op != b.op || a.count != b.count || a.dtype != b.dtype)
        die("collective #" + std::to_string(seq) + " differs between ranks: rank 0 called " +
            describe(a) + ", rank " + std::to_string(r) + " called " + describe(b));
    }
  }

  const int n_;
  const std::chrono::milliseconds limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint8_t> scratch_;  // all_reduce_sum's result, count elements of its dtype
};

class InprocCommunicator : public Communicator {
 public:
  InprocCommunicator(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }

  void all_reduce_sum(void* data, size_t count, DType dtype) override {
    if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
      die("all_reduce_sum: dtype " + std::string(dtype_name(dtype)) + " is not f32, bf16 or f16");
    const size_t bytes = count * dtype_size(dtype);
    const uint64_t seq = seq_++;
    const Slot mine{Op::AllReduceSum, count, dtype, data};
    g_->post_and_wait(rank_, seq, mine, [&] { g_->resize_scratch(bytes); });
    const size_t n = size_t(size()), b = count * size_t(rank_) / n, e = count * size_t(rank_ + 1) / n;
    const auto& s = g_->slots();
    void* out = g_->scratch();
    switch (dtype) {
      case DType::F32:
        reduce_range<float>(s, b, e, out, [](float v) { return v; }, [](float v) { return v; });
        break;
      case DType::BF16:
        reduce_range<uint16_t>(s, b, e, out, bf16_to_f32, f32_to_bf16);
        break;
      default:
        reduce_range<uint16_t>(s, b, e, out, f16_to_f32, f32_to_f16);
        break;
    }
    g_->wait(rank_, seq, mine);
    // The scratch is rewritten only once every rank has reached the next collective.
    if (bytes) std::memcpy(data, g_->scratch(), bytes);
  }

  void all_gather(const void* send, size_t count, DType dtype, void* recv) override {
    const size_t es = dtype_size(dtype);
    if (es == 0) die("all_gather: dtype " + std::string(dtype_name(dtype)) + " has no element size");
    const size_t bytes = count * es;
    const uint64_t seq = seq_++;
    const Slot mine{Op::AllGather, count, dtype, send};
    g_->post_and_wait(rank_, seq, mine, nullptr);
    uint8_t* out = static_cast<uint8_t*>(recv);
    const auto& s = g_->slots();
    for (int r = 0; r < size(); ++r) {
      uint8_t* dst = out + size_t(r) * bytes;
      if (bytes && dst != s[size_t(r)].send) std::memcpy(dst, s[size_t(r)].send, bytes);
    }
    // No rank returns (and may reuse its send buffer) before every rank has copied from it.
    g_->wait(rank_, seq, mine);
  }

  void barrier() override { g_->post_and_wait(rank_, seq_++, Slot{}, nullptr); }

 private:
  std::shared_ptr<Group> g_;
  int rank_;
  uint64_t seq_ = 0;  // collectives this rank has called
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_inproc_group(int n, std::chrono::milliseconds wait_limit) {
  G4_CHECK(n >= 1);
  auto g = std::make_shared<Group>(n, wait_limit);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<InprocCommunicator>(g, r));
  return out;
}

}  // namespace g4
