#!/usr/bin/env bash
# What the preload library costs a program whose heap fits in the local
# budget (goal: under 5%). Each workload runs REPS times without and with
# LD_PRELOAD=libfarmem_preload.so (FARMEM_TRANSPORT=loopback, a budget far
# above the heap, so nothing is evicted), interleaved and alternating which
# goes first; it prints the median and the minimum wall time of each, the
# median CPU time (user + system, all threads), and their ratios (on a
# shared, loaded machine the minimum wall time and the CPU time are the
# steadier figures: other tenants mostly add waiting), the median peak RSS
# of each (MiB, /usr/bin/time's %M: what the allocation-time zero fill,
# FARMEM_POPULATE_MAX, costs in memory), and the far heap's counters of the
# last preloaded run (far mallocs, zero-fill faults, blocks filled at
# allocation, evictions).
#
#   bench/preload_overhead.sh --build build-G --reps 9
#   bench/preload_overhead.sh --build build-G --reps 9 --workload mt --env FARMEM_STATS_SOCKET=0
#
# Workloads (--workload, repeatable; default all):
#   mt      tests/allocator/workloads/mt_workload.cc (4 threads, new/delete,
#           vector growth, 200 KiB strings, cross-thread frees): the far heap
#           serves every block >= FARMEM_MIN_FAR
#   python  python3 tests/allocator/workloads/structures.py (~100 MiB heap,
#           mostly small objects: the routing check on every malloc)
#   sort    sort --parallel=2 -S 100M of 25 MB of generated lines (one 100 MB
#           far buffer, ~60 MiB of it touched: first-touch faults)
# Every run's stdout is compared with the first unpreloaded run's.
# --env NAME=VALUE adds a variable to the preloaded runs (repeatable).
set -euo pipefail
exec </dev/null

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=$ROOT/build
REPS=7
WORKLOADS=()
EXTRA_ENV=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$(cd "$2" && pwd); shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --workload) WORKLOADS+=("$2"); shift 2 ;;
    --env) EXTRA_ENV+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "preload_overhead: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#WORKLOADS[@]} -gt 0 ]] || WORKLOADS=(mt python sort)
LIB=$BUILD/preload/libfarmem_preload.so
MT=$BUILD/tests/allocator/farmem_mt_workload
WL=$ROOT/tests/allocator/workloads
[[ -f $LIB ]] || { echo "preload_overhead: $LIB missing: build the farmem_preload target" >&2; exit 2; }

WORK=$(mktemp -d /tmp/farmem-overhead.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAR_ENV=(LD_PRELOAD="$LIB" FARMEM_TRANSPORT=loopback FARMEM_LOCAL_MEM=2G
         FARMEM_LOOPBACK_CAPACITY=2G FARMEM_STATS=1 "${EXTRA_ENV[@]}")

cmd_for() {
  case $1 in
    mt)
      [[ -x $MT ]] || { echo "preload_overhead: $MT missing: build farmem_mt_workload" >&2; exit 2; }
      echo "$MT" ;;
    python) echo "/usr/bin/python3 $WL/structures.py" ;;
    sort)
      [[ -f $WORK/lines.txt ]] || awk -v n=600000 -f "$WL/gen_lines.awk" > "$WORK/lines.txt"
      echo "/usr/bin/sort --parallel=2 -S 100M $WORK/lines.txt" ;;
    *) echo "preload_overhead: unknown workload $1 (mt, python, sort)" >&2; exit 2 ;;
  esac
}

