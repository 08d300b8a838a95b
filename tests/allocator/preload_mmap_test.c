/* Anonymous mmap under the preload library (issue 17 part 2; preload/shim.cc,
 * "Anonymous mmap"): each semantic a program relies on, checked on
 * mappings that must be far (their VMA is registered with userfaultfd:
 * "um" in /proc/self/smaps VmFlags) and on ones that must stay with the
 * kernel. Run by preload_mmap.sh twice: without the library (FAR unset:
 * the kernel's own semantics, the far-only checks skipped) and with it at
 * a small budget (MMAP_TEST_FAR=1). Exits 0 when every check passed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_far;      /* the preload library is expected to take qualifying mmaps */
static int g_failures; /* checks that failed */

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __func__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      ++g_failures;                                        \
    }                                                      \
  } while (0)

enum { kMiB = 1 << 20 };
static const int kRW = PROT_READ | PROT_WRITE;
static const int kAnon = MAP_PRIVATE | MAP_ANONYMOUS;

static void* map(size_t n) {
  void* p = mmap(NULL, n, kRW, kAnon, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  return p;
}

/* Is p's VMA registered with userfaultfd (the far region)? */
static int vma_is_far(const void* p) {
  FILE* f = fopen("/proc/self/smaps", "r");
  if (f == NULL) return -1;
  char line[512];
  int in = 0, far = 0;
  uintptr_t a = (uintptr_t)p;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      in = a >= lo && a < hi;
      continue;
    }
    if (in && strncmp(line, "VmFlags:", 8) == 0) {
      far = strstr(line, " um") != NULL;
      break;
    }
  }
  fclose(f);
  return far;
}

static void expect_far(const void* p, const char* what) {
  int f = vma_is_far(p);
  if (g_far) {
    CHECK(f == 1, "%s at %p is not in the far region", what, p);
  } else {
    CHECK(f == 0, "%s at %p is in a userfaultfd region without the library", what, p);
  }
}

static void expect_kernel(const void* p, const char* what) {
  CHECK(vma_is_far(p) == 0, "%s at %p went to the far region", what, p);
}

/* The value of a gauge in this process's stats socket (the library's
 * live statistics, runtime/stats_socket.h); -1 when unavailable. */
