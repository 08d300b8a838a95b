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
// glibc (counted in the statistics). Private anonymous mmap()s of at least
// FARMEM_MMAP_MIN go far too, with munmap, mremap, madvise and mprotect
// interposed on them: see "Anonymous mmap" at the end of this file.
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
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <new>

#include "allocator/api_internal.h"
#include "allocator/far_heap.h"
#include "allocator/local_scope.h"
#include "allocator/options.h"
#include "farmem/farmem.h"
#include "pager/colocate.h"
#include "pager/park.h"
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
// Anonymous mmap (below): its switch and the lock of its range map, which
// fork() holds across the fork.
extern std::atomic<size_t> g_mmap_min;
void mm_fork_lock();
void mm_fork_unlock();
void mm_init_self();
void start_trimming();
bool trim_fork_lock();
void trim_fork_unlock();
thread_local bool t_trim_locked = false;
void trim_print_stats(char* buf, size_t n);
void mm_print_stats(char* buf, size_t n);

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
    start_trimming();
    return;
  }
  if (g_opts->on_no_donor == farmem::NoDonorPolicy::kLocal) {
    FARMEM_LOG(kWarn,
               "preload: far memory unavailable, running all-local (FARMEM_ON_NO_DONOR=local): %s",
               st.to_string().c_str());
    g_min_far.store(SIZE_MAX, std::memory_order_relaxed);
    g_mmap_min.store(SIZE_MAX, std::memory_order_relaxed);
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
  farmem::ColocateHandback handback;  // started by the pinned thread (pager/colocate.h)
};

void* local_thread_main(void* raw) {
  // A thread started by farmem itself: local memory for its whole life.
  farmem::t_local_depth = 1;
  Trampoline t = *static_cast<Trampoline*>(raw);
  __libc_free(raw);
  farmem::colocate_apply_handback(t.handback);
  return t.fn(t.arg);
}

// A thread the program starts: in the registry of threads whose CPU the
// pager's handlers may read (pager/park.h), so that the handlers not on its
// CPU can park while it is the one thread that faults (pager/fault_path.h
// "Parked handlers"). It comes out through a thread-specific data
// destructor, which glibc runs in the thread on a return, pthread_exit()
// and cancellation alike, before the thread's stack (and the rseq area in
// it) goes. Not a cleanup handler (pthread_cleanup_push): in C++ that is a
// destructor the unwinder must run, and a forced unwind by glibc's
// libgcc_s through this library's own static copy of the unwinder aborts
// the program.
pthread_key_t g_cpu_key;
bool g_cpu_key_ok = false;  // set by the constructor, before any thread of ours

void unregister_cpu(void*) {
  farmem::unregister_thread_cpu();
}

void* app_thread_main(void* raw) {
  Trampoline t = *static_cast<Trampoline*>(raw);
  __libc_free(raw);
  farmem::colocate_apply_handback(t.handback);
  // The destructor first: a thread that ends before it registered only
  // takes out what is not there.
  if (g_cpu_key_ok && pthread_setspecific(g_cpu_key, reinterpret_cast<void*>(1)) == 0)
    farmem::register_thread_cpu();
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

void on_fork_prepare_far() {
  farmem::FarBacking* b = fork_backing();
  if (b == nullptr || g_fork_child) return;
  farmem::LocalScope local;
  const int saved = errno;           // fork()'s caller sees its own errno
  t_trim_locked = trim_fork_lock();  // no trim pass holds the loader's lock in the child
  mm_fork_lock();                    // no mmap of ours is half done in the child
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

// Co-location's lock is taken last and let go first (pager/colocate.h).
void on_fork_prepare() {
  on_fork_prepare_far();
  farmem::colocate_fork_prepare();
}

void on_fork_parent() {
  farmem::colocate_fork_parent();
  if (!t_fork_prepared) return;
  t_fork_prepared = false;
  mm_fork_unlock();
  if (t_trim_locked) trim_fork_unlock();
  t_trim_locked = false;
  const int saved = errno;  // a failed fork's EAGAIN/ENOMEM, for its caller
  farmem::LocalScope local;
  if (farmem::FarBacking* b = fork_backing()) b->fork_parent();
  errno = saved;
}

void on_fork_child() {
  farmem::colocate_fork_child();
  if (t_fork_prepared) mm_fork_unlock();
  if (t_trim_locked) trim_fork_unlock();
  t_trim_locked = false;
  t_fork_prepared = false;
  g_mmap_min.store(SIZE_MAX, std::memory_order_relaxed);
  farmem::FarBacking* b = fork_backing();
  g_fork_child = true;
  int s = g_state.load(std::memory_order_relaxed);
  if (s != kBoot) g_state.store(kOff, std::memory_order_relaxed);
  g_min_far.store(SIZE_MAX, std::memory_order_relaxed);
  farmem::forget_thread_cpus();  // its lock may have been held by a thread left behind
  if (b != nullptr) b->fork_child();
}

// The main thread's time (FARMEM_STATS): on a CPU and waiting for one are
// the kernel's (/proc/self/task/<pid>/schedstat, ns), the wall time is
// since the constructor ran; the rest the thread spent asleep, in page
// faults the pager served among others (I/O, locks, sleeps). On a machine
// whose CPU speed drifts this is the figure farmem's share of a run is
// read from: a CPU-bound program sleeps next to nothing without it.
struct ThreadTimes {
  uint64_t wall_ns = 0, run_ns = 0, wait_ns = 0;
};
ThreadTimes g_main0;
bool g_have_main0 = false;

bool main_times(ThreadTimes* t) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", static_cast<int>(getpid()));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // the main thread is gone (pthread_exit), or no schedstat
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  unsigned long long run = 0, wait = 0;
  if (sscanf(buf, "%llu %llu", &run, &wait) != 2) return false;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  t->wall_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  t->run_ns = run;
  t->wait_ns = wait;
  return true;
}

void print_main_times(char* msg, size_t n) {
  ThreadTimes now;
  if (!g_have_main0 || !main_times(&now)) return;
  const double wall = static_cast<double>(now.wall_ns - g_main0.wall_ns) / 1e9;
  const double run = static_cast<double>(now.run_ns - g_main0.run_ns) / 1e9;
  const double wait = static_cast<double>(now.wait_ns - g_main0.wait_ns) / 1e9;
  const double asleep = wall > run + wait ? wall - run - wait : 0.0;
  snprintf(msg, n,
           "farmem: stats: main thread: %.3f s on a CPU, %.3f s waiting for one, %.3f s asleep "
           "(page faults, I/O, locks) of %.3f s\n",
           run, wait, asleep, wall);
  write_stderr(msg);
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
    const farmem::PagerStats ps = rt->backing().stats();
    snprintf(msg, sizeof msg,
             "farmem: stats: access tracking: %llu victim hits kept mapped, %llu refaults, "
             "%llu tail passes without a demotion (FARMEM_HOT_LAPS), %llu evicted from behind "
             "a stream (FARMEM_EVICT_BEHIND)\n",
             (unsigned long long)ps.hot_marked, (unsigned long long)ps.refaults_hot,
             (unsigned long long)ps.hot_passes, (unsigned long long)ps.evicted_behind);
    write_stderr(msg);
    if (ps.colocations > 0 || ps.flush_apart_ns > 0) {
      snprintf(msg, sizeof msg,
               "farmem: stats: co-location (FARMEM_COLOCATE): the faulting thread and the "
               "evictor shared one CPU %llu times, %.1f s in all; a write-protect apart took "
               "%.1f us on average\n",
               (unsigned long long)ps.colocations, static_cast<double>(ps.colocated_ns) / 1e9,
               static_cast<double>(ps.flush_apart_ns) / 1e3);
      write_stderr(msg);
    }
    if (ps.moves_out + ps.moves_in + ps.move_fallbacks > 0) {
      snprintf(msg, sizeof msg,
               "farmem: stats: victim cache by UFFDIO_MOVE (FARMEM_UFFD_MOVE): %llu blocks "
               "moved out, %llu moved back, %llu refused (copied instead)\n",
               (unsigned long long)ps.moves_out, (unsigned long long)ps.moves_in,
               (unsigned long long)ps.move_fallbacks);
      write_stderr(msg);
    }
    snprintf(msg, sizeof msg,
             "farmem: stats: prefetch: %llu issued, %llu used, %llu unused; zero-fill "
             "fault-around: %llu blocks; faults that waited: %llu; served from another "
             "CPU: %llu\n",
             (unsigned long long)ps.prefetch_issued, (unsigned long long)ps.prefetch_used,
             (unsigned long long)ps.prefetch_unused, (unsigned long long)ps.zero_around,
             (unsigned long long)ps.faults_waited, (unsigned long long)ps.faults_cross_cpu);
    write_stderr(msg);
  }
  trim_print_stats(msg, sizeof msg);
  write_stderr(msg);
  mm_print_stats(msg, sizeof msg);
  write_stderr(msg);
  print_main_times(msg, sizeof msg);
}

