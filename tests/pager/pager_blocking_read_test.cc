// Idle handlers blocked in read() of the uffd (pager.h "Idle handlers block
// in read()"): the descriptor's blocking mode itself, and the pager torn
// down, forked and faulted with handlers blocked there, each test run both
// with blocking reads (when the kernel honours RWF_NOWAIT on a uffd) and
// with the ppoll() fallback forced (config.blocking_read = false).
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>
#include <vector>

#include "pager_harness.h"

namespace farmem::testing {
namespace {

// Whether this kernel lets the pager block in read() (the pager's own probe).
bool kernel_has_blocking_reads() {
  auto u = Uffd::open();
  return u.ok() && u->enable_blocking_reads();
}

void write_range(uint8_t* mem, size_t from, size_t to, uint64_t version) {
  for (size_t pg = from; pg < to; ++pg) fill_page(mem + pg * kPage, pg, version);
}

// The descriptor level: a read that waits, one that never does, and the
// kernel's POLLERR for poll() of a blocking uffd (why the pager switches the
// descriptor back to non-blocking while a handler polls).
TEST(UffdBlockingRead, ReadWaitsReadNowaitDoesNot) {
  FARMEM_SKIP_WITHOUT_UFFD();
  auto u = Uffd::open();
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  if (!u->enable_blocking_reads()) GTEST_SKIP() << "no RWF_NOWAIT on a userfaultfd (Linux < 6.10)";
  EXPECT_TRUE(u->blocking_reads());
  uffd_msg m[4];
  errno = 0;
  EXPECT_EQ(u->read_nowait(m, sizeof m), -1);
  EXPECT_EQ(errno, EAGAIN);
  pollfd pfd{u->fd(), POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 0), 1);
  EXPECT_TRUE(pfd.revents & POLLERR) << pfd.revents;
  u->set_nonblocking(true);
  pfd.revents = 0;
  EXPECT_EQ(poll(&pfd, 1, 0), 0) << pfd.revents;  // nothing pending, no error
  u->set_nonblocking(false);

  void* mem = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  ASSERT_TRUE(u->register_range(mem, 2 * kPage).ok());
  std::atomic<int> seen{-1};
  std::thread t([&] { seen = static_cast<volatile uint8_t*>(mem)[kPage + 5]; });
  const ssize_t n = read(u->fd(), m, sizeof m);  // waits for the fault
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof(uffd_msg)));
  EXPECT_EQ(m[0].event, UFFD_EVENT_PAGEFAULT);
  EXPECT_EQ(m[0].arg.pagefault.address & ~uint64_t{kPage - 1},
            reinterpret_cast<uintptr_t>(mem) + kPage);
  alignas(4096) static uint8_t src[kPage];
  src[5] = 42;
  EXPECT_EQ(u->copy(static_cast<char*>(mem) + kPage, src, kPage, false), Errc::kOk);
  t.join();
  EXPECT_EQ(seen.load(), 42);
  EXPECT_TRUE(u->unregister_range(mem, 2 * kPage).ok());
  munmap(mem, 2 * kPage);
}

class PagerBlockingReadTest : public ::testing::TestWithParam<bool> {
 protected:
  // A pager over `region` pages with a budget of `budget`, `handlers`
  // handler threads, blocking reads as the parameter says.
  P& start(LoopbackRig& rig, size_t budget, size_t region, uint32_t handlers, bool prefetch) {
    PagerConfig c = small_config(budget, region);
    c.handler_threads = handlers;
    c.prefetch = prefetch;
    c.blocking_read = GetParam();
    P& p = rig.start(c);
    EXPECT_EQ(p.uses_blocking_read(), GetParam() && kernel_has_blocking_reads());
    return p;
  }
};

// ~Pager while every handler is idle, i.e. blocked in read(): the doorbell
// must reach each of them (a hang here is a ctest timeout).
TEST_P(PagerBlockingReadTest, DestroyWithIdleHandlersManyTimes) {
  FARMEM_SKIP_WITHOUT_UFFD();
  for (int round = 0; round < 40; ++round) {
    LoopbackRig rig;
    const uint32_t handlers = 1 + static_cast<uint32_t>(round % 4);
    P& p = start(rig, 64, 256, handlers, false);
    auto* mem = static_cast<uint8_t*>(p.base());
    if (round % 2 == 0) {  // half the rounds never fault at all
      write_range(mem, 0, 16, static_cast<uint64_t>(round));
      ASSERT_EQ(first_bad_page(mem, 16, static_cast<uint64_t>(round)), 16u) << "round " << round;
    }
    rig.pager.reset();
  }
}

