#include "runtime/wire.h"

#include <algorithm>

namespace farmem::wire {
namespace {

// Payload size rule per type: exact size, or an upper bound (kVariable).
struct SizeRule {
  uint32_t size;
  bool exact;
};

SizeRule size_rule(MsgType t) noexcept {
  switch (t) {
    case MsgType::kHello:
      return {16, true};
    case MsgType::kChallenge:
      return {48, true};
    case MsgType::kAuth:
      return {32, true};
    case MsgType::kAttach:
      return {40, true};
    case MsgType::kWelcome:
      return {80, true};
    case MsgType::kAttached:
      return {0, true};
    case MsgType::kLease:
      return {8, true};
    case MsgType::kLeased:
      return {8 + kMaxSlabsPerLease * kSlabDescSize, false};
    case MsgType::kRelease:
      return {8, true};
    case MsgType::kReleased:
      return {0, true};
    case MsgType::kHeartbeat:
      return {0, true};
    case MsgType::kHeartbeatAck:
      return {0, true};
    case MsgType::kStats:
      return {0, true};
    case MsgType::kStatsReply:
      return {kStatsFields * 8, true};
    case MsgType::kRead:
      return {kIoReqSize, true};
    case MsgType::kReadData:
      return {kMaxIoLength, false};
    case MsgType::kWrite:
      return {kIoReqSize + kMaxIoLength, false};
    case MsgType::kWritten:
      return {0, true};
    case MsgType::kError:
      return {4 + kMaxErrorMessage, false};
    case MsgType::kClients:
      return {8, true};
    case MsgType::kClientsReply:
      return {8 + kMaxClientsPerReply * kClientInfoSize, false};
  }
  return {0, true};
}

uint8_t* grow(std::vector<uint8_t>& out, size_t n) {
  size_t old = out.size();
  out.resize(old + n);
  return out.data() + old;
}

uint8_t* begin_frame(std::vector<uint8_t>& out, MsgType type, uint64_t tag, uint32_t len) {
  uint8_t* p = grow(out, kHeaderSize + len);
  encode_frame_header(p, type, tag, len);
  std::memset(p + kHeaderSize, 0, len);
  return p + kHeaderSize;
}

Status need_size(std::span<const uint8_t> p, size_t n, const char* what) {
  if (p.size() != n)
    return make_error(Errc::kProtocol, "%s payload is %zu bytes, expected %zu", what, p.size(), n);
  return ok_status();
}

}  // namespace

const char* msg_type_name(MsgType t) noexcept {
  switch (t) {
    case MsgType::kHello:
      return "HELLO";
    case MsgType::kChallenge:
      return "CHALLENGE";
    case MsgType::kAuth:
      return "AUTH";
    case MsgType::kAttach:
      return "ATTACH";
    case MsgType::kWelcome:
      return "WELCOME";
    case MsgType::kAttached:
      return "ATTACHED";
    case MsgType::kLease:
      return "LEASE";
    case MsgType::kLeased:
      return "LEASED";
    case MsgType::kRelease:
      return "RELEASE";
    case MsgType::kReleased:
      return "RELEASED";
    case MsgType::kHeartbeat:
      return "HEARTBEAT";
    case MsgType::kHeartbeatAck:
      return "HEARTBEAT_ACK";
    case MsgType::kStats:
      return "STATS";
    case MsgType::kStatsReply:
      return "STATS_REPLY";
    case MsgType::kRead:
      return "READ";
    case MsgType::kReadData:
      return "READ_DATA";
    case MsgType::kWrite:
      return "WRITE";
    case MsgType::kWritten:
      return "WRITTEN";
    case MsgType::kError:
      return "ERROR";
    case MsgType::kClients:
      return "CLIENTS";
    case MsgType::kClientsReply:
      return "CLIENTS_REPLY";
  }
  return "UNKNOWN";
}

uint32_t max_payload(MsgType t) noexcept {
  return size_rule(t).size;
}

void encode_frame_header(uint8_t* out, MsgType type, uint64_t tag, uint32_t payload_len) noexcept {
  put_u32(out, payload_len);
  put_u16(out + 4, static_cast<uint16_t>(type));
  put_u16(out + 6, 0);
  put_u64(out + 8, tag);
}

void encode_header(const Header& h, uint8_t* out) noexcept {
  put_u32(out, h.payload_len);
  put_u16(out + 4, static_cast<uint16_t>(h.type));
  put_u16(out + 6, h.flags);
  put_u64(out + 8, h.tag);
}

Errc decode_header(const uint8_t* in, Header* out, const char** why) noexcept {
  const char* dummy;
  if (why == nullptr) why = &dummy;
  uint32_t len = get_u32(in);
  uint16_t type = get_u16(in + 4);
  uint16_t flags = get_u16(in + 6);
  if (type == 0 || type > kMaxMsgType) {
    *why = "unknown message type";
    return Errc::kProtocol;
  }
  if (flags != 0) {
    *why = "non-zero flags in frame header";
    return Errc::kProtocol;
  }
  SizeRule r = size_rule(static_cast<MsgType>(type));
  if (r.exact ? len != r.size : len > r.size) {
    *why = r.exact ? "payload length does not match the message type"
                   : "payload length exceeds the maximum for the message type";
    return Errc::kProtocol;
  }
  out->payload_len = len;
  out->type = static_cast<MsgType>(type);
  out->flags = flags;
  out->tag = get_u64(in + 8);
  return Errc::kOk;
}

void encode_hello(std::vector<uint8_t>& out, uint64_t tag, const Hello& m) {
  uint8_t* p = begin_frame(out, MsgType::kHello, tag, 16);
  put_u32(p, m.magic);
  put_u16(p + 4, m.version);
  p[6] = static_cast<uint8_t>(m.role);
  put_u64(p + 8, m.client_id);
}

void encode_challenge(std::vector<uint8_t>& out, uint64_t tag, const Challenge& m) {
  uint8_t* p = begin_frame(out, MsgType::kChallenge, tag, 48);
  put_u16(p, m.version);
  put_u32(p + 4, m.flags);
  put_u64(p + 8, m.instance_id);
  std::memcpy(p + 16, m.nonce.data(), kNonceSize);
}

void encode_auth(std::vector<uint8_t>& out, uint64_t tag, const Auth& m) {
  uint8_t* p = begin_frame(out, MsgType::kAuth, tag, 32);
  std::memcpy(p, m.mac.data(), kMacSize);
}

void encode_attach(std::vector<uint8_t>& out, uint64_t tag, const Attach& m) {
  uint8_t* p = begin_frame(out, MsgType::kAttach, tag, 40);
  put_u64(p, m.session_id);
  std::memcpy(p + 8, m.mac.data(), kMacSize);
}

void encode_welcome(std::vector<uint8_t>& out, uint64_t tag, const Welcome& m) {
  uint8_t* p = begin_frame(out, MsgType::kWelcome, tag, 80);
  put_u64(p, m.session_id);
  std::memcpy(p + 8, m.secret.data(), kSecretSize);
  put_u64(p + 40, m.capacity);
  put_u64(p + 48, m.slab_size);
  put_u64(p + 56, m.quota);
  put_u32(p + 64, m.heartbeat_ms);
  put_u32(p + 68, m.grace_ms);
  put_u64(p + 72, m.instance_id);
}

void encode_lease(std::vector<uint8_t>& out, uint64_t tag, const LeaseReq& m) {
  uint8_t* p = begin_frame(out, MsgType::kLease, tag, 8);
  put_u64(p, m.bytes);
}

void encode_leased(std::vector<uint8_t>& out, uint64_t tag, const Leased& m) {
  size_t n = m.slabs.size() > kMaxSlabsPerLease ? kMaxSlabsPerLease : m.slabs.size();
  uint8_t* p =
      begin_frame(out, MsgType::kLeased, tag, static_cast<uint32_t>(8 + n * kSlabDescSize));
  put_u32(p, static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) {
    uint8_t* d = p + 8 + i * kSlabDescSize;
    put_u32(d, m.slabs[i].slab);
    put_u32(d + 4, m.slabs[i].rkey);
    put_u64(d + 8, m.slabs[i].size);
    put_u64(d + 16, m.slabs[i].addr);
  }
}

void encode_release(std::vector<uint8_t>& out, uint64_t tag, const ReleaseReq& m) {
  uint8_t* p = begin_frame(out, MsgType::kRelease, tag, 8);
  put_u32(p, m.slab);
}

void encode_stats_reply(std::vector<uint8_t>& out, uint64_t tag, const StatsReply& m) {
  uint8_t* p = begin_frame(out, MsgType::kStatsReply, tag, kStatsFields * 8);
  const uint64_t fields[kStatsFields] = {
      m.capacity,      m.leased, m.slab_size, m.clients, m.connections,      m.bytes_read,
      m.bytes_written, m.reads,  m.writes,    m.errors,  m.sessions_expired, m.instance_id};
  for (size_t i = 0; i < kStatsFields; ++i) put_u64(p + 8 * i, fields[i]);
}

void encode_io_req(std::vector<uint8_t>& out, MsgType type, uint64_t tag, const IoReq& m,
                   const void* write_data) {
  uint32_t extra = type == MsgType::kWrite && write_data != nullptr ? m.length : 0;
  uint8_t* p = begin_frame(out, type, tag, static_cast<uint32_t>(kIoReqSize) + extra);
  put_u32(p, m.slab);
  put_u32(p + 4, m.length);
  put_u64(p + 8, m.offset);
  if (extra) std::memcpy(p + kIoReqSize, write_data, extra);
}

void encode_error(std::vector<uint8_t>& out, uint64_t tag, Errc code, std::string_view message) {
  if (message.size() > kMaxErrorMessage) message = message.substr(0, kMaxErrorMessage);
  uint8_t* p = begin_frame(out, MsgType::kError, tag, static_cast<uint32_t>(4 + message.size()));
  put_u16(p, static_cast<uint16_t>(code));
  std::memcpy(p + 4, message.data(), message.size());
}

void encode_clients(std::vector<uint8_t>& out, uint64_t tag, const ClientsReq& m) {
  uint8_t* p = begin_frame(out, MsgType::kClients, tag, 8);
  put_u64(p, m.after_session);
}

void encode_clients_reply(std::vector<uint8_t>& out, uint64_t tag, const ClientsReply& m) {
  size_t n = std::min<size_t>(m.clients.size(), kMaxClientsPerReply);
  uint8_t* p =
      begin_frame(out, MsgType::kClientsReply, tag, static_cast<uint32_t>(8 + n * kClientInfoSize));
  put_u32(p, m.total);
  put_u16(p + 4, static_cast<uint16_t>(n));
  p[6] = m.more ? 1 : 0;
  for (size_t i = 0; i < n; ++i) {
    const ClientInfo& c = m.clients[i];
    uint8_t* d = p + 8 + i * kClientInfoSize;
    put_u64(d, c.session_id);
    put_u64(d + 8, c.client_id);
    put_u64(d + 16, c.leased);
    put_u64(d + 24, c.bytes_read);
    put_u64(d + 32, c.bytes_written);
    put_u64(d + 40, c.reads);
    put_u64(d + 48, c.writes);
    put_u64(d + 56, c.age_ms);
    put_u32(d + 64, c.data_conns);
    put_u32(d + 68, c.idle_ms);
    size_t len = std::min(c.peer.size(), kMaxPeerName);
    put_u16(d + 72, static_cast<uint16_t>(len));
    std::memcpy(d + 80, c.peer.data(), len);
  }
}

void encode_empty(std::vector<uint8_t>& out, MsgType type, uint64_t tag) {
  begin_frame(out, type, tag, 0);
}

Status decode_hello(std::span<const uint8_t> p, Hello* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, 16, "HELLO"));
  m->magic = get_u32(p.data());
  if (m->magic != kMagic)
    return make_error(Errc::kProtocol,
                      "HELLO magic is 0x%08x, expected 0x%08x: not a farmem client", m->magic,
                      kMagic);
  m->version = get_u16(p.data() + 4);
  if (m->version != kVersion)
    return make_error(Errc::kVersionMismatch,
                      "client speaks protocol version %u, this server speaks %u: upgrade the "
                      "older side",
                      m->version, kVersion);
  uint8_t role = p[6];
  if (role != static_cast<uint8_t>(Role::kControl) && role != static_cast<uint8_t>(Role::kData))
    return make_error(Errc::kInvalidArgument, "HELLO role %u is neither control (1) nor data (2)",
                      role);
  m->role = static_cast<Role>(role);
  m->client_id = get_u64(p.data() + 8);
  return ok_status();
}

