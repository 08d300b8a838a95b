// Co-location: the program's one faulting thread confined to the CPU it
// runs on, next to the pager's evictor, while that pays (the decision is
// Pager<B>::colocate_tick(), pager/evictor.h "Co-location"). This file is
// the process-wide half: the pin itself, and what keeps it from leaking
// into anything the program starts.
//
//   colocate_pin(owner, tid, cpu, tp, alive);  // the mask saved, then {cpu}
//   colocate_still_pinned(owner);  // false: the program changed the mask since
//   colocate_unpin(owner);         // the saved mask back
//   colocate_restore_self();       // preload: before exec*, in a vfork child
//   colocate_handback(&h); ... colocate_apply_handback(h);  // pthread_create
//   colocate_suspend(); ... colocate_resume();   // preload: around posix_spawn
//   colocate_fork_prepare(); colocate_fork_parent(); colocate_fork_child();
//
// One pin per process at a time, held by one owner (a Pager). Only the
// main thread or a thread in the park.h registry is pinned, and only while
// it is there: `alive` is asked under the pin's lock, and a registered
// thread takes itself out of the registry before colocate_forget() (under
// that lock), so a pin never outlives its thread and a tid never names
// another process's thread. What the pinned thread starts gets the mask it
// had before the pin: a thread (the preload's pthread_create hands the
// saved mask to it, colocate_handback()), a fork() child (the pin's lock is
// held across fork(), colocate_fork_child()), a program it exec()s or
// vfork()s and exec()s (colocate_restore_self() in the exec wrappers,
// recognised by its thread pointer, which a vfork child shares),
// posix_spawn(), system() and popen() (the pin is lifted around the call:
// glibc's child execs without going through any wrapper).
#pragma once

#include <sched.h>

#include <cstdint>

namespace farmem {

// Pins thread `tid` of this process to `cpu` after saving its mask, for
// `owner`. `tp` is the thread's thread pointer (how a vfork child of it is
// recognised); `alive`, when given, is asked under the pin's lock and must
// say the thread has not started to end. False (nothing changed) when a
// pin is held already, a suspend is on, the thread is gone or already on
// that CPU alone, or the kernel refuses.
bool colocate_pin(const void* owner, int tid, int cpu, uintptr_t tp, bool (*alive)(int tid));
// Restores the pinned thread's saved mask (when it is still the one set by
// colocate_pin(): a program that set its own keeps it) and drops the pin,
// if `owner` holds it.
void colocate_unpin(const void* owner);
// True when `owner` holds the pin and the thread's mask is still {cpu};
// when the program set another, the pin is dropped without restoring
// anything and this says false.
bool colocate_still_pinned(const void* owner);
// The pinned thread (0: none) and its CPU.
int colocate_pinned_tid();
int colocate_pinned_cpu();
// A thread that ends (after it left the park.h registry): a pin on it is
// dropped, its mask untouched.
void colocate_forget(int tid);
// Suspended: the pin is lifted and no new one is taken until every
// suspend has been resumed (nestable, any thread).
void colocate_suspend();
void colocate_resume();
bool colocate_suspended();
// The calling task gets the pinned thread's saved mask back, when its
// mask is the pin's {cpu} and it is the pinned thread or a process started
// from it (same thread pointer: a vfork child, or a child of a fork that
// bypassed pthread_atfork). Async-signal-safe; reads the shared state only
// (a vfork child shares its parent's memory).
void colocate_restore_self();
// pthread_create: in the creator, colocate_handback() says whether it is
// the pinned thread and copies what the new thread needs; the new thread
// then gives itself the saved mask if it still has the pin's {cpu}, even
// when the pin ended meanwhile.
struct ColocateHandback {
  bool active = false;
  int cpu = -1;
  cpu_set_t mask;
};
bool colocate_handback(ColocateHandback* h);
void colocate_apply_handback(const ColocateHandback& h);
// The time thread `tid` of this process has spent on a CPU and waiting
// for one, in ns (/proc/self/task/<tid>/schedstat); false when it cannot
// be read.
bool thread_sched_ns(int tid, uint64_t* run, uint64_t* wait);
// pthread_atfork: prepare takes the pin's lock (no pin changes across the
// fork) and notes whether the forking thread is the pinned one; parent
// releases it; child gives the pinned thread's copy its saved mask back,
// forgets the pin (the child has no evictor) and releases the lock.
void colocate_fork_prepare();
void colocate_fork_parent();
void colocate_fork_child();

}  // namespace farmem
