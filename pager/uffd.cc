#include "pager/uffd.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace farmem {
namespace {

// Feature bits newer than Debian 12's linux-libc-dev (6.1) headers; the
// values are the kernel ABI and never change.
constexpr uint64_t kFeatureWpUnpopulated = 1ull << 13;
constexpr uint64_t kFeatureWpAsync = 1ull << 15;
constexpr uint64_t kFeatureMove = 1ull << 16;

// UFFDIO_MOVE, also newer than those headers (include/uapi/linux/userfaultfd.h):
//
//   struct uffdio_move {            ioctl _IOWR(0xAA, 0x05, struct uffdio_move)
//     u64 dst, src, len;            page-aligned
//     u64 mode;                     DONTWAKE = 1, ALLOW_SRC_HOLES = 2
//     s64 move;                     out: bytes moved, or -errno
//   };
struct UffdioMove {
  uint64_t dst;
  uint64_t src;
  uint64_t len;
  uint64_t mode;
  int64_t move;
};
constexpr unsigned kIoctlMoveNr = 0x05;
constexpr unsigned long kIoctlMove = _IOWR(UFFDIO, kIoctlMoveNr, UffdioMove);
constexpr uint64_t kMoveModeDontWake = 1;

int open_raw(UffdSource* source, int* syscall_errno, int* dev_errno) {
  // Without UFFD_USER_MODE_ONLY on purpose: a syscall such as read() into a
  // far buffer must be able to fault on it too.
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd >= 0) {
    *source = UffdSource::kSyscall;
    return fd;
  }
  *syscall_errno = errno;
  int dev = ::open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (dev < 0) {
    *dev_errno = errno;
    return -1;
  }
  fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
  *dev_errno = fd < 0 ? errno : 0;
  ::close(dev);
  if (fd >= 0) *source = UffdSource::kDevice;
  return fd;
}

}  // namespace

Status uffd_permission_error(int syscall_errno, int dev_errno) {
  return make_error(Errc::kPermissionDenied,
                    "userfaultfd is not permitted for this process (userfaultfd(2): %s; "
                    "/dev/userfaultfd: %s). Fix one of: run with CAP_SYS_PTRACE, set "
                    "`sysctl vm.unprivileged_userfaultfd=1`, or give this user read-write "
                    "access to /dev/userfaultfd",
                    strerror(syscall_errno), dev_errno ? strerror(dev_errno) : "no error");
}

namespace {

UffdFeatures decode(uint64_t raw) {
  UffdFeatures f;
  f.raw = raw;
  f.missing_wp = (raw & UFFD_FEATURE_PAGEFAULT_FLAG_WP) != 0;
  f.wp_unpopulated = (raw & kFeatureWpUnpopulated) != 0;
  f.wp_async = (raw & kFeatureWpAsync) != 0;
  f.move = (raw & kFeatureMove) != 0;
  f.minor_shmem = (raw & UFFD_FEATURE_MINOR_SHMEM) != 0;
  f.exact_address = (raw & UFFD_FEATURE_EXACT_ADDRESS) != 0;
  f.thread_id = (raw & UFFD_FEATURE_THREAD_ID) != 0;
  f.event_fork = (raw & UFFD_FEATURE_EVENT_FORK) != 0;
  return f;
}

}  // namespace

std::string UffdFeatures::to_string() const {
  std::string s = missing_wp ? "missing+wp" : "missing(no wp)";
  if (wp_unpopulated) s += " wp_unpopulated";
  if (wp_async) s += " wp_async";
  if (move) s += " move";
  if (minor_shmem) s += " minor_shmem";
  if (exact_address) s += " exact_address";
  if (thread_id) s += " thread_id";
  if (event_fork) s += " event_fork";
  return s;
}

