// The private jemalloc copy's entry points (see allocator/CMakeLists.txt:
// Debian's libjemalloc_pic.a with its public symbols renamed farmem_je_*),
// plus the types of jemalloc's public header.
//
//   unsigned arena = ...;
//   void* p = farmem_je_mallocx(4096, MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE);
//   farmem_je_dallocx(p, MALLOCX_TCACHE_NONE);
//
// Only allocator/*.cc include this; the preload shim never does (jemalloc.h
// declares malloc & co., which the shim defines).
#pragma once

#include <jemalloc/jemalloc.h>

#include <cstddef>

extern "C" {
void* farmem_je_mallocx(size_t size, int flags);
void* farmem_je_rallocx(void* ptr, size_t size, int flags);
size_t farmem_je_sallocx(const void* ptr, int flags);
size_t farmem_je_xallocx(void* ptr, size_t size, size_t extra, int flags);
void farmem_je_dallocx(void* ptr, int flags);
size_t farmem_je_nallocx(size_t size, int flags);
int farmem_je_mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);
}

namespace farmem {

// jemalloc 5.3's arena_config_t, the argument of the mallctl
// "experimental.arenas_create_ext" (not in the public header). With
// metadata_use_hooks = false the arena's own metadata stays in local
// memory instead of being carved out of the far region.
struct JeArenaConfig {
  extent_hooks_t* extent_hooks;
  bool metadata_use_hooks;
};

}  // namespace farmem
