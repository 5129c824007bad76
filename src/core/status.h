// Errors as values at module boundaries: Status / Result<T>.
// A failed Status carries one human-readable line that names the file, tensor or field.
// Nothing inside the forward pass returns errors: invariant violations use G4_CHECK (abort).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace g4 {

struct Error {
  std::string message;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : err_(std::move(e.message)) {}  // NOLINT(implicit)
  static Status ok() { return {}; }
  bool is_ok() const { return !err_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const {
    static const std::string empty;
    return err_ ? *err_ : empty;
  }

 private:
  std::optional<std::string> err_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}          // NOLINT(implicit)
  Result(Error e) : v_(std::move(e)) {}      // NOLINT(implicit)
  Result(Status s) : v_(Error{s.message()}) {}  // only for failed statuses
  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const std::string& message() const { return std::get<1>(v_).message; }
  Status status() const { return is_ok() ? Status{} : Status(Error{message()}); }

 private:
  std::variant<T, Error> v_;
};

// Build an error from printf-style pieces: err("%s: tensor %s has %d dims", file, name, n).
template <class... A>
Error err(const char* fmt, A... args) {
  if constexpr (sizeof...(A) == 0) {
    return Error{fmt};
  } else {
    int n = std::snprintf(nullptr, 0, fmt, args...);
    std::string s(n > 0 ? n : 0, '\0');
    std::snprintf(s.data(), s.size() + 1, fmt, args...);
    return Error{std::move(s)};
  }
}

}  // namespace g4

#define G4_CONCAT_INNER(a, b) a##b
#define G4_CONCAT(a, b) G4_CONCAT_INNER(a, b)

// Return the failed Status/Result from the enclosing function.
#define G4_TRY(expr)                                         \
  do {                                                       \
    auto&& g4_try_v = (expr);                                \
    if (!g4_try_v.is_ok()) return ::g4::Error{g4_try_v.message()}; \
  } while (0)

// auto x = value of a Result, or return its error.
#define G4_ASSIGN_OR_RETURN(lhs, expr)                                  \
  auto G4_CONCAT(g4_res_, __LINE__) = (expr);                           \
  if (!G4_CONCAT(g4_res_, __LINE__).is_ok())                            \
    return ::g4::Error{G4_CONCAT(g4_res_, __LINE__).message()};         \
  lhs = std::move(G4_CONCAT(g4_res_, __LINE__)).value()

// Invariant check: a programming error, never a user error. Aborts with file:line.
#define G4_CHECK(cond)                                                          \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: internal check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                             \
    }                                                                           \
  } while (0)