Result<Uffd> Uffd::open(bool wp_async) {
  UffdSource source = UffdSource::kSyscall;
  int se = 0, de = 0;
  // Probe: UFFDIO_API with features 0 reports every feature the kernel has;
  // a descriptor takes UFFDIO_API once, so the real one is opened after.
  Fd probe(open_raw(&source, &se, &de));
  if (!probe.valid()) return uffd_permission_error(se, de);
  uffdio_api api{};
  api.api = UFFD_API;
  if (ioctl(probe.get(), UFFDIO_API, &api) != 0) {
    return make_error(Errc::kIo, "UFFDIO_API failed: %s; this kernel's userfaultfd is unusable",
                      strerror(errno));
  }
  UffdFeatures f = decode(api.features);
  if (!f.missing_wp) {
    return make_error(Errc::kUnavailable,
                      "this kernel has no userfaultfd write-protect support for anonymous "
                      "memory (UFFD_FEATURE_PAGEFAULT_FLAG_WP); farmem needs Linux >= 5.7");
  }
  Uffd u;
  u.fd_ = Fd(open_raw(&u.source_, &se, &de));
  if (!u.fd_.valid()) return uffd_permission_error(se, de);
  uffdio_api want{};
  want.api = UFFD_API;
  want.features = UFFD_FEATURE_PAGEFAULT_FLAG_WP |
                  (f.exact_address ? UFFD_FEATURE_EXACT_ADDRESS : 0) |
                  (f.thread_id ? UFFD_FEATURE_THREAD_ID : 0) | (f.move ? kFeatureMove : 0) |
                  (wp_async && f.wp_async && f.move ? kFeatureWpAsync : 0);
  u.wp_async_ = wp_async && f.wp_async && f.move;  // demotion needs UFFDIO_MOVE (victim_move.h)
  if (f.event_fork) {
    // Fork snapshots (invariant 8). The kernel refuses the bit with EPERM
    // without CAP_SYS_PTRACE; a refused UFFDIO_API leaves the descriptor
    // unusable, so the probe descriptor tries it first.
    uffdio_api fork_api{};
    fork_api.api = UFFD_API;
    fork_api.features = UFFD_FEATURE_EVENT_FORK;
    UffdSource s2 = UffdSource::kSyscall;
    Fd probe2(open_raw(&s2, &se, &de));
    if (probe2.valid() && ioctl(probe2.get(), UFFDIO_API, &fork_api) == 0) {
      want.features |= UFFD_FEATURE_EVENT_FORK;
      u.fork_events_ = true;
      u.fork_why_ = "";
    } else {
      u.fork_why_ = errno == EPERM ? "UFFD_FEATURE_EVENT_FORK needs CAP_SYS_PTRACE"
                                   : "UFFD_FEATURE_EVENT_FORK was refused by the kernel";
    }
  } else {
    u.fork_why_ = "this kernel has no UFFD_FEATURE_EVENT_FORK";
  }
  if (ioctl(u.fd_.get(), UFFDIO_API, &want) != 0) {
    return make_error(Errc::kIo, "UFFDIO_API with features 0x%llx failed: %s",
                      static_cast<unsigned long long>(want.features), strerror(errno));
  }
  u.features_ = f;
  return u;
}

std::string Uffd::unavailable_reason() {
  auto u = open();
  if (!u.ok()) return u.status().to_string();
  return {};
}

Status Uffd::register_range(void* addr, size_t len) {
  uffdio_register reg{};
  reg.range.start = reinterpret_cast<uintptr_t>(addr);
  reg.range.len = len;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;
  if (ioctl(fd_.get(), UFFDIO_REGISTER, &reg) != 0) {
    return make_error(Errc::kIo,
                      "UFFDIO_REGISTER (MISSING|WP) of %zu bytes at %p failed: %s; the range "
                      "must be private anonymous memory",
                      len, addr, strerror(errno));
  }
  constexpr uint64_t kNeed =
      (1ull << _UFFDIO_COPY) | (1ull << _UFFDIO_WRITEPROTECT) | (1ull << _UFFDIO_WAKE);
  if ((reg.ioctls & kNeed) != kNeed) {
    return make_error(Errc::kUnavailable,
                      "UFFDIO_REGISTER granted ioctls 0x%llx without COPY/WRITEPROTECT/WAKE",
                      static_cast<unsigned long long>(reg.ioctls));
  }
  return ok_status();
}

Status Uffd::register_wp_only(void* addr, size_t len) {
  uffdio_register reg{};
  reg.range.start = reinterpret_cast<uintptr_t>(addr);
  reg.range.len = len;
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  if (ioctl(fd_.get(), UFFDIO_REGISTER, &reg) != 0) {
    return make_error(Errc::kIo,
                      "UFFDIO_REGISTER (WP) of %zu bytes at %p failed: %s; the range must be "
                      "private anonymous memory",
                      len, addr, strerror(errno));
  }
  if ((reg.ioctls & (1ull << kIoctlMoveNr)) == 0) {
    return make_error(Errc::kUnavailable,
                      "UFFDIO_REGISTER granted ioctls 0x%llx without UFFDIO_MOVE; this kernel "
                      "cannot move pages (set FARMEM_UFFD_MOVE=off)",
                      static_cast<unsigned long long>(reg.ioctls));
  }
  return ok_status();
}

