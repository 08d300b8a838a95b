# A multiprocessing Pool (fork start method) over data built before the
# fork and rewritten by the parent after it: the workers, long-running
# children, must see the data as it was at the fork.
import hashlib
import multiprocessing as mp

N = 48
SIZE = 1 << 20
data = [bytes([(i * 7 + j) % 251 for j in range(256)]) * (SIZE // 256) for i in range(N)]


def digest(i):
    return i, hashlib.sha256(data[i]).hexdigest()[:16]


if __name__ == "__main__":
    mp.set_start_method("fork")
    expect = [hashlib.sha256(d).hexdigest()[:16] for d in data]
    with mp.Pool(2) as pool:
        for i in range(N):  # the parent rewrites everything after the fork
            data[i] = bytes(SIZE)
        got = pool.map(digest, range(N), chunksize=4)
    bad = sum(1 for i, h in got if h != expect[i])
    print("pool results:", len(got), "differing from the snapshot:", bad)
    for i, h in got[:4]:
        print(i, h)
