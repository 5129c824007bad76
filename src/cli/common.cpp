#include "cli/common.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "io/model_dir.h"
#include "parallel/tp_model.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "model/drafter.h"
#include "model/expert_trace.h"
#include "runtime/image_prompt.h"
#include "quant/matmul.h"

namespace g4::cli {

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&]() -> Status {
    if (cur.empty()) return {};
    char* end = nullptr;
    long v = std::strtol(cur.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > 0x7fffffff) return err("--ids: '%s' is not a token id", cur.c_str());
    ids.push_back(int32_t(v));
    cur.clear();
    return {};
  };
  for (char c : s) {
    if (c == ',' || c == ' ' || c == '[' || c == ']' || c == '\n') {
      G4_TRY(flush());
    } else {
      cur.push_back(c);
    }
  }
  G4_TRY(flush());
  if (ids.empty()) return err("--ids: no token ids given");
  return ids;
}

Result<ActPrecision> parse_precision(const std::string& s, Model& model) {
  if (s != "" && s != "f32" && s != "bf16") return err("--dtype: expected f32 or bf16, got '%s'", s.c_str());
  // A device backend stores activations in the dtype it was made with (backend_options_from_args
  // read the same --dtype), and computes in it.
  if (model.backend().on_device())
    return model.backend().activation_dtype() == DType::BF16 ? ActPrecision::BF16 : ActPrecision::F32;
  ActPrecision P = model.config().reference_precision;
  if (s == "bf16") P = ActPrecision::BF16;
  else if (s == "f32") P = ActPrecision::F32;
  else if (!s.empty()) return err("--dtype: expected f32 or bf16, got '%s'", s.c_str());
  if (!model.backend().supports_precision(P))
    return err("backend '%s' computes f32 activations only: pass --dtype f32", model.backend().name().c_str());
  return P;
}

bool cheap_rows(const Args& a) { return a.get("--backend") == "cuda" && !batch_invariant(); }
int auto_prefill_chunk(const Args& a, int slow) {
  constexpr int kCheapRowChunk = 2048;
  return cheap_rows(a) ? kCheapRowChunk : slow;
}

Status apply_process_flags(const Args& a, bool batch_invariant_default) {
  if (a.has("--threads")) {
    char* end = nullptr;
    const long n = std::strtol(a.get("--threads").c_str(), &end, 10);
    if (*end != '\0' || n <= 0 || n > 1024) return err("--threads: expected a number from 1 to 1024");
    set_num_threads(int(n));
  }
  if (a.has("--weights")) {
    auto r = parse_weight_residency(a.get("--weights"));
    if (!r) return err("--weights: expected auto, mmap or copy, got '%s'", a.get("--weights").c_str());
    set_weight_residency(*r);
  }
  // A drafter's verification rows must be computed as a lone decode row would be (engine.h).
  batch_invariant_default = batch_invariant_default || a.has("--draft-model");
  const std::string bi = a.get("--batch-invariant", batch_invariant_default ? "on" : "off");
  if (bi != "on" && bi != "off") return err("--batch-invariant: expected on or off, got '%s'", bi.c_str());
  set_batch_invariant(bi == "on");
  return {};
}

Result<int> int_flag(const Args& a, const char* name, int def, int lo, int hi) {
  const std::string v = a.get(name);
  if (!a.has(name) && v.empty()) return def;
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < lo || n > hi)
    return err("%s: expected an integer in [%d, %d], got '%s'", name, lo, hi, v.c_str());
  return int(n);
}

