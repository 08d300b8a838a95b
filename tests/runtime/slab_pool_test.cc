#include "runtime/slab_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tests/runtime/local_donor.h"

namespace farmem {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSlab = 64 << 10;

std::unique_ptr<SlabPool> make_pool(uint64_t slabs, uint64_t quota = 0,
                                    SlabRegistrar* reg = nullptr, bool shared = false) {
  SlabPoolOptions o;
  o.shared = shared;
  o.capacity = slabs * kSlab;
  o.slab_size = kSlab;
  o.quota_per_owner = quota;
  o.try_hugepages = false;
  o.registrar = reg;
  auto p = SlabPool::create(o);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? std::move(*p) : nullptr;
}

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

TEST(SlabPool, CapacityMustBeAMultipleOfTheSlabSize) {
  SlabPoolOptions o;
  o.capacity = 3 * kSlab + 4096;
  o.slab_size = kSlab;
  auto p = SlabPool::create(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Errc::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("not a positive multiple of the slab size"));
  EXPECT_THAT(p.status().message(), HasSubstr("e.g. 196608"));  // rounded down to whole slabs
}

TEST(SlabPool, SlabSizeMustBeWholePages) {
  SlabPoolOptions o;
  o.capacity = 1 << 20;
  o.slab_size = 1000;
  auto p = SlabPool::create(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Errc::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("page size"));
}

TEST(SlabPool, LeaseRoundsUpToSlabsAndDescribesThem) {
  auto pool = make_pool(8);
  auto r = pool->lease(7, kSlab + 1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_NE((*r)[0].slab, (*r)[1].slab);
  for (const auto& d : *r) {
    EXPECT_EQ(d.size, kSlab);
    EXPECT_EQ(d.rkey, 0u);  // tcp: no registration
    EXPECT_EQ(d.addr, 0u);
    EXPECT_LT(d.slab, 8u);
    EXPECT_EQ(pool->owner_of(d.slab), 7u);
  }
  EXPECT_EQ(pool->leased_bytes(), 2 * kSlab);
  EXPECT_EQ(pool->leased_bytes(7), 2 * kSlab);
  EXPECT_EQ(pool->leased_bytes(8), 0u);
  EXPECT_EQ(pool->free_slabs(), 6u);
}

TEST(SlabPool, RefusesBadLeases) {
  auto pool = make_pool(4);
  auto zero = pool->lease(7, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), Errc::kInvalidArgument);
  auto nobody = pool->lease(0, kSlab);
  ASSERT_FALSE(nobody.ok());
  EXPECT_EQ(nobody.status().code(), Errc::kInvalidArgument);
  auto huge = pool->lease(7, UINT64_MAX);  // must not wrap into a small request
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), Errc::kResourceExhausted);
  EXPECT_THAT(huge.status().message(), HasSubstr("capacity"));
  EXPECT_EQ(pool->leased_bytes(), 0u);
}

TEST(SlabPool, LeaseIsAllOrNothingAndNeverExceedsCapacity) {
  auto pool = make_pool(4);
  ASSERT_TRUE(pool->lease(1, 3 * kSlab).ok());
  auto r = pool->lease(2, 2 * kSlab);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("only 1 of 4"));
  EXPECT_EQ(pool->leased_bytes(), 3 * kSlab);
  EXPECT_EQ(pool->leased_bytes(2), 0u);
  auto beyond = pool->lease(2, 5 * kSlab);
  ASSERT_FALSE(beyond.ok());
  EXPECT_THAT(beyond.status().message(), HasSubstr("whole capacity"));
  ASSERT_TRUE(pool->lease(2, kSlab).ok());
  EXPECT_EQ(pool->leased_bytes(), 4 * kSlab);
  EXPECT_EQ(pool->free_slabs(), 0u);
}

TEST(SlabPool, QuotaLimitsEachOwnerSeparately) {
  auto pool = make_pool(8, 3 * kSlab);
  EXPECT_EQ(pool->quota(), 3 * kSlab);
  ASSERT_TRUE(pool->lease(1, 2 * kSlab).ok());
  auto r = pool->lease(1, 2 * kSlab);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("quota"));
  ASSERT_TRUE(pool->lease(1, kSlab).ok());  // exactly up to the quota
  ASSERT_TRUE(pool->lease(2, 3 * kSlab).ok());
  EXPECT_EQ(pool->leased_bytes(), 6 * kSlab);
}

