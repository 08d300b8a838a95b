// farmem_downstream: leases memory from a farmemd, writes a pattern into it
// over the tcp data path, reads it back and checks it, using only the
// installed farmem (find_package(farmem), farmem::runtime).
//
//   farmem_downstream HOST:PORT TOKEN_FILE [BYTES]
//
// Prints "ok: leased N bytes in K slabs, wrote and read back B bytes" and
// exits 0, or says what failed and exits 1.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/auth.h"
#include "runtime/donor_client.h"
#include "runtime/net.h"
#include "runtime/parse.h"
#include "runtime/wire.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: farmem_downstream HOST:PORT TOKEN_FILE [BYTES]\n");
    return 2;
  }
  auto ep = farmem::parse_endpoint(argv[1], "donor", 7400);
  auto token = farmem::read_token_file(argv[2]);
  auto bytes = farmem::parse_size(argc > 3 ? argv[3] : "1M", "BYTES");
  if (!ep.ok() || !token.ok() || !bytes.ok()) {
    fprintf(stderr, "farmem_downstream: bad arguments: %s%s%s\n", ep.status().message().c_str(),
            token.status().message().c_str(), bytes.status().message().c_str());
    return 2;
  }
  farmem::DonorClientOptions o;
  o.server = *ep;
  o.token = *token;
  auto s = farmem::DonorSession::connect(o);
  if (!s.ok()) {
    fprintf(stderr, "farmem_downstream: %s\n", s.status().to_string().c_str());
    return 1;
  }
  auto slabs = (*s)->lease(*bytes);
  if (!slabs.ok()) {
    fprintf(stderr, "farmem_downstream: %s\n", slabs.status().to_string().c_str());
    return 1;
  }
  uint64_t leased = 0;
  for (const auto& d : *slabs) leased += d.size;

  // One WRITE and one READ of 4 KiB at the start of the first slab.
  auto fd = (*s)->open_data_connection();
  if (!fd.ok()) {
    fprintf(stderr, "farmem_downstream: %s\n", fd.status().to_string().c_str());
    return 1;
  }
  std::vector<uint8_t> data(4096), back(4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<uint8_t> frame;
  farmem::wire::IoReq req{(*slabs)[0].slab, 4096, 0};
  farmem::wire::encode_io_req(frame, farmem::wire::MsgType::kWrite, 1, req, data.data());
  farmem::wire::encode_io_req(frame, farmem::wire::MsgType::kRead, 2, req, nullptr);
  uint8_t h[farmem::wire::kHeaderSize];
  farmem::wire::Header w, r;
  if (farmem::send_all(fd->get(), frame.data(), frame.size()) != farmem::Errc::kOk ||
      farmem::recv_all(fd->get(), h, sizeof h) != farmem::Errc::kOk ||
      farmem::wire::decode_header(h, &w) != farmem::Errc::kOk ||
      w.type != farmem::wire::MsgType::kWritten ||
      farmem::recv_all(fd->get(), h, sizeof h) != farmem::Errc::kOk ||
      farmem::wire::decode_header(h, &r) != farmem::Errc::kOk ||
      r.type != farmem::wire::MsgType::kReadData || r.payload_len != back.size() ||
      farmem::recv_all(fd->get(), back.data(), back.size()) != farmem::Errc::kOk) {
    fprintf(stderr, "farmem_downstream: the WRITE/READ exchange with %s failed\n", argv[1]);
    return 1;
  }
  if (std::memcmp(data.data(), back.data(), data.size()) != 0) {
    fprintf(stderr, "farmem_downstream: read back different bytes than written\n");
    return 1;
  }
  printf("ok: leased %llu bytes in %zu slabs, wrote and read back %zu bytes\n",
         static_cast<unsigned long long>(leased), slabs->size(), data.size());
  return 0;
}
