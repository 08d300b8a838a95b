// Pager<B> set-up and tear-down: create(), init() (mappings, the uffd and
// its modes, budget and watermarks, victim cache and prefetch limits, remote
// map, queues and threads, in that order), ~Pager() (the reverse), and
// stats(). Part of Pager<B> (pager/pager_core.h); include pager/pager.h.
#pragma once

#include "pager/pager_core.h"

namespace farmem {

template <TransportBackend B>
Result<std::unique_ptr<Pager<B>>> Pager<B>::create(const PagerConfig& config, B* transport,
                                                   SlabSource* slabs) {
  FARMEM_RETURN_IF_ERROR(config.validate());
  if (!transport || !slabs) {
    return make_error(Errc::kInvalidArgument, "Pager::create: transport and slab source needed");
  }
  std::unique_ptr<Pager> p(new Pager(config, transport, slabs));
  FARMEM_RETURN_IF_ERROR(p->init());
  return p;
}

template <TransportBackend B>
Status Pager<B>::init() {
  if (cfg_.handler_threads == 0) cfg_.handler_threads = default_handler_threads(cfg_.pin_handlers);
  // Tests only: FARMEM_TEST_WP_ASYNC (auto / on / off) overrides
  // config.wp_async so that the whole pager suite runs in either mode
  // (applications set it through FARMEM_WP_ASYNC and PagerConfig::from_env).
  if (const char* v = getenv("FARMEM_TEST_WP_ASYNC")) {
    auto m = parse_wp_async(v);
    if (!m.ok()) return m.status().with_context("FARMEM_TEST_WP_ASYNC");
    cfg_.wp_async = *m;
  }
  // WP_ASYNC is a property of the whole descriptor, chosen at UFFDIO_API
  // time: it is asked for only when everything else it needs is here
  // (PAGEMAP_SCAN now, UFFDIO_MOVE checked by Uffd::open), because a
  // descriptor with it and a pager without it would lose writes.
  bool want_async = false;
  if (cfg_.wp_async != WpAsyncMode::kOff) {
    auto pm = PagemapScan::open();
    if (pm.ok()) {
      pagemap_ = std::move(*pm);
      want_async = true;
    } else if (cfg_.wp_async == WpAsyncMode::kOn) {
      return pm.status().with_context("FARMEM_WP_ASYNC=on (set auto or off)");
    }
  }
  auto u = Uffd::open(want_async);
  if (!u.ok()) return u.status();
  uffd_ = std::move(*u);
  // Before any range is registered: the probe reads the empty descriptor.
  if (cfg_.blocking_read) blocking_read_ = uffd_.enable_blocking_reads();

  n_blocks_ = cfg_.region_size / block_;
  FARMEM_RETURN_IF_ERROR(pt_.init(n_blocks_));
  FARMEM_RETURN_IF_ERROR(region_.map(cfg_.region_size, block_, true, "far-memory region"));
  // No THP: the pager installs blocks itself, and khugepaged must not merge them.
  (void)madvise(region_.ptr, cfg_.region_size, MADV_NOHUGEPAGE);
  FARMEM_RETURN_IF_ERROR(uffd_.register_range(region_.ptr, cfg_.region_size));

  budget_blocks_ = static_cast<int64_t>(cfg_.local_budget / block_);
  // A refault within reach (evictor.h "Access tracking"): the block left
  // less than a budget's worth of departures ago.
  refault_reach_ =
      static_cast<uint32_t>(std::min<int64_t>(PageTable::kLeaveMask / 2, budget_blocks_));
  hot_cap_ = budget_blocks_ * 3 / 4;
  high_blocks_ = static_cast<int64_t>(cfg_.high_watermark * static_cast<double>(budget_blocks_));
  low_blocks_ = static_cast<int64_t>(cfg_.low_watermark * static_cast<double>(budget_blocks_));
  if (high_blocks_ >= budget_blocks_) high_blocks_ = budget_blocks_ - 1;
  evict_trigger_.store(high_blocks_, std::memory_order_relaxed);
  if (low_blocks_ >= high_blocks_) low_blocks_ = high_blocks_ - 1;
  // Prefetch may fill the budget but for a small reserve that demand
  // faults keep (so that none waits for the evictor because of a
  // prefetch): half the gap to the high watermark, at most half a write-back
  // batch. It must lie above the evictor's trigger (evictor_main(): two
  // batches of headroom when faults do not wait), or a scan that keeps the
  // budget full never gets room to prefetch into: the larger reserve it had
  // (half the watermark gap, 369 blocks at a 96 MiB budget) let 4.9k of 120k
  // blocks of the eval scan be prefetched.
  prefetch_limit_ =
      budget_blocks_ - std::max<int64_t>(4, std::min<int64_t>((budget_blocks_ - high_blocks_) / 2,
                                                              cfg_.writeback_batch / 2));
  // A scan's window: wide enough that a confirmed stream's fault (one per
  // window) and its hand-offs are paid over many blocks, narrow enough that
  // a window is a small share of the budget ("Prefetch windows" in prefetch_path.h).
  cfg_.prefetch_max_window = static_cast<uint32_t>(
      std::min<int64_t>(cfg_.prefetch_max_window, std::max<int64_t>(32, budget_blocks_ / 16)));
  // The program is at or past its stream's latest fault (what the stream
  // mapped ahead takes no fault); blocks are taken from a little behind it.
  behind_gap_ = std::min<uint32_t>(64, cfg_.prefetch_max_window);
  victim_target_ =
      static_cast<uint64_t>(cfg_.victim_fraction * static_cast<double>(budget_blocks_));
  // Start small: a working set that fits (or nearly) never pays for a large
  // victim cache; thrashing grows it within a few epochs. Not below a
  // write-back batch plus, with prefetch, one prefetch window while blocks
  // are read ahead: they wait in the victim cache, and a smaller one drops
  // them unused. Without read-ahead, at a set that nearly fits, not below a
  // write-back batch (victim_floor_, evictor.h "Adaptive victim cache").
  victim_min_ = std::min<uint64_t>(victim_target_,
                                   std::max<uint64_t>(16, cfg_.writeback_batch) +
                                       (cfg_.prefetch ? uint64_t{cfg_.prefetch_max_window} : 0));
  victim_floor_ = std::min<uint64_t>(victim_min_, std::max<uint64_t>(16, cfg_.writeback_batch));
  victim_cur_.store(victim_min_, std::memory_order_relaxed);
  pin_limit_blocks_ = std::max<int64_t>(0, low_blocks_ - std::max<int64_t>(budget_blocks_ / 4, 16));
  uint64_t slots = victim_target_ + 2ull * cfg_.writeback_batch +
                   (cfg_.prefetch ? uint64_t{cfg_.handler_threads} * cfg_.prefetch_max_window : 0) +
                   16;
  if (slots > static_cast<uint64_t>(budget_blocks_)) slots = static_cast<uint64_t>(budget_blocks_);
  if (slots > kMaxSlots) slots = kMaxSlots;
  n_slots_ = static_cast<uint32_t>(slots);
  FARMEM_RETURN_IF_ERROR(slots_.map(uint64_t{n_slots_} * block_, 4096, false, "victim cache"));
  FARMEM_RETURN_IF_ERROR(setup_move());
  FARMEM_RETURN_IF_ERROR(setup_wp_async());
  // Under WP_ASYNC a write to a write-protected zero page would be
  // resolved by the kernel with no event, and the block would never be
  // counted: no zero page then.
  zero_page_ = cfg_.zero_page && !use_wp_async_;
  // The zero source of zero faults, fault-around runs included. Never
  // written, so it costs no memory (reads map the kernel's zero page).
  zero_around_max_ = std::min<uint32_t>(cfg_.zero_fault_around, kZeroAroundMaxBytes / block_ - 1);
  if (kZeroAroundMaxBytes / block_ < 2) zero_around_max_ = 0;
  // Both powers of two: the chunk stays one aligned power of two.
  zero_chunk_ = std::min<uint32_t>(cfg_.zero_chunk, kZeroAroundMaxBytes / block_);
  if (zero_chunk_ < 2) zero_chunk_ = 0;
  if (zero_chunk_ > 0) {
    FARMEM_RETURN_IF_ERROR(
        filled_.map((n_blocks_ + 63) / 64 * 8, 4096, true, "zero-fill chunk bitmap"));
  }
  FARMEM_RETURN_IF_ERROR(
      zero_.map(uint64_t{block_} * std::max<uint32_t>(1 + zero_around_max_, zero_chunk_), 4096,
                false, "zero block"));
  FARMEM_RETURN_IF_ERROR(transport_->register_buffer(slots_.ptr, uint64_t{n_slots_} * block_));
  registered_.push_back(slots_.ptr);
  free_slots_.reserve(n_slots_);
  fresh_slots_ = 0;
  FARMEM_RETURN_IF_ERROR(slot_meta_.map(4 * uint64_t{n_slots_}, 4096, true, "victim slot states"));
  slot_empty_ = reinterpret_cast<uint8_t*>(slot_meta_.ptr);
  wb_left_ = slot_empty_ + n_slots_;
  wb_ok_ = wb_left_ + n_slots_;
  wb_retry_ = wb_ok_ + n_slots_;
  // A fresh mapping holds no page; a pinning registration may have faulted
  // them all in, and they stay (evictor.h "Free slots' pages"). A fresh
  // slot's state is set when it is first taken (alloc_slot()).
  drop_slot_pages_ = !transport_->registration_pins();

  remote_ = std::make_unique<RemoteMap>(source_, transport_, block_);
  prefetcher_ = std::make_unique<Prefetcher>(cfg_.prefetch_max_window, n_blocks_);

  staging_blocks_ = cfg_.staging_blocks;
  if (staging_blocks_ == 0) {
    uint32_t s = (256u << 10) / block_;
    staging_blocks_ = s < 2 ? 2 : (s > 64 ? 64 : s);
  }
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return make_error(Errc::kIo, "eventfd: %s", strerror(errno));
  if (blocking_read_) {
    FARMEM_RETURN_IF_ERROR(doorbell_.map(kDoorbellBytes, 4096, false, "uffd doorbell page"));
    FARMEM_RETURN_IF_ERROR(uffd_.register_range(doorbell_.ptr, kDoorbellBytes));
    doorbell_addr_ = reinterpret_cast<uintptr_t>(doorbell_.ptr);
    bell_thread_ = std::thread([this] { doorbell_main(); });
  }

  for (uint32_t i = 0; i < cfg_.handler_threads; ++i) {
    auto h = std::make_unique<Handler>();
    auto q = transport_->open_queue();
    if (!q.ok()) return q.status().with_context("pager: opening a handler's transport queue");
    h->q = std::move(*q);
    FARMEM_RETURN_IF_ERROR(
        h->staging.map(uint64_t{staging_blocks_} * block_, 4096, false, "staging buffer"));
    FARMEM_RETURN_IF_ERROR(
        transport_->register_buffer(h->staging.ptr, uint64_t{staging_blocks_} * block_));
    registered_.push_back(h->staging.ptr);
    if (kRunMax * uint64_t{block_} <= (256u << 10))
      FARMEM_RETURN_IF_ERROR(
          h->run_buf.map(kRunMax * uint64_t{block_}, 4096, false, "prefetch run buffer"));
    for (uint32_t s = staging_blocks_; s-- > 0;) h->free_staging.push_back(s);
    size_t cap = h->q->depth();
    h->inflight.resize(cap);
    for (size_t k = cap; k-- > 0;) h->free_inflight.push_back(static_cast<uint32_t>(k));
    h->deferred.reserve(4096);
    h->ops.reserve(cap);
    h->pending.reserve(kMaxPending);
    handlers_.push_back(std::move(h));
  }
  auto eq = transport_->open_queue();
  if (!eq.ok()) return eq.status().with_context("pager: opening the evictor's transport queue");
  evict_q_ = std::move(*eq);
  auto hq = transport_->open_queue();
  if (!hq.ok()) return hq.status().with_context("pager: opening the hint transport queue");
  hint_q_ = std::move(*hq);
  h_wb_.reserve(cfg_.writeback_batch);
  wb_ops_.reserve(uint64_t{cfg_.writeback_batch} * remote_->replicas());
  if (remote_->replicas() > 1) {
    auto r = Replicator<B>::start(transport_, remote_.get());
    if (!r.ok()) return r.status().with_context("pager: starting re-replication");
    replicator_ = std::move(*r);
  }

  // Pinned only when every allowed CPU gets a handler: a CPU without one
  // would send each of its faults to another CPU, where an unpinned handler
  // may at least be woken on the faulting thread's CPU.
  std::vector<int> cpus = cfg_.pin_handlers ? allowed_cpus() : std::vector<int>{};
  if (cpus.size() > handlers_.size()) cpus.clear();
  // Parked handlers (fault_path.h): only with one handler per CPU, faults
  // that name their thread, and a start on the main thread. Set before the
  // handlers start, which read them.
  if (!cpus.empty() && handlers_.size() > 1 && uffd_.features().thread_id) {
    for (int c : cpus)  // each gets a handler: there are at least as many
      if (c < 64) handler_cpus_ |= uint64_t{1} << c;
    main_cpu_ = main_thread_cpu();
    main_tid_ = static_cast<int>(getpid());
    main_tp_ = reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
  }
  for (size_t i = 0; i < handlers_.size(); ++i) {
    Handler* hp = handlers_[i].get();
    hp->thread = std::thread([this, hp] { handler_main(*hp); });
    if (!cpus.empty()) {
      // Handlers per CPU (see above handler_main()). A refusal (a cpuset
      // changed meanwhile) only costs speed: the handler runs unpinned.
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[i % cpus.size()], &set);
      if (pthread_setaffinity_np(hp->thread.native_handle(), sizeof set, &set) == 0)
        hp->cpu = cpus[i % cpus.size()];
    }
  }
  evictor_ = std::thread([this] { evictor_main(); });
  FARMEM_LOG(kDebug,
             "pager: region %p + %llu, budget %lld blocks of %u, %u handlers, uffd %s, idle "
             "handlers %s",
             static_cast<void*>(region_.ptr), static_cast<unsigned long long>(cfg_.region_size),
             static_cast<long long>(budget_blocks_), block_, cfg_.handler_threads,
             uffd_.features().to_string().c_str(),
             blocking_read_ ? "block in read()" : "ppoll() (no RWF_NOWAIT on the uffd)");
  return ok_status();
}