# run MODE CMD...: "wall cpu" seconds on stdout (cpu: user + system of the
# program and all its threads, from wait4, which other tenants of a loaded
# machine disturb much less than wall time); MODE far adds the preload env.
run() {
  local mode=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  if [[ $mode == far ]]; then
    /usr/bin/time -o "$WORK/cpu" -f '%U %S %M' env "${FAR_ENV[@]}" "$@" \
      > "$WORK/out.$mode" 2> "$WORK/err.$mode"
  else
    /usr/bin/time -o "$WORK/cpu" -f '%U %S %M' "$@" > "$WORK/out.$mode" 2> "$WORK/err.$mode"
  fi
  t1=$(date +%s%N)
  if ! cmp -s "$WORK/out.$mode" "$WORK/out.ref"; then
    echo "preload_overhead: output of '$*' ($mode) differs from the reference" >&2
    cat "$WORK/err.$mode" >&2
    exit 1
  fi
  awk -v a="$t0" -v b="$t1" '{ printf "%.4f %.2f %.1f\n", (b - a) / 1e9, $1 + $2, $3 / 1024 }' \
    "$WORK/cpu"
}

# median [COLUMN] of whitespace-separated lines on stdin.
median() {
  awk -v c="${1:-1}" '{ print $c }' | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b / a }'; }

printf '%-7s %4s %9s %9s %6s %9s %9s %6s %8s %8s %6s %8s %8s   %s\n' workload reps "med w/o" \
  "med with" ratio "min w/o" "min with" ratio "cpu w/o" "cpu with" ratio "rss w/o" "rss with" \
  "far heap (last run)"
for w in "${WORKLOADS[@]}"; do
  read -r -a CMD <<< "$(cmd_for "$w")"
  "${CMD[@]}" > "$WORK/out.ref"  # reference output, and a warm-up of caches
  : > "$WORK/t.local"; : > "$WORK/t.far"
  for ((i = 0; i < REPS; ++i)); do
    if ((i % 2 == 0)); then
      run local "${CMD[@]}" >> "$WORK/t.local"; run far "${CMD[@]}" >> "$WORK/t.far"
    else
      run far "${CMD[@]}" >> "$WORK/t.far"; run local "${CMD[@]}" >> "$WORK/t.local"
    fi
  done
  a=$(median 1 < "$WORK/t.local")
  b=$(median 1 < "$WORK/t.far")
  am=$(awk '{ print $1 }' "$WORK/t.local" | sort -g | head -1)
  bm=$(awk '{ print $1 }' "$WORK/t.far" | sort -g | head -1)
  ac=$(median 2 < "$WORK/t.local")
  bc=$(median 2 < "$WORK/t.far")
  ar=$(median 3 < "$WORK/t.local")
  br=$(median 3 < "$WORK/t.far")
  far=$(sed -n 's/^farmem: stats: far heap: \([0-9]*\) allocations.*/\1 far mallocs/p' "$WORK/err.far" | head -1)
  faults=$(sed -n 's/.*faults: \([0-9]*\) zero-fill.*/\1 zero-fill faults/p' "$WORK/err.far" | head -1)
  evict=$(sed -n 's/.*evictions: \([0-9]*\) clean, \([0-9]*\) dirty.*/\1+\2 evictions/p' "$WORK/err.far" | head -1)
  filled=$(sed -n 's/.*zero fill at allocation: \([0-9]*\) blocks.*/\1 filled at allocation/p' \
    "$WORK/err.far" | tail -1)
  printf '%-7s %4d %8.3fs %8.3fs %6s %8.3fs %8.3fs %6s %7.2fs %7.2fs %6s %7.1fM %7.1fM   %s\n' \
    "$w" "$REPS" "$a" "$b" "$(ratio "$a" "$b")" "$am" "$bm" "$(ratio "$am" "$bm")" "$ac" "$bc" \
    "$(ratio "$ac" "$bc")" "$ar" "$br" \
    "${far:-no far heap}${faults:+, $faults}${filled:+, $filled}${evict:+, $evict}"
  echo "  w/o  (wall cpu rss): $(sort -g "$WORK/t.local" | tr '\n' ' ')" >&2
  echo "  with (wall cpu rss): $(sort -g "$WORK/t.far" | tr '\n' ' ')" >&2
done
