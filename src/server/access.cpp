#include "server/access.h"

#include <algorithm>

namespace g4::server {
namespace {

// "host:port" / "[v6]:port" / "host" -> host (lowercase, brackets kept off).
std::string host_part(std::string_view hostport) {
  std::string h;
  if (!hostport.empty() && hostport[0] == '[') {
    const size_t e = hostport.find(']');
    h = std::string(hostport.substr(1, e == std::string_view::npos ? std::string_view::npos : e - 1));
  } else {
    h = std::string(hostport.substr(0, hostport.find(':')));
  }
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return h;
}

// "http://host:port" -> "host:port" (lowercase); "" when there is no scheme.
std::string origin_authority(std::string_view origin) {
  const size_t p = origin.find("://");
  if (p == std::string_view::npos) return "";
  std::string a(origin.substr(p + 3));
  std::transform(a.begin(), a.end(), a.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return a;
}

}  // namespace

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

bool is_loopback_host(std::string_view host) {
  const std::string h = host_part(host);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

std::optional<ApiError> check_access(const http::Request& req, const ServerOptions& opt, http::Response& res) {
  const std::string host = req.get_header_value("Host");
  if (is_loopback_host(opt.host) && !host.empty() && !is_loopback_host(host))
    return ApiError{403, "permission_error",
                    "Host '" + host + "' is not this server's (bound to " + opt.host + "): request refused", ""};
  const std::string origin = req.get_header_value("Origin");
  if (!origin.empty()) {
    const bool listed = std::find(opt.cors_origins.begin(), opt.cors_origins.end(), origin) != opt.cors_origins.end() ||
                        std::find(opt.cors_origins.begin(), opt.cors_origins.end(), "*") != opt.cors_origins.end();
    const bool same = !host.empty() && origin_authority(origin) == origin_authority("http://" + host);
    if (!listed && !same)
      return ApiError{403, "permission_error",
                      "cross-origin request from " + origin + " refused (allow it with --cors-origin)", ""};
    if (listed) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
      if (req.method == "OPTIONS") {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers",
                       "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
        res.set_header("Access-Control-Max-Age", "600");
        return ApiError{204, "", "", ""};
      }
    }
  }
  // The web page (it asks for the key itself) and /health are open.
  if (opt.api_key.empty() || req.path == "/health" || req.path == "/") return std::nullopt;
  const std::string auth = req.get_header_value("Authorization");
  const std::string xkey = req.get_header_value("x-api-key");
  const std::string bearer = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : std::string();
  // Both compared, so the time taken does not say which header was checked.
  const bool ok_bearer = constant_time_equal(bearer, opt.api_key);
  const bool ok_x = constant_time_equal(xkey, opt.api_key);
  if (ok_bearer || ok_x) return std::nullopt;
  return ApiError{401, "authentication_error", "missing or invalid API key", ""};
}

}  // namespace g4::server
