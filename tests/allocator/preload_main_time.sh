#!/usr/bin/env bash
# FARMEM_STATS=1 reports the main thread's time at exit (preload/shim.cc
# print_main_times()): on a CPU, waiting for one, and asleep, of the wall
# time since start-up. Checks, with FARMEM_PRELOAD_LIB set, on a python3
# that pages a 32 MiB buffer through an 8 MiB budget (loopback donor),
# spins ~0.3 s on the CPU, then sleeps 0.4 s:
#   - the line is there, the sum is right and the run paged;
#   - asleep >= 0.35 s (the sleep) and on a CPU >= 0.25 s (the spin);
#   - the three parts add up to the wall time (to 0.01 s), which is at
#     least the program's own measure of its run.
set -euo pipefail
: "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"
preload_check_uffd
preload_workdir farmem-maintime
work=$WORK
prog='import time
t0 = time.monotonic()
b = bytearray(32 << 20)
for k in (2, 1):
    for i in range(0, len(b), 4096): b[i] = k
print(sum(b))
c0 = time.thread_time()
while time.thread_time() - c0 < 0.3: pass
time.sleep(0.4)
print("%.3f" % (time.monotonic() - t0))'
env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRANSPORT=loopback FARMEM_LOOPBACK_CAPACITY=256M \
  FARMEM_LOCAL_MEM=8M FARMEM_STATS=1 FARMEM_STATS_SOCKET=0 \
  /usr/bin/python3 -c "$prog" > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; fail "the run failed"; }
[[ $(head -1 "$work/out") == $((32 * 256)) ]] || fail "wrong sum: $(head -1 "$work/out")"
dirty=$(sed -n 's/^farmem: stats: evictions: [0-9]* clean, \([0-9]*\) dirty.*/\1/p' "$work/err")
[[ -n $dirty && $dirty -gt 0 ]] || { cat "$work/err" >&2; fail "the run did not page"; }
line=$(grep '^farmem: stats: main thread: ' "$work/err") || { cat "$work/err" >&2; fail "no main-thread line"; }
echo "$line"
read -r cpu wait asleep wall < <(echo "$line" |
  sed -n 's/.*: \([0-9.]*\) s on a CPU, \([0-9.]*\) s waiting for one, \([0-9.]*\) s asleep (page faults, I\/O, locks) of \([0-9.]*\) s$/\1 \2 \3 \4/p')
[[ -n ${wall:-} ]] || fail "cannot parse: $line"
own=$(sed -n 2p "$work/out")
python3 - "$cpu" "$wait" "$asleep" "$wall" "$own" <<'PY' || exit 1
import sys
cpu, wait, asleep, wall, own = map(float, sys.argv[1:])
bad = []
if asleep < 0.35: bad.append("asleep %.3f s < the 0.4 s sleep" % asleep)
if cpu < 0.25: bad.append("on a CPU %.3f s < the 0.3 s spin" % cpu)
if abs(cpu + wait + asleep - wall) > 0.01: bad.append("parts %.3f s != wall %.3f s" % (cpu + wait + asleep, wall))
if wall < own: bad.append("wall %.3f s < the program's own %.3f s" % (wall, own))
if bad:
    print("FAIL: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
PY
echo "PASS"
