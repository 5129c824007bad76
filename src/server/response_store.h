// The responses a server keeps for `previous_response_id` and GET / DELETE /v1/responses/{id}
// (OpenAI's Responses API, responses_api.cpp), within the server's lifetime: each one's
// conversation in chat-completions form (every turn's input messages and the assistant's answers;
// not the instructions, which OpenAI does not carry over) and the response object. Bounded: past
// kMaxEntries the oldest go first. Thread-safe.
#pragma once
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/api_types.h"

namespace g4::server {

class ResponseStore {
 public:
  static constexpr size_t kMaxEntries = 512;
  struct Entry {
    ojson messages;  // chat-completions messages, ready to precede the next turn's input
    ojson response;  // the response object as last sent
  };
  void put(const std::string& id, Entry e) {
    std::lock_guard<std::mutex> lk(mu_);
    if (map_.insert_or_assign(id, std::move(e)).second) order_.push_back(id);
    while (map_.size() > kMaxEntries && !order_.empty()) {
      map_.erase(order_.front());
      order_.pop_front();
    }
  }
  std::optional<Entry> get(const std::string& id) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(id);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  bool erase(const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    return map_.erase(id) > 0;  // its id stays in order_ until it ages out (erase of nothing)
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> map_;
  std::deque<std::string> order_;
};

}  // namespace g4::server
