#include "runtime/slab_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "runtime/log.h"
#include "runtime/parse.h"

namespace farmem {
namespace {

constexpr uint64_t kPageSize = 4096;

// The default huge page size from /proc/meminfo ("Hugepagesize: 2048 kB").
uint64_t huge_page_size() {
  FILE* f = fopen("/proc/meminfo", "re");
  if (f == nullptr) return 2ull << 20;
  char line[256];
  uint64_t kb = 0;
  while (fgets(line, sizeof line, f) != nullptr) {
    if (sscanf(line, "Hugepagesize: %" SCNu64 " kB", &kb) == 1) break;
  }
  fclose(f);
  return kb ? kb << 10 : 2ull << 20;
}

}  // namespace

Result<std::unique_ptr<SlabPool>> SlabPool::create(const SlabPoolOptions& o) {
  if (o.slab_size == 0 || o.slab_size % kPageSize != 0)
    return make_error(Errc::kInvalidArgument,
                      "slab size %" PRIu64 " is not a positive multiple of the %" PRIu64
                      "-byte page size: use e.g. 1M or 64M",
                      o.slab_size, kPageSize);
  if (o.capacity == 0 || o.capacity % o.slab_size != 0)
    return make_error(Errc::kInvalidArgument,
                      "capacity %" PRIu64 " is not a positive multiple of the slab size %" PRIu64
                      ": round the capacity to whole slabs (e.g. %" PRIu64 ")",
                      o.capacity, o.slab_size,
                      (o.capacity / o.slab_size + (o.capacity < o.slab_size)) * o.slab_size);
  uint64_t n = o.capacity / o.slab_size;
  if (n > UINT32_MAX)
    return make_error(Errc::kInvalidArgument,
                      "capacity %" PRIu64 " holds %" PRIu64
                      " slabs, more than slab ids can number: use a larger slab size",
                      o.capacity, n);

  if (o.shared && o.registrar != nullptr)
    return make_error(Errc::kInvalidArgument,
                      "a shared slab pool (one-sided access for local clients) cannot also be "
                      "registered with an RDMA device");

  std::unique_ptr<SlabPool> pool(new SlabPool());
  pool->shared_ = o.shared;
  const int kind = o.shared ? MAP_SHARED : MAP_PRIVATE;
  pool->capacity_ = o.capacity;
  pool->slab_size_ = o.slab_size;
  pool->quota_ =
      o.quota_per_owner == 0 || o.quota_per_owner > o.capacity ? o.capacity : o.quota_per_owner;
  pool->registrar_ = o.registrar;

  // Reserve the whole capacity now (commit charge included: no
  // MAP_NORESERVE), so an impossible --capacity fails at start-up and not
  // at the first client's write. Pages are backed lazily.
  void* p = MAP_FAILED;
  if (o.try_hugepages) {
    uint64_t hp = huge_page_size();
    if (o.capacity % hp == 0 && o.slab_size % hp == 0) {
      p = mmap(nullptr, o.capacity, PROT_READ | PROT_WRITE, kind | MAP_ANONYMOUS | MAP_HUGETLB, -1,
               0);
      if (p == MAP_FAILED)
        FARMEM_LOG(kInfo,
                   "huge pages unavailable for %s of donor memory (%s); using normal pages "
                   "with transparent huge pages. To use huge pages, reserve them first, e.g. "
                   "`echo %" PRIu64 " > /proc/sys/vm/nr_hugepages`",
                   format_size(o.capacity).c_str(), strerror(errno), o.capacity / hp);
      else
        pool->huge_pages_ = true;
    } else {
      FARMEM_LOG(kInfo,
                 "huge pages not used: capacity and slab size must be multiples of the %s huge "
                 "page size; using normal pages with transparent huge pages",
                 format_size(hp).c_str());
    }
  }
  if (p == MAP_FAILED) {
    p = mmap(nullptr, o.capacity, PROT_READ | PROT_WRITE, kind | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return make_error(Errc::kResourceExhausted,
                        "cannot reserve %s of donor memory: mmap: %s. Lower --capacity",
                        format_size(o.capacity).c_str(), strerror(errno));
    // Best effort: a kernel without THP simply refuses.
    (void)madvise(p, o.capacity, MADV_HUGEPAGE);
  }
  pool->base_ = static_cast<uint8_t*>(p);
  pool->mapped_ = o.capacity;

  if (pool->registrar_ != nullptr) {
    Status st = pool->registrar_->register_region(pool->base_, pool->mapped_);
    if (!st.ok()) return st.with_context("registering donor memory");
  }

  if (pool->shared_ && !pool->huge_pages_) {
    // Address space for alias() views, never given out twice: 16 TiB (or
    // less where the kernel refuses) of inaccessible, unbacked pages.
    for (uint64_t size = kViewArena; size >= (uint64_t{1} << 36) && !pool->arena_; size /= 4) {
      void* a = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (a == MAP_FAILED) continue;
      pool->arena_ = static_cast<uint8_t*>(a);
      pool->arena_size_ = size;
    }
  }

  pool->slabs_.resize(n);
  pool->free_.reserve(n);
  for (uint64_t i = n; i > 0; --i) pool->free_.push_back(static_cast<uint32_t>(i - 1));
  return pool;
}

SlabPool::~SlabPool() {
  // A client holding a slab's file (file_view()) reads nothing from now on.
  for (Slab& s : slabs_)
    if (s.file >= 0) {
      (void)ftruncate(s.file, 0);
      close(s.file);
    }
  if (arena_ != nullptr) munmap(arena_, arena_size_);  // every view with it
  if (base_ != nullptr) munmap(base_, mapped_);
}

Result<std::vector<wire::SlabDesc>> SlabPool::lease(LeaseOwner owner, uint64_t bytes) {
  if (owner == 0) return make_error(Errc::kInvalidArgument, "lease owner 0 is reserved");
  if (bytes == 0) return make_error(Errc::kInvalidArgument, "LEASE of 0 bytes: ask for at least 1");
  uint64_t n = bytes / slab_size_ + (bytes % slab_size_ != 0);
  if (n > capacity_ / slab_size_)  // not n * slab_size_: that can wrap
    return make_error(Errc::kResourceExhausted,
                      "LEASE of %" PRIu64 " bytes needs %" PRIu64
                      " slabs, more than this donor's whole capacity (%" PRIu64
                      " bytes): ask for less or use more donors",
                      bytes, n, capacity_);
  if (n > wire::kMaxSlabsPerLease)
    return make_error(Errc::kInvalidArgument,
                      "LEASE of %" PRIu64 " bytes needs %" PRIu64
                      " slabs, at most %u per request: lease in several requests",
                      bytes, n, wire::kMaxSlabsPerLease);

  std::vector<wire::SlabDesc> out;
  out.reserve(n);
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t mine = 0;
  if (auto it = owner_bytes_.find(owner); it != owner_bytes_.end()) mine = it->second;
  // Without a per-client quota (quota_ == capacity_) the free-slab check
  // below says it better.
  if (quota_ < capacity_ && mine + n * slab_size_ > quota_)
    return make_error(Errc::kResourceExhausted,
                      "LEASE of %" PRIu64 " bytes would bring this client to %" PRIu64
                      " bytes, above its quota of %" PRIu64
                      " bytes (--quota-per-client): release slabs first",
                      bytes, mine + n * slab_size_, quota_);
  if (free_.size() < n)
    return make_error(Errc::kResourceExhausted,
                      "LEASE of %" PRIu64 " bytes needs %" PRIu64
                      " slabs but only %zu of %zu "
                      "are free right now: retry later or use another donor",
                      bytes, n, free_.size(), slabs_.size());
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t id = free_[free_.size() - 1 - i];
    wire::SlabDesc d;
    d.slab = id;
    d.size = slab_size_;
    if (registrar_ != nullptr) {
      Status st = registrar_->describe(owner, &d, slab_addr(id));
      if (!st.ok()) {
        for (const auto& done : out) registrar_->forget(owner, done.slab);
        return st.with_context("registering a leased slab");
      }
    }
    out.push_back(d);
  }
  free_.resize(free_.size() - n);
  for (const auto& d : out) {
    Slab& s = slabs_[d.slab];
    FARMEM_BUG_ON(s.state != State::kFree || s.pins != 0);
    s.state = State::kLeased;
    s.owner = owner;
    s.io = false;
  }
  owner_bytes_[owner] = mine + n * slab_size_;
  leased_ += n * slab_size_;
  return out;
}

bool SlabPool::drop_locked(uint32_t slab) {
  Slab& s = slabs_[slab];
  FARMEM_BUG_ON(s.state != State::kLeased);
  if (registrar_ != nullptr) registrar_->forget(s.owner, slab);
  if (s.alias != nullptr) {
    // Before the slab can be zeroed or lent again (alias()): the view
    // becomes inaccessible address space that no later view reuses.
    const uint64_t span = slab_size_ + kPageSize;
    if (mmap(s.alias, span, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
             0) == MAP_FAILED &&
        munmap(s.alias, span) != 0) {
      FARMEM_LOG(kError,
                 "slab %u: its one-sided view cannot be revoked (%s); it is never lent again", slab,
                 strerror(errno));
      s.stuck = true;
    }
    s.alias = nullptr;
    --live_views_;
  }
  auto it = owner_bytes_.find(s.owner);
  FARMEM_BUG_ON(it == owner_bytes_.end() || it->second < slab_size_);
  it->second -= slab_size_;
  if (it->second == 0) owner_bytes_.erase(it);
  leased_ -= slab_size_;
  s.owner = 0;
  s.state = State::kDraining;
  return s.pins == 0 && !s.stuck;
}

void SlabPool::finish(uint32_t slab) noexcept {
  // Nobody can reach a draining slab with no pins: zero it unlocked.
  uint8_t* p = slab_addr(slab);
  bool pinned_frames = registrar_ != nullptr && registrar_->pins_pages();
  auto never_lent_again = [&](const char* why) {
    FARMEM_LOG(kError, "slab %u cannot be %s (%s); it is never lent again", slab, why,
               strerror(errno));
    std::lock_guard<std::mutex> lk(mu_);
    slabs_[slab].stuck = true;
  };
  if (int fd = slabs_[slab].file; fd >= 0) {
    // file_view(): the late owner's file reads as empty from now on; the
    // slab gets fresh (zero) shared pages of the pool's kind.
    const bool revoked = ftruncate(fd, 0) == 0;
    close(fd);
    {
      std::lock_guard<std::mutex> lk(mu_);
      slabs_[slab].file = -1;
      --live_files_;
    }
    if (!revoked || mmap(p, slab_size_, PROT_READ | PROT_WRITE,
                         MAP_FIXED | MAP_SHARED | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
      return never_lent_again("revoked (ftruncate) or given fresh pages (mmap)");
    (void)madvise(p, slab_size_, MADV_HUGEPAGE);
  } else if (shared_) {
    // MADV_DONTNEED only unmaps shared memory; MADV_REMOVE frees it. No
    // memset instead: a one-sided write that pinned a page before the view
    // went could land after it.
    if (madvise(p, slab_size_, MADV_REMOVE) != 0) return never_lent_again("zeroed (MADV_REMOVE)");
  } else if (pinned_frames || madvise(p, slab_size_, MADV_DONTNEED) != 0) {
    std::memset(p, 0, slab_size_);
  }
  std::lock_guard<std::mutex> lk(mu_);
  Slab& s = slabs_[slab];
  FARMEM_BUG_ON(s.state != State::kDraining || s.pins != 0);
  s.state = State::kFree;
  free_.push_back(slab);
}

Status SlabPool::release(LeaseOwner owner, uint32_t slab) {
  bool finish_now;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (slab >= slabs_.size() || slabs_[slab].state != State::kLeased)
      return make_error(Errc::kNotFound, "RELEASE of slab %u, which is not leased to anyone", slab);
    if (slabs_[slab].owner != owner)
      return make_error(Errc::kPermissionDenied,
                        "RELEASE of slab %u, which is leased to another client", slab);
    finish_now = drop_locked(slab);
  }
  if (finish_now) finish(slab);
  return ok_status();
}

size_t SlabPool::release_all(LeaseOwner owner) {
  std::vector<uint32_t> to_finish;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (owner == 0 || owner_bytes_.find(owner) == owner_bytes_.end()) return 0;
    for (uint32_t i = 0; i < slabs_.size(); ++i) {
      if (slabs_[i].state != State::kLeased || slabs_[i].owner != owner) continue;
      ++n;
      if (drop_locked(i)) to_finish.push_back(i);
    }
  }
  for (uint32_t s : to_finish) finish(s);
  return n;
}

Errc SlabPool::pin(LeaseOwner owner, uint32_t slab, uint64_t offset, uint64_t length,
                   uint8_t** addr) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  if (slab >= slabs_.size() || slabs_[slab].state != State::kLeased) return Errc::kNotFound;
  Slab& s = slabs_[slab];
  if (s.owner != owner || owner == 0) return Errc::kPermissionDenied;
  // Written so that no sum can overflow.
  if (offset > slab_size_ || length > slab_size_ - offset) return Errc::kOutOfRange;
  ++s.pins;
  s.io = true;
  *addr = slab_addr(slab) + offset;
  return Errc::kOk;
}

