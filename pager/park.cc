#include "pager/park.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstddef>

#include "pager/colocate.h"

namespace farmem {

namespace {

const volatile uint32_t* own_rseq_cpu() {
  if (__rseq_size < offsetof(struct rseq, cpu_id) + sizeof(uint32_t)) return nullptr;
  auto* area = reinterpret_cast<struct rseq*>(static_cast<char*>(__builtin_thread_pointer()) +
                                              __rseq_offset);
  if (static_cast<int32_t>(area->cpu_id) < 0) return nullptr;
  return &area->cpu_id;
}

// The registry: few threads, looked up by a handler per fault of a thread
// that is not the main one, so a short array under a spinlock (tiny
// sections; a plain word, so that a fork()ed child can reset it).
struct ThreadCpus {
  std::atomic<int> lock{0};
  int n = 0;
  int tid[256];
  const volatile uint32_t* cpu[256];
  uintptr_t tp[256];  // thread pointers (pager/colocate.h)
};
ThreadCpus g_thread_cpus;

class RegistryLock {
 public:
  RegistryLock() {
    while (g_thread_cpus.lock.exchange(1, std::memory_order_acquire) != 0) sched_yield();
  }
  ~RegistryLock() { g_thread_cpus.lock.store(0, std::memory_order_release); }
};

}  // namespace

void register_thread_cpu() {
  const volatile uint32_t* cpu = own_rseq_cpu();
  if (cpu == nullptr) return;
  const int tid = static_cast<int>(syscall(SYS_gettid));
  RegistryLock lk;
  if (g_thread_cpus.n == 256) return;
  g_thread_cpus.tid[g_thread_cpus.n] = tid;
  g_thread_cpus.cpu[g_thread_cpus.n] = cpu;
  g_thread_cpus.tp[g_thread_cpus.n] = reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
  ++g_thread_cpus.n;
}

void unregister_thread_cpu() {
  const int tid = static_cast<int>(syscall(SYS_gettid));
  {
    RegistryLock lk;
    for (int i = 0; i < g_thread_cpus.n; ++i) {
      if (g_thread_cpus.tid[i] != tid) continue;
      --g_thread_cpus.n;
      g_thread_cpus.tid[i] = g_thread_cpus.tid[g_thread_cpus.n];
      g_thread_cpus.cpu[i] = g_thread_cpus.cpu[g_thread_cpus.n];
      g_thread_cpus.tp[i] = g_thread_cpus.tp[g_thread_cpus.n];
      break;
    }
  }
  // Out of the registry first: a pin taken from now on sees it leaving
  // (thread_registered() under the pin's lock), one taken before is
  // forgotten here (pager/colocate.h).
  colocate_forget(tid);
}

bool thread_registered(int tid, uintptr_t* tp) {
  RegistryLock lk;
  for (int i = 0; i < g_thread_cpus.n; ++i) {
    if (g_thread_cpus.tid[i] != tid) continue;
    if (tp != nullptr) *tp = g_thread_cpus.tp[i];
    return true;
  }
  return false;
}

void forget_thread_cpus() {
  g_thread_cpus.n = 0;
  g_thread_cpus.lock.store(0, std::memory_order_release);
}

int registered_thread_cpu(int tid) {
  // Never waits: the caller is a fault handler, and the holder may be a
  // thread whose signal handler waits for that handler's fault.
  if (g_thread_cpus.lock.exchange(1, std::memory_order_acquire) != 0) return kRegistryBusy;
  int cpu = -1;
  for (int i = 0; i < g_thread_cpus.n; ++i) {
    if (g_thread_cpus.tid[i] != tid) continue;
    cpu = read_cpu(g_thread_cpus.cpu[i]);
    break;
  }
  g_thread_cpus.lock.store(0, std::memory_order_release);
  return cpu;
}

const volatile uint32_t* main_thread_cpu() {
  if (syscall(SYS_gettid) != getpid()) return nullptr;
  return own_rseq_cpu();
}

void ParkWord::wait(uint32_t seen, long ns) {
  timespec ts{ns / 1'000'000'000, ns % 1'000'000'000};
  // EAGAIN (the word changed), ETIMEDOUT and EINTR all mean: look again.
  (void)syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word_), FUTEX_WAIT_PRIVATE, seen, &ts,
                nullptr, 0);
}

void ParkWord::bump() {
  word_.fetch_add(1, std::memory_order_seq_cst);
  (void)syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, INT_MAX,
                nullptr, nullptr, 0);
}

}  // namespace farmem
