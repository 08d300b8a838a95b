// The C API: thin, noexcept wrappers over the process-wide FarRuntime.
#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "allocator/api_internal.h"
#include "allocator/local_scope.h"
#include "farmem/farmem.h"
#include "runtime/log.h"

namespace farmem {

std::atomic<uint64_t> g_local_fallbacks{0};

namespace {

std::mutex g_mu;                         // serialises start / shutdown
std::atomic<FarRuntime*> g_rt{nullptr};  // owned; set under g_mu
__thread char t_error[512] __attribute__((tls_model("initial-exec")));

// Sets errno and the message; returns -1 for `return fail(...)`.
int fail(int err, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int fail(int err, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_error, sizeof t_error, fmt, ap);
  va_end(ap);
  errno = err;
  return -1;
}

FarHeap* heap_or_fail(const char* fn) {
  FarRuntime* rt = api_runtime();
  if (rt == nullptr) {
    fail(ENXIO, "%s: farmem is not running; call fm_init() first", fn);
    return nullptr;
  }
  return &rt->heap();
}

// Checks that [p, p+len) is far memory; -1 with errno otherwise.
int check_range(const char* fn, const void* p, size_t len, FarRuntime** rt_out) {
  FarRuntime* rt = api_runtime();
  if (rt == nullptr) return fail(ENXIO, "%s: farmem is not running; call fm_init() first", fn);
  FarBacking& b = rt->backing();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base = reinterpret_cast<uintptr_t>(b.base());
  if (a < base || a - base > b.size() || len > b.size() - (a - base)) {
    return fail(EINVAL,
                "%s(%p, %zu): the range is not inside far memory [%p, +%zu); hints apply to "
                "memory from fm_malloc",
                fn, p, len, b.base(), b.size());
  }
  *rt_out = rt;
  return 0;
}

}  // namespace

FarRuntime* api_runtime() noexcept {
  return g_rt.load(std::memory_order_acquire);
}

int errno_of(Errc e) noexcept {
  switch (e) {
    case Errc::kOk:
      return 0;
    case Errc::kInvalidArgument:
    case Errc::kOutOfRange:
      return EINVAL;
    case Errc::kPermissionDenied:
      return EPERM;
    case Errc::kUnauthenticated:
      return EACCES;
    case Errc::kResourceExhausted:
      return ENOMEM;
    case Errc::kUnavailable:
      return ECONNREFUSED;
    case Errc::kTimeout:
      return ETIMEDOUT;
    case Errc::kVersionMismatch:
      return EPROTO;
    case Errc::kProtocol:
      return EPROTO;
    case Errc::kNotFound:
      return ENOENT;
    case Errc::kCancelled:
      return ECANCELED;
    default:
      return EIO;
  }
}

Status api_start(const FarOptions& o) {
  LocalScope local;
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_rt.load(std::memory_order_relaxed) != nullptr) {
    return make_error(Errc::kInvalidArgument,
                      "farmem is already running; call fm_shutdown() before fm_init() again");
  }
  auto rt = FarRuntime::start(o);
  if (!rt.ok()) return rt.status();
  g_rt.store(rt->release(), std::memory_order_release);
  return ok_status();
}

bool api_stats(fm_stats_t* out) noexcept {
  LocalScope local;
  FarRuntime* rt = api_runtime();
  if (rt == nullptr) return false;
  memset(out, 0, sizeof *out);
  PagerStats p = rt->backing().stats();
  FarHeap::Stats h = rt->heap().stats();
  out->region_size = rt->backing().size();
  out->far_allocated = h.allocated;
  out->far_active = h.active;
  out->far_mallocs = h.nmalloc;
  out->far_frees = h.ndalloc;
  out->local_fallbacks = g_local_fallbacks.load(std::memory_order_relaxed);
  out->resident_bytes = p.resident_bytes;
  out->resident_peak_bytes = p.resident_peak_bytes;
  out->budget_bytes = p.budget_bytes;
  out->remote_bytes = p.remote_bytes;
  out->faults_zero = p.faults_zero;
  out->faults_remote = p.faults_remote;
  out->faults_victim = p.faults_victim;
  out->faults_wp = p.faults_wp;
  out->evictions_clean = p.evictions_clean;
  out->evictions_dirty = p.evictions_dirty;
  out->bytes_read = p.bytes_read;
  out->bytes_written = p.bytes_written;
  out->fetch_p50_us = p.fetch_latency.percentile_us(0.5);
  out->fetch_p99_us = p.fetch_latency.percentile_us(0.99);
  out->faults_waited = p.faults_waited;
  out->pinned_bytes = p.pinned_bytes;
  out->prefetch_issued = p.prefetch_issued;
  out->prefetch_used = p.prefetch_used;
  out->prefetch_unused = p.prefetch_unused;
  out->zero_around = p.zero_around;
  out->populated_bytes = h.populated_blocks * rt->backing().block_size();
  return true;
}

}  // namespace farmem

