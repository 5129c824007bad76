#include "cli/options.h"

#include <cctype>
#include <cstdio>

namespace g4::cli {
namespace {

// The long name of an option with its dashes ("--model"), or a positional's name.
std::string key_of(const CLI::Option& o) {
  if (!o.get_lnames().empty()) return "--" + o.get_lnames()[0];
  if (!o.get_snames().empty()) return "-" + o.get_snames()[0];
  return o.get_name();
}

}  // namespace

CLI::Validator one_of(std::vector<std::string> choices) {
  std::string names;
  for (size_t i = 0; i < choices.size(); ++i)
    names += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return CLI::Validator(
      [choices, names](std::string& v) -> std::string {
        for (const auto& c : choices)
          if (v == c) return "";
        return "expected " + names + ", got '" + v + "'";
      },
      "");  // --help shows the choices in the type name or the meaning
}

VerbCli::VerbCli(const std::string& verb, const std::string& summary)
    : verb_(verb), app_(summary, "gemma4 " + verb) {
  app_.set_help_flag("-h,--help", "print this help (every option, its default and meaning) and exit");
  app_.allow_extras();  // unknown options are reported by parse() in this project's wording
  app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app_.get_formatter()->column_width(34);
  app_.get_formatter()->label("REQUIRED", "required");
}

CLI::Option* VerbCli::value(const std::string& names, const std::string& help, const std::string& def) {
  CLI::Option* o = app_.add_option(names, help);
  o->type_name("VALUE")->group(group_)->allow_extra_args(false);
  if (!def.empty()) o->default_str(def);
  return o;
}

CLI::Option* VerbCli::flag(const std::string& names, const std::string& help) {
  return app_.add_flag(names, help)->group(group_);
}

void VerbCli::words(const std::string& name, const std::string& help) {
  // Not a CLI11 positional: CLI11 splits a "[a,b]" word of a many-valued option at its commas
  // (a prompt or an id list must stay as typed), so the words are taken from what CLI11 leaves.
  words_ = true;
  app_.footer("Arguments:\n  " + name + "...  " + help);
}

int VerbCli::parse(const std::vector<std::string>& argv, Args& out) {
  // CLI11 takes the arguments in reverse order.
  std::vector<std::string> rev(argv.rbegin(), argv.rend());
  try {
    app_.parse(rev);
  } catch (const CLI::CallForHelp&) {
    // "--context N=8192": the type name without CLI11's validator descriptions, and the default.
    for (CLI::Option* o : app_.get_options()) {
      if (o->get_type_size() == 0) continue;
      std::string tn = o->get_type_name();
      std::string text = tn.substr(0, tn.find(':'));
      if (!o->get_default_str().empty()) text += "=" + o->get_default_str();
      if (o->get_required()) text += " (required)";
      o->option_text(text);
    }
    std::fputs(app_.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "gemma4 %s: %s (see gemma4 %s --help)\n", verb_.c_str(), e.what(), verb_.c_str());
    return 2;
  }
  std::vector<std::string> words;
  for (const std::string& extra : app_.remaining()) {
    const bool dash = extra.size() > 1 && extra[0] == '-' && !std::isdigit(static_cast<unsigned char>(extra[1]));
    if (dash) {
      std::fprintf(stderr, "gemma4 %s: unknown option %s (see gemma4 %s --help)\n", verb_.c_str(), extra.c_str(),
                   verb_.c_str());
      return 2;
    }
    if (!words_) {
      std::fprintf(stderr, "gemma4 %s: unexpected argument '%s' (see gemma4 %s --help)\n", verb_.c_str(),
                   extra.c_str(), verb_.c_str());
      return 2;
    }
    words.push_back(extra);
  }
  out = Args{};
  out.positional = std::move(words);
  for (const CLI::Option* o : app_.get_options()) {
    const std::string key = key_of(*o);
    if (key == "--help") continue;
    if (!o->get_default_str().empty()) out.defaults[key] = o->get_default_str();
    if (o->get_type_size() == 0) {  // a switch: present or not
      for (size_t i = 0; i < o->count(); ++i) out.flags.emplace_back(key, "");
    } else {
      for (const std::string& v : o->results()) out.flags.emplace_back(key, v);
    }
  }
  return -1;
}

void add_load_options(VerbCli& cli) {
  cli.group("Model loading");
  cli.value("-m,--model", "model directory (config.json + *.safetensors), .gguf file, or a directory holding one; "
            "default: the starter model")->type_name("PATH");
  cli.value("--backend", "compute backend: cpu, reference (scalar, exact), ggml (llama.cpp's CPU numerics), "
            "cuda (NVIDIA GPU, in a CUDA build)", "cpu")
      ->type_name("NAME")->check(one_of({"cpu", "reference", "ggml", "cuda"}));
  cli.value("-t,--threads", "worker threads (default: all cores)")->type_name("N")->check(CLI::Range(1, 1024));
  cli.value("--weights", "weight residency: auto (copy files up to 1 GiB that fit in a quarter of free memory), "
            "mmap (map the file), copy (read into huge pages)", "auto")
      ->type_name("MODE")->check(one_of({"auto", "mmap", "copy"}));
  cli.value("--batch-invariant", "on: row-exact kernels, a sequence's tokens do not depend on its batch "
            "(default: on for serve on the CPU and with --draft-model, else off; on CUDA it costs batched "
            "throughput)")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--tensor-parallel", "split the model over N ranks, a thread and a backend each (heads, MLP columns, "
            "experts, vocabulary); cpu and reference backends, or cuda with a GPU per rank", "1")
      ->type_name("N")->check(CLI::Range(1, 64));
  cli.value("--devices", "with --backend cuda and --tensor-parallel N: the GPU of each rank, comma-separated "
            "(default: 0..N-1; a GPU listed twice shares it, through host collectives)")
      ->type_name("LIST");
  cli.value("--collectives", "how tensor-parallel ranks exchange: auto (NCCL for ranks on distinct GPUs, "
            "else through the host), nccl, host", "auto")
      ->type_name("HOW")->check(one_of({"auto", "nccl", "host"}));
  cli.group("CUDA backend (BackendOptions)");
  cli.value("--cuda-device", "the GPU to run on (its CUDA device number)", "0")
      ->type_name("N")->check(CLI::Range(0, 63));
  cli.value("--cuda-graphs", "record each forward step and replay it as a CUDA graph", "on")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--tensor-cores", "prefill matmuls on the tensor cores", "on")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-blas", "with --dtype bf16: prefill matmuls on cuBLAS's bf16 GEMMs (weights dequantized "
            "to bf16), else the f32-accurate tensor-core kernels", "on")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-bf16-cache", "GiB of bf16 copies of weights kept for the cuBLAS launches (prefill, 33+ "
            "streams, lora --dtype bf16) instead of dequantizing them at every launch, while 2 GiB of device memory stays "
            "free; 0: none", "0")
      ->type_name("GIB")->check(CLI::Range(0, 1024));
  cli.value("--cuda-blas-cached-rows", "the fewest rows a launch whose weights have bf16 copies runs on "
            "cuBLAS instead of the few-row tensor-core kernel (tuning; 0: the built-in switch-over)", "0")
      ->type_name("N")->check(CLI::Range(0, 33));
  cli.value("--cuda-attn-split", "the fewest cache positions a block of a decode attention launch takes "
            "(tuning; 0: the built-in 64; more where the launch would not fit one round of resident blocks)", "0")
      ->type_name("N")->check(CLI::Range(0, 65536));
  cli.value("--int8-dots", "with --dtype bf16: decode matmuls on int8-quantized activation rows (dp4a)", "on")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-pdl", "programmatic dependent launch: a kernel is scheduled while the one before it "
            "finishes", "on")->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-fuse", "with --int8-dots: decode launches share their int8 activation rows (the output "
            "projection reads those the attention wrote, the per-layer input's projection those its gelu_mul wrote; "
            "q/k/v of two formats prepare once)", "on")->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-fold-prep", "decode attention does attn_prep's work (q/k norms, RoPE, the KV write) itself, "
            "one launch fewer a layer (experimental: measured slower so far)", "off")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-int8-mma", "with --batch-invariant: verify-forward GEMVs of 5+ rows into K-quant weights (4 rows "
            "into large Q4_K / Q5_K ones) on the int8 tensor cores, the one-row bits", "on")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-row-fetch", "how decode GEMV blocks fetch their weight rows before they run: l2 (ask L2 where "
            "they fit beside the launch before), shared (one-row GEMVs copy them into shared memory), auto (l2, and "
            "one-row Q6_K GEMVs with small blocks stage them), none", "auto")
      ->type_name("l2|shared|auto|none")->check(one_of({"l2", "shared", "auto", "none"}));
  cli.value("--cuda-gemv-ahead", "one-row decode GEMVs (plain, rows of 4096+ values, not Q6_K) ask for each lane's "
            "next weight unit before dotting the current one (the same bits)", "on")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-profile", "time every op by events; per-op device times on stderr at exit", "off")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("--cuda-timing", "host and device time per forward step; medians on stderr at exit", "off")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.group("Options");
}

