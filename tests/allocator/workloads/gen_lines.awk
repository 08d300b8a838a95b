# awk -v n=LINES -f gen_lines.awk > file: deterministic pseudo-random lines
# (own LCG: the same bytes on every awk). Keys are locally shuffled (each
# line is out of place by a few thousand positions at most), like a log
# merged from several sources: sort's passes stay mostly sequential, so the
# test exercises far memory without being a pure page-thrashing benchmark.
BEGIN {
  x = 12345
  for (i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483648
    y = (x * 69069 + 1) % 4294967296
    printf "%012d %08x line-%d %s\n", i * 1000 + x % 3000000, y, i, substr("abcdefghijklmnopqrstuvwxyz0123456789", 1 + i % 30, 6 + i % 7)
  }
}
