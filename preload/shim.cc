// The preload shim: malloc & co. for unmodified programs.
//
//   export FARMEM_SERVERS=10.0.0.5:7400 FARMEM_TOKEN_FILE=/etc/farmem/token
//   LD_PRELOAD=libfarmem_preload.so FARMEM_LOCAL_MEM=2G FARMEM_STATS=1 app
//
// Routing. Once the runtime runs, every allocation of at least
// FARMEM_MIN_FAR bytes (default 0: every size) made by an application
// thread goes to the far heap; allocations made in a LocalScope (the
// runtime's own threads and set-up, invariant 3) go to glibc (__libc_malloc
// & co.), as do those made before the runtime started. Small objects share
// far pages that stay resident while they are hot: the pager's replacement
// decides what leaves, not a size threshold. The far heap uses jemalloc's
// thread caches (FarHeapOptions::thread_cache: a malloc/free pair is a
// thread-local pop and push), so a small far malloc costs about what
// glibc's does (bench/alloc_bench.cc, BM_*Small). free/realloc/
// malloc_usable_size route by address: one subtraction and compare against
// the far region. An allocation the far region cannot hold falls back to
// glibc (counted in the statistics).
//
// Life cycle (one state word):
//
//   state     entered when                      allocations go
//   --------  --------------------------------  -----------------------------
//   kBoot     process start (before our ctor)    local (also dlsym recursion)
//   kArmed    ctor parsed FARMEM_* successfully  local; the start trigger
//                                                below starts the runtime
//   kStarting one thread is starting it          local (others never wait)
//   kReady    runtime running                    far (>= FARMEM_MIN_FAR)
//   kOff      start failed with ON_NO_DONOR=local, local
//             or in a fork()ed child
//
// Start-up is lazy: the first allocation of at least kStartMin (16 KiB, or
// FARMEM_MIN_FAR when larger) starts the runtime, or a thread's kStartBytes
// (1 MiB) of smaller ones: a program that allocates little never connects
// to a donor or starts a thread ("allocates little, pays little"); what was
// allocated before stays local (at most about kStartBytes per thread plus
// the program's start-up). It runs in a LocalScope, so the runtime's own
// memory is local; threads created meanwhile (pager handlers, evictor,
// heartbeat) are marked local for life by the pthread_create wrapper
// below (invariant 3). When no donor can be reached: FARMEM_ON_NO_DONOR=
// fail (default) prints why and exits 1; =local warns once and runs
// all-local.
//
// Exit: nothing is torn down. Destructors and atexit handlers that run
// after ours may still read far memory or free it, so the pager keeps
// serving until the process is gone; the donor drops our leases when the
// control connection closes. FARMEM_STATS=1 prints a summary from the
// library's destructor (it runs after the program's own).
//
// fork() (invariant 8; pager/fork_snapshot.h): pthread_atfork handlers,
// registered in our constructor, so that our prepare runs LAST of all
// prepare handlers (after jemalloc's, whose arena locks are then held) and
// our parent/child handlers FIRST. prepare: the pager quiesces and records
// a snapshot of the far region (Pager::prepare_fork). parent: fork_parent,
// which learns from the kernel whether a child exists (a fork that copied
// the address space returns only after the pager read its UFFD_EVENT_FORK;
// errno is not a reliable signal, other handlers may change it); no
// handler of ours changes errno. child: the state goes kOff
// (new large allocations are local: the child has no pager thread and no
// transport), the backing turns inert (jemalloc's purges fail there and it
// keeps the pages) and far memory reads as it was at the fork, served by
// the parent. Exit: the library's destructor lets live children have every
// snapshot block first (finish_fork_children); a parent killed or leaving
// with _exit() cannot, and its children then read zeros where far memory
// was not resident. A prepare that fails (a WRITE to a donor failed) prints
// why; that child reads zeros there too. A child never prints statistics
// or touches the stats socket (its thread is the parent's).
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <new>

#include "allocator/api_internal.h"
#include "allocator/far_heap.h"
#include "allocator/local_scope.h"
#include "allocator/options.h"
#include "farmem/farmem.h"
#include "runtime/log.h"
#include "runtime/parse.h"