void resolve_spawn_fns();  // below, "exec and spawn"

__attribute__((constructor)) void preload_init() {
  farmem::LocalScope local;
  (void)libc_usable();
  (void)real_create();
  resolve_spawn_fns();
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
    // Constructors run in the main thread.
    g_have_main0 = main_times(&g_main0);
  }
  pthread_atfork(&on_fork_prepare, &on_fork_parent, &on_fork_child);
  g_cpu_key_ok = pthread_key_create(&g_cpu_key, &unregister_cpu) == 0;
  // The preload heap is the process's only one and is never destroyed: it
  // may use jemalloc's thread caches (far_heap.h).
  g_opts->thread_cache = true;
  g_min_far.store(g_opts->min_far > kStartMin ? g_opts->min_far : kStartMin,
                  std::memory_order_relaxed);
  mm_init_self();
  // A qualifying mmap starts the runtime too (see Anonymous mmap).
  g_mmap_min.store(g_opts->mmap_min == 0 ? SIZE_MAX : g_opts->mmap_min, std::memory_order_relaxed);
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

// ---- farmem's own allocations ---------------------------------------------
//
// The library links libstdc++ statically (a shared one costs ~1.2 MiB of
// resident text and libm in every program, inside its budget), and with it
// libstdc++'s own calls of malloc: operator new, and the emergency pool for
// exceptions, 73 KiB allocated by its static constructor, after ours. As
// a call of the interposed malloc that pool started the runtime in every
// program, with a donor or not (tests/allocator/preload_policy.sh: a
// program that allocates little never connects). So every call of the
// allocation functions from inside this library but outside this file
// (libstdc++, the runtime, the pager) is linked to these instead
// (-Wl,--wrap in preload/CMakeLists.txt): what farmem allocates for itself
// is local, whatever the thread or scope. free() and realloc() keep the
// interposed logic: a far block handed to them is still freed far.
#define FARMEM_WRAP extern "C" __attribute__((visibility("hidden")))
FARMEM_WRAP void* __wrap_malloc(size_t n);
FARMEM_WRAP void* __wrap_calloc(size_t c, size_t n);
FARMEM_WRAP void* __wrap_realloc(void* p, size_t n);
FARMEM_WRAP void __wrap_free(void* p);
FARMEM_WRAP void* __wrap_aligned_alloc(size_t a, size_t n);
FARMEM_WRAP int __wrap_posix_memalign(void** out, size_t a, size_t n);
void* __wrap_malloc(size_t n) {
  return __libc_malloc(n);
}
void* __wrap_calloc(size_t c, size_t n) {
  return __libc_calloc(c, n);
}
void* __wrap_realloc(void* p, size_t n) {
  return is_far(p) ? realloc(p, n) : __libc_realloc(p, n);
}
void __wrap_free(void* p) {
  free(p);
}
void* __wrap_aligned_alloc(size_t a, size_t n) {
  return __libc_memalign(a, n);
}
int __wrap_posix_memalign(void** out, size_t a, size_t n) {
  if (a < sizeof(void*) || (a & (a - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(a, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

FARMEM_EXPORT size_t malloc_usable_size(void* p) noexcept {
  if (p == nullptr) return 0;
  if (is_far(p)) return g_heap.load(std::memory_order_relaxed)->usable_size(p);
  return libc_usable()(p);
}

FARMEM_EXPORT int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*),
                                 void* arg) noexcept {
  CreateFn real = real_create();
  auto* tr = static_cast<Trampoline*>(__libc_malloc(sizeof(Trampoline)));
  if (tr == nullptr) return EAGAIN;
  tr->fn = fn;
  tr->arg = arg;
  // A thread the pinned thread starts gets the pinned thread's own mask
  // back, unless the program asked for the pin's CPU in attr itself.
  if (farmem::colocate_handback(&tr->handback) && attr != nullptr) {
    cpu_set_t asked;
    if (pthread_attr_getaffinity_np(attr, sizeof asked, &asked) == 0 && CPU_COUNT(&asked) == 1 &&
        CPU_ISSET(tr->handback.cpu, &asked))
      tr->handback.active = false;
  }
  int rc = real(t, attr, farmem::in_local_scope() ? &local_thread_main : &app_thread_main, tr);
  if (rc != 0) __libc_free(tr);
  return rc;
}

// ---- exec and spawn ---------------------------------------------------------
//
// Co-location (pager/colocate.h) may hold the program's faulting thread on
// one CPU. A program started from it must not inherit that: the exec
// family gives the calling task its own mask back first (the pinned thread
// itself, or a fork / vfork child of it: async-signal-safe, nothing
// written), and posix_spawn, system and popen lift the pin for the call
// (glibc's child execs without passing through any wrapper). The real
// functions are looked up in our constructor: a vfork child must not call
// dlsym.

namespace {

using ExecveFn = int (*)(const char*, char* const[], char* const[]);
using ExecvFn = int (*)(const char*, char* const[]);
using FexecveFn = int (*)(int, char* const[], char* const[]);
using SpawnFn = int (*)(pid_t*, const char*, const posix_spawn_file_actions_t*,
                        const posix_spawnattr_t*, char* const[], char* const[]);
using SystemFn = int (*)(const char*);
using PopenFn = FILE* (*)(const char*, const char*);
struct SpawnFns {
  ExecveFn execve, execvpe;
  ExecvFn execv, execvp;
  FexecveFn fexecve;
  SpawnFn posix_spawn, posix_spawnp;
  SystemFn system;
  PopenFn popen;
};
SpawnFns g_spawn;

template <typename F>
void resolve_one(F* out, const char* name) {
  *out = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
  if (*out == nullptr) farmem::fatal("farmem preload: dlsym(%s) failed: %s", name, dlerror());
}

void resolve_spawn_fns() {
  resolve_one(&g_spawn.execve, "execve");
  resolve_one(&g_spawn.execvpe, "execvpe");
  resolve_one(&g_spawn.execv, "execv");
  resolve_one(&g_spawn.execvp, "execvp");
  resolve_one(&g_spawn.fexecve, "fexecve");
  resolve_one(&g_spawn.posix_spawn, "posix_spawn");
  resolve_one(&g_spawn.posix_spawnp, "posix_spawnp");
  resolve_one(&g_spawn.system, "system");
  resolve_one(&g_spawn.popen, "popen");
}

// The pin lifted for the life of one call.
class SpawnUnpinned {
 public:
  SpawnUnpinned() { farmem::colocate_suspend(); }
  ~SpawnUnpinned() { farmem::colocate_resume(); }
  SpawnUnpinned(const SpawnUnpinned&) = delete;
  SpawnUnpinned& operator=(const SpawnUnpinned&) = delete;
};

// execl's arguments as an argv (on the stack: no allocation in a vfork
// child): arg0, then the variadic ones up to and with the NULL. With
// want_env (execle), the environment after the NULL goes to envp_out.
#define FARMEM_COLLECT_ARGV(argv, arg0, want_env, envp_out)               \
  size_t argc_ = 1; /* arg0: glibc declares it non-null */                \
  {                                                                       \
    va_list ap_;                                                          \
    va_start(ap_, arg0);                                                  \
    while (va_arg(ap_, const char*) != nullptr) ++argc_;                  \
    va_end(ap_);                                                          \
  }                                                                       \
  char** argv = static_cast<char**>(alloca((argc_ + 1) * sizeof(char*))); \
  {                                                                       \
    va_list ap_;                                                          \
    va_start(ap_, arg0);                                                  \
    argv[0] = const_cast<char*>(arg0);                                    \
    for (size_t i_ = 1; i_ <= argc_; ++i_) argv[i_] = va_arg(ap_, char*); \
    if (want_env) envp_out = va_arg(ap_, char**);                         \
    va_end(ap_);                                                          \
  }

}  // namespace

FARMEM_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) noexcept {
  farmem::colocate_restore_self();
  return g_spawn.execve(path, argv, envp);
}

FARMEM_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) noexcept {
  farmem::colocate_restore_self();
  return g_spawn.execvpe(file, argv, envp);
}

FARMEM_EXPORT int execv(const char* path, char* const argv[]) noexcept {
  farmem::colocate_restore_self();
  return g_spawn.execv(path, argv);
}

FARMEM_EXPORT int execvp(const char* file, char* const argv[]) noexcept {
  farmem::colocate_restore_self();
  return g_spawn.execvp(file, argv);
}

FARMEM_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) noexcept {
  farmem::colocate_restore_self();
  return g_spawn.fexecve(fd, argv, envp);
}

