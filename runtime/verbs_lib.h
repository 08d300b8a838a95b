// rdma-core on demand: libibverbs and librdmacm are loaded with dlopen the
// first time the verbs backend needs them, not at process start-up.
//
//   std::string why;
//   if (!farmem::verbs_lib::device_present(&why)) ...;   // no RDMA device: stay on tcp
//   if (!farmem::verbs_lib::load(&why)) ...;             // why: the dlopen error
//
// Why: linked normally, the two libraries (and libnl-3, libnl-route-3 behind
// them) are mapped and relocated in every process that loads farmem, which
// cost every program started under LD_PRELOAD=libfarmem_preload.so 12-17 ms
// of CPU, although almost every run uses tcp or loopback.
//
// How: farmem::verbs (verbs_transport.cc, verbs_donor.cc) keeps calling
// ibv_* and rdma_* by their names; verbs_lib.cc defines those functions
// itself (hidden, so nothing outside the linked binary sees them), and each
// one forwards to the real function resolved from the loaded library. The
// preload library links --as-needed, so rdma-core drops out of its
// DT_NEEDED; farmemd and the tests still link it (the forwarders then reach
// that same copy). Only
// the functions the backend calls are defined (the inline data-path calls,
// ibv_post_send and ibv_poll_cq, go through the device context and need no
// symbol). When rdma-core cannot be loaded, each of them fails the way its
// own documentation says it fails, with errno ELIBACC, and the first failure
// logs the dlopen error once; rdma_get_devices() reports no device without
// loading anything when /sys/class/infiniband lists none.
//
// Thread-safe: the loading runs once (pthread_once); after it, a call costs
// one indirect call.
#pragma once

#include <string>

namespace farmem::verbs_lib {

// True when /sys/class/infiniband lists at least one RDMA device (a real
// NIC, or a Soft-RoCE rxe device). Reads sysfs only: loads nothing.
// Otherwise *why (when not null) says what was found.
bool device_present(std::string* why);

// Loads libibverbs.so.1 and librdmacm.so.1 and resolves every function the
// backend calls; done once per process, later calls return the first
// result. false: *why (when not null) has the dlopen / dlsym error and what
// to install.
bool load(std::string* why);

// True when load() ran and succeeded (tests: a tcp run must not load).
bool loaded();

}  // namespace farmem::verbs_lib
