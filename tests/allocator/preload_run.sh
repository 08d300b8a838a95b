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
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"

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
preload_check_env
preload_workdir farmem-preload
preload_start_farmemd farmemd.log 1G 16M

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
preload_check_output
preload_check_far_memory_used
echo "PASS: $(wc -c < out.ref) bytes of output identical; $dirty pages written back, $remote fetched"