Status Uffd::unregister_range(void* addr, size_t len) {
  uffdio_range r{};
  r.start = reinterpret_cast<uintptr_t>(addr);
  r.len = len;
  if (ioctl(fd_.get(), UFFDIO_UNREGISTER, &r) != 0) {
    return make_error(Errc::kIo, "UFFDIO_UNREGISTER of %zu bytes at %p failed: %s", len, addr,
                      strerror(errno));
  }
  return ok_status();
}

Errc Uffd::copy(void* dst, const void* src, size_t len, bool write_protect, int* err) noexcept {
  for (;;) {
    uffdio_copy c{};
    c.dst = reinterpret_cast<uintptr_t>(dst);
    c.src = reinterpret_cast<uintptr_t>(src);
    c.len = len;
    c.mode = write_protect ? UFFDIO_COPY_MODE_WP : 0;
    if (ioctl(fd_.get(), UFFDIO_COPY, &c) == 0) return Errc::kOk;
    int e = errno;
    // EAGAIN: the address space changed under us (or a partial copy);
    // the remaining bytes are retried.
    if (e == EAGAIN) {
      if (c.copy > 0) {
        size_t done = static_cast<size_t>(c.copy);
        dst = static_cast<char*>(dst) + done;
        src = static_cast<const char*>(src) + done;
        len -= done;
      }
      continue;
    }
    if (err) *err = e;
    return e == EEXIST ? Errc::kInvalidArgument : Errc::kIo;
  }
}

Errc Uffd::write_protect(void* addr, size_t len, bool protect, int* err) noexcept {
  for (;;) {
    uffdio_writeprotect w{};
    w.range.start = reinterpret_cast<uintptr_t>(addr);
    w.range.len = len;
    w.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
    if (ioctl(fd_.get(), UFFDIO_WRITEPROTECT, &w) == 0) return Errc::kOk;
    if (errno == EAGAIN) continue;
    if (err) *err = errno;
    return Errc::kIo;
  }
}

Errc Uffd::zero_protected(void* dst, size_t len, int* err) noexcept {
  char* at = static_cast<char*>(dst);
  size_t left = len;
  while (left > 0) {
    uffdio_zeropage z{};
    z.range.start = reinterpret_cast<uintptr_t>(at);
    z.range.len = left;
    z.mode = UFFDIO_ZEROPAGE_MODE_DONTWAKE;
    if (ioctl(fd_.get(), UFFDIO_ZEROPAGE, &z) == 0) break;
    const int e = errno;
    if (e == EAGAIN) {  // the address space changed, or a partial fill: retry the rest
      if (z.zeropage > 0) {
        at += z.zeropage;
        left -= static_cast<size_t>(z.zeropage);
      }
      continue;
    }
    if (err) *err = e;
    return e == EEXIST ? Errc::kInvalidArgument : Errc::kIo;
  }
  if (Errc e = write_protect(dst, len, true, err); e != Errc::kOk) return e;
  return wake(dst, len);
}

namespace {
// How many leading 4 KiB pages of [src, src+len) are gone from src and
// present at dst (mincore: resident or not), i.e. were moved.
size_t moved_pages_prefix(char* dst, char* src, size_t len) noexcept {
  constexpr size_t kPg = 4096;
  size_t n = 0;
  for (; n < len; n += kPg) {
    unsigned char s = 0, d = 0;
    if (mincore(src + n, kPg, &s) != 0 || mincore(dst + n, kPg, &d) != 0) break;
    if ((s & 1) != 0 || (d & 1) == 0) break;
  }
  return n;
}
}  // namespace