TEST(SlabPool, ReleaseChecksTheOwner) {
  auto pool = make_pool(4);
  auto a = pool->lease(1, kSlab);
  ASSERT_TRUE(a.ok());
  uint32_t s = (*a)[0].slab;
  Status st = pool->release(2, s);
  EXPECT_EQ(st.code(), Errc::kPermissionDenied);
  EXPECT_EQ(pool->owner_of(s), 1u);
  uint32_t unleased = s == 0 ? 1 : 0;
  EXPECT_EQ(pool->release(1, unleased).code(), Errc::kNotFound);
  EXPECT_EQ(pool->release(1, 4).code(), Errc::kNotFound);  // no such slab
  EXPECT_EQ(pool->release(1, UINT32_MAX).code(), Errc::kNotFound);
  ASSERT_TRUE(pool->release(1, s).ok());
  EXPECT_EQ(pool->release(1, s).code(), Errc::kNotFound);  // twice
  EXPECT_EQ(pool->leased_bytes(), 0u);
  EXPECT_EQ(pool->free_slabs(), 4u);
}

TEST(SlabPool, PinChecksOwnerAndRange) {
  auto pool = make_pool(4);
  auto a = pool->lease(1, kSlab);
  ASSERT_TRUE(a.ok());
  uint32_t s = (*a)[0].slab;
  uint8_t* p = nullptr;
  ASSERT_EQ(pool->pin(1, s, kSlab - 4096, 4096, &p), Errc::kOk);  // ends exactly at the end
  EXPECT_EQ(p, pool->slab_addr(s) + kSlab - 4096);
  pool->unpin(s);
  EXPECT_EQ(pool->pin(2, s, 0, 1, &p), Errc::kPermissionDenied);
  EXPECT_EQ(pool->pin(1, s, kSlab - 4095, 4096, &p), Errc::kOutOfRange);
  EXPECT_EQ(pool->pin(1, s, kSlab, 1, &p), Errc::kOutOfRange);
  EXPECT_EQ(pool->pin(1, s, UINT64_MAX, 2, &p), Errc::kOutOfRange);  // no wrap-around
  EXPECT_EQ(pool->pin(1, s, 8, UINT64_MAX, &p), Errc::kOutOfRange);
  EXPECT_EQ(pool->pin(1, s == 0 ? 1 : 0, 0, 1, &p), Errc::kNotFound);
  EXPECT_EQ(pool->pin(1, 99, 0, 1, &p), Errc::kNotFound);
  // Another owner's out-of-range request learns nothing about the range.
  EXPECT_EQ(pool->pin(2, s, kSlab, 1, &p), Errc::kPermissionDenied);
}

TEST(SlabPool, ReleasedSlabIsZeroedBeforeTheNextOwner) {
  auto pool = make_pool(1);
  auto a = pool->lease(1, kSlab);
  ASSERT_TRUE(a.ok());
  uint8_t* p = nullptr;
  ASSERT_EQ(pool->pin(1, 0, 0, kSlab, &p), Errc::kOk);
  std::memset(p, 0xA5, kSlab);
  pool->unpin(0);
  ASSERT_TRUE(pool->release(1, 0).ok());
  auto b = pool->lease(2, kSlab);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*b)[0].slab, 0u);
  ASSERT_EQ(pool->pin(2, 0, 0, kSlab, &p), Errc::kOk);
  EXPECT_TRUE(all_zero(p, kSlab));
  pool->unpin(0);
}

