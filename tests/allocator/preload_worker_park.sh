#!/usr/bin/env bash
# Parked handlers for a program whose faults come from one thread that is
# not the main one (pager/fault_path.h "Parked handlers"; the thread is in
# the registry of pager/park.h because preload/shim.cc's pthread_create
# puts every thread it starts there). With FARMEM_PRELOAD_LIB set, python3
# starts a worker thread that pins itself to the second CPU and pages a
# 32 MiB buffer through an 8 MiB budget (loopback donor, no prefetch: one
# fault a page) while the main
# thread waits in join(). Over the last three of its five passes, the
# handler on the main thread's CPU (the first) must have parked: woken
# fewer times than 1 in 20 of the run's remote faults, and 20 times less
# often than the one on the worker's CPU, which serves them.
# Before the registry every handler stayed up for such a program, and each
# fault woke both. The buffer must read back right.
set -euo pipefail
: "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"
preload_check_uffd
ncpu=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
if ((ncpu != 2)); then
  echo "SKIP: needs exactly two CPUs to tell the handlers apart (this one has $ncpu)"
  exit 77
fi
preload_workdir farmem-workerpark
work=$WORK
prog='import os, threading, time
cpus = sorted(os.sched_getaffinity(0))
def handlers():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            if open("/proc/self/task/%s/comm" % t).read().strip() != "fm-fault":
                continue
            st = open("/proc/self/task/%s/status" % t).read().splitlines()
        except OSError:
            continue
        cpu = [l.split()[1] for l in st if l.startswith("Cpus_allowed_list")][0]
        out[cpu] = int([l.split()[1] for l in st if l.startswith("voluntary_ctxt_switches")][0])
    return out
res = {}
def work():
    os.sched_setaffinity(0, {cpus[1]})
    b = bytearray(32 << 20)
    def one_pass(k):
        for i in range(0, len(b), 4096):
            b[i] = k
    one_pass(1)
    time.sleep(0.15)  # past the 100 ms without parking after a new faulter
    one_pass(2)
    h0 = handlers()
    for k in (3, 4, 5):
        one_pass(k)
    h1 = handlers()
    res["home"] = h1[str(cpus[1])] - h0[str(cpus[1])]
    res["away"] = h1[str(cpus[0])] - h0[str(cpus[0])]
    res["sum"] = sum(b)
t = threading.Thread(target=work)
t.start()
t.join()
print(res["sum"], res["home"], res["away"])'
env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRANSPORT=loopback FARMEM_LOOPBACK_CAPACITY=256M \
  FARMEM_LOCAL_MEM=8M FARMEM_PREFETCH=0 FARMEM_STATS=1 FARMEM_STATS_SOCKET=0 \
  /usr/bin/python3 -c "$prog" > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; fail "the run failed"; }
read -r sum home away < "$work/out"
[[ $sum == $((5 * 8192)) ]] || fail "wrong sum: $sum"
remote=$(sed -n 's/^farmem: stats: faults: [0-9]* zero-fill, \([0-9]*\) remote.*/\1/p' "$work/err")
[[ -n $remote && $remote -ge 20000 ]] || { cat "$work/err" >&2; fail "the run did not page enough: $remote remote faults"; }
echo "remote faults $remote; handler switches over the last three passes: worker's CPU $home, other $away"
((away * 20 < remote)) || fail "the handler off the worker's CPU woke $away times (>= 1/20 of $remote faults)"
((home >= 1000 && home > 20 * away)) ||
  fail "the handler on the worker's CPU woke only $home times (the other $away) for $remote faults"
echo "PASS"
