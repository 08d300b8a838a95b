// userfaultfd set-up: opening the descriptor with a clear error when the
// process may not, feature detection, and thin noexcept wrappers of the
// range ioctls the fault path uses.
//
//   auto uffd = farmem::Uffd::open();            // Result<Uffd>
//   if (!uffd.ok()) fatal("%s", uffd.status().to_string().c_str());
//   FARMEM_RETURN_IF_ERROR(uffd->register_range(base, len));
//   uffd->copy(page, staging, 4096, /*write_protect=*/true);  // Errc
//
// The base path needs MISSING + WP on anonymous memory (Linux >= 5.7). The
// newer features are detected and reported (UffdFeatures) so that callers
// can pick a faster path where one exists; nothing here requires them.
//
// fork(): UFFD_FEATURE_EVENT_FORK is enabled when the kernel has it and the
// process may use it (CAP_SYS_PTRACE; without it UFFDIO_API refuses the bit
// with EPERM and the descriptor is opened without it: features().event_fork
// is false and fork_unavailable_reason() says why). With it, a fork() keeps
// the child's copy of the range registered with a NEW descriptor that
// arrives as a UFFD_EVENT_FORK message on this one; the forking thread waits
// in the kernel until that message is read, and meanwhile UFFDIO_COPY /
// WRITEPROTECT on this descriptor fail with EAGAIN (see pager/fork_snapshot.h
// for how the pager keeps that from dead-locking). The *_on(fd, ...) forms
// act on such a child descriptor.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/net.h"
#include "runtime/status.h"

namespace farmem {

// What the running kernel offers (from UFFDIO_API on a probe descriptor).
struct UffdFeatures {
  uint64_t raw = 0;               // UFFD_FEATURE_* bits as reported
  bool missing_wp = false;        // MISSING + WP registration of anonymous memory (required)
  bool wp_unpopulated = false;    // UFFD_FEATURE_WP_UNPOPULATED
  bool wp_async = false;          // UFFD_FEATURE_WP_ASYNC (with PAGEMAP_SCAN)
  bool move = false;              // UFFDIO_MOVE
  bool minor_shmem = false;       // UFFDIO_CONTINUE on shmem
  bool exact_address = false;     // UFFD_FEATURE_EXACT_ADDRESS
  bool thread_id = false;         // UFFD_FEATURE_THREAD_ID: a fault names its thread (ptid)
  bool event_fork = false;        // UFFD_FEATURE_EVENT_FORK offered by the kernel
  std::string to_string() const;  // "missing+wp move wp_async ..."
};

// How the descriptor was obtained; tests and logs print it.
enum class UffdSource : uint8_t { kSyscall, kDevice };

// The error returned when neither userfaultfd(2) nor /dev/userfaultfd may
// be used (errno values of both attempts); it names the three fixes.
Status uffd_permission_error(int syscall_errno, int dev_errno);

class Uffd {
 public:
  // Opens a non-blocking userfaultfd with the WP feature enabled. When the
  // process is not allowed to, the error names the three fixes. wp_async:
  // also UFFD_FEATURE_WP_ASYNC when the kernel has it (wp_async() says
  // whether it was granted): every write to a write-protected page of a
  // range registered with this descriptor is then resolved by the kernel
  // (no event); PagemapScan finds those pages afterwards.
  static Result<Uffd> open(bool wp_async = false);
  // Cheap check for tests: empty string when userfaultfd with MISSING+WP is
  // usable here, else the reason.
  static std::string unavailable_reason();

  Uffd() = default;
  Uffd(Uffd&&) = default;
  Uffd& operator=(Uffd&&) = default;

  int fd() const { return fd_.get(); }
  const UffdFeatures& features() const { return features_; }
  // True when this descriptor reports forks (UFFD_EVENT_FORK), i.e. a child
  // keeps its registration; else fork_unavailable_reason() says why not.
  bool fork_events() const { return fork_events_; }
  const char* fork_unavailable_reason() const { return fork_why_; }
  UffdSource source() const { return source_; }
  bool wp_async() const { return wp_async_; }

  // Registers [addr, addr+len) in MISSING and WP modes.
  Status register_range(void* addr, size_t len);
  // Registers [addr, addr+len) in WP mode only: missing pages there are
  // filled by the kernel as usual, but the range may be the destination of
  // move() (UFFDIO_MOVE needs a destination registered with this
  // descriptor, and equal page protections on both sides, which WP
  // registration changes).
  Status register_wp_only(void* addr, size_t len);
  Status unregister_range(void* addr, size_t len);

  // Fault-path ioctls. All return kOk or a bare Errc (never allocate):
  // kIo with errno preserved in *err when err is non-null.
  // Installs `len` bytes from src at dst (page-aligned), optionally
  // write-protected; wakes the threads waiting on the range. EEXIST (already
  // mapped) is reported as kInvalidArgument.
  Errc copy(void* dst, const void* src, size_t len, bool write_protect,
            int* err = nullptr) noexcept;
  // Sets or clears write protection; clearing wakes the waiters.
  Errc write_protect(void* addr, size_t len, bool protect, int* err = nullptr) noexcept;
  Errc wake(void* addr, size_t len) noexcept;
  // Maps the kernel's shared zero page over [dst, dst+len) (UFFDIO_ZEROPAGE,
  // no wake), write-protects it and then wakes the waiters, so that a
  // waiter's first write takes a WP fault. A thread that is not waiting and
  // writes between the first two ioctls gets a private copy with no event
  // (the kernel's copy-on-write); pager/zero_fill.h says why that loses
  // nothing. EEXIST is kInvalidArgument.
  Errc zero_protected(void* dst, size_t len, int* err = nullptr) noexcept;

