#!/usr/bin/env bash
# An unmodified program under the preload library against three farmemd on
# 127.0.0.1 with FARMEM_REPLICAS=2; one donor is SIGKILLed while the program
# runs. Its stdout must be byte-identical to a run without farmem, and far
# memory must really have been used (dirty evictions, remote faults).
#
#   preload_replication.sh --local-mem 16M [--kill-after SECONDS] -- prog args...
#
# Environment (set by ctest): FARMEMD, FARMEM_PRELOAD_LIB.
set -euo pipefail
exec </dev/null

LOCAL_MEM=16M
KILL_AFTER=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --local-mem) LOCAL_MEM=$2; shift 2 ;;
    --kill-after) KILL_AFTER=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "preload_replication: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "preload_replication: no program given" >&2; exit 2; }
: "${FARMEMD:?set FARMEMD to the farmemd binary}"
: "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"

if [[ ! -e /dev/userfaultfd && $(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null || echo 0) != 1 && $(id -u) != 0 ]]; then
  echo "SKIP: userfaultfd is not available to this user"
  exit 77
fi

WORK=$(mktemp -d /tmp/farmem-repl.XXXXXX)
DAEMONS=()
cleanup() {
  for d in "${DAEMONS[@]}"; do kill -KILL "$d" 2>/dev/null || true; wait "$d" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK"
head -c 32 /dev/urandom | base64 > token
chmod 600 token

SERVERS=""
for i in 0 1 2; do
  "$FARMEMD" --listen 127.0.0.1:0 --capacity 512M --slab-size 4M --token-file token \
    > "farmemd$i.log" 2>&1 &
  DAEMONS+=($!)
  PORT=""
  for _ in $(seq 1 100); do
    PORT=$(sed -n 's/^farmemd listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "farmemd$i.log" | head -1)
    [[ -n $PORT ]] && break
    sleep 0.1
  done
  [[ -n $PORT ]] || { cat "farmemd$i.log" >&2; echo "FAIL: farmemd $i did not start" >&2; exit 1; }
  SERVERS+="${SERVERS:+,}127.0.0.1:$PORT"
done

echo "== $* (local budget $LOCAL_MEM, donors $SERVERS, 2 replicas, one SIGKILLed after ${KILL_AFTER}s)"
"$@" > out.ref
LD_PRELOAD=$FARMEM_PRELOAD_LIB FARMEM_SERVERS=$SERVERS FARMEM_REPLICAS=2 \
  FARMEM_TOKEN_FILE=$WORK/token FARMEM_LOCAL_MEM=$LOCAL_MEM FARMEM_STATS=1 \
  "$@" > out.far 2> err.far &
PROG=$!
sleep "$KILL_AFTER"
if ! kill -0 "$PROG" 2>/dev/null; then
  wait "$PROG" || true
  cat err.far >&2
  echo "FAIL: the program finished before the donor could be killed; raise its work or lower --kill-after" >&2
  exit 1
fi
kill -KILL "${DAEMONS[1]}"
echo "SIGKILLed donor 1 (pid ${DAEMONS[1]}) while the program ran"
rc=0
wait "$PROG" || rc=$?
if [[ $rc -ne 0 ]]; then
  cat err.far >&2
  echo "FAIL: exit status $rc under the preload library after a donor died" >&2
  exit 1
fi
grep '^farmem: stats' err.far || true
grep 're-replication' err.far || true
if ! cmp -s out.ref out.far; then
  echo "FAIL: output differs from the run without the preload library" >&2
  diff <(head -c 2000 out.ref) <(head -c 2000 out.far) >&2 || true
  exit 1
fi
dirty=$(sed -n 's/.*evictions: [0-9]* clean, \([0-9]*\) dirty.*/\1/p' err.far)
remote=$(sed -n 's/.*zero-fill, \([0-9]*\) remote.*/\1/p' err.far)
if [[ -z $dirty || $dirty -eq 0 || -z $remote || $remote -eq 0 ]]; then
  echo "FAIL: far memory was not exercised beyond the budget (dirty evictions '$dirty', remote faults '$remote')" >&2
  cat err.far >&2
  exit 1
fi
if ! grep -q 'a donor failed' err.far; then
  echo "FAIL: the runtime did not notice the dead donor" >&2
  cat err.far >&2
  exit 1
fi
echo "PASS: $(wc -c < out.ref) bytes of output identical; $dirty pages written back, $remote fetched"
