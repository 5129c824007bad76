#include "text/stop_strings.h"

#include <algorithm>

namespace g4 {

size_t marker_prefix_at_end(std::string_view text, std::string_view marker) {
  if (marker.empty()) return 0;
  size_t n = std::min(text.size(), marker.size() - 1);
  for (; n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) continue;
    stops_.push_back(std::move(stops[i]));
    index_.push_back(int(i));
  }
}

StopStringMatcher::Result StopStringMatcher::feed(std::string_view piece) {
  Result r;
  if (stopped_) {
    r.stopped = true;
    r.which = which_;
    return r;
  }
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);
  // Earliest complete match. The held prefix contained no complete match, so any match ends
  // in the new piece; searching the whole (short) buffer is simplest.
  size_t best = std::string::npos;
  int best_i = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    size_t p = buf.find(stops_[i]);
    if (p != std::string::npos && (best == std::string::npos || p < best)) {
      best = p;
      best_i = int(i);
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    which_ = index_[best_i];
    r.text = buf.substr(0, best);
    r.stopped = true;
    r.which = which_;
    return r;
  }
  size_t hold = 0;
  for (auto& s : stops_) hold = std::max(hold, marker_prefix_at_end(buf, s));
  held_ = buf.substr(buf.size() - hold);
  buf.resize(buf.size() - hold);
  r.text = std::move(buf);
  return r;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace g4
