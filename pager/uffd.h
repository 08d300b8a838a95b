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
#pragma once

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
  // process is not allowed to, the error names the three fixes.
  static Result<Uffd> open();
  // Cheap check for tests: empty string when userfaultfd with MISSING+WP is
  // usable here, else the reason.
  static std::string unavailable_reason();

  Uffd() = default;
  Uffd(Uffd&&) = default;
  Uffd& operator=(Uffd&&) = default;

  int fd() const { return fd_.get(); }
  const UffdFeatures& features() const { return features_; }
  UffdSource source() const { return source_; }

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
  // UFFDIO_MOVE (features().move, Linux >= 6.8): moves the pages of
  // [src, src+len) to dst without copying; src becomes unmapped, dst is
  // mapped writable and not write-protected. Wakes the waiters on dst unless
  // wake is false. Errors (errno in *err): EEXIST dst is mapped; EBUSY a
  // source page is shared (fork, KSM) or pinned (DMA); ENOENT a source page
  // is missing; EINVAL the ranges do not qualify. Callers fall back to
  // copy() on kIo: a range that moved in part is moved back first, so kIo
  // means nothing moved. kInternal: that undo failed (the caller must stop).
  Errc move(void* dst, void* src, size_t len, bool wake, int* err = nullptr) noexcept;

 private:
  Fd fd_;
  UffdFeatures features_;
  UffdSource source_ = UffdSource::kSyscall;
};

}  // namespace farmem
