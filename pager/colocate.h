// Co-location: the program's one faulting thread confined to the CPU it
// runs on, next to the pager's evictor, while that pays (the decision is
// Pager<B>::colocate_tick(), pager/evictor.h "Co-location"). This file is
// the process-wide half: the pin itself, and what keeps it from leaking
// into anything the program starts.
//
//   colocate_pin(tid, cpu);     // the thread's mask saved, then {cpu}
//   colocate_still_pinned();    // false: the program changed the mask since
//   colocate_unpin();           // the saved mask back
//   colocate_restore_self();    // preload: before exec*, in a vfork child
//   colocate_suspend(); ... colocate_resume();   // preload: around posix_spawn
//   colocate_fork_prepare(); colocate_fork_child();  // preload: pthread_atfork
//
// One pin per process at a time. Only the main thread or a thread in the
// park.h registry is pinned (both are known to be alive: a registered
// thread takes itself out, and the pin with it, before it ends), so the tid
// can never name another process's thread. What the pinned thread starts
// gets the mask it had before the pin: a thread (preload's pthread_create
// trampoline calls colocate_restore_self()), a fork() child
// (colocate_fork_child()), a program it exec()s or vfork()s and exec()s
// (colocate_restore_self() in the exec wrappers), posix_spawn(), system()
// and popen() (the pin is lifted around the call: glibc's child execs
// without going through any wrapper).
#pragma once

#include <cstdint>

namespace farmem {

// Pins thread `tid` of this process to `cpu` after saving its mask. False
// (nothing changed) when a pin is held already, the thread is gone, or the
// kernel refuses.
bool colocate_pin(int tid, int cpu);
// Restores the pinned thread's saved mask (when it is still the one set by
// colocate_pin(): a program that set its own keeps it) and drops the pin.
void colocate_unpin();
// True when the pinned thread's mask is still {cpu}; when the program set
// another, the pin is dropped without restoring anything and this says
// false.
bool colocate_still_pinned();
// The pinned thread (0: none) and its CPU.
int colocate_pinned_tid();
int colocate_pinned_cpu();
// A thread that ends: a pin on it is dropped (park.cc's
// unregister_thread_cpu() calls this).
void colocate_forget(int tid);
// Suspended: the pin is lifted and no new one is taken until every
// suspend has been resumed (nestable, any thread).
void colocate_suspend();
void colocate_resume();
bool colocate_suspended();
// The calling task gets the pinned thread's saved mask back, when its
// mask is the pin's {cpu} and it is the pinned thread, a process started
// from this one (exec wrappers, a vfork child), or a thread the pinned
// thread started (from_pinned: the creator said so). Async-signal-safe;
// reads the shared state only (a vfork child shares its parent's memory).
void colocate_restore_self(bool from_pinned = false);
// True on the pinned thread.
bool colocate_is_pinned_self();
// The time thread `tid` of this process has spent on a CPU and waiting
// for one, in ns (/proc/self/task/<tid>/schedstat); false when it cannot
// be read.
bool thread_sched_ns(int tid, uint64_t* run, uint64_t* wait);
// pthread_atfork: prepare notes whether the forking thread is the pinned
// one; child gives that thread's copy its saved mask back and forgets the
// pin (the child has no evictor to hold one for).
void colocate_fork_prepare();
void colocate_fork_child();

}  // namespace farmem
