// Boost.Beast server behind http.h: one I/O thread runs every socket asynchronously (reading
// requests, writing queued response bytes); worker threads run the handlers. A session moves
// through: read head (deadline) -> read body (deadline, size limit) -> handler on a worker (the
// socket watched for the client closing) -> queued writes (deadline each) -> next request or close.
#include "server/http.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <optional>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <sys/socket.h>
#include <thread>

namespace g4::server::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// A fixed set of threads running queued tasks in order.
class Workers {
 public:
  void start(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
  }
  void post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, nothing left
        f = std::move(tasks_.front());
        tasks_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

const char* reason_phrase(int status) {
  const auto r = bhttp::obsolete_reason(bhttp::int_to_status(unsigned(status)));
  return r.empty() ? "Unknown" : r.data();
}

}  // namespace

std::string Request::get_header_value(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

bool Request::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return true;
  return false;
}

class Session;

struct Server::Impl {
  explicit Impl(Limits l) : lim(l) {}
  Limits lim;
  std::map<std::pair<std::string, std::string>, Handler> routes;  // (method, path)
  std::function<bool(const Request&, Response&)> pre_routing;
  Handler error_handler;
  std::function<void(const Request&, Response&, std::exception_ptr)> exception_handler;
  std::function<void(const Request&, const Response&)> logger;

  // Declared before the io_context, destroyed after it: the sessions its handlers hold use them.
  std::atomic<int> connections{0};
  std::atomic<bool> stopped{false};
  std::mutex sessions_mu;
  std::set<std::shared_ptr<Session>> sessions;  // open connections (for stop())
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  std::thread io_thread;
  Workers workers;

  void accept();
  void dispatch(const Request& req, Response& res);
  const Handler* prefix_route(const Request& req) const;
  // The bytes of a complete (not chunked) response.
  std::string serialize(const Request* req, Response& res, bool keep_alive);
};