template <TransportBackend B>
Pager<B>::~Pager() {
  fork_.shutdown(/*fill=*/!fork_child_);  // children get their snapshot blocks first
  stop_.store(true, std::memory_order_release);
  park_.bump();  // parked handlers see stop_ at once
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t w = write(stop_fd_, &one, sizeof one);
    (void)w;
  }
  {
    std::lock_guard<std::mutex> lk(evict_mu_);
    evict_cv_.notify_all();
  }
  if (bell_thread_.joinable() && !fork_child_) {
    // A handler blocked in read() does not see stop_fd_: ring until every
    // handler has returned (each one that reads the doorbell goes back to
    // the top of its loop and sees stop_).
    ring_doorbell([this] {
      for (auto& h : handlers_) {
        if (h->thread.joinable() && !h->exited.load(std::memory_order_acquire)) return false;
      }
      return true;
    });
  }
  for (auto& h : handlers_) {
    if (h->thread.joinable()) h->thread.join();
  }
  if (bell_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(bell_mu_);
      bell_exit_ = true;
    }
    bell_cv_.notify_all();
    bell_thread_.join();
  }
  if (evictor_.joinable()) evictor_.join();
  if (region_.ptr && uffd_.fd() >= 0) (void)uffd_.unregister_range(region_.ptr, cfg_.region_size);
  replicator_.reset();
  for (auto& h : handlers_) h->q.reset();
  evict_q_.reset();
  hint_q_.reset();
  for (void* p : registered_) (void)transport_->unregister_buffer(p);
  remote_.reset();
  if (stop_fd_ >= 0) close(stop_fd_);
}

template <TransportBackend B>
PagerStats Pager<B>::stats() const {
  PagerStats s;
  counters_.snapshot(&s);
  for (const auto& h : handlers_) h->ctr.add_to(&s);
  s.resident_bytes = resident_bytes();
  s.resident_peak_bytes = static_cast<uint64_t>(peak_.load(std::memory_order_relaxed)) * block_;
  s.budget_bytes = budget_bytes();
  s.remote_bytes = remote_ ? remote_->assigned_bytes() : 0;
  s.pinned_bytes = pinned_bytes();
  return s;
}

}  // namespace farmem
