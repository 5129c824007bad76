// gemma4 draft --model DIR --draft-model DIR --ids 2,105,... [--from P] [--dtype f32|bf16]
//               [--logits-out F.npy] [--states-out F.npy]
// gemma4 draft --model DIR --draft-model DIR --ids ... --generate N [--temperature T --top-k K
//               --seed S] [--without-drafter]
// Checking tool for speculative decoding (model/drafter.h, runtime/engine.h).
//
// Without --generate: for every n in [P, len(ids)) (P default 1) the drafter runs from the state
// "the target's cache holds ids[0..n), the next token is ids[n]" and drafts --draft-tokens tokens
// (default: its block_size - 1). Prints one JSON object per line: {"n": n, "drafts": [...]};
// --logits-out writes the tied head's logits of every draft step [states * drafts, vocab],
// --states-out the post-projected states [states * drafts, backbone].
// With --generate N: decoding of N tokens after ids through the engine with the drafter (greedy
// unless --temperature; --without-drafter: the same run after the drafter is removed, for
// comparisons); prints {"tokens": [...], "rounds": R, "drafted": D, "accepted": A, "decode_s": S}, S the
// seconds from the first token to the last (the decoding after the prompt's forward).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>

#include "cli/common.h"
#include "cli/options.h"
#include "model/drafter.h"
#include "runtime/engine.h"

