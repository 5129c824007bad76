// gemma4 fit [-m PATH] [-c N] [--parallel P] [--backend cpu|cuda] [--kv-bits B] [--tensor-parallel N
//            [--devices LIST]] [--json]
// Does a model fit this machine? Weights (as stored), KV cache (from the model's geometry, as the
// engine allocates it) and scratch against the free host memory (cpu) or the free memory of CUDA
// device 0 (cuda; said so when there is none). Prints the numbers, yes or no, and the largest
// context that fits. Exit status: 0 fits, 1 does not fit (or the free memory cannot be known).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/memory_plan.h"
#include "cli/options.h"
#include "parallel/tp_model.h"

namespace g4::cli {
namespace {

int cmd_fit(const std::vector<std::string>& argv) {
  VerbCli cli("fit", "Does a model fit this machine? Weights, KV cache and scratch against the free RAM (cpu) or "
              "VRAM (cuda), and the largest context that fits.");
  cli.value("-m,--model", "model directory, .gguf file, or a directory holding one (default: the starter model)")
      ->type_name("PATH");
  add_context_option(cli, "", "context per sequence in tokens (default: the model's max_position_embeddings)");
  cli.value("--parallel", "sequences held at once (serve --parallel)", "1")->type_name("P")->check(CLI::Range(1, 256));
  cli.value("--backend", "where the model runs: cpu (host memory) or cuda (device 0's memory)", "cpu")
      ->type_name("NAME")->check(one_of({"cpu", "reference", "ggml", "cuda"}));
  cli.value("--kv-bits", "quantized KV cache of N bits (default: f32)")->type_name("N")->check(CLI::Range(2, 8));
  cli.value("--kv-group-size", "quantization group of the KV cache", "64")->type_name("G")
      ->check(one_of({"32", "64", "128"}));
  cli.value("--chunk", "prompt tokens per sequence per step (the engine's prefill chunk)", "256")->type_name("N")
      ->check(CLI::Range(1, 1 << 16));
  cli.value("--dtype", "the activations' storage (on cuda bf16 unless f32; host backends store f32)")
      ->type_name("f32|bf16")->check(one_of({"f32", "bf16"}));
  cli.value("--tensor-parallel", "plan one rank of a model split over N ranks (on cuda: the group's tightest GPU)", "1")
      ->type_name("N")->check(CLI::Range(1, 64));
  cli.value("--devices", "with --backend cuda: each rank's GPU, comma-separated (default: 0..N-1)")->type_name("LIST");
  cli.value("--cuda-device", "with --backend cuda and one rank: the GPU", "0")->type_name("N")->check(CLI::Range(0, 63));
  cli.flag("--json", "print the numbers as one JSON object");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  PlanInput in;
  in.context = a.has("--context") ? std::stoll(a.get("--context")) : 0;
  in.parallel = std::stoi(a.get("--parallel"));
  in.kv_bits = a.has("--kv-bits") ? std::stoi(a.get("--kv-bits")) : 0;
  in.kv_group = std::stoi(a.get("--kv-group-size"));
  in.chunk = std::stoi(a.get("--chunk"));
  in.kv_elem_bytes = a.get("--dtype") == "f32" ? 4 : 0;
  auto bo = backend_options_from_args(a);
  if (!bo) return fail("fit", bo.message());
  if (uses_tp_group(bo.value()))  // the group a load would make, refused as the load would refuse it
    if (auto group = plan_tp_group(a.get("--backend"), bo.value()); !group) return fail("fit", group.message());
  in.place(bo.value());
  auto rep = plan_fit(a.get("--model"), a.get("--backend"), in);
  if (!rep) return fail("fit", rep.message());
  const FitReport& r = rep.value();
  const MemoryNeed& n = r.need;
  if (a.has("--json")) {
    nlohmann::ordered_json j = {
        {"model", r.model}, {"backend", a.get("--backend")}, {"context", r.input.context},
        {"parallel", r.input.parallel}, {"kv_bits", r.input.kv_bits}, {"tensor_parallel", r.input.ranks},
        {"max_positions", r.config.max_positions},
        {"need_bytes", {{"weights", n.weights}, {"kv_cache", n.kv}, {"scratch", n.scratch},
                        {"runtime", n.runtime}, {"total", n.total()}}},
        {"free_bytes", r.free_known ? nlohmann::ordered_json(r.free.bytes) : nlohmann::ordered_json()},
        {"free_source", r.free_known ? r.free.source : r.free_error},
        {"fits", r.free_known ? nlohmann::ordered_json(r.fits()) : nlohmann::ordered_json()},
        {"largest_context", r.largest_context}};
    std::printf("%s\n", j.dump().c_str());
    return r.fits() ? 0 : 1;
  }
  std::printf("model:    %s (%d layers, %d positions)\n", r.model.c_str(), r.config.n_layers, r.config.max_positions);
  std::printf("plan:     %s, %d sequence%s of %lld tokens, %s KV cache\n", a.get("--backend").c_str(),
              r.input.parallel, r.input.parallel == 1 ? "" : "s", (long long)r.input.context,
              r.input.kv_bits ? (std::to_string(r.input.kv_bits) + "-bit").c_str()
              : r.on_gpu && r.input.kv_elem_bytes != 4 ? "bf16" : "f32");
  if (r.input.ranks > 1)
    std::printf("split:    %d ranks; %s\n", r.input.ranks,
                r.on_gpu ? "the numbers below are one rank's (rank 0, the largest) on each GPU"
                         : "the numbers below are the group's in this machine's memory (the checkpoint mapped once)");
  std::printf("weights:  %s\nKV cache: %s\nscratch:  %s\nruntime:  %s%s\ntotal:    %s\n", human_bytes(n.weights).c_str(),
              human_bytes(n.kv).c_str(), human_bytes(n.scratch).c_str(), human_bytes(n.runtime).c_str(),
              r.on_gpu ? " (with the CUDA context)" : "", human_bytes(n.total()).c_str());
  if (!r.free_known) {
    std::printf("free:     unknown: %s\nfits:     cannot tell\n", r.free_error.c_str());
    return 1;
  }
  std::printf("free:     %s (%s)\n", human_bytes(r.free.bytes).c_str(), r.free.source.c_str());
  std::printf("fits:     %s\n", r.fits() ? "yes" : "no");
  if (r.largest_context == 0)
    std::printf("largest context that fits: none (the weights alone need more than is free)\n");
  else
    std::printf("largest context that fits: %lld tokens%s\n", (long long)r.largest_context,
                r.largest_context == r.config.max_positions ? " (the model's maximum)" : "");
  return r.fits() ? 0 : 1;
}

}  // namespace
G4_COMMAND("fit", "does a model fit this machine (RAM / VRAM), and the largest context that does", cmd_fit);
}  // namespace g4::cli
