// fork() snapshots of a pager region (DESIGN.md invariant 8): the child sees
// the region as it was at the fork, evicted blocks included, whatever the
// parent does afterwards, and its own writes never reach the parent.
//
//   // around fork() (the preload library does this from pthread_atfork):
//   FARMEM_RETURN_IF_ERROR(pager.prepare_fork());   // quiesce + snapshot
//   pid_t pid = fork();
//   if (pid == 0) pager.fork_child(); else pager.fork_parent();  // failed fork too
//
// The caller is the pager (Pager::prepare_fork / fork_parent, in
// pager/fork_path.h). The dependency is one way: the pager includes this
// file and calls ForkSupport; this file includes no pager header and calls
// nothing of the pager (what it needs comes in Env).
//
// How:
//   * The uffd has UFFD_FEATURE_EVENT_FORK (pager/uffd.h). At a fork the
//     kernel keeps the child's copy of the region registered (MISSING + WP,
//     uffd-wp bits kept) with a new descriptor, delivered to the PARENT as a
//     UFFD_EVENT_FORK message; a handler thread reads it and hands the
//     descriptor to this ForkSupport. Blocks mapped at the fork need nothing:
//     the kernel gives the child a copy-on-write copy.
//   * The snapshot records, for every block NOT mapped at the fork, the
//     remote unit that holds its data (dirty victims are written back first,
//     so that every unmapped block's data is in its unit); a block without
//     an entry reads as zeros in the child.
//   * One "fm-fork" thread in the parent serves every child: a missing
//     fault is filled with UFFDIO_COPY from a READ of the unit (or
//     UFFDIO_ZEROPAGE); right after adoption the whole child region is
//     un-write-protected with one ioctl (copy-on-write still isolates the
//     two processes), so the child takes no WP faults. It has its own
//     transport queue and staging buffer: the parent's fault path is
//     unchanged. The child has no transport (ibverbs and fork do not mix)
//     and no pager thread: its pager object is inert (in_fork_child()).
//   * A unit a live snapshot references is frozen: a write-back of its
//     block moves the block to a new unit (the old one is "orphaned"), and
//     freeing it (discard) is deferred; both are freed when the last
//     snapshot that references them is released.
//   * Release: when a child's address space is gone (exit or exec) its
//     descriptor's ioctls fail with ESRCH; the thread probes every child
//     every kProbeMs with a no-op UFFDIO_WRITEPROTECT(unprotect) of one
//     block. This follows the address space itself, so a child that closes
//     all its descriptors is still served, and exec releases at once.
//   * Did the fork succeed? Not from errno (atfork handlers and libc may
//     change it): the kernel lets a fork that copied the address space
//     return only after the UFFD_EVENT_FORK was read, so a snapshot not
//     adopted by then (Pager::fork_parent waits for the dispatch sections
//     that were reading) belongs to a fork that failed early (RLIMIT_NPROC,
//     EAGAIN) and is dropped. A fork that fails after the copy (pids cgroup
//     limit, bad CLONE_INTO_CGROUP fd) still delivers the event
//     (userfaultfd(2), BUGS): that child address space is already gone, the
//     first probe sees ESRCH and releases the snapshot (tested in
//     tests/pager/pager_fork_test.cc).
//   * Nested forks: a child's fork arrives as UFFD_EVENT_FORK on the child's
//     descriptor, read by the same thread; the grandchild shares the
//     child's snapshot (blocks the child has not faulted in are still the
//     snapshot's; the rest the kernel copies).
//   * Parent exit while children live: finish_children() (called by the
//     preload library's destructor and by ~Pager) copies every snapshot
//     block a child has not faulted in yet into it (UFFDIO_COPY of all,
//     EEXIST skipped) before closing its descriptor, so the child never
//     reads zeros where data was. A parent that dies without running it
//     (_exit, a signal) leaves its children's unfetched blocks reading as
//     zeros: the kernel drops their registration.
//   * Child memory: what a child faults in stays resident in the child
//     (nothing evicts there); it is ordinary private memory.
//
// Forks that bypass prepare_fork() (a raw clone() without CLONE_VM) still
// produce an event; the descriptor is closed with a warning and the child
// sees zeros for unmapped blocks. While a fork is in progress the kernel
// fails UFFDIO_COPY / WRITEPROTECT on the parent's descriptor with EAGAIN
// until the event is read; prepare_fork() therefore keeps the handlers from
// starting any ioctl (faults are parked) from the snapshot until
// fork_parent(), so that a free handler always reads the event.
#pragma once

