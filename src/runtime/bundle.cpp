#include "runtime/bundle.h"

#include <filesystem>

#include "parallel/tp_model.h"
#include "io/gguf.h"
#include "io/model_dir.h"
#include "text/tokenizer_gguf.h"

namespace g4 {
namespace fs = std::filesystem;

Result<std::optional<ChatTemplate>> gguf_chat_template(const GgufFile& f, const Tokenizer& tok,
                                                       ChatRenderOptions* tokens) {
  if (tokens) {
    if (tok.bos_id() >= 0) tokens->bos_token = tok.token_text(tok.bos_id());
    if (tok.eos_id() >= 0) tokens->eos_token = tok.token_text(tok.eos_id());
  }
  if (!f.has("tokenizer.chat_template")) return std::optional<ChatTemplate>();
  G4_ASSIGN_OR_RETURN(std::string_view tpl, f.get_string("tokenizer.chat_template"));
  G4_ASSIGN_OR_RETURN(ChatTemplate ct, ChatTemplate::from_string(std::string(tpl), f.path() + ": tokenizer.chat_template"));
  return std::optional<ChatTemplate>(std::move(ct));
}

Result<ModelBundle> load_bundle(const std::string& path_in, const std::string& backend,
                                void (*progress)(const std::string&), const BackendOptions& opt) {
  auto say = [&](const std::string& m) { if (progress) progress(m); };
  G4_ASSIGN_OR_RETURN(std::string path, resolve_model_path(path_in));
  say("opening " + path);
  G4_ASSIGN_OR_RETURN(OpenedModel om, open_model(path));
  ModelBundle b;
  b.path = om.path;
  b.format = om.format;
  b.name = fs::path(om.path).filename().string();
  if (om.gguf) {
    say("reading vocabulary");
    G4_ASSIGN_OR_RETURN(GgufVocab v, read_gguf_vocab(*om.gguf));
    G4_ASSIGN_OR_RETURN(Tokenizer t, Tokenizer::from_gguf_vocab(v));
    b.tokenizer = std::make_shared<Tokenizer>(std::move(t));
    G4_ASSIGN_OR_RETURN(b.chat_template, gguf_chat_template(*om.gguf, *b.tokenizer, nullptr));
  } else {
    const std::string tj = (fs::path(om.path) / "tokenizer.json").string();
    if (!fs::exists(tj)) return err("%s: no tokenizer.json in the model directory", om.path.c_str());
    say("reading tokenizer.json");
    G4_ASSIGN_OR_RETURN(Tokenizer t, Tokenizer::from_file(tj));
    b.tokenizer = std::make_shared<Tokenizer>(std::move(t));
    auto ct = ChatTemplate::from_model_dir(om.path, &b.render_defaults);
    if (ct) b.chat_template = std::move(ct).value();
  }
  const Tokenizer& tok = *b.tokenizer;
  if (tok.bos_id() >= 0) b.render_defaults.bos_token = tok.token_text(tok.bos_id());
  if (tok.eos_id() >= 0) b.render_defaults.eos_token = tok.token_text(tok.eos_id());
  // Stop ids: config/generation_config eos, the tokenizer's eos, and the end-of-turn marker.
  auto add_stop = [&](int id) {
    if (id >= 0 && std::find(b.stop_ids.begin(), b.stop_ids.end(), id) == b.stop_ids.end())
      b.stop_ids.push_back(id);
  };
  for (int id : om.config.eos_ids) add_stop(id);
  add_stop(tok.eos_id());
  add_stop(tok.id_of("<turn|>"));
  add_stop(tok.id_of("<end_of_turn>"));
  say("loading weights");
  G4_ASSIGN_OR_RETURN(b.model, build_model_ranks(om, backend, opt));
  if (tok.vocab_size() > b.model->config().vocab)
    return err("%s: tokenizer has %d tokens but the model's vocabulary is %d", path.c_str(),
               tok.vocab_size(), b.model->config().vocab);
  if (om.format == "safetensors") {
    G4_ASSIGN_OR_RETURN(b.vision, VisionEncoder::load_if_present(om.path, b.model->backend()));
    if (b.vision) say("vision encoder: " + std::to_string(b.vision->config().layers) + " layers");
  }
  return b;
}

std::vector<int32_t> encode_raw_prompt(const ModelBundle& b, const std::string& text) {
  const Tokenizer& t = *b.tokenizer;
  std::vector<int> ids = t.encode(text, false, false);
  std::vector<int32_t> out;
  if (t.bos_id() >= 0) out.push_back(t.bos_id());  // Gemma always starts with <bos>
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

std::vector<int32_t> encode_chat_prompt(const ModelBundle& b, const std::string& rendered) {
  std::vector<int> ids = b.tokenizer->encode(rendered, true, false);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

}  // namespace g4