// One connection.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket s, Server::Impl& srv) : stream_(std::move(s)), srv_(srv) { ++srv_.connections; }
  ~Session() { --srv_.connections; }

  void start() { read_head(); }

  // From any thread: marks the connection dead and closes the socket on the I/O thread.
  void abort() {
    closed_->store(true);
    cv_.notify_all();
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_now(); });
  }

  // Queues bytes for writing (from a worker). Waits while more than 1 MiB is queued (a slow
  // reader holds its worker, not memory). False when the connection is gone.
  bool enqueue(std::string bytes, bool last) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return closed_->load() || queued_bytes_ < (size_t(1) << 20); });
    if (closed_->load()) return false;
    queued_bytes_ += bytes.size();
    out_.push_back(std::move(bytes));
    if (last) last_queued_ = true;
    if (!writing_) {
      writing_ = true;
      net::post(stream_.get_executor(), [self = shared_from_this()] { self->write_next(); });
    }
    return true;
  }

  bool closed() const { return closed_->load(); }
  bool keep_alive() const { return keep_alive_; }

 private:
  void read_head() {
    parser_.emplace();
    parser_->body_limit(srv_.lim.max_body_bytes);
    parser_->header_limit(std::uint32_t(srv_.lim.max_header_bytes));
    stream_.expires_after(srv_.lim.header_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) { self->on_head(ec); });
  }

  void on_head(beast::error_code ec) {
    if (ec == bhttp::error::header_limit) return answer_error(431, "request header too large");
    // Beast checks a Content-Length against the body limit while parsing the head.
    if (ec == bhttp::error::body_limit) return answer_error(413, "request body too large");
    if (ec) return close_now();  // timeout, client gone, or not HTTP
    auto& h = parser_->get();
    const std::string enc(h[bhttp::field::content_encoding]);
    if (!enc.empty() && !iequals(enc, "identity"))
      return answer_error(415, "compressed request bodies (Content-Encoding) are not accepted");
    if (h.payload_size() && *h.payload_size() > srv_.lim.max_body_bytes) return answer_error(413, "request body too large");
    stream_.expires_after(srv_.lim.body_timeout);
    if (iequals(std::string(h[bhttp::field::expect]), "100-continue")) {
      auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*cont), [self = shared_from_this(), cont](beast::error_code e, size_t) {
        if (e) return self->close_now();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
  }

  void on_request(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) return answer_error(413, "request body too large");
    if (ec == bhttp::error::end_of_stream || ec == beast::error::timeout || ec == net::error::eof) return close_now();
    if (ec) return answer_error(400, std::string("malformed HTTP request: ") + ec.message());
    auto msg = parser_->release();
    keep_alive_ = msg.keep_alive();
    auto req = std::make_shared<Request>();
    req->method = std::string(msg.method_string());
    req->target = std::string(msg.target());
    req->path = req->target.substr(0, req->target.find('?'));
    for (const auto& f : msg) req->headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    req->body = std::move(msg.body());
    beast::error_code ep_ec;
    const auto ep = stream_.socket().remote_endpoint(ep_ec);
    if (!ep_ec) req->remote_addr = ep.address().to_string();
    req->closed = closed_;
    stream_.expires_never();
    watch_for_close();
    srv_.workers.post([self = shared_from_this(), req] { self->respond(*req); });
  }

  // While a handler runs, a readable socket whose peek returns 0 bytes means the client closed.
  void watch_for_close() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec == net::error::operation_aborted) return;
      char c;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (ec || n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        self->closed_->store(true);
        self->cv_.notify_all();
      }
    });
  }

  // On a worker: the handler, then its bytes.
  void respond(const Request& req) {
    Response res;
    srv_.dispatch(req, res);
    if (!res.provider) {
      const Response logged = srv_.logger ? res : Response{};
      enqueue(srv_.serialize(&req, res, keep_alive_), true);
      if (srv_.logger) srv_.logger(req, logged);
      return;
    }
    bhttp::response<bhttp::empty_body> head;
    head.version(11);
    head.result(unsigned(res.status));
    head.set(bhttp::field::content_type, res.content_type);
    for (const auto& [k, v] : res.headers) head.insert(k, v);
    head.chunked(true);
    head.keep_alive(keep_alive_);
    std::ostringstream hs;
    hs << head.base();
    bool ok = enqueue(hs.str(), false), finished = false;
    DataSink sink;
    sink.write = [&](const char* d, size_t n) {
      if (!ok || n == 0) return ok;
      char len[20];
      std::snprintf(len, sizeof len, "%zx\r\n", n);
      std::string chunk = len;
      chunk.append(d, n);
      chunk += "\r\n";
      ok = enqueue(std::move(chunk), false);
      return ok;
    };
    sink.is_writable = [&] { return ok && !closed(); };
    sink.done = [&] {
      if (finished) return;
      finished = true;
      ok = ok && enqueue("0\r\n\r\n", true);
    };
    for (size_t offset = 0; ok && !finished;) {
      if (!res.provider(offset, sink)) break;
    }
    if (!finished) abort();  // the stream ended without its last chunk: the client must not see it as complete
    if (res.provider_done) res.provider_done(finished && ok);
    if (srv_.logger) srv_.logger(req, res);
  }

  // On the I/O thread.
  void write_next() {
    std::shared_ptr<std::string> buf;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (out_.empty()) {
        writing_ = false;
        if (last_queued_) {
          last_queued_ = false;
          after_response();
        }
        return;
      }
      buf = std::make_shared<std::string>(std::move(out_.front()));
      out_.pop_front();
    }
    stream_.expires_after(srv_.lim.write_timeout);
    net::async_write(stream_, net::buffer(*buf), [self = shared_from_this(), buf](beast::error_code ec, size_t) {
      {
        std::lock_guard<std::mutex> lk(self->mu_);
        self->queued_bytes_ -= buf->size();
      }
      self->cv_.notify_all();
      if (ec) {
        self->closed_->store(true);
        return self->close_now();
      }
      self->write_next();
    });
  }

  void after_response() {
    stream_.expires_never();
    beast::error_code ec;
    stream_.socket().cancel(ec);  // the close watcher
    if (keep_alive_ && !closed() && !srv_.stopped.load()) return read_head();
    linger_close();
  }

  // Ends the connection after a last response: the write side is shut, and what the client still
  // sends (the rest of a refused body) is read and dropped for a moment, so that it reads the
  // answer instead of a reset.
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    drain_input();
  }

  void drain_input() {
    scratch_.resize(16384);
    stream_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > (size_t(16) << 20)) return self->close_now();
      self->drain_input();
    });
  }

  // The server's own error answers (before any handler ran), then close.
  void answer_error(int status, const std::string& message) {
    Request req;
    if (parser_) {
      const auto& h = parser_->get();
      req.method = std::string(h.method_string());
      req.target = std::string(h.target());
      req.path = req.target.substr(0, req.target.find('?'));
    }
    Response res;
    res.status = status;
    res.body = message;
    res.content_type = "text/plain";
    res.error_message = message;
    if (srv_.error_handler) {
      res.body.clear();
      srv_.error_handler(req, res);
    }
    keep_alive_ = false;
    stream_.expires_never();
    enqueue(srv_.serialize(&req, res, false), true);
  }

  void close_now() {
    closed_->store(true);
    cv_.notify_all();
    beast::error_code ec;
    stream_.socket().close(ec);
    std::lock_guard<std::mutex> lk(srv_.sessions_mu);
    srv_.sessions.erase(shared_from_this());
  }

  beast::tcp_stream stream_;
  Server::Impl& srv_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<std::atomic<bool>> closed_ = std::make_shared<std::atomic<bool>>(false);
  bool keep_alive_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> out_;
  size_t queued_bytes_ = 0;
  bool writing_ = false, last_queued_ = false;
  std::vector<char> scratch_;
  size_t drained_ = 0;
};

