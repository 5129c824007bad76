// gemma4 logits --model DIR --ids 2,105,... --out FILE.npy [--dtype f32|bf16] [--chunk N]
// Scores a token sequence: float32 logits [L, V] for every position, written as .npy.
// --chunk N runs the prompt as consecutive chunks of N tokens (1 = token-by-token decode).
// --kv-bits N [--kv-group-size G] [--quantized-kv-start T]: quantized KV cache (cli/common.h).
// --image F1[,F2...] [--max-soft-tokens N]: image features for the ids' image tokens, in order (the
// ids already hold boi + soft × image + eoi per image; `gemma4 vision` prints the soft count).
// --tap-dir DIR writes every named intermediate (embed, attn_residual.L, layer_out.L) of the
// first chunk as DIR/<name>[.<layer>].npy, for layer-by-layer comparison with a reference dump.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "cli/common.h"
#include "cli/options.h"

namespace g4::cli {
namespace {

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
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  auto ids = parse_ids(a.get("--ids"));
  if (!ids) return fail("logits", ids.message());
  const std::string out = a.get("--out");
  if (out.empty()) return fail("logits", "--out FILE.npy is required");
  auto m = load_model_from_args(a, true);
  if (!m) return fail("logits", m.message());
  Model& model = *m.value();
  auto P = parse_precision(a.get("--dtype"), model);
  if (!P) return fail("logits", P.message());
  if (Status ks = apply_model_flags(a, model, P.value()); !ks) return fail("logits", ks.message());
  const int V = model.config().vocab;
  for (int32_t id : ids.value())
    if (id >= V) return fail("logits", "token id " + std::to_string(id) + " is outside the vocabulary");
  const int L = int(ids->size());
  int chunk = a.has("--chunk") ? std::atoi(a.get("--chunk").c_str()) : L;
  if (chunk <= 0) return fail("logits", "--chunk must be positive");
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
  auto cache = model.new_cache();
  for (int s = 0, n = 0; s < L; s += n) {
    n = image_block_chunk_end(model.config(), ids->data(), L, s + std::min(chunk, L - s)) - s;
    SeqInput in{cache.get(), ids->data() + s, n, true};
    in.soft = soft_at(soft.value(), *ids, s, model.config());
    model.forward({in}, P.value(), logits.data() + size_t(s) * V);
  }
  Status st = write_npy(out, logits.data(), size_t(L), size_t(V));
  if (!st) return fail("logits", st.message());
  return 0;
}

}  // namespace
G4_COMMAND("logits", "score token ids: float32 logits [L, V] as .npy", cmd_logits);
}  // namespace g4::cli
