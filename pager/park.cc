#include "pager/park.h"

#include <linux/futex.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstddef>

namespace farmem {

const volatile uint32_t* main_thread_cpu() {
  if (syscall(SYS_gettid) != getpid()) return nullptr;
  if (__rseq_size < offsetof(struct rseq, cpu_id) + sizeof(uint32_t)) return nullptr;
  auto* area = reinterpret_cast<struct rseq*>(static_cast<char*>(__builtin_thread_pointer()) +
                                              __rseq_offset);
  if (static_cast<int32_t>(area->cpu_id) < 0) return nullptr;
  return &area->cpu_id;
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
