// gemma4 lora: LoRA fine-tuning, `mlx_lm.lora --train` on this runtime (train/trainer.h).
//
//   gemma4 lora --data DIR [--model M] [--adapter-path adapters] [--iters 1000] [--batch-size 4]
//     [--learning-rate 1e-5] [--optimizer adam|adamw|sgd] [--num-layers 16] [--rank 8] [--scale 20]
//     [--dropout 0] [--mask-prompt] [--max-seq-length 2048] [--grad-accumulation-steps 1]
//     [--steps-per-report 10] [--steps-per-eval 200] [--val-batches 25] [--save-every 100]
//     [--resume-adapter-file F] [--resume | --overwrite] [--seed 0] [--test [--test-batches 500]] [--chat-template F]
//     [--log-file F.jsonl] [--enable-thinking on|off] [--threads N] [--backend cpu|reference|cuda]
//
// mlx-lm's flags and defaults. DIR holds train.jsonl (and valid.jsonl, test.jsonl) in mlx-lm's
// formats (train/dataset.h; chat records rendered with enable_thinking as mlx-lm sets it unless
// --enable-thinking says otherwise). Writes DIR_OUT/adapter_config.json (as mlx-lm does: the run's
// settings, read back by --adapter-path here and by mlx-lm's load_adapters) and
// adapters.safetensors. Reports go to stdout in mlx-lm's wording; --log-file also writes each
// as a JSON line. An existing adapter in --adapter-path is refused unless --resume (continue
// training it) or --overwrite (replace it) is given (train/adapter_dir.h).
// Every save also writes the run's training state (train/train_state.h): resuming from an adapter
// file that has one (--resume-adapter-file DIR/NNNNNNN_adapters.safetensors, or --resume) continues
// that run exactly, bit for bit, when it stopped before --iters; a finished run's, or one without a
// state, trains again from the weights with the optimizer afresh, as mlx-lm does. Ctrl-C
// stops after the iteration under way, saving the adapter and its state (exit status 130); a
// second Ctrl-C quits at once.
// --backend cuda trains on the GPU (--cuda-device): the forward, the backward, the head and the loss
// in f32 kernels on the device (backend/grad_arith.h), the products on cuBLAS, with bf16 operands
// under --dtype bf16; the memory check before the run counts the model's weights and the batch
// against the device's free memory.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/lora_options.h"
#include "cli/memory_plan.h"
#include "cli/progress_bar.h"
#include "core/progress.h"
#include "core/atomic_file.h"
#include "core/thread_pool.h"
#include "runtime/bundle.h"
#include "train/adapter_dir.h"
#include "train/train_memory.h"
#include "train/trainer.h"

