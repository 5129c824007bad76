// Shared by the model tests: where the generated mlx-lm fixtures are.
#pragma once
#include <cstdlib>
#include <filesystem>

namespace g4::test {

// tests/fixtures/generated (made by `make fixtures`), or G4_FIXTURE_DIR (a copy elsewhere, as on the
// GPU machine).
inline std::filesystem::path fixture_root() {
  const char* env = std::getenv("G4_FIXTURE_DIR");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path(G4_SOURCE_DIR) / "tests/fixtures/generated";
}

}  // namespace g4::test
