#include "runtime/status.h"

#include <cstdarg>
#include <cstdio>

namespace farmem {

const char* errc_name(Errc c) noexcept {
  switch (c) {
    case Errc::kOk:
      return "ok";
    case Errc::kInvalidArgument:
      return "invalid_argument";
    case Errc::kOutOfRange:
      return "out_of_range";
    case Errc::kPermissionDenied:
      return "permission_denied";
    case Errc::kUnauthenticated:
      return "unauthenticated";
    case Errc::kResourceExhausted:
      return "resource_exhausted";
    case Errc::kUnavailable:
      return "unavailable";
    case Errc::kProtocol:
      return "protocol_error";
    case Errc::kTimeout:
      return "timeout";
    case Errc::kIo:
      return "io_error";
    case Errc::kInternal:
      return "internal";
    case Errc::kVersionMismatch:
      return "version_mismatch";
    case Errc::kNotFound:
      return "not_found";
    case Errc::kCancelled:
      return "cancelled";
  }
  return "unknown_error";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string s = errc_name(code_);
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

Status Status::with_context(std::string_view what) const {
  if (ok()) return *this;
  std::string m(what);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

Status make_error(Errc code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return Status(code, buf);
}

}  // namespace farmem
