#!/usr/bin/env bash
# The preload library keeps only the pages of its own code in use resident
# once far memory has started (preload/shim.cc, "Our own text";
# FARMEM_TRIM_TEXT). Checks, with FARMEM_PRELOAD_LIB set, on a python3 that
# pages a 32 MiB buffer through an 8 MiB budget (loopback donor), writes it
# twice and sums it, then reads its own /proc/self/smaps:
#   1. trimmed (the default): the sum is right, the library's executable
#      segment is split into one mapping per page (fault-around then maps
#      the page touched only), and less than 60% of it is resident;
#   2. FARMEM_TRIM_TEXT=0: one executable mapping, more of it resident than
#      in 1 (fault-around brings in ~16 pages per page touched);
#   3. FARMEM_TRIM_TEXT=2: a start-up error naming the variable, exit 1.
set -euo pipefail
: "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"
preload_check_uffd
preload_workdir farmem-trim
work=$WORK
lib=$(basename "$FARMEM_PRELOAD_LIB")
# Prints the sum, then "maps SIZE_KIB RSS_KIB" for the library's executable
# mappings.
prog='import os, re
b = bytearray(32 << 20)
for k in (2, 1):
    for i in range(0, len(b), 4096): b[i] = k
print(sum(b))
n = size = rss = 0
cur = False
for line in open("/proc/self/smaps"):
    m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$", line)
    if m:
        cur = m.group(3)[2] == "x" and m.group(4).endswith(os.environ["LIB"])
        if cur:
            n += 1
            size += (int(m.group(2), 16) - int(m.group(1), 16)) >> 10
    elif cur and line.startswith("Rss:"):
        rss += int(line.split()[1])
print(n, size, rss)'

# run LABEL ENV...: sets MAPS SIZE RSS; the sum and paging checked.
run() {
  local label=$1
  shift
  env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRANSPORT=loopback FARMEM_LOOPBACK_CAPACITY=256M \
    FARMEM_LOCAL_MEM=8M FARMEM_STATS=1 FARMEM_STATS_SOCKET=0 LIB="$lib" "$@" \
    /usr/bin/python3 -c "$prog" > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; fail "$label run failed"; }
  [[ $(head -1 "$work/out") == $((32 * 256)) ]] || fail "$label run: wrong sum: $(head -1 "$work/out")"
  local dirty
  dirty=$(sed -n 's/^farmem: stats: evictions: [0-9]* clean, \([0-9]*\) dirty.*/\1/p' "$work/err")
  [[ -n $dirty && $dirty -gt 0 ]] || { cat "$work/err" >&2; fail "$label run did not page"; }
  read -r MAPS SIZE RSS < <(sed -n 2p "$work/out")
  echo "$label: $MAPS executable mappings of $lib, $RSS of $SIZE KiB resident, $dirty dirty evictions"
}

run trimmed
[[ $MAPS -ge 100 ]] || fail "the executable segment is not split into pages ($MAPS mappings)"
[[ $((RSS * 100)) -lt $((SIZE * 60)) ]] || fail "$RSS of $SIZE KiB of text resident after trimming"
trimmed_rss=$RSS
run untrimmed FARMEM_TRIM_TEXT=0
[[ $MAPS == 1 ]] || fail "FARMEM_TRIM_TEXT=0 still split the text ($MAPS mappings)"
[[ $RSS -gt $trimmed_rss ]] || fail "untrimmed text ($RSS KiB) is not larger than trimmed ($trimmed_rss KiB)"

set +e
env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRIM_TEXT=2 /usr/bin/python3 -c 'print(1)' > "$work/out" 2> "$work/err"
rc=$?
set -e
[[ $rc == 1 ]] || { cat "$work/err" >&2; fail "FARMEM_TRIM_TEXT=2: exit $rc, not 1"; }
grep -q FARMEM_TRIM_TEXT "$work/err" || { cat "$work/err" >&2; fail "the error does not name FARMEM_TRIM_TEXT"; }
echo "FARMEM_TRIM_TEXT=2: $(head -1 "$work/err")"
echo "PASS"
