#include "runtime/auth.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/log.h"

namespace farmem {
namespace {

// SHA-256 (FIPS 180-4) and HMAC (RFC 2104), here rather than from OpenSSL:
// libcrypto cost every client that opens a data connection 3.5 MiB of
// resident text and data, counted against the program's budget, for one MAC
// per connection. Data-independent control flow and no table lookups by
// secret index, so it leaks no timing. Checked against the FIPS 180-2 and
// RFC 4231 vectors (tests/runtime/auth_test.cc).
constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

class Sha256 {
 public:
  void update(std::span<const uint8_t> in) {
    for (uint8_t b : in) {
      buf_[fill_++] = b;
      if (fill_ == 64) {
        block();
        fill_ = 0;
      }
    }
    bits_ += static_cast<uint64_t>(in.size()) * 8;
  }
  Mac finish() {
    const uint64_t bits = bits_;
    const uint8_t one = 0x80, zero = 0;
    update({&one, 1});
    while (fill_ != 56) update({&zero, 1});
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len);
    Mac out{};
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
    return out;
  }

 private:
  void block() {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t{buf_[4 * t]} << 24 | uint32_t{buf_[4 * t + 1]} << 16 |
             uint32_t{buf_[4 * t + 2]} << 8 | uint32_t{buf_[4 * t + 3]};
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t t1 =
          h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[t] + w[t];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf_[64] = {};
  size_t fill_ = 0;
  uint64_t bits_ = 0;
};

}  // namespace

Mac sha256(std::span<const uint8_t> msg) {
  Sha256 s;
  s.update(msg);
  return s.finish();
}

Mac hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> msg) {
  uint8_t k[64] = {};
  if (key.size() > sizeof k) {
    const Mac d = sha256(key);
    std::memcpy(k, d.data(), d.size());
  } else if (!key.empty()) {
    std::memcpy(k, key.data(), key.size());
  }
  uint8_t pad[64];
  for (size_t i = 0; i < sizeof pad; ++i) pad[i] = k[i] ^ 0x36;
  Sha256 inner;
  inner.update(pad);
  inner.update(msg);
  const Mac ih = inner.finish();
  for (size_t i = 0; i < sizeof pad; ++i) pad[i] = k[i] ^ 0x5c;
  Sha256 outer;
  outer.update(pad);
  outer.update(ih);
  return outer.finish();
}

// From the kernel's CSPRNG (getrandom(2)), like the MACs above without
// libcrypto: every client draws a random id and a placement seed.
void random_bytes(std::span<uint8_t> out) noexcept {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fatal("getrandom failed (%s): the kernel's random number generator is unavailable",
            std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

uint64_t random_u64() noexcept {
  uint64_t v;
  random_bytes({reinterpret_cast<uint8_t*>(&v), sizeof v});
  return v;
}

Mac auth_mac(std::span<const uint8_t> token, std::span<const uint8_t, wire::kNonceSize> nonce,
             uint64_t client_id) {
  static constexpr char kLabel[] = "farmem-auth-v1";
  uint8_t msg[sizeof kLabel - 1 + wire::kNonceSize + 8];
  std::memcpy(msg, kLabel, sizeof kLabel - 1);
  std::memcpy(msg + sizeof kLabel - 1, nonce.data(), nonce.size());
  wire::put_u64(msg + sizeof kLabel - 1 + wire::kNonceSize, client_id);
  return hmac_sha256(token, msg);
}

Mac attach_mac(std::span<const uint8_t> secret, std::span<const uint8_t, wire::kNonceSize> nonce) {
  static constexpr char kLabel[] = "farmem-attach-v1";
  uint8_t msg[sizeof kLabel - 1 + wire::kNonceSize];
  std::memcpy(msg, kLabel, sizeof kLabel - 1);
  std::memcpy(msg + sizeof kLabel - 1, nonce.data(), nonce.size());
  return hmac_sha256(secret, msg);
}

bool mac_equal(const Mac& a, const Mac& b) noexcept {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  // Through a volatile so the compiler cannot stop at the first difference.
  volatile uint8_t v = diff;
  return v == 0;
}

Result<std::string> read_token_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(Errc::kInvalidArgument, "cannot open token file %s: %s", path.c_str(),
                      strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return make_error(Errc::kInvalidArgument, "token file %s is not a regular file", path.c_str());
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    FARMEM_LOG(kWarn, "token file %s is readable by group or others; chmod 600 it", path.c_str());
  std::string s;
  char buf[4097];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) {
    s.append(buf, static_cast<size_t>(n));
    if (s.size() > 4096) break;
  }
  close(fd);
  if (n < 0)
    return make_error(Errc::kIo, "reading token file %s: %s", path.c_str(), strerror(errno));
  if (s.size() > 4096)
    return make_error(Errc::kInvalidArgument, "token file %s is larger than 4 KiB", path.c_str());
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  if (s.empty())
    return make_error(Errc::kInvalidArgument,
                      "token file %s is empty: put a shared secret in it, e.g. "
                      "`head -c 32 /dev/urandom | base64 > %s`",
                      path.c_str(), path.c_str());
  return s;
}

}  // namespace farmem
