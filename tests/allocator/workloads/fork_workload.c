/* fork() under the preload library (invariant 8): a heap far above the
 * local budget, a forked child that checks all of it after the parent
 * rewrote it, and fork+exec of /bin/true in a loop. Prints what it checked;
 * the output must be identical with and without the library. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { kChunks = 768, kChunk = 64 << 10 }; /* 48 MiB in 64 KiB allocations */

static void fill(uint64_t* p, size_t chunk, uint64_t version) {
  uint64_t x = (chunk + 1) * 0x9E3779B97F4A7C15ull ^ (version + 1) * 0xC2B2AE3D27D4EB4Full;
  for (size_t i = 0; i < kChunk / 8; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = x;
  }
}

/* Number of chunks that differ from version. */
static size_t check(uint64_t** heap, uint64_t version) {
  static uint64_t expect[kChunk / 8];
  size_t bad = 0;
  for (size_t c = 0; c < kChunks; ++c) {
    fill(expect, c, version);
    if (memcmp(heap[c], expect, kChunk) != 0) ++bad;
  }
  return bad;
}

static int wait_status(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(void) {
  uint64_t** heap = malloc(kChunks * sizeof *heap);
  for (size_t c = 0; c < kChunks; ++c) {
    heap[c] = malloc(kChunk);
    if (heap[c] == NULL) return 2;
    fill(heap[c], c, 1);
  }
  int go[2];
  if (pipe(go) != 0) return 2;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    close(go[1]);
    char b;
    if (read(go[0], &b, 1) != 1) _exit(3); /* the parent rewrote everything */
    size_t bad = check(heap, 1);
    if (bad != 0) {
      fprintf(stderr, "child: %zu of %d chunks differ from the heap at the fork\n", bad, kChunks);
      _exit(4);
    }
    for (size_t c = 0; c < kChunks; ++c) fill(heap[c], c, 3);
    _exit(check(heap, 3) == 0 ? 0 : 5);
  }
  close(go[0]);
  for (size_t c = 0; c < kChunks; ++c) fill(heap[c], c, 2);
  if (write(go[1], "x", 1) != 1) return 2;
  close(go[1]);
  printf("child after parent rewrite: exit %d\n", wait_status(pid));
  printf("parent heap after the child wrote its own: %zu chunks differ\n", check(heap, 2));

  int ok = 0;
  for (int i = 0; i < 20; ++i) {
    pid_t p = fork();
    if (p == 0) {
      execl("/bin/true", "true", (char*)NULL);
      _exit(127);
    }
    if (p > 0 && wait_status(p) == 0) ++ok;
    fill(heap[(size_t)i * 37 % kChunks], (size_t)i * 37 % kChunks, 2); /* rewrite: same data */
  }
  printf("fork+exec of /bin/true: %d of 20 exited 0\n", ok);
  printf("parent heap at the end: %zu chunks differ\n", check(heap, 2));
  for (size_t c = 0; c < kChunks; ++c) free(heap[c]);
  free(heap);
  return 0;
}
