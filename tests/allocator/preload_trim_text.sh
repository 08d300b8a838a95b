#!/usr/bin/env bash
# Once far memory has started, the code and read-only data of the process
# stay resident only while in use (preload/shim.cc, "Code and read-only
# data"; FARMEM_TRIM_TEXT). Checks, with FARMEM_PRELOAD_LIB set, on a
# python3 that pages a 32 MiB buffer through an 8 MiB budget (loopback
# donor), writes it twice, then loads two extension modules (_decimal,
# _ctypes: objects loaded after start-up), sleeps past the trim thread's
# period, uses them (decimal arithmetic, a libc call through ctypes), sums
# the buffer and reads its own /proc/self/smaps:
#   1. FARMEM_TRIM_TEXT=2 (the default): the sum and the results are right;
#      the library's executable segment, libc's and _decimal's (loaded
#      later) are split into one mapping per page (fault-around then maps
#      the page touched only); less than 60% of the library's text and less
#      of libc's than in 3 is resident; the summary counts at least two
#      passes (start-up and the thread) that dropped pages;
#   2. FARMEM_TRIM_TEXT=1: the library's text split, libc's and _decimal's
#      not, one pass;
#   3. FARMEM_TRIM_TEXT=0: nothing split, more of the library resident
#      than in 1 (fault-around brings in ~16 pages per page touched);
#   4. fork() during trim passes: with FARMEM_TRIM_PERIOD_MS=1 (a pass
#      most of the time), a python3 forks children for 2 s that each load
#      an extension module (dlopen takes the loader's write lock, which a
#      pass holds and glibc's fork does not reset) and exit; none may hang
#      (without the fork lock the first child hangs);
#   5. FARMEM_TRIM_TEXT=3: a start-up error naming the variable, exit 1.
set -euo pipefail
: "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"
preload_check_uffd
preload_workdir farmem-trim
work=$WORK
lib=$(basename "$FARMEM_PRELOAD_LIB")
# Prints the sum and the results, then "NAME MAPS SIZE_KIB RSS_KIB" for the
# executable mappings of the library, libc and _decimal.
prog='import os, re, time
b = bytearray(32 << 20)
for k in (2, 1):
    for i in range(0, len(b), 4096): b[i] = k
import _decimal, ctypes
time.sleep(1.4)
d = _decimal.Decimal(1) / _decimal.Decimal(7)
print(sum(b), str(d)[:8], ctypes.CDLL(None).getpid() == os.getpid())
def seg(name):
    n = size = rss = 0
    cur = False
    for line in open("/proc/self/smaps"):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$", line)
        if m:
            cur = m.group(3)[2] == "x" and os.path.basename(m.group(4)).startswith(name)
            if cur:
                n += 1
                size += (int(m.group(2), 16) - int(m.group(1), 16)) >> 10
        elif cur and line.startswith("Rss:"):
            rss += int(line.split()[1])
    return n, size, rss
for name in (os.environ["LIB"], "libc.so.6", "_decimal"):
    print(name.split(".")[0], *seg(name))'

# run LABEL ENV...: sets LIB_{MAPS,SIZE,RSS}, LIBC_*, DEC_* and PASSES; the
# sum, the results and paging checked.
run() {
  local label=$1
  shift
  env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRANSPORT=loopback FARMEM_LOOPBACK_CAPACITY=256M \
    FARMEM_LOCAL_MEM=8M FARMEM_STATS=1 FARMEM_STATS_SOCKET=0 LIB="$lib" "$@" \
    /usr/bin/python3 -c "$prog" > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; fail "$label run failed"; }
  [[ $(head -1 "$work/out") == "$((32 * 256)) 0.142857 True" ]] ||
    fail "$label run: wrong results: $(head -1 "$work/out")"
  local dirty
  dirty=$(sed -n 's/^farmem: stats: evictions: [0-9]* clean, \([0-9]*\) dirty.*/\1/p' "$work/err")
  [[ -n $dirty && $dirty -gt 0 ]] || { cat "$work/err" >&2; fail "$label run did not page"; }
  read -r _ LIB_MAPS LIB_SIZE LIB_RSS < <(sed -n 2p "$work/out")
  read -r _ LIBC_MAPS LIBC_SIZE LIBC_RSS < <(sed -n 3p "$work/out")
  read -r _ DEC_MAPS DEC_SIZE DEC_RSS < <(sed -n 4p "$work/out")
  PASSES=$(sed -n 's/^farmem: stats: code and read-only data (FARMEM_TRIM_TEXT [0-9]): trim passes: \([0-9]*\),.*/\1/p' "$work/err")
  [[ -n $PASSES ]] || { cat "$work/err" >&2; fail "$label: no trim line in the summary"; }
  # The summary's prefetch line, which bench/eval/programs.py parses.
  grep -Eq '^farmem: stats: prefetch: [0-9]+ issued, [0-9]+ used, [0-9]+ unused; zero-fill fault-around: [0-9]+ blocks; faults that waited: [0-9]+; served from another CPU: [0-9]+$' "$work/err" ||
    { cat "$work/err" >&2; fail "$label: no prefetch line in the summary"; }
  echo "$label: executable mappings / KiB resident of KiB: $lib $LIB_MAPS / $LIB_RSS of $LIB_SIZE," \
    "libc $LIBC_MAPS / $LIBC_RSS of $LIBC_SIZE, _decimal $DEC_MAPS / $DEC_RSS of $DEC_SIZE;" \
    "$(grep "code and read-only" "$work/err" | sed 's/^farmem: stats: //')"
}

