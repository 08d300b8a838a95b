// rdma-core on demand (see verbs_lib.h): the ibv_* / rdma_* functions the
// verbs backend calls, each forwarding to the real one in the library that
// load() opened.
#include "runtime/verbs_lib.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <type_traits>

// Our definitions below are hidden: they serve this binary's own calls and
// never interpose on the real libraries (whose internal calls must reach
// each other), even where a program links rdma-core itself too.
#pragma GCC visibility push(hidden)
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#pragma GCC visibility pop

#include "runtime/log.h"

// Every function the backend (verbs_transport.cc, verbs_donor.cc) calls by
// name: library, return type, name, parameters, arguments. A call added to
// the backend without its line here still links (farmem::verbs links
// rdma-core too), but the preload library then needs rdma-core at start-up
// again: tests/allocator/preload_needed.sh fails and names it.
#define FARMEM_VERBS_FUNCTIONS(X)                                                                  \
  X(kIbv, void, ibv_ack_cq_events, (struct ibv_cq * cq, unsigned int n), (cq, n))                  \
  X(kIbv, struct ibv_pd*, ibv_alloc_pd, (struct ibv_context * c), (c))                             \
  X(kIbv, struct ibv_comp_channel*, ibv_create_comp_channel, (struct ibv_context * c), (c))        \
  X(kIbv, struct ibv_cq*, ibv_create_cq,                                                           \
    (struct ibv_context * c, int cqe, void* ctx, struct ibv_comp_channel* ch, int vec),            \
    (c, cqe, ctx, ch, vec))                                                                        \
  X(kIbv, int, ibv_dealloc_pd, (struct ibv_pd * pd), (pd))                                         \
  X(kIbv, int, ibv_dereg_mr, (struct ibv_mr * mr), (mr))                                           \
  X(kIbv, int, ibv_destroy_comp_channel, (struct ibv_comp_channel * ch), (ch))                     \
  X(kIbv, int, ibv_destroy_cq, (struct ibv_cq * cq), (cq))                                         \
  X(kIbv, int, ibv_get_cq_event, (struct ibv_comp_channel * ch, struct ibv_cq * *cq, void** ctx),  \
    (ch, cq, ctx))                                                                                 \
  X(kIbv, const char*, ibv_get_device_name, (struct ibv_device * d), (d))                          \
  X(kIbv, int, ibv_query_device, (struct ibv_context * c, struct ibv_device_attr * a), (c, a))     \
  X(kIbv, struct ibv_mr*, ibv_reg_mr, (struct ibv_pd * pd, void* addr, size_t len, int access),    \
    (pd, addr, len, access))                                                                       \
  X(kIbv, const char*, ibv_wc_status_str, (enum ibv_wc_status s), (s))                             \
  X(kCm, int, rdma_accept, (struct rdma_cm_id * id, struct rdma_conn_param * p), (id, p))          \
  X(kCm, int, rdma_ack_cm_event, (struct rdma_cm_event * e), (e))                                  \
  X(kCm, int, rdma_bind_addr, (struct rdma_cm_id * id, struct sockaddr * a), (id, a))              \
  X(kCm, int, rdma_connect, (struct rdma_cm_id * id, struct rdma_conn_param * p), (id, p))         \
  X(kCm, struct rdma_event_channel*, rdma_create_event_channel, (void), ())                        \
  X(kCm, int, rdma_create_id,                                                                      \
    (struct rdma_event_channel * ch, struct rdma_cm_id * *id, void* ctx, enum rdma_port_space ps), \
    (ch, id, ctx, ps))                                                                             \
  X(kCm, int, rdma_create_qp,                                                                      \
    (struct rdma_cm_id * id, struct ibv_pd * pd, struct ibv_qp_init_attr * a), (id, pd, a))        \
  X(kCm, void, rdma_destroy_event_channel, (struct rdma_event_channel * ch), (ch))                 \
  X(kCm, int, rdma_destroy_id, (struct rdma_cm_id * id), (id))                                     \
  X(kCm, void, rdma_destroy_qp, (struct rdma_cm_id * id), (id))                                    \
  X(kCm, int, rdma_disconnect, (struct rdma_cm_id * id), (id))                                     \
  X(kCm, const char*, rdma_event_str, (enum rdma_cm_event_type e), (e))                            \
  X(kCm, void, rdma_free_devices, (struct ibv_context * *list), (list))                            \
  X(kCm, int, rdma_get_cm_event, (struct rdma_event_channel * ch, struct rdma_cm_event * *e),      \
    (ch, e))                                                                                       \
  X(kCm, int, rdma_listen, (struct rdma_cm_id * id, int backlog), (id, backlog))                   \
  X(kCm, int, rdma_reject, (struct rdma_cm_id * id, const void* data, uint8_t len),                \
    (id, data, len))                                                                               \
  X(kCm, int, rdma_resolve_addr,                                                                   \
    (struct rdma_cm_id * id, struct sockaddr * src, struct sockaddr * dst, int ms),                \
    (id, src, dst, ms))                                                                            \
  X(kCm, int, rdma_resolve_route, (struct rdma_cm_id * id, int ms), (id, ms))                      \
  X(kCm, int, rdma_set_option,                                                                     \
    (struct rdma_cm_id * id, int level, int name, void* val, size_t len),                          \
    (id, level, name, val, len))
