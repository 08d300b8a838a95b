// libcrypto on demand (see crypto_lib.h): the libcrypto functions farmem
// calls, each forwarding to the real one in the library load() opened.
#include "runtime/crypto_lib.h"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <type_traits>

// Hidden, so that they serve this binary's own calls only and never
// interpose on libcrypto's callers elsewhere in the process.
#pragma GCC visibility push(hidden)
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#pragma GCC visibility pop

#include "runtime/log.h"

#ifndef FARMEM_CRYPTO_SONAME
#define FARMEM_CRYPTO_SONAME "libcrypto.so.3"
#endif

namespace farmem::crypto_lib {
namespace {

struct Table {
  unsigned char* (*hmac)(const EVP_MD*, const void*, int, const unsigned char*, size_t,
                         unsigned char*, unsigned int*) = nullptr;
  const EVP_MD* (*sha256)() = nullptr;
  int (*memcmp)(const void*, const void*, size_t) = nullptr;
};

Table g_table;
bool g_ok = false;
char g_why[384];  // no allocation while loading
pthread_once_t g_once = PTHREAD_ONCE_INIT;

void do_load() {
  void* h = dlopen(FARMEM_CRYPTO_SONAME, RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    const char* e = dlerror();
    snprintf(g_why, sizeof g_why,
             "cannot load " FARMEM_CRYPTO_SONAME
             ": %s; farmem's donor handshake needs OpenSSL's "
             "libcrypto (Debian: libssl3)",
             e ? e : "unknown error");
    return;
  }
  Table t;
  const char* missing = nullptr;
  auto resolve = [&](auto& field, const char* name) {
    void* f = dlsym(h, name);
    if (f == nullptr && missing == nullptr) missing = name;
    field = reinterpret_cast<std::remove_reference_t<decltype(field)>>(f);
  };
  resolve(t.hmac, "HMAC");
  resolve(t.sha256, "EVP_sha256");
  resolve(t.memcmp, "CRYPTO_memcmp");
  if (missing != nullptr) {
    snprintf(g_why, sizeof g_why, FARMEM_CRYPTO_SONAME " has no function %s", missing);
    return;
  }
  g_table = t;
  __atomic_store_n(&g_ok, true, __ATOMIC_RELEASE);
}

bool ready() {
  pthread_once(&g_once, &do_load);
  if (__builtin_expect(g_ok, 1)) return true;
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) FARMEM_LOG(kError, "crypto: %s", g_why);
  return false;
}

}  // namespace

bool load(std::string* why) {
  if (ready()) return true;
  if (why) *why = g_why;
  return false;
}

bool loaded() {
  return __atomic_load_n(&g_ok, __ATOMIC_ACQUIRE);
}

}  // namespace farmem::crypto_lib

// ---- the forwarding definitions ----------------------------------------------

using farmem::crypto_lib::g_table;
using farmem::crypto_lib::ready;

extern "C" {
#pragma GCC visibility push(hidden)

unsigned char* HMAC(const EVP_MD* md, const void* key, int key_len, const unsigned char* data,
                    size_t data_len, unsigned char* out, unsigned int* out_len) {
  if (!ready()) return nullptr;
  return g_table.hmac(md, key, key_len, data, data_len, out, out_len);
}

const EVP_MD* EVP_sha256(void) {
  if (!ready()) return nullptr;
  return g_table.sha256();
}

// "Not equal" when libcrypto is missing: a MAC never matches by accident.
int CRYPTO_memcmp(const void* a, const void* b, size_t len) {
  if (!ready()) return 1;
  return g_table.memcmp(a, b, len);
}

#pragma GCC visibility pop
}  // extern "C"