namespace g4::cli {
namespace {

std::string json_ids(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

int generate(Model& model, const std::vector<int32_t>& ids, int n, ActPrecision P, const SamplingParams& sp) {
  EngineOptions eo;
  eo.parallel = 1;
  eo.precision = P;
  eo.prefix_cache_bytes = 0;
  eo.max_context = int(ids.size()) + n;
  Engine engine(model, eo);
  GenerationSpec spec;
  spec.prompt = ids;
  spec.max_tokens = n;
  spec.sampling = sp;
  std::vector<int32_t> out;
  std::promise<std::string> done;
  using Clock = std::chrono::steady_clock;
  Clock::time_point first, last;  // the first token's event (the prompt's forward behind it) and the last's
  auto r = engine.submit(spec, [&](const TokenEvent& ev) {
    if (ev.token >= 0) {
      last = Clock::now();
      if (out.empty()) first = last;
      out.push_back(ev.token);
    }
    if (ev.done) done.set_value(ev.error);
  });
  if (!r) return fail("draft", r.message());
  const std::string e = done.get_future().get();
  if (!e.empty()) return fail("draft", e);
  const EngineStats st = engine.stats();
  std::printf("{\"tokens\": %s, \"rounds\": %llu, \"drafted\": %llu, \"accepted\": %llu, \"decode_s\": %.6f}\n",
              json_ids(out).c_str(), static_cast<unsigned long long>(st.draft_rounds),
              static_cast<unsigned long long>(st.drafted_tokens), static_cast<unsigned long long>(st.accepted_tokens),
              std::chrono::duration<double>(last - first).count());
  return 0;
}

int cmd_draft(const std::vector<std::string>& argv) {
  VerbCli cli("draft", "Speculative-decoding check: the drafter's proposals from every position, or engine "
              "decoding with it (--generate).");
  add_load_options(cli);
  add_model_options(cli);
  cli.app().get_option("--draft-model")->required();
  cli.value("--ids", "the token ids, comma-separated or a JSON list")->type_name("IDS")->required();
  cli.value("--from", "first position to draft from", "1")->type_name("P")->check(CLI::Range(1, 1 << 24));
  cli.value("--dtype", "activation precision (default: the model format's; on cuda bf16)")->type_name("f32|bf16")
      ->check(one_of({"f32", "bf16"}));
  cli.value("--logits-out", "write the tied head's logits of every draft step")->type_name("F.npy");
  cli.value("--states-out", "write the post-projected states of every draft step")->type_name("F.npy");
  cli.value("--generate", "decode N tokens through the engine with the drafter")->type_name("N")
      ->check(CLI::Range(1, 1 << 24));
  cli.value("--temperature", "sampling temperature for --generate", "0")->type_name("T")->check(CLI::Range(0.0, 100.0));
  cli.value("--top-k", "top-k for --generate; 0: all", "0")->type_name("K")->check(CLI::Range(0, 1 << 24));
  cli.value("--seed", "sampling seed for --generate", "0")->type_name("S")->check(CLI::NonNegativeNumber);
  cli.flag("--without-drafter", "with --generate: the same run after the drafter is removed");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  auto ids = parse_ids(a.get("--ids"));
  if (!ids) return fail("draft", ids.message());
  if (!a.has("--draft-model")) return fail("draft", "--draft-model DIR is required");
  auto m = load_model_from_args(a, true);
  if (!m) return fail("draft", m.message());
  Model& model = *m.value();
  auto P = parse_precision(a.get("--dtype"), model);
  if (!P) return fail("draft", P.message());
  if (Status ks = apply_model_flags(a, model, P.value()); !ks) return fail("draft", ks.message());
  const int V = model.config().vocab, d = model.config().hidden, L = int(ids->size());
  for (int32_t id : ids.value())
    if (id < 0 || id >= V) return fail("draft", "token id " + std::to_string(id) + " is outside the vocabulary");
  if (a.has("--generate")) {
    auto n = int_flag(a, "--generate", 16, 1, 1 << 20);
    if (!n) return fail("draft", n.message());
    SamplingParams sp;
    sp.temperature = float(std::atof(a.get("--temperature").c_str()));
    auto k = int_flag(a, "--top-k", 0, 0, V);
    auto seed = int_flag(a, "--seed", 0, 0, INT32_MAX);
    if (!k || !seed) return fail("draft", !k ? k.message() : seed.message());
    sp.top_k = k.value();
    sp.seed = uint64_t(seed.value());
    sp.has_seed = true;
    if (a.has("--without-drafter")) model.set_drafter(nullptr);
    return generate(model, ids.value(), n.value(), P.value(), sp);
  }
  auto from = int_flag(a, "--from", 1, 1, L - 1);
  if (!from) return fail("draft", from.message() + " (--ids needs at least 2 tokens)");
  Drafter& dr = *model.drafter();
  const int K = dr.draft_tokens(), B = dr.config().backbone;
  const int S = L - from.value();
  std::vector<float> logits(size_t(S) * K * V), states(size_t(S) * K * B), scratch(static_cast<size_t>(V));
  const Buf hidden = model.backend().alloc_act(size_t(d));
  auto cache = model.new_cache();
  model.forward({SeqInput{cache.get(), ids->data(), from.value(), false}}, P.value(), scratch.data());
  for (int n = from.value(); n < L; ++n) {
    model.backend().copy(model.normed_rows(), size_t(d), hidden);
    std::vector<int32_t> drafts(static_cast<size_t>(K));
    const size_t k0 = size_t(n - from.value()) * K;
    dr.draft(*cache, hidden, (*ids)[size_t(n)], K, P.value(), drafts.data(), logits.data() + k0 * V,
             states.data() + k0 * B);
    std::printf("{\"n\": %d, \"drafts\": %s}\n", n, json_ids(drafts).c_str());
    if (n + 1 < L) model.forward({SeqInput{cache.get(), ids->data() + n, 1, false}}, P.value(), scratch.data());
  }
  model.backend().free(hidden);
  for (auto [flag, data, cols] : {std::tuple{"--logits-out", &logits, V}, std::tuple{"--states-out", &states, B}}) {
    if (!a.has(flag)) continue;
    Status st = write_npy(a.get(flag), data->data(), size_t(S) * K, size_t(cols));
    if (!st) return fail("draft", st.message());
  }
  return 0;
}

}  // namespace
G4_COMMAND("draft", "speculative-decoding check: drafter proposals per position, or engine decoding with a drafter",
           cmd_draft);
}  // namespace g4::cli
