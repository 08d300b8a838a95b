#!/usr/bin/env bash
# Runs one command inside a qemu guest that has a Soft-RoCE device, and
# returns its output and exit status on the host.
#
#   tools/softroce/run.sh -- ibv_devinfo -d rxe0
#   tools/softroce/run.sh --timeout 300 --share "$PWD/build" -- ctest -L verbs
#
# The guest boots Debian's kernel (prepare.sh builds and caches it), chroots
# into the host's / shared read-only over virtio-9p, and mounts each --share
# folder (default: the repository) read-write at its same absolute path, so
# host-built binaries run unchanged. Its network is its own: a veth pair,
# 10.0.0.1/24 on v0, and one rxe device `rxe0` on v0; nothing leaves the
# machine. The command runs as root in the host's current directory with
# PATH, HOME=/root, LANG=C.UTF-8, SOFTROCE_GUEST=1, every FARMEM_* variable
# of the caller (except FARMEM_SOFTROCE_*) and each --env NAME=VALUE.
#
# Options (environment default in brackets):
#   --accel tcg|kvm|auto  [FARMEM_SOFTROCE_ACCEL, tcg] auto picks kvm only
#                         where /dev/kvm is usable, the CPU has vmx/svm and
#                         it is not PVM (on which Debian's kernel hangs)
#   --timeout S           [FARMEM_SOFTROCE_TIMEOUT, 600] host-side limit for
#                         the whole guest run; qemu is killed after it
#   --mem SIZE            [FARMEM_SOFTROCE_MEM, 2G] guest memory
#   --cpus N              [FARMEM_SOFTROCE_CPUS, 2] guest CPUs
#   --share DIR           read-write share (repeatable; default the repo)
#   --env NAME=VALUE      set in the command's environment (repeatable)
#   --keep                keep the run folder (console log, output) even
#                         on success
#
# Exit status: the command's own; 77 when this machine cannot run the guest
# ("SKIP: <reason>" printed); 124 when the time limit hit; 125 when the
# guest gave no result (panic, failed set-up): the console log path is
# printed. Run folders of failed runs stay in <cache>/runs/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

accel="${FARMEM_SOFTROCE_ACCEL:-tcg}"
timeout_s="${FARMEM_SOFTROCE_TIMEOUT:-600}"
mem="${FARMEM_SOFTROCE_MEM:-2G}"
cpus="${FARMEM_SOFTROCE_CPUS:-2}"
shares=()
envs=()
keep=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --accel) accel="${2:?--accel needs tcg, kvm or auto}"; shift ;;
    --timeout) timeout_s="${2:?--timeout needs seconds}"; shift ;;
    --mem) mem="${2:?--mem needs a size such as 2G}"; shift ;;
    --cpus) cpus="${2:?--cpus needs a count}"; shift ;;
    --share) shares+=("${2:?--share needs a folder}"); shift ;;
    --env) envs+=("${2:?--env needs NAME=VALUE}"); shift ;;
    --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) softroce_die "unknown option '$1'; the command goes after '--' (see --help)" ;;
  esac
  shift