void Server::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket sock) {
    if (ec) {
      if (!stopped.load() && acceptor.is_open()) accept();
      return;
    }
    if (connections.load() >= lim.max_connections) {
      // Answered in one small write on the I/O thread, then closed.
      Response res;
      res.status = 503;
      res.error_message = "too many open connections";
      if (error_handler) error_handler(Request{}, res);
      auto bytes = std::make_shared<std::string>(serialize(nullptr, res, false));
      auto s = std::make_shared<tcp::socket>(std::move(sock));
      net::async_write(*s, net::buffer(*bytes), [s, bytes](beast::error_code, size_t) {
        beast::error_code e;
        s->shutdown(tcp::socket::shutdown_send, e);
        s->close(e);
      });
    } else {
      auto session = std::make_shared<Session>(std::move(sock), *this);
      {
        std::lock_guard<std::mutex> lk(sessions_mu);
        sessions.insert(session);
      }
      session->start();
    }
    accept();
  });
}

// The longest "/*" route of req's method whose prefix req.path extends, or null.
const Handler* Server::Impl::prefix_route(const Request& req) const {
  const Handler* best = nullptr;
  size_t best_len = 0;
  for (const auto& [key, h] : routes) {
    const std::string& p = key.second;
    if (key.first != req.method || p.size() < 2 || p.compare(p.size() - 2, 2, "/*") != 0) continue;
    const size_t n = p.size() - 1;  // the prefix, its trailing '/' kept
    if (req.path.size() > n && req.path.compare(0, n, p, 0, n) == 0 && n > best_len) {
      best = &h;
      best_len = n;
    }
  }
  return best;
}

void Server::Impl::dispatch(const Request& req, Response& res) {
  try {
    if (pre_routing && pre_routing(req, res)) {
      // answered before routing
    } else if (auto it = routes.find({req.method, req.path}); it != routes.end()) {
      it->second(req, res);
    } else if (const Handler* h = prefix_route(req)) {
      (*h)(req, res);
    } else {
      res.status = 404;
    }
  } catch (...) {
    res = Response{};
    res.status = 500;
    if (exception_handler) exception_handler(req, res, std::current_exception());
  }
  if (res.status >= 400 && res.body.empty() && !res.provider && error_handler) {
    try {
      error_handler(req, res);
    } catch (...) {
    }
  }
}

std::string Server::Impl::serialize(const Request* req, Response& res, bool keep_alive) {
  bhttp::response<bhttp::string_body> m;
  m.version(11);
  m.result(unsigned(res.status));  // the number as given, also where Beast has no name for it
  if (m.reason().empty()) m.reason(reason_phrase(res.status));
  for (const auto& [k, v] : res.headers) m.insert(k, v);
  if (!res.content_type.empty()) m.set(bhttp::field::content_type, res.content_type);
  const bool head_only = req && req->method == "HEAD";
  m.body() = head_only ? std::string() : std::move(res.body);
  m.keep_alive(keep_alive);
  m.prepare_payload();
  std::ostringstream o;
  o << m;
  return o.str();
}

Server::Server(Limits limits) : impl_(std::make_unique<Impl>(limits)) {}
Server::~Server() { stop(); }

void Server::Get(const std::string& path, Handler h) { impl_->routes[{"GET", path}] = std::move(h); }
void Server::Post(const std::string& path, Handler h) { impl_->routes[{"POST", path}] = std::move(h); }
void Server::Delete(const std::string& path, Handler h) { impl_->routes[{"DELETE", path}] = std::move(h); }
void Server::Options(const std::string& path, Handler h) { impl_->routes[{"OPTIONS", path}] = std::move(h); }
void Server::set_pre_routing_handler(std::function<bool(const Request&, Response&)> h) {
  impl_->pre_routing = std::move(h);
}
void Server::set_error_handler(Handler h) { impl_->error_handler = std::move(h); }
void Server::set_exception_handler(std::function<void(const Request&, Response&, std::exception_ptr)> h) {
  impl_->exception_handler = std::move(h);
}
void Server::set_logger(std::function<void(const Request&, const Response&)> h) { impl_->logger = std::move(h); }

Result<int> Server::bind(const std::string& host, int port) {
  beast::error_code ec;
  const auto addr = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return err("cannot bind %s: not an IP address (%s)", host.c_str(), ec.message().c_str());
  const tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return err("cannot bind %s:%d: %s", host.c_str(), port, ec.message().c_str());
  return int(impl_->acceptor.local_endpoint().port());
}

void Server::start() {
  impl_->workers.start(std::max(1, impl_->lim.worker_threads));
  impl_->accept();
  impl_->io_thread = std::thread([this] { impl_->ioc.run(); });
}

void Server::stop() {
  if (impl_->stopped.exchange(true)) return;
  net::post(impl_->ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard<std::mutex> lk(impl_->sessions_mu);
    open.assign(impl_->sessions.begin(), impl_->sessions.end());
  }
  for (auto& s : open) s->abort();
  open.clear();
  impl_->workers.stop();  // handlers see their connections closed and return
  impl_->ioc.stop();
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
  std::lock_guard<std::mutex> lk(impl_->sessions_mu);
  impl_->sessions.clear();
}

int Server::open_connections() const { return impl_->connections.load(); }

}  // namespace g4::server::http
