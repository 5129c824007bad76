#include "server/api_types.h"

#include "io/json_bounded.h"
#include "server/data_url.h"

#include <cmath>

namespace g4::server {
namespace {

ApiError bad(const std::string& param, const std::string& msg) {
  return ApiError{400, "invalid_request_error", msg, param};
}

}  // namespace

std::optional<ApiError> read_number(const ojson& body, const char* key, double lo, double hi,
                                    std::optional<double>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad(key, std::string("'") + key + "' must be a number");
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                        std::to_string(hi));
  out = v;
  return std::nullopt;
}

std::optional<ApiError> read_int(const ojson& body, const char* key, long lo, long hi,
                                 std::optional<long>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()))
    return bad(key, std::string("'") + key + "' must be an integer");
  double dv = it->get<double>();
  if (dv < double(lo) || dv > double(hi))
    return bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                        std::to_string(hi));
  out = long(dv);
  return std::nullopt;
}

std::optional<ApiError> read_bool(const ojson& body, const char* key, std::optional<bool>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad(key, std::string("'") + key + "' must be a boolean");
  out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_openai_sampling(const ojson& body, int vocab, TextRequest& r) {
  std::optional<double> d;
  std::optional<long> i;
  if (auto e = read_number(body, "temperature", 0, 100, d)) return e;
  if (d) r.sampling.temperature = float(*d), d.reset();
  if (auto e = read_number(body, "top_p", 0, 1, d)) return e;
  if (d) r.sampling.top_p = float(*d), d.reset();
  if (auto e = read_int(body, "top_k", 0, 1L << 30, i)) return e;
  if (i) r.sampling.top_k = int(*i), i.reset();
  if (auto e = read_number(body, "min_p", 0, 1, d)) return e;
  if (d) r.sampling.min_p = float(*d), d.reset();
  if (auto e = read_number(body, "presence_penalty", -2, 2, d)) return e;
  if (d) r.sampling.presence_penalty = float(*d), d.reset();
  if (auto e = read_number(body, "frequency_penalty", -2, 2, d)) return e;
  if (d) r.sampling.frequency_penalty = float(*d), d.reset();
  if (auto e = read_number(body, "repetition_penalty", 0, 10, d)) return e;
  if (d) r.sampling.repetition_penalty = float(*d), d.reset();
  if (auto e = read_int(body, "seed", -(1L << 62), 1L << 62, i)) return e;
  if (i) r.sampling.seed = uint64_t(*i), r.sampling.has_seed = true, i.reset();
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (auto e = read_int(body, key, 1, 1L << 30, i)) return e;
    if (i) r.max_tokens = int(*i), i.reset();
  }
  if (auto e = read_int(body, "n", 1, kMaxChoices, i)) return e;
  if (i) r.n = int(*i), i.reset();
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (auto& [k, v] : it->items()) {
      char* end = nullptr;
      long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || id < 0 || id >= vocab)
        return bad("logit_bias", "logit_bias key '" + k + "' is not a token id of this model");
      if (!v.is_number() || std::fabs(v.get<double>()) > 100)
        return bad("logit_bias", "logit_bias values must be numbers between -100 and 100");
      r.sampling.logit_bias.emplace_back(int(id), v.get<float>());
    }
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 16) return bad("stop", "at most 16 stop sequences");
      for (auto& s : *it) {
        if (!s.is_string()) return bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or an array of strings");
    }
    for (auto& s : r.stop)
      if (s.empty()) return bad("stop", "stop sequences must not be empty");
  }
  std::optional<bool> b;
  if (auto e = read_bool(body, "stream", b)) return e;
  r.stream = b.value_or(false);
  std::optional<bool> ig;
  if (auto e = read_bool(body, "ignore_eos", ig)) return e;  // vLLM's and llama-server's extension
  r.ignore_eos = ig.value_or(false);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad("stream_options", "'stream_options' must be an object");
    std::optional<bool> u;
    if (auto e = read_bool(*it, "include_usage", u)) return e;
    r.include_usage = u.value_or(false);
  }
  return std::nullopt;
}

