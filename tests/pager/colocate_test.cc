// Co-location's pin (pager/colocate.h): saved and restored, a mask the
// program set wins, one pin at a time, suspend, and nothing the pinned
// thread starts (a thread, a fork child, an exec) inherits it. The pager's
// decision is tested in pager_fault_path_test.cc.
#include "pager/colocate.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "pager/config.h"
#include "pager/park.h"

namespace farmem::testing {
namespace {

int own_tid() {
  return static_cast<int>(syscall(SYS_gettid));
}

uintptr_t own_tp() {
  return reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
}

const int kOwner = 0;  // the pin's owner in these tests (a Pager in the pager)
const void* const kMe = &kOwner;

bool pin(int tid, int cpu, uintptr_t tp = 0) {
  return colocate_pin(kMe, tid, cpu, tp, nullptr);
}

cpu_set_t mask_of(int tid) {
  cpu_set_t s;
  CPU_ZERO(&s);
  EXPECT_EQ(sched_getaffinity(tid, sizeof s, &s), 0);
  return s;
}

bool only(const cpu_set_t& s, int cpu) {
  return CPU_COUNT(&s) == 1 && CPU_ISSET(cpu, &s);
}

bool same(const cpu_set_t& a, const cpu_set_t& b) {
  return CPU_EQUAL(&a, &b);
}

// A thread that waits until it is let go (or runs `fn` first).
class Parked {
 public:
  Parked() {
    t_ = std::thread([this] {
      tid_.set_value(own_tid());
      go_.get_future().wait();
    });
    tid = tid_.get_future().get();
  }
  ~Parked() {
    go_.set_value();
    t_.join();
  }
  int tid = 0;

 private:
  std::promise<int> tid_;
  std::promise<void> go_;
  std::thread t_;
};

#define SKIP_WITHOUT_TWO_CPUS(cpus)                              \
  const std::vector<int> cpus = allowed_cpus();                  \
  if (cpus.size() < 2) GTEST_SKIP() << "needs two allowed CPUs"; \
  ASSERT_EQ(colocate_pinned_tid(), 0)

TEST(Colocate, PinSavesTheMaskAndUnpinRestoresIt) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  Parked a, b;
  const cpu_set_t before = mask_of(a.tid);
  ASSERT_TRUE(pin(a.tid, cpus[1]));
  EXPECT_TRUE(only(mask_of(a.tid), cpus[1]));
  EXPECT_EQ(colocate_pinned_tid(), a.tid);
  EXPECT_EQ(colocate_pinned_cpu(), cpus[1]);
  EXPECT_TRUE(colocate_still_pinned(kMe));
  // One pin at a time: b keeps its mask.
  EXPECT_FALSE(pin(b.tid, cpus[0]));
  EXPECT_TRUE(same(mask_of(b.tid), before));
  colocate_unpin(kMe);
  EXPECT_TRUE(same(mask_of(a.tid), before));
  EXPECT_EQ(colocate_pinned_tid(), 0);
  // Bad arguments change nothing.
  EXPECT_FALSE(pin(0, cpus[0]));
  EXPECT_FALSE(pin(a.tid, -1));
  EXPECT_EQ(colocate_pinned_tid(), 0);
}

TEST(Colocate, AThreadTheProgramKeepsOnOneCpuIsLeftAlone) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  std::promise<int> tid;
  std::promise<void> go;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[0], &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    tid.set_value(own_tid());
    go.get_future().wait();
  });
  const int id = tid.get_future().get();
  EXPECT_FALSE(pin(id, cpus[0]));  // there already, by its own choice
  EXPECT_FALSE(pin(id, cpus[1]));  // not a CPU it may use
  EXPECT_TRUE(only(mask_of(id), cpus[0]));
  EXPECT_EQ(colocate_pinned_tid(), 0);
  go.set_value();
  t.join();
}