static long long stat_gauge(const char* name) {
  char path[108];
  const char* xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg) {
    snprintf(path, sizeof path, "%s/farmem/%d.sock", xdg, (int)getpid());
  } else {
    snprintf(path, sizeof path, "/tmp/farmem-%d/%d.sock", (int)getuid(), (int)getpid());
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  if (connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  static char buf[1 << 16];
  size_t n = 0;
  ssize_t r;
  while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
  close(fd);
  buf[n] = 0;
  char key[128];
  snprintf(key, sizeof key, "\ngauge %s - ", name);
  char* at = strstr(buf, key);
  return at ? strtoll(at + strlen(key), NULL, 10) : -1;
}

static uint64_t word(uint64_t seed, size_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  return x * 0xBF58476D1CE4E5B9ull;
}
static void fill(void* p, size_t n, uint64_t seed) {
  uint64_t* w = p;
  for (size_t i = 0; i < n / 8; ++i) w[i] = word(seed, i);
}
/* Index of the first wrong word, or SIZE_MAX. */
static size_t verify(const void* p, size_t n, uint64_t seed) {
  const uint64_t* w = p;
  for (size_t i = 0; i < n / 8; ++i)
    if (w[i] != word(seed, i)) return i;
  return SIZE_MAX;
}
/* verify() of [off, off+n) of a buffer filled from p with `seed`. */
static size_t verify_part(const void* p, size_t off, size_t n, uint64_t seed) {
  const uint64_t* w = p;
  for (size_t i = off / 8; i < (off + n) / 8; ++i)
    if (w[i] != word(seed, i)) return i;
  return SIZE_MAX;
}
static int all_zero(const void* p, size_t n) {
  const unsigned char* c = p;
  for (size_t i = 0; i < n; ++i)
    if (c[i]) return 0;
  return 1;
}

/* Touches a region larger than the budget: what was written before is evicted. */
static void churn(void) {
  size_t n = 48 * (size_t)kMiB;
  char* q = map(n);
  for (size_t i = 0; i < n; i += 4096) q[i] = 1;
  CHECK(munmap(q, n) == 0, "munmap churn: %s", strerror(errno));
}

static void test_fresh_zero_and_recycled(void) {
  for (int round = 0; round < 4; ++round) {
    size_t n = (size_t)(1 + round) * 256 * 1024;
    char* p = map(n);
    expect_far(p, "a fresh anonymous mapping");
    CHECK(all_zero(p, n), "round %d: fresh mapping of %zu bytes is not zero", round, n);
    memset(p, 0xA5, n);
    CHECK(munmap(p, n) == 0, "munmap: %s", strerror(errno));
  }
  /* An odd length: rounded up to pages, the tail of the last page usable. */
  char* p = map(100000);
  CHECK(all_zero(p, 102400), "odd-length mapping is not zero");
  memset(p, 1, 102400);
  CHECK(munmap(p, 100000) == 0, "munmap odd length: %s", strerror(errno));
}

static void test_eviction_byte_exact_and_remote_freed(void) {
  size_t n = 40 * (size_t)kMiB; /* five times the budget */
  char* p = map(n);
  expect_far(p, "a 40 MiB mapping");
  fill(p, n, 7);
  size_t bad = verify(p, n, 7);
  CHECK(bad == SIZE_MAX, "40 MiB mapping differs at word %zu after eviction", bad);
  if (!g_far) {
    CHECK(munmap(p, n) == 0, "munmap: %s", strerror(errno));
    return;
  }
  long long before = stat_gauge("remote_bytes");
  CHECK(before >= 16ll * kMiB, "remote_bytes %lld after writing 40 MiB at an 8 MiB budget", before);
  CHECK(munmap(p, n) == 0, "munmap: %s", strerror(errno));
  long long after = stat_gauge("remote_bytes");
  CHECK(after >= 0 && before - after >= 16ll * kMiB,
        "munmap freed no remote copies: remote_bytes %lld -> %lld", before, after);
  printf("remote copies: %lld -> %lld bytes after munmap of 40 MiB\n", before, after);
}

static void test_dontneed_free(void) {
  int adv[2] = {MADV_DONTNEED, MADV_FREE};
  for (int k = 0; k < 2; ++k) {
    size_t n = 4 * (size_t)kMiB;
    char* p = map(n);
    fill(p, n, 11);
    /* The middle 2 MiB: resident for one round, evicted for the other. */
    if (k == 1) churn();
    CHECK(madvise(p + kMiB, 2 * (size_t)kMiB, adv[k]) == 0, "madvise %d: %s", adv[k],
          strerror(errno));
    /* The kernel keeps MADV_FREE pages until it needs memory; far memory
     * drops them at once. */
    if (adv[k] == MADV_DONTNEED || g_far)
      CHECK(all_zero(p + kMiB, 2 * (size_t)kMiB), "advice %d: the range does not read zeros",
            adv[k]);
    CHECK(verify(p, kMiB, 11) == SIZE_MAX, "advice %d: the head changed", adv[k]);
    /* The tail's words are the sequence's from 3 MiB on. */
    const uint64_t* w = (const uint64_t*)(p + 3 * kMiB);
    size_t bad = SIZE_MAX;
    for (size_t i = 0; i < kMiB / 8; ++i)
      if (w[i] != word(11, 3 * kMiB / 8 + i)) {
        bad = i;
        break;
      }
    CHECK(bad == SIZE_MAX, "advice %d: the tail changed at word %zu", adv[k], bad);
    /* Written again after the advice: the new data stays. */
    memset(p + kMiB, 0x5A, 4096);
    CHECK(((unsigned char*)p)[kMiB + 4095] == 0x5A, "write after advice lost");
    CHECK(madvise(p, n, MADV_WILLNEED) == 0, "MADV_WILLNEED: %s", strerror(errno));
    CHECK(madvise(p, n, MADV_NORMAL) == 0, "MADV_NORMAL: %s", strerror(errno));
    CHECK(munmap(p, n) == 0, "munmap: %s", strerror(errno));
  }
}

/* madvise(MADV_DONTNEED) on malloc()ed memory (the far heap's, under the
 * library) reads back zeros too, and mprotect to read-write succeeds. */
static void test_dontneed_heap(void) {
  size_t n = (size_t)kMiB;
  void* v = NULL;
  CHECK(posix_memalign(&v, 4096, n) == 0, "posix_memalign");
  char* p = v;
  memset(p, 0x33, n);
  CHECK(madvise(p + 4096, 8192, MADV_DONTNEED) == 0, "madvise on the heap: %s", strerror(errno));
  CHECK(all_zero(p + 4096, 8192), "DONTNEED on the heap does not read zeros");
  CHECK(p[4095] == 0x33 && p[3 * 4096] == 0x33, "DONTNEED on the heap changed its neighbours");
  CHECK(mprotect(p, n, kRW) == 0, "mprotect read-write on the heap: %s", strerror(errno));
  free(p);
}

static void test_partial_munmap(void) {
  size_t n = 2 * (size_t)kMiB;
  char* p = map(n);
  fill(p, n, 13);
  size_t q = 256 * 1024;
  CHECK(munmap(p + q, q) == 0, "munmap middle: %s", strerror(errno)); /* [256K, 512K) */
  CHECK(munmap(p, 4096) == 0, "munmap head page: %s", strerror(errno));
  CHECK(munmap(p + n - 8192, 8192) == 0, "munmap tail: %s", strerror(errno));
  const uint64_t* w = (const uint64_t*)p;
  size_t bad = SIZE_MAX;
  for (size_t i = 4096 / 8; i < (n - 8192) / 8 && bad == SIZE_MAX; ++i) {
    if (i >= q / 8 && i < 2 * q / 8) continue;
    if (w[i] != word(13, i)) bad = i;
  }
  CHECK(bad == SIZE_MAX, "what is left after partial munmaps differs at word %zu", bad);
  /* Remapping the hole: the kernel or the far heap gives zeros. */
  char* r = map(q);
  CHECK(all_zero(r, q), "a new mapping (maybe the hole) is not zero");
  CHECK(munmap(r, q) == 0, "munmap: %s", strerror(errno));
  /* The rest in one call spanning the holes. */
  CHECK(munmap(p, n) == 0, "munmap across holes: %s", strerror(errno));
  CHECK(munmap(p, n) == 0, "munmap of an unmapped range: %s", strerror(errno));
  CHECK(munmap(p + 1, 4096) == -1 && errno == EINVAL, "munmap of an unaligned address");
}

static void test_mremap(void) {
  size_t n = (size_t)kMiB;
  char* p = map(n);
  fill(p, n, 17);
  /* Grow, moving if it must. */
  char* g = mremap(p, n, 4 * n, MREMAP_MAYMOVE);
  CHECK(g != MAP_FAILED, "mremap grow: %s", strerror(errno));
  if (g == MAP_FAILED) return;
  expect_far(g, "a grown mapping");
  CHECK(verify(g, n, 17) == SIZE_MAX, "mremap grow lost data");
  CHECK(all_zero(g + n, 3 * n), "mremap grow: the new part is not zero");
  fill(g, 4 * n, 19);
  /* Shrink in place. */
  char* s = mremap(g, 4 * n, n / 2, 0);
  CHECK(s == g, "mremap shrink moved or failed: %s", strerror(errno));
  CHECK(verify(s, n / 2, 19) == SIZE_MAX, "mremap shrink lost data");
  /* Grow without MREMAP_MAYMOVE: in place or ENOMEM, never elsewhere. */
  char* t = mremap(s, n / 2, n, 0);
  CHECK(t == s || (t == MAP_FAILED && errno == ENOMEM), "mremap grow in place: %p vs %p (%s)",
        (void*)t, (void*)s, strerror(errno));
  size_t len = t == s ? n : n / 2;
  if (t == s) CHECK(all_zero(s + n / 2, n / 2), "grown in place: the new part is not zero");
  CHECK(verify(s, n / 2, 19) == SIZE_MAX, "mremap grow in place lost data");
  /* Grow a lot after eviction: moves, data byte-exact. */
  fill(s, len, 23);
  churn();
  char* m = mremap(s, len, 16 * n, MREMAP_MAYMOVE);
  CHECK(m != MAP_FAILED, "mremap grow 16x: %s", strerror(errno));
  if (m == MAP_FAILED) return;
  CHECK(verify(m, len, 23) == SIZE_MAX, "mremap grow 16x lost data");
  CHECK(all_zero(m + len, 16 * n - len), "mremap grow 16x: the new part is not zero");
  if (g_far) {
    void* x = mremap(m, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, (void*)0x100000000000ull);
    CHECK(x == MAP_FAILED && errno == EINVAL, "MREMAP_FIXED of a far mapping is refused");
  }
  CHECK(munmap(m, 16 * n) == 0, "munmap: %s", strerror(errno));
}

static sigjmp_buf g_jb;
static void* volatile g_fault_at;
static void on_segv(int sig, siginfo_t* si, void* uc) {
  (void)sig;
  (void)uc;
  g_fault_at = si->si_addr;
  siglongjmp(g_jb, 1);
}
/* 1 when reading p (writing what it holds when `write`) raises SIGSEGV at
 * p, 0 when the access goes through, -1 when it faults elsewhere. */
static int segv_at(volatile char* p, int write) {
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old);
  int r = 0;
  g_fault_at = NULL;
  if (sigsetjmp(g_jb, 1) == 0) {
    char c = *p;
    if (write) *p = c;
  } else {
    r = g_fault_at == (void*)p ? 1 : -1;
  }
  sigaction(SIGSEGV, &old, NULL);
  return r;
}
static int pages_writable(char* p, size_t n) {
  for (size_t i = 0; i < n; i += 4096)
    if (segv_at(p + i, 1) != 0) return 0;
  return 1;
}