extern "C" {
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void* __libc_valloc(size_t);
void* __libc_pvalloc(size_t);
// Declared by glibc only with _GNU_SOURCE / for compatibility.
void* pvalloc(size_t) noexcept;
}

#define FARMEM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using farmem::FarHeap;

enum State : int { kBoot, kArmed, kStarting, kReady, kOff };

std::atomic<int> g_state{kBoot};
// The smallest allocation that takes the far path (far_alloc): SIZE_MAX
// until the ctor and in kOff (all local), max(FARMEM_MIN_FAR, kStartMin)
// while kArmed (the far path starts the runtime), FARMEM_MIN_FAR in kReady.
std::atomic<size_t> g_min_far{SIZE_MAX};
constexpr size_t kStartMin = 16 << 10;
constexpr size_t kStartBytes = 1 << 20;
__thread size_t t_armed_bytes __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<uintptr_t> g_base{0};
std::atomic<uintptr_t> g_size{0};  // 0: nothing is far
std::atomic<FarHeap*> g_heap{nullptr};
farmem::FarOptions* g_opts = nullptr;  // from the ctor, never freed

using UsableFn = size_t (*)(void*);
using CreateFn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
std::atomic<UsableFn> g_libc_usable{nullptr};
std::atomic<CreateFn> g_real_create{nullptr};

// Our own copy of stderr, taken at start-up when FARMEM_STATS=1: programs
// may close fd 2 before exit (gnulib's close_stdout does), and the summary
// is printed after that.
int g_err_fd = 2;