using namespace farmem;

extern "C" {

void fm_config_init(fm_config* c) noexcept {
  if (c == nullptr) return;
  memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->prefetch = -1;
  c->decay_ms = -1;
}

int fm_init(const fm_config* c) noexcept {
  LocalScope local;
  FarOptions o;
  if (c == nullptr) {
    auto r = options_from_env();
    if (!r.ok()) return fail(EINVAL, "fm_init: %s", r.status().to_string().c_str());
    o = std::move(*r);
  } else {
    if (c->struct_size != sizeof(fm_config)) {
      return fail(EINVAL,
                  "fm_init: config.struct_size is %zu, expected %zu: initialise the config with "
                  "fm_config_init() and rebuild against this farmem.h",
                  c->struct_size, sizeof(fm_config));
    }
    if (c->transport == nullptr) {
      o.transport = FarTransport::kAuto;
    } else if (!parse_far_transport(c->transport, &o.transport)) {
      return fail(EINVAL,
                  "fm_init: transport \"%s\" is unknown; use \"auto\", \"tcp\", \"verbs\" or "
                  "\"loopback\"",
                  c->transport);
    }
    if (c->servers != nullptr && *c->servers) {
      auto s = parse_endpoint_list(c->servers, "fm_config.servers", 7400);
      if (!s.ok()) return fail(EINVAL, "fm_init: %s", s.status().to_string().c_str());
      o.servers = std::move(*s);
    }
    if (c->token_file) o.token_file = c->token_file;
    if (c->local_mem) o.pager.local_budget = c->local_mem;
    if (c->loopback_capacity) o.loopback_capacity = c->loopback_capacity;
    o.region_size = c->region_size;
    if (c->block_size) o.pager.block_size = c->block_size;
    o.pager.handler_threads = c->pager_threads;
    if (c->prefetch >= 0) o.pager.prefetch = c->prefetch != 0;
    if (c->decay_ms >= 0) o.decay_ms = c->decay_ms;
    if (c->connect_timeout_ms > 0) o.connect_timeout_ms = c->connect_timeout_ms;
    // fm_config has no field for it: the operator's switch applies here too.
    if (const char* v = getenv("FARMEM_STATS_SOCKET")) {
      auto r = parse_uint(v, "FARMEM_STATS_SOCKET", 0, 1);
      if (!r.ok()) return fail(EINVAL, "fm_init: %s", r.status().to_string().c_str());
      o.stats_socket = *r == 1;
    }
  }
  Status st = api_start(o);
  if (!st.ok()) {
    int e = errno_of(st.code());
    if (st.message().find("already running") != std::string::npos) e = EALREADY;
    if (st.message().find("userfaultfd") != std::string::npos && e != EINVAL) e = EPERM;
    return fail(e, "fm_init: %s", st.to_string().c_str());
  }
  t_error[0] = '\0';
  return 0;
}

int fm_shutdown(void) noexcept {
  LocalScope local;
  std::lock_guard<std::mutex> lk(g_mu);
  FarRuntime* rt = g_rt.exchange(nullptr, std::memory_order_acq_rel);
  if (rt == nullptr) return fail(ENXIO, "fm_shutdown: farmem is not running");
  delete rt;
  return 0;
}

int fm_is_running(void) noexcept {
  return api_runtime() != nullptr;
}

int fm_is_far(const void* p) noexcept {
  FarRuntime* rt = api_runtime();
  return rt != nullptr && rt->heap().contains(p);
}

void* fm_malloc(size_t size) noexcept {
  FarHeap* h = heap_or_fail("fm_malloc");
  if (h == nullptr) return nullptr;
  if (size > h->backing().size()) {
    fail(ENOMEM, "fm_malloc(%zu): larger than the whole far region (%zu bytes)", size,
         h->backing().size());
    return nullptr;
  }
  void* p = h->alloc(size);
  if (p == nullptr) fail(ENOMEM, "fm_malloc(%zu): the far region is exhausted", size);
  return p;
}

void* fm_calloc(size_t count, size_t size) noexcept {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    fail(ENOMEM, "fm_calloc(%zu, %zu): the product overflows size_t", count, size);
    return nullptr;
  }
  FarHeap* h = heap_or_fail("fm_calloc");
  if (h == nullptr) return nullptr;
  if (total > h->backing().size()) {
    fail(ENOMEM, "fm_calloc(%zu, %zu): larger than the whole far region (%zu bytes)", count, size,
         h->backing().size());
    return nullptr;
  }
  void* p = h->alloc_zeroed(total);
  if (p == nullptr) fail(ENOMEM, "fm_calloc(%zu, %zu): the far region is exhausted", count, size);
  return p;
}