Errc Uffd::move(void* dst, void* src, size_t len, bool wake, int* err) noexcept {
  char* const dst0 = static_cast<char*>(dst);
  char* const src0 = static_cast<char*>(src);
  size_t done = 0;
  for (;;) {
    UffdioMove m{};
    m.dst = reinterpret_cast<uintptr_t>(dst0 + done);
    m.src = reinterpret_cast<uintptr_t>(src0 + done);
    m.len = len - done;
    m.mode = wake ? 0 : kMoveModeDontWake;
    if (ioctl(fd_.get(), kIoctlMove, &m) == 0) return Errc::kOk;
    int e = errno;
    if (m.move > 0) done += static_cast<size_t>(m.move);
    // EAGAIN: a page was under migration or the move stopped part way;
    // the rest is retried so that a block is never left split.
    if (e == EAGAIN && done < len) continue;
    if (e == EAGAIN) return Errc::kOk;
    // Seen on Linux 6.18 under load (WP_ASYNC demotions, a 4 KiB block into
    // a slot just dropped with MADV_DONTNEED): EEXIST with move = -EEXIST,
    // yet the page had left src and was mapped at dst. Taking that for
    // "nothing moved" left the pager's block Present and unmapped: its
    // faults were woken forever and the next demotion's snapshot waited on
    // itself (hang). Pages gone from src and present at dst were moved: the
    // callers own both ranges, nothing else moves them.
    if (e == EEXIST) {
      const size_t extra = moved_pages_prefix(dst0 + done, src0 + done, len - done);
      if (extra > 0) {
        if (wake) (void)this->wake(dst0 + done, extra);
        done += extra;
        if (done == len) return Errc::kOk;
        continue;
      }
    }
    if (err) *err = e;
    // A block moved in part (a later page was pinned or shared): the moved
    // pages go back so that the caller sees all or nothing. They are ours
    // and exclusive, so moving them back cannot hit EBUSY.
    if (done > 0) {
      int e2 = 0;
      if (move(src0, dst0, done, /*wake=*/false, &e2) != Errc::kOk) {
        if (err) *err = e2;
        return Errc::kInternal;
      }
    }
    return Errc::kIo;
  }
}

namespace {
Errc child_errc(int e) {
  if (e == EAGAIN) return Errc::kUnavailable;
  if (e == ESRCH) return Errc::kNotFound;
  if (e == EEXIST) return Errc::kInvalidArgument;
  return Errc::kIo;
}
}  // namespace

Errc Uffd::copy_on(int fd, void* dst, const void* src, size_t len, bool write_protect, size_t* done,
                   int* err) noexcept {
  *done = 0;
  uffdio_copy c{};
  c.dst = reinterpret_cast<uintptr_t>(dst);
  c.src = reinterpret_cast<uintptr_t>(src);
  c.len = len;
  c.mode = write_protect ? UFFDIO_COPY_MODE_WP : 0;
  if (ioctl(fd, UFFDIO_COPY, &c) == 0) {
    *done = len;
    return Errc::kOk;
  }
  int e = errno;
  if (c.copy > 0) *done = static_cast<size_t>(c.copy);
  if (err) *err = e;
  return child_errc(e);
}

Errc Uffd::zeropage_on(int fd, void* dst, size_t len, size_t* done, int* err) noexcept {
  *done = 0;
  uffdio_zeropage z{};
  z.range.start = reinterpret_cast<uintptr_t>(dst);
  z.range.len = len;
  if (ioctl(fd, UFFDIO_ZEROPAGE, &z) == 0) {
    *done = len;
    return Errc::kOk;
  }
  int e = errno;
  if (z.zeropage > 0) *done = static_cast<size_t>(z.zeropage);
  if (err) *err = e;
  return child_errc(e);
}

Errc Uffd::unprotect_on(int fd, void* addr, size_t len, int* err) noexcept {
  uffdio_writeprotect w{};
  w.range.start = reinterpret_cast<uintptr_t>(addr);
  w.range.len = len;
  w.mode = 0;
  if (ioctl(fd, UFFDIO_WRITEPROTECT, &w) == 0) return Errc::kOk;
  int e = errno;
  if (err) *err = e;
  return child_errc(e);
}

namespace {
// PAGEMAP_SCAN, newer than Debian 12's headers (include/uapi/linux/fs.h,
// Documentation/admin-guide/mm/pagemap.rst):
//
//   struct pm_scan_arg {              ioctl _IOWR('f', 16, struct pm_scan_arg)
//     u64 size, flags;                sizeof, PM_SCAN_WP_MATCHING 1 | CHECK_WPASYNC 2
//     u64 start, end, walk_end;       range; out: where the walk stopped
//     u64 vec, vec_len;               struct page_region[] out
//     u64 max_pages;                  0 = no limit
//     u64 category_inverted, category_mask, category_anyof_mask, return_mask;
//   };
//   struct page_region { u64 start, end, categories; };
struct PmScanArg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
  uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
struct PageRegion {
  uint64_t start, end, categories;
};
constexpr unsigned long kPagemapScan = _IOWR('f', 16, PmScanArg);
constexpr uint64_t kPmScanWpMatching = 1;
constexpr uint64_t kPmScanCheckWpAsync = 2;
constexpr uint64_t kPageIsWritten = 1ull << 1;
constexpr uint64_t kPageIsPresent = 1ull << 3;
constexpr uint64_t kPageIsPfnZero = 1ull << 5;
}  // namespace

