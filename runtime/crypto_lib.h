// libcrypto on demand: OpenSSL's libcrypto is loaded with dlopen the first
// time farmem needs it (HMAC-SHA256 for a donor token in the handshake:
// runtime/auth.cc), not at process start-up. Random nonces and ids come from
// getrandom(2), so a client of an --insecure donor never loads it (its text
// would be 3.4 MiB of the program's resident set).
//
//   if (!farmem::crypto_lib::load(&why)) ...;   // why: the dlopen error
//
// Why: linked normally, libcrypto.so.3 is mapped, relocated and initialized
// in every process that loads farmem: about 20 ms of CPU for each program
// started under LD_PRELOAD=libfarmem_preload.so (measured: /usr/bin/python3
// -c pass, 46 ms bare, 69 ms with libcrypto.so.3 preloaded), although a
// program that never makes a large allocation never talks to a donor.
//
// How (as runtime/verbs_lib.h does for rdma-core): crypto_lib.cc defines,
// hidden, the three functions auth.cc calls (HMAC, EVP_sha256,
// CRYPTO_memcmp), each forwarding to the real one in the loaded library. The
// preload library links --as-needed, so libcrypto drops out of its
// DT_NEEDED; other binaries still link it and the forwarders reach that
// same copy. When libcrypto cannot be loaded, the forwarders fail as the
// real functions document (NULL, "not equal") and the first failure logs
// the dlopen error once; auth.cc then stops with its own message.
#pragma once

#include <string>

namespace farmem::crypto_lib {

// Loads libcrypto once per process (thread-safe); false with the dlopen /
// dlsym error and what to install in *why (when not null).
bool load(std::string* why);

// True when load() ran and succeeded (tests: a program that never reached
// a donor has not loaded it).
bool loaded();

}  // namespace farmem::crypto_lib
