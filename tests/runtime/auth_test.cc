// SHA-256 and HMAC-SHA256 (runtime/auth.cc) against the published vectors:
// FIPS 180-2 appendix B and RFC 4231 section 4. Every length around the
// 55/56/64-byte padding edges goes through the same vectors' construction.
#include "runtime/auth.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace farmem {
namespace {

std::string hex(const Mac& m) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t b : m) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Sha256, Fips180Vectors) {
  EXPECT_EQ(hex(sha256(bytes(""))),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256(bytes("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the padding needs a second block.
  EXPECT_EQ(hex(sha256(bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(bytes(std::string(1000000, 'a')))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(HmacSha256, Rfc4231Vectors) {
  // Test case 1: a 20-byte key.
  EXPECT_EQ(hex(hmac_sha256(bytes(std::string(20, '\x0b')), bytes("Hi There"))),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  EXPECT_EQ(hex(hmac_sha256(bytes("Jefe"), bytes("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 3: 50 bytes of 0xdd under 20 bytes of 0xaa.
  EXPECT_EQ(hex(hmac_sha256(bytes(std::string(20, '\xaa')), bytes(std::string(50, '\xdd')))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Test case 6: a key longer than the block is hashed first.
  EXPECT_EQ(hex(hmac_sha256(bytes(std::string(131, '\xaa')),
                            bytes("Test Using Larger Than Block-Size Key - Hash Key First"))),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // An empty key is legal.
  EXPECT_EQ(hex(hmac_sha256({}, bytes(""))),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST(Auth, MacsDependOnEveryInputAndCompareExactly) {
  std::array<uint8_t, wire::kNonceSize> nonce{};
  nonce[0] = 1;
  const std::string token = "a shared secret";
  const Mac m = auth_mac(bytes(token), nonce, 42);
  EXPECT_TRUE(mac_equal(m, auth_mac(bytes(token), nonce, 42)));
  EXPECT_FALSE(mac_equal(m, auth_mac(bytes(token), nonce, 43)));
  EXPECT_FALSE(mac_equal(m, auth_mac(bytes("another secret"), nonce, 42)));
  auto other = nonce;
  other[wire::kNonceSize - 1] ^= 1;
  EXPECT_FALSE(mac_equal(m, auth_mac(bytes(token), other, 42)));
  // The attach proof is a different label: never equal to the auth MAC.
  EXPECT_FALSE(mac_equal(m, attach_mac(bytes(token), nonce)));
  Mac flipped = m;
  flipped[31] ^= 0x80;
  EXPECT_FALSE(mac_equal(m, flipped));
}

}  // namespace
}  // namespace farmem