void add_decode_ahead_option(VerbCli& cli) {
  cli.value("--decode-ahead", "on a device backend, queue each decode step before the previous step's tokens are "
            "read (sampled on the device, they stay there as the next step's input; not with --tensor-parallel, "
            "--trace-experts, a grammar, logprobs or a drafter); off: a step at a time", "on")
      ->type_name("on|off")->check(one_of({"on", "off"}));
}

void add_model_options(VerbCli& cli) {
  cli.group("Model options");
  cli.value("--kv-bits", "quantize the full-attention KV cache to N bits (2..8; default: f32 cache)")
      ->type_name("N")->check(CLI::Range(2, 8));
  cli.value("--kv-group-size", "quantization group of the KV cache (with --kv-bits)", "64")
      ->type_name("G")->check(one_of({"32", "64", "128"}));
  cli.value("--quantized-kv-start", "tokens a sequence holds before its KV cache is quantized (with --kv-bits)",
            "5000")->type_name("T")->check(CLI::Range(0, 1 << 30));
  cli.value("--adapter-path", "a LoRA adapter directory as mlx_lm.lora saves it")->type_name("DIR");
  cli.value("--draft-model", "a Gemma 4 assistant drafter checkpoint for speculative decoding")->type_name("DIR");
  cli.value("--draft-tokens", "drafts per round (with --draft-model; default: the drafter's block_size - 1)")
      ->type_name("N")->check(CLI::Range(1, 64));
  cli.value("--trace-experts", "append the routed experts and weights of every token at every MoE layer to "
            "FILE as JSON lines (summary: gemma4 info --experts FILE)")->type_name("FILE");
  cli.group("Options");
}