#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pager/page_table.h"
#include "pager/remote_map.h"
#include "pager/uffd.h"
#include "runtime/log.h"
#include "runtime/transport.h"

namespace farmem {

// One fork's view of the blocks that were not mapped at the fork.
struct ForkSnapshot {
  struct Entry {
    uint32_t block;
    uint32_t unit;  // remote unit; kNoRemote: reads as zeros (cleared by a discard)
  };
  std::vector<Entry> entries;  // sorted by block
  uint32_t children = 0;       // child address spaces served from it (ForkSupport::mu_)

  const Entry* find(uint32_t b) const {
    auto it = std::lower_bound(entries.begin(), entries.end(), b,
                               [](const Entry& e, uint32_t v) { return e.block < v; });
    return it != entries.end() && it->block == b ? &*it : nullptr;
  }
  Entry* find(uint32_t b) { return const_cast<Entry*>(std::as_const(*this).find(b)); }
};

template <TransportBackend B>
class ForkSupport {
 public:
  static constexpr int kProbeMs = 100;
  static constexpr uint32_t kStaging = 16;  // blocks: READs in flight when filling at exit

  struct Env {
    B* transport = nullptr;
    RemoteMap* remote = nullptr;
    char* region = nullptr;
    uint64_t region_size = 0;
    uint32_t block = 0;
  };

  ForkSupport() = default;
  ForkSupport(const ForkSupport&) = delete;
  ForkSupport& operator=(const ForkSupport&) = delete;
  ~ForkSupport() { shutdown(false); }

  // Control path, first prepare_fork(): the queue, staging and the thread.
  Status start(const Env& env);
  bool started() const { return started_.load(std::memory_order_acquire); }

  // ---- forming a snapshot (prepare_fork .. the fork event) ----
  // From now on a discard of a block clears its entry in the snapshot
  // being formed (it was freed before the child could see it).
  void open_window() {
    window_.store(true, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mu_); }
  // mu_ held: a new snapshot to fill with record_locked().
  void begin_locked() { forming_ = std::make_shared<ForkSnapshot>(); }
  void record_locked(uint32_t b, uint32_t unit) {
    forming_->entries.push_back({b, unit});
    freeze_locked(unit);
  }
  // mu_ held: formed; the next UFFD_EVENT_FORK adopts it.
  void publish_locked() { pending_ = std::move(forming_); }
  // mu_ held: prepare_fork failed part way: forget the snapshot being formed.
  void abandon_locked() {
    if (forming_) release_snapshot_locked(*forming_);
    forming_.reset();
    window_.store(false, std::memory_order_release);
  }
  // The parent after fork(), once every handler dispatch section that ran
  // when fork() returned has ended (Pager::fork_parent): a snapshot still
  // pending had no UFFD_EVENT_FORK, so no child exists: it is dropped.
  void fork_done();

