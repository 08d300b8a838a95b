# Builds and hashes large structures: bytes blobs, a big dict, nested lists,
# a sort. Deterministic output. (Run under the preload library by
# tests/allocator/preload_run.sh; heap about 100 MiB.)
import hashlib

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
