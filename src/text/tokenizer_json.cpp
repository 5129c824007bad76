// Loading a Hugging Face tokenizer.json (tokenizers' serialization) into Tokenizer::Impl.
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/tokenizer_impl.h"

namespace g4 {

namespace {

using json = nlohmann::json;

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return err("%s: cannot open", path.c_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (!f && !f.eof()) return err("%s: read error", path.c_str());
  return ss.str();
}

// A tokenizers `Pattern`: {"String": "..."}; {"Regex": ...} is not supported.
Result<std::string> literal_pattern(const json& p, const std::string& where) {
  if (p.is_object() && p.contains("String") && p["String"].is_string()) return p["String"].get<std::string>();
  if (p.is_object() && p.contains("Regex"))
    return err("%s: Regex patterns are not supported (only String)", where.c_str());
  return err("%s: pattern must be {\"String\": ...}", where.c_str());
}

Status parse_normalizer(const json& n, const std::string& where, std::vector<tok::NormOp>& ops) {
  if (n.is_null()) return Status::ok();
  if (!n.is_object() || !n.contains("type")) return err("%s: expected an object with a type", where.c_str());
  const std::string type = n["type"].get<std::string>();
  if (type == "Sequence") {
    const json& list = n.value("normalizers", json::array());
    for (size_t i = 0; i < list.size(); ++i)
      G4_TRY(parse_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]", ops));
    return Status::ok();
  }
  if (type == "Replace") {
    G4_ASSIGN_OR_RETURN(std::string pat, literal_pattern(n.value("pattern", json()), where + ".pattern"));
    ops.push_back({tok::NormOp::kReplace, pat, n.value("content", std::string())});
    return Status::ok();
  }
  if (type == "Prepend") {
    ops.push_back({tok::NormOp::kPrepend, "", n.value("prepend", std::string())});
    return Status::ok();
  }
  return err("%s: normalizer type '%s' is not supported", where.c_str(), type.c_str());
}

Status parse_pre_tokenizer(const json& n, const std::string& where, std::vector<tok::SplitOp>& ops) {
  if (n.is_null()) return Status::ok();
  if (!n.is_object() || !n.contains("type")) return err("%s: expected an object with a type", where.c_str());
  const std::string type = n["type"].get<std::string>();
  if (type == "Sequence") {
    const json& list = n.value("pretokenizers", json::array());
    for (size_t i = 0; i < list.size(); ++i)
      G4_TRY(parse_pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", ops));
    return Status::ok();
  }
  if (type == "Split") {
    G4_ASSIGN_OR_RETURN(std::string pat, literal_pattern(n.value("pattern", json()), where + ".pattern"));
    if (n.value("invert", false)) return err("%s: Split with invert=true is not supported", where.c_str());
    const std::string b = n.value("behavior", std::string("Isolated"));
    using B = tok::SplitOp::Behavior;
    B beh;
    if (b == "Removed") beh = B::kRemoved;
    else if (b == "Isolated") beh = B::kIsolated;
    else if (b == "MergedWithPrevious") beh = B::kMergedWithPrevious;
    else if (b == "MergedWithNext") beh = B::kMergedWithNext;
    else if (b == "Contiguous") beh = B::kContiguous;
    else return err("%s: Split behavior '%s' is not supported", where.c_str(), b.c_str());
    ops.push_back({beh, pat});
    return Status::ok();
  }
  return err("%s: pre_tokenizer type '%s' is not supported", where.c_str(), type.c_str());
}

struct DecoderSpec {
  std::vector<std::pair<std::string, std::string>> replaces;  // applied to each token's text
  bool byte_fallback = false;
  bool after_fallback = false;  // a step after ByteFallback/Fuse was seen
};

Status parse_decoder(const json& n, const std::string& where, DecoderSpec& d) {
  if (n.is_null()) return err("%s: a tokenizer without a decoder is not supported", where.c_str());
  if (!n.is_object() || !n.contains("type")) return err("%s: expected an object with a type", where.c_str());
  const std::string type = n["type"].get<std::string>();
  if (type == "Sequence") {
    const json& list = n.value("decoders", json::array());
    for (size_t i = 0; i < list.size(); ++i)
      G4_TRY(parse_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]", d));
    return Status::ok();
  }
  if (type == "Replace") {
    if (d.after_fallback)
      return err("%s: Replace after ByteFallback/Fuse is not supported", where.c_str());
    G4_ASSIGN_OR_RETURN(std::string pat, literal_pattern(n.value("pattern", json()), where + ".pattern"));
    d.replaces.emplace_back(pat, n.value("content", std::string()));
    return Status::ok();
  }
  if (type == "ByteFallback") {
    d.byte_fallback = true;
    d.after_fallback = true;
    return Status::ok();
  }
  if (type == "Fuse") {  // decode() concatenates anyway
    d.after_fallback = true;
    return Status::ok();
  }
  return err("%s: decoder type '%s' is not supported", where.c_str(), type.c_str());
}

// Text of a token given in tokenizer_config.json: "<bos>" or {"content": "<bos>", ...}.
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return {};
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}


// model.vocab and model.merges, read straight from the SAX stream: building them as a DOM
// (a std::map of 262k keys, 500k small arrays) would dominate load time.
struct ModelTables {
  bool vocab_seen = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  bool merges_seen = false;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;  // first malformed entry
};

// SAX handler: a DOM for everything except model.vocab / model.merges (mirrors
// nlohmann::detail::json_sax_dom_parser for the DOM part).
class TokenizerSax : public nlohmann::json_sax<json> {
 public:
  TokenizerSax(json& root, ModelTables& t) : root_(root), t_(t) {}

