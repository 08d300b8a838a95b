#include "runtime/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace farmem {
namespace {

std::atomic<int> g_level{-1};

int initial_level() noexcept {
  LogLevel l = LogLevel::kInfo;
  if (const char* e = getenv("FARMEM_LOG_LEVEL")) {
    if (!parse_log_level(e, &l)) {
      log_message(LogLevel::kWarn,
                  "FARMEM_LOG_LEVEL=%s is not one of error|warn|info|debug; using info", e);
      l = LogLevel::kInfo;
    }
  }
  return static_cast<int>(l);
}

const char* level_name(LogLevel l) noexcept {
  switch (l) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

void vlog(const char* level, const char* fmt, va_list ap) noexcept {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "farmem[%d] %s: ", static_cast<int>(getpid()), level);
  if (n < 0) return;
  int m = vsnprintf(buf + n, sizeof buf - static_cast<size_t>(n), fmt, ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, len);
  (void)w;
}

}  // namespace

LogLevel log_level() noexcept {
  int l = g_level.load(std::memory_order_relaxed);
  if (__builtin_expect(l < 0, 0)) {
    g_level.store(static_cast<int>(LogLevel::kInfo), std::memory_order_relaxed);
    l = initial_level();
    g_level.store(l, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(l);
}

void set_log_level(LogLevel level) noexcept {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

bool parse_log_level(std::string_view t, LogLevel* out) noexcept {
  if (t == "error")
    *out = LogLevel::kError;
  else if (t == "warn" || t == "warning")
    *out = LogLevel::kWarn;
  else if (t == "info")
    *out = LogLevel::kInfo;
  else if (t == "debug")
    *out = LogLevel::kDebug;
  else
    return false;
  return true;
}

void log_message(LogLevel level, const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  vlog(level_name(level), fmt, ap);
  va_end(ap);
}

void fatal(const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  vlog("fatal", fmt, ap);
  va_end(ap);
  abort();
}

}  // namespace farmem
