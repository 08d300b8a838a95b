# shellcheck shell=bash disable=SC2034
# Shared helpers of the Soft-RoCE guest harness; sourced by prepare.sh,
# run.sh and smoke.sh, never run on its own.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   softroce_log "building the initramfs"
#   softroce_skip "qemu-system-x86_64 is missing and apt-get install failed"
#
# Exit codes shared by every script of the harness (callers rely on them):
#   0    success (run.sh: the guest command exited 0)
#   77   skipped: this machine cannot run the guest; "SKIP: <reason>" printed
#   124  run.sh: the host-side time limit killed the guest
#   125  run.sh: the guest gave no result (panic, setup failure, no status)
#   else run.sh: the guest command's own exit status; others: a harness error

SOFTROCE_SKIP=77
SOFTROCE_TIMEOUT=124
SOFTROCE_NO_RESULT=125

# The repository this copy of the harness lives in, and the cache beside it
# (.gitignore has /.cache/). FARMEM_SOFTROCE_CACHE moves the cache.
SOFTROCE_TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
SOFTROCE_REPO_ROOT="$(cd "$SOFTROCE_TOOLS_DIR/../.." && pwd -P)"
SOFTROCE_CACHE="${FARMEM_SOFTROCE_CACHE:-$SOFTROCE_REPO_ROOT/.cache/softroce}"

softroce_log() {
  printf 'softroce: %s\n' "$*" >&2
}

# The one way to give up because the machine cannot run the guest. The
# reason goes to stdout too, so that ctest (SKIP_RETURN_CODE 77) shows it.
softroce_skip() {
  printf 'SKIP: %s\n' "$*"
  exit "$SOFTROCE_SKIP"
}

# A harness error: something that should work here did not.
softroce_die() {
  printf 'softroce: error: %s\n' "$*" >&2
  exit 1
}

softroce_have() {
  command -v "$1" >/dev/null 2>&1
}

# Seconds since the epoch with millisecond precision, for the timings printed.
softroce_now() {
  date +%s.%3N
}

softroce_elapsed() {
  awk -v a="$1" -v b="$(softroce_now)" 'BEGIN { printf "%.1f", b - a }'
}