  bool null() override { return scalar(json(nullptr)); }
  bool boolean(bool v) override { return scalar(json(v)); }
  bool number_integer(int64_t v) override { return number(v, json(v)); }
  bool number_unsigned(uint64_t v) override {
    return number(v > uint64_t(INT64_MAX) ? -1 : int64_t(v), json(v));
  }
  bool number_float(double v, const std::string&) override { return scalar(json(v)); }
  bool string(std::string& v) override {
    if (mode_ == kVocab) return bad_vocab();
    if (mode_ == kMerges) {
      size_t sp = v.find(' ', 1);
      if (sp == std::string::npos) {
        fail("model.merges[" + std::to_string(t_.merges.size()) + "] '" + v + "' has no space");
        t_.merges.emplace_back();
      } else {
        t_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      }
      return true;
    }
    if (mode_ == kPair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return scalar(json(std::move(v)));
  }
  bool binary(json::binary_t& v) override { return scalar(json(v)); }
  bool start_object(std::size_t) override {
    if (mode_ == kNone && in_model() && key_ == "vocab") {
      mode_ = kVocab;
      t_.vocab_seen = true;
      return true;
    }
    if (mode_ != kNone) return bad_entry();
    open(json::object());
    return true;
  }
  bool key(std::string& k) override {
    key_ = k;
    return true;
  }
  bool end_object() override {
    if (mode_ == kVocab) {
      mode_ = kNone;
      return true;
    }
    close();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == kNone && in_model() && key_ == "merges") {
      mode_ = kMerges;
      t_.merges_seen = true;
      return true;
    }
    if (mode_ == kMerges) {
      mode_ = kPair;
      pair_.clear();
      return true;
    }
    if (mode_ != kNone) return bad_entry();
    open(json::array());
    return true;
  }
  bool end_array() override {
    if (mode_ == kPair) {
      if (pair_.size() != 2) {
        fail("model.merges[" + std::to_string(t_.merges.size()) + "] is neither [a, b] nor \"a b\"");
        t_.merges.emplace_back();
      } else {
        t_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      }
      mode_ = kMerges;
      return true;
    }
    if (mode_ == kMerges) {
      mode_ = kNone;
      return true;
    }
    close();
    return true;
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    parse_error_ = "byte " + std::to_string(pos) + ": " + e.what();
    return false;
  }
  const std::string& parse_error_message() const { return parse_error_; }

