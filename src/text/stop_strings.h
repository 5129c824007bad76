// Stop conditions for generation: stop token ids and stop strings on the streamed text.
//
// Stop strings are matched on the decoded TEXT (not token ids), so a stop string may span any
// number of token boundaries. Text that could still be the beginning of a stop string is held
// back until it either completes the stop string (then it is never emitted, and nothing after it
// is) or can no longer match (then it is released). The emitted text is exactly the generated
// text up to, not including, the earliest stop string (OpenAI `stop` semantics).
#pragma once
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace g4 {

// Length of the longest proper prefix of `marker` that is a suffix of `text` (0 if none):
// how much of `text` must be held back because it may be the start of `marker`.
size_t marker_prefix_at_end(std::string_view text, std::string_view marker);

// Token ids that end generation (Gemma 4: config eos_token_id [1, 106], the IT
// generation_config adds 50 `<|tool_response>`). The stop token itself is not emitted.
class StopTokenSet {
 public:
  StopTokenSet() = default;
  explicit StopTokenSet(const std::vector<int>& ids) : ids_(ids.begin(), ids.end()) {}
  void add(int id) { ids_.insert(id); }
  bool contains(int id) const { return ids_.count(id) != 0; }
  bool empty() const { return ids_.empty(); }
  size_t size() const { return ids_.size(); }

 private:
  std::unordered_set<int> ids_;
};

// Incremental stop-string matcher for one stream. Empty stop strings are ignored.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops = {});

  struct Result {
    std::string text;     // safe to emit now
    bool stopped = false;  // a stop string completed: generation must end
    int which = -1;        // index (into the constructor's list) of the stop string that matched
  };
  // Feeds newly decoded text. After a stop, further calls return empty results with stopped set.
  Result feed(std::string_view piece);
  // End of generation for another reason (EOS token, length): returns the held-back text.
  std::string flush();

  bool stopped() const { return stopped_; }
  // The constructor-list index of the stop string that matched (-1 before a stop).
  int which() const { return which_; }
  const std::string& held() const { return held_; }
  bool active() const { return !stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::vector<int> index_;  // position in the caller's list
  std::string held_;
  bool stopped_ = false;
  int which_ = -1;
};

}  // namespace g4