void write_stderr(const char* s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(g_err_fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

inline bool is_far(const void* p) {
  return reinterpret_cast<uintptr_t>(p) - g_base.load(std::memory_order_relaxed) <
         g_size.load(std::memory_order_relaxed);
}

inline bool wants_far(size_t n) {
  return n >= g_min_far.load(std::memory_order_relaxed) && !farmem::in_local_scope();
}

UsableFn libc_usable() {
  UsableFn f = g_libc_usable.load(std::memory_order_acquire);
  if (f == nullptr) {
    farmem::LocalScope local;
    f = reinterpret_cast<UsableFn>(dlsym(RTLD_NEXT, "malloc_usable_size"));
    g_libc_usable.store(f, std::memory_order_release);
  }
  return f;
}

CreateFn real_create() {
  CreateFn f = g_real_create.load(std::memory_order_acquire);
  if (f == nullptr) {
    farmem::LocalScope local;
    f = reinterpret_cast<CreateFn>(dlsym(RTLD_NEXT, "pthread_create"));
    if (f == nullptr) farmem::fatal("farmem preload: dlsym(pthread_create) failed: %s", dlerror());
    g_real_create.store(f, std::memory_order_release);
  }
  return f;
}

__attribute__((noinline)) void start_runtime() {
  farmem::LocalScope local;
  farmem::Status st = farmem::api_start(*g_opts);
  if (st.ok()) {
    farmem::FarRuntime* rt = farmem::api_runtime();
    FarHeap* h = &rt->heap();
    g_heap.store(h, std::memory_order_release);
    g_base.store(reinterpret_cast<uintptr_t>(rt->backing().base()), std::memory_order_release);
    g_size.store(rt->backing().size(), std::memory_order_release);
    g_state.store(kReady, std::memory_order_release);
    g_min_far.store(g_opts->min_far, std::memory_order_relaxed);
    FARMEM_LOG(kDebug, "preload: far memory ready: %s", rt->describe().c_str());
    return;
  }
  if (g_opts->on_no_donor == farmem::NoDonorPolicy::kLocal) {
    FARMEM_LOG(kWarn,
               "preload: far memory unavailable, running all-local (FARMEM_ON_NO_DONOR=local): %s",
               st.to_string().c_str());
    g_min_far.store(SIZE_MAX, std::memory_order_relaxed);
    g_state.store(kOff, std::memory_order_release);
    return;
  }
  char msg[1024];
  snprintf(msg, sizeof msg,
           "farmem: cannot start far memory: %s\n"
           "farmem: the program is stopped (FARMEM_ON_NO_DONOR=fail); check FARMEM_SERVERS and "
           "that farmemd runs there, or set FARMEM_ON_NO_DONOR=local to run all-local\n",
           st.to_string().c_str());
  write_stderr(msg);
  _exit(1);
}

// The far heap, starting the runtime on first use; nullptr: go local.
inline FarHeap* far_heap() {
  int s = g_state.load(std::memory_order_acquire);
  if (__builtin_expect(s == kReady, 1)) return g_heap.load(std::memory_order_relaxed);
  if (s != kArmed) return nullptr;
  if (!g_state.compare_exchange_strong(s, kStarting, std::memory_order_acq_rel)) return nullptr;
  start_runtime();
  return g_state.load(std::memory_order_acquire) == kReady ? g_heap.load(std::memory_order_relaxed)
                                                           : nullptr;
}

__attribute__((noinline)) void* far_alloc(size_t n, size_t align, bool zero) {
  if (FarHeap* h = far_heap()) {
    void* p = align ? h->alloc_aligned(align, n, zero) : (zero ? h->alloc_zeroed(n) : h->alloc(n));
    if (p) return p;
    farmem::g_local_fallbacks.fetch_add(1, std::memory_order_relaxed);
  }
  if (align) {
    void* p = __libc_memalign(align, n);
    if (p && zero) memset(p, 0, n);
    return p;
  }
  return zero ? __libc_calloc(1, n) : __libc_malloc(n);
}

// The start trigger's second half (see Life cycle): a local allocation made
// while kArmed counts towards kStartBytes on its thread.
__attribute__((noinline)) void note_armed(size_t n) {
  if (farmem::in_local_scope()) return;
  t_armed_bytes += n;
  if (t_armed_bytes >= kStartBytes) (void)far_heap();
}

inline void count_local(size_t n) {
  if (__builtin_expect(g_state.load(std::memory_order_relaxed) == kArmed, 0)) note_armed(n);
}

void* aligned_impl(size_t align, size_t n) {
  if (!wants_far(n)) return __libc_memalign(align, n);
  return far_alloc(n, align, false);
}

void far_free(void* p) {
  g_heap.load(std::memory_order_relaxed)->free(p);
}

struct Trampoline {
  void* (*fn)(void*);
  void* arg;
};

void* local_thread_main(void* raw) {
  // A thread started by farmem itself: local memory for its whole life.
  farmem::t_local_depth = 1;
  Trampoline t = *static_cast<Trampoline*>(raw);
  __libc_free(raw);
  return t.fn(t.arg);
}

// Set in a fork()ed child (see fork() in the header).
bool g_fork_child = false;
thread_local bool t_fork_prepared = false;

farmem::FarBacking* fork_backing() {
  if (g_state.load(std::memory_order_acquire) != kReady) return nullptr;
  farmem::FarRuntime* rt = farmem::api_runtime();
  return rt ? &rt->backing() : nullptr;
}

void on_fork_prepare() {
  farmem::FarBacking* b = fork_backing();
  if (b == nullptr || g_fork_child) return;
  farmem::LocalScope local;
  const int saved = errno;  // fork()'s caller sees its own errno
  farmem::Status st = b->prepare_fork();
  if (!st.ok()) {
    char msg[768];
    snprintf(msg, sizeof msg,
             "farmem: warning: fork() without a far-memory snapshot: %s; the child reads zeros "
             "where far memory was not resident\n",
             st.to_string().c_str());
    write_stderr(msg);
  }
  t_fork_prepared = true;
  errno = saved;
}

void on_fork_parent() {
  if (!t_fork_prepared) return;
  t_fork_prepared = false;
  const int saved = errno;  // a failed fork's EAGAIN/ENOMEM, for its caller
  farmem::LocalScope local;
  if (farmem::FarBacking* b = fork_backing()) b->fork_parent();
  errno = saved;
}

void on_fork_child() {
  t_fork_prepared = false;
  farmem::FarBacking* b = fork_backing();
  g_fork_child = true;
  int s = g_state.load(std::memory_order_relaxed);
  if (s != kBoot) g_state.store(kOff, std::memory_order_relaxed);
  g_min_far.store(SIZE_MAX, std::memory_order_relaxed);
  if (b != nullptr) b->fork_child();
}

void print_stats() {
  farmem::LocalScope local;
  fm_stats_t s;
  if (!farmem::api_stats(&s)) {
    write_stderr("farmem: stats: far memory was never used by this process\n");
    return;
  }
  using farmem::format_size;
  char msg[1536];
  snprintf(msg, sizeof msg,
           "farmem: stats: far heap: %llu allocations, %llu frees, %s live; %llu large "
           "allocations served locally\n"
           "farmem: stats: resident: peak %s of a %s budget; remote %s\n"
           "farmem: stats: faults: %llu zero-fill, %llu remote, %llu victim-cache, %llu "
           "write-protect; fetch p50 %llu us, p99 %llu us\n"
           "farmem: stats: evictions: %llu clean, %llu dirty; traffic: %s read, %s written\n",
           (unsigned long long)s.far_mallocs, (unsigned long long)s.far_frees,
           format_size(s.far_allocated).c_str(), (unsigned long long)s.local_fallbacks,
           format_size(s.resident_peak_bytes).c_str(), format_size(s.budget_bytes).c_str(),
           format_size(s.remote_bytes).c_str(), (unsigned long long)s.faults_zero,
           (unsigned long long)s.faults_remote, (unsigned long long)s.faults_victim,
           (unsigned long long)s.faults_wp, (unsigned long long)s.fetch_p50_us,
           (unsigned long long)s.fetch_p99_us, (unsigned long long)s.evictions_clean,
           (unsigned long long)s.evictions_dirty, format_size(s.bytes_read).c_str(),
           format_size(s.bytes_written).c_str());
  write_stderr(msg);
  if (farmem::FarRuntime* rt = farmem::api_runtime()) {
    snprintf(msg, sizeof msg,
             "farmem: stats: zero fill at allocation: %llu blocks (FARMEM_POPULATE_MAX %s)\n",
             (unsigned long long)rt->heap().stats().populated_blocks,
             format_size(g_opts->populate_max).c_str());
    write_stderr(msg);
  }
}

__attribute__((constructor)) void preload_init() {
  farmem::LocalScope local;
  (void)libc_usable();
  (void)real_create();
  auto o = farmem::options_from_env();
  if (!o.ok()) {
    char msg[1024];
    snprintf(msg, sizeof msg, "farmem: bad configuration: %s\n", o.status().to_string().c_str());
    write_stderr(msg);
    _exit(1);
  }
  g_opts = new farmem::FarOptions(std::move(*o));
  if (g_opts->stats) {
    int fd = fcntl(2, F_DUPFD_CLOEXEC, 200);
    if (fd >= 0) g_err_fd = fd;
  }
  pthread_atfork(&on_fork_prepare, &on_fork_parent, &on_fork_child);
  // The preload heap is the process's only one and is never destroyed: it
  // may use jemalloc's thread caches (far_heap.h).
  g_opts->thread_cache = true;
  g_min_far.store(g_opts->min_far > kStartMin ? g_opts->min_far : kStartMin,
                  std::memory_order_relaxed);
  g_state.store(kArmed, std::memory_order_release);
}

__attribute__((destructor)) void preload_fini() {
  if (g_fork_child) return;  // the runtime, its threads and its socket are the parent's
  if (farmem::FarBacking* b = fork_backing()) {
    farmem::LocalScope local;
    b->finish_fork_children();
  }
  if (g_opts != nullptr && g_opts->stats) print_stats();
  // The runtime stays up (see Exit above), but the stats socket goes now, so
  // that its file does not outlive the process.
  if (farmem::FarRuntime* rt = farmem::api_runtime()) rt->stop_stats_socket();
}

}  // namespace

// ---- the interposed functions -------------------------------------------------

FARMEM_EXPORT void* malloc(size_t n) noexcept {
  if (__builtin_expect(wants_far(n), 1)) return far_alloc(n, 0, false);
  count_local(n);
  return __libc_malloc(n);
}

FARMEM_EXPORT void free(void* p) noexcept {
  if (is_far(p)) {
    far_free(p);
    return;
  }
  __libc_free(p);
}

FARMEM_EXPORT void* calloc(size_t count, size_t size) noexcept {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (__builtin_expect(wants_far(n), 1)) return far_alloc(n, 0, true);
  count_local(n);
  return __libc_calloc(count, size);
}

FARMEM_EXPORT void* realloc(void* p, size_t n) noexcept {
  if (p == nullptr) return malloc(n);
  if (is_far(p)) {
    FarHeap* h = g_heap.load(std::memory_order_relaxed);
    if (n == 0) {  // glibc: realloc(p, 0) frees p and returns NULL
      h->free(p);
      return nullptr;
    }
    if (n >= g_min_far.load(std::memory_order_relaxed)) {
      if (void* q = h->realloc(p, n)) return q;
    }
    // Shrunk below the threshold (or the far region is full): move local.
    void* q = __libc_malloc(n);
    if (q == nullptr) return nullptr;
    size_t old = h->usable_size(p);
    memcpy(q, p, old < n ? old : n);
    h->free(p);
    return q;
  }
  if (!wants_far(n)) {
    count_local(n);
    return __libc_realloc(p, n);
  }
  // A local block (allocated before the runtime ran, or below the
  // threshold) moves to far memory the first time it is reallocated there.
  FarHeap* h = far_heap();
  if (h == nullptr) return __libc_realloc(p, n);
  void* q = h->alloc(n);
  if (q == nullptr) {
    farmem::g_local_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return __libc_realloc(p, n);
  }
  size_t old = libc_usable()(p);
  memcpy(q, p, old < n ? old : n);
  __libc_free(p);
  return q;
}

FARMEM_EXPORT void* reallocarray(void* p, size_t count, size_t size) noexcept {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(p, n);
}

FARMEM_EXPORT int posix_memalign(void** out, size_t align, size_t n) noexcept {
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  int saved = errno;
  void* p = aligned_impl(align, n);
  if (p == nullptr) return ENOMEM;
  errno = saved;
  *out = p;
  return 0;
}

FARMEM_EXPORT void* aligned_alloc(size_t align, size_t n) noexcept {
  if (align == 0 || (align & (align - 1)) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  return aligned_impl(align, n);
}

FARMEM_EXPORT void* memalign(size_t align, size_t n) noexcept {
  if (!wants_far(n)) return __libc_memalign(align, n);
  // glibc rounds a non-power-of-two alignment up; so do we.
  size_t a = align < 16 ? 16 : align;
  if ((a & (a - 1)) != 0) a = size_t{1} << (64 - __builtin_clzll(a));
  return far_alloc(n, a, false);
}

FARMEM_EXPORT void* valloc(size_t n) noexcept {
  if (!wants_far(n)) return __libc_valloc(n);
  return far_alloc(n, 4096, false);
}

FARMEM_EXPORT void* pvalloc(size_t n) noexcept {
  size_t r;
  if (__builtin_add_overflow(n, size_t{4095}, &r)) {
    errno = ENOMEM;
    return nullptr;
  }
  r &= ~size_t{4095};
  if (r == 0) r = 4096;
  if (!wants_far(r)) return __libc_pvalloc(n);
  return far_alloc(r, 4096, false);
}

FARMEM_EXPORT size_t malloc_usable_size(void* p) noexcept {
  if (p == nullptr) return 0;
  if (is_far(p)) return g_heap.load(std::memory_order_relaxed)->usable_size(p);
  return libc_usable()(p);
}

FARMEM_EXPORT int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*),
                                 void* arg) noexcept {
  CreateFn real = real_create();
  if (!farmem::in_local_scope()) return real(t, attr, fn, arg);
  auto* tr = static_cast<Trampoline*>(__libc_malloc(sizeof(Trampoline)));
  if (tr == nullptr) return EAGAIN;
  tr->fn = fn;
  tr->arg = arg;
  int rc = real(t, attr, &local_thread_main, tr);
  if (rc != 0) __libc_free(tr);
  return rc;
}
