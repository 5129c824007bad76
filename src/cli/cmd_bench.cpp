// gemma4 bench --model DIR [--prompt-tokens 128] [--gen-tokens 64] [--threads N] [--dtype f32|bf16]
//              [--chunk N|auto] [--repeat 1] [--batch-invariant on|off] (on: the kernels serve runs)
//              [--kv-bits N [--kv-group-size G] [--quantized-kv-start T]]
//              [--batch N] (N sequences: each prefilled alone, then decoded together, one forward a step)
//              [--decode-ahead on|off] (on a device: each step queued before the previous token is read)
// Measures prefill tok/s, decode tok/s (greedy, no stop; with --batch, the tokens of all N sequences
// a second), time to first token from process start, peak memory and the KV caches' bytes at the end. Prints a human summary on stderr and one JSON
// line on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cli/common.h"
#include "cli/options.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "model/greedy_pipeline.h"

namespace g4::cli {
namespace {

const auto g_process_start = std::chrono::steady_clock::now();

int cmd_bench(const std::vector<std::string>& argv) {
  using clk = std::chrono::steady_clock;
  VerbCli cli("bench", "Measure prefill / decode tok/s, time to first token and peak memory; one JSON line on "
              "stdout.");
  add_load_options(cli);
  add_model_options(cli);
  cli.value("--prompt-tokens", "prompt length in tokens (at most the model's positions)", "128")->type_name("N")
      ->check(CLI::Range(1, 1 << 24));
  cli.value("--gen-tokens", "tokens to decode after the prompt", "64")->type_name("N")->check(CLI::Range(1, 1 << 24));
  cli.value("--chunk", "prefill chunk size in tokens; auto: what run and serve use on cuda (2048 without "
            "--batch-invariant on), else 512", "auto")
      ->type_name("N|auto")->check(CLI::IsMember({"auto"}) | CLI::Range(1, 1 << 24));
  cli.value("--repeat", "runs; the best of them is reported", "1")->type_name("N")->check(CLI::Range(1, 1000));
  cli.value("--batch", "sequences decoded together (each prefilled alone first)", "1")->type_name("N")
      ->check(CLI::Range(1, 1024));
  add_decode_ahead_option(cli);
  cli.value("--dtype", "activation precision (f32 default; on cuda: the storage dtype, bf16 default)")
      ->type_name("f32|bf16")->check(one_of({"f32", "bf16"}));
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  const int np = std::atoi(a.get("--prompt-tokens").c_str());
  const int ng = std::atoi(a.get("--gen-tokens").c_str());
  const int repeat = std::atoi(a.get("--repeat").c_str());
  const int nb = std::atoi(a.get("--batch").c_str());
  const bool decode_ahead = a.get("--decode-ahead") == "on";
  auto m = load_model_from_args(a);
  if (!m) return fail("bench", m.message());
  Model& model = *m.value();
  constexpr int kHostChunk = 512;
  const int chunk = a.get("--chunk") != "auto" ? std::atoi(a.get("--chunk").c_str()) : auto_prefill_chunk(a, kHostChunk);
  auto P = parse_precision(a.has("--dtype") ? a.get("--dtype") : "f32", model);  // the engine's precision
  if (!P) return fail("bench", P.message());
  if (Status ks = apply_model_flags(a, model, P.value()); !ks) return fail("bench", ks.message());
  if (const int maxpos = model.config().max_positions; maxpos > 0 && np + ng > maxpos)
    return fail("bench", "--prompt-tokens " + std::to_string(np) + " + --gen-tokens " + std::to_string(ng) +
                             ": the model holds at most " + std::to_string(maxpos) +
                             " positions (max_position_embeddings)");
  const int V = model.config().vocab;
  // A fixed pseudo-random prompt of ordinary token ids (no specials).
  std::vector<int32_t> prompt(static_cast<size_t>(np));
  uint32_t s = 12345;
  for (int i = 0; i < np; ++i) {
    s = s * 1664525u + 1013904223u;
    prompt[size_t(i)] = int32_t(1000 + (s >> 8) % uint32_t(std::max(1, V - 1000)));
  }
  prompt[0] = model.config().bos_id;
  std::vector<float> logits(static_cast<size_t>(V));
  double best_prefill = 0, best_decode = 0, ttft = 0;
  size_t kv_bytes = 0;
  for (int r = 0; r < repeat; ++r) {
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<int32_t> next(static_cast<size_t>(nb), 0);
    double prefill_s = 0;
    for (int b = 0; b < nb; ++b) {  // sequence b's prompt: the bench prompt with its second token moved by b
      caches.push_back(model.new_cache());
      std::vector<int32_t> pb = prompt;
      if (np > 1) pb[1] = int32_t(1000 + (pb[1] - 1000 + b) % std::max(1, V - 1000));
      auto t0 = clk::now();
      ProgressTask progress("bench prefill", uint64_t(np), ProgressUnit::Tokens, uint64_t(chunk) + 1);
      for (int i = 0; i < np; i += chunk) {
        const int n = std::min(chunk, np - i);
        model.forward({SeqInput{caches.back().get(), pb.data() + i, n, false}}, P.value(), logits.data());
        progress.add(uint64_t(n));
      }
      const auto t1 = clk::now();
      prefill_s += std::chrono::duration<double>(t1 - t0).count();
      if (r == 0 && b == 0) ttft = std::chrono::duration<double>(t1 - g_process_start).count();
      next[size_t(b)] = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    const auto t1 = clk::now();
    ProgressTask progress("bench decode", uint64_t(ng) * uint64_t(nb), ProgressUnit::Tokens, 256);
    if (decode_ahead && GreedyPipeline::usable(model)) {  // greedy, the host a step ahead of the device
      std::vector<KvCache*> cs;
      for (auto& c : caches) cs.push_back(c.get());
      GreedyPipeline pipe(model, cs, P.value());
      pipe.start(next);
      for (int i = 0; i < ng; ++i) {
        next = pipe.next(i + 1 < ng);
        progress.add(uint64_t(nb));
      }
    } else {
      for (int i = 0; i < ng; ++i) {
        if (nb == 1) {  // greedy, as generation picks tokens (greedy_step: the argmax on the device where there is one)
          next[0] = greedy_step(model, *caches[0], next[0], P.value(), logits);
        } else {  // one forward over every sequence's next token, the argmax where the logits are
          std::vector<SeqInput> batch;
          std::vector<int32_t> in = next;
          for (int b = 0; b < nb; ++b) batch.push_back(SeqInput{caches[size_t(b)].get(), &in[size_t(b)], 1, false});
          model.forward(batch, P.value(), nullptr, next.data());
        }
        progress.add(uint64_t(nb));
      }
    }
    const auto t2 = clk::now();
    best_prefill = std::max(best_prefill, double(np) * nb / prefill_s);
    best_decode = std::max(best_decode, double(ng) * nb / std::chrono::duration<double>(t2 - t1).count());
    kv_bytes = 0;
    for (const auto& c : caches) kv_bytes += c->bytes();
  }
  std::fprintf(stderr, "prefill %.1f tok/s, decode %.1f tok/s, ttft %.3f s, peak %.0f MiB, KV cache %.1f MiB (%d threads)\n",
               best_prefill, best_decode, ttft, peak_rss_mib(), double(kv_bytes) / (1 << 20), num_threads());
  std::printf("{\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, \"ttft_s\": %.4f, \"peak_rss_mb\": %.1f, "
              "\"threads\": %d, \"prompt_tokens\": %d, \"gen_tokens\": %d, \"batch\": %d, \"kv_bytes\": %zu, "
              "\"activations\": \"%s\", \"prefill_blas\": %s}\n",
              best_prefill, best_decode, ttft, peak_rss_mib(), num_threads(), np, ng, nb, kv_bytes,
              std::string(dtype_name(model.backend().activation_dtype())).c_str(),
              cuda_prefill_on_blas(model.backend()) ? "true" : "false");
  return 0;
}

}  // namespace
G4_COMMAND("bench", "measure prefill/decode tok/s and peak memory", cmd_bench);
}  // namespace g4::cli