std::optional<ApiError> normalize_openai_messages(const ojson& messages, ojson& out, std::vector<ImageInput>& images) {
  if (!messages.is_array() || messages.empty())
    return bad("messages", "'messages' must be a non-empty array");
  out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(where, where + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return bad(where + ".role", where + ".role must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      return bad(where + ".role", "unknown role '" + r + "' (expected system, developer, user, assistant or tool)");
    ojson nm = m;
    auto content = m.find("content");
    if (content != m.end() && !content->is_null()) {
      if (content->is_array()) {
        std::string text;
        ojson parts = ojson::array();  // for the template when images are interleaved
        bool any_image = false;
        for (size_t j = 0; j < content->size(); ++j) {
          const ojson& part = (*content)[j];
          const std::string pw = where + ".content[" + std::to_string(j) + "]";
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            return bad(where + ".content", where + ".content parts must be objects with a 'type'");
          const std::string t = part["type"].get<std::string>();
          if (t == "text" || t == "input_text") {
            if (!part.contains("text") || !part["text"].is_string())
              return bad(where + ".content", "text parts need a string 'text'");
            text += part["text"].get<std::string>();
            parts.push_back({{"type", "text"}, {"text", part["text"]}});
          } else if (t == "image_url" || t == "image" || t == "input_image") {
            if (r != "user") return bad(pw, "images are only accepted in user messages");
            // {"image_url": {"url": ...}} (chat completions), {"image_url": "..."} (responses).
            const ojson* u = nullptr;
            for (const char* k : {"image_url", "image", "url"})
              if (part.contains(k)) { u = &part[k]; break; }
            if (u && u->is_object() && u->contains("url")) u = &(*u)["url"];
            if (!u || !u->is_string()) return bad(pw, pw + " needs image_url.url (a data: URL)");
            std::string why;
            auto bytes = decode_data_url(u->get<std::string>(), &why);
            if (!bytes) return bad(pw, pw + ": " + why);
            images.push_back(ImageInput{std::move(*bytes), pw});
            parts.push_back({{"type", "image"}});
            any_image = true;
          } else {
            return bad(where + ".content", "unsupported content part type '" + t + "'");
          }
        }
        if (any_image) nm["content"] = parts;
        else nm["content"] = text;
      } else if (!content->is_string()) {
        return bad(where + ".content", where + ".content must be a string or an array of parts");
      }
    } else if (r != "assistant") {
      return bad(where + ".content", where + " needs 'content'");
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      if (r != "assistant") return bad(where + ".tool_calls", "only assistant messages have tool_calls");
      if (!tc->is_array()) return bad(where + ".tool_calls", "'tool_calls' must be an array");
      ojson calls = ojson::array();
      for (const auto& c : *tc) {
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
            !c["function"].contains("name") || !c["function"]["name"].is_string())
          return bad(where + ".tool_calls", "each tool call needs function.name");
        ojson call = c;
        const ojson& args = c["function"].contains("arguments") ? c["function"]["arguments"] : ojson();
        if (args.is_string()) {
          std::string why;
          auto parsed = parse_json_bounded<ojson>(args.get<std::string>(), kRequestJsonLimits, why);
          if (!parsed) return bad(where + ".tool_calls", "function.arguments is not valid JSON: " + why);
          call["function"]["arguments"] = std::move(*parsed);
        } else if (args.is_null()) {
          call["function"]["arguments"] = ojson::object();
        }
        calls.push_back(std::move(call));
      }
      nm["tool_calls"] = calls;
    }
    if (r == "tool" && (!m.contains("tool_call_id") || !m["tool_call_id"].is_string()) && !m.contains("name"))
      return bad(where + ".tool_call_id", "tool messages need 'tool_call_id'");
    out.push_back(std::move(nm));
  }
  return std::nullopt;
}

// The body of either OpenAI endpoint.
// Chat: "logprobs": true with "top_logprobs": 0..20; completions: "logprobs": 0..20 (OpenAI's
// legacy limit is 5; vLLM's 20).
static std::optional<ApiError> read_openai_logprobs(const ojson& body, bool chat, TextRequest& r) {
  std::optional<long> n;
  if (chat) {
    std::optional<bool> on;
    if (auto e = read_bool(body, "logprobs", on)) return e;
    if (auto e = read_int(body, "top_logprobs", 0, kMaxTopLogprobs, n)) return e;
    if (n && !on.value_or(false))
      return ApiError{400, "invalid_request_error", "'top_logprobs' needs 'logprobs': true", "top_logprobs"};
    if (on.value_or(false)) r.logprobs = int(n.value_or(0));
  } else {
    if (auto e = read_int(body, "logprobs", 0, kMaxTopLogprobs, n)) return e;
    if (n) r.logprobs = int(*n);
  }
  return std::nullopt;
}

std::optional<ApiError> read_openai_request(const ojson& body, bool chat, int vocab, TextRequest& r) {
  r.chat = chat;
  if (auto err = read_openai_sampling(body, vocab, r)) return err;
  if (auto err = read_openai_logprobs(body, chat, r)) return err;
  if (auto err = read_constraint(body, r)) return err;
  if (chat) {
    if (!body.contains("messages"))
      return ApiError{400, "invalid_request_error", "'messages' is required", "messages"};
    if (auto err = normalize_openai_messages(body["messages"], r.messages, r.images)) return err;
    if (auto err = normalize_openai_tools(body.value("tools", ojson()), r.tools)) return err;
    if (auto err = read_openai_tool_choice(body, r)) return err;
    // Thinking: chat_template_kwargs.enable_thinking, or reasoning_effort (none/low/medium/high).
    if (auto k = body.find("chat_template_kwargs"); k != body.end() && k->is_object()) {
      if (auto t = k->find("enable_thinking"); t != k->end() && t->is_boolean()) r.thinking = t->get<bool>();
    }
    if (auto re = body.find("reasoning_effort"); re != body.end() && re->is_string())
      r.thinking = re->get<std::string>() != "none";
  } else {
    auto p = body.find("prompt");
    if (p == body.end() || !(p->is_string() || (p->is_array() && p->size() == 1 && (*p)[0].is_string())))
      return ApiError{400, "invalid_request_error", "'prompt' must be a string", "prompt"};
    r.prompt = p->is_string() ? p->get<std::string>() : (*p)[0].get<std::string>();
  }
  return std::nullopt;
}

// Recursion depth is bounded by the request parser (io/json_bounded.h).
ojson mark_literal_strings(const ojson& j, const Tokenizer& tok) {
  if (j.is_string()) return tok.mark_literal(j.get_ref<const std::string&>());
  if (j.is_array()) {
    ojson out = ojson::array();
    for (const auto& x : j) out.push_back(mark_literal_strings(x, tok));
    return out;
  }
  if (j.is_object()) {
    ojson out = ojson::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[tok.mark_literal(it.key())] = mark_literal_strings(it.value(), tok);
    return out;
  }
  return j;
}

std::optional<ApiError> normalize_openai_tools(const ojson& tools, ojson& out) {
  out = nullptr;
  if (tools.is_null()) return std::nullopt;
  if (!tools.is_array()) return bad("tools", "'tools' must be an array");
  out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string())
      return bad(where, where + " must be {type: 'function', function: {name, description, parameters}}");
    out.push_back(t);
  }
  if (out.empty()) out = nullptr;
  return std::nullopt;
}

}  // namespace g4::server