TEST(Colocate, AMaskTheProgramSetsWhilePinnedWins) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  cpu_set_t two;
  CPU_ZERO(&two);
  CPU_SET(cpus[0], &two);
  CPU_SET(cpus[1], &two);
  std::promise<int> tid;
  std::promise<void> pinned, set;
  std::promise<void> go;
  std::thread t([&] {
    tid.set_value(own_tid());
    pinned.get_future().wait();
    ASSERT_EQ(sched_setaffinity(0, sizeof two, &two), 0);  // the program's own call
    set.set_value();
    go.get_future().wait();
  });
  const int id = tid.get_future().get();
  ASSERT_TRUE(pin(id, cpus[1]));
  pinned.set_value();
  set.get_future().wait();
  EXPECT_FALSE(colocate_still_pinned(kMe));
  EXPECT_EQ(colocate_pinned_tid(), 0);
  colocate_unpin(kMe);  // nothing to restore
  EXPECT_TRUE(same(mask_of(id), two));
  go.set_value();
  t.join();
}

TEST(Colocate, SuspendLiftsThePinAndHoldsOffNewOnes) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  Parked a;
  const cpu_set_t before = mask_of(a.tid);
  ASSERT_TRUE(pin(a.tid, cpus[0]));
  colocate_suspend();
  EXPECT_TRUE(colocate_suspended());
  EXPECT_TRUE(same(mask_of(a.tid), before));
  EXPECT_EQ(colocate_pinned_tid(), 0);
  EXPECT_FALSE(colocate_still_pinned(kMe));
  EXPECT_FALSE(pin(a.tid, cpus[0]));
  colocate_suspend();  // nested
  colocate_resume();
  EXPECT_FALSE(pin(a.tid, cpus[0]));
  colocate_resume();
  EXPECT_FALSE(colocate_suspended());
  ASSERT_TRUE(pin(a.tid, cpus[0]));
  colocate_unpin(kMe);
  EXPECT_TRUE(same(mask_of(a.tid), before));
}

TEST(Colocate, AThreadThatEndsTakesThePinWithIt) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  Parked a;
  ASSERT_TRUE(pin(a.tid, cpus[1]));
  colocate_forget(a.tid + 1);  // another thread: no effect
  EXPECT_EQ(colocate_pinned_tid(), a.tid);
  colocate_forget(a.tid);
  EXPECT_EQ(colocate_pinned_tid(), 0);
  EXPECT_TRUE(only(mask_of(a.tid), cpus[1]));  // an ending thread's mask is not touched
}

// Whether a fork()ed child's mask is `want`: run `in_child` in a child of
// the calling thread, which reports back.
bool child_mask_is(const cpu_set_t& want, void (*in_child)()) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  const pid_t pid = fork();
  if (pid == 0) {
    in_child();
    cpu_set_t now;
    CPU_ZERO(&now);
    const char ok = sched_getaffinity(0, sizeof now, &now) == 0 && CPU_EQUAL(&now, &want);
    (void)!write(fds[1], &ok, 1);
    _exit(0);
  }
  close(fds[1]);
  char ok = 0;
  const bool got = read(fds[0], &ok, 1) == 1;
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return got && ok == 1;
}

cpu_set_t only_set(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return one;
}