run "all (default)"
[[ $LIB_MAPS -ge 100 ]] || fail "the library's text is not split into pages ($LIB_MAPS mappings)"
[[ $((LIB_RSS * 100)) -lt $((LIB_SIZE * 60)) ]] || fail "$LIB_RSS of $LIB_SIZE KiB of the library's text resident"
[[ $LIBC_MAPS -ge 100 ]] || fail "libc's text is not split into pages ($LIBC_MAPS mappings)"
[[ $DEC_MAPS -ge 10 ]] || fail "_decimal, loaded after start-up, is not split ($DEC_MAPS mappings)"
[[ $PASSES -ge 2 ]] || fail "$PASSES trim passes in a run longer than the thread's period"
grep -q ", 0 B of resident pages dropped" "$work/err" && fail "the trim passes dropped nothing"
all_libc_rss=$LIBC_RSS
run "own (FARMEM_TRIM_TEXT=1)" FARMEM_TRIM_TEXT=1
[[ $LIB_MAPS -ge 100 ]] || fail "FARMEM_TRIM_TEXT=1 did not split the library's text ($LIB_MAPS mappings)"
[[ $LIBC_MAPS == 1 && $DEC_MAPS == 1 ]] || fail "FARMEM_TRIM_TEXT=1 split other objects: libc $LIBC_MAPS, _decimal $DEC_MAPS"
[[ $PASSES == 1 ]] || fail "FARMEM_TRIM_TEXT=1: $PASSES passes, not 1"
own_rss=$LIB_RSS
run "none (FARMEM_TRIM_TEXT=0)" FARMEM_TRIM_TEXT=0
[[ $LIB_MAPS == 1 && $LIBC_MAPS == 1 ]] || fail "FARMEM_TRIM_TEXT=0 still split the text ($LIB_MAPS, $LIBC_MAPS mappings)"
[[ $PASSES == 0 ]] || fail "FARMEM_TRIM_TEXT=0: $PASSES passes"
[[ $LIB_RSS -gt $own_rss ]] || fail "untrimmed library text ($LIB_RSS KiB) is not larger than trimmed ($own_rss KiB)"
[[ $LIBC_RSS -gt $all_libc_rss ]] || fail "untrimmed libc text ($LIBC_RSS KiB) is not larger than trimmed ($all_libc_rss KiB)"

forks='import os, sys, time
b = bytearray(16 << 20)
for i in range(0, len(b), 4096): b[i] = 1
t0 = time.time(); n = hung = 0
while time.time() - t0 < 2:
    pid = os.fork()
    if pid == 0:
        import _decimal
        os._exit(0 if _decimal.Decimal(3) + 4 == 7 else 3)
    n += 1
    deadline = time.time() + 5
    while True:
        p, st = os.waitpid(pid, os.WNOHANG)
        if p == pid:
            if os.waitstatus_to_exitcode(st) != 0: sys.exit("a child failed: status %d" % st)
            break
        if time.time() > deadline:
            hung += 1; os.kill(pid, 9); os.waitpid(pid, 0); break
        time.sleep(0.0002)
print(n, hung)'
env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRANSPORT=loopback FARMEM_LOOPBACK_CAPACITY=256M \
  FARMEM_LOCAL_MEM=8M FARMEM_STATS=1 FARMEM_STATS_SOCKET=0 FARMEM_TRIM_PERIOD_MS=1 \
  /usr/bin/python3 -c "$forks" > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; fail "the fork run failed"; }
read -r n hung < "$work/out"
echo "fork during trim passes: $n children, $hung hung; $(grep "code and read-only" "$work/err" | sed 's/^farmem: stats: //')"
[[ $n -ge 5 && $hung == 0 ]] || fail "$hung of $n forked children hung (the loader's lock held by a trim pass at the fork?)"

set +e
env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRIM_TEXT=3 /usr/bin/python3 -c 'print(1)' > "$work/out" 2> "$work/err"
rc=$?
set -e
[[ $rc == 1 ]] || { cat "$work/err" >&2; fail "FARMEM_TRIM_TEXT=3: exit $rc, not 1"; }
grep -q FARMEM_TRIM_TEXT "$work/err" || { cat "$work/err" >&2; fail "the error does not name FARMEM_TRIM_TEXT"; }
echo "FARMEM_TRIM_TEXT=3: $(head -1 "$work/err")"
echo "PASS"
