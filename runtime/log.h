// Logging and graded assertions. Nothing here allocates: these run inside
// malloc and inside the fault handler.
//
//   FARMEM_LOG(kInfo, "leased %zu slabs to client %llu", n, id);
//   FARMEM_BUG_ON(state != PageState::kFetching);   // kept in release builds
//   FARMEM_DCHECK(offset % kPageSize == 0);          // debug builds only
#pragma once

#include <cstdint>
#include <string_view>

namespace farmem {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Process-wide threshold; messages above it are dropped. Default kInfo,
// overridden by FARMEM_LOG_LEVEL (error|warn|info|debug) when first used.
LogLevel log_level() noexcept;
void set_log_level(LogLevel level) noexcept;
// Parses "error", "warn", "info", "debug"; returns false on anything else.
bool parse_log_level(std::string_view text, LogLevel* out) noexcept;

// Writes one line "farmem[pid] level: message\n" to stderr with one write().
void log_message(LogLevel level, const char* fmt, ...) noexcept
    __attribute__((format(printf, 2, 3)));

// Prints "farmem: fatal: message" and aborts. Never allocates.
[[noreturn]] void fatal(const char* fmt, ...) noexcept __attribute__((format(printf, 1, 2)));

}  // namespace farmem

#define FARMEM_LOG(level, ...)                                                                  \
  do {                                                                                          \
    if (static_cast<int>(::farmem::LogLevel::level) <= static_cast<int>(::farmem::log_level())) \
      ::farmem::log_message(::farmem::LogLevel::level, __VA_ARGS__);                            \
  } while (0)

// Stays in release builds: a broken internal invariant.
#define FARMEM_BUG_ON(cond)                                           \
  do {                                                                \
    if (__builtin_expect(!!(cond), 0))                                \
      ::farmem::fatal("BUG at %s:%d: %s", __FILE__, __LINE__, #cond); \
  } while (0)

#ifndef NDEBUG
#define FARMEM_DCHECK(cond) FARMEM_BUG_ON(!(cond))
#else
#define FARMEM_DCHECK(cond) \
  do {                      \
  } while (0 && (cond))
#endif
