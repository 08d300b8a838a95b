#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: README command 2
# and the whole of CI (.ci/run).
#
#   tools/test.sh            # every stage below
#   tools/test.sh --quick    # skips the Release build, the ASan+UBSan build and the fuzz run
#   tools/test.sh --only fuzz,format   # just these stages (no dependencies run)
#
# Stages, in order; a failed stage skips the stages that need it and the
# others still run, so that one run reports everything. The exit status is
# non-zero when any stage failed.
#
#   deps      tools/install-deps.sh
#   build     cmake (Ninja, RelWithDebInfo, FARMEM_ENABLE_WERROR=ON) in build/, ninja
#   test      ctest --output-on-failure -j2 in build/
#             (includes eval_quick, label eval: bench/eval/run.sh --quick, which
#             fails on any failed cell or checksum mismatch; timings are not judged)
#   release   cmake (Ninja, Release, FARMEM_ENABLE_WERROR=ON, tests and benchmarks on) in
#             <prefix>-release/, ninja: compile only; every documented build type must
#             build (-O3 warns where RelWithDebInfo's -O2 does not)
#   asan      the same with FARMEM_ENABLE_ASAN+UBSAN in build-asan/, and its ctest
#             (without the Soft-RoCE guest tests, which the test stage ran)
#   format    tools/format-check.sh
#   fuzz      clang + libFuzzer build in build-fuzz/, each fuzzer for
#             FARMEM_FUZZ_SECONDS (default 60) from a generated seed corpus
#
# Environment: FARMEM_BUILD_PREFIX (default "build") names the build
# directories <prefix>, <prefix>-release, <prefix>-asan, <prefix>-fuzz; FARMEM_FUZZ_SECONDS;
# FARMEM_CTEST_JOBS (default 2).
set -uo pipefail
exec </dev/null  # CI has no stdin; nothing here may wait for it

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

quick=false
ONLY=""  # comma-separated stage names, empty = all
only_given=false
while [[ $# -gt 0 ]]; do
  arg=$1
  shift
  case "$arg" in
    --quick) quick=true ;;
    --only=*)
      ONLY=${arg#--only=}
      only_given=true
      ;;
    --only)
      ONLY=${1:-}
      only_given=true
      shift || true
      ;;
    -h | --help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
      exit 0
      ;;
    *)
      echo "test.sh: unknown argument '$arg'; use --quick, --only STAGES or --help" >&2
      exit 2
      ;;
  esac
done

