// DonorAdmin: an operator's read-only control session to one farmemd, for
// `farmemctl status`: STATS totals and the per-client list (CLIENTS).
//
//   farmem::DonorAdminOptions o;
//   o.server = {"10.0.0.5", 7400};
//   o.token = *farmem::read_token_file("/etc/farmem/token");
//   auto a = farmem::DonorAdmin::connect(o);     // HELLO, CHALLENGE, AUTH, WELCOME
//   if (!a.ok()) { fprintf(stderr, "%s\n", a.status().to_string().c_str()); return 1; }
//   auto totals = (*a)->stats();                 // wire::StatsReply
//   auto list = (*a)->clients();                 // every session, this one excluded
//
// It is an ordinary control session (the donor counts it among its clients
// while it is open) that leases nothing and sends no heartbeats: use it for
// a few requests, then drop it. Only token holders get one, so only they can
// see who else uses the donor. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/net.h"
#include "runtime/parse.h"
#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem {

struct DonorAdminOptions {
  Endpoint server;
  std::string token;      // empty: an all-zero MAC (only --insecure donors accept it)
  int timeout_ms = 5000;  // connect and each round trip
};

class DonorAdmin {
 public:
  // kUnavailable/kTimeout: the donor cannot be reached; kUnauthenticated:
  // it refused the token.
  static Result<std::unique_ptr<DonorAdmin>> connect(const DonorAdminOptions& opts);

  Result<wire::StatsReply> stats();
  // All live sessions, page by page, ascending by session id, without this
  // admin session itself.
  Result<std::vector<wire::ClientInfo>> clients();
  const wire::Welcome& welcome() const { return welcome_; }

 private:
  explicit DonorAdmin(const DonorAdminOptions& o) : opts_(o) {}
  // Sends `frame` and receives the reply of type `expect` (or turns an
  // ERROR into a Status).
  Status round_trip(const std::vector<uint8_t>& frame, uint64_t tag, wire::MsgType expect,
                    std::vector<uint8_t>* payload);

  DonorAdminOptions opts_;
  Fd fd_;
  wire::Welcome welcome_{};
  uint64_t next_tag_ = 1;
};

}  // namespace farmem
