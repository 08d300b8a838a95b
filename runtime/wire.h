// The farmem wire protocol: control plane and tcp data plane.
//
// Every message is one frame: a fixed 16-byte header and a payload. All
// integers are little-endian. One TCP connection carries frames in both
// directions; a reply echoes the tag of its request, and a server answers
// the requests of one connection in order, so a client may pipeline.
//
//   byte 0               4        6        8                        16
//        +---------------+--------+--------+------------------------+
//        | payload_len   | type   | flags  | tag                    |
//        | u32           | u16    | u16=0  | u64, echoed in reply   |
//        +---------------+--------+--------+------------------------+
//        | payload: payload_len bytes, layout per type below        |
//
// A connection starts with a handshake, then carries requests:
//
//   client                          server
//   HELLO(role=control) ──────────▶
//                       ◀────────── CHALLENGE(nonce, instance id)
//   AUTH(hmac) ───────────────────▶            (token holders only)
//                       ◀────────── WELCOME(session id + secret, limits)
//   LEASE / RELEASE / HEARTBEAT / STATS / CLIENTS ...
//
//   HELLO(role=data) ─────────────▶
//                       ◀────────── CHALLENGE(nonce, instance id)
//   ATTACH(session, hmac) ────────▶            (holders of a session secret)
//                       ◀────────── ATTACHED
//   READ / WRITE ... (pipelined)
//
// Payloads (offsets in bytes; "pad" is zero on send and ignored on receipt):
//
//   HELLO      0 magic u32 'FMEM' | 4 version u16 | 6 role u8 | 7 pad u8 |
//              8 client_id u64                                   = 16
//   CHALLENGE  0 version u16 | 2 pad u16 | 4 flags u32 | 8 instance_id u64 |
//              16 nonce[32]                                      = 48
//   AUTH       0 hmac[32]: HMAC-SHA256(token,
//                          "farmem-auth-v1" | nonce | client_id u64)  = 32
//   ATTACH     0 session_id u64 | 8 hmac[32]: HMAC-SHA256(session_secret,
//                          "farmem-attach-v1" | nonce)            = 40
//   WELCOME    0 session_id u64 | 8 secret[32] | 40 capacity u64 |
//              48 slab_size u64 | 56 quota u64 | 64 heartbeat_ms u32 |
//              68 grace_ms u32 | 72 instance_id u64               = 80
//   ATTACHED   (empty)
//   LEASE      0 bytes u64                                       = 8
//   LEASED     0 count u32 | 4 pad u32 | 8 count x SlabDesc       = 8 + 24n
//              SlabDesc: 0 slab u32 | 4 rkey u32 | 8 size u64 | 16 addr u64
//   RELEASE    0 slab u32 | 4 pad u32                            = 8
//   RELEASED   (empty)
//   HEARTBEAT  (empty)            HEARTBEAT_ACK (empty)
//   STATS      (empty)            STATS_REPLY   kStatsFields x u64
//   READ       0 slab u32 | 4 length u32 | 8 offset u64          = 16
//   READ_DATA  length bytes
//   WRITE      0 slab u32 | 4 length u32 | 8 offset u64 | 16 data = 16 + length
//   WRITTEN    (empty)
//   ERROR      0 code u16 (farmem::Errc) | 2 pad u16 | 4 message (UTF-8,
//              at most kMaxErrorMessage bytes, no terminator)
//   CLIENTS    0 after_session u64                               = 8
//              (control connections only: token holders; lists the
//              sessions whose id is above after_session, ascending)
//   CLIENTS_REPLY
//              0 total u32 | 4 count u16 | 6 more u8 | 7 pad u8 |
//              8 count x ClientInfo                     = 8 + 128n, n <= 30
//              total: sessions alive now; more = 1: ask again with
//              after_session = the last listed session id
//              ClientInfo:
//              0 session_id u64 | 8 client_id u64 | 16 leased u64 |
//              24 bytes_read u64 | 32 bytes_written u64 | 40 reads u64 |
//              48 writes u64 | 56 age_ms u64 (since the session opened) |
//              64 data_conns u32 | 68 idle_ms u32 (since the last control
//              frame) | 72 peer_len u16 | 74 pad[6] | 80 peer[48] (UTF-8
//              "host:port", peer_len bytes used, rest zero)    = 128
//
// Validation: a header whose type is unknown, whose flags are non-zero or
// whose payload_len is not allowed for its type is a protocol error and the
// receiver closes the connection after (server side) an ERROR frame.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace farmem::wire {

inline constexpr uint32_t kMagic = 0x4D454D46;  // "FMEM" in memory order
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderSize = 16;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;
inline constexpr size_t kSecretSize = 32;
// Largest READ or WRITE: the pager fetches blocks of up to 2 MiB.
inline constexpr uint32_t kMaxIoLength = 2u << 20;
// Largest payload of any control frame.
inline constexpr uint32_t kMaxControlPayload = 4096;
inline constexpr uint32_t kMaxErrorMessage = 1024;
inline constexpr uint32_t kMaxSlabsPerLease = 128;
// CHALLENGE flags: what the donor serves besides the tcp data path.
// kChallengeVerbs: an rdma_cm listener on the control port's number (the
// verbs data path); clients choosing FARMEM_TRANSPORT=auto need it.
inline constexpr uint32_t kChallengeVerbs = 1u << 0;
inline constexpr size_t kSlabDescSize = 24;
static_assert(8 + kMaxSlabsPerLease * kSlabDescSize <= kMaxControlPayload);