TEST(Colocate, NothingThePinnedThreadStartsInheritsThePin) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  const cpu_set_t before = mask_of(own_tid());
  const cpu_set_t one = only_set(cpus[1]);
  // A thread plays the program's faulting thread, pinned to cpus[1].
  std::thread t([&] {
    ASSERT_TRUE(pin(own_tid(), cpus[1], own_tp()));
    // A thread it starts, as the preload's pthread_create does it, gets
    // the mask back, even when the pin ended before it ran.
    ColocateHandback hb;
    ASSERT_TRUE(colocate_handback(&hb));
    cpu_set_t got;
    std::thread([&] {
      colocate_apply_handback(hb);
      got = mask_of(0);
    }).join();
    EXPECT_TRUE(same(got, before));
    ASSERT_TRUE(colocate_handback(&hb));
    std::promise<void> unpinned;
    std::thread late([&] {
      unpinned.get_future().wait();
      colocate_apply_handback(hb);
      got = mask_of(0);
    });
    colocate_unpin(kMe);
    EXPECT_TRUE(same(mask_of(0), before));
    unpinned.set_value();
    late.join();
    EXPECT_TRUE(same(got, before)) << "a thread that ran after the pin ended";
    ASSERT_TRUE(pin(own_tid(), cpus[1], own_tp()));
    // A thread that is not the pinned one has no hand-back to give.
    std::thread([&] { EXPECT_FALSE(colocate_handback(&hb)); }).join();
    // A fork() child (the preload's pthread_atfork handlers)...
    colocate_fork_prepare();
    EXPECT_TRUE(child_mask_is(before, [] { colocate_fork_child(); }));
    colocate_fork_parent();
    // ... and one that execs without them (vfork + exec, an exec
    // wrapper's colocate_restore_self(): same thread pointer).
    EXPECT_TRUE(child_mask_is(before, [] { colocate_restore_self(); }));
    // Without either, the child would keep the pin: the check can fail.
    EXPECT_TRUE(child_mask_is(one, [] {}));
    // A child of another thread that chose {cpus[1]} itself keeps it.
    std::thread([&] {
      ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
      EXPECT_TRUE(child_mask_is(one, [] { colocate_restore_self(); }));
      colocate_restore_self();  // and so does the thread itself
      EXPECT_TRUE(same(mask_of(0), one));
    }).join();
    // The parent is still pinned, and the lock the fork took is free.
    EXPECT_TRUE(only(mask_of(0), cpus[1]));
    EXPECT_TRUE(colocate_still_pinned(kMe));
    // The pinned thread's own exec gives it its mask back too.
    colocate_restore_self();
    EXPECT_TRUE(same(mask_of(0), before));
    EXPECT_FALSE(colocate_still_pinned(kMe));
  });
  t.join();
  EXPECT_EQ(colocate_pinned_tid(), 0);
}

// A pin is only taken on a thread still in the registry (asked under the
// pin's lock), and a registered thread's exit takes the pin with it.
TEST(Colocate, APinNeverOutlivesItsThread) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  auto registered = [](int tid) { return thread_registered(tid, nullptr); };
  std::promise<int> tid;
  std::promise<void> pinned, left;
  std::thread t([&] {
    register_thread_cpu();
    uintptr_t tp = 0;
    EXPECT_TRUE(thread_registered(own_tid(), &tp));
    EXPECT_EQ(tp, own_tp());
    tid.set_value(own_tid());
    pinned.get_future().wait();
    unregister_thread_cpu();  // as the preload's destructor at thread exit
    left.set_value();
  });
  const int id = tid.get_future().get();
  if (!thread_registered(id, nullptr)) {
    pinned.set_value();
    t.join();
    GTEST_SKIP() << "no rseq: threads are not registered here";
  }
  ASSERT_TRUE(colocate_pin(kMe, id, cpus[1], 0, +registered));
  EXPECT_EQ(colocate_pinned_tid(), id);
  pinned.set_value();
  left.get_future().wait();
  EXPECT_EQ(colocate_pinned_tid(), 0) << "the pin outlived its thread's exit";
  EXPECT_FALSE(colocate_pin(kMe, id, cpus[1], 0, +registered)) << "a thread that left";
  t.join();
}

// Two owners (two pagers): only the one holding the pin ends it.
TEST(Colocate, OnlyTheOwnerEndsThePin) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  Parked a;
  const cpu_set_t before = mask_of(a.tid);
  const int other = 0;
  ASSERT_TRUE(pin(a.tid, cpus[0]));
  EXPECT_FALSE(colocate_still_pinned(&other));
  colocate_unpin(&other);
  EXPECT_EQ(colocate_pinned_tid(), a.tid);
  EXPECT_TRUE(only(mask_of(a.tid), cpus[0]));
  colocate_unpin(kMe);
  EXPECT_TRUE(same(mask_of(a.tid), before));
}

TEST(Colocate, ConfigFromEnv) {
  EXPECT_EQ(PagerConfig{}.colocate, ColocateMode::kAuto);
  for (auto [text, mode] :
       {std::pair{"auto", ColocateMode::kAuto}, std::pair{"on", ColocateMode::kOn},
        std::pair{"off", ColocateMode::kOff}}) {
    setenv("FARMEM_COLOCATE", text, 1);
    auto c = PagerConfig::from_env(PagerConfig{});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->colocate, mode);
    EXPECT_STREQ(colocate_name(mode), text);
  }
  setenv("FARMEM_COLOCATE", "yes", 1);
  auto bad = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_COLOCATE");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("FARMEM_COLOCATE=yes"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace farmem::testing
