// VerbsDonor: farmemd's verbs side. An rdma_cm listener that accepts RC
// queue pairs of authenticated sessions only, and a SlabRegistrar that
// confines each session to its own slabs.
//
//   farmem::VerbsDonor::Hooks h;
//   h.session_secret = [&](uint64_t id, farmem::VerbsDonor::Secret* s) { ...; return found; };
//   auto v = farmem::VerbsDonor::create(std::move(h));     // before the SlabPool
//   po.registrar = v->get();                               // SlabPoolOptions
//   ... tcp_listen ...
//   (void)(*v)->listen({"10.0.0.1", tcp_port});            // same port number, RDMA_PS_TCP
//   ... on session end: (*v)->session_ended(id);  on shutdown: (*v)->stop();
//
// Isolation (invariant 7): every session gets its own protection domain.
// Each slab leased to it is registered once, at lease time, as a memory
// region in that PD with REMOTE_READ | REMOTE_WRITE (describe() hands its
// rkey and address out in LEASED) and deregistered when the slab leaves the
// session (forget()), before the pool zeroes it. The session's QPs are
// created in the same PD, so the hardware refuses (IBV_WC_REM_ACCESS_ERR on
// the requester) any rkey of another session, and any range outside the
// session's own MRs. The daemon's CPU takes part only in connection set-up
// and leases: nothing per page.
//
// Connection admission (wire format in runtime/verbs_transport.h): the
// connect request's private data names a live session and proves its
// secret with a MAC over a fresh nonce; a replayed nonce, an unknown
// session, a bad proof or too many QPs for the session is rejected with the
// reason in the reject's private data.
//
// A session's resources:
//
//   event                          | effect
//   -------------------------------+---------------------------------------------
//   first describe() or connect    | PD allocated
//   describe(owner, slab)          | MR over the slab in the owner's PD
//   forget(owner, slab)            | that MR deregistered
//   CONNECT_REQUEST accepted       | QP in the owner's PD, rdma_accept
//   DISCONNECTED / error           | QP and id destroyed
//   session_ended(id)              | every QP of it disconnected (flushes the
//                                  | client's ops); PD freed once no QP/MR is left
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "runtime/parse.h"
#include "runtime/slab_pool.h"
#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem {

class VerbsDonor final : public SlabRegistrar {
 public:
  using Secret = std::array<uint8_t, wire::kSecretSize>;
  struct Hooks {
    // Fills the secret of a live session; false when there is none. Called
    // from the rdma_cm thread without VerbsDonor's lock held.
    std::function<bool(uint64_t session, Secret* secret)> session_secret;
    uint32_t max_qps_per_session = 64;
  };

  static Result<std::unique_ptr<VerbsDonor>> create(Hooks hooks);
  ~VerbsDonor() override;  // stop()
  VerbsDonor(const VerbsDonor&) = delete;
  VerbsDonor& operator=(const VerbsDonor&) = delete;

  // Binds the rdma_cm listener to ep (the control endpoint's address and
  // port number) and starts the event thread. kUnavailable when no RDMA
  // device owns that address.
  Status listen(const Endpoint& ep, uint64_t instance_id);
  // Disconnects every QP and frees every verbs resource. Idempotent.
  void stop() noexcept;
  // Disconnects the session's QPs; its MRs go with forget().
  void session_ended(uint64_t session) noexcept;

  const char* device_name() const;
  uint64_t qps_accepted() const { return accepted_.load(); }
  uint64_t qps_refused() const { return refused_.load(); }

  // SlabRegistrar.
  Status register_region(uint8_t* base, uint64_t length) override;
  Status describe(LeaseOwner owner, wire::SlabDesc* desc, uint8_t* addr) override;
  void forget(LeaseOwner owner, uint32_t slab) noexcept override;
  bool pins_pages() const noexcept override { return true; }

 private:
  struct Client {
    ibv_pd* pd = nullptr;
    std::map<uint32_t, ibv_mr*> mrs;  // slab -> MR
    std::set<rdma_cm_id*> qps;
    std::set<uint64_t> nonces;  // seen in connect requests
    bool ended = false;
  };

  explicit VerbsDonor(Hooks hooks);
  void event_loop();
  void on_connect_request(rdma_cm_event* ev);
  void drop_id(rdma_cm_id* id);  // with mu_ held
  Client* client_locked(uint64_t owner, Status* st);
  void maybe_free_locked(uint64_t owner);
  void reject(rdma_cm_id* id, Errc code, const Status& why);

  const Hooks hooks_;
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_cq* cq_ = nullptr;  // shared by every donor QP; never polled: the donor posts nothing
  uint32_t max_rd_atom_ = 0;
  uint8_t* base_ = nullptr;
  uint64_t length_ = 0;
  std::atomic<uint64_t> instance_id_{0};
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;  // guarded by mu_

  mutable std::mutex mu_;
  std::map<uint64_t, Client> clients_;        // guarded by mu_
  std::map<rdma_cm_id*, uint64_t> id_owner_;  // guarded by mu_
  std::atomic<uint64_t> accepted_{0}, refused_{0};
};

}  // namespace farmem