Status decode_challenge(std::span<const uint8_t> p, Challenge* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, 48, "CHALLENGE"));
  m->version = get_u16(p.data());
  if (m->version != kVersion)
    return make_error(Errc::kVersionMismatch,
                      "server speaks protocol version %u, this client speaks %u: upgrade the "
                      "older side",
                      m->version, kVersion);
  m->flags = get_u32(p.data() + 4);
  m->instance_id = get_u64(p.data() + 8);
  std::memcpy(m->nonce.data(), p.data() + 16, kNonceSize);
  return ok_status();
}

Status decode_auth(std::span<const uint8_t> p, Auth* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, 32, "AUTH"));
  std::memcpy(m->mac.data(), p.data(), kMacSize);
  return ok_status();
}

Status decode_attach(std::span<const uint8_t> p, Attach* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, 40, "ATTACH"));
  m->session_id = get_u64(p.data());
  std::memcpy(m->mac.data(), p.data() + 8, kMacSize);
  return ok_status();
}

Status decode_welcome(std::span<const uint8_t> p, Welcome* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, 80, "WELCOME"));
  m->session_id = get_u64(p.data());
  std::memcpy(m->secret.data(), p.data() + 8, kSecretSize);
  m->capacity = get_u64(p.data() + 40);
  m->slab_size = get_u64(p.data() + 48);
  m->quota = get_u64(p.data() + 56);
  m->heartbeat_ms = get_u32(p.data() + 64);
  m->grace_ms = get_u32(p.data() + 68);
  m->instance_id = get_u64(p.data() + 72);
  if (m->slab_size == 0) return make_error(Errc::kProtocol, "WELCOME slab_size is 0");
  if (m->heartbeat_ms == 0) return make_error(Errc::kProtocol, "WELCOME heartbeat_ms is 0");
  return ok_status();
}

