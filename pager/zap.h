// Dropping many scattered ranges of this process's memory under one TLB
// flush: madvise(MADV_DONTNEED) of each range, batched into one
// process_madvise(2) call on the process itself where the kernel allows it.
//
//   ZapBatch z;
//   z.add(a, 4096);
//   z.add(b, 8192);
//   if (int err = z.flush(); err != 0) fatal("...: %s", strerror(err));
//
// Why: what a demotion costs here is its TLB flush, and a flush is a
// cross-CPU interrupt whenever another thread of the process runs on the
// other CPU (the program itself, while the evictor demotes). madvise()
// flushes once per call, so scattered blocks (a random-access heap) paid
// one flush each. process_madvise() of the calling process (PIDFD_SELF,
// Linux >= 6.13; MADV_DONTNEED on one's own memory since 6.13 too) gathers
// every range of one call under one flush (Linux >= 6.16). Measured on
// this 2-vCPU guest (Linux 6.18) by bench/pager_bench.cc BM_ZapScattered
// (pages at random addresses in 256 MiB, median of 64 interleaved rounds),
// us per page, a madvise() each -> one ZapBatch:
//   another thread of the process spinning on the other CPU:
//     16 pages 11.9 -> 1.25, 64 pages 12.0 -> 0.67, 256 pages 10.0 -> 0.52
//   nobody else running: 64 pages 1.31 -> 0.48
// Where process_madvise() refuses (an older kernel: EINVAL, ENOSYS,
// EBADF, EPERM) the batch falls back to one madvise() per range, once and
// for the life of the process.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace farmem {

class ZapBatch {
 public:
  static constexpr size_t kMaxRanges = 512;  // <= UIO_MAXIOV (1024)

  // Adds [addr, addr + len); flushes first when the batch is full (and
  // returns that flush's error, 0 when none). Adjacent ranges merge.
  int add(void* addr, size_t len);
  // Drops every range added since the last flush; 0 or an errno of the
  // madvise() that failed (the ranges are then in an unknown state).
  int flush();
  size_t pending() const { return n_; }
  // process_madvise() calls made, and madvise() calls made (fallback).
  uint64_t batched_calls() const { return batched_; }
  uint64_t single_calls() const { return single_; }
  // Whether this kernel takes process_madvise(MADV_DONTNEED) on the
  // process itself (probed once, at the first flush of any batch).
  static bool batching_available();
  // Tests: false makes every later flush take the fallback; true probes again.
  static void set_batching_for_testing(bool on);

 private:
  iovec iov_[kMaxRanges];
  size_t n_ = 0;
  uint64_t batched_ = 0, single_ = 0;
};

}  // namespace farmem
