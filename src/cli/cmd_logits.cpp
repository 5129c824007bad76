// gemma4 logits --model DIR --ids 2,105,... --out FILE.npy [--dtype f32|bf16] [--chunk N]
// Scores a token sequence: float32 logits [L, V] for every position, written as .npy.
// --chunk N runs the prompt as consecutive chunks of N tokens (1 = token-by-token decode).
// --kv-bits N [--kv-group-size G] [--quantized-kv-start T]: quantized KV cache (cli/common.h).
// --image F1[,F2...] [--max-soft-tokens N]: image features for the ids' image tokens, in order (the
// ids already hold boi + soft × image + eoi per image; `gemma4 vision` prints the soft count).
// --tap-dir DIR writes every named intermediate (embed, attn_residual.L, layer_out.L) of the
// first chunk as DIR/<name>[.<layer>].npy, for layer-by-layer comparison with a reference dump.
// --tensor-parallel N splits the model over N ranks, a thread each (parallel/tp_model.h; cpu and
// reference backends): the same logits within float rounding, the check of the sharded forward.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "cli/common.h"
#include "cli/options.h"
#include "io/model_dir.h"
#include "parallel/tp_model.h"

namespace g4::cli {
namespace {

// The prompt's logits [L, V] through `model`'s forward in chunks of `chunk` tokens (whole image
// blocks kept together).
void score_chunks(Model& model, const std::vector<int32_t>& ids, const std::vector<float>& soft, int chunk,
                  ActPrecision P, float* logits) {
  const int L = int(ids.size()), V = model.config().vocab;
  auto cache = model.new_cache();
  for (int s = 0, n = 0; s < L; s += n) {
    n = image_block_chunk_end(model.config(), ids.data(), L, s + std::min(chunk, L - s)) - s;
    SeqInput in{cache.get(), ids.data() + s, n, true};
    in.soft = soft_at(soft, ids, s, model.config());
    model.forward({in}, P, logits + size_t(s) * V);
  }
}

// --tensor-parallel N: every rank scores the prompt; rank 0's logits are returned.
Result<std::vector<float>> score_tensor_parallel(const Args& a, const std::vector<int32_t>& ids, int chunk, int ranks) {
  for (const char* f : {"--adapter-path", "--draft-model", "--trace-experts", "--tap-dir", "--image"})
    if (a.has(f)) return err("--tensor-parallel does not take %s yet", f);
  G4_TRY(apply_process_flags(a));
  G4_ASSIGN_OR_RETURN(std::string path, resolve_model_path(a.get("--model")));
  G4_ASSIGN_OR_RETURN(OpenedModel om, open_model(path));
  const std::string backend = a.has("--backend") ? a.get("--backend") : "cpu";
  G4_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelGroup> g, TensorParallelGroup::open(om, backend, ranks));
  G4_ASSIGN_OR_RETURN(ActPrecision P, parse_precision(a.get("--dtype"), g->rank(0)));
  for (int r = 0; r < g->size(); ++r) G4_TRY(apply_model_flags(a, g->rank(r), P));
  const int V = om.config.vocab;
  for (int32_t id : ids)
    if (id >= V) return err("token id %d is outside the vocabulary", id);
  std::vector<std::vector<float>> out(static_cast<size_t>(g->size()));
  g->run([&](int r, Model& m) {
    out[size_t(r)].resize(ids.size() * size_t(V));
    score_chunks(m, ids, {}, chunk, P, out[size_t(r)].data());
  });
  return std::move(out[0]);
}

int cmd_logits(const std::vector<std::string>& argv) {
  VerbCli cli("logits", "Score a token sequence: float32 logits [L, V] for every position, as .npy.");
  add_load_options(cli);
  add_model_options(cli);
  add_image_options(cli);
  cli.value("--ids", "the token ids, comma-separated or a JSON list")->type_name("IDS")->required();
  cli.value("--out", "the .npy file to write")->type_name("F.npy")->required();
  cli.value("--dtype", "activation precision (default: bf16 for MLX / HF checkpoints, f32 for GGUF; on cuda bf16)")
      ->type_name("f32|bf16")->check(one_of({"f32", "bf16"}));
  cli.value("--chunk", "run the prompt in chunks of N tokens; 1: token by token (default: all at once)")
      ->type_name("N")->check(CLI::Range(1, 1 << 24));
  cli.value("--tap-dir", "write every named intermediate of the first chunk as DIR/NAME.npy")->type_name("DIR");
  cli.value("--tensor-parallel", "split the model over N ranks, a thread each (cpu and reference backends)", "1")
      ->type_name("N")->check(CLI::Range(1, 64));
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  auto ids = parse_ids(a.get("--ids"));
  if (!ids) return fail("logits", ids.message());
  const std::string out = a.get("--out");
  if (out.empty()) return fail("logits", "--out FILE.npy is required");
  const int L = int(ids->size());
  int chunk = a.has("--chunk") ? std::atoi(a.get("--chunk").c_str()) : L;
  if (chunk <= 0) return fail("logits", "--chunk must be positive");
  if (const int tp = a.has("--tensor-parallel") ? std::atoi(a.get("--tensor-parallel").c_str()) : 1; tp > 1) {
    auto logits = score_tensor_parallel(a, ids.value(), chunk, tp);
    if (!logits) return fail("logits", logits.message());
    Status st = write_npy(out, logits->data(), size_t(L), logits->size() / size_t(L));
    return st ? 0 : fail("logits", st.message());
  }
  auto m = load_model_from_args(a, true);
  if (!m) return fail("logits", m.message());
  Model& model = *m.value();
  auto P = parse_precision(a.get("--dtype"), model);
  if (!P) return fail("logits", P.message());
  if (Status ks = apply_model_flags(a, model, P.value()); !ks) return fail("logits", ks.message());
  const int V = model.config().vocab;
  for (int32_t id : ids.value())
    if (id >= V) return fail("logits", "token id " + std::to_string(id) + " is outside the vocabulary");
  std::vector<float> logits(size_t(L) * V);
  const std::string tap_dir = a.get("--tap-dir");
  if (!tap_dir.empty()) {
    model.set_tap([tap_dir](const char* name, int layer, const float* data, size_t n) {
      std::string f = tap_dir + "/" + name + (layer >= 0 ? "." + std::to_string(layer) : "") + ".npy";
      (void)write_npy(f, data, 1, n);
    });
  }
  auto soft = image_features_from_args(a, model, ids.value());
  if (!soft) return fail("logits", soft.message());
  score_chunks(model, ids.value(), soft.value(), chunk, P.value(), logits.data());
  Status st = write_npy(out, logits.data(), size_t(L), size_t(V));
  if (!st) return fail("logits", st.message());
  return 0;
}

}  // namespace
G4_COMMAND("logits", "score token ids: float32 logits [L, V] as .npy", cmd_logits);
}  // namespace g4::cli
