#!/usr/bin/env bash
# The evaluation harness (issue 6): workloads at 100/75/50/25% local memory
# under all-local, farmem (loopback, tcp against farmemd) and Linux swap
# (cgroup-v1 limit + swapfile, zswap off and on); CSV, JSON, a table and
# PNG plots.
#
#   bench/eval/run.sh                    # default set, ~20 min on 2 cores; as root
#   bench/eval/run.sh --quick            # small sizes, ratios 100 and 50 (< 3 min, CI)
#   bench/eval/run.sh --out DIR [--workloads kv,scan] [--systems local,fm-tcp,swap]
#                     [--ratios 100,50] [--timeout S] [--swapfile PATH]
#
# The programs set (issue 16): unmodified Debian programs (xz -7, GNU sort,
# zstd -19 --long=27) plain, under swap and zswap and under farmem at the
# same peak RSS (R x the plain peak), outputs compared by sha256; wall, user
# and system time, peak RSS against its target, farmem's and swap's counters
# per cell; results in bench/eval/results-programs (table.md):
#
#   bench/eval/run.sh --set programs          # 100/70/50%, fm-tcp, swap, zswap; as root
#   bench/eval/run.sh --set programs --quick  # 1 MiB inputs, 100/50%, plain + fm-tcp (< 2 min, CI)
#   bench/eval/run.sh --set programs --programs xz,zstd --systems local,fm-tcp,fm-loopback,swap
#                     [--ratios 100,70] [--timeout-factor 20] [--timeout S]
#
# bench/eval/programs.py's header says how the limits are derived.
#
# Builds farmemd, the preload library and the workloads in FARMEM_BUILD_DIR
# (default build-eval, RelWithDebInfo) unless --build-dir names a build
# tree that has them (ctest passes its own). Results go to --out (default
# bench/eval/results). bench/eval/eval.py is the harness; its header says
# how the local budget is set for each system. Exit status 1 when a cell
# failed (error, timeout or a checksum different from all-local; in the
# programs set a timeout is a result, not a failure).
set -euo pipefail
exec </dev/null

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

build_dir=""
set_name=micro
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2 ;;
    --build-dir=*) build_dir=${1#--build-dir=}; shift ;;
    --set) set_name=${2:?--set needs micro or programs}; args+=("$1" "$2"); shift 2 ;;
    --set=*) set_name=${1#--set=}; args+=("$1"); shift ;;
    -h | --help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
      exit 0
      ;;
    *) args+=("$1"); shift ;;
  esac
done

need=(farmemd farmemctl farmem_preload farmem_eval_kv farmem_eval_sort farmem_eval_pagerank
  farmem_eval_scan farmem_eval_faultlat farmem_eval_mcload farmem_eval_runprog)
case "$set_name" in
  micro) ;;
  programs) need=(farmemd farmemctl farmem_preload farmem_eval_runprog) ;;  # the programs are Debian's
  *) echo "eval: --set is micro or programs, not '$set_name'" >&2; exit 2 ;;
esac
have_all() {
  local d=$1
  [[ -x $d/runtime/farmemd && -f $d/preload/libfarmem_preload.so ]] || return 1
  [[ $set_name == programs ]] && { [[ -x $d/bench/eval/farmem_eval_runprog ]]; return; }
  local w
  for w in kv sort pagerank scan faultlat mcload runprog; do
    [[ -x $d/bench/eval/farmem_eval_$w ]] || return 1
  done
}

if [[ -z $build_dir ]]; then
  build_dir=${FARMEM_BUILD_DIR:-$ROOT/build-eval}
  [[ $build_dir == /* ]] || build_dir=$ROOT/$build_dir
  echo "eval: building ${need[*]} in $build_dir"
  cmake -S "$ROOT" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build_dir" -j2 --target "${need[@]}"
elif ! have_all "$build_dir"; then
  echo "eval: $build_dir lacks farmemd, the preload library or the workloads;" \
    "build them: cmake --build $build_dir --target farmem_eval" >&2
  exit 2
fi

missing=()
if [[ $set_name == programs ]]; then
  command -v xz >/dev/null 2>&1 || missing+=("xz (Debian package xz-utils)")
  command -v sort >/dev/null 2>&1 || missing+=("sort (Debian package coreutils)")
  command -v zstd >/dev/null 2>&1 || missing+=("zstd (Debian package zstd)")
else
  command -v memcached >/dev/null 2>&1 || missing+=("memcached (Debian package memcached)")
  command -v gnuplot >/dev/null 2>&1 || missing+=("gnuplot (Debian package gnuplot-nox)")
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "eval: missing: ${missing[*]}; tools/install-deps.sh installs them" >&2
  exit 2
fi

exec python3 "$HERE/eval.py" --build-dir "$build_dir" "${args[@]}"
