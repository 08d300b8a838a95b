#include "pager/colocate.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>

namespace farmem {

namespace {

// The pin. Its fields are written under mu before tid is published
// (release) and read after tid is seen (acquire); colocate_restore_self()
// takes no lock (it may run in a vfork child).
struct Pin {
  std::mutex mu;
  std::atomic<int> tid{0};
  std::atomic<int> cpu{-1};
  std::atomic<int> pid{0};
  std::atomic<uintptr_t> tp{0};
  const void* owner = nullptr;
  cpu_set_t saved;
  std::atomic<int> suspends{0};
};
Pin g_pin;
thread_local bool t_forking_pinned = false;

int own_tid() {
  return static_cast<int>(syscall(SYS_gettid));
}

uintptr_t own_tp() {
  return reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
}

bool is_only(const cpu_set_t& set, int cpu) {
  return cpu >= 0 && CPU_COUNT(&set) == 1 && CPU_ISSET(cpu, &set);
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
  g_pin.owner = nullptr;
}

}  // namespace

bool colocate_pin(const void* owner, int tid, int cpu, uintptr_t tp, bool (*alive)(int tid)) {
  if (owner == nullptr || tid <= 0 || cpu < 0 || cpu >= CPU_SETSIZE) return false;
  std::lock_guard<std::mutex> lk(g_pin.mu);
  if (g_pin.tid.load(std::memory_order_relaxed) != 0 ||
      g_pin.suspends.load(std::memory_order_acquire) > 0)
    return false;
  // Under the lock: a thread that ends leaves the registry first and then
  // waits here in colocate_forget(), so it is either seen leaving now or
  // forgets this pin after.
  if (alive != nullptr && !alive(tid)) return false;
  cpu_set_t was;
  CPU_ZERO(&was);
  if (sched_getaffinity(tid, sizeof was, &was) != 0 || !CPU_ISSET(cpu, &was)) return false;
  if (is_only(was, cpu)) return false;  // pinned there already, by the program
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  g_pin.saved = was;
  g_pin.owner = owner;
  g_pin.cpu.store(cpu, std::memory_order_relaxed);
  g_pin.pid.store(static_cast<int>(getpid()), std::memory_order_relaxed);
  g_pin.tp.store(tp, std::memory_order_relaxed);
  // Published before the mask changes: an exec or vfork from the thread
  // after the change always finds the pin (before it, its mask is not
  // {cpu} and the look is harmless).
  g_pin.tid.store(tid, std::memory_order_release);
  if (sched_setaffinity(tid, sizeof one, &one) != 0) {
    unpin_locked(/*restore=*/false);
    return false;
  }
  return true;
}

void colocate_unpin(const void* owner) {
  std::lock_guard<std::mutex> lk(g_pin.mu);
  if (g_pin.owner == owner) unpin_locked(/*restore=*/true);
}

bool colocate_still_pinned(const void* owner) {
  std::lock_guard<std::mutex> lk(g_pin.mu);
  const int tid = g_pin.tid.load(std::memory_order_relaxed);
  if (tid == 0 || g_pin.owner != owner) return false;
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

void colocate_restore_self() {
  const int tid = g_pin.tid.load(std::memory_order_acquire);
  if (tid == 0) return;
  const int cpu = g_pin.cpu.load(std::memory_order_relaxed);
  // Another process: only a child of the pinned thread (a vfork child
  // shares its thread pointer, a fork child has a copy of it). In this
  // process: only the pinned thread (its own exec). Anyone else with
  // {cpu} chose it.
  if (static_cast<int>(getpid()) != g_pin.pid.load(std::memory_order_relaxed)) {
    if (own_tp() != g_pin.tp.load(std::memory_order_relaxed)) return;
  } else if (own_tid() != tid) {
    return;
  }
  cpu_set_t now;
  CPU_ZERO(&now);
  if (sched_getaffinity(0, sizeof now, &now) != 0 || !is_only(now, cpu)) return;
  (void)sched_setaffinity(0, sizeof g_pin.saved, &g_pin.saved);
}

bool colocate_handback(ColocateHandback* h) {
  h->active = false;
  const int tid = g_pin.tid.load(std::memory_order_acquire);
  if (tid == 0 || tid != own_tid()) return false;
  // The pin cannot end while its thread is here (only the thread's own
  // exit or a suspend from another thread could; the lock orders those).
  std::lock_guard<std::mutex> lk(g_pin.mu);
  if (g_pin.tid.load(std::memory_order_relaxed) != tid) return false;
  h->cpu = g_pin.cpu.load(std::memory_order_relaxed);
  h->mask = g_pin.saved;
  h->active = true;
  return true;
}

void colocate_apply_handback(const ColocateHandback& h) {
  if (!h.active) return;
  cpu_set_t now;
  CPU_ZERO(&now);
  if (sched_getaffinity(0, sizeof now, &now) != 0 || !is_only(now, h.cpu)) return;
  (void)sched_setaffinity(0, sizeof h.mask, &h.mask);
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
  g_pin.mu.lock();
  t_forking_pinned = g_pin.tid.load(std::memory_order_relaxed) == own_tid();
}

void colocate_fork_parent() {
  t_forking_pinned = false;
  g_pin.mu.unlock();
}

void colocate_fork_child() {
  // The forking thread holds the lock (prepare): nobody else is left.
  if (t_forking_pinned) (void)sched_setaffinity(0, sizeof g_pin.saved, &g_pin.saved);
  t_forking_pinned = false;
  g_pin.tid.store(0, std::memory_order_relaxed);
  g_pin.cpu.store(-1, std::memory_order_relaxed);
  g_pin.owner = nullptr;
  g_pin.suspends.store(0, std::memory_order_relaxed);
  g_pin.mu.unlock();
}

}  // namespace farmem
