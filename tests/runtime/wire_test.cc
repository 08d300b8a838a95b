#include "runtime/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace farmem::wire {
namespace {

// Parses exactly one frame out of `bytes` and checks its header.
FrameParser::Frame one_frame(FrameParser& p, const std::vector<uint8_t>& bytes, MsgType type,
                             uint64_t tag) {
  p.feed(bytes);
  FrameParser::Frame f;
  const char* why = nullptr;
  EXPECT_EQ(p.next(&f, &why), Errc::kOk) << (why ? why : "");
  EXPECT_EQ(f.header.type, type);
  EXPECT_EQ(f.header.tag, tag);
  FrameParser::Frame extra;
  EXPECT_EQ(p.next(&extra), Errc::kNotFound);
  return f;
}

TEST(Wire, HelloRoundTrip) {
  std::vector<uint8_t> b;
  Hello h;
  h.role = Role::kData;
  h.client_id = 0x1122334455667788ull;
  encode_hello(b, 7, h);
  FrameParser p;
  auto f = one_frame(p, b, MsgType::kHello, 7);
  Hello d;
  ASSERT_TRUE(decode_hello(f.payload, &d).ok());
  EXPECT_EQ(d.role, Role::kData);
  EXPECT_EQ(d.client_id, h.client_id);
  EXPECT_EQ(d.version, kVersion);
}

TEST(Wire, ChallengeAuthAttachWelcomeRoundTrip) {
  std::vector<uint8_t> b;
  Challenge c;
  c.instance_id = 99;
  for (size_t i = 0; i < c.nonce.size(); ++i) c.nonce[i] = static_cast<uint8_t>(i * 3);
  encode_challenge(b, 1, c);
  Auth a;
  a.mac.fill(0xAB);
  encode_auth(b, 2, a);
  Attach at;
  at.session_id = 1234;
  at.mac.fill(0xCD);
  encode_attach(b, 3, at);
  Welcome w;
  w.session_id = 55;
  w.secret.fill(0x5A);
  w.capacity = 1ull << 36;
  w.slab_size = 1 << 26;
  w.quota = 1ull << 30;
  w.heartbeat_ms = 1000;
  w.grace_ms = 5000;
  w.instance_id = 77;
  encode_welcome(b, 4, w);

  FrameParser p;
  p.feed(b);
  FrameParser::Frame f;
  ASSERT_EQ(p.next(&f), Errc::kOk);
  Challenge c2;
  ASSERT_TRUE(decode_challenge(f.payload, &c2).ok());
  EXPECT_EQ(c2.instance_id, 99u);
  EXPECT_EQ(c2.nonce, c.nonce);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  Auth a2;
  ASSERT_TRUE(decode_auth(f.payload, &a2).ok());
  EXPECT_EQ(a2.mac, a.mac);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  Attach at2;
  ASSERT_TRUE(decode_attach(f.payload, &at2).ok());
  EXPECT_EQ(at2.session_id, 1234u);
  EXPECT_EQ(at2.mac, at.mac);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  Welcome w2;
  ASSERT_TRUE(decode_welcome(f.payload, &w2).ok());
  EXPECT_EQ(w2.session_id, 55u);
  EXPECT_EQ(w2.secret, w.secret);
  EXPECT_EQ(w2.capacity, w.capacity);
  EXPECT_EQ(w2.slab_size, w.slab_size);
  EXPECT_EQ(w2.quota, w.quota);
  EXPECT_EQ(w2.heartbeat_ms, 1000u);
  EXPECT_EQ(w2.grace_ms, 5000u);
  EXPECT_EQ(w2.instance_id, 77u);
}

TEST(Wire, LeaseReleaseStatsRoundTrip) {
  std::vector<uint8_t> b;
  encode_lease(b, 10, LeaseReq{3u << 20});
  Leased l;
  for (uint32_t i = 0; i < 5; ++i) l.slabs.push_back({i + 1, 100 + i, 1u << 20, 0x1000ull * i});
  encode_leased(b, 11, l);
  encode_release(b, 12, ReleaseReq{4});
  encode_empty(b, MsgType::kStats, 13);
  StatsReply s{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  encode_stats_reply(b, 14, s);
  encode_empty(b, MsgType::kHeartbeat, 15);

  FrameParser p;
  p.feed(b);
  FrameParser::Frame f;
  ASSERT_EQ(p.next(&f), Errc::kOk);
  LeaseReq lr;
  ASSERT_TRUE(decode_lease(f.payload, &lr).ok());
  EXPECT_EQ(lr.bytes, 3u << 20);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  Leased l2;
  ASSERT_TRUE(decode_leased(f.payload, &l2).ok());
  ASSERT_EQ(l2.slabs.size(), 5u);
  EXPECT_EQ(l2.slabs[3].slab, 4u);
  EXPECT_EQ(l2.slabs[3].rkey, 103u);
  EXPECT_EQ(l2.slabs[3].addr, 0x3000u);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  ReleaseReq rr;
  ASSERT_TRUE(decode_release(f.payload, &rr).ok());
  EXPECT_EQ(rr.slab, 4u);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  EXPECT_EQ(f.header.type, MsgType::kStats);
  EXPECT_EQ(f.payload.size(), 0u);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  StatsReply s2;
  ASSERT_TRUE(decode_stats_reply(f.payload, &s2).ok());
  EXPECT_EQ(std::memcmp(&s, &s2, sizeof s), 0);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  EXPECT_EQ(f.header.type, MsgType::kHeartbeat);
}

TEST(Wire, ReadWriteErrorRoundTrip) {
  std::vector<uint8_t> b;
  encode_io_req(b, MsgType::kRead, 20, IoReq{3, 4096, 8192}, nullptr);
  std::vector<uint8_t> data(100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  encode_io_req(b, MsgType::kWrite, 21, IoReq{3, 100, 5}, data.data());
  encode_error(b, 22, Errc::kOutOfRange, "offset past the end of slab 3");
  FrameParser p;
  p.feed(b);
  FrameParser::Frame f;
  ASSERT_EQ(p.next(&f), Errc::kOk);
  IoReq r;
  ASSERT_TRUE(decode_io_req(f.payload, &r).ok());
  EXPECT_EQ(r.slab, 3u);
  EXPECT_EQ(r.length, 4096u);
  EXPECT_EQ(r.offset, 8192u);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  EXPECT_EQ(f.header.type, MsgType::kWrite);
  ASSERT_TRUE(decode_io_req(f.payload, &r).ok());
  ASSERT_EQ(f.payload.size(), kIoReqSize + 100);
  EXPECT_EQ(std::memcmp(f.payload.data() + kIoReqSize, data.data(), 100), 0);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  ErrorMsg e;
  ASSERT_TRUE(decode_error(f.payload, &e).ok());
  EXPECT_EQ(e.code, Errc::kOutOfRange);
  EXPECT_EQ(e.message, "offset past the end of slab 3");
}

TEST(Wire, FramesSplitAcrossFeeds) {
  std::vector<uint8_t> b;
  encode_lease(b, 1, LeaseReq{4096});
  encode_lease(b, 2, LeaseReq{8192});
  FrameParser p;
  FrameParser::Frame f;
  for (size_t i = 0; i < b.size(); ++i) {
    p.feed({&b[i], 1});
    if (i + 1 == kHeaderSize + 8) {
      ASSERT_EQ(p.next(&f), Errc::kOk);
      EXPECT_EQ(f.header.tag, 1u);
    } else if (i + 1 < b.size()) {
      ASSERT_EQ(p.next(&f), Errc::kNotFound);
    }
  }
  ASSERT_EQ(p.next(&f), Errc::kOk);
  EXPECT_EQ(f.header.tag, 2u);
}

TEST(Wire, HeaderValidation) {
  uint8_t h[kHeaderSize];
  Header d;
  const char* why = nullptr;
  encode_frame_header(h, MsgType::kLease, 1, 8);
  EXPECT_EQ(decode_header(h, &d, &why), Errc::kOk);
  // Unknown types.
  put_u16(h + 4, 0);
  EXPECT_EQ(decode_header(h, &d, &why), Errc::kProtocol);
  put_u16(h + 4, kMaxMsgType + 1);
  EXPECT_EQ(decode_header(h, &d, &why), Errc::kProtocol);
  EXPECT_STREQ(why, "unknown message type");
  // Fixed-size message with the wrong length.
  encode_frame_header(h, MsgType::kLease, 1, 9);
  EXPECT_EQ(decode_header(h, &d, &why), Errc::kProtocol);
  // Oversized data.
  encode_frame_header(h, MsgType::kWrite, 1, kIoReqSize + kMaxIoLength + 1);
  EXPECT_EQ(decode_header(h, &d, &why), Errc::kProtocol);
  encode_frame_header(h, MsgType::kReadData, 1, 0xFFFFFFFFu);
  EXPECT_EQ(decode_header(h, &d, &why), Errc::kProtocol);
  // Flags must be zero.
  encode_frame_header(h, MsgType::kHeartbeat, 1, 0);
  put_u16(h + 6, 1);
  EXPECT_EQ(decode_header(h, &d, &why), Errc::kProtocol);
}

TEST(Wire, BodyValidation) {
  Hello h;
  std::vector<uint8_t> b;
  encode_hello(b, 0, Hello{0xdeadbeef, kVersion, Role::kControl, 1});
  EXPECT_EQ(decode_hello({b.data() + kHeaderSize, 16}, &h).code(), Errc::kProtocol);
  b.clear();
  encode_hello(b, 0, Hello{kMagic, kVersion + 1, Role::kControl, 1});
  EXPECT_EQ(decode_hello({b.data() + kHeaderSize, 16}, &h).code(), Errc::kVersionMismatch);
  b.clear();
  encode_hello(b, 0, Hello{kMagic, kVersion, static_cast<Role>(9), 1});
  EXPECT_EQ(decode_hello({b.data() + kHeaderSize, 16}, &h).code(), Errc::kInvalidArgument);

  IoReq r;
  uint8_t io[kIoReqSize] = {};
  EXPECT_EQ(decode_io_req({io, kIoReqSize}, &r).code(), Errc::kInvalidArgument);  // length 0
  put_u32(io + 4, kMaxIoLength + 1);
  EXPECT_EQ(decode_io_req({io, kIoReqSize}, &r).code(), Errc::kInvalidArgument);
  EXPECT_EQ(decode_io_req({io, 8}, &r).code(), Errc::kProtocol);

  uint8_t leased[8] = {};
  put_u32(leased, kMaxSlabsPerLease + 1);
  Leased l;
  EXPECT_EQ(decode_leased({leased, 8}, &l).code(), Errc::kProtocol);
  put_u32(leased, 2);  // claims 2 descriptors, carries none
  EXPECT_EQ(decode_leased({leased, 8}, &l).code(), Errc::kProtocol);

  LeaseReq lr;
  uint8_t zero[8] = {};
  EXPECT_EQ(decode_lease({zero, 8}, &lr).code(), Errc::kInvalidArgument);
}

TEST(Wire, ClientsRoundTrip) {
  std::vector<uint8_t> b;
  encode_clients(b, 41, ClientsReq{0x0102030405060708ull});
  ClientsReply r;
  r.total = 33;
  r.more = true;
  for (uint32_t i = 0; i < kMaxClientsPerReply; ++i) {
    ClientInfo c;
    c.session_id = 1000 + i;
    c.client_id = 0xC0FFEE00ull + i;
    c.leased = (uint64_t{i} + 1) << 20;
    c.bytes_read = 4096ull * i;
    c.bytes_written = 8192ull * i + 1;
    c.reads = i;
    c.writes = 2ull * i;
    c.age_ms = 60000 + i;
    c.data_conns = i % 3;
    c.idle_ms = 17 * i;
    c.peer = "127.0.0." + std::to_string(i) + ":" + std::to_string(40000 + i);
    r.clients.push_back(c);
  }
  // A peer name longer than the wire field is cut, not refused.
  r.clients[5].peer = std::string(kMaxPeerName + 10, 'x');
  encode_clients_reply(b, 41, r);
  FrameParser p;
  p.feed(b);
  FrameParser::Frame f;
  ASSERT_EQ(p.next(&f), Errc::kOk);
  EXPECT_EQ(f.header.type, MsgType::kClients);
  EXPECT_EQ(f.header.payload_len, 8u);
  ClientsReq q;
  ASSERT_TRUE(decode_clients(f.payload, &q).ok());
  EXPECT_EQ(q.after_session, 0x0102030405060708ull);
  ASSERT_EQ(p.next(&f), Errc::kOk);
  EXPECT_EQ(f.header.type, MsgType::kClientsReply);
  EXPECT_EQ(f.header.tag, 41u);
  EXPECT_EQ(f.header.payload_len, 8 + kMaxClientsPerReply * kClientInfoSize);
  ClientsReply d;
  ASSERT_TRUE(decode_clients_reply(f.payload, &d).ok());
  EXPECT_EQ(d.total, 33u);
  EXPECT_TRUE(d.more);
  ASSERT_EQ(d.clients.size(), kMaxClientsPerReply);
  for (uint32_t i = 0; i < kMaxClientsPerReply; ++i) {
    const ClientInfo& a = r.clients[i];
    const ClientInfo& c = d.clients[i];
    EXPECT_EQ(c.session_id, a.session_id);
    EXPECT_EQ(c.client_id, a.client_id);
    EXPECT_EQ(c.leased, a.leased);
    EXPECT_EQ(c.bytes_read, a.bytes_read);
    EXPECT_EQ(c.bytes_written, a.bytes_written);
    EXPECT_EQ(c.reads, a.reads);
    EXPECT_EQ(c.writes, a.writes);
    EXPECT_EQ(c.age_ms, a.age_ms);
    EXPECT_EQ(c.data_conns, a.data_conns);
    EXPECT_EQ(c.idle_ms, a.idle_ms);
    EXPECT_EQ(c.peer, i == 5 ? std::string(kMaxPeerName, 'x') : a.peer);
  }
  FrameParser::Frame extra;
  EXPECT_EQ(p.next(&extra), Errc::kNotFound);

  // An empty last page.
  b.clear();
  encode_clients_reply(b, 42, ClientsReply{0, false, {}});
  ASSERT_EQ(b.size(), kHeaderSize + 8);
  ASSERT_TRUE(decode_clients_reply({b.data() + kHeaderSize, 8}, &d).ok());
  EXPECT_EQ(d.total, 0u);
  EXPECT_FALSE(d.more);
  EXPECT_TRUE(d.clients.empty());
}

TEST(Wire, ClientsReplyValidation) {
  ClientsReply r;
  r.total = 2;
  r.clients.resize(2);
  r.clients[0].session_id = 5;
  r.clients[0].peer = "a:1";
  r.clients[1].session_id = 9;
  std::vector<uint8_t> b;
  encode_clients_reply(b, 1, r);
  std::vector<uint8_t> pl(b.begin() + kHeaderSize, b.end());
  ClientsReply d;
  ASSERT_TRUE(decode_clients_reply(pl, &d).ok());

  auto bad = pl;
  put_u16(bad.data() + 4, 3);  // claims 3 entries, carries 2
  EXPECT_EQ(decode_clients_reply(bad, &d).code(), Errc::kProtocol);
  bad = pl;
  put_u16(bad.data() + 4, kMaxClientsPerReply + 1);
  EXPECT_EQ(decode_clients_reply(bad, &d).code(), Errc::kProtocol);
  bad = pl;
  bad[6] = 2;  // more is a flag
  EXPECT_EQ(decode_clients_reply(bad, &d).code(), Errc::kProtocol);
  bad = pl;
  put_u16(bad.data() + 8 + 72, kMaxPeerName + 1);
  EXPECT_EQ(decode_clients_reply(bad, &d).code(), Errc::kProtocol);
  bad = pl;
  put_u64(bad.data() + 8 + kClientInfoSize, 5);  // not ascending
  EXPECT_EQ(decode_clients_reply(bad, &d).code(), Errc::kProtocol);
  bad = pl;
  put_u64(bad.data() + 8, 0);  // session 0 is nobody
  EXPECT_EQ(decode_clients_reply(bad, &d).code(), Errc::kProtocol);
  uint8_t more_but_none[8] = {0, 0, 0, 0, 0, 0, 1, 0};
  EXPECT_EQ(decode_clients_reply({more_but_none, 8}, &d).code(), Errc::kProtocol);
  EXPECT_EQ(decode_clients_reply({more_but_none, 4}, &d).code(), Errc::kProtocol);

  ClientsReq q;
  EXPECT_EQ(decode_clients({more_but_none, 4}, &q).code(), Errc::kProtocol);
  // The header rule bounds CLIENTS_REPLY and fixes CLIENTS at 8 bytes.
  uint8_t h[kHeaderSize];
  Header hd;
  encode_frame_header(h, MsgType::kClientsReply, 1,
                      8 + (kMaxClientsPerReply + 1) * kClientInfoSize);
  EXPECT_EQ(decode_header(h, &hd), Errc::kProtocol);
  encode_frame_header(h, MsgType::kClients, 1, 0);
  EXPECT_EQ(decode_header(h, &hd), Errc::kProtocol);
  EXPECT_STREQ(msg_type_name(MsgType::kClientsReply), "CLIENTS_REPLY");
}

TEST(Wire, BrokenStreamStaysBroken) {
  FrameParser p;
  std::vector<uint8_t> junk(kHeaderSize, 0xFF);
  p.feed(junk);
  FrameParser::Frame f;
  EXPECT_EQ(p.next(&f), Errc::kProtocol);
  std::vector<uint8_t> good;
  encode_empty(good, MsgType::kHeartbeat, 1);
  p.feed(good);
  EXPECT_EQ(p.next(&f), Errc::kProtocol);
}

}  // namespace
}  // namespace farmem::wire