// "Local clients" (donor_server.cc): a leased slab of a shared pool gets a
// view of its own, with the proof in the page after it; what is written
// through the view is the slab's data; once the slab leaves its owner the
// view is gone (EFAULT), the slab is zeroed, and the next owner's view is
// another mapping.
TEST(SlabPool, AliasIsTheSlabUntilItLeavesItsOwner) {
  if (!testing::one_sided_allowed()) GTEST_SKIP() << "process_vm_readv is not allowed here";
  auto pool = make_pool(2, 0, nullptr, /*shared=*/true);
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->shared());
  auto a = pool->lease(1, kSlab);
  ASSERT_TRUE(a.ok());
  const uint32_t slab = (*a)[0].slab;
  const uint8_t proof[4] = {9, 8, 7, 6};
  auto v = pool->alias(1, slab, proof);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  ASSERT_NE(*v, reinterpret_cast<uint64_t>(pool->slab_addr(slab)));
  uint8_t got[4] = {};
  ASSERT_EQ(testing::read_own_memory(*v + kSlab, got, 4), 0);
  EXPECT_EQ(std::memcmp(got, proof, 4), 0);
  ASSERT_EQ(testing::read_own_memory(*v, got, 4), 0);
  EXPECT_TRUE(all_zero(got, 4)) << "the proof is not in the slab's data";
  // Written through the view, seen in the slab, and the other way round.
  auto* view = reinterpret_cast<uint8_t*>(*v);
  std::memset(view + 4096, 0x5A, 4096);
  uint8_t* p = nullptr;
  ASSERT_EQ(pool->pin(1, slab, 0, kSlab, &p), Errc::kOk);
  EXPECT_EQ(p[4096], 0x5A);
  EXPECT_EQ(p[8191], 0x5A);
  p[kSlab - 1] = 0x33;
  pool->unpin(slab);
  EXPECT_EQ(view[kSlab - 1], 0x33);
  // Asking again gives the same view (and rewrites the proof).
  auto again = pool->alias(1, slab, proof);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *v);

  // Others may not.
  EXPECT_EQ(pool->alias(2, slab, proof).status().code(), Errc::kPermissionDenied);
  EXPECT_EQ(pool->alias(1, slab + 1, proof).status().code(), Errc::kNotFound);

  ASSERT_TRUE(pool->release(1, slab).ok());
  EXPECT_EQ(testing::read_own_memory(*v, got, 4), EFAULT) << "the view outlived the lease";
  EXPECT_EQ(testing::read_own_memory(*v + kSlab, got, 4), EFAULT) << "the proof outlived the lease";
  auto b = pool->lease(2, 2 * kSlab);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(pool->pin(2, slab, 0, kSlab, &p), Errc::kOk);
  EXPECT_TRUE(all_zero(p, kSlab)) << "a shared slab must be zeroed too (MADV_REMOVE)";
  pool->unpin(slab);
  // The next owner's views are elsewhere: the first owner, late, still
  // only faults, and never reaches them.
  for (const auto& d : *b) {
    auto w = pool->alias(2, d.slab, proof);
    ASSERT_TRUE(w.ok());
    EXPECT_NE(*w, *v);
    std::memset(reinterpret_cast<uint8_t*>(*w), 0x77, 64);
  }
  EXPECT_EQ(testing::read_own_memory(*v, got, 4), EFAULT)
      << "a revoked view's address was mapped again";
  // Session end drops every view of the owner.
  auto w = pool->alias(2, slab, proof);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(pool->release_all(2), 2u);
  EXPECT_EQ(testing::read_own_memory(*w, got, 4), EFAULT);
}

