#include "cli/conversation.h"

#include <cstdio>
#include <fstream>

namespace g4::cli {

Conversation::Conversation(Session& s, bool chat, std::string system, bool thinking, std::vector<ImageInput> images,
                           int max_soft_tokens)
    : s_(s), chat_(chat), system_(std::move(system)), thinking_(thinking), images_(std::move(images)),
      max_soft_tokens_(max_soft_tokens) {
  reset();
}

void Conversation::reset() {
  history_ = nlohmann::ordered_json::array();
  if (!system_.empty()) history_.push_back({{"role", "system"}, {"content", system_}});
  images_sent_ = false;
  context_tokens_ = 0;
}

void Conversation::set_system(const std::string& text) {
  const bool had = !history_.empty() && history_[0]["role"] == "system";
  if (had) history_.erase(history_.begin());
  system_ = text;
  if (!system_.empty()) history_.insert(history_.begin(), {{"role", "system"}, {"content", system_}});
}

size_t Conversation::turns() const {
  size_t n = 0;
  for (const auto& m : history_) n += m["role"] == "user";
  return n;
}

int Conversation::context_tokens() const { return context_tokens_; }

int Conversation::turn(const std::string& user) {
  if (!chat_) {
    std::string prompt = system_.empty() ? user : system_ + "\n\n" + user;
    answer(s_, encode_raw_prompt(s_.b, prompt), false, false);
    if (!s_.failed) context_tokens_ = s_.last.prompt_tokens + s_.last.completion_tokens;
    return s_.failed ? 1 : 0;
  }
  const bool with_images = !images_.empty() && !images_sent_;
  if (with_images) {
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    for (size_t i = 0; i < images_.size(); ++i) parts.push_back({{"type", "image"}});
    parts.push_back({{"type", "text"}, {"text", user}});
    history_.push_back({{"role", "user"}, {"content", parts}});
    images_sent_ = true;
  } else {
    history_.push_back({{"role", "user"}, {"content", user}});
  }
  bool open = false;
  auto ids = chat_prompt(s_, history_, thinking_, &open);
  if (!ids) {
    history_.erase(history_.end() - 1);
    images_sent_ = images_sent_ && !with_images;
    std::fprintf(stderr, "gemma4 run: %s\n", ids.message().c_str());
    return 1;
  }
  std::string reply = answer(s_, ids.value(), true, open, images_sent_ ? images_ : std::vector<ImageInput>{},
                             max_soft_tokens_);
  if (s_.failed) {  // keep the history as it was before this message
    history_.erase(history_.end() - 1);
    // The images travel with the first user message: if that one failed, the next one takes them.
    images_sent_ = images_sent_ && !with_images;
    return 1;
  }
  history_.push_back({{"role", "assistant"}, {"content", reply}});
  context_tokens_ = s_.last.prompt_tokens + s_.last.completion_tokens;
  return 0;
}

Status Conversation::save(const std::string& path) const {
  std::ofstream f(path);
  if (!f) return err("%s: cannot write", path.c_str());
  f << nlohmann::ordered_json{{"messages", history_}}.dump(2) << "\n";
  if (!f.flush()) return err("%s: write failed", path.c_str());
  return Status::ok();
}

Status Conversation::load(const std::string& path) {
  std::ifstream f(path);
  if (!f) return err("%s: cannot read", path.c_str());
  auto j = nlohmann::ordered_json::parse(f, nullptr, false);
  if (j.is_discarded()) return err("%s: not valid JSON", path.c_str());
  if (j.is_object() && j.contains("messages")) j = j["messages"];
  if (!j.is_array()) return err("%s: expected a list of messages or {\"messages\": [...]}", path.c_str());
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& m = j[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      return err("%s: message %zu is not {\"role\": ..., \"content\": TEXT}", path.c_str(), i);
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "assistant")
      return err("%s: message %zu: role '%s' is not system, user or assistant", path.c_str(), i, role.c_str());
  }
  history_ = std::move(j);
  system_ = !history_.empty() && history_[0]["role"] == "system" ? history_[0]["content"].get<std::string>() : "";
  images_sent_ = !images_.empty();  // a loaded conversation does not take the --image files
  context_tokens_ = 0;
  return Status::ok();
}

}  // namespace g4::cli