Status apply_model_flags(const Args& a, Model& m, ActPrecision P) {
  KvCacheOptions o;
  G4_ASSIGN_OR_RETURN(o.quant.bits, int_flag(a, "--kv-bits", 0, 0, 8));
  G4_ASSIGN_OR_RETURN(o.quant.group_size, int_flag(a, "--kv-group-size", 64, 1, 1 << 20));
  G4_ASSIGN_OR_RETURN(o.quantized_start, int_flag(a, "--quantized-kv-start", 5000, 0, 1 << 30));
  o.quant.bf16_params = P == ActPrecision::BF16;
  if (o.quant.bits == 0 && (a.has("--kv-group-size") || a.has("--quantized-kv-start")))
    return err("--kv-group-size and --quantized-kv-start need --kv-bits");
  G4_TRY(m.set_kv_options(o));
  if (m.ranks() > 1 && a.has("--draft-model"))
    return err("--tensor-parallel does not take --draft-model yet (drafters are not sharded)");
  if (a.has("--adapter-path")) {
    G4_ASSIGN_OR_RETURN(auto ad, m.load_adapter(a.get("--adapter-path")));
    m.set_adapter(std::move(ad));
  }
  if (a.has("--draft-model")) {
    G4_ASSIGN_OR_RETURN(auto dr, Drafter::load(a.get("--draft-model"), m.config(), m.weights(), m.backend()));
    G4_ASSIGN_OR_RETURN(int n, int_flag(a, "--draft-tokens", dr->config().block_size - 1, 1, 64));
    dr->set_draft_tokens(n);
    m.set_drafter(std::move(dr));
  } else if (a.has("--draft-tokens")) {
    return err("--draft-tokens needs --draft-model");
  }
  if (a.has("--trace-experts")) {
    if (m.config().n_experts == 0) return err("--trace-experts: the model has no MoE layers");
    G4_ASSIGN_OR_RETURN(std::unique_ptr<ExpertTrace> t, ExpertTrace::open(a.get("--trace-experts")));
    m.set_expert_trace(std::move(t));
  }
  return Status::ok();
}

Result<BackendOptions> backend_options_from_args(const Args& a) {
  BackendOptions o;
  auto on_off = [&](const char* name, bool& out) -> Status {
    if (!a.has(name)) return {};
    const std::string v = a.get(name);
    if (v != "on" && v != "off") return err("%s: expected on or off, got '%s'", name, v.c_str());
    out = v == "on";
    return {};
  };
  G4_TRY(on_off("--cuda-graphs", o.graphs));
  G4_TRY(on_off("--tensor-cores", o.tensor_cores));
  G4_TRY(on_off("--cuda-blas", o.blas));
  G4_TRY(on_off("--int8-dots", o.int8_dots));
  G4_TRY(on_off("--cuda-pdl", o.pdl));
  G4_TRY(on_off("--cuda-fuse", o.fuse_decode_ops));
  G4_TRY(on_off("--cuda-fold-prep", o.fold_attn_prep));
  G4_TRY(on_off("--cuda-int8-mma", o.int8_mma_rows));
  G4_TRY(on_off("--cuda-gemv-ahead", o.gemv_ahead));
  G4_TRY(on_off("--cuda-profile", o.profile));
  G4_TRY(on_off("--cuda-timing", o.timing));
  G4_ASSIGN_OR_RETURN(o.device, int_flag(a, "--cuda-device", 0, 0, 63));
  G4_ASSIGN_OR_RETURN(o.tensor_parallel, int_flag(a, "--tensor-parallel", 1, 1, 64));
  if (a.has("--devices")) {
    const std::string list = a.get("--devices");
    for (size_t at = 0; at <= list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      const std::string item = list.substr(at, comma - at);
      char* end = nullptr;
      const long d = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || d < 0 || d > 63)
        return err("--devices: expected GPU numbers 0..63 separated by commas, got '%s'", list.c_str());
      o.devices.push_back(int(d));
      at = comma + 1;
    }
    if (!a.has("--tensor-parallel")) o.tensor_parallel = int(o.devices.size());
  }
  const std::string fetch = a.get("--cuda-row-fetch", "auto");
  if (fetch == "shared") o.row_fetch = BackendOptions::RowFetch::Shared;
  else if (fetch == "none") o.row_fetch = BackendOptions::RowFetch::None;
  else if (fetch == "auto") o.row_fetch = BackendOptions::RowFetch::Auto;
  else if (fetch != "l2") return err("--cuda-row-fetch: expected l2, shared, none or auto, got '%s'", fetch.c_str());
  const std::string how = a.get("--collectives", "auto");
  if (how == "nccl") o.collectives = BackendOptions::Collectives::Nccl;
  else if (how == "host") o.collectives = BackendOptions::Collectives::Host;
  else if (how != "auto") return err("--collectives: expected auto, nccl or host, got '%s'", how.c_str());
  G4_ASSIGN_OR_RETURN(o.bf16_weight_cache_gib, int_flag(a, "--cuda-bf16-cache", 0, 0, 1024));
  G4_ASSIGN_OR_RETURN(o.blas_cached_min_rows, int_flag(a, "--cuda-blas-cached-rows", 0, 0, 33));
  G4_ASSIGN_OR_RETURN(o.attn_split_positions, int_flag(a, "--cuda-attn-split", 0, 0, 65536));
  const std::string dt = a.get("--dtype");
  if (!dt.empty() && dt != "f32" && dt != "bf16") return err("--dtype: expected f32 or bf16, got '%s'", dt.c_str());
  // Device backends store activations in bf16 unless --dtype f32 asks for the exact path (the
  // accuracy contract of docs/cuda-notes.md); host backends always store f32 (their --dtype is a
  // rounding mode, parse_precision).
  o.activations = dt == "f32" ? DType::F32 : DType::BF16;
  o.row_exact = batch_invariant();  // apply_process_flags has set it
  return o;
}

