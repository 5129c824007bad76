// One log line per HTTP request on stderr: method, path, status, prompt / completion tokens, time
// to first token and total time; as text or as one JSON object per line (--log-format json).
// Verbose lines add the request's own prefill and decode speeds and the engine's load.
//
// The numbers of a request are gathered per thread: the HTTP server runs a request's routing,
// its handler, its streamed body and the log call on one worker thread, so begin_request() (at
// routing), note_tokens() (the generation, as it goes) and log_request() (after the body) meet.
#pragma once
#include <string>

#include "runtime/engine.h"

namespace g4::server {

enum class LogFormat { None, Text, Json };

struct RequestLogOptions {
  LogFormat format = LogFormat::Text;
  bool verbose = false;
};

// Starts the current thread's request: its clock and empty counts.
void begin_request();
// The generation's counts so far (each call replaces the last); the first call with a completion
// token marks the time to first token.
void note_tokens(int prompt_tokens, int cached_tokens, int completion_tokens);
// The line for the request that ends now on this thread (nothing for LogFormat::None).
// `engine` (may be null) gives the verbose line's load figures.
void log_request(const RequestLogOptions& o, const std::string& method, const std::string& path, int status,
                 const Engine* engine);
// The text of that line, without writing it (for tests and log_request).
std::string request_log_line(const RequestLogOptions& o, const std::string& method, const std::string& path,
                             int status, const Engine* engine);

}  // namespace g4::server
