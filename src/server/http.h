// The HTTP/1.1 layer under the API handlers, on Boost.Beast (Debian's libboost): Beast parses
// requests (headers, chunked bodies) and this file's server bounds everything a client controls:
//
// - a request's head must arrive within header_timeout (slow senders are cut off, and they hold
//   no thread: reading is asynchronous on one I/O thread), its body within body_timeout;
// - head size (max_header_bytes: 431) and body size after de-chunking (max_body_bytes: 413);
//   compressed bodies (Content-Encoding other than identity) are refused (415), so no body is
//   ever inflated;
// - at most max_connections open connections; one more is answered 503 and closed;
// - handlers run on worker_threads threads; a response's bytes are written asynchronously with a
//   write_timeout per write, and a client that closed its side is seen by
//   Request::is_connection_closed() (non-streamed handlers) and by DataSink::write failing
//   (streamed ones).
//
// The types copy the names of cpp-httplib's (Get/Post routes, Request::get_header_value,
// Response::set_content / set_chunked_content_provider, DataSink), the library this layer
// replaced, so route code reads the same.
#pragma once
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace g4::server::http {

struct Request {
  std::string method, target, path, body;  // path: target without the query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string remote_addr;
  // Case-insensitive header lookup; "" when absent.
  std::string get_header_value(std::string_view name) const;
  bool has_header(std::string_view name) const;
  // Whether the client has gone away (checked while a handler runs, without reading its socket).
  bool is_connection_closed() const { return closed && closed->load(); }
  std::shared_ptr<const std::atomic<bool>> closed;
};

// Where a streaming handler writes its chunks.
class DataSink {
 public:
  std::function<bool(const char* data, size_t n)> write;  // false once the connection is gone
  std::function<bool()> is_writable;
  std::function<void()> done;  // the last chunk was written
};

struct Response {
  // Called repeatedly until it calls sink.done() (success) or returns false (abort).
  using ContentProvider = std::function<bool(size_t offset, DataSink& sink)>;
  int status = 200;
  std::string body, content_type;
  std::vector<std::pair<std::string, std::string>> headers;
  ContentProvider provider;
  std::function<void(bool success)> provider_done;
  std::string error_message;  // why the server itself refused a request (for the error handler)

  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  void set_header(std::string k, std::string v) { headers.emplace_back(std::move(k), std::move(v)); }
  void set_chunked_content_provider(std::string type, ContentProvider p, std::function<void(bool)> done = {}) {
    content_type = std::move(type);
    provider = std::move(p);
    provider_done = std::move(done);
  }
};

using Handler = std::function<void(const Request&, Response&)>;

struct Limits {
  size_t max_body_bytes = size_t(4) << 20;
  size_t max_header_bytes = size_t(64) << 10;
  std::chrono::milliseconds header_timeout{10000};  // also the keep-alive idle limit
  std::chrono::milliseconds body_timeout{60000};
  std::chrono::milliseconds write_timeout{60000};
  int max_connections = 512;
  int worker_threads = 40;
};

class Server {
 public:
  explicit Server(Limits limits);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes by exact path, or by prefix when the path ends in "/*" ("/v1/responses/*": every path
  // below /v1/responses/; the handler reads the rest from req.path). Exact routes win.
  void Get(const std::string& path, Handler h);
  void Post(const std::string& path, Handler h);
  void Delete(const std::string& path, Handler h);
  void Options(const std::string& path, Handler h);
  // Runs before routing; returning true means `res` is the answer and no route runs.
  void set_pre_routing_handler(std::function<bool(const Request&, Response&)> h);
  // Gives a body to error statuses without one (the server's own 400/404/413/415/431/503, and a
  // handler's status without a body).
  void set_error_handler(Handler h);
  // A handler threw: fills the response (500).
  void set_exception_handler(std::function<void(const Request&, Response&, std::exception_ptr)> h);
  // Called once per request a handler answered, after its response (a stream: after its last
  // chunk), on the thread that ran the handler.
  void set_logger(std::function<void(const Request&, const Response&)> h);

  // Binds and listens (port 0: a free one); returns the port.
  Result<int> bind(const std::string& host, int port);
  // Starts the I/O thread and the workers.
  void start();
  // Closes the listener and every connection (streams in progress see write failures), then
  // joins the threads. Idempotent.
  void stop();
  int open_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace g4::server::http