  // Blocking reads (fault_path.h "Idle handlers block in read()"). The descriptor
  // is opened non-blocking. enable_blocking_reads() makes read() wait for a
  // message, but only when a reader can still ask without waiting: preadv2
  // with RWF_NOWAIT, which a userfaultfd honours from Linux 6.10 (read_iter
  // and FMODE_NOWAIT; older kernels refuse it with EOPNOTSUPP).
  // It probes that once, with a read that must find nothing, so call it
  // before any range is registered; on a refusal it leaves the descriptor
  // non-blocking and returns false. Never allocates.
  bool enable_blocking_reads() noexcept;
  bool blocking_reads() const { return blocking_; }
  // poll() of a blocking userfaultfd always answers POLLERR (the kernel's
  // userfaultfd_poll: "poll() never guarantees that read won't block"), so
  // a caller that polls switches the descriptor back to non-blocking while
  // it does (the file status flag is shared by every reader; a read()
  // already blocked stays blocked). One fcntl(); only after
  // enable_blocking_reads() succeeded.
  void set_nonblocking(bool on) noexcept;
  // Reads pending messages without ever waiting, whatever the mode: bytes
  // read, or -1 with errno (EAGAIN: none pending, e.g. another handler took
  // it). Never allocates.
  ssize_t read_nowait(void* buf, size_t len) noexcept;
  // UFFDIO_MOVE (features().move, Linux >= 6.8): moves the pages of
  // [src, src+len) to dst without copying; src becomes unmapped, dst is
  // mapped writable and not write-protected. Wakes the waiters on dst unless
  // wake is false. Errors (errno in *err): EEXIST dst is mapped; EBUSY a
  // source page is shared (fork, KSM) or pinned (DMA); ENOENT a source page
  // is missing; EINVAL the ranges do not qualify. Callers fall back to
  // copy() on kIo: a range that moved in part is moved back first, so kIo
  // means nothing moved. kInternal: that undo failed (the caller must stop).
  Errc move(void* dst, void* src, size_t len, bool wake, int* err = nullptr) noexcept;

  // The same ioctls on any userfaultfd descriptor, e.g. a fork child's
  // (UFFD_EVENT_FORK). Unlike the members they do not retry EAGAIN (the
  // child's address space is changing: it is forking itself and waits for
  // its own UFFD_EVENT_FORK to be read), they report it as kUnavailable
  // with *done = bytes installed so far. ESRCH (the child's address space is
  // gone: it exited or exec'd) is kNotFound. EEXIST is kInvalidArgument.
  static Errc copy_on(int fd, void* dst, const void* src, size_t len, bool write_protect,
                      size_t* done, int* err = nullptr) noexcept;
  static Errc zeropage_on(int fd, void* dst, size_t len, size_t* done, int* err = nullptr) noexcept;
  // Clears write protection of [addr, addr+len) in the descriptor's address
  // space (waking waiters); a no-op on pages that are not protected, so it
  // also serves as the probe "is that address space still alive".
  static Errc unprotect_on(int fd, void* addr, size_t len, int* err = nullptr) noexcept;

 private:
  Fd fd_;
  bool fork_events_ = false;
  const char* fork_why_ = "not opened";
  UffdFeatures features_;
  UffdSource source_ = UffdSource::kSyscall;
  bool wp_async_ = false;
  bool blocking_ = false;
  int status_flags_ = 0;  // F_GETFL without O_NONBLOCK (blocking_ only)
};

// PAGEMAP_SCAN on /proc/self/pagemap (Linux >= 6.7), for WP_ASYNC dirty
// tracking: which pages of a range were written since they were last
// write-protected (PAGE_IS_WRITTEN: the uffd-wp bit is clear). Pages not
// mapped are never reported.
//
//   auto pm = farmem::PagemapScan::open();               // Result<PagemapScan>
//   farmem::PagemapScan::Range r[16];
//   long n = pm->written(addr, len, r, 16, /*reprotect=*/false);
class PagemapScan {
 public:
  struct Range {
    uint64_t start, end;  // [start, end) of written pages
  };
  // kUnavailable when the kernel has no PAGEMAP_SCAN.
  static Result<PagemapScan> open();
  // Fills at most max ranges of written pages of [addr, addr+len) and
  // returns their number, or -errno. reprotect: PM_SCAN_WP_MATCHING, i.e.
  // write-protect the reported pages again in the same walk (atomically per
  // page table). A result of max ranges may be partial: the caller scans
  // the rest from the end of the last one. Never allocates.
  long written(const void* addr, size_t len, Range* out, size_t max, bool reprotect) const noexcept;
  // 4 KiB pages of [addr, addr+len) that hold memory: mapped, and not the
  // kernel's shared zero page (which mincore() counts as resident); -errno
  // on error. Never allocates.
  long memory_pages(const void* addr, size_t len) const noexcept;

 private:
  Fd fd_;
};

}  // namespace farmem
