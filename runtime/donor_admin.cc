#include "runtime/donor_admin.h"

#include <cstring>

#include "runtime/auth.h"

namespace farmem {

using wire::MsgType;

Result<std::unique_ptr<DonorAdmin>> DonorAdmin::connect(const DonorAdminOptions& opts) {
  if (opts.server.port == 0)
    return make_error(Errc::kInvalidArgument, "donor address %s has no port: give HOST:PORT",
                      opts.server.to_string().c_str());
  std::unique_ptr<DonorAdmin> a(new DonorAdmin(opts));
  auto fd = tcp_connect(opts.server, opts.timeout_ms);
  if (!fd.ok()) return fd.status();
  FARMEM_RETURN_IF_ERROR(set_socket_timeouts(fd->get(), opts.timeout_ms, opts.timeout_ms));
  a->fd_ = std::move(*fd);

  const std::string donor = opts.server.to_string();
  uint64_t client_id = 0;
  while (client_id == 0) client_id = random_u64();
  std::vector<uint8_t> frame, payload;
  wire::Hello hello;
  hello.role = wire::Role::kControl;
  hello.client_id = client_id;
  wire::encode_hello(frame, 1, hello);
  FARMEM_RETURN_IF_ERROR(a->round_trip(frame, 1, MsgType::kChallenge, &payload));
  wire::Challenge ch;
  FARMEM_RETURN_IF_ERROR(wire::decode_challenge(payload, &ch)
                             .with_context("donor " + donor + " sent a bad CHALLENGE"));

  wire::Auth auth;
  if (!opts.token.empty())
    auth.mac = auth_mac({reinterpret_cast<const uint8_t*>(opts.token.data()), opts.token.size()},
                        ch.nonce, client_id);
  frame.clear();
  wire::encode_auth(frame, 2, auth);
  Status st = a->round_trip(frame, 2, MsgType::kWelcome, &payload);
  if (st.code() == Errc::kUnauthenticated)
    return make_error(Errc::kUnauthenticated,
                      opts.token.empty()
                          ? "donor %s requires a token and none was given: pass --token-file "
                            "with a copy of the donor's token file"
                          : "donor %s refused the token: the --token-file given does not match "
                            "the donor's --token-file",
                      donor.c_str());
  FARMEM_RETURN_IF_ERROR(st);
  FARMEM_RETURN_IF_ERROR(wire::decode_welcome(payload, &a->welcome_)
                             .with_context("donor " + donor + " sent a bad WELCOME"));
  a->next_tag_ = 3;
  return a;
}

Status DonorAdmin::round_trip(const std::vector<uint8_t>& frame, uint64_t tag, MsgType expect,
                              std::vector<uint8_t>* payload) {
  const std::string donor = opts_.server.to_string();
  const MsgType sent = static_cast<MsgType>(wire::get_u16(frame.data() + 4));
  auto lost = [&](Errc e, const char* doing) {
    if (e == Errc::kTimeout)
      return make_error(Errc::kTimeout, "donor %s did not answer %s within %d ms", donor.c_str(),
                        wire::msg_type_name(sent), opts_.timeout_ms);
    return make_error(Errc::kUnavailable,
                      "donor %s closed the connection while %s %s (is it a farmemd, and of this "
                      "version?)",
                      donor.c_str(), doing, wire::msg_type_name(sent));
  };
  Errc e = send_all(fd_.get(), frame.data(), frame.size());
  if (e != Errc::kOk) return lost(e, "sending");
  uint8_t raw[wire::kHeaderSize];
  e = recv_all(fd_.get(), raw, sizeof raw);
  if (e != Errc::kOk) return lost(e, "waiting for the reply to");
  wire::Header h;
  const char* why = "";
  if (wire::decode_header(raw, &h, &why) != Errc::kOk)
    return make_error(Errc::kProtocol, "donor %s sent a malformed frame in reply to %s: %s",
                      donor.c_str(), wire::msg_type_name(sent), why);
  payload->resize(h.payload_len);
  if (h.payload_len > 0) {
    e = recv_all(fd_.get(), payload->data(), h.payload_len);
    if (e != Errc::kOk) return lost(e, "receiving the reply to");
  }
  if (h.type == MsgType::kError) {
    wire::ErrorMsg m;
    FARMEM_RETURN_IF_ERROR(wire::decode_error(*payload, &m));
    return Status(m.code, "donor " + donor + ": " + m.message);
  }
  if (h.type != expect || h.tag != tag)
    return make_error(Errc::kProtocol, "donor %s answered %s with %s (tag %llu), expected %s",
                      donor.c_str(), wire::msg_type_name(sent), wire::msg_type_name(h.type),
                      static_cast<unsigned long long>(h.tag), wire::msg_type_name(expect));
  return ok_status();
}

Result<wire::StatsReply> DonorAdmin::stats() {
  std::vector<uint8_t> frame, payload;
  uint64_t tag = next_tag_++;
  wire::encode_empty(frame, MsgType::kStats, tag);
  FARMEM_RETURN_IF_ERROR(round_trip(frame, tag, MsgType::kStatsReply, &payload));
  wire::StatsReply r;
  FARMEM_RETURN_IF_ERROR(wire::decode_stats_reply(payload, &r));
  return r;
}

Result<std::vector<wire::ClientInfo>> DonorAdmin::clients() {
  std::vector<wire::ClientInfo> all;
  uint64_t after = 0;
  // Bounded: a donor serves at most 2^20 clients (farmemd --max-clients).
  for (int page = 0; page < (1 << 20) / static_cast<int>(wire::kMaxClientsPerReply) + 2; ++page) {
    std::vector<uint8_t> frame, payload;
    uint64_t tag = next_tag_++;
    wire::encode_clients(frame, tag, wire::ClientsReq{after});
    Status st = round_trip(frame, tag, MsgType::kClientsReply, &payload);
    if (st.code() == Errc::kProtocol &&
        st.message().find("CLIENTS is not allowed") != std::string::npos)
      return make_error(Errc::kVersionMismatch,
                        "donor %s does not know CLIENTS: it is an older farmemd; upgrade it",
                        opts_.server.to_string().c_str());
    FARMEM_RETURN_IF_ERROR(st);
    wire::ClientsReply r;
    FARMEM_RETURN_IF_ERROR(wire::decode_clients_reply(payload, &r));
    // decode_clients_reply checked: ascending ids, and a page saying more
    // follow is not empty.
    if (!r.clients.empty()) after = r.clients.back().session_id;
    for (auto& c : r.clients)
      if (c.session_id != welcome_.session_id) all.push_back(std::move(c));
    if (!r.more) return all;
  }
  return make_error(Errc::kProtocol, "donor %s keeps saying more clients follow: giving up",
                    opts_.server.to_string().c_str());
}

}  // namespace farmem
