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

namespace farmem::testing {
namespace {

int own_tid() {
  return static_cast<int>(syscall(SYS_gettid));
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
  ASSERT_TRUE(colocate_pin(a.tid, cpus[1]));
  EXPECT_TRUE(only(mask_of(a.tid), cpus[1]));
  EXPECT_EQ(colocate_pinned_tid(), a.tid);
  EXPECT_EQ(colocate_pinned_cpu(), cpus[1]);
  EXPECT_TRUE(colocate_still_pinned());
  // One pin at a time: b keeps its mask.
  EXPECT_FALSE(colocate_pin(b.tid, cpus[0]));
  EXPECT_TRUE(same(mask_of(b.tid), before));
  colocate_unpin();
  EXPECT_TRUE(same(mask_of(a.tid), before));
  EXPECT_EQ(colocate_pinned_tid(), 0);
  // Bad arguments change nothing.
  EXPECT_FALSE(colocate_pin(0, cpus[0]));
  EXPECT_FALSE(colocate_pin(a.tid, -1));
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
  EXPECT_FALSE(colocate_pin(id, cpus[0]));  // there already, by its own choice
  EXPECT_FALSE(colocate_pin(id, cpus[1]));  // not a CPU it may use
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
  ASSERT_TRUE(colocate_pin(id, cpus[1]));
  pinned.set_value();
  set.get_future().wait();
  EXPECT_FALSE(colocate_still_pinned());
  EXPECT_EQ(colocate_pinned_tid(), 0);
  colocate_unpin();  // nothing to restore
  EXPECT_TRUE(same(mask_of(id), two));
  go.set_value();
  t.join();
}

TEST(Colocate, SuspendLiftsThePinAndHoldsOffNewOnes) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  Parked a;
  const cpu_set_t before = mask_of(a.tid);
  ASSERT_TRUE(colocate_pin(a.tid, cpus[0]));
  colocate_suspend();
  EXPECT_TRUE(colocate_suspended());
  EXPECT_TRUE(same(mask_of(a.tid), before));
  EXPECT_EQ(colocate_pinned_tid(), 0);
  EXPECT_FALSE(colocate_still_pinned());
  EXPECT_FALSE(colocate_pin(a.tid, cpus[0]));
  colocate_suspend();  // nested
  colocate_resume();
  EXPECT_FALSE(colocate_pin(a.tid, cpus[0]));
  colocate_resume();
  EXPECT_FALSE(colocate_suspended());
  ASSERT_TRUE(colocate_pin(a.tid, cpus[0]));
  colocate_unpin();
  EXPECT_TRUE(same(mask_of(a.tid), before));
}

TEST(Colocate, AThreadThatEndsTakesThePinWithIt) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  Parked a;
  ASSERT_TRUE(colocate_pin(a.tid, cpus[1]));
  colocate_forget(a.tid + 1);  // another thread: no effect
  EXPECT_EQ(colocate_pinned_tid(), a.tid);
  colocate_forget(a.tid);
  EXPECT_EQ(colocate_pinned_tid(), 0);
  EXPECT_TRUE(only(mask_of(a.tid), cpus[1]));  // an ending thread's mask is not touched
}

// Whether a forked child's mask is the parent's full one: run `in_child`
// in a fork()ed child of the calling thread, which reports back.
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

TEST(Colocate, NothingThePinnedThreadStartsInheritsThePin) {
  SKIP_WITHOUT_TWO_CPUS(cpus);
  const cpu_set_t before = mask_of(own_tid());
  // A thread plays the program's faulting thread, pinned to cpus[1].
  std::thread t([&] {
    ASSERT_TRUE(colocate_pin(own_tid(), cpus[1]));
    ASSERT_TRUE(colocate_is_pinned_self());
    // A thread it starts, as the preload's pthread_create trampoline
    // does it (from_pinned), gets the mask back.
    cpu_set_t got;
    std::thread([&] {
      colocate_restore_self(/*from_pinned=*/true);
      got = mask_of(0);
    }).join();
    EXPECT_TRUE(same(got, before));
    // One not started by it (no flag) that has {cpus[1]} keeps it.
    std::thread([&] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[1], &one);
      ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
      colocate_restore_self();
      got = mask_of(0);
    }).join();
    EXPECT_TRUE(only(got, cpus[1]));
    // A fork() child (the preload's pthread_atfork handlers)...
    colocate_fork_prepare();
    EXPECT_TRUE(child_mask_is(before, [] { colocate_fork_child(); }));
    // ... and a child that execs without them (vfork + exec, an exec
    // wrapper's colocate_restore_self()).
    EXPECT_TRUE(child_mask_is(before, [] { colocate_restore_self(); }));
    // Without either, the child would keep the pin: the check can fail.
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[1], &one);
    EXPECT_TRUE(child_mask_is(one, [] {}));
    // The parent is still pinned.
    EXPECT_TRUE(only(mask_of(0), cpus[1]));
    EXPECT_TRUE(colocate_still_pinned());
    // The pinned thread's own exec gives it its mask back too.
    colocate_restore_self();
    EXPECT_TRUE(same(mask_of(0), before));
    EXPECT_FALSE(colocate_still_pinned());
  });
  t.join();
  EXPECT_EQ(colocate_pinned_tid(), 0);
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