if [[ $only_given == true && -z ${ONLY//,/} ]]; then
  echo "test.sh: --only needs a list of stages, e.g. --only fuzz,format" >&2
  exit 2
fi
for stage in ${ONLY//,/ }; do
  case "$stage" in
    deps | build | test | release | asan | format | fuzz) ;;
    *)
      echo "test.sh: --only: unknown stage '$stage'; stages are deps,build,test,release,asan,format,fuzz" >&2
      exit 2
      ;;
  esac
done

PREFIX=${FARMEM_BUILD_PREFIX:-build}
BUILD=$ROOT/$PREFIX
BUILD_RELEASE=$ROOT/$PREFIX-release
BUILD_ASAN=$ROOT/$PREFIX-asan
BUILD_FUZZ=$ROOT/$PREFIX-fuzz
FUZZ_SECONDS=${FARMEM_FUZZ_SECONDS:-60}
CTEST_JOBS=${FARMEM_CTEST_JOBS:-2}

# ---- Stage bookkeeping --------------------------------------------------------
declare -A RESULT    # stage -> PASS | FAIL | SKIP (reason)
declare -A SECONDS_OF
ORDER=()
failed=false

banner() { printf '\n==== %s ====\n' "$*"; }

# run_stage NAME FUNCTION [NEEDS...]: runs FUNCTION unless a stage it needs
# did not pass (a stage left out by --only counts as passed).
run_stage() {
  local name=$1 fn=$2
  shift 2
  if [[ -n $ONLY && ",$ONLY," != *",$name,"* ]]; then
    skip_stage "$name" "not selected"
    return
  fi
  ORDER+=("$name")
  local need
  for need in "$@"; do
    if [[ ${RESULT[$need]:-} != PASS && ${RESULT[$need]:-} != "SKIP (not selected)" ]]; then
      RESULT[$name]="SKIP (needs $need)"
      SECONDS_OF[$name]=0
      return
    fi
  done
  banner "stage $name"
  local t0=$SECONDS
  if "$fn"; then
    RESULT[$name]=PASS
  else
    RESULT[$name]=FAIL
    failed=true
    echo "test.sh: stage '$name' FAILED" >&2
  fi
  SECONDS_OF[$name]=$((SECONDS - t0))
}

skip_stage() {  # skip_stage NAME REASON
  ORDER+=("$1")
  RESULT[$1]="SKIP ($2)"
  SECONDS_OF[$1]=0
}

summary() {
  banner "summary"
  local s
  for s in "${ORDER[@]}"; do
    printf '  %-8s %-28s %4ss\n' "$s" "${RESULT[$s]}" "${SECONDS_OF[$s]}"
  done
  printf '  total    %-28s %4ss\n' "$($failed && echo FAILED || echo PASSED)" "$SECONDS"
}

# ---- Stages -------------------------------------------------------------------
# Scripts run through bash so that they work without their executable bit.
stage_deps() {
  bash tools/install-deps.sh
}

configure() {  # configure DIR [cmake args...]; a later -DCMAKE_BUILD_TYPE wins
  local dir=$1
  shift
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFARMEM_ENABLE_WERROR=ON "$@"
}

stage_build() {
  configure "$BUILD" -DFARMEM_ENABLE_TESTS=ON && ninja -C "$BUILD"
}

# Release (-O3): gcc 12 reports at -O3 what it does not at -O2 (-Wrestrict
# in std::string's operator+, issue 15). Compiled, not run: the test stage
# runs the same tests.
stage_release() {
  configure "$BUILD_RELEASE" -DCMAKE_BUILD_TYPE=Release -DFARMEM_ENABLE_TESTS=ON \
    -DFARMEM_ENABLE_BENCH=ON && ninja -C "$BUILD_RELEASE"
}

stage_test() {
  # The summary lines ("100% tests passed, 0 tests failed out of N") are
  # what CI reads: ctest's output is never filtered. No tests at all (a
  # broken discovery) is a failure, not a pass.
  (cd "$BUILD" && ctest --output-on-failure --no-tests=error -j"$CTEST_JOBS")
}

# Decides whether LeakSanitizer can run here. It stops the process with
# ptrace to scan it; where ptrace is forbidden (some containers, Yama
# ptrace_scope=3) it dies with "LeakSanitizer has encountered a fatal
# error" and fails every test. Probe with a program that leaks on purpose:
# leaks are checked only when that leak is reported.
lsan_works() {
  local dir=$BUILD_ASAN/lsan-probe
  mkdir -p "$dir"
  printf '#include <cstdlib>\nvoid* volatile p;\nint main() { p = std::malloc(7); p = nullptr; }\n' \
    >"$dir/leak.cc"
  "${CXX:-c++}" -fsanitize=address -g "$dir/leak.cc" -o "$dir/leak" >/dev/null 2>&1 || return 1
  local out
  out=$(ASAN_OPTIONS=detect_leaks=1 "$dir/leak" 2>&1)  # exits non-zero by design
  [[ $out == *"detected memory leaks"* ]]
}

setup_sanitizer_env() {
  local leaks=1
  if ! lsan_works; then
    leaks=0
    echo "test.sh: LeakSanitizer cannot run here (ptrace not permitted?); leak checks are OFF" >&2
  fi
  export ASAN_OPTIONS=detect_leaks=$leaks:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  LSAN_ENABLED=$leaks
}

stage_asan() {
  mkdir -p "$BUILD_ASAN" || return 1
  setup_sanitizer_env
  echo "ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS"
  # gtest_discover_tests runs the binaries at build time: same environment.
  configure "$BUILD_ASAN" -DFARMEM_ENABLE_TESTS=ON -DFARMEM_ENABLE_ASAN=ON \
    -DFARMEM_ENABLE_UBSAN=ON -DFARMEM_ENABLE_BENCH=OFF &&
    ninja -C "$BUILD_ASAN" &&
    # The Soft-RoCE guest tests (label softroce) boot a VM for minutes; they
    # run once, in the plain build above, not again here.
    (cd "$BUILD_ASAN" && ctest --output-on-failure --no-tests=error -j"$CTEST_JOBS" -LE softroce)
}

stage_format() {
  bash tools/format-check.sh
}

stage_fuzz() {
  if ! command -v clang++ >/dev/null 2>&1; then
    echo "test.sh: clang++ not found; tools/install-deps.sh installs it" >&2
    return 1
  fi
  [[ -n ${LSAN_ENABLED:-} ]] || setup_sanitizer_env
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD_FUZZ" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFARMEM_ENABLE_WERROR=ON -DFARMEM_ENABLE_FUZZ=ON \
    -DFARMEM_ENABLE_TESTS=OFF -DFARMEM_ENABLE_BENCH=OFF &&
    ninja -C "$BUILD_FUZZ" farmem_fuzz || return 1

  local seeds=$BUILD_FUZZ/seeds
  rm -rf "$seeds"
  "$BUILD_FUZZ/fuzz/farmem_fuzz_make_corpus" "$seeds" || return 1

  local fuzzer name rc status=0 ran=0
  for fuzzer in "$BUILD_FUZZ"/fuzz/farmem_*_fuzz; do
    [[ -x $fuzzer ]] || continue
    name=$(basename "$fuzzer")
    ran=$((ran + 1))
    mkdir -p "$BUILD_FUZZ/corpus/$name" "$BUILD_FUZZ/artifacts"
    echo "fuzz: $name for ${FUZZ_SECONDS}s (log: $BUILD_FUZZ/$name.log)"
    # New inputs go to corpus/<name> (kept between local runs), seeds are
    # read only; a crashing input is saved under artifacts/.
    "$fuzzer" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
      -detect_leaks="$LSAN_ENABLED" -print_final_stats=1 \
      -artifact_prefix="$BUILD_FUZZ/artifacts/$name-" \
      "$BUILD_FUZZ/corpus/$name" "$seeds" >"$BUILD_FUZZ/$name.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then
      grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)' \
        "$BUILD_FUZZ/$name.log" | sed 's/^/  /'
    else
      status=1
      echo "fuzz: $name FAILED (exit $rc); the end of its log:" >&2
      tail -n 60 "$BUILD_FUZZ/$name.log" >&2
      echo "fuzz: reproduce with: $fuzzer <the artifact named above>" >&2
    fi
  done
  if [[ $ran -eq 0 ]]; then
    echo "test.sh: no fuzzers were built in $BUILD_FUZZ/fuzz" >&2
    return 1
  fi
  return $status
}

# ---- Main -----------------------------------------------------------------------
echo "farmem tests in $ROOT ($(uname -sr), $(nproc) cpus${CI:+, CI=$CI})"

run_stage deps stage_deps
run_stage build stage_build deps
run_stage test stage_test build
if $quick; then
  skip_stage release "--quick"
  skip_stage asan "--quick"
else
  run_stage release stage_release deps
  run_stage asan stage_asan deps
fi
run_stage format stage_format deps
if $quick; then
  skip_stage fuzz "--quick"
else
  run_stage fuzz stage_fuzz deps
fi

summary
$failed && exit 1
exit 0
