// libFuzzer target for the wire protocol: wire::FrameParser and every
// decode_* function, fed the bytes a peer could send on a connection.
//
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DFARMEM_ENABLE_FUZZ=ON
//   ninja -C build-fuzz farmem_frame_parser_fuzz farmem_fuzz_make_corpus
//   build-fuzz/fuzz/farmem_fuzz_make_corpus build-fuzz/corpus
//   build-fuzz/fuzz/farmem_frame_parser_fuzz -max_total_time=60 build-fuzz/corpus
//
// The input is taken as a raw byte stream, so that the seed corpus is made
// of real encoded frames. It is parsed twice: once fed whole, once fed in
// chunks whose sizes come from a PRNG seeded with a hash of the input (the
// run must be reproducible from the input alone). Besides the sanitizers,
// these must hold, else the target aborts:
//  * every frame the parser yields is the next 16 + payload_len bytes of the
//    input, byte for byte, with a header that re-encodes to the same bytes
//    and a payload no longer than max_payload(type);
//  * chunked and whole feeding yield the same number of frames and end in
//    the same state; a protocol error is sticky;
//  * a payload that decodes re-encodes to the same bytes (pad bytes aside),
//    and one that does not decode is refused with a validation code and a
//    message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem::wire {
namespace {

[[noreturn]] void fail(const char* what, int line) {
  std::fprintf(stderr, "frame_parser_fuzz: check failed at line %d: %s\n", line, what);
  std::abort();
}
#define FUZZ_CHECK(cond)                \
  do {                                  \
    if (!(cond)) fail(#cond, __LINE__); \
  } while (0)

// SplitMix64: small, deterministic, good enough to vary chunk sizes.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t s_;
};

uint64_t fnv1a(std::span<const uint8_t> data) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint8_t b : data) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

// Chunk sizes mix single bytes (every split point inside a header), short
// runs and large blocks.
size_t chunk_size(Rng& rng, size_t left) {
  size_t n;
  switch (rng.next() % 4) {
    case 0:
      n = 1;
      break;
    case 1:
      n = 1 + rng.next() % kHeaderSize;
      break;
    case 2:
      n = 1 + rng.next() % 256;
      break;
    default:
      n = 1 + rng.next() % 8192;
      break;
  }
  return n < left ? n : left;
}

// A decoder refused the payload: the code must be one of the validation
// codes and the message must say what was wrong.
void check_refusal(const Status& st) {
  FUZZ_CHECK(st.code() == Errc::kProtocol || st.code() == Errc::kVersionMismatch ||
             st.code() == Errc::kInvalidArgument);
  FUZZ_CHECK(!st.message().empty());
}

// `frame` is a whole encoded frame; its payload must equal `orig` except in
// the bytes `is_pad(i)` names, which are ignored on receipt and must be
// zero when sent.
template <class IsPad>
void check_reencoded_masked(const std::vector<uint8_t>& frame, std::span<const uint8_t> orig,
                            IsPad is_pad) {
  FUZZ_CHECK(frame.size() == kHeaderSize + orig.size());
  const uint8_t* p = frame.data() + kHeaderSize;
  for (size_t i = 0; i < orig.size(); ++i) {
    if (is_pad(i)) {
      FUZZ_CHECK(p[i] == 0);
    } else {
      FUZZ_CHECK(p[i] == orig[i]);
    }
  }
}

// As above with one pad range [pad_begin, pad_end).
void check_reencoded(const std::vector<uint8_t>& frame, std::span<const uint8_t> orig,
                     size_t pad_begin = 0, size_t pad_end = 0) {
  check_reencoded_masked(frame, orig, [&](size_t i) { return i >= pad_begin && i < pad_end; });
}

