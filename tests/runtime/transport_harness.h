// The harness contract of the transport conformance suite
// (transport_conformance_test.cc), and the loopback harnesses.
//
//   template <class H> class TransportConformance : public ::testing::Test {
//     H h_;
//     void SetUp() override { h_.SetUp(); }
//     void TearDown() override { h_.TearDown(); }
//   };
//   auto q = std::move(*h_.transport().open_queue());
//   farmem::IoOp op{farmem::IoKind::kWrite, 4096, {h_.server(), h_.slabs()[0].slab, 0}, buf, 1};
//
// Every backend provides one struct H with:
//
//   using Backend = ...;                     // satisfies farmem::TransportBackend
//   static constexpr const char* kName;      // test-name suffix: [A-Za-z0-9_]
//   static constexpr bool kKillFailsOutstanding;
//       true: every op outstanding when kill_server() is called completes
//       kUnavailable (loopback: nothing executes before the owner polls);
//       false: such an op completes kOk or kUnavailable (tcp: an op already
//       on the wire may have been served before the daemon stopped).
//   void SetUp();        // may use gtest ASSERT_*: builds one server, leases
//                        // at least 2 slabs of at least 2 * wire::kMaxIoLength
//                        // bytes each, zero-filled, and add_slab()s them all
//   void TearDown();     // releases what SetUp built (the fixture's queues
//                        // and registered buffers are gone by then)
//   Backend& transport();
//   farmem::ServerId server() const;                       // the one server
//   const std::vector<farmem::SlabDesc>& slabs() const;    // as leased, added
//   void kill_server();  // the donor dies: loopback kill(); tcp: stop the
//                        // in-process daemon. Idempotent.
//   farmem::ServerId unknown_server() const;  // an id never add_server()ed
//
// What the suite assumes beyond runtime/transport.h (all backends agree):
//  * register_buffer of a range overlapping a registered one (including the
//    same range twice) fails with kInvalidArgument; unregister_buffer of an
//    address that is not the start of a registered buffer fails with
//    kNotFound.
//  * A fresh leased slab reads as zeros.
//
// Adding a backend: write `tests/runtime/<backend>_harness.h` defining the
// harness struct and `#define FARMEM_<BACKEND>_HARNESS , <Harness>` (only
// when the backend is built), include it from the conformance test under
// __has_include, and put the macro into its `Backends` list.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/loopback_transport.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

namespace farmem::testing {

// The loopback backend with no injected faults.
struct LoopbackHarness {
  using Backend = LoopbackTransport;
  static constexpr const char* kName = "loopback";
  static constexpr bool kKillFailsOutstanding = true;
  static constexpr uint64_t kSlabSize = 2 * uint64_t{wire::kMaxIoLength};
  static constexpr uint64_t kSlabs = 4;
  static constexpr ServerId kServer = 3;

  void SetUp() { build(LoopbackFaults{}); }
  void TearDown() {}

  Backend& transport() { return *transport_; }
  ServerId server() const { return kServer; }
  const std::vector<SlabDesc>& slabs() const { return slabs_; }
  void kill_server() { donor_->kill(); }
  ServerId unknown_server() const { return kServer + 1; }

  LoopbackDonor& donor() { return *donor_; }

 protected:
  void build(LoopbackFaults faults) {
    donor_ = std::make_unique<LoopbackDonor>(kSlabs * kSlabSize, kSlabSize);
    donor_->set_faults(std::move(faults));
    transport_ = std::make_unique<LoopbackTransport>();
    Status st = transport_->add_server(kServer, donor_.get());
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto lease = donor_->lease(2 * kSlabSize);
    ASSERT_TRUE(lease.ok()) << lease.status().to_string();
    slabs_ = *lease;
    for (const SlabDesc& s : slabs_) {
      st = transport_->add_slab(kServer, s);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  }

  // Destroyed in reverse: transport before the donor it points to.
  std::unique_ptr<LoopbackDonor> donor_;
  std::unique_ptr<LoopbackTransport> transport_;
  std::vector<SlabDesc> slabs_;
};

// The loopback backend with latency, jitter and reordering: the suite must
// not depend on completion order or timing.
struct LoopbackFaultyHarness : LoopbackHarness {
  static constexpr const char* kName = "loopback_faulty";
  void SetUp() { build(LoopbackFaults{.latency_us = 50, .jitter_us = 300, .reorder = true}); }
};

}  // namespace farmem::testing