done
(($#)) || softroce_die "no command given: run.sh [options] -- CMD [ARGS...]"
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || softroce_die "--timeout '$timeout_s' is not a whole number of seconds"
[[ "$cpus" =~ ^[1-9][0-9]*$ ]] || softroce_die "--cpus '$cpus' is not a positive count"
[[ "$mem" =~ ^([1-9][0-9]*)([MG])$ ]] || softroce_die "--mem '$mem' is not like 512M or 2G"
mem_mib=${BASH_REMATCH[1]}
[[ ${BASH_REMATCH[2]} == G ]] && mem_mib=$((mem_mib * 1024))
for e in "${envs[@]}"; do
  [[ "$e" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || softroce_die "--env '$e' is not NAME=VALUE"
done
# Caller's FARMEM_* settings travel along; the harness's own do not.
while IFS='=' read -r name _; do
  [[ "$name" == FARMEM_* && "$name" != FARMEM_SOFTROCE_* ]] && envs+=("$name=${!name}")
done < <(env)

# Shares are named in the guest's shell config: keep their names plain.
((${#shares[@]})) || shares=("$SOFTROCE_REPO_ROOT")
declare -a share_dirs=()
for s in "${shares[@]}"; do
  [[ -d "$s" ]] || softroce_die "--share '$s' is not a folder"
  s="$(cd "$s" && pwd -P)"
  [[ "$s" != / ]] || softroce_die "--share / makes no sense: / is already shared read-only"
  [[ "$s" =~ ^/[A-Za-z0-9._/+-]+$ ]] ||
    softroce_die "--share '$s': use a path of letters, digits and ._/+- only"
  share_dirs+=("$s")
done
# Parents before children, so that nested shares mount in the right order.
mapfile -t share_dirs < <(printf '%s\n' "${share_dirs[@]}" | awk '{ print length, $0 }' | sort -n -u | cut -d' ' -f2-)

# ---- can this machine run it? (cheap checks first) -----------------------
avail_mib=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
((avail_mib >= mem_mib + 256)) ||
  softroce_skip "the guest needs ${mem_mib} MiB + 256 MiB for qemu but only ${avail_mib} MiB are available (try --mem 1G)"

real_kvm() {
  [[ -r /dev/kvm && -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo && [[ ! -d /sys/module/kvm_pvm ]]
}
case "$accel" in
  tcg) ;;
  kvm)
    [[ -r /dev/kvm && -w /dev/kvm ]] ||
      softroce_skip "--accel kvm but /dev/kvm is missing or not accessible (use --accel tcg)"
    ;;
  auto) if real_kvm; then accel=kvm; else accel=tcg; fi ;;
  *) softroce_die "--accel '$accel': use tcg, kvm or auto" ;;
esac
# Through bash: the scripts work without their executable bits.
guest_dir="$(bash "$SOFTROCE_TOOLS_DIR/prepare.sh")" || {
  rc=$?
  ((rc == SOFTROCE_SKIP)) && { printf '%s\n' "$guest_dir"; exit "$SOFTROCE_SKIP"; }
  softroce_die "prepare.sh failed (exit $rc)"
}
qemu="qemu-system-x86_64"
softroce_have "$qemu" || softroce_skip "$qemu is not installed (prepare.sh installs qemu-system-x86)"
softroce_have timeout || softroce_skip "coreutils timeout is missing"
if [[ "$accel" == kvm ]]; then
  accel_args=(-accel kvm -cpu host)
else
  # shellcheck disable=SC2054  # the commas belong to qemu's option syntax
  accel_args=(-accel tcg,thread=multi -cpu max)
fi

# ---- the run folder: config, command, and what comes back ----------------
mkdir -p "$SOFTROCE_CACHE/runs"
run="$(mktemp -d "$SOFTROCE_CACHE/runs/$(date +%Y%m%d-%H%M%S)-XXXX")"
qemu_pid=""
tail_pid=""
# shellcheck disable=SC2317  # called through the trap
finish() {
  local rc=$?
  if [[ -n "$qemu_pid" ]]; then
    # Interrupted while the guest runs. Never leave it behind: stop the
    # timeout wrapper (it passes the signal on), then qemu itself by the pid
    # it wrote (qemu deletes that file when it exits: it may be gone).
    kill "$qemu_pid" 2>/dev/null || true
    local pid
    pid="$(cat "$run/qemu.pid" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && { kill -9 "$pid" 2>/dev/null || true; }
  fi
  [[ -n "$tail_pid" ]] && { kill "$tail_pid" 2>/dev/null || true; }
  if ((rc == 0 && !keep)); then
    rm -rf "$run"
  else
    softroce_log "run folder kept: $run"
  fi
  # Failed runs pile up; keep the ten newest.
  # shellcheck disable=SC2012  # run folder names are ours: plain characters
  { ls -1dt "$SOFTROCE_CACHE"/runs/*/ 2>/dev/null | tail -n +11 | xargs -r rm -rf; } || true
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

{
  printf 'SOFTROCE_SHARES=%q\n' "${share_dirs[*]}"
  printf 'SOFTROCE_MSIZE=262144\n'
} >"$run/config.sh"
{
  printf '#!/bin/bash\n# Written by run.sh; runs in the guest chroot.\n'
  printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
  for e in "${envs[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} >"$run/cmd.sh"

fsdevs=(
  -fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
  -device "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot"
  -fsdev "local,id=results,path=$run,security_model=none,multidevs=remap"
  -device "virtio-9p-pci,fsdev=results,mount_tag=results"
)
for i in "${!share_dirs[@]}"; do
  fsdevs+=(-fsdev "local,id=share$i,path=${share_dirs[i]},security_model=none,multidevs=remap"
    -device "virtio-9p-pci,fsdev=share$i,mount_tag=share$i")
done

# quiet: the console log holds only warnings and the guest init's lines.
# mitigations=off and tsc=reliable save emulated work; panic=-1 with
# -no-reboot turns a guest panic into qemu exiting.
cmdline="console=ttyS0 rdinit=/init panic=-1 quiet loglevel=4 mitigations=off tsc=reliable"
softroce_log "booting $(basename "$guest_dir") ($accel, ${cpus} cpus, ${mem_mib} MiB, limit ${timeout_s} s):$(printf ' %q' "$@")"
start=$(softroce_now)
timeout -k 5 "$timeout_s" "$qemu" -name farmem-softroce -machine pc "${accel_args[@]}" \
  -smp "$cpus" -m "$mem_mib" -nodefaults -no-user-config -display none -monitor none \
  -serial "file:$run/console.log" -no-reboot -nic none -pidfile "$run/qemu.pid" \
  -kernel "$guest_dir/vmlinux" -initrd "$guest_dir/initramfs.cpio" -append "$cmdline" \
  "${fsdevs[@]}" </dev/null >"$run/qemu.log" 2>&1 &
qemu_pid=$!
# Stream the command's output as the guest writes it.
tail -n +1 -F --pid="$qemu_pid" "$run/output.log" 2>/dev/null &
tail_pid=$!
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
qemu_pid=""
wait "$tail_pid" 2>/dev/null || true
tail_pid=""
elapsed=$(softroce_elapsed "$start")

show_console() {
  softroce_log "console log: $run/console.log (last lines follow)"
  tail -n 25 "$run/console.log" 2>/dev/null | sed 's/^/  | /' >&2 || true
  if [[ -s "$run/qemu.log" ]]; then
    softroce_log "qemu said:"
    sed 's/^/  | /' "$run/qemu.log" >&2
  fi
}

if [[ -s "$run/status" ]]; then
  status="$(cat "$run/status")"
  softroce_log "guest run took $elapsed s (rxe ready at $(cat "$run/ready" 2>/dev/null || echo '?') s of guest uptime); command exited $status"
  [[ "$status" =~ ^[0-9]+$ ]] || { show_console; exit "$SOFTROCE_NO_RESULT"; }
  exit "$status"
fi
if ((qemu_rc == 124 || qemu_rc == 137)); then
  softroce_log "time limit of $timeout_s s reached; qemu killed"
  show_console
  exit "$SOFTROCE_TIMEOUT"
fi
if [[ -s "$run/setup_error" ]]; then
  softroce_log "guest set-up failed: $(cat "$run/setup_error")"
else
  softroce_log "the guest gave no result (qemu exit $qemu_rc after $elapsed s; guest panic or crash?)"
fi
show_console
exit "$SOFTROCE_NO_RESULT"