Result<uint64_t> SlabPool::alias(LeaseOwner owner, uint32_t slab, std::span<const uint8_t> proof) {
  if (!shared_)
    return make_error(Errc::kInvalidArgument, "slab %u: the pool is not shared memory", slab);
  if (proof.size() > kPageSize)
    return make_error(Errc::kInvalidArgument, "slab %u: a proof of %zu bytes does not fit", slab,
                      proof.size());
  std::lock_guard<std::mutex> lk(mu_);
  if (slab >= slabs_.size() || slabs_[slab].state != State::kLeased)
    return make_error(Errc::kNotFound, "slab %u is not leased", slab);
  Slab& s = slabs_[slab];
  if (s.owner != owner || owner == 0)
    return make_error(Errc::kPermissionDenied, "slab %u is leased to another client", slab);
  if (s.alias == nullptr) {
    if (arena_ == nullptr)
      return make_error(Errc::kInvalidArgument,
                        "slab %u: no views of a huge-page pool (mremap cannot alias it)", slab);
    if (live_views_ >= kMaxViews)
      return make_error(Errc::kResourceExhausted, "slab %u: %u views are live, the most", slab,
                        kMaxViews);
    // [view of the slab][proof page], at the arena's next unused address.
    const uint64_t span = slab_size_ + kPageSize;
    if (arena_size_ - arena_next_ < span)
      return make_error(Errc::kResourceExhausted, "slab %u: the address space for views is used up",
                        slab);
    uint8_t* view = arena_ + arena_next_;
    arena_next_ += span;
    // A file of its own when the slab is as lent (no I/O on it yet, so
    // nothing to carry over) and the proof leaves room for the file's
    // record, else old_size 0: a second mapping of the same
    // shared pages, and the proof in a private page.
    void* pp =
        !s.io && proof.size() <= wire::kLocalFileRecord ? file_view(s, slab, view) : MAP_FAILED;
    if (pp == MAP_FAILED) {
      void* a = mremap(slab_addr(slab), 0, slab_size_, MREMAP_MAYMOVE | MREMAP_FIXED, view);
      pp = a == MAP_FAILED ? MAP_FAILED
                           : mmap(view + slab_size_, kPageSize, PROT_READ | PROT_WRITE,
                                  MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (pp == MAP_FAILED) {
      const int e = errno;
      if (mmap(view, span, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
               0) == MAP_FAILED)
        munmap(view, span);
      return make_error(Errc::kResourceExhausted, "slab %u: no second mapping: %s", slab,
                        strerror(e));
    }
    s.alias = view;
    ++live_views_;
  }
  std::memcpy(s.alias + slab_size_, proof.data(), proof.size());
  if (s.file >= 0) {
    uint8_t* rec = s.alias + slab_size_ + wire::kLocalFileRecord;
    wire::put_u32(rec, wire::kLocalFileMagic);
    wire::put_u32(rec + 4, static_cast<uint32_t>(s.file));
  }
  return reinterpret_cast<uint64_t>(s.alias);
}

// The slab moves into a memfd of its own (slab + proof page; it may not
// grow, so a write after the revocation below fails instead of extending
// it): this process's mapping of the slab and the view both map the file.
// finish() revokes it by truncating it to nothing before the slab is lent
// again: a late pread gets 0 bytes, a late pwrite EPERM.
void* SlabPool::file_view(Slab& s, uint32_t slab, uint8_t* view) {
  // Descriptors stay for accept(): files for at most a quarter of the
  // process's limit, plain views beyond.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) != 0 || live_files_ >= nofile.rlim_cur / 4)
    return MAP_FAILED;
  const uint64_t span = slab_size_ + kPageSize;
  const int fd = memfd_create("farmem-slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(span)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      mmap(view, span, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED, fd, 0) == MAP_FAILED) {
    close(fd);
    return MAP_FAILED;
  }
  if (mmap(slab_addr(slab), slab_size_, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED, fd, 0) ==
      MAP_FAILED) {
    // The pool's own pages are still there (a failed MAP_FIXED leaves the
    // range as it was only when it failed before unmapping it: restore).
    // The view is alias()'s to replace or revoke.
    (void)mmap(slab_addr(slab), slab_size_, PROT_READ | PROT_WRITE,
               MAP_FIXED | MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    close(fd);
    return MAP_FAILED;
  }
  s.file = fd;
  ++live_files_;
  return view;
}

void SlabPool::unpin(uint32_t slab) noexcept {
  bool finish_now = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    FARMEM_BUG_ON(slab >= slabs_.size() || slabs_[slab].pins == 0);
    Slab& s = slabs_[slab];
    --s.pins;
    finish_now = s.pins == 0 && s.state == State::kDraining && !s.stuck;
  }
  if (finish_now) finish(slab);
}

uint64_t SlabPool::leased_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return leased_;
}

uint64_t SlabPool::leased_bytes(LeaseOwner owner) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = owner_bytes_.find(owner);
  return it == owner_bytes_.end() ? 0 : it->second;
}

uint32_t SlabPool::free_slabs() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<uint32_t>(free_.size());
}

LeaseOwner SlabPool::owner_of(uint32_t slab) const {
  std::lock_guard<std::mutex> lk(mu_);
  return slab < slabs_.size() ? slabs_[slab].owner : 0;
}

}  // namespace farmem
