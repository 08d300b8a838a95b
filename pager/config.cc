#include "pager/config.h"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>

#include "runtime/parse.h"

namespace farmem {

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

uint32_t default_handler_threads(bool pinned) {
  if (pinned) {
    size_t n = allowed_cpus().size();
    if (n == 0) n = 1;
    return static_cast<uint32_t>(n > 64 ? 64 : n);
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 2) return 1;
  return static_cast<uint32_t>(n / 2 > 8 ? 8 : n / 2);
}

Result<uint64_t> parse_local_mem(std::string_view text) {
  return parse_size_or_percent(text, "FARMEM_LOCAL_MEM", physical_ram_bytes());
}

Result<UffdMoveMode> parse_uffd_move(std::string_view text) {
  if (text == "auto") return UffdMoveMode::kAuto;
  if (text == "on") return UffdMoveMode::kOn;
  if (text == "off") return UffdMoveMode::kOff;
  return make_error(Errc::kInvalidArgument, "FARMEM_UFFD_MOVE=%.*s: expected auto, on or off",
                    static_cast<int>(text.size()), text.data());
}

const char* uffd_move_name(UffdMoveMode m) {
  switch (m) {
    case UffdMoveMode::kAuto:
      return "auto";
    case UffdMoveMode::kOn:
      return "on";
    case UffdMoveMode::kOff:
      return "off";
  }
  return "?";
}

Result<WpAsyncMode> parse_wp_async(std::string_view text) {
  if (text == "auto") return WpAsyncMode::kAuto;
  if (text == "on") return WpAsyncMode::kOn;
  if (text == "off") return WpAsyncMode::kOff;
  return make_error(Errc::kInvalidArgument, "FARMEM_WP_ASYNC=%.*s: expected auto, on or off",
                    static_cast<int>(text.size()), text.data());
}

const char* wp_async_name(WpAsyncMode m) {
  switch (m) {
    case WpAsyncMode::kAuto:
      return "auto";
    case WpAsyncMode::kOn:
      return "on";
    case WpAsyncMode::kOff:
      return "off";
  }
  return "?";
}

Result<ColocateMode> parse_colocate(std::string_view text) {
  if (text == "auto") return ColocateMode::kAuto;
  if (text == "on") return ColocateMode::kOn;
  if (text == "off") return ColocateMode::kOff;
  return make_error(Errc::kInvalidArgument, "FARMEM_COLOCATE=%.*s: expected auto, on or off",
                    static_cast<int>(text.size()), text.data());
}

const char* colocate_name(ColocateMode m) {
  switch (m) {
    case ColocateMode::kAuto:
      return "auto";
    case ColocateMode::kOn:
      return "on";
    case ColocateMode::kOff:
      return "off";
  }
  return "?";
}

Status PagerConfig::validate() const {
  if (block_size < 4096 || block_size > (2u << 20) || (block_size & (block_size - 1)) != 0) {
    return make_error(Errc::kInvalidArgument,
                      "block size %u: must be a power of two from 4096 (4K) to 2097152 (2M)",
                      block_size);
  }
  if (region_size == 0 || region_size % block_size != 0) {
    return make_error(Errc::kInvalidArgument,
                      "region size %llu: must be a non-zero multiple of the block size %u",
                      static_cast<unsigned long long>(region_size), block_size);
  }
  uint64_t blocks = local_budget / block_size;
  if (blocks < 32) {
    return make_error(Errc::kInvalidArgument,
                      "local budget %llu bytes is %llu blocks of %u bytes; the pager needs at "
                      "least 32 blocks: raise FARMEM_LOCAL_MEM or lower the block size",
                      static_cast<unsigned long long>(local_budget),
                      static_cast<unsigned long long>(blocks), block_size);
  }
  if (!(low_watermark > 0.0 && low_watermark < high_watermark && high_watermark <= 1.0)) {
    return make_error(Errc::kInvalidArgument,
                      "watermarks low=%.3f high=%.3f: need 0 < low < high <= 1", low_watermark,
                      high_watermark);
  }
  if (!(victim_fraction >= 0.0 && victim_fraction <= 0.75)) {
    return make_error(Errc::kInvalidArgument, "victim fraction %.3f: must be in [0, 0.75]",
                      victim_fraction);
  }
  if (hot_laps > 15) {
    return make_error(Errc::kInvalidArgument, "hot laps %u: at most 15 (0 turns tracking off)",
                      hot_laps);
  }
  if (handler_threads > 64) {
    return make_error(Errc::kInvalidArgument, "handler threads %u: at most 64", handler_threads);
  }
  if (writeback_batch == 0 || writeback_batch > 256) {
    return make_error(Errc::kInvalidArgument, "write-back batch %u: must be 1..256",
                      writeback_batch);
  }
  if (prefetch_max_window > 256) {
    return make_error(Errc::kInvalidArgument, "prefetch window %u: at most 256 blocks",
                      prefetch_max_window);
  }
  if (zero_fault_around > 64) {
    return make_error(Errc::kInvalidArgument,
                      "zero-fill fault-around %u: at most 64 blocks (0 turns it off)",
                      zero_fault_around);
  }
  if (zero_chunk > 64 || zero_chunk == 1 || (zero_chunk & (zero_chunk - 1)) != 0) {
    return make_error(Errc::kInvalidArgument,
                      "zero-fill chunk %u: a power of two from 2 to 64 blocks (0 turns it off)",
                      zero_chunk);
  }
  if (staging_blocks > 256) {
    return make_error(Errc::kInvalidArgument, "staging blocks %u: at most 256", staging_blocks);
  }
  return ok_status();
}

Result<PagerConfig> PagerConfig::from_env(PagerConfig c) {
  if (const char* v = getenv("FARMEM_LOCAL_MEM")) {
    auto r = parse_local_mem(v);
    if (!r.ok()) return r.status();
    c.local_budget = *r;
  }
  if (const char* v = getenv("FARMEM_PAGER_THREADS")) {
    auto r = parse_uint(v, "FARMEM_PAGER_THREADS", 1, 64);
    if (!r.ok()) return r.status();
    c.handler_threads = static_cast<uint32_t>(*r);
  }
  if (const char* v = getenv("FARMEM_BLOCK_SIZE")) {
    auto r = parse_size(v, "FARMEM_BLOCK_SIZE");
    if (!r.ok()) return r.status();
    if (*r > (2u << 20)) {
      return make_error(Errc::kInvalidArgument, "FARMEM_BLOCK_SIZE=%s: at most 2M", v);
    }
    c.block_size = static_cast<uint32_t>(*r);
  }
  if (const char* v = getenv("FARMEM_PREFETCH")) {
    auto r = parse_uint(v, "FARMEM_PREFETCH", 0, 1);
    if (!r.ok()) return r.status();
    c.prefetch = *r == 1;
  }
  if (const char* v = getenv("FARMEM_UFFD_MOVE")) {
    auto r = parse_uffd_move(v);
    if (!r.ok()) return r.status();
    c.uffd_move = *r;
  }
  if (const char* v = getenv("FARMEM_WP_ASYNC")) {
    auto r = parse_wp_async(v);
    if (!r.ok()) return r.status();
    c.wp_async = *r;
  }
  if (const char* v = getenv("FARMEM_ZERO_AROUND")) {
    auto r = parse_uint(v, "FARMEM_ZERO_AROUND", 0, 64);
    if (!r.ok()) return r.status();
    c.zero_fault_around = static_cast<uint32_t>(*r);
  }
  if (const char* v = getenv("FARMEM_ZERO_AROUND_WRITABLE")) {
    auto r = parse_uint(v, "FARMEM_ZERO_AROUND_WRITABLE", 0, 1);
    if (!r.ok()) return r.status();
    c.zero_around_writable = *r == 1;
  }
  if (const char* v = getenv("FARMEM_ZERO_CHUNK")) {
    auto r = parse_uint(v, "FARMEM_ZERO_CHUNK", 0, 64);
    if (!r.ok()) return r.status();
    c.zero_chunk = static_cast<uint32_t>(*r);
  }
  if (const char* v = getenv("FARMEM_BLOCKING_READ")) {
    auto r = parse_uint(v, "FARMEM_BLOCKING_READ", 0, 1);
    if (!r.ok()) return r.status();
    c.blocking_read = *r == 1;
  }
  if (const char* v = getenv("FARMEM_PIN_HANDLERS")) {
    auto r = parse_uint(v, "FARMEM_PIN_HANDLERS", 0, 1);
    if (!r.ok()) return r.status();
    c.pin_handlers = *r == 1;
  }
  if (const char* v = getenv("FARMEM_COLOCATE")) {
    auto r = parse_colocate(v);
    if (!r.ok()) return r.status();
    c.colocate = *r;
  }
  if (const char* v = getenv("FARMEM_WRITTEN_WRITABLE")) {
    auto r = parse_uint(v, "FARMEM_WRITTEN_WRITABLE", 0, 1);
    if (!r.ok()) return r.status();
    c.written_writable = *r == 1;
  }
  if (const char* v = getenv("FARMEM_HOT_LAPS")) {
    auto r = parse_uint(v, "FARMEM_HOT_LAPS", 0, 15);
    if (!r.ok()) return r.status();
    c.hot_laps = static_cast<uint32_t>(*r);
  }
  if (const char* v = getenv("FARMEM_REFAULT_HOT")) {
    auto r = parse_uint(v, "FARMEM_REFAULT_HOT", 0, 1);
    if (!r.ok()) return r.status();
    c.refault_hot = *r == 1;
  }
  if (const char* v = getenv("FARMEM_EVICT_BEHIND")) {
    auto r = parse_uint(v, "FARMEM_EVICT_BEHIND", 0, 1);
    if (!r.ok()) return r.status();
    c.evict_behind = *r == 1;
  }
  if (const char* v = getenv("FARMEM_ZERO_PAGE")) {
    auto r = parse_uint(v, "FARMEM_ZERO_PAGE", 0, 1);
    if (!r.ok()) return r.status();
    c.zero_page = *r == 1;
  }
  FARMEM_RETURN_IF_ERROR(c.validate());
  return c;
}

}  // namespace farmem
