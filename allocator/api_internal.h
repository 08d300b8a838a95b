// The process-wide runtime behind the C API (include/farmem/farmem.h),
// shared with the preload shim, which starts it from the environment and
// then serves malloc from its heap.
//
//   FARMEM_RETURN_IF_ERROR(farmem::api_start(options));
//   farmem::FarHeap& h = farmem::api_runtime()->heap();
#pragma once

#include <atomic>
#include <cstdint>

#include "allocator/far_runtime.h"
#include "runtime/status.h"

struct fm_stats_t;

namespace farmem {

// kInvalidArgument ("already running") when a runtime exists.
Status api_start(const FarOptions& o);
// nullptr when not running. Acquire load: safe to use from any thread.
FarRuntime* api_runtime() noexcept;
// Large allocations the preload shim served locally (far region full).
extern std::atomic<uint64_t> g_local_fallbacks;
// Fills out from the running runtime; false when none.
bool api_stats(fm_stats_t* out) noexcept;
// errno value for a Status code.
int errno_of(Errc e) noexcept;

}  // namespace farmem
