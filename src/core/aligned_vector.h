// std::vector storage aligned to 64 bytes (a cache line, the widest SIMD load). Loops whose
// vectorized form depends on where an array starts (the compiler peels unaligned heads) then sum
// in the same order wherever the heap put the array, so results do not depend on what ran before.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace g4 {

template <class T>
struct Aligned64Allocator {
  using value_type = T;
  Aligned64Allocator() = default;
  template <class U>
  Aligned64Allocator(const Aligned64Allocator<U>&) {}  // NOLINT
  T* allocate(size_t n) {
    const size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
    void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const Aligned64Allocator<U>&) const { return true; }
};

template <class T>
using AlignedVector = std::vector<T, Aligned64Allocator<T>>;

}  // namespace g4