void add_text_options(VerbCli& cli) {
  cli.group("Generation");
  cli.value("-n,--max-tokens", "most tokens per answer", "512")->type_name("N")->check(CLI::Range(1, 1 << 24));
  cli.value("--temp,--temperature", "sampling temperature; 0 is greedy (default: the model's generation_config, "
            "else 0)")->type_name("T")->check(CLI::Range(0.0, 100.0));
  cli.value("--top-k", "sample among the K most likely tokens; 0: all (default: generation_config's)")
      ->type_name("K")->check(CLI::Range(0, 1 << 24));
  cli.value("--top-p", "nucleus sampling mass; 1: off (default: generation_config's)")
      ->type_name("P")->check(CLI::Range(0.0, 1.0));
  cli.value("--min-p", "drop tokens below P times the top probability; 0: off", "0")
      ->type_name("P")->check(CLI::Range(0.0, 1.0));
  cli.value("--repetition-penalty", "divide the logits of tokens already seen by R; 1: off", "1")
      ->type_name("R")->check(CLI::PositiveNumber);
  cli.value("--presence-penalty", "subtract P from the logits of tokens already seen", "0")->type_name("P")
      ->check(CLI::Number);
  cli.value("--frequency-penalty", "subtract F times the count of each token seen", "0")->type_name("F")
      ->check(CLI::Number);
  cli.value("-s,--seed", "sampling seed (default: random)")->type_name("S")->check(CLI::NonNegativeNumber);
  cli.value("--stop", "stop when the answer contains STR (repeatable)")->type_name("STR");
  cli.value("--logit-bias", "add BIAS to token ID's logit (repeatable)")->type_name("ID=BIAS");
  cli.group("Options");
}

void add_image_options(VerbCli& cli) {
  cli.group("Images (checkpoints with a vision encoder)");
  cli.value("--image", "image files, comma-separated (JPEG, PNG, GIF, BMP)")->type_name("F1[,F2]");
  cli.value("--max-soft-tokens", "image tokens per image (default: the model's)")->type_name("N")
      ->check(CLI::Range(0, 1120));
  cli.group("Options");
}

void add_context_option(VerbCli& cli, const std::string& def, const std::string& help) {
  cli.value("-c,--context", help, def)->type_name("N")->check(CLI::Range(16, 1 << 30));
}

void add_chat_template_option(VerbCli& cli) {
  cli.value("--chat-template", "a Jinja chat template file that replaces the model's own (or gives a base model "
            "one)")->type_name("FILE");
}

}  // namespace g4::cli
