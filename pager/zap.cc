#include "pager/zap.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace farmem {
namespace {

#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif
// include/uapi/linux/pidfd.h: the calling thread (its process's mm).
constexpr int kPidfdSelfThread = -10000;

// 0: not probed yet, 1: process_madvise() works, 2: it does not.
std::atomic<int> g_mode{0};

int zap_each(const iovec* iov, size_t n, uint64_t* calls) {
  for (size_t i = 0; i < n; ++i) {
    ++*calls;
    if (madvise(iov[i].iov_base, iov[i].iov_len, MADV_DONTNEED) != 0) return errno;
  }
  return 0;
}

}  // namespace

bool ZapBatch::batching_available() {
  int m = g_mode.load(std::memory_order_relaxed);
  if (m == 0) {
    // An empty vector: the kernel checks the pidfd and the advice, and
    // advises nothing.
    iovec none{nullptr, 0};
    long r = syscall(SYS_process_madvise, kPidfdSelfThread, &none, 1, MADV_DONTNEED, 0);
    m = r == 0 ? 1 : 2;
    g_mode.store(m, std::memory_order_relaxed);
  }
  return m == 1;
}

void ZapBatch::set_batching_for_testing(bool on) {
  g_mode.store(on ? 0 : 2, std::memory_order_relaxed);
}

int ZapBatch::add(void* addr, size_t len) {
  if (n_ > 0) {
    iovec& last = iov_[n_ - 1];
    if (static_cast<char*>(last.iov_base) + last.iov_len == addr) {
      last.iov_len += len;
      return 0;
    }
  }
  int err = 0;
  if (n_ == kMaxRanges) err = flush();
  iov_[n_++] = iovec{addr, len};
  return err;
}

int ZapBatch::flush() {
  const size_t n = n_;
  n_ = 0;
  if (n == 0) return 0;
  if (n == 1 || !batching_available()) return zap_each(iov_, n, &single_);
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += iov_[i].iov_len;
  ++batched_;
  long r = syscall(SYS_process_madvise, kPidfdSelfThread, iov_, n, MADV_DONTNEED, 0);
  if (r >= 0 && static_cast<size_t>(r) == total) return 0;
  if (r < 0) {
    const int e = errno;
    const bool refused = e == EINVAL || e == ENOSYS || e == EBADF || e == EPERM;
    if (refused) g_mode.store(2, std::memory_order_relaxed);
    if (!refused && e != EAGAIN && e != EINTR) return e;
  }
  // Refused, or a partial advice: the ranges not yet done, one by one
  // (MADV_DONTNEED twice on the same range is harmless).
  size_t done = r > 0 ? static_cast<size_t>(r) : 0, i = 0;
  while (i < n && done >= iov_[i].iov_len) done -= iov_[i++].iov_len;
  if (i < n && done > 0) {
    iov_[i].iov_base = static_cast<char*>(iov_[i].iov_base) + done;
    iov_[i].iov_len -= done;
  }
  return zap_each(iov_ + i, n - i, &single_);
}

}  // namespace farmem
