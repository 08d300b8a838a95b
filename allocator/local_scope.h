// Routing of allocations made by farmem itself: local memory, never far.
//
//   {
//     farmem::LocalScope local;       // this thread's mallocs go to glibc
//     auto rt = farmem::FarRuntime::start(opts);
//   }
//
// Invariant 3: the pager's threads and everything on the fault path use
// local memory. In the preload library every malloc is interposed, so the
// runtime's own allocations (set-up, the extent hooks, statistics) run
// inside a LocalScope, and threads created while one is active (pager
// handlers, the evictor, the donor heartbeat) are local for their whole
// life (preload/shim.cc wraps pthread_create for that). Outside the preload
// library the flag is set but nobody reads it.
//
// The flag is a plain initial-exec TLS int: reading it costs one load.
#pragma once

namespace farmem {

// > 0: this thread's allocations are local. Internal threads start at 1.
extern __thread int t_local_depth __attribute__((tls_model("initial-exec")));

inline bool in_local_scope() noexcept {
  return t_local_depth > 0;
}

class LocalScope {
 public:
  LocalScope() noexcept { ++t_local_depth; }
  ~LocalScope() { --t_local_depth; }
  LocalScope(const LocalScope&) = delete;
  LocalScope& operator=(const LocalScope&) = delete;
};

}  // namespace farmem