  // ---- the pager's unit bookkeeping ----
  // Frozen: a snapshot reads unit u, so the block's next write-back must go
  // to a new unit. Cheap when no snapshot lives.
  bool unit_frozen(uint32_t u) {
    if (frozen_count_.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> lk(mu_);
    return frozen_.count(u) != 0;
  }
  // The parent no longer references unit u of block b (discarded, or its
  // block moved to a new unit). true: a snapshot keeps it and frees it on
  // release; false: the caller frees it now. discarded: also clear b's
  // entry in a snapshot still being formed.
  bool keep_unit(uint32_t b, uint32_t u, bool discarded);

  // ---- from a handler thread: a UFFD_EVENT_FORK on the parent's uffd ----
  void on_fork_event(int ufd) noexcept;

  // Fills every live child with its snapshot blocks, closes them, stops the
  // thread (fill = false: just stop). Idempotent.
  void shutdown(bool fill);

  // Tests and statistics.
  size_t children() const { return n_children_.load(std::memory_order_acquire); }
  uint64_t events() const { return events_.load(std::memory_order_relaxed); }
  size_t frozen_units() const { return frozen_count_.load(std::memory_order_acquire); }
  uint64_t faults_served() const { return served_.load(std::memory_order_relaxed); }

 private:
  struct Child {
    int fd = -1;
    std::shared_ptr<ForkSnapshot> snap;
    bool dead = false;
  };
  struct Frozen {
    uint32_t refs = 0;
    bool orphaned = false;  // the parent no longer references it: free at refs 0
  };

  void freeze_locked(uint32_t u) {
    auto& f = frozen_[u];
    ++f.refs;
    frozen_count_.store(frozen_.size(), std::memory_order_release);
  }
  void thaw_locked(uint32_t u);  // one reference less
  void release_snapshot_locked(ForkSnapshot& s);
  void adopt(Child c);  // server thread: into adopted_, merged by merge_adopted()
  void merge_adopted();
  void server_main();
  void read_events(Child& c);
  // Serves one fault of c; false when the child is gone.
  bool serve(Child& c, uint64_t addr, uint64_t flags);
  bool fill_block(Child& c, uint32_t b, const ForkSnapshot::Entry* e);
  // READ of unit into staging block i; false on a transport error (logged).
  bool read_unit(uint32_t unit, uint32_t i, uint32_t b);
  // UFFDIO_COPY / ZEROPAGE into c, handling EAGAIN (the child is forking:
  // its event is read first) and EEXIST (page by page). false: child gone.
  bool install(Child& c, char* dst, const char* src);
  void fill_all(Child& c);
  void close_child(Child& c);

  Env env_;
  std::atomic<bool> started_{false};
  std::unique_ptr<typename B::Queue> q_;
  char* staging_ = nullptr;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> n_children_{0};
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> events_{0};  // UFFD_EVENT_FORK on the parent's descriptor

  std::mutex mu_;
  std::atomic<bool> window_{false};
  std::shared_ptr<ForkSnapshot> forming_;        // guarded by mu_
  std::shared_ptr<ForkSnapshot> pending_;        // guarded by mu_
  std::unordered_map<uint32_t, Frozen> frozen_;  // guarded by mu_
  std::atomic<size_t> frozen_count_{0};
  std::vector<Child> inbox_;        // guarded by mu_: adopted by handlers, served by the thread
  std::vector<Child> children_;     // server thread only (and shutdown after it stopped)
  std::vector<Child> adopted_;      // server thread: new children, merged between passes
  bool warned_unexpected_ = false;  // guarded by mu_
};

// ---------------------------------------------------------------------------

template <TransportBackend B>
Status ForkSupport<B>::start(const Env& env) {
  if (started()) return ok_status();
  env_ = env;
  auto q = env.transport->open_queue();
  if (!q.ok()) return q.status().with_context("fork snapshots: opening a transport queue");
  q_ = std::move(*q);
  const size_t len = uint64_t{kStaging} * env.block;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return make_error(Errc::kResourceExhausted, "fork snapshots: mmap of %zu bytes: %s", len,
                      strerror(errno));
  }
  staging_ = static_cast<char*>(p);
  Status st = env.transport->register_buffer(staging_, len);
  if (!st.ok()) {
    munmap(staging_, len);
    staging_ = nullptr;
    return st.with_context("fork snapshots: registering the staging buffer");
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return make_error(Errc::kIo, "fork snapshots: eventfd: %s", strerror(errno));
  inbox_.reserve(16);
  thread_ = std::thread([this] { server_main(); });
  started_.store(true, std::memory_order_release);
  return ok_status();
}

template <TransportBackend B>
void ForkSupport<B>::fork_done() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!pending_) return;  // adopted: a child (or a spurious event's dead one)
  release_snapshot_locked(*pending_);
  pending_.reset();
  window_.store(false, std::memory_order_release);
}

