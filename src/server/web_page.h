// The web chat page of `gemma4 serve` (src/server/web/chat.html, built into the binary): GET /
// answers it. The page talks to /v1/chat/completions and asks for the API key when the server has
// one, so / itself needs none.
#pragma once
#include "server/http.h"

#include <string_view>

namespace g4::server {

std::string_view web_chat_page();
void register_web_page(http::Server& http);

}  // namespace g4::server
