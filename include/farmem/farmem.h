/* farmem: far memory for C programs.
 *
 *   #include <farmem/farmem.h>
 *
 *   fm_config c;
 *   fm_config_init(&c);
 *   c.servers = "10.0.0.5:7400";          // a farmemd
 *   c.token_file = "/etc/farmem/token";
 *   c.local_mem = 512 << 20;              // at most 512 MiB of far pages resident here
 *   if (fm_init(&c) != 0) { fprintf(stderr, "farmem: %s\n", fm_last_error()); exit(1); }
 *   double* v = fm_calloc(1 << 28, sizeof *v);   // 2 GiB, mostly on the donor
 *   ...
 *   fm_free(v);
 *   fm_shutdown();
 *
 * fm_init(NULL) reads the FARMEM_* environment variables instead (the table
 * is in the README). Far memory is ordinary memory to the program: any
 * thread may read and write it; pages are fetched on first touch and
 * written back when the local budget needs room.
 *
 * Errors: every function is noexcept. On failure a function returns NULL
 * or -1 and sets errno; fm_last_error() gives this thread's last message:
 *   ENXIO   farmem is not initialised (fm_init) or was shut down
 *   ENOMEM  the far region is exhausted, or a size overflows
 *   EINVAL  a pointer that is not far memory, a bad alignment or range
 *   EALREADY fm_init while running
 *   ENOMEM  also: fm_pin would pin more than the local budget allows
 * fm_init also sets ECONNREFUSED (no donor reachable), EACCES (token
 * refused), EPERM (userfaultfd not permitted) or EINVAL (bad config).
 *
 * Thread safety: all functions are thread-safe, except that fm_init and
 * fm_shutdown must not race with other calls (far memory is unmapped by
 * fm_shutdown; nothing allocated before it may be used after it).
 */