// Runs the decoder that matches the frame's type and checks the round trip.
void check_payload(const Header& h, std::span<const uint8_t> p) {
  FUZZ_CHECK(p.size() == h.payload_len);
  FUZZ_CHECK(p.size() <= max_payload(h.type));
  FUZZ_CHECK(std::strcmp(msg_type_name(h.type), "UNKNOWN") != 0);
  std::vector<uint8_t> out;
  switch (h.type) {
    case MsgType::kHello: {
      Hello m;
      Status st = decode_hello(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_hello(out, h.tag, m);
      return check_reencoded(out, p, 7, 8);
    }
    case MsgType::kChallenge: {
      Challenge m;
      Status st = decode_challenge(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_challenge(out, h.tag, m);
      return check_reencoded(out, p, 2, 4);
    }
    case MsgType::kAuth: {
      Auth m;
      Status st = decode_auth(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_auth(out, h.tag, m);
      return check_reencoded(out, p);
    }
    case MsgType::kAttach: {
      Attach m;
      Status st = decode_attach(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_attach(out, h.tag, m);
      return check_reencoded(out, p);
    }
    case MsgType::kWelcome: {
      Welcome m;
      Status st = decode_welcome(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_welcome(out, h.tag, m);
      return check_reencoded(out, p);
    }
    case MsgType::kLease: {
      LeaseReq m;
      Status st = decode_lease(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_lease(out, h.tag, m);
      return check_reencoded(out, p);
    }
    case MsgType::kLeased: {
      Leased m;
      Status st = decode_leased(p, &m);
      if (!st.ok()) return check_refusal(st);
      FUZZ_CHECK(m.slabs.size() <= kMaxSlabsPerLease);
      encode_leased(out, h.tag, m);
      return check_reencoded(out, p, 4, 8);
    }
    case MsgType::kRelease: {
      ReleaseReq m;
      Status st = decode_release(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_release(out, h.tag, m);
      return check_reencoded(out, p, 4, 8);
    }
    case MsgType::kStatsReply: {
      StatsReply m;
      Status st = decode_stats_reply(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_stats_reply(out, h.tag, m);
      return check_reencoded(out, p);
    }
    case MsgType::kRead:
    case MsgType::kWrite: {
      IoReq m;
      Status st = decode_io_req(p, &m);
      if (!st.ok()) return check_refusal(st);
      FUZZ_CHECK(m.length >= 1 && m.length <= kMaxIoLength);
      // Only the 16-byte prefix: a WRITE's data follows it unparsed, and its
      // length is checked against the frame by the server, not the decoder.
      encode_io_req(out, h.type, h.tag, m, nullptr);
      return check_reencoded(out, p.first(kIoReqSize));
    }
    case MsgType::kError: {
      ErrorMsg m;
      Status st = decode_error(p, &m);
      if (!st.ok()) return check_refusal(st);
      FUZZ_CHECK(m.code != Errc::kOk);
      FUZZ_CHECK(m.message.size() + 4 == p.size());
      encode_error(out, h.tag, m.code, m.message);
      FUZZ_CHECK(out.size() == kHeaderSize + p.size());
      // Unknown codes are read as kInternal; known ones survive.
      uint16_t code = get_u16(p.data());
      uint16_t back = get_u16(out.data() + kHeaderSize);
      FUZZ_CHECK(back == code || back == static_cast<uint16_t>(Errc::kInternal));
      FUZZ_CHECK(std::memcmp(out.data() + kHeaderSize + 4, p.data() + 4, p.size() - 4) == 0);
      return;
    }
    case MsgType::kClients: {
      ClientsReq m;
      Status st = decode_clients(p, &m);
      if (!st.ok()) return check_refusal(st);
      encode_clients(out, h.tag, m);
      return check_reencoded(out, p);
    }
    case MsgType::kClientsReply: {
      ClientsReply m;
      Status st = decode_clients_reply(p, &m);
      if (!st.ok()) return check_refusal(st);
      FUZZ_CHECK(m.clients.size() <= kMaxClientsPerReply);
      for (size_t i = 1; i < m.clients.size(); ++i)
        FUZZ_CHECK(m.clients[i - 1].session_id < m.clients[i].session_id);
      encode_clients_reply(out, h.tag, m);
      // Pad: byte 7; in each entry bytes 74..79 and the peer field past
      // its length.
      return check_reencoded_masked(out, p, [&](size_t i) {
        if (i < 8) return i == 7;
        size_t entry = (i - 8) / kClientInfoSize;
        size_t at = (i - 8) % kClientInfoSize;
        if (at >= 74 && at < 80) return true;
        return at >= 80 + m.clients[entry].peer.size();
      });
    }
    case MsgType::kReadData:
      return;  // raw bytes, nothing to decode
    case MsgType::kAttached:
    case MsgType::kReleased:
    case MsgType::kHeartbeat:
    case MsgType::kHeartbeatAck:
    case MsgType::kStats:
    case MsgType::kWritten:
      FUZZ_CHECK(p.empty());
      return;
  }
  fail("frame of a type the header decoder should have refused", __LINE__);
}

// Checks one frame the parser yielded against the input at `*offset` and
// advances it.
void check_frame(std::span<const uint8_t> input, size_t* offset, const FrameParser::Frame& f) {
  FUZZ_CHECK(*offset + kHeaderSize + f.header.payload_len <= input.size());
  uint8_t hdr[kHeaderSize];
  encode_header(f.header, hdr);
  FUZZ_CHECK(std::memcmp(hdr, input.data() + *offset, kHeaderSize) == 0);
  FUZZ_CHECK(f.payload.size() == f.header.payload_len);
  FUZZ_CHECK(
      f.payload.empty() ||
      std::memcmp(f.payload.data(), input.data() + *offset + kHeaderSize, f.payload.size()) == 0);
  check_payload(f.header, f.payload);
  *offset += kHeaderSize + f.header.payload_len;
}

struct Outcome {
  size_t frames = 0;
  size_t consumed = 0;  // bytes covered by the frames
  Errc end = Errc::kNotFound;
};

// Drains every frame currently available; returns the code that stopped it.
Errc drain(FrameParser& parser, std::span<const uint8_t> input, Outcome* o) {
  for (;;) {
    FrameParser::Frame f;
    const char* why = nullptr;
    Errc e = parser.next(&f, &why);
    if (e == Errc::kOk) {
      check_frame(input, &o->consumed, f);
      ++o->frames;
      continue;
    }
    FUZZ_CHECK(e == Errc::kNotFound || e == Errc::kProtocol);
    if (e == Errc::kProtocol) FUZZ_CHECK(why != nullptr && why[0] != '\0');
    return e;
  }
}

Outcome parse_whole(std::span<const uint8_t> input) {
  FrameParser parser;
  Outcome o;
  parser.feed(input);
  o.end = drain(parser, input, &o);
  return o;
}

Outcome parse_chunked(std::span<const uint8_t> input) {
  FrameParser parser;
  Outcome o;
  Rng rng(fnv1a(input));
  size_t fed = 0;
  while (fed < input.size()) {
    size_t n = chunk_size(rng, input.size() - fed);
    parser.feed(input.subspan(fed, n));
    fed += n;
    o.end = drain(parser, input, &o);
    if (o.end == Errc::kProtocol) break;
  }
  if (o.end == Errc::kProtocol) {
    // Sticky: more bytes, even a valid frame, do not revive the stream.
    std::vector<uint8_t> more;
    encode_empty(more, MsgType::kHeartbeat, 1);
    parser.feed(more);
    FrameParser::Frame f;
    FUZZ_CHECK(parser.next(&f) == Errc::kProtocol);
  }
  return o;
}

}  // namespace
}  // namespace farmem::wire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace farmem::wire;
  std::span<const uint8_t> input(data, size);
  Outcome whole = parse_whole(input);
  Outcome chunked = parse_chunked(input);
  FUZZ_CHECK(whole.frames == chunked.frames);
  FUZZ_CHECK(whole.consumed == chunked.consumed);
  FUZZ_CHECK(whole.end == chunked.end);
  // What is left after the last frame is either an incomplete frame (the
  // parser waits for more) or starts with a header it must refuse.
  size_t left = size - whole.consumed;
  Header h;
  if (left < kHeaderSize) {
    FUZZ_CHECK(whole.end == farmem::Errc::kNotFound);
  } else if (decode_header(data + whole.consumed, &h) == farmem::Errc::kOk) {
    FUZZ_CHECK(whole.end == farmem::Errc::kNotFound);
    FUZZ_CHECK(h.payload_len > left - kHeaderSize);
  } else {
    FUZZ_CHECK(whole.end == farmem::Errc::kProtocol);
  }
  return 0;
}
