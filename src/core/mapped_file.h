// Read-only view of a whole weight file. Weights are views into these bytes.
//
// Residency (set_weight_residency, process-wide, before files are opened):
//   Mmap    the file is memory-mapped; opening never reads all of its bytes into RAM, and the
//           page cache can drop pages under memory pressure. Right for files near RAM size.
//   Copy    the bytes are read into anonymous memory backed by 2 MiB transparent huge pages.
//           Decode streams every weight once per token; with 4 KiB file pages the TLB misses
//           cost the starter model ~15 % of its decode speed on this class of machine. Costs a
//           read of the file at open (~0.1 s for 240 MB from the page cache).
//   Auto    Copy for files up to kAutoCopyMaxBytes that also fit in a quarter of the memory
//           available now; Mmap otherwise. The default. The copy costs ~1.3 s per GiB before the
//           first token (zeroing huge pages, then the read); on a 2.6 GiB Gemma 4 E2B Q4_K_M file
//           it made time to first token 4.8 s against 1.3 s mapped, for no measurable decode
//           gain (software prefetch hides most TLB misses of the big matrices), so only files up
//           to 1 GiB are copied.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"

namespace g4 {

enum class WeightResidency { Auto, Mmap, Copy };
constexpr uint64_t kAutoCopyMaxBytes = uint64_t(1) << 30;

void set_weight_residency(WeightResidency r);
WeightResidency weight_residency();
// "auto" | "mmap" | "copy"; nullopt for anything else.
std::optional<WeightResidency> parse_weight_residency(const std::string& s);

class MappedFile {
 public:
  // Opens `path` read-only under the process's residency setting. Errors name the path and the
  // system reason.
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool copied() const { return copied_; }  // true when the bytes live in anonymous memory

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* region_ = nullptr;  // the mapping to munmap (the copy's region is larger than size_)
  size_t region_size_ = 0;
  bool copied_ = false;
  std::string path_;
};

}  // namespace g4