FARMEM_EXPORT int execl(const char* path, const char* arg, ...) noexcept {
  char** envp_unused = nullptr;
  FARMEM_COLLECT_ARGV(argv, arg, false, envp_unused);
  (void)envp_unused;
  farmem::colocate_restore_self();
  return g_spawn.execv(path, argv);
}

FARMEM_EXPORT int execlp(const char* file, const char* arg, ...) noexcept {
  char** envp_unused = nullptr;
  FARMEM_COLLECT_ARGV(argv, arg, false, envp_unused);
  (void)envp_unused;
  farmem::colocate_restore_self();
  return g_spawn.execvp(file, argv);
}

FARMEM_EXPORT int execle(const char* path, const char* arg, ...) noexcept {
  char** envp = nullptr;
  FARMEM_COLLECT_ARGV(argv, arg, true, envp);
  farmem::colocate_restore_self();
  return g_spawn.execve(path, argv, envp);
}

FARMEM_EXPORT int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* fa,
                              const posix_spawnattr_t* attr, char* const argv[],
                              char* const envp[]) noexcept {
  SpawnUnpinned unpinned;
  return g_spawn.posix_spawn(pid, path, fa, attr, argv, envp);
}

FARMEM_EXPORT int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* fa,
                               const posix_spawnattr_t* attr, char* const argv[],
                               char* const envp[]) noexcept {
  SpawnUnpinned unpinned;
  return g_spawn.posix_spawnp(pid, file, fa, attr, argv, envp);
}

FARMEM_EXPORT int system(const char* command) {
  SpawnUnpinned unpinned;
  return g_spawn.system(command);
}

FARMEM_EXPORT FILE* popen(const char* command, const char* type) {
  SpawnUnpinned unpinned;
  return g_spawn.popen(command, type);
}

// ---- anonymous mmap ---------------------------------------------------------
//
// Anonymous mmap. Once the runtime runs (or to start it, as a large malloc
// does), an application's mmap()/mmap64() of at least FARMEM_MMAP_MIN bytes
// (default 64K; 0: off) that is exactly
//   addr NULL, prot PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
//   [| MAP_NORESERVE | MAP_POPULATE], fd -1, offset 0
// gets a page-aligned range of the far region instead, from the far heap's
// extent allocator (ExtentSpace::alloc: fresh or dropped space, so it reads
// as zeros). Everything else stays with the kernel: MAP_SHARED, files,
// PROT_EXEC or PROT_NONE, MAP_FIXED*, MAP_STACK, MAP_GROWSDOWN,
// MAP_HUGETLB, MAP_32BIT, MAP_LOCKED, an address hint, and every call made
// by this library itself (jemalloc's own metadata, the pager, found by the
// caller's return address) or in a LocalScope. glibc's own mmaps (malloc's
// large chunks, thread stacks, ld.so) are internal calls and never reach us.
//
// The ranges handed out are kept in a sorted array of [begin, end) (g_mm,
// memory from the kernel, never from a heap, one mutex), so that on them:
//   munmap       drops the pages (they read as zeros, budget and remote copies
//                freed) and gives the range back; partial unmaps work; parts
//                of the far region not handed out by mmap are left alone
//   madvise      DONTNEED / FREE: drop (reads back zeros); WIPEONFORK and
//                REMOVE: EINVAL (cannot be honoured); other known advice: 0
//   mremap       shrink in place; grow in place when the space after it is
//                free, else move (MREMAP_MAYMOVE; without it ENOMEM);
//                MREMAP_FIXED / MREMAP_DONTUNMAP: EINVAL
//   mprotect     any protection the kernel takes, enforced by the kernel (a
//                write to PROT_READ, any access to PROT_NONE: SIGSEGV at the
//                address). A protected range is pinned first (fetched and
//                kept resident: the pager never has to read, move or refill
//                it, which the protection would forbid) and is remembered
//                (g_prot); read-write again unpins it. Pins count against the
//                local budget and are limited (Pager::pin): past the limit
//                mprotect fails with ENOMEM and changes nothing (a warning
//                says why, once). munmap, MAP_FIXED over it and mremap's cut
//                tail make a range read-write first (a recycled range must
//                be); madvise(DONTNEED) keeps the protection (the range is
//                briefly writable for the drop, then pinned again); mremap
//                of a range with one protection moves it with the range and
//                gives the grown part the same, and of a range with mixed
//                protections fails with EFAULT, as the kernel's (several
//                VMAs there); shrinking across protections works. Needs
//                FARMEM_BLOCK_SIZE=4K (the default), else EACCES.
//   mmap FIXED   over a range of ours with the qualifying prot and flags:
//                its pages are dropped (a fresh zeroed mapping); any other
//                MAP_FIXED into the far region: EINVAL, MAP_FIXED_NOREPLACE:
//                EEXIST (the kernel would replace the pager's mapping)
// Calls on ranges outside the far region, or parts of them, go to the
// kernel. The rest of the far region (the far heap's malloc memory) is
// read-write memory to them too: madvise(DONTNEED / FREE) drops its pages
// (they read as zeros, as from the kernel; jemalloc keeps no metadata
// there), mprotect as above, munmap leaves it alone (it is not a mapping of
// the program's). The kernel never sees a call on the far region: it would
// split, protect or drop the pager's mapping under it. fork(): the far
// region's snapshot covers these ranges (the child sees them as at the
// fork); in the child new mappings come from the kernel and dropped pages
// are zeroed with memset.

