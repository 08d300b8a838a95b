# Shared steps of the preload tests (preload_run.sh, preload_replication.sh):
# sourced, not run.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"
#   preload_check_env my_script          # FARMEMD / FARMEM_PRELOAD_LIB set, uffd usable (77 = skip)
#   preload_check_uffd                   # uffd usable (77 = skip), for tests without a farmemd
#   preload_workdir farmem-mine          # WORK (cwd), token, cleanup trap stopping DAEMONS
#   preload_start_farmemd d0.log 1G 16M  # PORT, and its pid appended to DAEMONS
#   ... run "$@" > out.ref and under LD_PRELOAD > out.far 2> err.far ...
#   preload_check_output                 # out.ref == out.far, else FAIL
#   preload_check_far_memory_used [ERR]  # dirty / remote from ERR (err.far), both > 0, else FAIL
#
# PRELOAD_STOP_SIGNAL (default TERM) is what the cleanup sends the daemons.

# Exits 2 when a variable the script needs is unset, 77 (ctest's skip code)
# when this user cannot use userfaultfd.
preload_check_env() {
  : "${FARMEMD:?set FARMEMD to the farmemd binary}"
  : "${FARMEM_PRELOAD_LIB:?set FARMEM_PRELOAD_LIB to libfarmem_preload.so}"
  preload_check_uffd
}
preload_check_uffd() {
  if [[ ! -e /dev/userfaultfd && $(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null || echo 0) != 1 && $(id -u) != 0 ]]; then
    echo "SKIP: userfaultfd is not available to this user"
    exit 77
  fi
}

# A private directory /tmp/PREFIX.XXXXXX as cwd with a fresh token file; on
# exit every daemon in DAEMONS is stopped and the directory removed.
DAEMONS=()
preload_cleanup() {
  local d
  for d in "${DAEMONS[@]}"; do
    kill "-${PRELOAD_STOP_SIGNAL:-TERM}" "$d" 2>/dev/null || true
    wait "$d" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
preload_workdir() {
  WORK=$(mktemp -d "/tmp/$1.XXXXXX")
  trap preload_cleanup EXIT
  cd "$WORK"
  head -c 32 /dev/urandom | base64 > token
  chmod 600 token
}

# Starts farmemd on 127.0.0.1 (a port it picks) with the token (or, with a
# fourth argument "insecure", without one: --insecure), logging to LOG; sets
# PORT from its first line. Fails (exit 1, log shown) when it dies or does
# not report a port within 10 s.
preload_start_farmemd() {
  local log=$1 capacity=$2 slab=$3 pid auth=(--token-file token)
  [[ ${4:-} == insecure ]] && auth=(--insecure)
  # PRELOAD_FARMEMD_ARGS: more flags for every daemon (e.g. --local-clients=off).
  # Created here, not by the background job's redirection: the first sed
  # below may run before that job has, and a sed that cannot read the file
  # fails the whole script (set -e, pipefail).
  : > "$log"
  # shellcheck disable=SC2086  # PRELOAD_FARMEMD_ARGS is a list of flags
  "$FARMEMD" --listen 127.0.0.1:0 --capacity "$capacity" --slab-size "$slab" "${auth[@]}" \
    ${PRELOAD_FARMEMD_ARGS:-} > "$log" 2>&1 &
  pid=$!
  DAEMONS+=("$pid")
  PORT=""
  for _ in $(seq 1 100); do
    PORT=$(sed -n 's/^farmemd listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [[ -n $PORT ]] && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "FAIL: farmemd ($log) died" >&2; exit 1; }
    sleep 0.1
  done
  cat "$log" >&2
  echo "FAIL: farmemd ($log) did not report its port" >&2
  exit 1
}

# out.far must equal out.ref byte for byte.
preload_check_output() {
  if ! cmp -s out.ref out.far; then
    echo "FAIL: output differs from the run without the preload library" >&2
    diff <(head -c 2000 out.ref) <(head -c 2000 out.far) >&2 || true
    exit 1
  fi
}

# The stats line in err.far (FARMEM_STATS=1) must show dirty evictions and
# remote faults: the program really went beyond its local budget. Sets
# dirty and remote.
preload_check_far_memory_used() {
  local err=${1:-err.far}
  dirty=$(sed -n 's/.*evictions: [0-9]* clean, \([0-9]*\) dirty.*/\1/p' "$err")
  remote=$(sed -n 's/.*zero-fill, \([0-9]*\) remote.*/\1/p' "$err")
  if [[ -z $dirty || $dirty -eq 0 || -z $remote || $remote -eq 0 ]]; then
    echo "FAIL: far memory was not exercised beyond the budget (dirty evictions '$dirty', remote faults '$remote')" >&2
    cat "$err" >&2
    exit 1
  fi
}
