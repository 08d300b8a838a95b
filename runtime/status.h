// Status and Result: the error type of setup and control paths.
//
//   farmem::Result<int> parse(std::string_view s);
//   auto r = parse("12");
//   if (!r.ok()) { log_error("%s", r.status().to_string().c_str()); return; }
//   int v = *r;
//
// The fault path never throws and never builds a Status (it allocates): it
// carries a bare Errc per operation instead.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace farmem {

// Stable numbers: they cross the network in ERROR frames.
enum class Errc : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,    // a field or parameter is malformed
  kOutOfRange = 2,         // offset/length outside the allowed range
  kPermissionDenied = 3,   // not yours (another client's slab, ...)
  kUnauthenticated = 4,    // missing or wrong token
  kResourceExhausted = 5,  // capacity, quota, queue depth, client limit
  kUnavailable = 6,        // peer unreachable, connection lost, donor dead
  kProtocol = 7,           // bad frame: length, opcode, sequence
  kTimeout = 8,
  kIo = 9,  // a system call failed
  kInternal = 10,
  kVersionMismatch = 11,
  kNotFound = 12,
  kCancelled = 13,
};

// Short stable name of a code ("out_of_range"); never allocates.
const char* errc_name(Errc c) noexcept;

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == Errc::kOk; }
  Errc code() const { return code_; }
  const std::string& message() const { return message_; }
  // "out_of_range: READ of 4096 bytes at offset ... is outside slab 3"
  std::string to_string() const;

  // Adds context in front of the message, keeping the code.
  Status with_context(std::string_view what) const;

 private:
  Errc code_ = Errc::kOk;
  std::string message_;
};

inline Status ok_status() {
  return Status();
}

// printf-style constructor for error statuses.
Status make_error(Errc code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status) : v_(std::move(status)) {
    if (std::get<Status>(v_).ok()) v_ = Status(Errc::kInternal, "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace farmem

// Propagates a non-OK Status out of the current function.
#define FARMEM_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::farmem::Status farmem_st_ = (expr);    \
    if (!farmem_st_.ok()) return farmem_st_; \
  } while (0)
