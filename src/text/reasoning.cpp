#include "text/reasoning.h"

#include <algorithm>

#include "text/stop_strings.h"

namespace g4 {

ReasoningSplitter::ReasoningSplitter(Options o)
    : o_(std::move(o)), state_(o_.start_in_reasoning ? State::kReasoning : State::kContent) {}

void ReasoningSplitter::emit(std::vector<ReasoningEvent>& out, ReasoningEvent::Kind k,
                             std::string_view t) {
  if (t.empty()) return;
  if (!out.empty() && out.back().kind == k) {
    out.back().text.append(t);
  } else {
    out.push_back({k, std::string(t)});
  }
}

std::vector<ReasoningEvent> ReasoningSplitter::feed(std::string_view piece) {
  std::vector<ReasoningEvent> out;
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);
  std::string_view rest(buf);
  const bool tools = !o_.tool_call_open.empty() && !o_.tool_call_close.empty();
  while (true) {
    if (state_ == State::kAfterOpen) {
      if (rest.empty()) break;  // wait for the next character
      if (o_.drop_newline_after_open && rest[0] == '\n') rest.remove_prefix(1);
      state_ = State::kReasoning;
      continue;
    }
    if (state_ == State::kInTool) {  // inside a tool call: content until its close marker
      size_t p = rest.find(o_.tool_call_close);
      if (p == std::string_view::npos) {
        size_t hold = marker_prefix_at_end(rest, o_.tool_call_close);
        emit(out, ReasoningEvent::kContent, rest.substr(0, rest.size() - hold));
        held_ = std::string(rest.substr(rest.size() - hold));
        break;
      }
      size_t n = p + o_.tool_call_close.size();
      emit(out, ReasoningEvent::kContent, rest.substr(0, n));
      rest.remove_prefix(n);
      state_ = State::kContent;
      continue;
    }
    if (state_ == State::kContent) {
      size_t p = rest.find(o_.open);
      size_t pt = tools ? rest.find(o_.tool_call_open) : std::string_view::npos;
      if (p == std::string_view::npos && pt == std::string_view::npos) {
        size_t hold = marker_prefix_at_end(rest, o_.open);
        if (tools) hold = std::max(hold, marker_prefix_at_end(rest, o_.tool_call_open));
        emit(out, ReasoningEvent::kContent, rest.substr(0, rest.size() - hold));
        held_ = std::string(rest.substr(rest.size() - hold));
        break;
      }
      if (pt < p) {  // a tool call starts: pass it through untouched
        size_t n = pt + o_.tool_call_open.size();
        emit(out, ReasoningEvent::kContent, rest.substr(0, n));
        rest.remove_prefix(n);
        state_ = State::kInTool;
        continue;
      }
      emit(out, ReasoningEvent::kContent, rest.substr(0, p));
      rest.remove_prefix(p + o_.open.size());
      saw_open_ = true;
      state_ = State::kAfterOpen;
      continue;
    }
    // kReasoning: look for the close marker, or a tool call that ends the channel.
    size_t pc = rest.find(o_.close);
    size_t pt = tools ? rest.find(o_.tool_call_open) : std::string_view::npos;
    if (pc == std::string_view::npos && pt == std::string_view::npos) {
      size_t hold = marker_prefix_at_end(rest, o_.close);
      if (tools) hold = std::max(hold, marker_prefix_at_end(rest, o_.tool_call_open));
      emit(out, ReasoningEvent::kReasoning, rest.substr(0, rest.size() - hold));
      held_ = std::string(rest.substr(rest.size() - hold));
      break;
    }
    state_ = State::kContent;
    if (pt < pc) {  // "<|tool_call>" inside reasoning: close the channel, keep the marker text
      emit(out, ReasoningEvent::kReasoning, rest.substr(0, pt));
      rest.remove_prefix(pt);
      size_t n = o_.tool_call_open.size();
      emit(out, ReasoningEvent::kContent, rest.substr(0, n));
      rest.remove_prefix(n);
      state_ = State::kInTool;
    } else {
      emit(out, ReasoningEvent::kReasoning, rest.substr(0, pc));
      rest.remove_prefix(pc + o_.close.size());
    }
  }
  return out;
}

std::vector<ReasoningEvent> ReasoningSplitter::finish() {
  std::vector<ReasoningEvent> out;
  if (state_ == State::kAfterOpen) state_ = State::kReasoning;
  const bool content = state_ == State::kContent || state_ == State::kInTool;
  emit(out, content ? ReasoningEvent::kContent : ReasoningEvent::kReasoning,
       held_);
  held_.clear();
  return out;
}

bool prompt_opens_reasoning(std::string_view prompt, std::string_view open,
                            std::string_view close) {
  size_t o = prompt.rfind(open);
  if (o == std::string_view::npos) return false;
  size_t c = prompt.rfind(close);
  return c == std::string_view::npos || c < o;
}

}  // namespace g4
