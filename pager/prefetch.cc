#include "pager/prefetch.h"

#include <algorithm>

namespace farmem {
namespace {

constexpr uint32_t kInitialWindow = 4;
constexpr int64_t kMaxStride = 256;  // blocks; a larger jump is not a stream

}  // namespace

Prefetcher::Prefetcher(uint32_t max_window, uint64_t n_blocks)
    : max_window_(max_window), n_blocks_(n_blocks) {}

bool Prefetcher::majority(const int64_t* d, int n, int64_t* delta) {
  int64_t cand = 0;
  int votes = 0;
  for (int i = 0; i < n; ++i) {
    if (votes == 0) {
      cand = d[i];
      votes = 1;
    } else {
      votes += d[i] == cand ? 1 : -1;
    }
  }
  int c = 0;
  for (int i = 0; i < n; ++i) c += d[i] == cand ? 1 : 0;
  if (2 * c > n) {
    *delta = cand;
    return true;
  }
  return false;
}

int64_t Prefetcher::trend_locked() const {
  if (count_ < 2) return 0;
  // Stream: the last two deltas agree.
  int64_t d1 = deltas_[(pos_ + kHistory - 1) % kHistory];
  int64_t d2 = deltas_[(pos_ + kHistory - 2) % kHistory];
  if (d1 == d2 && d1 != 0 && d1 >= -kMaxStride && d1 <= kMaxStride) return d1;
  // Majority trend over a growing window of recent deltas (Leap): a
  // short window first, so that a new trend is seen quickly.
  int64_t recent[kHistory];
  for (int w = 8; w <= kHistory; w *= 2) {
    if (w > count_) break;
    for (int i = 0; i < w; ++i) recent[i] = deltas_[(pos_ + kHistory - 1 - i) % kHistory];
    int64_t d = 0;
    if (majority(recent, w, &d) && d != 0 && d >= -kMaxStride && d <= kMaxStride) return d;
  }
  return 0;
}

size_t Prefetcher::on_fault(uint32_t b, bool prefetch_hit, uint32_t* out, size_t cap,
                            bool* confirmed) {
  std::lock_guard<std::mutex> lk(mu_);
  bool continues = false;
  if (last_block_ >= 0) {
    int64_t raw = static_cast<int64_t>(b) - last_block_;
    // A jump over blocks that were prefetched on the current trend (and
    // mapped, so they never faulted) is that trend, not noise.
    if (last_trend_ != 0 && raw != 0 && raw % last_trend_ == 0 && raw / last_trend_ > 1 &&
        raw / last_trend_ <= static_cast<int64_t>(window_) + 1) {
      raw = last_trend_;
      continues = true;
    }
    deltas_[pos_] = raw;
    pos_ = (pos_ + 1) % kHistory;
    if (count_ < kHistory) ++count_;
  }
  last_block_ = b;
  if (prefetch_hit) {
    unused_streak_ = 0;
    window_ = std::min<uint32_t>(max_window_, std::max<uint32_t>(kInitialWindow, window_ * 2));
  }
  int64_t d = trend_locked();
  last_trend_ = d;
  if (confirmed) *confirmed = d != 0 && (prefetch_hit || continues);
  if (d == 0) {
    window_ /= 2;
    return 0;
  }
  if (window_ == 0) window_ = std::min<uint32_t>(kInitialWindow, max_window_);
  size_t n = 0;
  for (uint32_t k = 1; k <= window_ && n < cap; ++k) {
    int64_t c = static_cast<int64_t>(b) + d * k;
    if (c < 0 || static_cast<uint64_t>(c) >= n_blocks_) break;
    out[n++] = static_cast<uint32_t>(c);
  }
  return n;
}

void Prefetcher::on_unused() {
  std::lock_guard<std::mutex> lk(mu_);
  if (++unused_streak_ >= 4) {
    window_ /= 2;
    unused_streak_ = 0;
  }
}

}  // namespace farmem