namespace {

std::atomic<size_t> g_mmap_min{SIZE_MAX};  // SIZE_MAX: off (or not yet / no more)
uintptr_t g_self_lo = 0, g_self_len = 0;   // this library's loaded segments
std::atomic<uint64_t> g_mmap_count{0}, g_mmap_bytes{0}, g_mmap_fallbacks{0};
std::atomic<uint64_t> g_prot_bytes{0}, g_prot_calls{0}, g_prot_refused{0};  // mprotect
constexpr int kRW = PROT_READ | PROT_WRITE;
constexpr uintptr_t kPageMask = 4095;

void* sys_mmap(void* a, size_t n, int prot, int flags, int fd, off_t off) {
  return reinterpret_cast<void*>(syscall(SYS_mmap, a, n, prot, flags, fd, off));
}
int sys_munmap(void* a, size_t n) {
  return static_cast<int>(syscall(SYS_munmap, a, n));
}

int find_self(struct dl_phdr_info* info, size_t, void*) {
  const uintptr_t me = reinterpret_cast<uintptr_t>(&find_self);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t b = info->dlpi_addr + ph.p_vaddr, e = b + ph.p_memsz;
    if (b < lo) lo = b;
    if (e > hi) hi = e;
    if (me >= b && me < e) mine = true;
  }
  if (!mine) return 0;
  g_self_lo = lo;
  g_self_len = hi - lo;
  return 1;
}

inline bool from_self(uintptr_t ra) {
  return ra - g_self_lo < g_self_len;
}
// Calls made by this library (the pager drops pages with madvise) or its
// threads go straight to the kernel.
inline bool mm_kernel_caller(void* ra) {
  return from_self(reinterpret_cast<uintptr_t>(ra)) || farmem::in_local_scope();
}

// The ranges handed out by mmap, sorted by begin, disjoint.
struct MmRange {
  uintptr_t b, e;
  int prot;  // g_prot only: the protection the program asked for
};
struct MmMap {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  MmRange* r = nullptr;
  size_t n = 0, cap = 0;

  // Room for `more` entries; false when the kernel has no memory.
  bool reserve(size_t more) {
    if (n + more <= cap) return true;
    size_t c = cap ? cap * 2 : 256;
    while (c < n + more) c *= 2;
    void* p = r ? reinterpret_cast<void*>(syscall(SYS_mremap, r, cap * sizeof(MmRange),
                                                  c * sizeof(MmRange), MREMAP_MAYMOVE))
                : sys_mmap(nullptr, c * sizeof(MmRange), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    r = static_cast<MmRange*>(p);
    cap = c;
    return true;
  }
  // First entry with e > a.
  size_t lower(uintptr_t a) const {
    size_t lo = 0, hi = n;
    while (lo < hi) {
      size_t m = (lo + hi) / 2;
      if (r[m].e <= a) {
        lo = m + 1;
      } else {
        hi = m;
      }
    }
    return lo;
  }
  // reserve(1) first.
  void insert(uintptr_t b, uintptr_t e, int prot = 0) {
    size_t i = lower(b);
    memmove(&r[i + 1], &r[i], (n - i) * sizeof(MmRange));
    r[i] = MmRange{b, e, prot};
    ++n;
  }
  // Removes [b, e) from the map, calling fn(ib, ie, prot) for each piece
  // of an entry inside it first. reserve(1) first (one entry may split).
  template <class Fn>
  void carve(uintptr_t b, uintptr_t e, Fn fn) {
    size_t i = lower(b);
    while (i < n && r[i].b < e) {
      MmRange& x = r[i];
      const uintptr_t ib = x.b > b ? x.b : b, ie = x.e < e ? x.e : e;
      fn(ib, ie, x.prot);
      if (x.b < ib && x.e > ie) {  // split
        const uintptr_t tail_e = x.e;
        x.e = ib;
        insert(ie, tail_e, x.prot);
        return;
      }
      if (x.b < ib) {
        x.e = ib;
        ++i;
      } else if (x.e > ie) {
        x.b = ie;
        ++i;
      } else {
        memmove(&r[i], &r[i + 1], (n - i - 1) * sizeof(MmRange));
        --n;
      }
    }
  }
  // fn(ib, ie, prot) for each piece of an entry inside [b, e).
  template <class Fn>
  void each(uintptr_t b, uintptr_t e, Fn fn) const {
    for (size_t i = lower(b); i < n && r[i].b < e; ++i) {
      fn(r[i].b > b ? r[i].b : b, r[i].e < e ? r[i].e : e, r[i].prot);
    }
  }
  // Is [b, e) entirely ours?
  bool covered(uintptr_t b, uintptr_t e) const {
    for (size_t i = lower(b); i < n && b < e; ++i) {
      if (r[i].b > b) return false;
      b = r[i].e;
    }
    return b >= e;
  }
  // Index of the entry holding a, or n.
  size_t holding(uintptr_t a) const {
    size_t i = lower(a);
    return i < n && r[i].b <= a ? i : n;
  }
};
MmMap g_mm;
MmMap g_prot;  // far ranges the program protected (not read-write); under g_mm.mu

struct MmLock {
  MmLock() { pthread_mutex_lock(&g_mm.mu); }
  ~MmLock() { pthread_mutex_unlock(&g_mm.mu); }
  MmLock(const MmLock&) = delete;
  MmLock& operator=(const MmLock&) = delete;
};

void mm_fork_lock() {
  pthread_mutex_lock(&g_mm.mu);
}
void mm_fork_unlock() {
  pthread_mutex_unlock(&g_mm.mu);
}
void mm_init_self() {
  dl_iterate_phdr(&find_self, nullptr);
}

// ---- Code and read-only data ------------------------------------------------
// The program's and its libraries' code and read-only data are file pages:
// resident once touched, and so inside the same peak RSS as the heap a
// user budgets, while a kernel under a memory limit reclaims the cold ones
// first (they are clean: a later touch is a minor fault from the page
// cache). Left alone, a process under farmem holds more of them than
// without it (eval kv: libc, libm, libstdc++, ld.so and this library held
// 3.6 MiB at exit against 2.4 MiB without farmem), for two reasons:
//   - start-up and exit run code once (farmem's options, connections and
//     jemalloc's set-up; the program's initialisation; destructors), and
//     it stays resident;
//   - the kernel's fault-around maps the 16 pages around each page touched
//     (eval kv at exit: 816 KiB of libc's code resident, 188 KiB of it
//     touched).
// So once the runtime has started (FARMEM_TRIM_TEXT=2, the default):
//   1. split: every loaded object's read-only segments are split into one
//      mapping per page (MADV_RANDOM on every second page: mappings with
//      different flags do not merge, and fault-around stops at a
//      mapping's end), so a touch maps one page;
//   2. drop: their resident pages leave the page table (MADV_DONTNEED; the
//      pages stay in the page cache);
// and then, from a thread of its own, every FARMEM_TRIM_PERIOD_MS (1 s): drop again
// (split first when objects were loaded since), so that what stays
// resident is what was used in the last period. eval kv then ends at 1.0
// MiB less peak RSS than without farmem, not 0.9 MiB more. Cost: one
// minor fault per page of code used in a period (a few hundred a second),
// one mapping per page in /proc/PID/maps (the splits stop at a quarter of
// vm.max_map_count; objects past it are only dropped), a pagemap read of 8
// bytes per page per pass.
//
// Safety. A page is dropped only when /proc/self/pagemap says it is a
// present file page: a private copy (a relocated PT_GNU_RELRO page, a
// debugger's breakpoint, text patched at run time) is anonymous and kept,
// and writable segments and PT_GNU_RELRO are not even looked at. The walk
// runs inside dl_iterate_phdr(), which holds the loader's lock, so no
// object is unmapped under it (dlclose() unlinks an object under that lock
// before it unmaps it). It runs in its own thread because that lock may be
// held by a thread that waits on a far-memory fault: no pager thread ever
// waits for it. Skipped under a debugger (TracerPid in /proc/self/status);
// a fork()ed child has no trim thread. FARMEM_TRIM_TEXT=1: this library
// only, once (the 1.3 MiB of the pager, the transports and a private
// jemalloc, of which paging uses ~80 pages); 0: nothing.
std::atomic<uint64_t> g_trim_passes{0};
std::atomic<uint64_t> g_trim_bytes{0};  // resident file pages dropped
int g_pagemap_fd = -1;
// Held across every pass and across fork() by the forking thread: glibc's
// fork does not reset the loader's write lock in the child, so a fork in
// the middle of a pass (which holds it, in dl_iterate_phdr) would leave the
// child's dlopen and C++ exception unwinding (which walks the objects with
// dl_iterate_phdr) blocked for good.
pthread_mutex_t g_trim_mu = PTHREAD_MUTEX_INITIALIZER;
int64_t g_split_room = 0;                 // pages we may still split (mappings to add)
unsigned long long g_split_adds = ~0ull;  // dlpi_adds when objects were last split

struct TrimRanges {
  uintptr_t b[8], e[8];  // read-only segments, whole pages
  int n = 0;
  uintptr_t wb[8], we[8];  // writable segments and PT_GNU_RELRO: never dropped
  int wn = 0;
};

TrimRanges trim_ranges(const struct dl_phdr_info* info) {
  TrimRanges t;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    const uintptr_t b = info->dlpi_addr + ph.p_vaddr, e = b + ph.p_memsz;
    const bool keep = ph.p_type == PT_GNU_RELRO || (ph.p_type == PT_LOAD && (ph.p_flags & PF_W));
    if (keep && t.wn < 8) {
      t.wb[t.wn] = b & ~kPageMask;
      t.we[t.wn++] = (e + kPageMask) & ~kPageMask;
    } else if (ph.p_type == PT_LOAD && !keep && t.n < 8) {
      t.b[t.n] = b & ~kPageMask;
      t.e[t.n++] = (e + kPageMask) & ~kPageMask;
    }
  }
  return t;
}

