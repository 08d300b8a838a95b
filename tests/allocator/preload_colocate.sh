#!/usr/bin/env bash
# Co-location under the preload library (pager/evictor.h "Co-location",
# pager/colocate.h). With FARMEM_COLOCATE=on, python3's main thread pages a
# 32 MiB buffer through an 8 MiB budget (loopback donor) until the pager
# confines it to one CPU. While it is, nothing it starts may inherit that:
# a thread, a fork() child, a subprocess (vfork/fork + exec), posix_spawn
# and os.system() must each see every CPU the program may use. The buffer
# must read back right. FARMEM_COLOCATE=off: the main thread never is.
set -euo pipefail
: "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"
preload_check_uffd
ncpu=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
if ((ncpu < 2)); then
  echo "SKIP: needs two CPUs (this one has $ncpu)"
  exit 77
fi
preload_workdir farmem-colocate
work=$WORK
prog='import os, subprocess, sys, threading, time
full = os.sched_getaffinity(0)
b = bytearray(32 << 20)
k = 0
def page():
    global k
    k = (k + 1) % 256
    for i in range(0, len(b), 4096):
        b[i] = k
    assert all(b[i] == k for i in range(0, len(b), 4096))
def pinned():
    return len(os.sched_getaffinity(0)) == 1
# "off" pages for 2 s (a pin comes within ~0.3 s when on).
end = time.time() + (2 if sys.argv[1] == "off" else 30)
while not pinned() and time.time() < end:
    page()
if sys.argv[1] == "off":
    print("pinned" if pinned() else "apart")
    sys.exit(0)
if not pinned():
    print("never pinned")
    sys.exit(0)
probe = [sys.executable, "-c", "import os; print(len(os.sched_getaffinity(0)))"]
seen = {}
def check(name, fn, after=True):
    # Pinned before (and after, where the call does not lift the pin
    # itself), so that a full mask is the wrapper'"'"'s doing.
    for attempt in range(100):
        if not pinned():
            page()
            continue
        n = fn()
        if pinned() or not after:
            seen[name] = n
            return
    seen[name] = "not pinned around it"
def in_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(len(os.sched_getaffinity(0))))
    t.start()
    t.join()
    return out[0]
def in_fork():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(len(os.sched_getaffinity(0))).encode())
        os._exit(0)
    os.close(w)
    n = int(os.read(r, 16))
    os.close(r)
    os.waitpid(pid, 0)
    return n
def in_subprocess():
    return int(subprocess.run(probe, capture_output=True, check=True).stdout)
def in_posix_spawn():
    r, w = os.pipe()
    pid = os.posix_spawn(sys.executable, probe, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
    os.close(w)
    n = int(os.read(r, 16))
    os.close(r)
    os.waitpid(pid, 0)
    return n
def in_system():
    path = os.environ["COLOCATE_OUT"]
    os.system(" ".join(probe[:2]) + " \"" + probe[2] + "\" > " + path)
    return int(open(path).read())
for name, fn in (("thread", in_thread), ("fork", in_fork), ("subprocess", in_subprocess)):
    check(name, fn)
# These lift the pin for the call (glibc'"'"'s child execs without a wrapper).
check("posix_spawn", in_posix_spawn, after=False)
check("system", in_system, after=False)
page()
print(" ".join("%s=%s" % kv for kv in seen.items()))'
run() {  # $1: FARMEM_COLOCATE
  env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRANSPORT=loopback FARMEM_LOOPBACK_CAPACITY=256M \
    FARMEM_LOCAL_MEM=8M FARMEM_STATS=1 FARMEM_STATS_SOCKET=0 FARMEM_COLOCATE="$1" \
    COLOCATE_OUT="$work/system.out" \
    /usr/bin/python3 -c "$prog" "$1" > "$work/out.$1" 2> "$work/err.$1" ||
    { cat "$work/err.$1" >&2; fail "the run with FARMEM_COLOCATE=$1 failed"; }
}
run on
out=$(cat "$work/out.on")
echo "FARMEM_COLOCATE=on: $out"
[[ $out != "never pinned" ]] || { cat "$work/err.on" >&2; fail "the main thread was never co-located"; }
grep -q "co-location (FARMEM_COLOCATE).* one CPU [1-9]" "$work/err.on" ||
  { cat "$work/err.on" >&2; fail "FARMEM_STATS says no co-location"; }
for name in thread fork subprocess posix_spawn system; do
  [[ " $out " == *" $name=$ncpu "* ]] || fail "$name: expected $ncpu CPUs, got: $out"
done
run off
out=$(cat "$work/out.off")
echo "FARMEM_COLOCATE=off: $out"
[[ $out == apart ]] || fail "FARMEM_COLOCATE=off: the main thread was pinned"
echo "PASS"
