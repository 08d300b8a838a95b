// Parked fault handlers: where the program's faulting thread runs, and a
// wait for the handlers not needed there. Used by Pager<B>::handler_main()
// (pager/fault_path.h "Parked handlers").
//
//   const volatile uint32_t* cpu = main_thread_cpu();   // null: unknown
//   int c = read_cpu(cpu);                              // -1: unknown
//   register_thread_cpu(); ... unregister_thread_cpu(); // in a thread
//   int d = registered_thread_cpu(tid);                 // -1: unknown, kRegistryBusy
//   ParkWord w;  w.wait(w.load(), 50'000'000);  w.bump();
//
// main_thread_cpu() is the main thread's rseq area's cpu_id (glibc
// registers an rseq area for every thread since 2.35; the kernel rewrites
// its cpu_id whenever the thread returns to user space on another CPU), so
// any thread can tell where the main thread runs with one load. It is only
// returned on the main thread itself, whose thread control block lives as
// long as the process: a thread's rseq area is freed with its stack.
// Other threads' areas are read through a registry instead: a thread puts
// its own area in (register_thread_cpu()) and takes it out before it ends
// (unregister_thread_cpu(); preload/shim.cc does both for every thread the
// program starts, the latter from a thread-specific data destructor), and
// registered_thread_cpu() reads an area under the registry's lock, so
// never after its thread took it out.
#pragma once

#include <atomic>
#include <cstdint>

namespace farmem {

// The address of the calling thread's rseq cpu_id when the calling thread
// is the process's main thread and glibc registered rseq for it; null
// otherwise (another thread, rseq off with glibc.pthread.rseq=0, an older
// glibc).
const volatile uint32_t* main_thread_cpu();

// The calling thread's rseq cpu_id goes into the registry (nothing
// without rseq, or when 256 threads are in it already) / comes out of it.
// A thread that registered must unregister before it exits.
void register_thread_cpu();
void unregister_thread_cpu();
// In a fork()ed child (one thread left): empties the registry and frees
// its lock, which another thread of the parent may have held.
void forget_thread_cpus();

// Whether thread `tid` is in the registry (waits for the registry's lock;
// not for a fault handler), and its thread pointer.
bool thread_registered(int tid, uintptr_t* tp);

// The CPU a registered thread `tid` runs on, -1 (not registered, or its
// CPU is unknown), or kRegistryBusy: another thread holds the registry's
// lock, and this never waits. Busy says nothing about `tid`: a caller
// must not read it as "not registered" (a holder preempted for a few
// milliseconds would otherwise make every fault meanwhile look like one
// of an unknown thread, and keep every handler up for kParkAfterOtherNs).
inline constexpr int kRegistryBusy = -2;
int registered_thread_cpu(int tid);

// The CPU `*cpu` names, or -1 (null, or rseq's "not registered" values).
inline int read_cpu(const volatile uint32_t* cpu) {
  if (cpu == nullptr) return -1;
  const int32_t c = static_cast<int32_t>(*cpu);
  return c < 0 ? -1 : c;
}

// A generation counter threads can sleep on (a futex): wait(g, ns) returns
// at once unless the word still holds g, and after ns nanoseconds at most;
// every change made with bump() wakes every waiter.
class ParkWord {
 public:
  uint32_t load() const { return word_.load(std::memory_order_seq_cst); }
  void wait(uint32_t seen, long ns);
  void bump();

 private:
  std::atomic<uint32_t> word_{0};
};

}  // namespace farmem
