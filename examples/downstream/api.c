/* farmem_downstream_api: the far-memory C API from an installed farmem
 * (find_package(farmem), farmem::allocator): far memory from a farmemd,
 * four times the local budget written and read back.
 *
 *   farmem_downstream_api HOST:PORT TOKEN_FILE
 *
 * Prints "ok: wrote and read back N MiB through a M MiB local budget,
 * R remote faults" and exits 0, or says what failed and exits 1 (77 when
 * userfaultfd is not available to this process). */
#include <errno.h>
#include <farmem/farmem.h>
#include <stdint.h>
#include <stdio.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: farmem_downstream_api HOST:PORT TOKEN_FILE\n");
    return 2;
  }
  fm_config c;
  fm_config_init(&c);
  c.servers = argv[1];
  c.token_file = argv[2];
  c.transport = "tcp";
  c.local_mem = 2 << 20;
  c.region_size = 12 << 20; /* of the donor's capacity */
  if (fm_init(&c) != 0) {
    fprintf(stderr, "farmem_downstream_api: %s\n", fm_last_error());
    return errno == EPERM ? 77 : 1;
  }
  const size_t n = 4 * c.local_mem;
  uint8_t* p = fm_malloc(n);
  if (p == NULL) {
    fprintf(stderr, "farmem_downstream_api: fm_malloc: %s\n", fm_last_error());
    return 1;
  }
  for (size_t i = 0; i < n; ++i) p[i] = (uint8_t)(i * 131 >> 7);
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != (uint8_t)(i * 131 >> 7)) {
      fprintf(stderr, "farmem_downstream_api: byte %zu differs after eviction\n", i);
      return 1;
    }
  }
  fm_stats_t s;
  fm_stats_init(&s);
  if (fm_stats(&s) != 0) {
    fprintf(stderr, "farmem_downstream_api: fm_stats: %s\n", fm_last_error());
    return 1;
  }
  fm_free(p);
  if (fm_shutdown() != 0) {
    fprintf(stderr, "farmem_downstream_api: fm_shutdown: %s\n", fm_last_error());
    return 1;
  }
  printf("ok: wrote and read back %zu MiB through a %llu MiB local budget, %s remote faults\n",
         n >> 20, (unsigned long long)(s.budget_bytes >> 20), s.faults_remote > 0 ? "with" : "no");
  return 0;
}
