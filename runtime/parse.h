// Parsing of configuration values: sizes, endpoints, durations. One place
// for every user-facing value so that a bad one is the same clear error
// whether it came from a flag, a file or the environment.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace farmem {

// "4096", "64K", "64KiB", "512M", "2G", "1T" (binary multiples, case
// insensitive, optional "B"/"iB"). Overflow and junk are errors that quote
// `what` (the flag or variable name).
Result<uint64_t> parse_size(std::string_view text, std::string_view what);

// A size, or a percentage of physical RAM ("25%").
Result<uint64_t> parse_size_or_percent(std::string_view text, std::string_view what,
                                       uint64_t total_ram);

// Milliseconds: "1500", "1500ms", "2s", "1m".
Result<uint64_t> parse_duration_ms(std::string_view text, std::string_view what);

// Unsigned integer in [lo, hi].
Result<uint64_t> parse_uint(std::string_view text, std::string_view what, uint64_t lo, uint64_t hi);

struct Endpoint {
  std::string host;  // name or numeric address, IPv6 without brackets
  uint16_t port = 0;
  std::string to_string() const;  // "host:port" or "[v6]:port"
};

// "HOST:PORT", "[V6]:PORT"; a missing ":PORT" takes default_port when it is
// non-zero.
Result<Endpoint> parse_endpoint(std::string_view text, std::string_view what,
                                uint16_t default_port = 0);
// Comma-separated endpoints ("a:7400,b:7400").
Result<std::vector<Endpoint>> parse_endpoint_list(std::string_view text, std::string_view what,
                                                  uint16_t default_port = 0);

// Physical RAM of this machine in bytes.
uint64_t physical_ram_bytes();

// "64.0 MiB"
std::string format_size(uint64_t bytes);

}  // namespace farmem