bool kept(const TrimRanges& t, uintptr_t p) {
  for (int j = 0; j < t.wn; ++j) {
    if (p >= t.wb[j] && p < t.we[j]) return true;
  }
  return false;
}

// fn(b, e) for each run of pages of t's read-only segments that are not kept.
template <class Fn>
void for_each_droppable(const TrimRanges& t, Fn fn) {
  const uintptr_t page = kPageMask + 1;
  for (int i = 0; i < t.n; ++i) {
    uintptr_t b = t.b[i];
    for (uintptr_t p = t.b[i]; p <= t.e[i]; p += page) {
      if (p < t.e[i] && !kept(t, p)) continue;
      if (b < p) fn(b, p);
      b = p + page;
    }
  }
}

bool traced() {
  int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = strstr(buf, "TracerPid:");
  return p != nullptr && strtol(p + 10, nullptr, 10) != 0;
}

// One mapping per page of [b, e): every second page random, so that no
// two neighbours merge. Idempotent.
void split_pages(uintptr_t b, uintptr_t e) {
  const uintptr_t page = kPageMask + 1;
  for (uintptr_t p = b; p < e; p += page) {
    if ((p / page) & 1) syscall(SYS_madvise, p, page, MADV_RANDOM);
  }
}

// Drops the present file pages of [b, e) from the page table; keeps the
// rest (see Safety above). Returns the bytes dropped.
uint64_t drop_file_pages(uintptr_t b, uintptr_t e) {
  constexpr uint64_t kPresent = 1ull << 63, kFilePage = 1ull << 61;
  const uintptr_t page = kPageMask + 1;
  uint64_t ent[128], dropped = 0;
  uintptr_t run = 0;  // start of the current run of pages to drop, or 0
  auto flush = [&](uintptr_t p) {
    if (run != 0 && syscall(SYS_madvise, run, p - run, MADV_DONTNEED) == 0) dropped += p - run;
    run = 0;
  };
  uintptr_t p = b;
  while (p < e) {
    const size_t n = std::min<size_t>(128, (e - p) / page);
    const ssize_t want = static_cast<ssize_t>(n * sizeof ent[0]);
    if (pread(g_pagemap_fd, ent, want, static_cast<off_t>(p / page * sizeof ent[0])) != want) {
      break;
    }
    for (size_t i = 0; i < n; ++i, p += page) {
      if ((ent[i] & (kPresent | kFilePage)) != (kPresent | kFilePage)) {
        flush(p);
      } else if (run == 0) {
        run = p;
      }
    }
  }
  flush(p);
  return dropped;
}

struct TrimPass {
  bool own_only;
  bool split;
  bool first = true;
  uint64_t dropped = 0;
};

int trim_object(struct dl_phdr_info* info, size_t, void* arg) {
  auto* pass = static_cast<TrimPass*>(arg);
  if (pass->first && !pass->own_only) {
    pass->split = info->dlpi_adds != g_split_adds;  // objects were loaded since the last split
    g_split_adds = info->dlpi_adds;
  }
  pass->first = false;
  if (info->dlpi_addr == getauxval(AT_SYSINFO_EHDR)) return 0;  // the vDSO: not a file
  const TrimRanges t = trim_ranges(info);
  const uintptr_t me = reinterpret_cast<uintptr_t>(&trim_object);
  bool mine = false;
  uint64_t pages = 0;
  for (int i = 0; i < t.n; ++i) {
    mine = mine || (me >= t.b[i] && me < t.e[i]);
    pages += (t.e[i] - t.b[i]) / (kPageMask + 1);
  }
  if (pass->own_only && !mine) return 0;
  if (pass->split && (mine || static_cast<int64_t>(pages) <= g_split_room)) {
    if (!mine) g_split_room -= static_cast<int64_t>(pages);
    for_each_droppable(t, [](uintptr_t b, uintptr_t e) { split_pages(b, e); });
  }
  for_each_droppable(t, [&](uintptr_t b, uintptr_t e) { pass->dropped += drop_file_pages(b, e); });
  return 0;
}

void trim_pass(bool own_only) {
  if (traced()) return;
  TrimPass pass{own_only, own_only};
  pthread_mutex_lock(&g_trim_mu);
  dl_iterate_phdr(&trim_object, &pass);
  pthread_mutex_unlock(&g_trim_mu);
  g_trim_passes.fetch_add(1, std::memory_order_relaxed);
  g_trim_bytes.fetch_add(pass.dropped, std::memory_order_relaxed);
}

