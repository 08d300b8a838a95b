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
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"

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
preload_check_env
PRELOAD_STOP_SIGNAL=KILL
preload_workdir farmem-repl

SERVERS=""
for i in 0 1 2; do
  preload_start_farmemd "farmemd$i.log" 512M 4M
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
preload_check_output
preload_check_far_memory_used
if ! grep -q 'a donor failed' err.far; then
  echo "FAIL: the runtime did not notice the dead donor" >&2
  cat err.far >&2
  exit 1
fi
echo "PASS: $(wc -c < out.ref) bytes of output identical; $dirty pages written back, $remote fetched"
