#include "core/mapped_file.h"
#include "core/progress.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace g4 {
namespace {

std::atomic<WeightResidency> g_residency{WeightResidency::Auto};
constexpr size_t kHugePage = size_t(2) << 20;

// MemAvailable from /proc/meminfo in bytes; 0 when unknown.
uint64_t mem_available() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

bool should_copy(size_t size) {
  switch (g_residency.load()) {
    case WeightResidency::Mmap: return false;
    case WeightResidency::Copy: return true;
    case WeightResidency::Auto: break;
  }
  return size <= kAutoCopyMaxBytes && size <= mem_available() / 4;
}

// Copies smaller than this finish before a progress bar would help.
constexpr size_t kProgressMinBytes = size_t(64) << 20;

// Reads [0, size) of fd into dst with pread, in 2 MiB pieces shared by up to 4 threads (the
// page faults that zero the huge pages are the cost, and they scale with threads).
Status read_all(int fd, uint8_t* dst, size_t size, const std::string& path) {
  const size_t pieces = (size + kHugePage - 1) / kHugePage;
  const unsigned nthreads = std::max(1u, std::min({4u, std::thread::hardware_concurrency(), unsigned(pieces)}));
  std::atomic<size_t> next{0};
  std::atomic<int> failure{0};  // errno of the first failed read, or -1 for a short file
  ProgressTask progress("reading " + path.substr(path.find_last_of('/') + 1), size, ProgressUnit::Bytes,
                        kProgressMinBytes);
  auto worker = [&] {
    for (size_t i; failure.load() == 0 && (i = next.fetch_add(1)) < pieces;) {
      size_t off = i * kHugePage, end = std::min(size, off + kHugePage);
      while (off < end) {
        ssize_t n = ::pread(fd, dst + off, end - off, off_t(off));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          int expected = 0;
          failure.compare_exchange_strong(expected, n < 0 ? errno : -1);
          return;
        }
        off += size_t(n);
        progress.add(uint64_t(n));
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < nthreads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  if (int e = failure.load(); e != 0)
    return e > 0 ? err("%s: cannot read: %s", path.c_str(), std::strerror(e))
                 : err("%s: file shrank while being read", path.c_str());
  return Status::ok();
}

}  // namespace

void set_weight_residency(WeightResidency r) { g_residency.store(r); }
WeightResidency weight_residency() { return g_residency.load(); }

std::optional<WeightResidency> parse_weight_residency(const std::string& s) {
  if (s == "auto") return WeightResidency::Auto;
  if (s == "mmap") return WeightResidency::Mmap;
  if (s == "copy") return WeightResidency::Copy;
  return std::nullopt;
}

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return err("%s: cannot open: %s", path.c_str(), std::strerror(errno));
  struct CloseFd {
    int fd;
    ~CloseFd() { ::close(fd); }
  } close_fd{fd};  // the bytes are copied or mapped before open() returns
  struct stat st {};
  if (::fstat(fd, &st) != 0) return err("%s: cannot stat: %s", path.c_str(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return err("%s: not a regular file", path.c_str());
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = size_t(st.st_size);
  if (f->size_ == 0) return f;
  if (should_copy(f->size_)) {
    // One extra huge page of slack so the data can start on a 2 MiB boundary.
    const size_t len = (f->size_ + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      auto* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~uintptr_t(kHugePage - 1));
      ::madvise(aligned, len - size_t(aligned - static_cast<uint8_t*>(p)), MADV_HUGEPAGE);  // a hint
      f->region_ = p;
      f->region_size_ = len;
      G4_TRY(read_all(fd, aligned, f->size_, path));  // on failure f's destructor unmaps the region
      ::mprotect(p, len, PROT_READ);
      f->data_ = aligned;
      f->copied_ = true;
      return f;
    }
    // No memory for a copy: fall through to the mapping.
  }
  void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return err("%s: cannot mmap: %s", path.c_str(), std::strerror(errno));
  f->region_ = p;
  f->region_size_ = f->size_;
  f->data_ = static_cast<const uint8_t*>(p);
  return f;
}

MappedFile::~MappedFile() {
  if (region_) ::munmap(region_, region_size_);
}

}  // namespace g4