void* fm_realloc(void* ptr, size_t size) noexcept {
  if (ptr == nullptr) return fm_malloc(size);
  FarHeap* h = heap_or_fail("fm_realloc");
  if (h == nullptr) return nullptr;
  if (!h->contains(ptr)) {
    fail(EINVAL,
         "fm_realloc(%p, %zu): %p is not far memory (region [%p, +%zu)); use realloc() for "
         "malloc'ed memory",
         ptr, size, ptr, h->backing().base(), h->backing().size());
    return nullptr;
  }
  if (size == 0) {
    h->free(ptr);
    return nullptr;
  }
  if (size > h->backing().size()) {
    fail(ENOMEM, "fm_realloc(%p, %zu): larger than the whole far region", ptr, size);
    return nullptr;
  }
  void* p = h->realloc(ptr, size);
  if (p == nullptr) fail(ENOMEM, "fm_realloc(%p, %zu): the far region is exhausted", ptr, size);
  return p;
}

void fm_free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  FarRuntime* rt = api_runtime();
  if (rt == nullptr || !rt->heap().contains(ptr)) {
    fail(EINVAL,
         "fm_free(%p): not far memory (%s); the pointer was left alone. Memory from malloc() "
         "goes back with free()",
         ptr, rt == nullptr ? "farmem is not running" : "outside the far region");
    FARMEM_LOG(kError, "%s", t_error);
    return;
  }
  rt->heap().free(ptr);
}

void* fm_aligned_alloc(size_t alignment, size_t size) noexcept {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    fail(EINVAL, "fm_aligned_alloc(%zu, %zu): the alignment must be a power of two", alignment,
         size);
    return nullptr;
  }
  FarHeap* h = heap_or_fail("fm_aligned_alloc");
  if (h == nullptr) return nullptr;
  if (size > h->backing().size() || alignment > h->backing().size() / 2) {
    fail(ENOMEM, "fm_aligned_alloc(%zu, %zu): larger than the far region allows", alignment, size);
    return nullptr;
  }
  void* p = h->alloc_aligned(alignment, size);
  if (p == nullptr) {
    fail(ENOMEM, "fm_aligned_alloc(%zu, %zu): the far region is exhausted", alignment, size);
  }
  return p;
}

size_t fm_usable_size(const void* ptr) noexcept {
  if (ptr == nullptr) return 0;
  FarRuntime* rt = api_runtime();
  if (rt == nullptr || !rt->heap().contains(ptr)) {
    fail(EINVAL, "fm_usable_size(%p): not far memory", ptr);
    return 0;
  }
  return rt->heap().usable_size(ptr);
}

// The range is widened outward to whole blocks (allocator/far_backing.h).
static int hint(const char* fn, FarHint kind, const void* p, size_t len) {
  LocalScope local;  // the Status message below is local memory
  if (len == 0) return 0;
  FarRuntime* rt = nullptr;
  if (check_range(fn, p, len, &rt) != 0 || rt == nullptr) return -1;
  Status st = rt->backing().hint(kind, const_cast<void*>(p), len);
  if (st.ok()) {
    t_error[0] = '\0';
    return 0;
  }
  return fail(errno_of(st.code()), "%s: %s", fn, st.to_string().c_str());
}

int fm_prefetch(const void* p, size_t len) noexcept {
  return hint("fm_prefetch", FarHint::kPrefetch, p, len);
}
int fm_evict(const void* p, size_t len) noexcept {
  return hint("fm_evict", FarHint::kEvict, p, len);
}
int fm_pin(const void* p, size_t len) noexcept {
  return hint("fm_pin", FarHint::kPin, p, len);
}
int fm_unpin(const void* p, size_t len) noexcept {
  return hint("fm_unpin", FarHint::kUnpin, p, len);
}

int fm_stats(fm_stats_t* out) noexcept {
  if (out == nullptr) return fail(EINVAL, "fm_stats: out is NULL");
  const size_t want = out->struct_size;
  if (want < FM_STATS_SIZE_V1) {
    return fail(EINVAL,
                "fm_stats: out->struct_size is %zu, at least %zu expected: initialise the struct "
                "with fm_stats_init() first",
                want, static_cast<size_t>(FM_STATS_SIZE_V1));
  }
  // Filled whole, then copied as far as the caller's struct goes: a caller
  // built against an older header gets its fields, one built against a
  // newer header keeps its extra fields as they were.
  fm_stats_t all;
  if (!api_stats(&all)) return fail(ENXIO, "fm_stats: farmem is not running");
  const size_t n = std::min(want, sizeof all);
  all.struct_size = n;
  memcpy(out, &all, n);
  return 0;
}

const char* fm_last_error(void) noexcept {
  return t_error;
}

}  // extern "C"