namespace g4::cli {
namespace {
namespace fs = std::filesystem;
using train::Report;

void progress(const std::string& m) { std::fprintf(stderr, "[gemma4] %s\n", m.c_str()); }

std::atomic<bool> g_stop{false};
// First Ctrl-C: stop after this iteration (train() saves); the second: the default action.
void on_interrupt(int) {
  if (g_stop.exchange(true)) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  const char msg[] = "\n[gemma4] stopping after this iteration, saving the adapter (Ctrl-C again to quit at once)\n";
  (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
}

Result<float> float_flag(const Args& a, const char* name, float def) {
  if (!a.has(name)) return def;
  const std::string s = a.get(name);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) return err("%s %s: expected a number", name, s.c_str());
  return float(v);
}

// On a model with MoE layers, lora_parameters.keys names the modules trained (attention and the
// dense MLP), so that mlx-lm's load_adapters wraps those and not the router and experts, as its
// default keys would.
Status write_adapter_config(const std::string& path, const Args& a, const train::LoraConfig& lc,
                            const train::TrainOptions& o, const std::string& model, const std::string& opt,
                            float lr, const ModelConfig& cfg) {
  nlohmann::ordered_json j;
  j["model"] = model;
  j["data"] = a.get("--data");
  j["fine_tune_type"] = "lora";
  j["optimizer"] = opt;
  j["mask_prompt"] = a.has("--mask-prompt");
  j["num_layers"] = lc.num_layers;
  j["batch_size"] = o.batch_size;
  j["iters"] = o.iters;
  j["val_batches"] = o.val_batches;
  j["learning_rate"] = lr;
  j["steps_per_report"] = o.steps_per_report;
  j["steps_per_eval"] = o.steps_per_eval;
  j["resume_adapter_file"] = a.has("--resume-adapter-file") ? nlohmann::ordered_json(a.get("--resume-adapter-file"))
                                                            : nlohmann::ordered_json();
  j["adapter_path"] = o.adapter_dir;
  j["save_every"] = o.save_every;
  j["max_seq_length"] = o.max_seq_length;
  j["grad_accumulation_steps"] = o.grad_accumulation_steps;
  j["seed"] = o.seed;
  j["lora_parameters"] = {{"rank", lc.rank}, {"dropout", lc.dropout}, {"scale", lc.scale}};
  if (cfg.n_experts > 0) {
    nlohmann::ordered_json keys = nlohmann::ordered_json::array();
    for (const char* m : kLoraModules)
      for (int l = 0; l < cfg.n_layers; ++l)
        if (lora_module_shape(cfg, l, m).first > 0) {
          keys.push_back(m);
          break;
        }
    j["lora_parameters"]["keys"] = keys;
  }
  return write_file_atomic(path, j.dump(4) + "\n");
}

int run_lora(const std::vector<std::string>& argv) {
  VerbCli cli("lora", "LoRA fine-tuning on jsonl data, with mlx_lm.lora's flags and defaults; writes an adapter "
              "for --adapter-path.");
  add_lora_options(cli);
  Args parsed;
  if (int rc = cli.parse(argv, parsed); rc >= 0) return rc;
  const Args& a = parsed;
  auto fail_ = [](const std::string& m) { return fail("lora", m); };
  if (a.get("--fine-tune-type", "lora") != "lora")
    return fail_("--fine-tune-type " + a.get("--fine-tune-type") + ": only lora is supported (not dora or full)");
  if (a.get("--tensor-parallel", "1") != "1")
    return fail_("--tensor-parallel " + a.get("--tensor-parallel") +
                 ": training runs on one rank (the split is for inference: run, generate, serve and the checking verbs)");
  for (const char* flag : {"--devices", "--collectives"})
    if (a.has(flag)) return fail_(std::string(flag) + ": training runs on one rank (tensor parallelism is for inference)");
  const std::string backend = a.get("--backend");
  if (backend != "cpu" && backend != "reference" && backend != "cuda")
    return fail_("--backend " + backend + ": training runs on the host (cpu or reference) or on a GPU (cuda)");
  const bool on_gpu = backend == "cuda";
  if (!on_gpu && a.get("--dtype", "f32") != "f32")
    return fail_("--dtype " + a.get("--dtype") + ": the host backends train in f32 (bf16 is for --backend cuda)");
  // On a GPU: the model is read on the host (the head and the loss run there) and its weights are
  // placed on the device by the training arithmetic (backend/grad_arith.h).
  std::unique_ptr<GradArith> gpu;
  BackendOptions gpu_options;
  if (on_gpu) {
    auto bo = backend_options_from_args(a);
    if (!bo.is_ok()) return fail_(bo.message());
    gpu_options = bo.value();
    gpu_options.activations = a.get("--dtype", "f32") == "bf16" ? DType::BF16 : DType::F32;
    std::string why;
    gpu = make_cuda_grad_arith(&why, gpu_options);
    if (!gpu) return fail_("--backend cuda: " + why);
  }
  if (!a.has("--data")) return fail_("--data DIR is required (a directory with train.jsonl and valid.jsonl)");
  const std::string data_dir = a.get("--data");
  if (!fs::is_directory(data_dir)) return fail_(data_dir + ": not a directory");

  train::LoraConfig lc;
  train::TrainOptions o;
  auto parse_flags = [&]() -> Status {  // every numeric flag, checked before loading anything
    G4_ASSIGN_OR_RETURN(lc.num_layers, int_flag(a, "--num-layers", 16, -1, 1 << 20));
    G4_ASSIGN_OR_RETURN(lc.rank, int_flag(a, "--rank", 8, 1, 1 << 16));
    G4_ASSIGN_OR_RETURN(o.iters, int_flag(a, "--iters", 1000, 1, 1 << 30));
    G4_ASSIGN_OR_RETURN(o.batch_size, int_flag(a, "--batch-size", 4, 1, 1 << 20));
    G4_ASSIGN_OR_RETURN(o.val_batches, int_flag(a, "--val-batches", 25, -1, 1 << 30));
    G4_ASSIGN_OR_RETURN(o.steps_per_report, int_flag(a, "--steps-per-report", 10, 1, 1 << 30));
    G4_ASSIGN_OR_RETURN(o.steps_per_eval, int_flag(a, "--steps-per-eval", 200, 1, 1 << 30));
    G4_ASSIGN_OR_RETURN(o.save_every, int_flag(a, "--save-every", 100, 1, 1 << 30));
    G4_ASSIGN_OR_RETURN(o.max_seq_length, int_flag(a, "--max-seq-length", 2048, 2, 1 << 24));
    G4_ASSIGN_OR_RETURN(o.grad_accumulation_steps, int_flag(a, "--grad-accumulation-steps", 1, 1, 1 << 20));
    G4_ASSIGN_OR_RETURN(int seed, int_flag(a, "--seed", 0, 0, 2147483647));
    o.seed = uint32_t(seed);
    G4_ASSIGN_OR_RETURN(lc.scale, float_flag(a, "--scale", 20.f));
    G4_ASSIGN_OR_RETURN(lc.dropout, float_flag(a, "--dropout", 0.f));
    return Status::ok();
  };
  if (Status s = parse_flags(); !s) return fail_(s.message());
  auto lr = float_flag(a, "--learning-rate", 1e-5f);
  if (!lr.is_ok()) return fail_(lr.message());
  auto opt = train::Optimizer::create(a.get("--optimizer", "adam"), lr.value());
  if (!opt.is_ok()) return fail_(opt.message());
  int test_batches = 500;
  if (auto tb = int_flag(a, "--test-batches", 500, -1, 1 << 30); tb.is_ok()) test_batches = tb.value();
  else return fail_(tb.message());
  o.adapter_dir = a.get("--adapter-path", "adapters");
  if (a.has("--resume") && a.has("--overwrite")) return fail_("--resume and --overwrite exclude each other");
  if (a.has("--resume") && a.has("--resume-adapter-file"))
    return fail_("--resume starts from the adapter in --adapter-path; --resume-adapter-file names another: pass one");
  const train::ExistingAdapter existing = a.has("--resume")      ? train::ExistingAdapter::Resume
                                          : a.has("--overwrite") ? train::ExistingAdapter::Overwrite
                                                                 : train::ExistingAdapter::Refuse;

  if (Status s = apply_process_flags(a); !s) return fail_(s.message());
  auto bundle = load_bundle(a.get("--model"), on_gpu ? "cpu" : backend, progress);
  if (!bundle.is_ok()) return fail_(bundle.message());
  ModelBundle& b = bundle.value();
  if (a.has("--chat-template")) {
    auto ct = ChatTemplate::from_file(a.get("--chat-template"));
    if (!ct.is_ok()) return fail_(ct.message());
    b.chat_template = std::move(ct.value());
  }
  const ModelConfig& cfg = b.model->config();
  // mlx-lm's default of 16 layers, on a model with fewer: all of them (an explicit value must fit).
  if (!a.has("--num-layers") && lc.num_layers > cfg.n_layers) lc.num_layers = -1;

  train::DatasetOptions dopt;
  dopt.mask_prompt = a.has("--mask-prompt");
  if (a.has("--enable-thinking")) {
    const std::string v = a.get("--enable-thinking");
    if (v != "on" && v != "off") return fail_("--enable-thinking " + v + ": expected on or off");
    dopt.enable_thinking = v == "on";
  }
  train::Dataset sets[3];
  const char* names[3] = {"train", "valid", "test"};
  for (int i = 0; i < 3; ++i) {
    if (i == 2 && !a.has("--test")) break;
    auto d = train::load_jsonl((fs::path(data_dir) / (std::string(names[i]) + ".jsonl")).string(), b, dopt);
    if (!d.is_ok()) return fail_(d.message());
    sets[i] = std::move(d.value());
  }
  if (sets[0].size() == 0) return fail_(data_dir + "/train.jsonl: training set not found or empty");
  if (sets[1].size() == 0)
    progress("warning: " + data_dir + "/valid.jsonl not found or empty: training without validation");
  if (a.has("--test") && sets[2].size() == 0) return fail_(data_dir + "/test.jsonl: test set not found or empty");
  progress("data: " + std::to_string(sets[0].size()) + " train, " + std::to_string(sets[1].size()) + " valid" +
           (a.has("--test") ? ", " + std::to_string(sets[2].size()) + " test" : std::string()) + " records");

  auto params = train::LoraParams::create(cfg, lc, train::lora_layer_prefix(cfg), o.seed);
  if (!params.is_ok()) return fail_(params.message());
  {  // every refusal before the adapter directory is touched: a refused run writes nothing there
    train::NumpyLegacyRng probe(o.seed);
    auto batches = train::BatchIterator::create(sets[0], o.batch_size, &probe, false);
    if (!batches.is_ok()) return fail_(batches.message());
    // The largest batch the data can make (its longest records) against the free memory.
    std::vector<int> rows;
    for (const train::Dataset& set : sets)
      for (const train::Example& ex : set.examples)
        rows.push_back(std::min<int>(int(ex.tokens.size()), o.max_seq_length) - 1);
    std::sort(rows.rbegin(), rows.rend());
    rows.resize(std::min(rows.size(), size_t(o.batch_size)));
    uint64_t need = train::training_batch_bytes(cfg, params->first_layer(), rows);
    FreeMemory free = host_free_memory();
    if (on_gpu) {  // the batch and the model's weights, in the device's memory
      auto fm = cuda_free_memory(gpu_options.device);
      if (!fm.is_ok()) return fail_("--backend cuda: " + fm.message());
      free = fm.value();
      auto wb = stored_weight_bytes(cfg, *b.model->source());
      if (!wb.is_ok()) return fail_(wb.message());
      need += wb.value();
      if (gpu_options.activations == DType::BF16)  // the weights' bf16 copies, the budget in full
        need += uint64_t(gpu_options.bf16_weight_cache_gib) << 30;
    }
    const std::string sizes = "a batch of " + std::to_string(rows.size()) + " records of up to " +
                              std::to_string(rows.empty() ? 0 : rows[0] + 1) + " tokens";
    if (free.bytes > 0 && need > free.bytes)
      return fail_(sizes + " needs about " + human_bytes(need) + " to train (" +
                   (on_gpu ? "the model's weights, activations and attention weights" : "activations and attention weights") +
                   "); " +
                   human_bytes(free.bytes) + " is free (" + free.source +
                   "): lower --batch-size or --max-seq-length");
    progress("training memory: about " + human_bytes(need) + " for " + sizes + ", " + human_bytes(free.bytes) +
             " free");
  }
  auto resume_from = train::prepare_adapter_dir(o.adapter_dir, existing, lc);
  if (!resume_from.is_ok()) return fail_(resume_from.message());
  if (a.has("--resume-adapter-file")) resume_from.value() = a.get("--resume-adapter-file");
  std::optional<train::TrainState> state;
  if (resume_from.value()) {
    progress("loading fine-tuned weights from " + *resume_from.value());
    if (Status s = params->load(*resume_from.value()); !s) return fail_(s.message());
    const std::string sp = train::train_state_path(*resume_from.value());
    if (fs::exists(sp)) {
      auto st = train::load_train_state(sp);
      if (!st.is_ok()) return fail_(st.message());
      if (st->iteration >= o.iters) {  // a finished run: another run from its weights, as mlx-lm's resume
        progress("the run saved in " + sp + " finished at iteration " + std::to_string(st->iteration) +
                 ": training again from its weights, the optimizer afresh");
      } else {
        state = std::move(st).value();
        o.resume = &*state;
        progress("continuing the run from iteration " + std::to_string(state->iteration) + " (" + sp + ")");
      }
    } else {
      progress("no training state beside it (" + sp + "): the optimizer starts afresh at iteration 1");
    }
  }
  if (Status s = write_adapter_config((fs::path(o.adapter_dir) / "adapter_config.json").string(), a, lc, o, b.path,
                                     opt->name(), lr.value(), cfg);
      !s)
    return fail_(s.message());
  std::printf("Trainable parameters: %.3fM (%zu modules, the last %d layers, rank %d)\n",
              double(params->parameter_count()) / 1e6, params->modules().size(),
              lc.num_layers < 0 ? cfg.n_layers : lc.num_layers, lc.rank);
  std::fflush(stdout);

  std::ofstream log;
  if (a.has("--log-file")) {
    log.open(a.get("--log-file"), std::ios::trunc);
    if (!log) return fail_(a.get("--log-file") + ": cannot write");
  }
  auto report = [&](const Report& r) {
    clear_progress_line();
    nlohmann::ordered_json j{{"kind", r.kind}, {"iteration", r.iteration}};
    if (r.kind == "val") {
      std::printf("Iter %d: Val loss %.3f, Val took %.3fs\n", r.iteration, r.loss, r.seconds);
      j["loss"] = r.loss;
    } else if (r.kind == "train") {
      std::printf("Iter %d: Train loss %.3f, Learning Rate %.3e, It/sec %.3f, Tokens/sec %.3f, Trained Tokens %ld, "
                  "Peak mem %.3f GB\n", r.iteration, r.loss, double(r.learning_rate), r.it_per_sec, r.tokens_per_sec,
                  r.trained_tokens, peak_rss_mib() / 1024.0);
      j["loss"] = r.loss;
      j["tokens_per_sec"] = r.tokens_per_sec;
      j["trained_tokens"] = r.trained_tokens;
    } else if (r.kind == "interrupted") {
      std::printf("Iter %d: Interrupted; saved adapter weights and training state to %s (continue with --resume)\n",
                  r.iteration, r.path.c_str());
      j["path"] = r.path;
    } else {
      std::printf("Iter %d: Saved adapter weights to %s\n", r.iteration, r.path.c_str());
      j["path"] = r.path;
    }
    std::fflush(stdout);
    if (log.is_open()) log << j.dump() << "\n" << std::flush;
  };

  train::LoraTrainModel tm(*b.model, params.value(), std::move(gpu));
  train::NumpyLegacyRng rng(o.seed);
  progress("training: " + std::to_string(o.iters) + " iterations, batch " + std::to_string(o.batch_size) + ", " +
           opt->name() + " lr " + a.get("--learning-rate", "1e-05") + ", " + std::to_string(num_threads()) +
           " threads");
  // On a terminal, a progress bar with the time left between reports (cli/progress_bar.h).
  std::optional<ProgressTask> iterations(std::in_place, "training", uint64_t(o.iters), ProgressUnit::Iterations);
  if (state) iterations->add(uint64_t(state->iteration));
  auto step = [&](int) { iterations->add(1); };
  // Validation and the test set: a bar of their batches while they run (on long records they take
  // minutes between two report lines).
  std::optional<ProgressTask> batches_bar;
  auto batches_progress = [&batches_bar](const char* what) {
    return [&batches_bar, what](int i, int n) {
      if (i == 0) batches_bar.emplace(what, uint64_t(n), ProgressUnit::Iterations);
      else if (batches_bar) batches_bar->add(1);
      if (i == n) batches_bar.reset();
    };
  };
  o.val_progress = batches_progress("validation batches");
  o.stop = &g_stop;
  std::signal(SIGINT, on_interrupt);
  auto done = train::train(tm, params.value(), opt.value(), sets[0], sets[1], o, rng, report, step);
  std::signal(SIGINT, SIG_DFL);
  if (!done.is_ok()) return fail_(done.message());
  iterations.reset();  // the bar's last line, before the test report
  if (done.value() < o.iters) return 130;  // interrupted (saved)
  if (a.has("--test")) {
    auto tl = train::evaluate(tm, sets[2], o.batch_size, test_batches, o.max_seq_length, rng,
                              batches_progress("test batches"));
    if (!tl.is_ok()) return fail_(tl.message());
    std::printf("Test loss %.3f, Test ppl %.3f.\n", tl.value(), std::exp(tl.value()));
    if (log.is_open()) log << nlohmann::ordered_json{{"kind", "test"}, {"loss", tl.value()}}.dump() << "\n";
  }
  return 0;
}

}  // namespace

G4_COMMAND("lora", "LoRA fine-tuning on jsonl data (mlx_lm.lora --train); writes an adapter for --adapter-path",
           run_lora);

}  // namespace g4::cli