Result<PagemapScan> PagemapScan::open() {
  PagemapScan p;
  p.fd_ = Fd(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  if (!p.fd_.valid()) {
    return make_error(Errc::kUnavailable, "open /proc/self/pagemap: %s", strerror(errno));
  }
  // Probe: an empty range is accepted by every kernel that has the ioctl.
  PmScanArg a{};
  a.size = sizeof a;
  if (ioctl(p.fd_.get(), kPagemapScan, &a) < 0) {
    return make_error(Errc::kUnavailable,
                      "PAGEMAP_SCAN on /proc/self/pagemap failed: %s; it needs Linux >= 6.7",
                      strerror(errno));
  }
  return p;
}

long PagemapScan::written(const void* addr, size_t len, Range* out, size_t max,
                          bool reprotect) const noexcept {
  PageRegion v[32];
  size_t n = 0;
  uint64_t start = reinterpret_cast<uintptr_t>(addr);
  const uint64_t end = start + len;
  while (start < end && n < max) {
    PmScanArg a{};
    a.size = sizeof a;
    a.flags = kPmScanCheckWpAsync | (reprotect ? kPmScanWpMatching : 0);
    a.start = start;
    a.end = end;
    a.vec = reinterpret_cast<uintptr_t>(v);
    a.vec_len = (max - n) < 32 ? (max - n) : 32;
    a.category_mask = kPageIsWritten;
    a.return_mask = kPageIsWritten;
    long r = ioctl(fd_.get(), kPagemapScan, &a);
    if (r < 0) return -errno;
    for (long i = 0; i < r; ++i) out[n++] = Range{v[i].start, v[i].end};
    if (a.walk_end <= start || a.walk_end >= end) break;
    start = a.walk_end;
  }
  return static_cast<long>(n);
}

long PagemapScan::memory_pages(const void* addr, size_t len) const noexcept {
  PageRegion v[32];
  long pages = 0;
  uint64_t start = reinterpret_cast<uintptr_t>(addr);
  const uint64_t end = start + len;
  while (start < end) {
    PmScanArg a{};
    a.size = sizeof a;
    a.start = start;
    a.end = end;
    a.vec = reinterpret_cast<uintptr_t>(v);
    a.vec_len = 32;
    // Present and NOT the zero page.
    a.category_mask = kPageIsPresent | kPageIsPfnZero;
    a.category_inverted = kPageIsPfnZero;
    a.return_mask = kPageIsPresent;
    long r = ioctl(fd_.get(), kPagemapScan, &a);
    if (r < 0) return -errno;
    for (long i = 0; i < r; ++i) pages += static_cast<long>((v[i].end - v[i].start) / 4096);
    if (a.walk_end <= start || a.walk_end >= end) break;
    start = a.walk_end;
  }
  return pages;
}

Errc Uffd::wake(void* addr, size_t len) noexcept {
  uffdio_range r{};
  r.start = reinterpret_cast<uintptr_t>(addr);
  r.len = len;
  return ioctl(fd_.get(), UFFDIO_WAKE, &r) == 0 ? Errc::kOk : Errc::kIo;
}

bool Uffd::enable_blocking_reads() noexcept {
  const int fd = fd_.get();
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) return false;
  // Nothing is registered yet, so nothing can be pending: a kernel that
  // honours RWF_NOWAIT answers EAGAIN; one without read_iter on a
  // userfaultfd answers EOPNOTSUPP. Any other answer, a message included,
  // is not trusted either. (Linux 6.18 here: EAGAIN.)
  uffd_msg m;
  iovec iov{&m, sizeof m};
  const ssize_t r = preadv2(fd, &iov, 1, -1, RWF_NOWAIT);
  if (r < 0 && errno == EAGAIN) {
    blocking_ = true;
    status_flags_ = fl & ~O_NONBLOCK;
    return true;
  }
  (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  return false;
}

void Uffd::set_nonblocking(bool on) noexcept {
  if (blocking_) (void)fcntl(fd_.get(), F_SETFL, status_flags_ | (on ? O_NONBLOCK : 0));
}

ssize_t Uffd::read_nowait(void* buf, size_t len) noexcept {
  if (!blocking_) return read(fd_.get(), buf, len);
  iovec iov{buf, len};
  return preadv2(fd_.get(), &iov, 1, -1, RWF_NOWAIT);
}

}  // namespace farmem
