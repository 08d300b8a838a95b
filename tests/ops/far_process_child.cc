// A far-memory process for far_process_stats_test: fm_init(NULL) from the
// FARMEM_* environment, writes 4x its local budget, reads it back, prints
// its own counters on one line, then waits for stdin to close and exits.
//
//   FARMEM_SERVERS=127.0.0.1:7400 FARMEM_LOCAL_MEM=4M far_process_child
//   -> "ready faults_remote=N evictions_dirty=N resident=N budget=N sock=PATH"
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <thread>

#include "allocator/api_internal.h"
#include "farmem/farmem.h"

int main() {
  if (fm_init(nullptr) != 0) {
    fprintf(stderr, "far_process_child: %s\n", fm_last_error());
    return 2;
  }
  fm_stats_t s;
  fm_stats_init(&s);
  (void)fm_stats(&s);
  const size_t n = 4 * s.budget_bytes;
  auto* p = static_cast<uint8_t*>(fm_malloc(n));
  if (p == nullptr) {
    fprintf(stderr, "far_process_child: %s\n", fm_last_error());
    return 3;
  }
  for (size_t i = 0; i < n; i += 512) p[i] = static_cast<uint8_t>(i >> 9);
  for (size_t i = 0; i < n; i += 512) {
    if (p[i] != static_cast<uint8_t>(i >> 9)) {
      fprintf(stderr, "far_process_child: byte %zu differs\n", i);
      return 4;
    }
  }
  // Fault counters are bumped just after the faulting thread is woken:
  // wait (bounded) until they settle.
  fm_stats_t again;
  fm_stats_init(&again);
  (void)fm_stats(&s);
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (void)fm_stats(&again);
    if (again.faults_remote == s.faults_remote && again.faults_zero == s.faults_zero) break;
    s = again;
  }
  farmem::FarRuntime* rt = farmem::api_runtime();
  printf("ready faults_remote=%" PRIu64 " evictions_dirty=%" PRIu64 " resident=%" PRIu64
         " budget=%" PRIu64 " sock=%s\n",
         again.faults_remote, again.evictions_dirty, again.resident_bytes, again.budget_bytes,
         rt->stats_socket_path().c_str());
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  fm_free(p);
  return fm_shutdown() == 0 ? 0 : 5;
}
