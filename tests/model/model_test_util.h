// Shared by the model tests: where the generated mlx-lm fixtures are.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "model/model.h"

namespace g4::test {

// tests/fixtures/generated (made by `make fixtures`), or G4_FIXTURE_DIR (a copy elsewhere, as on the
// GPU machine).
inline std::filesystem::path fixture_root() {
  const char* env = std::getenv("G4_FIXTURE_DIR");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path(G4_SOURCE_DIR) / "tests/fixtures/generated";
}

// The fixture `name` loaded on `backend`, or null: with *skip saying why where the test should
// skip (the fixture was not generated; cuda without a device), else after a test failure.
inline std::unique_ptr<Model> fixture_model(const std::string& name, const std::string& backend, std::string* skip) {
  const std::filesystem::path dir = fixture_root() / name;
  if (!std::filesystem::exists(dir / "config.json")) {
    *skip = dir.string() + " missing (make fixtures)";
    return nullptr;
  }
  auto mr = load_model(dir.string(), backend);
  if (!mr && backend == "cuda") *skip = "no CUDA device: " + mr.message();
  else if (!mr) ADD_FAILURE() << mr.message();
  return mr ? std::move(mr.value()) : nullptr;
}

}  // namespace g4::test