enum class MsgType : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kAuth = 3,
  kAttach = 4,
  kWelcome = 5,
  kAttached = 6,
  kLease = 7,
  kLeased = 8,
  kRelease = 9,
  kReleased = 10,
  kHeartbeat = 11,
  kHeartbeatAck = 12,
  kStats = 13,
  kStatsReply = 14,
  kRead = 15,
  kReadData = 16,
  kWrite = 17,
  kWritten = 18,
  kError = 19,
  kClients = 20,
  kClientsReply = 21,
};
inline constexpr uint16_t kMaxMsgType = 21;

const char* msg_type_name(MsgType t) noexcept;

enum class Role : uint8_t { kControl = 1, kData = 2 };

struct Header {
  uint32_t payload_len = 0;
  MsgType type = MsgType::kError;
  uint16_t flags = 0;
  uint64_t tag = 0;
};

// Encodes a header into exactly kHeaderSize bytes.
void encode_header(const Header& h, uint8_t* out) noexcept;
// Decodes and validates a header: known type, zero flags, payload_len
// allowed for the type (exact for fixed-size messages, bounded otherwise).
// On failure returns kProtocol and, when `why` is non-null, a static
// description of the problem.
Errc decode_header(const uint8_t* in, Header* out, const char** why = nullptr) noexcept;
// The largest payload_len a frame of this type may carry.
uint32_t max_payload(MsgType t) noexcept;

// ---- Message bodies -------------------------------------------------------

struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  Role role = Role::kControl;
  uint64_t client_id = 0;
};
struct Challenge {
  uint16_t version = kVersion;
  uint32_t flags = 0;
  uint64_t instance_id = 0;
  std::array<uint8_t, kNonceSize> nonce{};
};
struct Auth {
  std::array<uint8_t, kMacSize> mac{};
};
struct Attach {
  uint64_t session_id = 0;
  std::array<uint8_t, kMacSize> mac{};
};
struct Welcome {
  uint64_t session_id = 0;
  std::array<uint8_t, kSecretSize> secret{};
  uint64_t capacity = 0;
  uint64_t slab_size = 0;
  uint64_t quota = 0;
  uint32_t heartbeat_ms = 0;
  uint32_t grace_ms = 0;
  uint64_t instance_id = 0;
};
struct LeaseReq {
  uint64_t bytes = 0;
};
struct SlabDesc {
  uint32_t slab = 0;
  // verbs: remote key of the slab's memory region; tcp: 0, or for a client
  // on the donor's host the donor's pid (donor_server.cc "Local clients")
  uint32_t rkey = 0;
  uint64_t size = 0;
  // verbs: remote virtual address; tcp: 0, or for a client on the donor's
  // host the address of the slab's view in the donor, followed by a page
  // that starts with the session secret (and may end with a file record:
  // kLocalFileRecord below)
  uint64_t addr = 0;
};
// A local client's view (SlabDesc.addr) may be a mapping of a memfd of the
// donor's that holds the slab and the proof page: then the last 8 bytes of
// the proof page are kLocalFileMagic and that file's descriptor number in
// the donor, both u32 little-endian. The client takes the file with
// pidfd_getfd() and reads and writes the slab with pread / pwrite on it
// (donor_server.cc "Local clients").
inline constexpr size_t kLocalFileRecord = 4096 - 8;     // offset in the proof page
inline constexpr uint32_t kLocalFileMagic = 0x31444D46;  // "FMD1" in memory order
struct Leased {
  std::vector<SlabDesc> slabs;
};
struct ReleaseReq {
  uint32_t slab = 0;
};

// Fields of STATS_REPLY, in wire order.
struct StatsReply {
  uint64_t capacity = 0;
  uint64_t leased = 0;
  uint64_t slab_size = 0;
  uint64_t clients = 0;        // sessions alive now
  uint64_t connections = 0;    // TCP connections open now
  uint64_t bytes_read = 0;     // served by READ
  uint64_t bytes_written = 0;  // received by WRITE
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t errors = 0;            // ERROR frames sent
  uint64_t sessions_expired = 0;  // released for missed heartbeats
  uint64_t instance_id = 0;
};
inline constexpr size_t kStatsFields = 12;
static_assert(sizeof(StatsReply) == kStatsFields * 8);

struct IoReq {  // READ and WRITE request prefix
  uint32_t slab = 0;
  uint32_t length = 0;
  uint64_t offset = 0;
};
inline constexpr size_t kIoReqSize = 16;

// One session in CLIENTS_REPLY.
inline constexpr size_t kClientInfoSize = 128;
inline constexpr size_t kMaxPeerName = 48;
inline constexpr uint32_t kMaxClientsPerReply = 30;
static_assert(8 + kMaxClientsPerReply * kClientInfoSize <= kMaxControlPayload);