template <TransportBackend B>
bool ForkSupport<B>::keep_unit(uint32_t b, uint32_t u, bool discarded) {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with open_window()
  if (!window_.load(std::memory_order_seq_cst) &&
      frozen_count_.load(std::memory_order_acquire) == 0) {
    return false;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (discarded && window_.load(std::memory_order_relaxed)) {
    for (ForkSnapshot* s : {forming_.get(), pending_.get()}) {
      if (s == nullptr) continue;
      ForkSnapshot::Entry* e = s->find(b);
      if (e != nullptr && e->unit == u) {
        e->unit = kNoRemote;
        thaw_locked(u);
      }
    }
  }
  auto it = frozen_.find(u);
  if (it == frozen_.end()) return false;
  it->second.orphaned = true;
  return true;
}

template <TransportBackend B>
void ForkSupport<B>::thaw_locked(uint32_t u) {
  auto it = frozen_.find(u);
  FARMEM_BUG_ON(it == frozen_.end() || it->second.refs == 0);
  if (--it->second.refs > 0) return;
  if (it->second.orphaned) env_.remote->free_unit(u);
  frozen_.erase(it);
  frozen_count_.store(frozen_.size(), std::memory_order_release);
}

template <TransportBackend B>
void ForkSupport<B>::release_snapshot_locked(ForkSnapshot& s) {
  for (ForkSnapshot::Entry& e : s.entries) {
    if (e.unit != kNoRemote) thaw_locked(e.unit);
    e.unit = kNoRemote;
  }
}

template <TransportBackend B>
void ForkSupport<B>::on_fork_event(int ufd) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  events_.fetch_add(1, std::memory_order_relaxed);
  if (!pending_ || !started()) {
    if (!warned_unexpected_) {
      warned_unexpected_ = true;
      FARMEM_LOG(kWarn,
                 "fork snapshots: a fork() happened without Pager::prepare_fork() (a raw clone?); "
                 "its child reads zeros where far memory was not resident at the fork");
    }
    close(ufd);
    return;
  }
  Child c;
  c.fd = ufd;
  c.snap = std::move(pending_);
  pending_.reset();
  c.snap->children = 1;
  window_.store(false, std::memory_order_release);
  inbox_.push_back(std::move(c));
  n_children_.fetch_add(1, std::memory_order_acq_rel);
  uint64_t one = 1;
  ssize_t w = write(wake_fd_, &one, sizeof one);
  (void)w;
}

template <TransportBackend B>
void ForkSupport<B>::adopt(Child c) {
  // No WP faults in the child: its pages are copy-on-write anyway.
  int err = 0;
  Errc e = Uffd::unprotect_on(c.fd, env_.region, env_.region_size, &err);
  while (e == Errc::kUnavailable) {
    read_events(c);  // the new child forks already: take that event first
    e = Uffd::unprotect_on(c.fd, env_.region, env_.region_size, &err);
  }
  if (e != Errc::kOk && e != Errc::kNotFound) {
    FARMEM_LOG(kWarn, "fork snapshots: un-write-protecting a child's region failed: %s",
               strerror(err));
  }
  // Not into children_ directly: callers may hold a reference into it.
  adopted_.push_back(std::move(c));
}

template <TransportBackend B>
void ForkSupport<B>::merge_adopted() {
  for (Child& c : adopted_) children_.push_back(std::move(c));
  adopted_.clear();
}

template <TransportBackend B>
void ForkSupport<B>::read_events(Child& c) {
  uffd_msg msgs[16];
  for (;;) {
    ssize_t n = read(c.fd, msgs, sizeof msgs);
    if (n <= 0) return;
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(uffd_msg); ++i) {
      const uffd_msg& m = msgs[i];
      if (m.event == UFFD_EVENT_FORK) {
        // Nested fork: the grandchild shares this child's snapshot.
        Child g;
        g.fd = static_cast<int>(m.arg.fork.ufd);
        g.snap = c.snap;
        {
          std::lock_guard<std::mutex> lk(mu_);
          ++g.snap->children;
        }
        n_children_.fetch_add(1, std::memory_order_acq_rel);
        adopt(std::move(g));
      } else if (m.event == UFFD_EVENT_PAGEFAULT && !c.dead) {
        if (!serve(c, m.arg.pagefault.address, m.arg.pagefault.flags)) c.dead = true;
      }
    }
  }
}