Status decode_lease(std::span<const uint8_t> p, LeaseReq* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, 8, "LEASE"));
  m->bytes = get_u64(p.data());
  if (m->bytes == 0) return make_error(Errc::kInvalidArgument, "LEASE of 0 bytes");
  return ok_status();
}

Status decode_leased(std::span<const uint8_t> p, Leased* m) {
  if (p.size() < 8) return make_error(Errc::kProtocol, "LEASED payload of %zu bytes", p.size());
  uint32_t n = get_u32(p.data());
  if (n > kMaxSlabsPerLease)
    return make_error(Errc::kProtocol, "LEASED lists %u slabs, at most %u allowed", n,
                      kMaxSlabsPerLease);
  FARMEM_RETURN_IF_ERROR(need_size(p, 8 + size_t{n} * kSlabDescSize, "LEASED"));
  m->slabs.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* d = p.data() + 8 + size_t{i} * kSlabDescSize;
    m->slabs[i].slab = get_u32(d);
    m->slabs[i].rkey = get_u32(d + 4);
    m->slabs[i].size = get_u64(d + 8);
    m->slabs[i].addr = get_u64(d + 16);
    if (m->slabs[i].size == 0) return make_error(Errc::kProtocol, "LEASED slab %u has size 0", i);
  }
  return ok_status();
}