struct ClientsReq {
  uint64_t after_session = 0;  // 0: from the first
};
struct ClientInfo {
  uint64_t session_id = 0;
  uint64_t client_id = 0;
  uint64_t leased = 0;
  uint64_t bytes_read = 0;  // served to this session by READ
  uint64_t bytes_written = 0;
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t age_ms = 0;
  uint32_t data_conns = 0;
  uint32_t idle_ms = 0;
  std::string peer;  // at most kMaxPeerName bytes on the wire (longer is cut)
};
struct ClientsReply {
  uint32_t total = 0;  // sessions alive when the page was taken
  bool more = false;   // another page follows: ask with the last session id
  std::vector<ClientInfo> clients;
};

struct ErrorMsg {
  Errc code = Errc::kInternal;
  std::string message;
};

// Each encode_* appends a whole frame (header + payload) to `out`.
void encode_hello(std::vector<uint8_t>& out, uint64_t tag, const Hello& m);
void encode_challenge(std::vector<uint8_t>& out, uint64_t tag, const Challenge& m);
void encode_auth(std::vector<uint8_t>& out, uint64_t tag, const Auth& m);
void encode_attach(std::vector<uint8_t>& out, uint64_t tag, const Attach& m);
void encode_welcome(std::vector<uint8_t>& out, uint64_t tag, const Welcome& m);
void encode_lease(std::vector<uint8_t>& out, uint64_t tag, const LeaseReq& m);
void encode_leased(std::vector<uint8_t>& out, uint64_t tag, const Leased& m);
void encode_release(std::vector<uint8_t>& out, uint64_t tag, const ReleaseReq& m);
void encode_stats_reply(std::vector<uint8_t>& out, uint64_t tag, const StatsReply& m);
void encode_io_req(std::vector<uint8_t>& out, MsgType type, uint64_t tag, const IoReq& m,
                   const void* write_data);
void encode_error(std::vector<uint8_t>& out, uint64_t tag, Errc code, std::string_view message);
void encode_clients(std::vector<uint8_t>& out, uint64_t tag, const ClientsReq& m);
// Lists at most kMaxClientsPerReply entries (the rest are dropped).
void encode_clients_reply(std::vector<uint8_t>& out, uint64_t tag, const ClientsReply& m);
// A frame with an empty payload (ATTACHED, RELEASED, HEARTBEAT, ...).
void encode_empty(std::vector<uint8_t>& out, MsgType type, uint64_t tag);
// Only the header of a frame whose payload the caller sends separately
// (READ_DATA, WRITE data) to avoid a copy.
void encode_frame_header(uint8_t* out, MsgType type, uint64_t tag, uint32_t payload_len) noexcept;

// Each decode_* checks the payload length and every field's range and
// returns kProtocol / kVersionMismatch / kInvalidArgument with a message
// naming the field.
Status decode_hello(std::span<const uint8_t> p, Hello* m);
Status decode_challenge(std::span<const uint8_t> p, Challenge* m);
Status decode_auth(std::span<const uint8_t> p, Auth* m);
Status decode_attach(std::span<const uint8_t> p, Attach* m);
Status decode_welcome(std::span<const uint8_t> p, Welcome* m);
Status decode_lease(std::span<const uint8_t> p, LeaseReq* m);
Status decode_leased(std::span<const uint8_t> p, Leased* m);
Status decode_release(std::span<const uint8_t> p, ReleaseReq* m);
Status decode_stats_reply(std::span<const uint8_t> p, StatsReply* m);
// For WRITE, `p` may be just the 16-byte prefix; the data follows it.
Status decode_io_req(std::span<const uint8_t> p, IoReq* m);
Status decode_error(std::span<const uint8_t> p, ErrorMsg* m);
Status decode_clients(std::span<const uint8_t> p, ClientsReq* m);
Status decode_clients_reply(std::span<const uint8_t> p, ClientsReply* m);

// Feeds a byte stream and yields whole validated frames. Used by the fuzz
// target and by anything that parses from a buffer instead of a socket.
class FrameParser {
 public:
  struct Frame {
    Header header;
    std::span<const uint8_t> payload;  // valid until the next feed()/next()
  };
  void feed(std::span<const uint8_t> bytes);
  // Returns kOk and fills `f` when a whole frame is buffered; kNotFound
  // when more bytes are needed; kProtocol (sticky) on a bad header.
  Errc next(Frame* f, const char** why = nullptr);

 private:
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
  bool broken_ = false;
};

// ---- Little-endian helpers -------------------------------------------------
inline void put_u16(uint8_t* p, uint16_t v) noexcept {
  std::memcpy(p, &v, 2);
}
inline void put_u32(uint8_t* p, uint32_t v) noexcept {
  std::memcpy(p, &v, 4);
}
inline void put_u64(uint8_t* p, uint64_t v) noexcept {
  std::memcpy(p, &v, 8);
}
inline uint16_t get_u16(const uint8_t* p) noexcept {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t get_u32(const uint8_t* p) noexcept {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t get_u64(const uint8_t* p) noexcept {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

}  // namespace farmem::wire