/* mprotect on far memory: the kernel enforces it (SIGSEGV at the address)
 * through eviction around it, read-write again makes the data evictable
 * and byte-exact, DONTNEED keeps it, munmap and mremap behave as the
 * kernel's, and a range too big to hold resident is refused with ENOMEM. */
static void test_mprotect(void) {
  size_t n = (size_t)kMiB, off = 64 * 1024, rl = 256 * 1024;
  char* p = map(n);
  char* r = p + off;
  fill(p, n, 41);
  CHECK(mprotect(p, n, kRW) == 0, "mprotect read-write: %s", strerror(errno));
  CHECK(mprotect(r, rl, PROT_READ) == 0, "mprotect PROT_READ: %s", strerror(errno));
  CHECK(segv_at(r, 1) == 1 && segv_at(r + rl - 1, 1) == 1, "a write to PROT_READ went through");
  CHECK(segv_at(r, 0) == 0, "a read of PROT_READ faulted");
  CHECK(segv_at(r - 1, 1) == 0 && segv_at(r + rl, 1) == 0, "the neighbours are not writable");
  CHECK(mprotect(r + 4096, 4096, PROT_NONE) == 0, "mprotect PROT_NONE: %s", strerror(errno));
  CHECK(segv_at(r + 4096, 0) == 1, "a read of PROT_NONE went through");
  churn(); /* the rest of p is evicted, the protected part stays */
  CHECK(segv_at(r, 1) == 1 && segv_at(r + 4096, 0) == 1, "eviction lifted a protection");
  CHECK(verify_part(p, 0, off + 4096, 41) == SIZE_MAX, "data before the PROT_NONE page changed");
  CHECK(verify_part(p, off + 8192, n - off - 8192, 41) == SIZE_MAX,
        "data after the PROT_NONE page changed");
  CHECK(mprotect(r, rl, kRW) == 0, "mprotect back: %s", strerror(errno));
  CHECK(verify(p, n, 41) == SIZE_MAX, "protecting changed the data");
  CHECK(pages_writable(r, rl), "read-write again, but a write faults");
  fill(p, n, 43);
  churn(); /* unprotected: evicted and fetched back byte-exact */
  CHECK(verify(p, n, 43) == SIZE_MAX, "data written after mprotect back differs after eviction");
  /* DONTNEED keeps the protection; the range reads zeros. */
  CHECK(mprotect(r, rl, PROT_READ) == 0, "mprotect PROT_READ again: %s", strerror(errno));
  CHECK(madvise(r, rl, MADV_DONTNEED) == 0, "DONTNEED on PROT_READ: %s", strerror(errno));
  CHECK(all_zero(r, rl), "DONTNEED on PROT_READ: not zeros");
  CHECK(segv_at(r + 8192, 1) == 1, "DONTNEED lifted the protection");
  CHECK(verify_part(p, 0, off, 43) == SIZE_MAX, "DONTNEED changed the head");
  /* munmap of a protected mapping: its space comes back read-write. */
  CHECK(mprotect(p, n, PROT_NONE) == 0, "mprotect PROT_NONE (all): %s", strerror(errno));
  CHECK(munmap(p, n) == 0, "munmap of PROT_NONE: %s", strerror(errno));
  for (int k = 0; k < 4; ++k) {
    char* q = map(n);
    CHECK(pages_writable(q, n) && all_zero(q, n),
          "round %d: a new mapping (%s) is not zeroed "
          "read-write memory",
          k, q == p ? "the unmapped range" : "elsewhere");
    CHECK(munmap(q, n) == 0, "munmap: %s", strerror(errno));
  }
  /* mremap: one protection over the range moves with it and covers the
   * grown part; mixed protections are refused (EFAULT: several VMAs). */
  char* m = map(n);
  fill(m, n, 47);
  CHECK(mprotect(m + 8192, 8192, PROT_READ) == 0, "mprotect before mremap: %s", strerror(errno));
  char* x = mremap(m, n, 8 * n, MREMAP_MAYMOVE);
  CHECK(x == MAP_FAILED && errno == EFAULT, "mremap of mixed protections: %p (%s)", (void*)x,
        strerror(errno));
  CHECK(mprotect(m, n, PROT_READ) == 0, "mprotect all before mremap: %s", strerror(errno));
  char* g = mremap(m, n, 3 * n, MREMAP_MAYMOVE);
  CHECK(g != MAP_FAILED, "mremap of a protected mapping: %s", strerror(errno));
  if (g != MAP_FAILED) {
    CHECK(verify(g, n, 47) == SIZE_MAX, "mremap of a protected mapping lost data");
    CHECK(segv_at(g, 1) == 1 && segv_at(g + n - 1, 1) == 1 && segv_at(g + 3 * n - 1, 1) == 1,
          "mremap lost the protection");
    CHECK(all_zero(g + n, 2 * n), "the grown part is not zero");
    CHECK(mprotect(g, 3 * n, kRW) == 0 && pages_writable(g, 3 * n), "mremapped: read-write again");
    CHECK(mprotect(g + 4096, 4096, PROT_NONE) == 0, "mprotect one page: %s", strerror(errno));
    char* t = mremap(g, 3 * n, 2 * n, 0); /* shrink across two protections: allowed */
    CHECK(t == g, "mremap shrink of mixed protections: %s", strerror(errno));
    CHECK(segv_at(g + 4096, 0) == 1 && verify(g, 4096, 47) == SIZE_MAX,
          "shrinking changed what is left");
    CHECK(munmap(g, 2 * n) == 0, "munmap: %s", strerror(errno));
  }
  /* The far heap (malloc memory) too. */
  void* v = NULL;
  CHECK(posix_memalign(&v, 4096, 65536) == 0, "posix_memalign");
  memset(v, 5, 65536);
  char* h = (char*)v + 4096;
  CHECK(mprotect(h, 4096, PROT_READ) == 0, "mprotect heap memory: %s", strerror(errno));
  CHECK(segv_at(h, 1) == 1 && h[0] == 5, "heap memory: PROT_READ not enforced");
  CHECK(mprotect(h, 4096, kRW) == 0, "mprotect heap memory back: %s", strerror(errno));
  h[0] = 6;
  free(v);
  /* A fork()ed child sees the data and the protection. */
  char* f = map(n);
  fill(f, n, 53);
  CHECK(mprotect(f, 4096, PROT_READ) == 0, "mprotect before fork: %s", strerror(errno));
  churn();
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(segv_at(f, 1) == 1 && verify(f, n, 53) == SIZE_MAX ? 0 : 5);
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child of a protected mapping: status %d", st);
  CHECK(munmap(f, n) == 0, "munmap: %s", strerror(errno));
  /* More than the budget can hold resident: refused, nothing changed. */
  size_t big = 32 * (size_t)kMiB;
  char* b = map(big);
  fill(b, big, 59);
  int rc = mprotect(b, big, PROT_READ);
  if (g_far) {
    CHECK(rc == -1 && errno == ENOMEM, "mprotect of 32 MiB at an 8 MiB budget: rc %d (%s)", rc,
          strerror(errno));
    CHECK(pages_writable(b, big), "a refused mprotect protected something");
  } else {
    CHECK(rc == 0, "mprotect PROT_READ of 32 MiB: %s", strerror(errno));
    CHECK(segv_at(b + big - 1, 1) == 1, "PROT_READ not enforced");
  }
  CHECK(verify(b, big, 59) == SIZE_MAX, "data changed by mprotect of 32 MiB");
  CHECK(munmap(b, big) == 0, "munmap: %s", strerror(errno));
}

