#include "train/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/json_bounded.h"

namespace g4::train {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

enum class Format { Completions, Chat, Text };

Result<std::vector<int32_t>> render_tokens(const ModelBundle& b, const ojson& messages, const ojson& tools,
                                           bool add_generation_prompt, bool thinking, const std::string& where) {
  ChatRenderOptions o = b.render_defaults;
  o.add_generation_prompt = add_generation_prompt;
  o.enable_thinking = thinking;
  auto text = b.chat_template->render(messages, tools, o);
  if (!text.is_ok()) return err("%s: chat template: %s", where.c_str(), text.message().c_str());
  return encode_chat_prompt(b, text.value());
}

Result<Example> chat_example(const ModelBundle& b, const ojson& messages, const ojson& tools, bool mask_prompt,
                             bool gen_prompt_for_prefix, bool thinking, const std::string& where) {
  Example ex;
  G4_ASSIGN_OR_RETURN(ex.tokens, render_tokens(b, messages, tools, false, thinking, where));
  if (mask_prompt) {
    ojson head = ojson::array();
    for (size_t i = 0; i + 1 < messages.size(); ++i) head.push_back(messages[i]);
    G4_ASSIGN_OR_RETURN(auto prefix, render_tokens(b, head, tools, gen_prompt_for_prefix, thinking, where));
    ex.offset = int(prefix.size());
  }
  return ex;
}

}  // namespace

