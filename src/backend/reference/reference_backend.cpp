// The reference backend: HostBackend's scalar ops, single-threaded. Slow and obviously correct;
// every fast backend is tested against it.
#include "backend/host_backend.h"

namespace g4 {
namespace {
class ReferenceBackend final : public HostBackend {
 public:
  std::string name() const override { return "reference"; }
};
}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace g4
