// Who may use the server, checked before any route runs (Server's pre-routing step):
// - the API key (--api-key), compared in constant time, from "Authorization: Bearer KEY" or
//   "x-api-key: KEY" (every path but /health);
// - the Host header, when bound to loopback: only loopback names (a web page on another name that
//   resolves to 127.0.0.1, "DNS rebinding", is refused);
// - the Origin header that browsers send: same-origin requests and the origins of --cors-origin
//   (which also get CORS response headers and preflight answers); other origins are refused, so
//   no web page can drive a local server unless allowed.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "server/api_types.h"
#include "server/context.h"

namespace g4::server {

bool constant_time_equal(std::string_view a, std::string_view b);
// 127.0.0.0/8, ::1 or "localhost".
bool is_loopback_host(std::string_view host);

// nullopt: go on (CORS headers may have been added to `res`); else the refusal (401 / 403), or a
// finished preflight answer in `res` (status 204, returned as an ApiError with status 204).
std::optional<ApiError> check_access(const http::Request& req, const ServerOptions& opt, http::Response& res);

}  // namespace g4::server