 private:
  enum Mode { kNone, kVocab, kMerges, kPair };
  bool in_model() const { return path_.size() == 2 && path_[1] == "model"; }
  void fail(const std::string& msg) {
    if (t_.error.empty()) t_.error = msg;
  }
  bool bad_vocab() {
    fail("model.vocab['" + key_ + "'] is not a non-negative integer");
    return true;
  }
  bool bad_entry() {  // a container inside vocab / merges: stop with an error
    fail(mode_ == kVocab ? "model.vocab['" + key_ + "'] is not a non-negative integer"
                         : "model.merges[" + std::to_string(t_.merges.size()) + "] is neither [a, b] nor \"a b\"");
    return false;
  }
  bool number(int64_t v, json j) {
    if (mode_ == kVocab) {
      if (v < 0) return bad_vocab();
      t_.vocab.emplace_back(key_, v);
      return true;
    }
    if (mode_ == kMerges || mode_ == kPair) {
      fail("model.merges[" + std::to_string(t_.merges.size()) + "] is neither [a, b] nor \"a b\"");
      return true;
    }
    return scalar(std::move(j));
  }
  bool scalar(json v) {
    if (mode_ == kVocab) return bad_vocab();
    if (mode_ != kNone) {
      fail("model.merges[" + std::to_string(t_.merges.size()) + "] is neither [a, b] nor \"a b\"");
      return true;
    }
    insert(std::move(v));
    return true;
  }
  json* insert(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  void open(json v) {
    bool parent_is_object = !stack_.empty() && stack_.back()->is_object();
    path_.push_back(parent_is_object ? key_ : std::string());
    stack_.push_back(insert(std::move(v)));
  }
  void close() {
    stack_.pop_back();
    path_.pop_back();
  }

  json& root_;
  ModelTables& t_;
  std::vector<json*> stack_;
  std::vector<std::string> path_;  // key of each open container ("" for array elements / root)
  std::string key_;
  Mode mode_ = kNone;
  std::vector<std::string> pair_;
  std::string parse_error_;
};

Result<json> parse_tokenizer_json(std::string_view text, const std::string& name, ModelTables& t) {
  json root;
  TokenizerSax sax(root, t);
  bool ok = json::sax_parse(text.begin(), text.end(), &sax);
  if (!ok && !t.error.empty()) return err("%s: %s", name.c_str(), t.error.c_str());
  if (!ok) return err("%s: not valid JSON (%s)", name.c_str(), sax.parse_error_message().c_str());
  return root;
}

Result<std::shared_ptr<Tokenizer::Impl>> load_json(const json& j, ModelTables& tables, const std::string& name,
                                                   const json& cfg) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  Tokenizer::Impl& m = *impl;
  const char* nm = name.c_str();
  if (!j.is_object()) return err("%s: top level is not an object", nm);
  if (!j.contains("model") || !j["model"].is_object()) return err("%s: missing field 'model'", nm);
  const json& model = j["model"];
  const std::string mtype = model.value("type", std::string("BPE"));
  if (mtype != "BPE") return err("%s: model.type '%s' is not supported (only BPE)", nm, mtype.c_str());
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
      return err("%s: model.%s is not supported", nm, k);
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
    return err("%s: model.dropout is not supported", nm);
  m.model = Tokenizer::Impl::Model::kBpe;
  m.byte_fallback = model.value("byte_fallback", false);
  m.fuse_unk = model.value("fuse_unk", false);
  m.ignore_merges = model.value("ignore_merges", false);

  // Vocabulary: model.vocab plus added tokens (which may extend it).
  if (!tables.error.empty()) return err("%s: %s", nm, tables.error.c_str());
  if (!tables.vocab_seen) return err("%s: model.vocab missing (or not an object)", nm);
  const json& added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : json::array();
  int64_t max_id = -1;
  for (const auto& [tok_text, id] : tables.vocab) max_id = std::max(max_id, id);
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
        !a.contains("content") || !a["content"].is_string())
      return err("%s: added_tokens[%zu] needs an integer id and a string content", nm, i);
    max_id = std::max(max_id, a["id"].get<int64_t>());
  }
  if (max_id >= (int64_t(1) << 30)) return err("%s: token id %lld is too large", nm, (long long)max_id);
  m.tokens.assign(size_t(max_id + 1), std::string());
  for (auto& [tok_text, id] : tables.vocab) m.tokens[size_t(id)] = std::move(tok_text);
  m.flags.assign(m.tokens.size(), 0);

  // Normalizer / pre-tokenizer / decoder.
  G4_TRY(parse_normalizer(j.value("normalizer", json()), name + ": normalizer", m.normalizer));
  G4_TRY(parse_pre_tokenizer(j.value("pre_tokenizer", json()), name + ": pre_tokenizer", m.pre_tokenizer));
  DecoderSpec dec;
  G4_TRY(parse_decoder(j.value("decoder", json()), name + ": decoder", dec));

