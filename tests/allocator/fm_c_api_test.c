/* The C API from a C program: farmem.h compiles as C with -Wall -Wextra
 * -Werror, and a C program writes four times its local budget of far
 * memory, reads it back byte-exact after eviction, and reads the
 * statistics through fm_stats_init() / struct_size.
 * Exit 0: passed; 77: skipped (userfaultfd not available here); else the
 * failed check is printed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "farmem/farmem.h"

static int failures;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              fm_last_error());                                                                \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

static uint8_t pattern(size_t i) {
  return (uint8_t)((i * 2654435761u) >> 24);
}

int main(void) {
  fm_stats_t zeroed;
  memset(&zeroed, 0, sizeof zeroed);
  CHECK(fm_stats(&zeroed) == -1 && errno == EINVAL);
  CHECK(strstr(fm_last_error(), "fm_stats_init") != NULL);

  fm_config c;
  fm_config_init(&c);
  c.transport = "loopback";
  c.loopback_capacity = 256ull << 20;
  c.local_mem = 4 << 20;
  c.pager_threads = 2;
  if (fm_init(&c) != 0) {
    if (errno == EPERM) {
      printf("skipped: %s\n", fm_last_error());
      return 77;
    }
    fprintf(stderr, "fm_init: %s\n", fm_last_error());
    return 1;
  }

  const size_t n = 16 << 20;
  uint8_t* p = fm_malloc(n);
  CHECK(p != NULL);
  if (p == NULL) return 1;
  CHECK(fm_is_far(p));
  for (size_t i = 0; i < n; ++i) p[i] = pattern(i);
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; ++i) {
    if (p[i] != pattern(i)) bad = i;
  }
  if (bad != n) fprintf(stderr, "byte %zu differs after eviction\n", bad);
  CHECK(bad == n);

  fm_stats_t s;
  fm_stats_init(&s);
  CHECK(fm_stats(&s) == 0);
  CHECK(s.struct_size == sizeof s);
  CHECK(s.budget_bytes == 4u << 20);
  CHECK(s.faults_remote > 0);
  CHECK(s.evictions_dirty > 0);
  CHECK(s.resident_peak_bytes <= s.budget_bytes);
  CHECK(s.far_allocated >= n);

  int local = 0;
  errno = 0;
  fm_free(&local); /* not far memory: reported, left alone */
  CHECK(errno == EINVAL);
  fm_free(p);
  CHECK(fm_shutdown() == 0);
  if (failures == 0) printf("passed: %zu MiB through a 4 MiB budget from C\n", n >> 20);
  return failures == 0 ? 0 : 1;
}