void* trim_thread_main(void*) {
  pthread_setname_np(pthread_self(), "farmem-trim");
  for (;;) {
    const uint32_t ms = g_opts->trim_period_ms;
    struct timespec ts = {static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR) {
    }
    trim_pass(false);
  }
}

// From start_runtime() (a LocalScope: the thread is local for life).
void start_trimming() {
  if (g_opts->trim_text == 0) return;
  g_pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (g_pagemap_fd < 0) {
    FARMEM_LOG(kDebug, "preload: code is not trimmed: /proc/self/pagemap: %s", strerror(errno));
    return;
  }
  if (g_opts->trim_text == 1) {
    trim_pass(true);
    return;
  }
  long max_maps = 65530;
  if (FILE* f = fopen("/proc/sys/vm/max_map_count", "re")) {
    if (fscanf(f, "%ld", &max_maps) != 1) max_maps = 65530;
    fclose(f);
  }
  g_split_room = max_maps / 4;
  trim_pass(false);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 << 10);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // the program's signals are not for it
  pthread_t t;
  if (int rc = pthread_create(&t, &attr, &trim_thread_main, nullptr); rc != 0) {
    FARMEM_LOG(kWarn, "preload: no thread to trim code (%s): it is trimmed once only",
               strerror(rc));
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
}
// A pass takes milliseconds, but it may wait on far-memory faults and on
// the loader's lock; a fork() from inside a dl_iterate_phdr() callback
// would hold the latter, so the wait is bounded, and the fork then goes on
// without the lock (the pass cannot be in the loader's lock then: the
// forking thread has it).
bool trim_fork_lock() {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 2;
  return pthread_mutex_timedlock(&g_trim_mu, &until) == 0;
}

void trim_fork_unlock() {
  pthread_mutex_unlock(&g_trim_mu);
}

void trim_print_stats(char* buf, size_t n) {
  snprintf(buf, n,
           "farmem: stats: code and read-only data (FARMEM_TRIM_TEXT %d): trim passes: %llu, "
           "%s of resident pages dropped\n",
           g_opts->trim_text, (unsigned long long)g_trim_passes.load(std::memory_order_relaxed),
           farmem::format_size(g_trim_bytes.load(std::memory_order_relaxed)).c_str());
}

void mm_print_stats(char* buf, size_t n) {
  snprintf(buf, n,
           "farmem: stats: anonymous mmap: %llu mappings far (FARMEM_MMAP_MIN %s), %s live; %llu "
           "left to the kernel (far region full); mprotect: %llu calls, %s protected (held "
           "resident), %llu refused\n",
           (unsigned long long)g_mmap_count.load(std::memory_order_relaxed),
           g_opts->mmap_min ? farmem::format_size(g_opts->mmap_min).c_str() : "0, off",
           farmem::format_size(g_mmap_bytes.load(std::memory_order_relaxed)).c_str(),
           (unsigned long long)g_mmap_fallbacks.load(std::memory_order_relaxed),
           (unsigned long long)g_prot_calls.load(std::memory_order_relaxed),
           farmem::format_size(g_prot_bytes.load(std::memory_order_relaxed)).c_str(),
           (unsigned long long)g_prot_refused.load(std::memory_order_relaxed));
}

inline uintptr_t page_up(uintptr_t n) {
  return (n + kPageMask) & ~kPageMask;
}

// [b, e) ∩ the far region; false when empty.
bool far_part(uintptr_t b, uintptr_t e, uintptr_t* fb, uintptr_t* fe) {
  const uintptr_t base = g_base.load(std::memory_order_acquire);
  const uintptr_t size = g_size.load(std::memory_order_acquire);
  if (size == 0) return false;
  *fb = b > base ? b : base;
  *fe = e < base + size ? e : base + size;
  return *fb < *fe;
}

// The kernel's parts of [b, e) around the far part [fb, fe): fn(ptr, len)
// for each; the first failure is returned.
template <class Fn>
int kernel_parts(uintptr_t b, uintptr_t e, uintptr_t fb, uintptr_t fe, Fn fn) {
  if (b < fb) {
    if (int rc = fn(reinterpret_cast<void*>(b), fb - b); rc != 0) return rc;
  }
  if (fe < e) return fn(reinterpret_cast<void*>(fe), e - fe);
  return 0;
}

// Where a munmap / madvise / mprotect of [addr, addr+len) goes. kKernel:
// no far part (or a call from our own library): the kernel's alone.
// kInvalid: a far part but addr is not page-aligned (EINVAL). kFar: [*b,
// *e) is the page-rounded range and [*fb, *fe) its far part.
enum class MmRoute { kKernel, kInvalid, kFar };
MmRoute mm_route(void* addr, size_t len, void* caller, uintptr_t* b, uintptr_t* e, uintptr_t* fb,
                 uintptr_t* fe) {
  *b = reinterpret_cast<uintptr_t>(addr);
  *e = page_up(*b + len);
  if (len == 0 || *e < *b || mm_kernel_caller(caller) || !far_part(*b, *e, fb, fe)) {
    return MmRoute::kKernel;
  }
  return (*b & kPageMask) != 0 ? MmRoute::kInvalid : MmRoute::kFar;
}

inline FarHeap* mm_heap() {
  return g_heap.load(std::memory_order_acquire);
}

// Makes [b, e) (ours) read as zeros: drop, or in a fork()ed child (where
// the pages cannot be dropped) zero them.
void mm_zero(uintptr_t b, uintptr_t e) {
  farmem::LocalScope local;
  if (!mm_heap()->space().drop(reinterpret_cast<void*>(b), e - b)) {
    memset(reinterpret_cast<void*>(b), 0, e - b);
  }
}

// Removes [b, e) from the map and gives the pieces of it that were ours
// back to the far heap (their pages dropped). g_mm.mu held. false: no
// memory for a split (nothing changed).
bool mm_unmap_locked(uintptr_t b, uintptr_t e) {
  if (b >= e) return true;
  if (!g_mm.reserve(1)) return false;
  farmem::LocalScope local;
  FarHeap* h = mm_heap();
  g_mm.carve(b, e, [h](uintptr_t ib, uintptr_t ie, int) {
    // In a fork()ed child the drop fails and the range is not reused: the
    // child keeps the parent's snapshot pages there (nothing is lost).
    (void)h->space().give_back(reinterpret_cast<void*>(ib), ie - ib, true, true);
    g_mmap_bytes.fetch_sub(ie - ib, std::memory_order_relaxed);
  });
  return true;
}

// mprotect of far memory (see the comment at the top of this part): a
// range the program protects (anything but read-write) is pinned, so the
// pager never has to read, move or refill it while the kernel enforces the
// protection, and g_prot remembers it; read-write again unpins it.
std::atomic<bool> g_prot_warned{false};

int sys_mprotect(uintptr_t b, uintptr_t e, int prot) {
  return static_cast<int>(syscall(SYS_mprotect, reinterpret_cast<void*>(b), e - b, prot));
}

// Pins (or unpins) [b, e); a no-op in a fork()ed child, where nothing is
// evicted.
farmem::Status mm_pin(uintptr_t b, uintptr_t e, bool pin) {
  if (g_fork_child || b >= e) return farmem::ok_status();
  return mm_heap()->backing().hint(pin ? farmem::FarHint::kPin : farmem::FarHint::kUnpin,
                                   reinterpret_cast<void*>(b), e - b);
}