  struct Added { int id; std::string content; bool normalized; };
  std::vector<Added> added_list;
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    int id = int(a["id"].get<int64_t>());
    std::string content = a["content"].get<std::string>();
    bool special = a.value("special", false);
    // tokenizers' default: normalized = !special.
    bool normalized = a.contains("normalized") && a["normalized"].is_boolean() ? a["normalized"].get<bool>() : !special;
    m.tokens[id] = content;
    m.flags[id] |= tok::kFlagAdded | (special ? tok::kFlagSpecial : 0);
    added_list.push_back({id, std::move(content), normalized});
  }

  // Decoded pieces.
  m.decode_byte_fallback = dec.byte_fallback;
  m.pieces = m.tokens;
  for (auto& p : m.pieces)
    for (auto& [pat, with] : dec.replaces) {
      if (pat.empty()) continue;
      std::string out;
      size_t from = 0;
      for (size_t pos = p.find(pat); pos != std::string::npos; pos = p.find(pat, from)) {
        out.append(p, from, pos - from);
        out += with;
        from = pos + pat.size();
      }
      out.append(p, from, std::string::npos);
      p.swap(out);
    }
  m.finish_vocab();

  // Added-token matchers. A normalized token is matched on normalized text, so its content is
  // normalized first (AddedVocabulary::refresh_added_tokens).
  for (auto& a : added_list) {
    if (!a.normalized) {
      m.raw_added.add(a.content, a.id);
      continue;
    }
    std::string c = a.content;
    for (const auto& op : m.normalizer) {
      if (op.kind == tok::NormOp::kReplace) {
        std::string out;
        size_t from = 0;
        for (size_t pos = c.find(op.pattern); !op.pattern.empty() && pos != std::string::npos;
             pos = c.find(op.pattern, from)) {
          out.append(c, from, pos - from);
          out += op.content;
          from = pos + op.pattern.size();
        }
        out.append(c, from, std::string::npos);
        c.swap(out);
      } else if (!c.empty()) {
        c.insert(0, op.content);
      }
    }
    m.norm_added.add(c, a.id);
  }

  // Merges: [["a","b"], ...] or ["a b", ...]; rank = position.
  m.merges.reserve(tables.merges.size());
  std::string joined;
  for (size_t r = 0; r < tables.merges.size(); ++r) {
    const auto& [a, b] = tables.merges[r];
    joined.assign(a).append(b);
    int ia = m.index.find(a), ib = m.index.find(b), im = m.index.find(joined);
    if (ia < 0 || ib < 0) return err("%s: model.merges[%zu] uses a token missing from the vocab", nm, r);
    if (im < 0) return err("%s: model.merges[%zu] merges into a token missing from the vocab", nm, r);
    m.merges.insert(ia, ib, uint32_t(r), im);
  }

  // Special ids.
  if (model.contains("unk_token") && model["unk_token"].is_string())
    m.unk = m.index.find(model["unk_token"].get<std::string>());
  auto pick = [&](const char* key, std::initializer_list<const char*> defaults) {
    std::string t = config_token(cfg, key);
    if (!t.empty()) return m.index.find(t);
    for (const char* d : defaults)
      if (int id = m.index.find(d); id >= 0) return id;
    return -1;
  };
  m.bos = pick("bos_token", {"<bos>", "<s>"});
  m.eos = pick("eos_token", {"<eos>", "</s>"});
  m.pad = pick("pad_token", {"<pad>"});
  if (int u = pick("unk_token", {}); u >= 0) m.unk = u;
  // BOS from the post-processor (TemplateProcessing whose "single" starts with a special token).
  std::function<void(const json&)> scan_post = [&](const json& p) {
    if (!p.is_object()) return;
    std::string t = p.value("type", std::string());
    if (t == "Sequence") {
      for (const auto& q : p.value("processors", json::array())) scan_post(q);
    } else if (t == "TemplateProcessing" && p.contains("single") && p["single"].is_array() &&
               !p["single"].empty() && p["single"][0].contains("SpecialToken")) {
      std::string tokname = p["single"][0]["SpecialToken"].value("id", std::string());
      int id = m.index.find(tokname);
      if (id >= 0 && id == m.bos) m.wants_bos = true;
    }
  };
  scan_post(j.value("post_processor", json()));
  if (cfg.is_object() && cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
    m.wants_bos = cfg["add_bos_token"].get<bool>();
  return impl;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json(std::string_view text, const std::string& name) {
  ModelTables tables;
  G4_ASSIGN_OR_RETURN(json j, parse_tokenizer_json(text, name, tables));
  try {
    G4_ASSIGN_OR_RETURN(auto impl, load_json(j, tables, name, json()));
    return Tokenizer(std::shared_ptr<const Impl>(std::move(impl)));
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    return err("%s: %s", name.c_str(), e.what());
  }
}

Result<Tokenizer> Tokenizer::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "tokenizer.json").string();
  if (!fs::exists(file, ec)) return err("%s: no tokenizer.json", file.c_str());
  G4_ASSIGN_OR_RETURN(std::string text, read_file(file));
  json cfg;
  fs::path cfg_path = fs::path(file).parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path, ec)) {
    auto c = read_file(cfg_path.string());
    if (c.is_ok()) {
      cfg = json::parse(c.value(), nullptr, false);
      if (cfg.is_discarded()) return err("%s: not valid JSON", cfg_path.string().c_str());
    }
  }
  ModelTables tables;
  G4_ASSIGN_OR_RETURN(json j, parse_tokenizer_json(text, file, tables));
  text = std::string();  // free the file text before building the tables
  try {
    G4_ASSIGN_OR_RETURN(auto impl, load_json(j, tables, file, cfg));
    return Tokenizer(std::shared_ptr<const Impl>(std::move(impl)));
  } catch (const json::exception& e) {
    return err("%s: %s", file.c_str(), e.what());
  }
}

}  // namespace g4
