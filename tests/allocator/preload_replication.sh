#!/usr/bin/env bash
# An unmodified program under the preload library against three farmemd on
# 127.0.0.1 with FARMEM_REPLICAS=2; one donor is SIGKILLed while the program
# runs. Its stdout must be byte-identical to a run without farmem, and far
# memory must really have been used (dirty evictions, remote faults).
#
#   preload_replication.sh --local-mem 16M -- prog args...
#
# The kill happens at a point the program reports, not after a delay (which
# a fast machine outran): the far run gets PRELOAD_SYNC_DIR=<its work dir>;
# the program creates $PRELOAD_SYNC_DIR/ready once it has written its data
# (most of it evicted to the donors, two replicas each) and waits for
# $PRELOAD_SYNC_DIR/go. The script then SIGKILLs donor 1, waits until it is
# dead, creates go, and the program reads its data back: whatever was on
# donor 1 comes from the other replica. Before it exits the program creates
# done and waits for exit, which the script creates once the runtime has
# logged the dead donor (the failure detector probes every 200 ms): that
# check does not depend on the program running long enough either. The
# program must honour this (tests/allocator/workloads/structures.py does).
#
# Environment (set by ctest): FARMEMD, FARMEM_PRELOAD_LIB.
set -euo pipefail
exec </dev/null
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"

LOCAL_MEM=16M
READY_TIMEOUT=150  # seconds for the program to reach each reported point (ctest: 180)
while [[ $# -gt 0 ]]; do
  case $1 in
    --local-mem) LOCAL_MEM=$2; shift 2 ;;
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

echo "== $* (local budget $LOCAL_MEM, donors $SERVERS, 2 replicas, one SIGKILLed once the program wrote its data)"
"$@" > out.ref
LD_PRELOAD=$FARMEM_PRELOAD_LIB FARMEM_SERVERS=$SERVERS FARMEM_REPLICAS=2 \
  FARMEM_TOKEN_FILE=$WORK/token FARMEM_LOCAL_MEM=$LOCAL_MEM FARMEM_STATS=1 \
  PRELOAD_SYNC_DIR=$WORK "$@" > out.far 2> err.far &
PROG=$!
# wait_for FILE WHAT: until the program creates FILE; FAIL when it exits
# first or takes longer than READY_TIMEOUT.
wait_for() {
  local waited=0 rc=0
  while [[ ! -e $1 ]]; do
    if ! kill -0 "$PROG" 2>/dev/null; then
      wait "$PROG" || rc=$?
      cat err.far >&2
      echo "FAIL: the program exited (status $rc) before it reported $2 ($WORK/$1); does it honour PRELOAD_SYNC_DIR?" >&2
      exit 1
    fi
    if ((waited >= READY_TIMEOUT * 20)); then
      kill -KILL "$PROG" 2>/dev/null || true
      cat err.far >&2
      echo "FAIL: the program did not report $2 within ${READY_TIMEOUT}s" >&2
      exit 1
    fi
    sleep 0.05
    waited=$((waited + 1))
  done
}
wait_for ready "its data written"
kill -KILL "${DAEMONS[1]}"
{ wait "${DAEMONS[1]}"; } 2>/dev/null || true  # reaped: the donor is gone before the program goes on
touch go
echo "SIGKILLed donor 1 (pid ${DAEMONS[1]}) after the program wrote its data; it reads it back now"
wait_for done "its work done"
# The runtime must notice the dead donor (fault path or health check) while
# the process lives; it probes every 200 ms, so 30 s is only a bound.
for _ in $(seq 1 600); do
  grep -q 'a donor failed' err.far && break
  sleep 0.05
done
touch exit
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
