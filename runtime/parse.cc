#include "runtime/parse.h"

#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdio>

namespace farmem {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool ieq(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (tolower(static_cast<unsigned char>(a[i])) != tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

Status bad(std::string_view what, std::string_view text, const char* expect) {
  return make_error(Errc::kInvalidArgument, "%.*s=\"%.*s\" is not valid: expected %s",
                    static_cast<int>(what.size()), what.data(), static_cast<int>(text.size()),
                    text.data(), expect);
}

// Splits "123abc" into the number and the suffix.
bool split_number(std::string_view s, uint64_t* n, std::string_view* suffix) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *n);
  if (ec != std::errc() || p == s.data()) return false;
  *suffix = trim(s.substr(static_cast<size_t>(p - s.data())));
  return true;
}

}  // namespace

Result<uint64_t> parse_size(std::string_view text, std::string_view what) {
  static constexpr const char* kExpect =
      "a size such as 4096, 64K, 512M, 2G or 1T (binary multiples)";
  std::string_view s = trim(text);
  uint64_t n;
  std::string_view suf;
  if (s.empty() || !isdigit(static_cast<unsigned char>(s.front())) || !split_number(s, &n, &suf))
    return bad(what, text, kExpect);
  int shift;
  if (suf.empty() || ieq(suf, "b"))
    shift = 0;
  else if (ieq(suf, "k") || ieq(suf, "kb") || ieq(suf, "kib"))
    shift = 10;
  else if (ieq(suf, "m") || ieq(suf, "mb") || ieq(suf, "mib"))
    shift = 20;
  else if (ieq(suf, "g") || ieq(suf, "gb") || ieq(suf, "gib"))
    shift = 30;
  else if (ieq(suf, "t") || ieq(suf, "tb") || ieq(suf, "tib"))
    shift = 40;
  else
    return bad(what, text, kExpect);
  if (shift > 0 && n > (UINT64_MAX >> shift))
    return make_error(Errc::kInvalidArgument, "%.*s=\"%.*s\" is too large",
                      static_cast<int>(what.size()), what.data(), static_cast<int>(text.size()),
                      text.data());
  return n << shift;
}

Result<uint64_t> parse_size_or_percent(std::string_view text, std::string_view what,
                                       uint64_t total_ram) {
  std::string_view s = trim(text);
  if (!s.empty() && s.back() == '%') {
    uint64_t pct;
    std::string_view suf;
    if (!split_number(s.substr(0, s.size() - 1), &pct, &suf) || !suf.empty() || pct == 0 ||
        pct > 100)
      return bad(what, text, "a percentage of RAM from 1% to 100%, or a size such as 2G");
    return static_cast<uint64_t>(static_cast<__uint128_t>(total_ram) * pct / 100);
  }
  return parse_size(text, what);
}

Result<uint64_t> parse_duration_ms(std::string_view text, std::string_view what) {
  static constexpr const char* kExpect = "a duration such as 500ms, 2s or 1m";
  std::string_view s = trim(text);
  uint64_t n;
  std::string_view suf;
  if (s.empty() || !isdigit(static_cast<unsigned char>(s.front())) || !split_number(s, &n, &suf))
    return bad(what, text, kExpect);
  uint64_t mul;
  if (suf.empty() || ieq(suf, "ms"))
    mul = 1;
  else if (ieq(suf, "s"))
    mul = 1000;
  else if (ieq(suf, "m") || ieq(suf, "min"))
    mul = 60000;
  else
    return bad(what, text, kExpect);
  if (n > UINT64_MAX / mul) return bad(what, text, kExpect);
  return n * mul;
}

Result<uint64_t> parse_uint(std::string_view text, std::string_view what, uint64_t lo,
                            uint64_t hi) {
  std::string_view s = trim(text);
  uint64_t n;
  std::string_view suf;
  char expect[96];
  snprintf(expect, sizeof expect, "a whole number from %llu to %llu",
           static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi));
  if (s.empty() || !isdigit(static_cast<unsigned char>(s.front())) || !split_number(s, &n, &suf) ||
      !suf.empty() || n < lo || n > hi)
    return bad(what, text, expect);
  return n;
}

std::string Endpoint::to_string() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

Result<Endpoint> parse_endpoint(std::string_view text, std::string_view what,
                                uint16_t default_port) {
  static constexpr const char* kExpect = "HOST:PORT, for example 127.0.0.1:7400 or [::1]:7400";
  std::string_view s = trim(text);
  Endpoint ep;
  std::string_view port;
  if (!s.empty() && s.front() == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos || close == 1) return bad(what, text, kExpect);
    ep.host = std::string(s.substr(1, close - 1));
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad(what, text, kExpect);
      port = rest.substr(1);
    }
  } else {
    size_t colon = s.rfind(':');
    if (colon != std::string_view::npos && s.find(':') != colon) return bad(what, text, kExpect);
    ep.host = std::string(s.substr(0, colon));
    if (colon != std::string_view::npos) port = s.substr(colon + 1);
  }
  if (ep.host.empty()) return bad(what, text, kExpect);
  for (char c : ep.host)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '_' ||
          c == '%'))
      return bad(what, text, kExpect);
  if (port.empty()) {
    if (default_port == 0) return bad(what, text, kExpect);
    ep.port = default_port;
    return ep;
  }
  auto p = parse_uint(port, what, 1, 65535);
  if (!p.ok()) return bad(what, text, kExpect);
  ep.port = static_cast<uint16_t>(*p);
  return ep;
}

Result<std::vector<Endpoint>> parse_endpoint_list(std::string_view text, std::string_view what,
                                                  uint16_t default_port) {
  std::vector<Endpoint> out;
  std::string_view s = text;
  while (true) {
    size_t comma = s.find(',');
    std::string_view item = trim(s.substr(0, comma));
    if (!item.empty()) {
      auto ep = parse_endpoint(item, what, default_port);
      if (!ep.ok()) return ep.status();
      out.push_back(*ep);
    }
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  if (out.empty())
    return bad(what, text, "a comma-separated list of HOST:PORT, e.g. 127.0.0.1:7400");
  return out;
}

uint64_t physical_ram_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(size);
}

std::string format_size(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace farmem
