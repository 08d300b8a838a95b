#!/usr/bin/env bash
# Runs an unmodified program with and without the preload library against a
# real farmemd on 127.0.0.1 (a port it picks) and checks that stdout is
# byte-identical and that far memory was really used beyond the local
# budget (dirty evictions and remote fetches).
#
#   preload_run.sh --local-mem 16M [--setup 'shell cmd'] -- prog args...
#
# Environment (set by ctest): FARMEMD, FARMEM_PRELOAD_LIB. The program runs
# in a private temporary directory (cwd); --setup runs there first.
set -euo pipefail
exec </dev/null

LOCAL_MEM=16M
SETUP=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --local-mem) LOCAL_MEM=$2; shift 2 ;;
    --setup) SETUP=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "preload_run: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "preload_run: no program given" >&2; exit 2; }
: "${FARMEMD:?set FARMEMD to the farmemd binary}"
: "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"

if [[ ! -e /dev/userfaultfd && $(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null || echo 0) != 1 && $(id -u) != 0 ]]; then
  echo "SKIP: userfaultfd is not available to this user"
  exit 77
fi

WORK=$(mktemp -d /tmp/farmem-preload.XXXXXX)
DAEMON=""
cleanup() {
  if [[ -n $DAEMON ]]; then kill -TERM "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK"
head -c 32 /dev/urandom | base64 > token
chmod 600 token

"$FARMEMD" --listen 127.0.0.1:0 --capacity 1G --slab-size 16M --token-file token \
  > farmemd.log 2>&1 &
DAEMON=$!
PORT=""
for _ in $(seq 1 100); do
  PORT=$(sed -n 's/^farmemd listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' farmemd.log | head -1)
  [[ -n $PORT ]] && break
  kill -0 "$DAEMON" 2>/dev/null || { cat farmemd.log >&2; echo "FAIL: farmemd died" >&2; exit 1; }
  sleep 0.1
done
[[ -n $PORT ]] || { cat farmemd.log >&2; echo "FAIL: farmemd did not report its port" >&2; exit 1; }

if [[ -n $SETUP ]]; then bash -c "$SETUP"; fi

echo "== $* (local budget $LOCAL_MEM, donor 127.0.0.1:$PORT)"
start=$(date +%s.%N)
"$@" > out.ref
mid=$(date +%s.%N)
LD_PRELOAD=$FARMEM_PRELOAD_LIB FARMEM_SERVERS=127.0.0.1:$PORT FARMEM_TOKEN_FILE=$WORK/token \
  FARMEM_LOCAL_MEM=$LOCAL_MEM FARMEM_STATS=1 "$@" > out.far 2> err.far || {
  rc=$?; cat err.far >&2; echo "FAIL: exit status $rc under the preload library" >&2; exit 1; }
end=$(date +%s.%N)
grep '^farmem: stats' err.far || true
awk -v a="$start" -v b="$mid" -v c="$end" \
  'BEGIN { printf "time: %.2f s without, %.2f s with far memory\n", b - a, c - b }'
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
echo "PASS: $(wc -c < out.ref) bytes of output identical; $dirty pages written back, $remote fetched"
