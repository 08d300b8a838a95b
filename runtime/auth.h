// Authentication primitives for the control protocol: HMAC-SHA256 of our
// own (runtime/auth.cc says why not libcrypto's), a constant-time compare,
// random bytes from getrandom(2).
// See wire.h for what is MACed.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem {

using Mac = std::array<uint8_t, wire::kMacSize>;

// Cryptographically random bytes; fatal on failure of the system RNG.
void random_bytes(std::span<uint8_t> out) noexcept;
uint64_t random_u64() noexcept;

// SHA-256 (FIPS 180-4) of msg, and HMAC-SHA256 (RFC 2104) of msg under key.
Mac sha256(std::span<const uint8_t> msg);
Mac hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> msg);

// HMAC-SHA256(token, "farmem-auth-v1" | nonce | client_id u64 LE).
Mac auth_mac(std::span<const uint8_t> token, std::span<const uint8_t, wire::kNonceSize> nonce,
             uint64_t client_id);
// HMAC-SHA256(secret, "farmem-attach-v1" | nonce).
Mac attach_mac(std::span<const uint8_t> secret, std::span<const uint8_t, wire::kNonceSize> nonce);
// Constant-time comparison.
bool mac_equal(const Mac& a, const Mac& b) noexcept;

// Reads a token file: its bytes with one trailing newline removed. Refuses
// an empty file, one over 4 KiB, and (warning only) one readable by others.
Result<std::string> read_token_file(const std::string& path);

}  // namespace farmem
