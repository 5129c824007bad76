#include "runtime/text_stream.h"

namespace g4 {

const std::string& TextStream::stopped_by() const {
  static const std::string none;
  const int i = stop_.which();
  return i >= 0 && size_t(i) < opt_.stop_strings.size() ? opt_.stop_strings[size_t(i)] : none;
}

TextStream::TextStream(const Tokenizer& tok, TextStreamOptions opt)
    : opt_(std::move(opt)),
      detok_(tok, false),
      stop_(opt_.stop_strings),
      reasoning_([&] {
        ReasoningSplitter::Options o;
        o.start_in_reasoning = opt_.reasoning_open_in_prompt;
        return o;
      }()) {}

void TextStream::content(const std::string& text, bool final, std::vector<TextEvent>& out) {
  if (!opt_.parse_tool_calls) {
    if (!text.empty()) out.push_back({TextEvent::kContent, text, {}});
    return;
  }
  auto evs = tools_.feed(text);
  if (final) {
    auto rest = tools_.finish();
    evs.insert(evs.end(), rest.begin(), rest.end());
  }
  for (auto& e : evs) {
    if (e.kind == ToolCallEvent::kText) {
      out.push_back({TextEvent::kContent, std::move(e.text), {}});
    } else {
      out.push_back({TextEvent::kToolCall, {}, std::move(e.call)});
    }
  }
}

void TextStream::route(const std::string& text, bool final, std::vector<TextEvent>& out) {
  if (!opt_.split_reasoning) {
    content(text, final, out);
    return;
  }
  auto evs = reasoning_.feed(text);
  if (final) {
    auto rest = reasoning_.finish();
    evs.insert(evs.end(), rest.begin(), rest.end());
  }
  std::string answer;
  for (auto& e : evs) {
    if (e.kind == ReasoningEvent::kReasoning) {
      if (!answer.empty()) content(std::exchange(answer, {}), false, out);
      out.push_back({TextEvent::kReasoning, std::move(e.text), {}});
    } else {
      answer += e.text;
    }
  }
  content(answer, final, out);
}

std::vector<TextEvent> TextStream::push(int token) {
  std::vector<TextEvent> out;
  if (stop_.stopped()) return out;
  std::string piece = detok_.push(token);
  if (piece.empty()) return out;
  if (stop_.active()) {
    auto r = stop_.feed(piece);
    route(r.text, r.stopped, out);
  } else {
    route(piece, false, out);
  }
  return out;
}

std::vector<TextEvent> TextStream::finish() {
  std::vector<TextEvent> out;
  if (stop_.stopped()) return out;
  std::string rest = detok_.finish();
  if (stop_.active()) {
    auto r = stop_.feed(rest);
    rest = r.text;
    if (!r.stopped) rest += stop_.flush();
  }
  route(rest, true, out);
  return out;
}

}  // namespace g4
