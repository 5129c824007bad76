// The HTTP layer's native types: a parsed, validated generation request (from OpenAI or Anthropic
// JSON), errors in a form either API can render, and the JSON->request translation helpers.
// JSON stays here at the edge; the engine only sees GenerationSpec.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/image_prompt.h"
#include "text/tokenizer.h"

namespace g4::server {

using ojson = nlohmann::ordered_json;

// A client error (4xx) or server error (5xx), rendered in the API's own error shape.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the offending field, when there is one
};

// What every endpoint turns its body into.
constexpr int kMaxChoices = 8;

struct TextRequest {
  // Chat requests: messages (and tools) for the chat template. Completions: raw prompt text.
  bool chat = true;
  ojson messages = ojson::array();
  ojson tools;  // null or array
  std::string prompt;
  std::optional<bool> thinking;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;  // run to max_tokens: the model's end tokens do not stop it (vLLM, llama-server)
  int max_tokens = 0;  // 0: server default
  SamplingParams sampling;
  std::vector<std::string> stop;
  // Images of chat messages, in prompt order (each also left as a {"type": "image"} part in
  // `messages`, which the chat template writes as the image token).
  std::vector<ImageInput> images;
  // >= 0: report each token's logprob and this many alternatives (GenerationSpec::logprobs).
  int logprobs = -1;
  int n = 1;  // choices (OpenAI's n, at most kMaxChoices)
  // Constrained decoding as the request asked for it (read_constraint), and once compiled
  // (compile_constraint) the grammar the generation follows.
  struct Constraint {
    enum Kind { None, JsonObject, JsonSchema, Grammar } kind = None;
    std::string text;    // the schema (JSON text) or the EBNF grammar
    bool strict = false;  // json_schema: no properties beyond the schema's
    std::string param;   // the field it came from, for errors
  } constraint;
  std::shared_ptr<const CompiledGrammar> grammar;
  // The LoRA adapter the request's "model" picked (select_adapter), or null: the base model.
  std::shared_ptr<const MountedAdapter> adapter;
  // Which tools the answer must call (OpenAI tool_choice / parallel_tool_calls, Anthropic
  // tool_choice): Auto leaves it to the model; Required forces one or more calls of any tool, Named
  // one call of `name`, through a grammar of the model's tool-call syntax that takes the place of
  // `constraint` ("none" drops the tools instead).
  struct ToolChoice {
    enum Mode { Auto, Required, Named } mode = Auto;
    std::string name;
    bool parallel = true;
    std::string param = "tool_choice";  // the field, for errors
  } tool_choice;
};

// Field readers that produce ApiErrors naming the field. `where` is the JSON path prefix.
std::optional<ApiError> read_number(const ojson& body, const char* key, double lo, double hi,
                                    std::optional<double>& out);
std::optional<ApiError> read_int(const ojson& body, const char* key, long lo, long hi,
                                 std::optional<long>& out);
std::optional<ApiError> read_bool(const ojson& body, const char* key, std::optional<bool>& out);

// Sampling fields shared by the OpenAI endpoints (temperature, top_p, top_k, min_p, seed,
// presence/frequency/repetition penalties, logit_bias, stop, max_tokens / max_completion_tokens).
std::optional<ApiError> read_openai_sampling(const ojson& body, int vocab, TextRequest& r);

// Checks and normalizes OpenAI-style messages for the chat template: roles, string or
// content-part bodies, assistant tool_calls whose JSON-string arguments are parsed into objects,
// tool results. Image parts (image_url / input_image with a base64 data: URL) become
// {"type": "image"} parts and their bytes are appended to `images`; remote URLs are refused.
std::optional<ApiError> normalize_openai_messages(const ojson& messages, ojson& out, std::vector<ImageInput>& images);
// A request body -> TextRequest: OpenAI chat completions (chat) or completions (vocab: the
// model's, for logit_bias ids), and Anthropic messages. Errors name the field.
std::optional<ApiError> read_openai_request(const ojson& body, bool chat, int vocab, TextRequest& r);
std::optional<ApiError> read_anthropic_request(const ojson& body, TextRequest& r);
// A copy of client JSON whose strings (values and keys) have their special tokens' text marked
// literal (Tokenizer::mark_literal): rendered into a chat template and encoded with
// Tokenizer::encode_marked, only the template's own markup becomes control tokens.
ojson mark_literal_strings(const ojson& j, const Tokenizer& tok);
// Constrained-decoding fields of an OpenAI body: response_format {type: text | json_object |
// json_schema {json_schema: {schema, strict}}} (json_object also takes llama-server's `schema`),
// llama-server's top-level `json_schema` (an object) and `grammar` (GBNF / EBNF text). At most one.
std::optional<ApiError> read_constraint(const ojson& body, TextRequest& r);

// Validates an OpenAI `tools` array ({type: function, function: {name, description, parameters}}).
std::optional<ApiError> normalize_openai_tools(const ojson& tools, ojson& out);
// OpenAI `tool_choice` ("none" | "auto" | "required" | {type: function, function: {name}}) and
// `parallel_tool_calls`, after r.tools is set: "none" drops the tools; a forced choice needs tools,
// and a named function must be one of them.
std::optional<ApiError> read_openai_tool_choice(const ojson& body, TextRequest& r);
// Anthropic `tool_choice` ({type: auto | any | tool | none, name, disable_parallel_tool_use}).
std::optional<ApiError> read_anthropic_tool_choice(const ojson& body, TextRequest& r);

}  // namespace g4::server
