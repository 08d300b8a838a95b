// The loopback queue's lookup cache (runtime/loopback_transport.h): post()
// validates ops against a per-queue copy of the buffers and slabs it last
// found, stamped with the transport's table generation. Every change of the
// tables must be seen by the next post(): a removed slab or an unregistered
// buffer is refused even right after ops on it were accepted from the cache,
// and slabs sharing a cache entry are each checked against the real table.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "runtime/loopback_transport.h"

namespace farmem {
namespace {

constexpr uint64_t kSlab = 64u << 10;
constexpr ServerId kServer = 3;

class LoopbackPostCache : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(t_.add_server(kServer, &donor_).ok());
    // 17 slabs: ids 1 .. 17, so ids 1 and 17 share an entry of the
    // 16-entry direct-mapped cache.
    auto l = donor_.lease(17 * kSlab);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    slabs_ = *l;
    ASSERT_EQ(slabs_.size(), 17u);
    ASSERT_EQ(slabs_[16].slab - slabs_[0].slab, 16u);
    buf_.assign(2 * 4096, 0);
    ASSERT_TRUE(t_.register_buffer(buf_.data(), buf_.size()).ok());
    auto q = t_.open_queue();
    ASSERT_TRUE(q.ok());
    q_ = std::move(*q);
  }

  // Posts one op and returns its completion status (posts are never
  // refused here: a bad op completes with its error).
  Errc run(IoKind k, size_t slab, uint64_t off, uint32_t len, void* local) {
    IoOp op{k, len, {kServer, slabs_[slab].slab, off}, local, 9};
    EXPECT_EQ(q_->post({&op, 1}), Errc::kOk);
    IoCompletion c[1];
    for (int i = 0; i < 1000; ++i) {
      if (q_->wait(c, 100) == 1) {
        EXPECT_EQ(c[0].cookie, 9u);
        return c[0].status;
      }
    }
    ADD_FAILURE() << "op did not complete";
    return Errc::kInternal;
  }
  void fill(size_t slab, uint8_t v) {
    auto m = donor_.slab_memory(slabs_[slab].slab);
    ASSERT_FALSE(m.empty());
    memset(m.data(), v, 4096);
  }

  LoopbackDonor donor_{64 * kSlab, kSlab};
  LoopbackTransport t_;
  std::vector<SlabDesc> slabs_;
  std::vector<uint8_t> buf_;
  std::unique_ptr<LoopbackTransport::Queue> q_;  // destroyed before t_
};

TEST_F(LoopbackPostCache, RemovedSlabIsRefusedRightAfterCachedPosts) {
  ASSERT_TRUE(t_.add_slab(kServer, slabs_[0]).ok());
  fill(0, 0x41);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data()), Errc::kOk);
  EXPECT_EQ(buf_[4095], 0x41);
  ASSERT_TRUE(t_.remove_slab(kServer, slabs_[0].slab).ok());
  buf_[0] = 0;
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data()), Errc::kInvalidArgument);
  EXPECT_EQ(buf_[0], 0) << "a refused READ moved bytes";
  ASSERT_TRUE(t_.add_slab(kServer, slabs_[0]).ok());
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data()), Errc::kOk);
  EXPECT_EQ(buf_[0], 0x41);
}

TEST_F(LoopbackPostCache, UnregisteredBufferIsRefusedRightAfterCachedPosts) {
  ASSERT_TRUE(t_.add_slab(kServer, slabs_[0]).ok());
  fill(0, 0x42);
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data() + 4096), Errc::kOk);
  // Straddling the end of the cached buffer: refused, not served from it.
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data() + 4097), Errc::kInvalidArgument);
  ASSERT_TRUE(t_.unregister_buffer(buf_.data()).ok());
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data()), Errc::kInvalidArgument);
  EXPECT_EQ(run(IoKind::kWrite, 0, 0, 16, buf_.data()), Errc::kInvalidArgument);
  // Another buffer, then the first one again.
  std::vector<uint8_t> other(4096, 0);
  ASSERT_TRUE(t_.register_buffer(other.data(), other.size()).ok());
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, other.data()), Errc::kOk);
  EXPECT_EQ(other[100], 0x42);
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data()), Errc::kInvalidArgument);
  ASSERT_TRUE(t_.register_buffer(buf_.data(), buf_.size()).ok());
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data()), Errc::kOk);
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, other.data()), Errc::kOk);
  ASSERT_TRUE(t_.unregister_buffer(other.data()).ok());
}

TEST_F(LoopbackPostCache, SlabsSharingACacheEntryAreEachChecked) {
  ASSERT_TRUE(t_.add_slab(kServer, slabs_[0]).ok());
  fill(0, 0x01);
  fill(16, 0x10);
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data()), Errc::kOk);
  EXPECT_EQ(buf_[7], 0x01);
  // Slab 17 (index 16) maps to slab 1's entry but was never added.
  EXPECT_EQ(run(IoKind::kRead, 16, 0, 4096, buf_.data()), Errc::kInvalidArgument);
  ASSERT_TRUE(t_.add_slab(kServer, slabs_[16]).ok());
  EXPECT_EQ(run(IoKind::kRead, 16, 0, 4096, buf_.data()), Errc::kOk);
  EXPECT_EQ(buf_[7], 0x10);
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 4096, buf_.data()), Errc::kOk);
  EXPECT_EQ(buf_[7], 0x01);
  // Alternating between them keeps reading the right memory.
  for (int i = 0; i < 4; ++i) {
    const size_t s = i % 2 ? 16 : 0;
    EXPECT_EQ(run(IoKind::kRead, s, 0, 4096, buf_.data()), Errc::kOk);
    EXPECT_EQ(buf_[4000], s ? 0x10 : 0x01);
  }
}

TEST_F(LoopbackPostCache, BoundsAreCheckedOnCachedSlabs) {
  ASSERT_TRUE(t_.add_slab(kServer, slabs_[0]).ok());
  EXPECT_EQ(run(IoKind::kRead, 0, kSlab - 4096, 4096, buf_.data()), Errc::kOk);
  EXPECT_EQ(run(IoKind::kRead, 0, kSlab - 4095, 4096, buf_.data()), Errc::kOutOfRange);
  EXPECT_EQ(run(IoKind::kRead, 0, kSlab + 1, 1, buf_.data()), Errc::kOutOfRange);
  EXPECT_EQ(run(IoKind::kRead, 0, 0, 0, buf_.data()), Errc::kInvalidArgument);
  // A second server with a slab of the same id is a different entry.
  LoopbackDonor other{4 * kSlab, kSlab};
  ASSERT_TRUE(t_.add_server(kServer + 1, &other).ok());
  IoOp op{IoKind::kRead, 4096, {kServer + 1, slabs_[0].slab, 0}, buf_.data(), 5};
  ASSERT_EQ(q_->post({&op, 1}), Errc::kOk);
  IoCompletion c[1];
  ASSERT_EQ(q_->wait(c, 1000), 1u);
  EXPECT_EQ(c[0].status, Errc::kInvalidArgument);
}

}  // namespace
}  // namespace farmem
