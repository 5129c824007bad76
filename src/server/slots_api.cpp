// Explicit saves of a conversation's KV, in the manner of llama-server's slot files (its
// `POST /slots/{id}?action=save|restore` with `--slot-save-path`). Our slots hold one request
// each, so a conversation is named by its prompt instead of a slot number:
//   POST /slots/save    {"filename": NAME, "messages": [...] | "prompt": text}
//     writes the prefix cache's entry sharing the longest prefix with that prompt (the KV a
//     finished turn left, prompt and answer) to DIR/saved/NAME -> {"filename", "n_saved" (its
//     tokens), "n_matched" (the prefix it shares with the prompt), "n_written" (bytes),
//     "timings": {"save_ms"}}; 404 when no entry shares a token.
//   POST /slots/restore {"filename": NAME}
//     reads it back into the prefix cache -> {"filename", "n_restored", "n_read", "timings":
//     {"restore_ms"}}; 404 when missing, 400 when it is not a whole entry of this model and options.
// DIR is --prompt-cache's (400 without it); NAME is 1-128 of [A-Za-z0-9._-], not starting with '.'.
// Files are in runtime/prompt_store.h's entry format, under the same key; saved ones are never
// removed by the disk bound.
#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"
#include "core/plain_name.h"
#include "runtime/prompt_store.h"
#include "server/context.h"

namespace g4::server {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// The saved entry's path for body["filename"], or false with *e.
bool saved_path(const Context& ctx, const ojson& body, std::string* name, std::string* path, ApiError* e) {
  const std::string& dir = ctx.engine.options().prompt_cache_dir;
  if (dir.empty()) {
    *e = ApiError{400, "invalid_request_error", "start the server with --prompt-cache DIR to save and restore KV", ""};
    return false;
  }
  auto it = body.find("filename");
  if (it == body.end() || !it->is_string()) {
    *e = ApiError{400, "invalid_request_error", "'filename' must be a string", "filename"};
    return false;
  }
  *name = it->get<std::string>();
  if (!is_plain_name(*name, 128) || (*name)[0] == '.') {
    *e = ApiError{400, "invalid_request_error", "'filename' must be 1-128 of A-Z a-z 0-9 . _ - and not start with '.'",
                  "filename"};
    return false;
  }
  *path = (fs::path(dir) / "saved" / *name).string();
  return true;
}

void save(Context& ctx, const http::Request& hreq, http::Response& res) {
  const auto t0 = Clock::now();
  ApiError e;
  ojson body;
  std::string name, path;
  std::vector<int32_t> ids;
  bool chat = false;
  if (parse_body(hreq, body, e) && saved_path(ctx, body, &name, &path, &e) &&
      request_prompt_ids(ctx, body, &ids, &chat, &e)) {
    size_t matched = 0;
    auto got = ctx.engine.export_prefix(ids, &matched);
    if (!got) {
      e = ApiError{503, "server_error", got.message(), ""};
    } else if (matched == 0) {
      e = ApiError{404, "not_found_error", "no cached KV shares a prefix with this prompt", ""};
    } else {
      const auto& [tokens, state] = got.value();
      const std::string bytes = encode_prompt_entry(ctx.engine.options().prompt_cache_key, tokens, state);
      std::error_code ec;
      fs::create_directories(fs::path(path).parent_path(), ec);
      if (Status st = write_file_atomic(path, bytes); !st) {
        e = ApiError{500, "server_error", st.message(), ""};
      } else {
        res.set_content(ojson{{"filename", name}, {"n_saved", tokens.size()}, {"n_matched", matched},
                              {"n_written", bytes.size()}, {"timings", {{"save_ms", ms_since(t0)}}}}.dump(),
                        "application/json");
        ctx.metrics.count("/slots/save", 200);
        return;
      }
    }
  }
  ctx.metrics.count("/slots/save", e.status);
  send_openai_error(res, e);
}

void restore(Context& ctx, const http::Request& hreq, http::Response& res) {
  const auto t0 = Clock::now();
  ApiError e;
  ojson body;
  std::string name, path;
  if (parse_body(hreq, body, e) && saved_path(ctx, body, &name, &path, &e)) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      e = ApiError{404, "not_found_error", "no saved KV named '" + name + "'", "filename"};
    } else {
      const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      std::vector<int32_t> tokens;
      std::vector<uint8_t> state;
      std::string why;
      if (!decode_prompt_entry(bytes, ctx.engine.options().prompt_cache_key, &tokens, &state, &why)) {
        e = ApiError{400, "invalid_request_error", "'" + name + "' cannot be restored: " + why, "filename"};
      } else {
        const size_t n = tokens.size();
        if (Status st = ctx.engine.import_prefix(std::move(tokens), state); !st) {
          e = ApiError{400, "invalid_request_error", "'" + name + "' cannot be restored: " + st.message(), "filename"};
        } else {
          res.set_content(ojson{{"filename", name}, {"n_restored", n}, {"n_read", bytes.size()},
                                {"timings", {{"restore_ms", ms_since(t0)}}}}.dump(),
                          "application/json");
          ctx.metrics.count("/slots/restore", 200);
          return;
        }
      }
    }
  }
  ctx.metrics.count("/slots/restore", e.status);
  send_openai_error(res, e);
}

}  // namespace

void register_slot_routes(http::Server& svr, Context& ctx) {
  svr.Post("/slots/save", [&ctx](const http::Request& q, http::Response& r) { save(ctx, q, r); });
  svr.Post("/slots/restore", [&ctx](const http::Request& q, http::Response& r) { restore(ctx, q, r); });
}

}  // namespace g4::server