// The file of "Local clients": a slab aliased as lent moves into a memfd
// whose descriptor number ends the proof page; that file is the slab (what
// pwrite puts there the donor reads, and the other way round) and holds
// the proof after it. When the slab leaves its owner the file is empty
// and cannot grow: a late pread gets 0 bytes, a late pwrite EPERM, and the
// slab lent again is zero. A slab with I/O in flight gets a plain view.
TEST(SlabPool, AliasOfAFreshSlabIsAFileEmptiedWhenTheSlabLeaves) {
  if (!testing::one_sided_allowed() || !testing::take_fd_allowed())
    GTEST_SKIP() << "process_vm_readv or pidfd_getfd is not allowed here";
  auto pool = make_pool(2, 0, nullptr, /*shared=*/true);
  ASSERT_NE(pool, nullptr);
  auto a = pool->lease(1, kSlab);
  ASSERT_TRUE(a.ok());
  const uint32_t slab = (*a)[0].slab;
  const uint8_t proof[4] = {4, 3, 2, 1};
  auto v = pool->alias(1, slab, proof);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  const auto* rec = reinterpret_cast<const uint8_t*>(*v + kSlab + wire::kLocalFileRecord);
  ASSERT_EQ(wire::get_u32(rec), wire::kLocalFileMagic);
  const int fd = testing::take_fd(static_cast<int>(wire::get_u32(rec + 4)));
  ASSERT_GE(fd, 0) << strerror(errno);
  uint8_t got[4096];
  ASSERT_EQ(pread(fd, got, 4, kSlab), 4);
  EXPECT_EQ(std::memcmp(got, proof, 4), 0);
  std::vector<uint8_t> pat(4096);
  for (size_t i = 0; i < pat.size(); ++i) pat[i] = static_cast<uint8_t>(i * 13 + 5);
  ASSERT_EQ(pwrite(fd, pat.data(), pat.size(), 8192), 4096);
  uint8_t* p = nullptr;
  ASSERT_EQ(pool->pin(1, slab, 0, kSlab, &p), Errc::kOk);
  EXPECT_EQ(std::memcmp(p + 8192, pat.data(), pat.size()), 0);
  p[100] = 0x42;
  pool->unpin(slab);
  ASSERT_EQ(pread(fd, got, 1, 100), 1);
  EXPECT_EQ(got[0], 0x42);

  ASSERT_TRUE(pool->release(1, slab).ok());
  EXPECT_EQ(pread(fd, got, sizeof got, 0), 0) << "the file outlived the lease";
  errno = 0;
  EXPECT_EQ(pwrite(fd, pat.data(), pat.size(), 0), -1);
  EXPECT_EQ(errno, EPERM) << "a revoked file must not grow again";
  auto b = pool->lease(2, kSlab);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*b)[0].slab, slab);
  ASSERT_EQ(pool->pin(2, slab, 0, kSlab, &p), Errc::kOk);
  EXPECT_TRUE(all_zero(p, kSlab)) << "the slab lent again must be zero";
  pool->unpin(slab);
  auto w = pool->alias(2, slab, proof);  // a file of its own again
  ASSERT_TRUE(w.ok());
  std::memset(reinterpret_cast<uint8_t*>(*w), 0x77, 64);
  EXPECT_EQ(pread(fd, got, sizeof got, 0), 0) << "the late file reaches the next owner's data";
  close(fd);

  // I/O since the slab was lent (here: a write, done) when the view is
  // asked for: a plain view, no file, and the data stays.
  auto c = pool->lease(3, kSlab);
  ASSERT_TRUE(c.ok());
  const uint32_t other = (*c)[0].slab;
  ASSERT_EQ(pool->pin(3, other, 0, 64, &p), Errc::kOk);
  p[0] = 0x11;
  pool->unpin(other);
  auto x = pool->alias(3, other, proof);
  ASSERT_TRUE(x.ok());
  EXPECT_NE(wire::get_u32(reinterpret_cast<const uint8_t*>(*x + kSlab + wire::kLocalFileRecord)),
            wire::kLocalFileMagic);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(*x)[0], 0x11) << "what was written before the view";
}

