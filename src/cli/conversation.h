// One chat conversation of `gemma4 run`: the messages so far (system prompt first), the images
// that go with the first user message, and the settings /set changes. Without a chat template
// (a base model) each turn completes the system text and the message as raw text.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/chat_session.h"

namespace g4::cli {

class Conversation {
 public:
  Conversation(Session& s, bool chat, std::string system, bool thinking, std::vector<ImageInput> images,
               int max_soft_tokens);
  // Sends `user`, streams the answer to stdout and keeps both in the history; on an error the
  // history stays as it was and the message goes to stderr. Returns 0, or 1 after an error.
  int turn(const std::string& user);
  void reset();                              // back to the system prompt alone
  void set_system(const std::string& text);  // replaces (or, "" removes) the system prompt
  void set_thinking(bool on) { thinking_ = on; }
  // Writes the messages as a JSON file ({"messages": [...]}, as `gemma4 render --messages` reads).
  Status save(const std::string& path) const;
  // Replaces the conversation with a saved one (a JSON list of messages or {"messages": [...]});
  // the error names the file and the message that is not {"role": ..., "content": TEXT}.
  Status load(const std::string& path);

  bool chat() const { return chat_; }
  bool thinking() const { return thinking_; }
  const std::string& system() const { return system_; }
  size_t turns() const;            // user messages so far
  int context_tokens() const;      // tokens the last answer's sequence held (prompt + answer)
  Session& session() { return s_; }

 private:
  Session& s_;
  bool chat_;
  std::string system_;
  bool thinking_;
  std::vector<ImageInput> images_;
  int max_soft_tokens_;
  bool images_sent_ = false;
  nlohmann::ordered_json history_ = nlohmann::ordered_json::array();
  int context_tokens_ = 0;
};

}  // namespace g4::cli