// fn(gb, ge) for each part of [b, e) that g_prot does not hold, until fn
// returns false; returns where it stopped (e when it did not).
template <class Fn>
uintptr_t mm_unprotected_gaps(uintptr_t b, uintptr_t e, Fn fn) {
  uintptr_t at = b;
  for (size_t i = g_prot.lower(b); i < g_prot.n && g_prot.r[i].b < e; ++i) {
    const uintptr_t ib = g_prot.r[i].b > b ? g_prot.r[i].b : b;
    if (at < ib && !fn(at, ib)) return at;
    at = g_prot.r[i].e < e ? g_prot.r[i].e : e;
  }
  if (at < e && !fn(at, e)) return at;
  return e;
}

// Read-write again: [b, e) (page-aligned, g_mm.mu held) loses its
// protection in the kernel, then its pins. -1 with errno when the kernel
// refused (nothing of ours changed then).
int mm_unprotect_locked(uintptr_t b, uintptr_t e) {
  int rc = 0;
  g_prot.each(b, e, [&rc](uintptr_t ib, uintptr_t ie, int) {
    if (rc == 0 && sys_mprotect(ib, ie, kRW) != 0) rc = -1;
  });
  if (rc != 0) return rc;
  if (!g_prot.reserve(1)) {
    errno = ENOMEM;
    return -1;
  }
  g_prot.carve(b, e, [](uintptr_t ib, uintptr_t ie, int) {
    (void)mm_pin(ib, ie, false);
    g_prot_bytes.fetch_sub(ie - ib, std::memory_order_relaxed);
  });
  return 0;
}

// mprotect of [b, e) (page-aligned, far, g_mm.mu held).
int mm_protect_locked(uintptr_t b, uintptr_t e, int prot) {
  g_prot_calls.fetch_add(1, std::memory_order_relaxed);
  if (prot == kRW) return mm_unprotect_locked(b, e);
  if (mm_heap()->backing().block_size() != 4096) {
    // Pins cover whole blocks, protections pages: not worth the bookkeeping.
    if (!g_prot_warned.exchange(true)) {
      fprintf(stderr,
              "farmem: mprotect(%p, %zu, %d) on far memory refused (EACCES): protecting far "
              "memory needs FARMEM_BLOCK_SIZE=4K (it is %u); or keep such mappings with the "
              "kernel (FARMEM_MMAP_MIN=off)\n",
              reinterpret_cast<void*>(b), static_cast<size_t>(e - b), prot,
              mm_heap()->backing().block_size());
    }
    errno = EACCES;
    return -1;
  }
  if (!g_prot.reserve(2)) {
    errno = ENOMEM;
    return -1;
  }
  // The parts not protected yet are read-write: pinning may touch them.
  farmem::Status st;
  const uintptr_t stop = mm_unprotected_gaps(b, e, [&st](uintptr_t gb, uintptr_t ge) {
    st = mm_pin(gb, ge, true);
    return st.ok();
  });
  if (!st.ok() || sys_mprotect(b, e, prot) != 0) {
    const int err = st.ok() ? errno : ENOMEM;
    mm_unprotected_gaps(b, stop, [](uintptr_t gb, uintptr_t ge) {
      (void)mm_pin(gb, ge, false);
      return true;
    });
    if (!st.ok()) {
      g_prot_refused.fetch_add(1, std::memory_order_relaxed);
      if (!g_prot_warned.exchange(true)) {
        fprintf(stderr,
                "farmem: mprotect(%p, %zu, %d) on far memory failed (ENOMEM): a protected range "
                "stays resident until it is read-write again, and %s (this warning is shown "
                "once)\n",
                reinterpret_cast<void*>(b), static_cast<size_t>(e - b), prot, st.message().c_str());
      }
    }
    errno = err;
    return -1;
  }
  g_prot.carve(b, e, [](uintptr_t ib, uintptr_t ie, int) {
    g_prot_bytes.fetch_sub(ie - ib, std::memory_order_relaxed);
  });
  g_prot.insert(b, e, prot);
  g_prot_bytes.fetch_add(e - b, std::memory_order_relaxed);
  return 0;
}

inline bool mm_qualifies(void* addr, int prot, int flags, int fd, off_t off) {
  return addr == nullptr && fd == -1 && off == 0 && prot == (PROT_READ | PROT_WRITE) &&
         (flags & ~(MAP_NORESERVE | MAP_POPULATE)) == (MAP_PRIVATE | MAP_ANONYMOUS);
}

// A far range of n bytes (page multiple) in the map; nullptr: go to the kernel.
void* mm_far_map(size_t n) {
  FarHeap* h = far_heap();  // starts the runtime while kArmed
  if (h == nullptr || g_fork_child) return nullptr;
  farmem::LocalScope local;
  MmLock lk;
  if (!g_mm.reserve(1)) return nullptr;
  void* p = h->space().alloc(nullptr, n, 4096);
  if (p == nullptr) {
    g_mmap_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  g_mm.insert(b, b + n);
  g_mmap_count.fetch_add(1, std::memory_order_relaxed);
  g_mmap_bytes.fetch_add(n, std::memory_order_relaxed);
  return p;
}

void* mm_fail(int err) {
  errno = err;
  return MAP_FAILED;
}

// MAP_FIXED / MAP_FIXED_NOREPLACE overlapping the far region [fb, fe).
void* mm_fixed_in_far(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(addr);
  if ((b & kPageMask) != 0 || len == 0) return mm_fail(EINVAL);
  const uintptr_t e = b + page_up(len);
  if (flags & MAP_FIXED_NOREPLACE) return mm_fail(EEXIST);
  const int plain = flags & ~MAP_FIXED;
  MmLock lk;
  if (!mm_qualifies(nullptr, prot, plain, fd, off) || !g_mm.covered(b, e)) {
    return mm_fail(EINVAL);
  }
  if (mm_unprotect_locked(b, e) != 0) return MAP_FAILED;
  mm_zero(b, e);
  return addr;
}

}  // namespace

FARMEM_EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
  const uintptr_t ra = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  if (__builtin_expect(from_self(ra), 0) || farmem::in_local_scope()) {
    return sys_mmap(addr, len, prot, flags, fd, off);
  }
  if (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(addr);
    uintptr_t fb, fe;
    if (len != 0 && b + len > b && far_part(b & ~kPageMask, page_up(b + len), &fb, &fe)) {
      return mm_fixed_in_far(addr, len, prot, flags, fd, off);
    }
  } else if (len >= g_mmap_min.load(std::memory_order_relaxed) &&
             mm_qualifies(addr, prot, flags, fd, off) && !farmem::in_local_scope() &&
             len <= (SIZE_MAX >> 1)) {
    if (void* p = mm_far_map(page_up(len))) return p;
  }
  return sys_mmap(addr, len, prot, flags, fd, off);
}

FARMEM_EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept
    __attribute__((alias("mmap")));

FARMEM_EXPORT int munmap(void* addr, size_t len) noexcept {
  uintptr_t b, e, fb, fe;
  const MmRoute r = mm_route(addr, len, __builtin_return_address(0), &b, &e, &fb, &fe);
  if (r == MmRoute::kKernel) return sys_munmap(addr, len);
  if (r == MmRoute::kInvalid) {
    errno = EINVAL;
    return -1;
  }
  {
    MmLock lk;
    if (mm_unprotect_locked(fb, fe) != 0) return -1;
    if (!mm_unmap_locked(fb, fe)) {
      errno = ENOMEM;
      return -1;
    }
  }
  return kernel_parts(b, e, fb, fe, [](void* p, size_t n) { return sys_munmap(p, n); });
}

