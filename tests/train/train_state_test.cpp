// The training state file (train/train_state.h): a saved state reads back equal, the state file
// beside an adapter file is named after it, and damaged files are refused naming the file.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "train/train_state.h"

namespace g4::train {
namespace {
namespace fs = std::filesystem;

TrainState sample() {
  TrainState s;
  s.iteration = 7;
  NumpyLegacyRng rng(3);
  rng.permutation(10);
  s.rng = rng.save();
  s.batches = {{2, 0, 1}, 1, true};
  s.opt_m = {{1.f, -2.f}, {}, {0.5f}};
  s.opt_v = {{3.f, 4.f}, {}, {0.25f}};
  s.grads = {{0.f, 1e-30f, -7.f}};
  s.losses = 1.25;
  s.train_time = 0.5;
  s.n_tokens = 11;
  s.trained_tokens = 99;
  s.steps = 2;
  s.fingerprint = {{"batch_size", 4}, {"optimizer", "adam"}};
  return s;
}

TEST(TrainState, RoundTripsEveryField) {
  const fs::path dir = fs::temp_directory_path() / "g4_train_state_test";
  fs::create_directories(dir);
  const std::string path = (dir / "training_state.bin").string();
  const TrainState s = sample();
  ASSERT_TRUE(save_train_state(path, s).is_ok());
  auto r = load_train_state(path);
  ASSERT_TRUE(r.is_ok()) << r.message();
  const TrainState& t = r.value();
  EXPECT_EQ(t.iteration, 7);
  EXPECT_EQ(t.rng, s.rng);
  EXPECT_EQ(t.batches.order, s.batches.order);
  EXPECT_EQ(t.batches.pos, 1u);
  EXPECT_TRUE(t.batches.started);
  EXPECT_EQ(t.opt_m, s.opt_m);
  EXPECT_EQ(t.opt_v, s.opt_v);
  EXPECT_EQ(t.grads, s.grads);
  EXPECT_EQ(t.losses, 1.25);
  EXPECT_EQ(t.n_tokens, 11);
  EXPECT_EQ(t.trained_tokens, 99);
  EXPECT_EQ(t.steps, 2);
  EXPECT_EQ(t.fingerprint, s.fingerprint);
  NumpyLegacyRng a(3), b(0);  // the generator continues where it was saved
  a.permutation(10);
  ASSERT_TRUE(b.load(t.rng));
  EXPECT_EQ(a.permutation(50), b.permutation(50));

  // Damaged files: cut short, another file, trailing bytes.
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto write = [&](const std::string& b) { std::ofstream(path, std::ios::binary | std::ios::trunc) << b; };
  write(bytes.substr(0, bytes.size() - 3));
  EXPECT_NE(load_train_state(path).message().find("cut short"), std::string::npos);
  write(bytes + "xx");
  EXPECT_NE(load_train_state(path).message().find("bytes past its arrays"), std::string::npos);
  write("not a state");
  EXPECT_EQ(load_train_state(path).message(), path + ": not a training state file");
  fs::remove_all(dir);
}

TEST(TrainState, SitsBesideItsAdapterFile) {
  EXPECT_EQ(train_state_path("out/0000100_adapters.safetensors"), "out/0000100_training_state.bin");
  EXPECT_EQ(train_state_path("out/adapters.safetensors"), "out/training_state.bin");
  EXPECT_EQ(train_state_path("mine.safetensors"), "training_state.bin");
}

}  // namespace
}  // namespace g4::train