Status decode_release(std::span<const uint8_t> p, ReleaseReq* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, 8, "RELEASE"));
  m->slab = get_u32(p.data());
  return ok_status();
}

Status decode_stats_reply(std::span<const uint8_t> p, StatsReply* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, kStatsFields * 8, "STATS_REPLY"));
  uint64_t f[kStatsFields];
  for (size_t i = 0; i < kStatsFields; ++i) f[i] = get_u64(p.data() + 8 * i);
  *m = StatsReply{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]};
  return ok_status();
}

Status decode_io_req(std::span<const uint8_t> p, IoReq* m) {
  if (p.size() < kIoReqSize)
    return make_error(Errc::kProtocol, "READ/WRITE payload of %zu bytes, at least %zu needed",
                      p.size(), kIoReqSize);
  m->slab = get_u32(p.data());
  m->length = get_u32(p.data() + 4);
  m->offset = get_u64(p.data() + 8);
  if (m->length == 0) return make_error(Errc::kInvalidArgument, "READ/WRITE of 0 bytes");
  if (m->length > kMaxIoLength)
    return make_error(Errc::kInvalidArgument, "READ/WRITE of %u bytes, at most %u allowed",
                      m->length, kMaxIoLength);
  return ok_status();
}

Status decode_error(std::span<const uint8_t> p, ErrorMsg* m) {
  if (p.size() < 4 || p.size() > 4 + kMaxErrorMessage)
    return make_error(Errc::kProtocol, "ERROR payload of %zu bytes", p.size());
  uint16_t code = get_u16(p.data());
  m->code = code == 0 || code > static_cast<uint16_t>(Errc::kCancelled) ? Errc::kInternal
                                                                        : static_cast<Errc>(code);
  m->message.assign(reinterpret_cast<const char*>(p.data() + 4), p.size() - 4);
  return ok_status();
}