#ifndef FARMEM_FARMEM_H_
#define FARMEM_FARMEM_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#define FM_NOEXCEPT noexcept
extern "C" {
#else
#define FM_NOEXCEPT
#endif

#define FM_API __attribute__((visibility("default")))

typedef struct fm_config {
  size_t struct_size;         /* sizeof(fm_config); set by fm_config_init */
  const char* servers;        /* "HOST:PORT[,HOST:PORT...]" (tcp) */
  const char* transport;      /* "auto" (default: verbs if RDMA reaches the donors, else tcp),
                                 "tcp", "verbs" or "loopback" (in-process donor) */
  const char* token_file;     /* the donors' shared token; NULL = none (insecure donors) */
  uint64_t local_mem;         /* local budget in bytes; 0 = 256 MiB */
  uint64_t loopback_capacity; /* loopback donor size; 0 = 1 GiB */
  uint64_t region_size;       /* far address space; 0 = the donors' capacity */
  uint32_t block_size;        /* fetch granularity; 0 = 4096 */
  uint32_t pager_threads;     /* fault handler threads; 0 = default */
  int32_t prefetch;           /* -1 = default (on), 0 = off, 1 = on */
  int32_t decay_ms;           /* freed pages dropped after; -1 = default (1000) */
  int32_t connect_timeout_ms; /* per donor; 0 = 3000 */
} fm_config;

/* Statistics. struct_size makes the struct extensible without breaking
   callers built against an older or newer header: set it before the call
   (fm_stats_init()); fm_stats() fills the fields that both
   the caller's and the library's struct have and sets struct_size to the
   bytes it filled (fields past that are left as they were). */
typedef struct fm_stats_t {
  size_t struct_size;           /* in: sizeof(fm_stats_t); out: bytes filled */
  uint64_t region_size;         /* far address space */
  uint64_t far_allocated;       /* bytes in live far allocations */
  uint64_t far_active;          /* bytes of pages holding live allocations */
  uint64_t far_mallocs;         /* far allocations so far */
  uint64_t far_frees;           /* far frees so far */
  uint64_t local_fallbacks;     /* preload: large allocations served locally */
  uint64_t resident_bytes;      /* far pages resident here now */
  uint64_t resident_peak_bytes; /* highest resident_bytes */
  uint64_t budget_bytes;        /* the local budget */
  uint64_t remote_bytes;        /* remote space holding written-back pages */
  uint64_t faults_zero;         /* first touch of a never-written page (no I/O) */
  uint64_t faults_remote;       /* page fetched from a donor */
  uint64_t faults_victim;       /* page found in the local victim cache (no I/O) */
  uint64_t faults_wp;           /* first write to a clean resident page */
  uint64_t evictions_clean;     /* pages dropped without I/O */
  uint64_t evictions_dirty;     /* pages written back, then dropped */
  uint64_t bytes_read;          /* from donors */
  uint64_t bytes_written;       /* to donors */
  uint64_t fetch_p50_us;        /* demand fetch latency, upper bound of the bucket */
  uint64_t fetch_p99_us;
  /* FM_STATS_SIZE_V1 ends here. */
  uint64_t faults_waited;   /* faults that found their page busy or the budget full */
  uint64_t pinned_bytes;    /* held resident by fm_pin (part of resident_bytes) */
  uint64_t prefetch_issued; /* pages read ahead of a fault */
  uint64_t prefetch_used;   /* read-ahead pages touched before eviction */
  uint64_t prefetch_unused; /* read-ahead pages dropped untouched */
  uint64_t zero_around;     /* never-written pages mapped with a neighbour's first touch */
  uint64_t populated_bytes; /* never-written pages mapped when allocated (no fault) */
} fm_stats_t;

/* The smallest struct_size fm_stats() accepts: struct_size and the fields
   up to fetch_p99_us. */
#define FM_STATS_SIZE_V1 (offsetof(fm_stats_t, fetch_p99_us) + sizeof(uint64_t))
/* Inline, so that struct_size is the size the caller was compiled with. */
static inline void fm_stats_init(fm_stats_t* s) FM_NOEXCEPT {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
}

FM_API void fm_config_init(fm_config* config) FM_NOEXCEPT;
/* config NULL: from the environment. */
FM_API int fm_init(const fm_config* config) FM_NOEXCEPT;
FM_API int fm_shutdown(void) FM_NOEXCEPT;
FM_API int fm_is_running(void) FM_NOEXCEPT;

FM_API void* fm_malloc(size_t size) FM_NOEXCEPT;
FM_API void* fm_calloc(size_t count, size_t size) FM_NOEXCEPT;
/* ptr NULL: fm_malloc. size 0: frees ptr and returns NULL. On failure ptr
   is left as it was. */
FM_API void* fm_realloc(void* ptr, size_t size) FM_NOEXCEPT;
/* NULL is a no-op; a pointer that is not far memory is reported (EINVAL,
   a message on stderr) and left alone. */
FM_API void fm_free(void* ptr) FM_NOEXCEPT;
/* alignment: a power of two. */
FM_API void* fm_aligned_alloc(size_t alignment, size_t size) FM_NOEXCEPT;
FM_API size_t fm_usable_size(const void* ptr) FM_NOEXCEPT;
/* 1 when ptr lies in the far region. */
FM_API int fm_is_far(const void* ptr) FM_NOEXCEPT;

/* Hints on [ptr, ptr+len), which must lie in far memory (else -1/EINVAL).
   Each covers every pager block (FARMEM_BLOCK_SIZE) holding a byte of the
   range, so a neighbour sharing the first or last block is covered too;
   contents never change.
   fm_prefetch: fetch the range now (returns when it is resident, or early
     when the local budget stays full: it is advice).
   fm_evict: write the range's modified pages back and drop them from local
     memory now; the next access fetches them again.
   fm_pin: make the range resident and keep it so until fm_unpin (pins are
     counted per block). Pinned memory counts against the local budget; at
     most about two thirds of the budget may be pinned: beyond that -1/ENOMEM
     and nothing of the range stays pinned.
   fm_unpin: -1/EINVAL when a block of the range is not pinned. */
FM_API int fm_prefetch(const void* ptr, size_t len) FM_NOEXCEPT;
FM_API int fm_evict(const void* ptr, size_t len) FM_NOEXCEPT;
FM_API int fm_pin(const void* ptr, size_t len) FM_NOEXCEPT;
FM_API int fm_unpin(const void* ptr, size_t len) FM_NOEXCEPT;

/* out->struct_size below FM_STATS_SIZE_V1: -1/EINVAL. */
FM_API int fm_stats(fm_stats_t* out) FM_NOEXCEPT;
/* This thread's last error message ("" when none). */
FM_API const char* fm_last_error(void) FM_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* FARMEM_FARMEM_H_ */
