# A dict of 1.5M small objects (issue 17's python program): tuples, ints and
# short strings, all in pymalloc's 1 MiB arenas (anonymous mmap64(), not
# malloc), looked up in a scattered order; prints a digest. For the test of
# issue 17's part 2 (anonymous mmap in far memory; ctest preload_python3_rss
# runs it with 400k entries). With malloc alone far, python's peak RSS did
# not drop (1.5M entries: 509 MiB plain, 517 MiB at FARMEM_LOCAL_MEM=64M);
# with the arenas far too, 400k entries: 148 -> ~101 MiB at 64M.
import sys
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500000
d = {}
for i in range(n):
    d["k%d" % i] = (i, str(i * 7 % 1000003), [i % 97])
total = 0
for i in range(0, n, 7):
    v = d["k%d" % ((i * 31337) % n)]
    total = (total * 31 + v[0] + len(v[1]) + v[2][0]) % 1000000007
print(len(d), total)
