// gemma4 greedy --model DIR --ids 2,105,... --steps N [--dtype f32|bf16] [--chunk N] [--decode-ahead on|off]
//               [--kv-bits N [--kv-group-size G] [--quantized-kv-start T]] [--image F1[,F2] --max-soft-tokens N]
// Greedy (argmax) continuation of a token sequence; prints the generated ids as a JSON list.
// Stops only after N steps (no stop tokens): a checking tool, not a chat.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "cli/common.h"
#include "cli/options.h"
#include "model/greedy_pipeline.h"

namespace g4::cli {
namespace {

int cmd_greedy(const std::vector<std::string>& argv) {
  VerbCli cli("greedy", "Greedy (argmax) continuation of a token sequence, as a JSON id list (no stop tokens).");
  add_load_options(cli);
  add_model_options(cli);
  add_image_options(cli);
  cli.value("--ids", "the token ids, comma-separated or a JSON list")->type_name("IDS")->required();
  cli.value("--steps", "tokens to generate", "16")->type_name("N")->check(CLI::Range(1, 1 << 24));
  cli.value("--dtype", "activation precision (default: bf16 for MLX / HF checkpoints, f32 for GGUF; on cuda bf16)")
      ->type_name("f32|bf16")->check(one_of({"f32", "bf16"}));
  cli.value("--chunk", "prompt chunk size in tokens", "512")->type_name("N")->check(CLI::Range(1, 1 << 24));
  add_decode_ahead_option(cli);
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  auto ids = parse_ids(a.get("--ids"));
  if (!ids) return fail("greedy", ids.message());
  const int steps = std::atoi(a.get("--steps").c_str());
  auto m = load_model_from_args(a, true);
  if (!m) return fail("greedy", m.message());
  Model& model = *m.value();
  auto P = parse_precision(a.get("--dtype"), model);
  if (!P) return fail("greedy", P.message());
  if (Status ks = apply_model_flags(a, model, P.value()); !ks) return fail("greedy", ks.message());
  const int V = model.config().vocab;
  const int L = int(ids->size());
  int chunk = std::atoi(a.get("--chunk").c_str());
  if (chunk <= 0) return fail("greedy", "--chunk must be positive");
  auto soft = image_features_from_args(a, model, ids.value());
  if (!soft) return fail("greedy", soft.message());
  std::vector<float> logits(static_cast<size_t>(V));
  auto cache = model.new_cache();
  for (int s = 0, n = 0; s < L; s += n) {
    n = image_block_chunk_end(model.config(), ids->data(), L, s + std::min(chunk, L - s)) - s;
    SeqInput in{cache.get(), ids->data() + s, n, false};
    in.soft = soft_at(soft.value(), *ids, s, model.config());
    model.forward({in}, P.value(), logits.data());
  }
  std::vector<int32_t> out;
  int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  out.push_back(next);
  if (a.get("--decode-ahead") == "on" && GreedyPipeline::usable(model) && steps > 1) {  // the host a step ahead (model/greedy_pipeline.h)
    GreedyPipeline pipe(model, {cache.get()}, P.value());
    pipe.start({next});
    for (int i = 1; i < steps; ++i) out.push_back(pipe.next(i + 1 < steps)[0]);
  } else {
    for (int i = 1; i < steps; ++i) out.push_back(next = greedy_step(model, *cache, next, P.value(), logits));
  }
  std::printf("[");
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? ", " : "", out[i]);
  std::printf("]\n");
  return 0;
}

}  // namespace
G4_COMMAND("greedy", "greedy continuation of token ids (JSON list on stdout)", cmd_greedy);
}  // namespace g4::cli
