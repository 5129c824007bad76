#include "server/web_page.h"

namespace g4::server {

std::string_view web_chat_page() {
  static constexpr std::string_view kPage =
#include "web_chat_html.inc"
      ;
  return kPage;
}

void register_web_page(http::Server& http) {
  http.Get("/", [](const http::Request&, http::Response& res) {
    const std::string_view page = web_chat_page();
    res.set_content(std::string(page), "text/html; charset=utf-8");
    res.set_header("Cache-Control", "no-cache");
  });
}

}  // namespace g4::server