// ~Pager right after faults that leave I/O behind: write-backs of a region
// 4x the budget and prefetch READs of a sequential read-back in flight.
TEST_P(PagerBlockingReadTest, DestroyRightAfterFaultsManyTimes) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 128, kPages = 512;
  for (int round = 0; round < 12; ++round) {
    LoopbackRig rig;
    P& p = start(rig, kBudget, kPages, 1 + static_cast<uint32_t>(round % 2), true);
    auto* mem = static_cast<uint8_t*>(p.base());
    write_range(mem, 0, kPages, 7);
    ASSERT_EQ(first_bad_page(mem, kPages, 7), kPages) << "round " << round;
    const PagerStats s = p.stats();
    EXPECT_GT(s.faults_remote, 0u) << s.to_string();  // the read-back came from the donor
    rig.pager.reset();
  }
}

// Bytes exact after eviction with several application threads faulting on
// several handlers, twice over (the second pass rewrites what was evicted).
TEST_P(PagerBlockingReadTest, BytesExactAfterEviction) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 256, kPages = 2048, kThreads = 3;
  LoopbackRig rig;
  P& p = start(rig, kBudget, kPages, 2, false);
  auto* mem = static_cast<uint8_t*>(p.base());
  for (uint64_t version = 1; version <= 2; ++version) {
    std::vector<std::thread> ts;
    std::atomic<size_t> bad{0};
    for (size_t t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        const size_t from = t * kPages / kThreads, to = (t + 1) * kPages / kThreads;
        write_range(mem, from, to, version);
        if (first_bad_page(mem, to, version, from) != to) ++bad;
      });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(bad.load(), 0u) << "version " << version;
    EXPECT_EQ(first_bad_page(mem, kPages, version), kPages) << "version " << version;
  }
  const PagerStats s = p.stats();
  EXPECT_GT(s.evictions_dirty, kPages / 2) << s.to_string();
  EXPECT_GT(s.faults_remote, kPages / 2) << s.to_string();
}

// fork() while the handlers are idle (blocked in read()): prepare_fork()
// must get them out of their dispatch sections, and fork_parent() must see
// the UFFD_EVENT_FORK. The child reads the snapshot (evicted blocks
// included) and the parent goes on faulting, several rounds.
TEST_P(PagerBlockingReadTest, ForkWhileHandlersIdle) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 128, kPages = 640;
  LoopbackRig rig;
  P& p = start(rig, kBudget, kPages, 2, false);
  if (!p.fork_snapshots()) GTEST_SKIP() << "no UFFD_FEATURE_EVENT_FORK (CAP_SYS_PTRACE)";
  auto* mem = static_cast<uint8_t*>(p.base());
  for (uint64_t round = 1; round <= 4; ++round) {
    write_range(mem, 0, kPages, round);
    ASSERT_TRUE(p.prepare_fork().ok());
    const pid_t pid = fork();
    if (pid == 0) {
      p.fork_child();
      const size_t bad = first_bad_page(mem, kPages, round);
      if (bad != kPages) {
        char msg[96];
        const int n = snprintf(msg, sizeof msg, "child: page %zu is not version %llu\n", bad,
                               static_cast<unsigned long long>(round));
        ssize_t w = ::write(2, msg, static_cast<size_t>(n));
        (void)w;
        _exit(10);
      }
      _exit(0);
    }
    p.fork_parent();
    ASSERT_GE(pid, 0) << strerror(errno);
    EXPECT_EQ(p.fork_events(), round);
    // The parent faults on (rewrites) everything while the child checks.
    write_range(mem, 0, kPages, round + 100);
    EXPECT_EQ(first_bad_page(mem, kPages, round + 100), kPages) << "round " << round;
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "round " << round;
  }
  EXPECT_TRUE(wait_until([&] { return p.fork_children() == 0; }, 20000)) << p.fork_children();
}

INSTANTIATE_TEST_SUITE_P(Modes, PagerBlockingReadTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("Blocking") : std::string("Ppoll");
                         });

}  // namespace
}  // namespace farmem::testing
