// OpenAI's Responses API request (POST /v1/responses) as a chat-completions body, so that one
// reader (read_openai_request) validates both APIs' fields: `input` (a string, or message,
// function_call and function_call_output items; reasoning items are skipped), `instructions`
// (a system message, not carried to later turns), `previous_response_id` (that response's stored
// conversation first), `tools` (flat function tools), `tool_choice`, `parallel_tool_calls`,
// `max_output_tokens`, `text.format` (json_object / json_schema), `reasoning.effort`, and the
// sampling fields the chat endpoint takes.
#pragma once
#include <optional>

#include "server/api_types.h"
#include "server/response_store.h"

namespace g4::server {

// chat: the chat-completions body; conversation: the messages this response continues (the
// previous conversation and this input, without instructions), for the store. Errors name the
// Responses field (404 for an unknown previous_response_id).
std::optional<ApiError> responses_to_chat(const ojson& body, const ResponseStore& store, ojson& chat,
                                          ojson& conversation);

// A chat-reader error's field in Responses terms (messages -> input, max_tokens ->
// max_output_tokens, response_format -> text.format).
std::string responses_param(const std::string& chat_param);

}  // namespace g4::server