static void test_left_to_kernel(void) {
  size_t n = (size_t)kMiB;
  char* s = mmap(NULL, n, kRW, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(s != MAP_FAILED, "MAP_SHARED: %s", strerror(errno));
  expect_kernel(s, "MAP_SHARED");
  /* Shared with a child: its write is seen. */
  s[0] = 0;
  pid_t pid = fork();
  if (pid == 0) {
    s[0] = 42;
    _exit(0);
  }
  waitpid(pid, NULL, 0);
  CHECK(s[0] == 42, "MAP_SHARED: the child's write is not seen");
  munmap(s, n);
  char* x = mmap(NULL, n, PROT_READ | PROT_EXEC, kAnon, -1, 0);
  CHECK(x != MAP_FAILED, "PROT_EXEC: %s", strerror(errno));
  expect_kernel(x, "PROT_READ|PROT_EXEC");
  munmap(x, n);
  char* none = mmap(NULL, n, PROT_NONE, kAnon, -1, 0);
  expect_kernel(none, "PROT_NONE");
  /* MAP_FIXED into the kernel's own reservation stays there. */
  char* fx = mmap(none, n, kRW, kAnon | MAP_FIXED, -1, 0);
  CHECK(fx == none, "MAP_FIXED over a reservation: %s", strerror(errno));
  expect_kernel(fx, "MAP_FIXED");
  fx[5] = 5;
  munmap(none, n);
  char* st = mmap(NULL, n, kRW, kAnon | MAP_STACK, -1, 0);
  expect_kernel(st, "MAP_STACK");
  munmap(st, n);
  char* small = mmap(NULL, 16384, kRW, kAnon, -1, 0);
  expect_kernel(small, "a mapping below FARMEM_MMAP_MIN");
  munmap(small, 16384);
  char path[] = "/tmp/farmem-mmap-test.XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
  unlink(path);
  CHECK(ftruncate(fd, (off_t)n) == 0, "ftruncate");
  char* f = mmap(NULL, n, kRW, MAP_PRIVATE, fd, 0);
  CHECK(f != MAP_FAILED, "file mapping: %s", strerror(errno));
  expect_kernel(f, "a file mapping");
  munmap(f, n);
  close(fd);
  /* MAP_FIXED over a far mapping of ours: a fresh zeroed mapping there;
   * anything else into the far region is refused. */
  char* p = map(n);
  memset(p, 7, n);
  char* r = mmap(p, n, kRW, kAnon | MAP_FIXED, -1, 0);
  CHECK(r == p, "MAP_FIXED over our own mapping: %s", strerror(errno));
  CHECK(all_zero(p, n), "MAP_FIXED over our own mapping: not zero");
  if (g_far) {
    void* z = mmap(p, n, PROT_NONE, kAnon | MAP_FIXED, -1, 0);
    CHECK(z == MAP_FAILED && errno == EINVAL, "MAP_FIXED PROT_NONE into the far region");
    z = mmap(p, n, kRW, kAnon | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(z == MAP_FAILED && errno == EEXIST, "MAP_FIXED_NOREPLACE into the far region");
    int rc = madvise(p, n, MADV_WIPEONFORK);
    CHECK(rc == -1 && errno == EINVAL, "MADV_WIPEONFORK on far memory is refused");
  }
  munmap(p, n);
}

static void test_syscall_into_far(void) {
  size_t n = 64 * 1024;
  int fds[2];
  CHECK(pipe(fds) == 0, "pipe");
  char* src = malloc(n);
  for (size_t i = 0; i < n; ++i) src[i] = (char)(i * 7 + 3);
  /* A fresh (never touched) far buffer, then an evicted one. */
  for (int round = 0; round < 2; ++round) {
    char* dst = map(4 * n);
    if (round == 1) {
      memset(dst, 0xEE, 4 * n);
      churn();
    }
    pid_t pid = fork();
    if (pid == 0) {
      size_t off = 0;
      while (off < n) {
        ssize_t w = write(fds[1], src + off, n - off);
        if (w <= 0) _exit(1);
        off += (size_t)w;
      }
      _exit(0);
    }
    size_t got = 0;
    while (got < n) {
      ssize_t r = read(fds[0], dst + n + got, n - got);
      if (r <= 0) break;
      got += (size_t)r;
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(got == n && memcmp(dst + n, src, n) == 0, "round %d: read() into far memory: %zu bytes",
          round, got);
    munmap(dst, 4 * n);
  }
  free(src);
  close(fds[0]);
  close(fds[1]);
}

static void test_fork_sees_data(void) {
  size_t n = 16 * (size_t)kMiB;
  char* p = map(n);
  fill(p, n, 29);
  churn(); /* part of it is remote at the fork */
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (verify(p, n, 29) != SIZE_MAX) _exit(3);
    fill(p, n, 31); /* the child's own writes */
    _exit(verify(p, n, 31) == SIZE_MAX ? 0 : 4);
  }
  fill(p, 4 * (size_t)kMiB, 37); /* the parent writes meanwhile */
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child: status %d", st);
  CHECK(verify(p, 4 * (size_t)kMiB, 37) == SIZE_MAX, "parent's data changed by the child");
  munmap(p, n);
}

/* Four threads mapping, growing, shrinking, advising and unmapping their
 * own mappings at once (the range map is shared): every page reads what
 * its thread wrote, or zeros where it must. */
static int g_thread_bad;
static void* churn_thread(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  enum { kSlots = 8 };
  char* m[kSlots] = {0};
  size_t len[kSlots] = {0};
  int bad = 0;
  for (int it = 0; it < 600; ++it) {
    int k = (int)(rand_r(&seed) % kSlots);
    char tag = (char)(k + 1);
    if (m[k] == NULL) {
      len[k] = (size_t)(4 + rand_r(&seed) % 28) * 16384;
      m[k] = map(len[k]);
      for (size_t i = 0; i < len[k]; i += 4096) {
        bad += m[k][i] != 0;
        m[k][i] = tag;
      }
      continue;
    }
    for (size_t i = 0; i < len[k]; i += 4096) bad += m[k][i] != tag;
    switch (rand_r(&seed) % 5) {
      case 0:
        bad += munmap(m[k], len[k]) != 0;
        m[k] = NULL;
        break;
      case 1: {
        size_t nl = (size_t)(4 + rand_r(&seed) % 28) * 16384;
        char* q = mremap(m[k], len[k], nl, MREMAP_MAYMOVE);
        if (q == MAP_FAILED) {
          ++bad;
          break;
        }
        for (size_t i = len[k]; i < nl; i += 4096) {
          bad += q[i] != 0;
          q[i] = tag;
        }
        m[k] = q;
        len[k] = nl;
        break;
      }
      case 2:
        bad += madvise(m[k], len[k], MADV_DONTNEED) != 0;
        for (size_t i = 0; i < len[k]; i += 4096) {
          bad += m[k][i] != 0;
          m[k][i] = tag;
        }
        break;
      case 3:
        /* Protect the head, check it, and make it writable again. */
        bad += mprotect(m[k], 16384, PROT_READ) != 0;
        for (size_t i = 0; i < 16384; i += 4096) bad += m[k][i] != tag;
        bad += mprotect(m[k], 16384, kRW) != 0;
        break;
      default:
        if (len[k] > 8192) {
          bad += munmap(m[k] + len[k] - 4096, 4096) != 0;
          len[k] -= 4096;
        }
        break;
    }
  }
  for (int k = 0; k < kSlots; ++k)
    if (m[k]) bad += munmap(m[k], len[k]) != 0;
  __atomic_add_fetch(&g_thread_bad, bad, __ATOMIC_RELAXED);
  return NULL;
}

static void test_threads(void) {
  pthread_t t[4];
  for (int i = 0; i < 4; ++i)
    CHECK(pthread_create(&t[i], NULL, churn_thread, (void*)(uintptr_t)(i + 1)) == 0,
          "pthread_create");
  for (int i = 0; i < 4; ++i) pthread_join(t[i], NULL);
  CHECK(g_thread_bad == 0, "%d wrong pages or failed calls in four threads", g_thread_bad);
}

int main(void) {
  const char* e = getenv("MMAP_TEST_FAR");
  g_far = e && strcmp(e, "1") == 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  test_fresh_zero_and_recycled();
  test_eviction_byte_exact_and_remote_freed();
  test_dontneed_free();
  test_dontneed_heap();
  test_partial_munmap();
  test_mremap();
  test_mprotect();
  test_left_to_kernel();
  test_syscall_into_far();
  test_fork_sees_data();
  test_threads();
  printf("%s: %d failed checks (%s)\n", g_failures ? "FAIL" : "PASS", g_failures,
         g_far ? "far memory" : "kernel");
  return g_failures ? 1 : 0;
}