// Files take descriptors, which a server needs for its connections: at
// most a quarter of RLIMIT_NOFILE's soft limit are open at once; slabs
// beyond get plain views, and a file closed by a release makes room.
TEST(SlabPool, SlabFilesStayWithinAQuarterOfTheDescriptorLimit) {
  if (!testing::one_sided_allowed() || !testing::take_fd_allowed())
    GTEST_SKIP() << "process_vm_readv or pidfd_getfd is not allowed here";
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max < 64) GTEST_SKIP() << "the hard descriptor limit is below 64";
  struct Restore {
    rlimit r;
    ~Restore() { setrlimit(RLIMIT_NOFILE, &r); }
  } restore{saved};
  rlimit low = saved;
  low.rlim_cur = 32;  // 8 files
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  auto pool = make_pool(10, 0, nullptr, /*shared=*/true);
  ASSERT_NE(pool, nullptr);
  auto a = pool->lease(1, 9 * kSlab);
  ASSERT_TRUE(a.ok());
  const uint8_t proof[4] = {1, 2, 3, 4};
  auto has_file = [&](uint64_t view) {
    const auto* rec = reinterpret_cast<const uint8_t*>(view + kSlab + wire::kLocalFileRecord);
    return wire::get_u32(rec) == wire::kLocalFileMagic;
  };
  std::vector<bool> file;
  for (const auto& d : *a) {
    auto v = pool->alias(1, d.slab, proof);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    file.push_back(has_file(*v));
    reinterpret_cast<uint8_t*>(*v)[0] = 0x21;  // a view either way
  }
  EXPECT_EQ(std::count(file.begin(), file.end(), true), 8);
  EXPECT_TRUE(file[0]);
  EXPECT_FALSE(file[8]) << "a ninth file past a quarter of the limit";
  // The tenth slab has no room either; a release gives its file's back.
  auto b = pool->lease(2, kSlab);
  ASSERT_TRUE(b.ok());
  auto w = pool->alias(2, (*b)[0].slab, proof);
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(has_file(*w));
  ASSERT_TRUE(pool->release(1, (*a)[0].slab).ok());
  auto c = pool->lease(3, kSlab);
  ASSERT_TRUE(c.ok());
  auto x = pool->alias(3, (*c)[0].slab, proof);
  ASSERT_TRUE(x.ok());
  EXPECT_TRUE(has_file(*x)) << "a released slab's file still counts";
}

TEST(SlabPool, AliasNeedsASharedPool) {
  auto pool = make_pool(1);
  ASSERT_FALSE(pool->shared());
  ASSERT_TRUE(pool->lease(1, kSlab).ok());
  const uint8_t proof[1] = {1};
  auto v = pool->alias(1, 0, proof);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), Errc::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("not shared memory"));
}

TEST(SlabPool, PinnedSlabDrainsBeforeReuse) {
  auto pool = make_pool(1);
  ASSERT_TRUE(pool->lease(1, kSlab).ok());
  uint8_t* p = nullptr;
  ASSERT_EQ(pool->pin(1, 0, 0, kSlab, &p), Errc::kOk);
  EXPECT_EQ(pool->release_all(1), 1u);
  // The owner is gone at once, the slab is not lendable yet.
  EXPECT_EQ(pool->leased_bytes(), 0u);
  EXPECT_EQ(pool->owner_of(0), 0u);
  EXPECT_EQ(pool->free_slabs(), 0u);
  uint8_t* q = nullptr;
  EXPECT_EQ(pool->pin(1, 0, 0, 1, &q), Errc::kNotFound);
  auto r = pool->lease(2, kSlab);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kResourceExhausted);
  // The in-flight I/O finishes writing, then lets go.
  std::memset(p, 0x5A, kSlab);
  pool->unpin(0);
  EXPECT_EQ(pool->free_slabs(), 1u);
  auto b = pool->lease(2, kSlab);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(pool->pin(2, 0, 0, kSlab, &p), Errc::kOk);
  EXPECT_TRUE(all_zero(p, kSlab));
  pool->unpin(0);
}

TEST(SlabPool, ReleaseAllReturnsEverySlabOfOneOwner) {
  auto pool = make_pool(8);
  ASSERT_TRUE(pool->lease(1, 3 * kSlab).ok());
  ASSERT_TRUE(pool->lease(2, 2 * kSlab).ok());
  ASSERT_TRUE(pool->lease(1, kSlab).ok());
  EXPECT_EQ(pool->release_all(1), 4u);
  EXPECT_EQ(pool->release_all(1), 0u);
  EXPECT_EQ(pool->leased_bytes(), 2 * kSlab);
  EXPECT_EQ(pool->leased_bytes(2), 2 * kSlab);
  EXPECT_EQ(pool->free_slabs(), 6u);
}