Result<std::unique_ptr<Model>> load_model_from_args(const Args& a, bool quiet) {
  G4_TRY(apply_process_flags(a));
  G4_ASSIGN_OR_RETURN(BackendOptions bo, backend_options_from_args(a));
  std::string path = a.get("--model");
  auto t0 = std::chrono::steady_clock::now();
  if (!quiet) std::fprintf(stderr, "loading %s ...\n", path.empty() ? "default model" : path.c_str());
  Result<std::unique_ptr<Model>> m = Error{""};
  if (uses_tp_group(bo)) {
    G4_ASSIGN_OR_RETURN(std::string p, resolve_model_path(path));
    G4_ASSIGN_OR_RETURN(OpenedModel om, open_model(p));
    m = build_model_ranks(om, a.get("--backend"), bo);
  } else {
    m = load_model(path, a.get("--backend"), bo);
  }
  if (m && !quiet) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "loaded in %.2f s (%.1f MiB of weights)\n", s,
                 double(m.value()->weights().weight_bytes) / (1 << 20));
  }
  return m;
}

Result<std::vector<float>> image_features_from_args(const Args& a, Model& m, const std::vector<int32_t>& ids) {
  if (!a.has("--image")) return std::vector<float>{};
  G4_ASSIGN_OR_RETURN(auto enc, VisionEncoder::load(a.get("--model"), m.backend()));
  G4_TRY(enc->usable_for_prompts(m.backend()));
  G4_ASSIGN_OR_RETURN(int mst, int_flag(a, "--max-soft-tokens", 0, 0, 1120));
  G4_ASSIGN_OR_RETURN(std::vector<ImageInput> images, read_image_files(a.get("--image")));
  G4_ASSIGN_OR_RETURN(std::vector<PatchGrid> grids, preprocess_images(*enc, images, mst));
  G4_ASSIGN_OR_RETURN(std::vector<float> soft, encode_images(*enc, grids, images));
  const size_t k = size_t(std::count(ids.begin(), ids.end(), m.config().image_token));
  if (k * size_t(m.config().hidden) != soft.size())
    return err("the ids hold %zu image tokens but the images give %zu", k, soft.size() / size_t(m.config().hidden));
  return soft;
}

const float* soft_at(const std::vector<float>& soft, const std::vector<int32_t>& ids, int from, const ModelConfig& c) {
  if (soft.empty()) return nullptr;
  return soft.data() + size_t(std::count(ids.begin(), ids.begin() + from, c.image_token)) * size_t(c.hidden);
}

Status write_npy(const std::string& path, const float* data, size_t rows, size_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) +
                       ", " + std::to_string(cols) + "), }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) return err("%s: cannot write", path.c_str());
  const char magic[] = "\x93NUMPY\x01\x00";
  f.write(magic, 8);
  uint16_t hl = uint16_t(header.size());
  f.write(reinterpret_cast<const char*>(&hl), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data), std::streamsize(rows * cols * 4));
  if (!f) return err("%s: write failed", path.c_str());
  return {};
}

int fail(const char* verb, const std::string& msg) {
  std::fprintf(stderr, "gemma4 %s: %s\n", verb, msg.c_str());
  return 1;
}

double peak_rss_mib() {
  // VmHWM is this process's own peak; getrusage's ru_maxrss can carry a parent's peak across exec.
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

int32_t greedy_step(Model& m, KvCache& cache, int32_t tok, ActPrecision P, std::vector<float>& logits) {
  int32_t next = tok;
  if (m.backend().on_device()) {
    m.forward({SeqInput{&cache, &tok, 1, false}}, P, nullptr, &next);
    return next;
  }
  m.forward({SeqInput{&cache, &tok, 1, false}}, P, logits.data());
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace g4::cli