FARMEM_EXPORT int madvise(void* addr, size_t len, int advice) noexcept {
  auto kernel = [advice](void* p, size_t n) {
    return static_cast<int>(syscall(SYS_madvise, p, n, advice));
  };
  uintptr_t b, e, fb, fe;
  const MmRoute r = mm_route(addr, len, __builtin_return_address(0), &b, &e, &fb, &fe);
  if (r == MmRoute::kKernel) return kernel(addr, len);
  if (r == MmRoute::kInvalid) {
    errno = EINVAL;
    return -1;
  }
  switch (advice) {
    case MADV_DONTNEED:
    case MADV_FREE:
    case MADV_NORMAL:
    case MADV_RANDOM:
    case MADV_SEQUENTIAL:
    case MADV_WILLNEED:
    case MADV_COLD:
    case MADV_PAGEOUT:
    case MADV_DONTDUMP:
    case MADV_DODUMP:
    case MADV_HUGEPAGE:
    case MADV_NOHUGEPAGE:
    case MADV_MERGEABLE:
    case MADV_UNMERGEABLE:
    case MADV_DONTFORK:
    case MADV_DOFORK:
    case MADV_KEEPONFORK:
      break;
    default:  // MADV_REMOVE, MADV_WIPEONFORK, MADV_HWPOISON, ...: not on far memory
      errno = EINVAL;
      return -1;
  }
  if (advice == MADV_DONTNEED || advice == MADV_FREE) {
    MmLock lk;
    // Protected parts: writable for the drop (a child zeroes with memset)
    // and pinned again after it (the drop unpinned them), then protected
    // as before. Another thread may reach them meanwhile.
    g_prot.each(fb, fe, [](uintptr_t ib, uintptr_t ie, int) { (void)sys_mprotect(ib, ie, kRW); });
    mm_zero(fb, fe);
    g_prot.each(fb, fe, [](uintptr_t ib, uintptr_t ie, int prot) {
      farmem::Status st = mm_pin(ib, ie, true);
      if (!st.ok()) {
        fprintf(stderr,
                "farmem: warning: madvise: protected far memory at %p not pinned again: %s\n",
                reinterpret_cast<void*>(ib), st.message().c_str());
      }
      (void)sys_mprotect(ib, ie, prot);
    });
  }
  return kernel_parts(b, e, fb, fe, kernel);
}

FARMEM_EXPORT int mprotect(void* addr, size_t len, int prot) noexcept {
  auto kernel = [prot](void* p, size_t n) {
    return static_cast<int>(syscall(SYS_mprotect, p, n, prot));
  };
  uintptr_t b, e, fb, fe;
  const MmRoute r = mm_route(addr, len, __builtin_return_address(0), &b, &e, &fb, &fe);
  if (r == MmRoute::kKernel) return kernel(addr, len);
  if (r == MmRoute::kInvalid) {
    errno = EINVAL;
    return -1;
  }
  {
    MmLock lk;
    if (mm_protect_locked(fb, fe, prot) != 0) return -1;
  }
  return kernel_parts(b, e, fb, fe, kernel);
}

FARMEM_EXPORT void* mremap(void* old, size_t old_len, size_t new_len, int flags, ...) noexcept {
  void* want = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    want = va_arg(ap, void*);
    va_end(ap);
  }
  const uintptr_t b = reinterpret_cast<uintptr_t>(old);
  uintptr_t fb, fe;
  const size_t probe = old_len ? old_len : 1;  // 0 (duplicate a shared mapping): refused below
  const bool ours = b + probe > b && !mm_kernel_caller(__builtin_return_address(0)) &&
                    far_part(b, page_up(b + probe), &fb, &fe);
  if (!ours) {
    // The kernel's mapping; it may not move into the far region.
    if (flags & MREMAP_FIXED) {
      const uintptr_t w = reinterpret_cast<uintptr_t>(want);
      if (new_len != 0 && w + new_len > w && far_part(w, page_up(w + new_len), &fb, &fe)) {
        return mm_fail(EINVAL);
      }
    }
    return reinterpret_cast<void*>(syscall(SYS_mremap, old, old_len, new_len, flags, want));
  }
  if ((b & kPageMask) != 0 || old_len == 0 || new_len == 0 || new_len > (SIZE_MAX >> 1) ||
      (flags & ~MREMAP_MAYMOVE) != 0) {
    return mm_fail(EINVAL);
  }
  const size_t on = page_up(old_len), nn = page_up(new_len);
  const uintptr_t e = b + on;
  farmem::LocalScope local;
  MmLock lk;
  const size_t i = g_mm.holding(b);
  if (i == g_mm.n || g_mm.r[i].e < e) return mm_fail(EFAULT);  // not one mapping of ours
  if (nn <= on) {
    if (mm_unprotect_locked(b + nn, e) != 0) return MAP_FAILED;
    if (!mm_unmap_locked(b + nn, e)) return mm_fail(ENOMEM);
    return old;
  }
  // As the kernel's, growing needs one protection over the whole range
  // (it is one VMA there), and the new part takes it.
  int tail_prot = kRW;
  {
    uintptr_t at = b;
    bool mixed = false, any = false;
    g_prot.each(b, e, [&](uintptr_t ib, uintptr_t ie, int prot) {
      mixed |= ib != at || (any && prot != tail_prot);
      any = true;
      tail_prot = prot;
      at = ie;
    });
    if (mixed || (any && at != e)) return mm_fail(EFAULT);
  }
  FarHeap* h = mm_heap();
  const size_t grow = nn - on;
  if (g_mm.r[i].e == e && !g_fork_child &&
      h->space().alloc(reinterpret_cast<void*>(e), grow, 4096) != nullptr) {
    if (tail_prot != kRW && mm_protect_locked(e, e + grow, tail_prot) != 0) {
      (void)h->space().give_back(reinterpret_cast<void*>(e), grow, true, true);
      return MAP_FAILED;
    }
    g_mm.r[i].e = e + grow;  // the next entry starts beyond: that space was free
    g_mmap_bytes.fetch_add(grow, std::memory_order_relaxed);
    return old;
  }
  if (!(flags & MREMAP_MAYMOVE)) return mm_fail(ENOMEM);
  if (!g_mm.reserve(2)) return mm_fail(ENOMEM);
  void* q = g_fork_child ? nullptr : h->space().alloc(nullptr, nn, 4096);
  if (q != nullptr) {
    const uintptr_t qb = reinterpret_cast<uintptr_t>(q);
    g_mm.insert(qb, qb + nn);
    g_mmap_count.fetch_add(1, std::memory_order_relaxed);
    g_mmap_bytes.fetch_add(nn, std::memory_order_relaxed);
  } else {
    q = sys_mmap(nullptr, nn, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) return q;
  }
  // A protected range: readable for the copy; its protection (and pin)
  // moves with it.
  if (tail_prot != kRW && !(tail_prot & PROT_READ)) (void)sys_mprotect(b, e, PROT_READ);
  memcpy(q, old, on);
  if (tail_prot != kRW) {
    (void)mm_unprotect_locked(b, e);
    const uintptr_t qb = reinterpret_cast<uintptr_t>(q);
    if ((g_mm.holding(qb) < g_mm.n ? mm_protect_locked(qb, qb + nn, tail_prot)
                                   : sys_mprotect(qb, qb + nn, tail_prot)) != 0) {
      fprintf(stderr, "farmem: warning: mremap: the protection of %p was not carried to %p: %s\n",
              old, q, strerror(errno));
    }
  }
  (void)mm_unmap_locked(b, e);  // reserved above: cannot fail
  return q;
}