class FakeRegistrar : public SlabRegistrar {
 public:
  Status register_region(uint8_t* base, uint64_t length) override {
    ++regions;
    region_base = base;
    region_len = length;
    return ok_status();
  }
  Status describe(LeaseOwner owner, wire::SlabDesc* d, uint8_t* addr) override {
    d->rkey = static_cast<uint32_t>(owner * 1000 + d->slab);
    d->addr = reinterpret_cast<uint64_t>(addr);
    ++described;
    return ok_status();
  }
  void forget(LeaseOwner, uint32_t) noexcept override { ++forgotten; }
  bool pins_pages() const noexcept override { return true; }  // memset path

  int regions = 0, described = 0, forgotten = 0;
  uint8_t* region_base = nullptr;
  uint64_t region_len = 0;
};

TEST(SlabPool, RegistrarHookSeesTheRegionOnceAndEveryLease) {
  FakeRegistrar reg;
  auto pool = make_pool(4, 0, &reg);
  EXPECT_EQ(reg.regions, 1);
  EXPECT_EQ(reg.region_base, pool->slab_addr(0));
  EXPECT_EQ(reg.region_len, 4 * kSlab);
  auto a = pool->lease(3, 2 * kSlab);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reg.described, 2);
  for (const auto& d : *a) {
    EXPECT_EQ(d.rkey, 3000 + d.slab);
    EXPECT_EQ(d.addr, reinterpret_cast<uint64_t>(pool->slab_addr(d.slab)));
  }
  uint8_t* p = nullptr;
  uint32_t s = (*a)[0].slab;
  ASSERT_EQ(pool->pin(3, s, 0, kSlab, &p), Errc::kOk);
  std::memset(p, 0x77, kSlab);
  pool->unpin(s);
  EXPECT_EQ(pool->release_all(3), 2u);
  EXPECT_EQ(reg.forgotten, 2);
  EXPECT_EQ(reg.regions, 1);
  EXPECT_TRUE(all_zero(pool->slab_addr(s), kSlab));  // zeroed by memset, frames kept
}

TEST(SlabPool, HugePagesRequestedStillGivesUsableMemory) {
  // Whether MAP_HUGETLB works depends on the machine (nr_hugepages); either
  // way the pool must serve zeroed memory.
  SlabPoolOptions o;
  o.capacity = 4 << 20;
  o.slab_size = 2 << 20;
  o.try_hugepages = true;
  auto p = SlabPool::create(o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto a = (*p)->lease(1, 2 << 20);
  ASSERT_TRUE(a.ok());
  uint8_t* m = nullptr;
  ASSERT_EQ((*p)->pin(1, (*a)[0].slab, 0, 2 << 20, &m), Errc::kOk);
  EXPECT_TRUE(all_zero(m, 2 << 20));
  std::memset(m, 1, 2 << 20);
  (*p)->unpin((*a)[0].slab);
  ASSERT_TRUE((*p)->release(1, (*a)[0].slab).ok());
  auto b = (*p)->lease(2, 4 << 20);
  ASSERT_TRUE(b.ok());
  for (const auto& d : *b) EXPECT_TRUE(all_zero((*p)->slab_addr(d.slab), 2 << 20));
}

TEST(SlabPool, ConcurrentLeasesNeverShareASlabOrExceedCapacity) {
  constexpr uint32_t kSlabs = 16;
  auto pool = make_pool(kSlabs);
  std::vector<std::atomic<uint64_t>> owner(kSlabs);
  std::atomic<bool> bad{false};
  std::vector<std::thread> ts;
  for (uint64_t t = 1; t <= 4; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int i = 0; i < 400; ++i) {
        auto r = pool->lease(t, (rng() % 4 + 1) * kSlab);
        if (!r.ok()) continue;
        for (const auto& d : *r) {
          uint64_t zero = 0;
          if (!owner[d.slab].compare_exchange_strong(zero, t)) bad = true;
        }
        if (pool->leased_bytes() > kSlabs * kSlab) bad = true;
        for (const auto& d : *r) {
          owner[d.slab].store(0);
          if (!pool->release(t, d.slab).ok()) bad = true;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_FALSE(bad.load());
  EXPECT_EQ(pool->leased_bytes(), 0u);
  EXPECT_EQ(pool->free_slabs(), kSlabs);
}

}  // namespace
}  // namespace farmem
