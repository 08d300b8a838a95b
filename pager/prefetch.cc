#include "pager/prefetch.h"

#include <algorithm>

namespace farmem {
namespace {

constexpr uint32_t kInitialWindow = 4;
constexpr int64_t kMaxStride = 256;  // blocks; a larger jump is not a stream
constexpr uint32_t kGenMask = (1u << 27) - 1;
static_assert(Prefetcher::kStreams == 32, "a stream tag keeps the entry index in 5 bits");

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

int Prefetcher::match_locked(int64_t b) const {
  // A stream with a direction continues at any block from its next one to
  // just past its prefetch front (blocks mapped ahead never fault), or on
  // its last block again; one seen once continues one block either way.
  int best = -1;
  bool best_strong = false;
  for (int i = 0; i < kStreams; ++i) {
    const Stream& s = streams_[i];
    if (s.last < 0) continue;
    bool strong = false;
    if (s.dir != 0) {
      const int64_t st = steps(s, b);
      const int64_t reach = std::max<int64_t>(1, steps(s, s.front) + 1);
      if (st < 0 || st > reach) continue;
      strong = true;
    } else if (b != s.last && b != s.last + 1 && b != s.last - 1) {
      continue;
    }
    if (best < 0 || (strong && !best_strong) ||
        (strong == best_strong && s.stamp > streams_[best].stamp)) {
      best = i;
      best_strong = strong;
    }
  }
  return best;
}

size_t Prefetcher::on_fault(uint32_t b, bool prefetch_hit, bool write, uint32_t* out, size_t cap,
                            Plan* plan) {
  *plan = Plan{};
  std::lock_guard<std::mutex> lk(mu_);
  // The trend detector sees every fault.
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
  const int64_t d = trend_locked();
  last_trend_ = d;

  // Sequential streams.
  ++clock_;
  const int64_t bb = b;
  const int i = match_locked(bb);
  if (i < 0) {
    // A new stream replaces the least recently used one.
    int v = 0;
    for (int k = 1; k < kStreams; ++k)
      if (streams_[k].stamp < streams_[v].stamp) v = k;
    Stream& s = streams_[v];
    const uint32_t gen = (s.gen + 1) & kGenMask;
    s = Stream{};
    s.gen = gen;
    s.last = s.front = bb;
    s.stamp = clock_;
    s.write = write;
  } else {
    Stream& s = streams_[i];
    s.stamp = clock_;
    s.write = write;
    if (s.dir == 0) {
      if (bb != s.last) {
        s.dir = bb > s.last ? 1 : -1;
        s.run = 1;
        s.last = s.front = bb;
      }
    } else if (const int64_t st = steps(s, bb); st > 0) {
      // Past the next block: over blocks prefetched for this stream.
      if (prefetch_hit || st > 1) {
        s.confirmed = true;
        s.window =
            std::min<uint32_t>(max_window_, std::max<uint32_t>(kInitialWindow, s.window * 2));
      }
      if (s.run < 1024) ++s.run;
      s.last = bb;
      if (steps(s, s.front) < 0) s.front = bb;
    } else if (prefetch_hit) {
      s.confirmed = true;
    }
    if (s.dir != 0 && (s.run >= 2 || s.confirmed)) {
      if (s.window == 0) s.window = std::min<uint32_t>(kInitialWindow, max_window_);
      size_t n = 0;
      for (uint32_t k = 1; k <= s.window && n < cap; ++k) {
        const int64_t c = bb + s.dir * static_cast<int64_t>(k);
        if (c < 0 || static_cast<uint64_t>(c) >= n_blocks_) break;
        out[n++] = static_cast<uint32_t>(c);
      }
      // The marker: half a window ahead, and past the old front (a block
      // handed out before may be mapped already and would never fault).
      const int64_t old_front = steps(s, s.front);
      const size_t mk = static_cast<size_t>(std::max<int64_t>(s.window / 2 + 1, old_front + 1));
      if (n > 0 && steps(s, out[n - 1]) > old_front) s.front = out[n - 1];
      plan->confirmed = s.confirmed;
      plan->write = s.write || s.writes_ahead;
      plan->stream = tag(i);
      // One marker at a time: while the last one is still ahead, its fault
      // is what asks for the next window.
      if (s.confirmed && mk <= n && (s.marker < 0 || steps(s, s.marker) <= 0)) {
        plan->marker = out[mk - 1];
        s.marker = out[mk - 1];
      }
      return n;
    }
  }

  // No sequential stream: the strided / majority trend.
  plan->confirmed = d != 0 && (prefetch_hit || continues);
  plan->write = write;
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

size_t Prefetcher::on_fault(uint32_t b, bool prefetch_hit, uint32_t* out, size_t cap,
                            bool* confirmed) {
  Plan plan;
  size_t n = on_fault(b, prefetch_hit, false, out, cap, &plan);
  if (confirmed) *confirmed = plan.confirmed;
  return n;
}

bool Prefetcher::on_written_ahead(uint32_t b) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t bb = b;
  for (Stream& s : streams_) {
    if (s.last < 0 || s.dir == 0 || !s.confirmed) continue;
    // Mapped ahead by s: from a window behind its latest fault (the
    // stream has moved on since) up to its front.
    const int64_t st = steps(s, bb);
    if (st >= -static_cast<int64_t>(s.window) && st <= steps(s, s.front)) {
      s.writes_ahead = true;
      return true;
    }
  }
  return false;
}

void Prefetcher::on_unused() {
  std::lock_guard<std::mutex> lk(mu_);
  if (++unused_streak_ >= 4) {
    window_ /= 2;
    for (Stream& s : streams_)
      if (s.window > kInitialWindow) s.window /= 2;
    unused_streak_ = 0;
  }
}

bool Prefetcher::still_ahead(uint32_t stream, uint32_t b) {
  if (stream == kNoStream) return false;
  std::lock_guard<std::mutex> lk(mu_);
  const Stream& s = streams_[stream & (kStreams - 1)];
  if (s.last < 0 || s.dir == 0 || s.gen != (stream >> 5)) return false;
  const int64_t st = steps(s, b);
  return st >= 1 && st <= static_cast<int64_t>(s.window);
}

size_t Prefetcher::behind(uint32_t gap, uint32_t span, uint32_t* out, size_t cap) {
  std::lock_guard<std::mutex> lk(mu_);
  int order[kStreams];
  int n = 0;
  for (int i = 0; i < kStreams; ++i) {
    const Stream& s = streams_[i];
    if (s.last >= 0 && s.dir != 0 && s.confirmed) order[n++] = i;
  }
  std::sort(order, order + n, [&](int x, int y) { return streams_[x].stamp > streams_[y].stamp; });
  size_t k = 0;
  for (int j = 0; j < n && k < cap; ++j) {
    const Stream& s = streams_[order[j]];
    for (uint32_t d = gap; d < gap + span && k < cap; ++d) {
      const int64_t b = s.last - s.dir * static_cast<int64_t>(d);
      if (b < 0 || b >= static_cast<int64_t>(n_blocks_)) break;
      out[k++] = static_cast<uint32_t>(b);
    }
  }
  return k;
}

uint32_t Prefetcher::stream_window(uint32_t b) {
  std::lock_guard<std::mutex> lk(mu_);
  const int i = match_locked(b);
  return i < 0 || streams_[i].dir == 0 ? 0 : streams_[i].window;
}

}  // namespace farmem