bool vocabulary_has_thinking(const Tokenizer& t) {
  static const char* const kPairs[][2] = {{"<think>", "</think>"},
                                          {"<longcat_think>", "</longcat_think>"},
                                          {"<|think:start|>", "<|think:end|>"},
                                          {"<|channel>", "<channel|>"}};
  for (const auto& p : kPairs)
    if (t.id_of(p[0]) >= 0 && t.id_of(p[1]) >= 0) return true;
  for (const char* x : {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"})
    if (t.id_of(x) < 0) return false;
  return true;
}

Result<Dataset> load_jsonl(const std::string& path, const ModelBundle& b, const DatasetOptions& opt) {
  Dataset d;
  d.path = path;
  if (!fs::exists(path)) return d;
  std::ifstream f(path);
  if (!f) return err("%s: cannot read", path.c_str());
  std::string line;
  int lineno = 0;
  Format fmt = Format::Text;
  bool first = true;
  const bool thinking = opt.enable_thinking.value_or(vocabulary_has_thinking(*b.tokenizer));
  const int eos = b.tokenizer->eos_id() >= 0 ? b.tokenizer->eos_id()
                                             : (b.model->config().eos_ids.empty() ? -1 : b.model->config().eos_ids[0]);
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    std::string why;
    auto parsed = parse_json_bounded<ojson>(line, kRequestJsonLimits, why);
    if (!parsed) return err("%s: not valid JSON: %s", where.c_str(), why.c_str());
    const ojson rec = std::move(*parsed);
    if (!rec.is_object()) return err("%s: each line must be a JSON object", where.c_str());
    if (first) {  // the format is the first record's, as mlx-lm's create_dataset decides
      if (rec.contains(opt.prompt_feature) && rec.contains(opt.completion_feature)) fmt = Format::Completions;
      else if (rec.contains(opt.chat_feature)) fmt = Format::Chat;
      else if (rec.contains(opt.text_feature)) fmt = Format::Text;
      else
        return err("%s: unsupported data format: expected {\"%s\", \"%s\"}, {\"%s\"} or {\"%s\"} fields",
                   where.c_str(), opt.prompt_feature.c_str(), opt.completion_feature.c_str(), opt.chat_feature.c_str(),
                   opt.text_feature.c_str());
      if (fmt == Format::Text && opt.mask_prompt)
        return err("%s: --mask-prompt needs prompt/completion or chat records (text records have no prompt)",
                   where.c_str());
      if (fmt != Format::Text && !b.chat_template)
        return err("%s: chat and prompt/completion records are rendered through the model's chat template, and "
                   "this model has none (give one with --chat-template, or use {\"text\": ...} records)",
                   where.c_str());
      first = false;
    }
    const ojson tools = rec.contains("tools") ? rec["tools"] : ojson();
    Example ex;
    auto need_string = [&](const std::string& key) -> Status {
      if (!rec.contains(key) || !rec[key].is_string())
        return err("%s: field \"%s\" must be a string", where.c_str(), key.c_str());
      return Status::ok();
    };
    if (fmt == Format::Text) {
      G4_TRY(need_string(opt.text_feature));
      // HF tokenizer.encode(text): special-token strings parsed, BOS when the tokenizer adds one.
      const Tokenizer& tok = *b.tokenizer;
      const std::vector<int> ids = tok.encode(rec[opt.text_feature].get<std::string>(), true, tok.wants_bos());
      ex.tokens.assign(ids.begin(), ids.end());
      if (eos >= 0 && (ex.tokens.empty() || ex.tokens.back() != eos)) ex.tokens.push_back(eos);
    } else if (fmt == Format::Completions) {
      G4_TRY(need_string(opt.prompt_feature));
      G4_TRY(need_string(opt.completion_feature));
      ojson msgs = ojson::array();
      msgs.push_back({{"role", "user"}, {"content", rec[opt.prompt_feature]}});
      msgs.push_back({{"role", "assistant"}, {"content", rec[opt.completion_feature]}});
      G4_ASSIGN_OR_RETURN(ex, chat_example(b, msgs, tools, opt.mask_prompt, true, thinking, where));
    } else {
      if (!rec.contains(opt.chat_feature) || !rec[opt.chat_feature].is_array() || rec[opt.chat_feature].empty())
        return err("%s: field \"%s\" must be a non-empty array of messages", where.c_str(), opt.chat_feature.c_str());
      const ojson& msgs = rec[opt.chat_feature];
      for (const ojson& m : msgs)
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
          return err("%s: every message needs a string \"role\"", where.c_str());
      const bool last_is_assistant = msgs.back()["role"] == "assistant";
      G4_ASSIGN_OR_RETURN(ex, chat_example(b, msgs, tools, opt.mask_prompt, last_is_assistant, thinking, where));
    }
    d.examples.push_back(std::move(ex));
    d.fields.push_back(int(rec.size()));
  }
  return d;
}

uint32_t NumpyLegacyRng::interval(uint32_t max) {
  // numpy random_interval: the smallest all-ones mask >= max, rejection-sample 32-bit draws.
  if (max == 0) return 0;
  uint32_t mask = max;
  for (int s = 1; s < 32; s <<= 1) mask |= mask >> s;
  uint32_t v;
  while ((v = uint32_t(mt_()) & mask) > max) {
  }
  return v;
}

std::vector<int> NumpyLegacyRng::permutation(int n) {
  // RandomState.permutation(n) = shuffle(arange(n)): Fisher-Yates from the end.
  std::vector<int> a(static_cast<size_t>(n));
  std::iota(a.begin(), a.end(), 0);
  for (int i = n - 1; i >= 1; --i) std::swap(a[size_t(i)], a[interval(uint32_t(i))]);
  return a;
}

Result<BatchIterator> BatchIterator::create(const Dataset& d, int batch_size, NumpyLegacyRng* rng, bool loop) {
  if (batch_size < 1) return err("--batch-size %d: must be at least 1", batch_size);
  if (int(d.size()) < batch_size)
    return err("%s: the dataset must have at least batch_size=%d examples but only has %zu", d.path.c_str(),
               batch_size, d.size());
  std::vector<int> idx(d.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int x, int y) { return d.fields[size_t(x)] < d.fields[size_t(y)]; });
  BatchIterator it;
  for (size_t i = 0; i + size_t(batch_size) <= idx.size(); i += size_t(batch_size))
    it.batches_.emplace_back(idx.begin() + long(i), idx.begin() + long(i) + batch_size);
  it.loop_ = loop;
  it.rng_ = rng;
  return it;
}

bool BatchIterator::next(std::vector<int>* batch) {
  if (!started_ || pos_ == order_.size()) {
    if (started_ && !loop_) return false;
    order_ = rng_->permutation(int(batches_.size()));  // drawn when the batch is asked for, as mlx-lm
    pos_ = 0;
    started_ = true;
  }
  *batch = batches_[size_t(order_[pos_++])];
  return true;
}

std::string NumpyLegacyRng::save() const {
  std::ostringstream o;
  o << mt_;
  return o.str();
}

bool NumpyLegacyRng::load(const std::string& state) {
  std::istringstream i(state);
  std::mt19937 mt;
  if (!(i >> mt)) return false;
  mt_ = mt;
  return true;
}

Status BatchIterator::restore(const Position& p) {
  std::vector<int> sorted = p.order;
  std::sort(sorted.begin(), sorted.end());
  bool perm = p.started ? sorted.size() == batches_.size() : sorted.empty();
  for (size_t i = 0; perm && i < sorted.size(); ++i) perm = sorted[i] == int(i);
  if (!perm || p.pos > p.order.size())
    return err("the saved batch order does not fit %zu batches (other data or --batch-size)", batches_.size());
  order_ = p.order;
  pos_ = p.pos;
  started_ = p.started;
  return {};
}

}  // namespace g4::train
