// Helpers shared by the model-running verbs: model/backend/thread flags, id lists, .npy output.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/status.h"
#include "model/model.h"

namespace g4::cli {

// Parses "2,105,3" (or a JSON list "[2,105,3]") into ids.
Result<std::vector<int32_t>> parse_ids(const std::string& s);
// --dtype f32|bf16 on a host backend: the rounding mode of the activations (bf16: MLX's, for
// parity with mlx-lm); empty: the model format's reference precision (bf16 for MLX / HF
// checkpoints, f32 for GGUF). An error when the backend does not compute that precision. On a
// device backend: the precision its activations are stored in (backend_options_from_args).
Result<ActPrecision> parse_precision(const std::string& s, Model& model);
// --threads N, --weights auto|mmap|copy (core/mapped_file.h) and --batch-invariant on|off
// (quant/matmul.h; default: batch_invariant_default): process-wide settings, applied before a
// model is loaded.
Status apply_process_flags(const Args& a, bool batch_invariant_default = false);
// Whether a row of a step is cheap: cuda's batched kernels (--backend cuda without
// --batch-invariant on, as apply_process_flags set it). Row-exact and host kernels cost 15-100x
// more a row.
bool cheap_rows(const Args& a);
// The prompt rows one sequence feeds per step by default (`auto`): 2048 where rows are cheap, so
// the tensor-core tiles and the experts' 64-row blocks fill (H200, 2048-token prompt, 256 / 512 /
// 1024 / 2048-row chunks: 26B-A4B 11.1k / 15.9k / 20.5k / 22.3k tok/s, E4B 15.8k / 25.8k / 35.7k
// / 40.0k), else `slow` (short steps beside decoding streams).
int auto_prefill_chunk(const Args& a, int slow);
// An integer flag in [lo, hi]: the value given, else its declared default, else def; the error
// names the flag.
Result<int> int_flag(const Args& a, const char* name, int def, int lo, int hi);
// Options applied to a loaded model:
//   --kv-bits N (2..8; absent: f32 KV), --kv-group-size G (32|64|128, default 64) and
//   --quantized-kv-start T (default 5000, mlx-lm's): the quantized KV cache of the caches `m`
//   makes from now on (model/kv_cache.h), with scales in bf16 when the activations are (P);
//   --adapter-path DIR: a LoRA adapter in mlx-lm's format (model/lora.h);
//   --draft-model DIR [--draft-tokens N]: a Gemma 4 assistant drafter (model/drafter.h) with N
//   drafts per round (default: its block_size - 1), for speculative decoding in the engine
//   (--batch-invariant then defaults to on, so the output equals decoding without it).
Status apply_model_flags(const Args& a, Model& m, ActPrecision P);
// The device backend's options (BackendOptions) from --cuda-graphs on|off (default on),
// --tensor-cores on|off (on), --cuda-blas on|off (on), --cuda-profile on|off (off: per-op device times on stderr at exit)
// --cuda-timing on|off (off: per-step host/device times on stderr at exit) and --cuda-device N
// (0: the GPU to run on); and the device
// activations' dtype from --dtype f32|bf16 (default f32), for the verbs that take --dtype.
Result<BackendOptions> backend_options_from_args(const Args& a);
// Loads --model (or the default starter model) on --backend, after apply_process_flags.
// Prints load progress on stderr unless quiet.
Result<std::unique_ptr<Model>> load_model_from_args(const Args& a, bool quiet = false);
// --image F1[,F2...] [--max-soft-tokens N] for the checking verbs: the images' text-space
// features (vision/vision_encoder.h, loaded from --model) for the image tokens of `ids`, in order
// ([k, hidden]); empty without --image. Errors name the file, or give both counts when the ids
// hold a different number of image tokens.
Result<std::vector<float>> image_features_from_args(const Args& a, Model& m, const std::vector<int32_t>& ids);
// The features of ids[from...]'s image tokens within `soft` (SeqInput::soft), or null when empty.
const float* soft_at(const std::vector<float>& soft, const std::vector<int32_t>& ids, int from, const ModelConfig& c);
// Writes a float32 [rows, cols] array as a NumPy .npy file.
Status write_npy(const std::string& path, const float* data, size_t rows, size_t cols);
// Prints "gemma4 <verb>: <msg>" to stderr and returns 1.
int fail(const char* verb, const std::string& msg);
// Peak resident set size of this process in MiB.
double peak_rss_mib();

// One greedy decode step: feeds `tok` to `cache` and returns the next token. On a device backend
// the argmax runs there and only the id comes back (Model::forward); on the host the logits row
// (kept in `logits`, [vocab]) is scanned.
int32_t greedy_step(Model& m, KvCache& cache, int32_t tok, ActPrecision P, std::vector<float>& logits);

}  // namespace g4::cli