template <TransportBackend B>
bool ForkSupport<B>::read_unit(uint32_t unit, uint32_t i, uint32_t b) {
  for (int attempt = 0;; ++attempt) {
    IoOp op{IoKind::kRead, env_.block, env_.remote->resolve(unit),
            staging_ + uint64_t{i} * env_.block, i};
    Errc e = q_->post({&op, 1});
    IoCompletion c{i, e};
    if (e == Errc::kOk) {
      while (q_->wait({&c, 1}, 100) == 0) {
      }
    }
    if (c.status == Errc::kOk) return true;
    // Never zeros where data was: the child stays blocked on the fault and
    // the READ is retried (a lost donor is fatal in the parent anyway).
    if (attempt % 50 == 0) {
      FARMEM_LOG(kError,
                 "fork snapshots: READ of block %u (region %p) for a child from donor %s failed "
                 "(%s); retrying",
                 b, static_cast<void*>(env_.region), env_.remote->server_name(op.remote.server),
                 errc_name(c.status));
    }
    if (stop_.load(std::memory_order_acquire)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

template <TransportBackend B>
bool ForkSupport<B>::install(Child& c, char* dst, const char* src) {
  size_t off = 0;
  const size_t len = env_.block;
  while (off < len) {
    size_t done = 0;
    int err = 0;
    Errc e = src ? Uffd::copy_on(c.fd, dst + off, src + off, len - off, false, &done, &err)
                 : Uffd::zeropage_on(c.fd, dst + off, len - off, &done, &err);
    off += done;
    if (e == Errc::kOk) return true;
    if (e == Errc::kNotFound) return false;  // ESRCH: the child is gone
    if (e == Errc::kUnavailable) {
      read_events(c);  // EAGAIN: it is forking; its event must be read first
      if (c.dead) return false;
      continue;
    }
    if (e == Errc::kInvalidArgument) {
      // EEXIST: this page is there already (the child has it): skip it.
      off = (off + 4096) & ~size_t{4095};
      continue;
    }
    FARMEM_LOG(kWarn, "fork snapshots: installing a page in a child failed: %s", strerror(err));
    return true;
  }
  return true;
}

template <TransportBackend B>
bool ForkSupport<B>::fill_block(Child& c, uint32_t b, const ForkSnapshot::Entry* e) {
  char* dst = env_.region + uint64_t{b} * env_.block;
  if (e == nullptr || e->unit == kNoRemote) return install(c, dst, nullptr);
  if (!read_unit(e->unit, 0, b)) return true;
  return install(c, dst, staging_);
}

template <TransportBackend B>
bool ForkSupport<B>::serve(Child& c, uint64_t addr, uint64_t flags) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(env_.region);
  if (addr < base || addr >= base + env_.region_size) {
    // Outside the region only the victim slots can be registered (WP, for
    // UFFDIO_MOVE); the child never uses them: let it through.
    int err = 0;
    Errc e = Uffd::unprotect_on(c.fd, reinterpret_cast<void*>(addr & ~uint64_t{4095}), 4096, &err);
    return e != Errc::kNotFound;
  }
  const uint32_t b = static_cast<uint32_t>((addr - base) / env_.block);
  if (flags & UFFD_PAGEFAULT_FLAG_WP) {
    Errc e = Uffd::unprotect_on(c.fd, env_.region + uint64_t{b} * env_.block, env_.block);
    return e != Errc::kNotFound;
  }
  const ForkSnapshot::Entry* ent = c.snap->find(b);
  served_.fetch_add(1, std::memory_order_relaxed);
  return fill_block(c, b, ent);
}

template <TransportBackend B>
void ForkSupport<B>::close_child(Child& c) {
  close(c.fd);
  c.fd = -1;
  std::lock_guard<std::mutex> lk(mu_);
  if (--c.snap->children == 0) release_snapshot_locked(*c.snap);
  c.snap.reset();
  n_children_.fetch_sub(1, std::memory_order_acq_rel);
}

template <TransportBackend B>
void ForkSupport<B>::server_main() {
  pthread_setname_np(pthread_self(), "fm-fork");
  std::vector<pollfd> fds;
  auto last_probe = std::chrono::steady_clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    for (const Child& c : children_) fds.push_back({c.fd, POLLIN, 0});
    int r = poll(fds.data(), fds.size(), kProbeMs);
    if (stop_.load(std::memory_order_acquire)) break;
    if (r > 0 && (fds[0].revents & POLLIN)) {
      uint64_t v;
      ssize_t n = read(wake_fd_, &v, sizeof v);
      (void)n;
      std::vector<Child> in;
      {
        std::lock_guard<std::mutex> lk(mu_);
        in.swap(inbox_);
        inbox_.reserve(16);
      }
      for (Child& c : in) adopt(std::move(c));
    }
    merge_adopted();
    const size_t n_polled = fds.size() - 1;
    for (size_t i = 0; r > 0 && i < n_polled && i < children_.size(); ++i) {
      if (fds[i + 1].revents & (POLLIN | POLLERR)) read_events(children_[i]);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_probe >= std::chrono::milliseconds(kProbeMs)) {
      last_probe = now;
      for (Child& c : children_) {
        if (c.dead) continue;
        // A no-op (nothing there is write-protected), except that it fails
        // with ESRCH once the child's address space is gone.
        if (Uffd::unprotect_on(c.fd, env_.region, env_.block) == Errc::kNotFound) c.dead = true;
      }
    }
    size_t keep = 0;
    for (size_t i = 0; i < children_.size(); ++i) {
      if (children_[i].dead) {
        close_child(children_[i]);
      } else {
        if (keep != i) children_[keep] = std::move(children_[i]);
        ++keep;
      }
    }
    children_.resize(keep);
    merge_adopted();
  }
}

template <TransportBackend B>
void ForkSupport<B>::fill_all(Child& c) {
  // Batches of READs into the staging blocks, then one UFFDIO_COPY each.
  const auto& ents = c.snap->entries;
  size_t i = 0;
  while (i < ents.size() && !c.dead) {
    IoOp ops[kStaging];
    uint32_t blocks[kStaging], units[kStaging];
    size_t n = 0;
    for (; i < ents.size() && n < kStaging && n < q_->depth(); ++i) {
      if (ents[i].unit == kNoRemote) continue;  // zeros: the kernel's own zero fill will do
      blocks[n] = ents[i].block;
      units[n] = ents[i].unit;
      ops[n] = IoOp{IoKind::kRead, env_.block, env_.remote->resolve(ents[i].unit),
                    staging_ + uint64_t{n} * env_.block, n};
      ++n;
    }
    if (n == 0) continue;
    IoCompletion comps[kStaging];
    size_t got = 0;
    Errc pe = q_->post({ops, n});
    if (pe == Errc::kOk) {
      while (got < n) got += q_->wait({comps + got, n - got}, 100);
    }
    for (size_t k = 0; k < n && !c.dead; ++k) {
      bool ok = pe == Errc::kOk;
      for (size_t j = 0; ok && j < got; ++j) {
        if (comps[j].cookie == k) ok = comps[j].status == Errc::kOk;
      }
      // A failed batch READ is retried alone (never zeros where data was).
      if (!ok && !read_unit(units[k], static_cast<uint32_t>(k), blocks[k])) continue;
      if (!install(c, env_.region + uint64_t{blocks[k]} * env_.block,
                   staging_ + uint64_t{k} * env_.block)) {
        c.dead = true;
      }
    }
  }
}

template <TransportBackend B>
void ForkSupport<B>::shutdown(bool fill) {
  if (!started_.exchange(false, std::memory_order_acq_rel)) return;
  stop_.store(true, std::memory_order_release);
  uint64_t one = 1;
  ssize_t w = write(wake_fd_, &one, sizeof one);
  (void)w;
  if (thread_.joinable()) thread_.join();
  stop_.store(false, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (Child& c : inbox_) children_.push_back(std::move(c));
    inbox_.clear();
  }
  // Children forked by children meanwhile (read while filling) are filled too.
  while (!children_.empty()) {
    for (Child& c : children_) {
      if (fill && !c.dead) fill_all(c);
      close_child(c);
    }
    children_.clear();
    merge_adopted();
  }
  q_.reset();
  if (staging_) {
    (void)env_.transport->unregister_buffer(staging_);
    munmap(staging_, uint64_t{kStaging} * env_.block);
    staging_ = nullptr;
  }
  close(wake_fd_);
  wake_fd_ = -1;
}

}  // namespace farmem
