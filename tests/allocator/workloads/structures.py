# Builds and hashes large structures: bytes blobs, a big dict, nested lists,
# a sort. Deterministic output. (Run under the preload library by
# tests/allocator/preload_run.sh; heap about 100 MiB.)
#
# With PRELOAD_SYNC_DIR set (tests/allocator/preload_replication.sh) it
# stops twice and lets the test go on, whatever the machine's speed: once
# everything is built and before any of it is read back, it creates
# $PRELOAD_SYNC_DIR/ready and waits until $PRELOAD_SYNC_DIR/go exists (the
# test kills a donor meanwhile); and before it exits, done / exit (the test
# checks that the runtime noticed the dead donor while the process lives).
# Its output is the same either way. Each wait gives up after 10 minutes,
# so that a test killed meanwhile leaves no process behind.
import hashlib
import os
import sys
import time


def sync_point(mine, theirs):
    d = os.environ.get("PRELOAD_SYNC_DIR")
    if not d:
        return
    open(os.path.join(d, mine), "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(d, theirs)):
        if time.monotonic() > deadline:
            sys.exit("structures.py: no %s/%s within 600 s" % (d, theirs))
        time.sleep(0.01)


h = hashlib.sha256()
blobs = []
for i in range(500):
    # 96 KiB each, content depends on i: lives in far memory (>= FARMEM_MIN_FAR)
    blobs.append(bytes((i * 7 + k) & 0xFF for k in range(256)) * 384)
table = {}
for i in range(100000):
    table[i * 2654435761 % 1000003] = i
big = list(range(600000))
big.sort(key=lambda v: (v * 40503) % 65536)
sync_point("ready", "go")
for i in range(0, len(blobs), 3):
    h.update(blobs[i])
for k in sorted(table)[:30000]:
    h.update(k.to_bytes(4, "little"))
h.update(repr(big[:1000]).encode())
rows = [bytearray(blobs[i][:65536]) for i in range(0, 500, 2)]
for r in rows:
    r[100] = (r[100] + 1) & 0xFF
    h.update(r)
print(len(blobs), len(table), len(big), sum(big[::1000]))
print(h.hexdigest())
sync_point("done", "exit")
