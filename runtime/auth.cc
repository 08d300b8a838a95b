#include "runtime/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/log.h"

namespace farmem {
namespace {

Mac hmac(std::span<const uint8_t> key, std::span<const uint8_t> msg) {
  Mac out{};
  unsigned int len = 0;
  // An empty key is legal for HMAC; pass a valid pointer anyway.
  static const uint8_t kEmpty = 0;
  if (HMAC(EVP_sha256(), key.empty() ? &kEmpty : key.data(), static_cast<int>(key.size()),
           msg.data(), msg.size(), out.data(), &len) == nullptr ||
      len != out.size())
    fatal("HMAC-SHA256 failed in libcrypto");
  return out;
}

}  // namespace

// From the kernel's CSPRNG (getrandom(2), which libcrypto's RAND_bytes seeds
// from too), not from libcrypto: every client draws a random id and a
// placement seed, and loading libcrypto for that alone put 3.4 MiB of its
// text in the resident set of every program under the preload library, where
// it is counted against the program's budget. libcrypto now loads only for a
// donor token's HMAC.
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
  return hmac(token, msg);
}

Mac attach_mac(std::span<const uint8_t> secret, std::span<const uint8_t, wire::kNonceSize> nonce) {
  static constexpr char kLabel[] = "farmem-attach-v1";
  uint8_t msg[sizeof kLabel - 1 + wire::kNonceSize];
  std::memcpy(msg, kLabel, sizeof kLabel - 1);
  std::memcpy(msg + sizeof kLabel - 1, nonce.data(), nonce.size());
  return hmac(secret, msg);
}

bool mac_equal(const Mac& a, const Mac& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
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