Status decode_clients(std::span<const uint8_t> p, ClientsReq* m) {
  FARMEM_RETURN_IF_ERROR(need_size(p, 8, "CLIENTS"));
  m->after_session = get_u64(p.data());
  return ok_status();
}

Status decode_clients_reply(std::span<const uint8_t> p, ClientsReply* m) {
  if (p.size() < 8)
    return make_error(Errc::kProtocol, "CLIENTS_REPLY payload of %zu bytes, at least 8 needed",
                      p.size());
  m->total = get_u32(p.data());
  uint16_t n = get_u16(p.data() + 4);
  uint8_t more = p[6];
  if (n > kMaxClientsPerReply)
    return make_error(Errc::kProtocol, "CLIENTS_REPLY lists %u clients, at most %u allowed", n,
                      kMaxClientsPerReply);
  FARMEM_RETURN_IF_ERROR(need_size(p, 8 + size_t{n} * kClientInfoSize, "CLIENTS_REPLY"));
  if (more > 1)
    return make_error(Errc::kProtocol, "CLIENTS_REPLY more flag is %u, expected 0 or 1", more);
  if (more == 1 && n == 0)
    return make_error(Errc::kProtocol,
                      "CLIENTS_REPLY says more follow but lists none: the next page cannot be "
                      "asked for");
  m->more = more == 1;
  m->clients.resize(n);
  uint64_t prev = 0;
  for (uint16_t i = 0; i < n; ++i) {
    const uint8_t* d = p.data() + 8 + size_t{i} * kClientInfoSize;
    ClientInfo& c = m->clients[i];
    c.session_id = get_u64(d);
    if (c.session_id <= prev)
      return make_error(Errc::kProtocol,
                        "CLIENTS_REPLY entry %u: session ids must be non-zero and ascending", i);
    prev = c.session_id;
    c.client_id = get_u64(d + 8);
    c.leased = get_u64(d + 16);
    c.bytes_read = get_u64(d + 24);
    c.bytes_written = get_u64(d + 32);
    c.reads = get_u64(d + 40);
    c.writes = get_u64(d + 48);
    c.age_ms = get_u64(d + 56);
    c.data_conns = get_u32(d + 64);
    c.idle_ms = get_u32(d + 68);
    uint16_t len = get_u16(d + 72);
    if (len > kMaxPeerName)
      return make_error(Errc::kProtocol,
                        "CLIENTS_REPLY entry %u: peer name of %u bytes, at most %zu", i, len,
                        kMaxPeerName);
    c.peer.assign(reinterpret_cast<const char*>(d + 80), len);
  }
  return ok_status();
}

void FrameParser::feed(std::span<const uint8_t> bytes) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > 65536) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

Errc FrameParser::next(Frame* f, const char** why) {
  if (broken_) {
    if (why) *why = "stream already failed";
    return Errc::kProtocol;
  }
  if (buf_.size() - pos_ < kHeaderSize) return Errc::kNotFound;
  Header h;
  Errc e = decode_header(buf_.data() + pos_, &h, why);
  if (e != Errc::kOk) {
    broken_ = true;
    return e;
  }
  if (buf_.size() - pos_ - kHeaderSize < h.payload_len) return Errc::kNotFound;
  f->header = h;
  f->payload = std::span<const uint8_t>(buf_.data() + pos_ + kHeaderSize, h.payload_len);
  pos_ += kHeaderSize + h.payload_len;
  return Errc::kOk;
}

}  // namespace farmem::wire
