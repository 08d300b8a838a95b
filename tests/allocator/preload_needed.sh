#!/usr/bin/env bash
# The preload library maps rdma-core only when it uses verbs
# (runtime/verbs_lib.h), libcrypto never (runtime/auth.cc has its own
# HMAC-SHA256), and no shared libstdc++ (linked in, preload/CMakeLists.txt):
# loaded, they cost every preloaded program ~20 ms of CPU and resident set
# inside its budget (libcrypto 3.5 MiB, libstdc++ with libm ~1.2 MiB).
# Checks, with FARMEM_PRELOAD_LIB set:
#   1. its DT_NEEDED list names none of libibverbs, librdmacm, libcrypto,
#      libstdc++ (a verbs call added without its forwarder in
#      runtime/verbs_lib.cc brings one back), nor libm (preload/mathlite.h);
#   2. a program that used far memory over loopback (FARMEM_STATS shows far
#      allocations) never mapped any of them;
#   2b. with FARMEMD set: nor one that pages to a donor over tcp, both
#      without a token (an --insecure farmemd) and with one, under a 2 MiB
#      budget so that it evicts (dirty evictions and remote faults > 0) and
#      so opens data connections, each with its attach proof;
#   3. FARMEM_TRANSPORT=verbs on a host without an RDMA device is a clear
#      start-up error (exit 1) naming the device check and FARMEM_TRANSPORT=tcp,
#      still without mapping rdma-core.
set -euo pipefail
: "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"
fail() { echo "FAIL: $*" >&2; exit 1; }
lazy='libibverbs|librdmacm|libcrypto|libstdc\+\+'

needed=$(readelf -d "$FARMEM_PRELOAD_LIB" | awk '/NEEDED/ { print $NF }')
echo "DT_NEEDED: $(echo $needed)"
if grep -Eq "$lazy" <<< "$needed"; then
  fail "$FARMEM_PRELOAD_LIB needs $(grep -Eo "$lazy" <<< "$needed" | tr '\n' ' ')at start-up"
fi
# Nor libm: its three functions the library uses are its own
# (preload/mathlite.h); a loaded libm costs ~0.3 MiB resident.
if grep -q '^libm\.so' <<< "$needed"; then
  fail "$FARMEM_PRELOAD_LIB needs libm (a new libm call: add it to preload/mathlite.h)"
fi

if [[ ! -e /dev/userfaultfd && $(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null || echo 0) != 1 && $(id -u) != 0 ]]; then
  echo "SKIP: userfaultfd is not available to this user (check 1 passed)"
  exit 77
fi
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"
preload_workdir farmem-needed
work=$WORK
# A far allocation of NEED_MB MiB (>= FARMEM_MIN_FAR) written twice, then the
# maps read; the sum is 256 per MiB.
prog='import os
b = bytearray(int(os.environ["NEED_MB"]) << 20)
for k in (2, 1):
    for i in range(0, len(b), 4096): b[i] = k
print(sum(b))
print(open("/proc/self/maps").read())'

# run_far_and_check LABEL MB ENV...: the program under the preload library
# with an MB MiB buffer and ENV; its output right, far memory used, and none
# of $lazy mapped. With EVICTS=1 it must also have paged.
run_far_and_check() {
  local label=$1 mb=$2 far
  shift 2
  env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_LOCAL_MEM=64M FARMEM_STATS=1 FARMEM_STATS_SOCKET=0 \
    NEED_MB="$mb" "$@" /usr/bin/python3 -c "$prog" > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; fail "$label run failed"; }
  [[ $(head -1 "$work/out") == $((mb * 256)) ]] || fail "$label run: wrong output: $(head -1 "$work/out")"
  far=$(sed -n 's/^farmem: stats: far heap: \([0-9]*\) allocations.*/\1/p' "$work/err")
  [[ -n $far && $far -gt 0 ]] || { cat "$work/err" >&2; fail "$label run: far memory was not used"; }
  if [[ ${EVICTS:-0} == 1 ]]; then
    preload_check_far_memory_used "$work/err"
    far="$far (dirty evictions $dirty, remote faults $remote)"
  fi
  if grep -Eq "$lazy" "$work/out"; then
    fail "a $label run mapped $(grep -Eo "($lazy)[^ ]*" "$work/out" | sort -u | tr '\n' ' ')"
  fi
  echo "$label run: $far far allocations, no rdma-core, libcrypto or libstdc++ mapped"
}

run_far_and_check loopback 4 FARMEM_TRANSPORT=loopback FARMEM_LOOPBACK_CAPACITY=256M
if [[ -n ${FARMEMD:-} ]]; then
  preload_start_farmemd farmemd-insecure.log 64M 16M insecure
  EVICTS=1 run_far_and_check "tcp, no token, paging" 16 FARMEM_LOCAL_MEM=2M FARMEM_TRANSPORT=tcp \
    FARMEM_SERVERS="127.0.0.1:$PORT"
  preload_start_farmemd farmemd-token.log 64M 16M
  EVICTS=1 run_far_and_check "tcp, token, paging" 16 FARMEM_LOCAL_MEM=2M FARMEM_TRANSPORT=tcp \
    FARMEM_SERVERS="127.0.0.1:$PORT" FARMEM_TOKEN_FILE="$work/token"
fi

if [[ -d /sys/class/infiniband ]] && [[ -n $(ls -A /sys/class/infiniband) ]]; then
  echo "this host has an RDMA device: check 3 skipped (checks 1-2 passed)"
  exit 0
fi
set +e
env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_TRANSPORT=verbs FARMEM_SERVERS=127.0.0.1:9 \
  FARMEM_MIN_FAR=0 /usr/bin/python3 -c 'print(1)' > "$work/out" 2> "$work/err"
rc=$?
set -e
[[ $rc == 1 ]] || { cat "$work/err" >&2; fail "FARMEM_TRANSPORT=verbs without a device: exit $rc, not 1"; }
grep -q "FARMEM_TRANSPORT=verbs, but no RDMA device" "$work/err" || { cat "$work/err" >&2; fail "no clear verbs error"; }
grep -q "set FARMEM_TRANSPORT=tcp" "$work/err" || { cat "$work/err" >&2; fail "the error does not say what to do"; }
echo "verbs without a device: $(grep -m1 'FARMEM_TRANSPORT=verbs' "$work/err")"
echo "PASS"
