#!/usr/bin/env bash
# README command 1: installs what is missing, builds, and runs the main job
# against a donor daemon on this machine.
#
#   tools/demo.sh                 # python3 with a 20M local budget against farmemd
#
# Steps: tools/install-deps.sh; build farmemd and the main job in build/
# (RelWithDebInfo: optimised, with symbols); write a random token to a
# private temporary directory; start farmemd on 127.0.0.1 on a free port
# with a small capacity; wait until it listens; run the main job; stop the
# daemon and print its log. The daemon and the temporary files are cleaned
# up on every exit path, Ctrl-C included.
#
# The main job is an unmodified program under LD_PRELOAD (main_job() below);
# examples/transport_demo.cc is the transport-level demo it replaced.
#
# Environment: FARMEM_BUILD_DIR (default build, relative to the repository
# or absolute), FARMEM_DEMO_CAPACITY (default 256M), FARMEM_DEMO_NO_BUILD=1
# (skip install and build: ctest runs this script on its own build tree),
# FARMEM_DEMO_LOCAL_MEM (default 20M).
set -euo pipefail
exec </dev/null

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
BUILD=${FARMEM_BUILD_DIR:-build}
[[ $BUILD == /* ]] || BUILD=$ROOT/$BUILD
CAPACITY=${FARMEM_DEMO_CAPACITY:-512M}

# ---- The main job -------------------------------------------------------------
# An unmodified Debian program (python3 building and hashing ~100 MiB of
# structures) runs twice: once as it is, once under the preload library with
# a local budget of FARMEM_DEMO_LOCAL_MEM (default 20M, about a fifth of its
# heap), so most of its heap lives in farmemd. The two outputs must be
# identical; FARMEM_STATS=1 prints what the pager did.
MAIN_TARGETS=(farmem_preload)
LOCAL_MEM=${FARMEM_DEMO_LOCAL_MEM:-20M}
PROGRAM=(/usr/bin/python3 "$ROOT/tests/allocator/workloads/structures.py")

# Runs with FARMEM_SERVERS and FARMEM_TOKEN_FILE set to the daemon started
# below; its exit status is the script's.
main_job() {
  local plain far
  log "running without farmem: ${PROGRAM[*]##*/}"
  plain=$(/usr/bin/time -f '%e s, peak RSS %M KiB' -o "$WORK/time.plain" "${PROGRAM[@]}")
  log "  output: $(echo "$plain" | tr '\n' ' ')($(cat "$WORK/time.plain"))"
  log "running under LD_PRELOAD=libfarmem_preload.so with FARMEM_LOCAL_MEM=$LOCAL_MEM"
  # /usr/bin/time measures; env sets LD_PRELOAD for the program alone.
  far=$(/usr/bin/time -f '%e s, peak RSS %M KiB' -o "$WORK/time.far" \
    env LD_PRELOAD="$BUILD/preload/libfarmem_preload.so" FARMEM_LOCAL_MEM="$LOCAL_MEM" \
    FARMEM_STATS=1 "${PROGRAM[@]}" 2>"$WORK/far.stderr") || {
    err "the program failed under farmem; its stderr:"
    sed 's/^/  | /' "$WORK/far.stderr" >&2
    return 1
  }
  log "  output: $(echo "$far" | tr '\n' ' ')($(cat "$WORK/time.far"))"
  log "what farmem did (FARMEM_STATS=1):"
  sed 's/^/  | /' "$WORK/far.stderr"
  if [[ $plain != "$far" ]]; then
    err "FAILED: the output under farmem differs from the plain run"
    return 1
  fi
  log "the output under farmem is identical to the plain run"
}

# ---- Plumbing -------------------------------------------------------------------
log() { printf 'demo: %s\n' "$*"; }
err() { printf 'demo: %s\n' "$*" >&2; }

WORK=""
DAEMON_PID=""

stop_daemon() {
  [[ -n $DAEMON_PID ]] || return 0
  local pid=$DAEMON_PID status=0 i
  DAEMON_PID=""
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do  # up to 10 s for a clean shutdown
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    err "farmemd (pid $pid) did not stop within 10 s of SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || status=$?
  return "$status"
}

cleanup() {
  stop_daemon || true
  [[ -n $WORK ]] && rm -rf "$WORK"
  return 0
}
trap cleanup EXIT
trap 'err "interrupted"; exit 130' INT
trap 'err "terminated"; exit 143' TERM

# The port a process listens on, from the kernel's socket table (the daemon
# binds port 0, so it never races another program for a port).
# Without ss, fall back to the line farmemd prints once it listens.
listen_port_of() {
  if command -v ss >/dev/null 2>&1; then
    ss -H -ltnp 2>/dev/null |
      awk -v pid="pid=$1," 'index($0, pid) { n = split($4, a, ":"); print a[n]; exit }'
  else
    sed -n 's/^farmemd listening on [^ ]*:\([0-9][0-9]*\),.*/\1/p' "$DAEMON_LOG" | head -n1
  fi
}

# ---- 1. Install and build ----------------------------------------------------------
if [[ ${FARMEM_DEMO_NO_BUILD:-0} != 1 ]]; then
  bash tools/install-deps.sh
  log "building farmemd and ${MAIN_TARGETS[*]} in $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFARMEM_ENABLE_WERROR=ON >/dev/null
  ninja -C "$BUILD" farmemd "${MAIN_TARGETS[@]}"
fi

# ---- 2. Start a donor on loopback ------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/farmem-demo.XXXXXX")
chmod 700 "$WORK"
TOKEN_FILE=$WORK/token
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$TOKEN_FILE")
chmod 600 "$TOKEN_FILE"
DAEMON_LOG=$WORK/farmemd.log

"$BUILD/runtime/farmemd" --listen 127.0.0.1:0 --capacity "$CAPACITY" \
  --token-file "$TOKEN_FILE" >"$DAEMON_LOG" 2>&1 &
DAEMON_PID=$!
log "started farmemd (pid $DAEMON_PID, capacity $CAPACITY)"

port=""
for ((i = 0; i < 100; i++)); do  # up to 10 s
  if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    err "farmemd exited before it listened; its log:"
    sed 's/^/  | /' "$DAEMON_LOG" >&2
    DAEMON_PID=""
    exit 1
  fi
  port=$(listen_port_of "$DAEMON_PID")
  [[ -n $port ]] && break
  sleep 0.1
done
if [[ -z $port ]]; then
  err "farmemd did not listen within 10 s; its log:"
  sed 's/^/  | /' "$DAEMON_LOG" >&2
  exit 1
fi
log "farmemd listens on 127.0.0.1:$port"

# ---- 3. The main job ---------------------------------------------------------------------
job_status=0
FARMEM_SERVERS=127.0.0.1:$port FARMEM_TOKEN_FILE=$TOKEN_FILE main_job "$@" || job_status=$?

# ---- 4. Stop the donor and show what it said -----------------------------------------------
daemon_status=0
stop_daemon || daemon_status=$?
log "farmemd log:"
sed 's/^/  | /' "$DAEMON_LOG"
if [[ $daemon_status -ne 0 ]]; then
  err "farmemd exited with status $daemon_status after SIGTERM (expected 0)"
fi
if [[ $job_status -ne 0 ]]; then
  err "FAILED: the main job exited with status $job_status"
  exit "$job_status"
fi
[[ $daemon_status -eq 0 ]] || exit 1
log "done: the main job succeeded and farmemd stopped cleanly"
