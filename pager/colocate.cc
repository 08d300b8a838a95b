#include "pager/colocate.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <new>

namespace farmem {

namespace {

// The pin. saved is written before tid is published (release) and read
// after tid is seen (acquire); mu orders pin / unpin / forget among
// themselves (restore_self() takes no lock: it may run in a vfork child).
struct Pin {
  std::mutex mu;
  std::atomic<int> tid{0};
  std::atomic<int> cpu{-1};
  std::atomic<int> pid{0};
  cpu_set_t saved;
  std::atomic<int> suspends{0};
};
Pin g_pin;
thread_local bool t_forking_pinned = false;

int own_tid() {
  return static_cast<int>(syscall(SYS_gettid));
}

bool is_only(const cpu_set_t& set, int cpu) {
  return CPU_COUNT(&set) == 1 && CPU_ISSET(cpu, &set);
}

// Under g_pin.mu.
void unpin_locked(bool restore) {
  const int tid = g_pin.tid.load(std::memory_order_relaxed);
  if (tid == 0) return;
  const int cpu = g_pin.cpu.load(std::memory_order_relaxed);
  if (restore) {
    cpu_set_t now;
    CPU_ZERO(&now);
    if (sched_getaffinity(tid, sizeof now, &now) == 0 && is_only(now, cpu))
      (void)sched_setaffinity(tid, sizeof g_pin.saved, &g_pin.saved);
  }
  g_pin.tid.store(0, std::memory_order_release);
  g_pin.cpu.store(-1, std::memory_order_relaxed);
}

}  // namespace

bool colocate_pin(int tid, int cpu) {
  if (tid <= 0 || cpu < 0 || cpu >= CPU_SETSIZE) return false;
  std::lock_guard<std::mutex> lk(g_pin.mu);
  if (g_pin.tid.load(std::memory_order_relaxed) != 0 ||
      g_pin.suspends.load(std::memory_order_acquire) > 0)
    return false;
  cpu_set_t was;
  CPU_ZERO(&was);
  if (sched_getaffinity(tid, sizeof was, &was) != 0 || !CPU_ISSET(cpu, &was)) return false;
  if (is_only(was, cpu)) return false;  // pinned there already, by the program
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  g_pin.saved = was;
  g_pin.cpu.store(cpu, std::memory_order_relaxed);
  g_pin.pid.store(static_cast<int>(getpid()), std::memory_order_relaxed);
  if (sched_setaffinity(tid, sizeof one, &one) != 0) return false;
  g_pin.tid.store(tid, std::memory_order_release);
  return true;
}

void colocate_unpin() {
  std::lock_guard<std::mutex> lk(g_pin.mu);
  unpin_locked(/*restore=*/true);
}

bool colocate_still_pinned() {
  std::lock_guard<std::mutex> lk(g_pin.mu);
  const int tid = g_pin.tid.load(std::memory_order_relaxed);
  if (tid == 0) return false;
  cpu_set_t now;
  CPU_ZERO(&now);
  if (sched_getaffinity(tid, sizeof now, &now) == 0 &&
      is_only(now, g_pin.cpu.load(std::memory_order_relaxed)))
    return true;
  unpin_locked(/*restore=*/false);
  return false;
}

int colocate_pinned_tid() {
  return g_pin.tid.load(std::memory_order_acquire);
}

int colocate_pinned_cpu() {
  return g_pin.cpu.load(std::memory_order_relaxed);
}

void colocate_forget(int tid) {
  if (g_pin.tid.load(std::memory_order_acquire) != tid) return;
  std::lock_guard<std::mutex> lk(g_pin.mu);
  if (g_pin.tid.load(std::memory_order_relaxed) == tid) unpin_locked(/*restore=*/false);
}

void colocate_suspend() {
  std::lock_guard<std::mutex> lk(g_pin.mu);
  g_pin.suspends.fetch_add(1, std::memory_order_acq_rel);
  unpin_locked(/*restore=*/true);
}

void colocate_resume() {
  g_pin.suspends.fetch_sub(1, std::memory_order_acq_rel);
}

bool colocate_suspended() {
  return g_pin.suspends.load(std::memory_order_acquire) > 0;
}

void colocate_restore_self(bool from_pinned) {
  const int tid = g_pin.tid.load(std::memory_order_acquire);
  if (tid == 0) return;
  const int cpu = g_pin.cpu.load(std::memory_order_relaxed);
  // Only the pinned thread itself, a thread it started, or a process
  // started from this one (a vfork child shares the state; a fork child's
  // copy was cleared by colocate_fork_child() unless it is a vfork): a
  // thread of this process with {cpu} of its own choosing keeps it.
  const bool child = static_cast<int>(getpid()) != g_pin.pid.load(std::memory_order_relaxed);
  if (!from_pinned && !child && own_tid() != tid) return;
  cpu_set_t now;
  CPU_ZERO(&now);
  if (cpu < 0 || sched_getaffinity(0, sizeof now, &now) != 0 || !is_only(now, cpu)) return;
  (void)sched_setaffinity(0, sizeof g_pin.saved, &g_pin.saved);
}

bool colocate_is_pinned_self() {
  const int tid = g_pin.tid.load(std::memory_order_acquire);
  return tid != 0 && tid == own_tid();
}

bool thread_sched_ns(int tid, uint64_t* run_ns, uint64_t* wait_ns) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  unsigned long long run = 0, wait = 0;
  if (sscanf(buf, "%llu %llu", &run, &wait) != 2) return false;
  *run_ns = run;
  *wait_ns = wait;
  return true;
}

void colocate_fork_prepare() {
  t_forking_pinned = g_pin.tid.load(std::memory_order_acquire) == own_tid();
}

void colocate_fork_child() {
  // Single-threaded here: the lock may have been held by a thread left
  // behind, so it is not taken.
  if (g_pin.tid.load(std::memory_order_relaxed) == 0) return;
  if (t_forking_pinned) (void)sched_setaffinity(0, sizeof g_pin.saved, &g_pin.saved);
  t_forking_pinned = false;
  new (&g_pin.mu) std::mutex();
  g_pin.tid.store(0, std::memory_order_relaxed);
  g_pin.cpu.store(-1, std::memory_order_relaxed);
}

}  // namespace farmem