// rdma_get_devices is defined by hand below (no device: no loading).

namespace farmem::verbs_lib {
namespace {

enum Lib { kIbv, kCm };
constexpr const char* kSoname[] = {"libibverbs.so.1", "librdmacm.so.1"};

struct Table {
#define FARMEM_VERBS_FIELD(lib, ret, name, params, args) ret(*name) params = nullptr;
  FARMEM_VERBS_FUNCTIONS(FARMEM_VERBS_FIELD)
#undef FARMEM_VERBS_FIELD
  struct ibv_context** (*rdma_get_devices)(int*) = nullptr;
};

Table g_table;
bool g_ok = false;
char g_why[512];  // no allocation: the loader may run inside malloc's callers
pthread_once_t g_once = PTHREAD_ONCE_INIT;

void set_why(const char* what, const char* err) {
  snprintf(g_why, sizeof g_why,
           "%s: %s; the verbs transport needs rdma-core's libibverbs1 and librdmacm1 "
           "(and a provider: ibverbs-providers); or set FARMEM_TRANSPORT=tcp",
           what, err ? err : "unknown error");
}

void do_load() {
  void* h[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    // RTLD_GLOBAL, as when they were linked: libibverbs' provider plugins
    // (dlopened by libibverbs itself) resolve its symbols through it.
    h[i] = dlopen(kSoname[i], RTLD_NOW | RTLD_GLOBAL);
    if (h[i] == nullptr) {
      char what[64];
      snprintf(what, sizeof what, "cannot load %s", kSoname[i]);
      set_why(what, dlerror());
      return;
    }
  }
  Table t;
  const char* missing = nullptr;
  auto resolve = [&](auto& field, Lib lib, const char* name) {
    void* f = dlsym(h[lib], name);
    if (f == nullptr && missing == nullptr) missing = name;
    field = reinterpret_cast<std::remove_reference_t<decltype(field)>>(f);
  };
#define FARMEM_VERBS_RESOLVE(lib, ret, name, params, args) resolve(t.name, lib, #name);
  FARMEM_VERBS_FUNCTIONS(FARMEM_VERBS_RESOLVE)
#undef FARMEM_VERBS_RESOLVE
  resolve(t.rdma_get_devices, kCm, "rdma_get_devices");
  if (missing != nullptr) {
    set_why("rdma-core lacks a function farmem calls", missing);
    return;
  }
  g_table = t;
  __atomic_store_n(&g_ok, true, __ATOMIC_RELEASE);
}

// Loads on first use; false (and the reason logged once) when rdma-core
// cannot be loaded.
bool ready() {
  pthread_once(&g_once, &do_load);
  if (__builtin_expect(g_ok, 1)) return true;
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) FARMEM_LOG(kError, "verbs: %s", g_why);
  errno = ELIBACC;
  return false;
}

// What each kind of function returns when rdma-core is missing (errno is
// ELIBACC): ibv_* return an errno value or NULL, rdma_* -1 or NULL.
template <class R>
R failed(Lib lib) {
  if constexpr (std::is_void_v<R>) {
    return;
  } else if constexpr (std::is_same_v<R, const char*>) {
    return "(rdma-core not loaded)";
  } else if constexpr (std::is_pointer_v<R>) {
    return nullptr;
  } else {
    return lib == kIbv ? ELIBACC : -1;
  }
}

}  // namespace

bool device_present(std::string* why) {
  DIR* d = opendir("/sys/class/infiniband");
  if (d == nullptr) {
    if (why) *why = "no RDMA device on this host (no /sys/class/infiniband)";
    return false;
  }
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') {
      found = true;
      break;
    }
  }
  closedir(d);
  if (!found && why) *why = "no RDMA device on this host (/sys/class/infiniband is empty)";
  return found;
}

bool load(std::string* why) {
  if (ready()) return true;
  if (why) *why = g_why;
  return false;
}

bool loaded() {
  // pthread_once has run when g_ok is true; a racing first load reads false.
  return __atomic_load_n(&g_ok, __ATOMIC_ACQUIRE);
}

}  // namespace farmem::verbs_lib

// ---- the forwarding definitions ----------------------------------------------

using farmem::verbs_lib::failed;
using farmem::verbs_lib::g_table;
using farmem::verbs_lib::ready;

extern "C" {

#pragma GCC visibility push(hidden)
// The name is parenthesized: ibv_reg_mr is also a function-like macro.
#define FARMEM_VERBS_DEFINE(lib, ret, name, params, args)     \
  ret(name) params {                                          \
    if (!ready()) return failed<ret>(farmem::verbs_lib::lib); \
    return (g_table.name)args;                                \
  }
FARMEM_VERBS_FUNCTIONS(FARMEM_VERBS_DEFINE)
#undef FARMEM_VERBS_DEFINE

struct ibv_context** rdma_get_devices(int* num_devices) {
  // No device: say so without loading anything (FARMEM_TRANSPORT=auto and
  // farmemd's --transport auto ask this first).
  if (!farmem::verbs_lib::device_present(nullptr)) {
    if (num_devices) *num_devices = 0;
    errno = ENODEV;
    return nullptr;
  }
  if (!ready()) {
    if (num_devices) *num_devices = 0;
    return nullptr;
  }
  return g_table.rdma_get_devices(num_devices);
}
#pragma GCC visibility pop

}  // extern "C"
