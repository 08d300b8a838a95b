#!/usr/bin/env bash
# Installs every Debian package farmem needs to build, test, fuzz and demo.
#
#   tools/install-deps.sh            # as root, or as a user with sudo
#   tools/install-deps.sh --check    # only report what is missing (exit 1 if any)
#
# Idempotent and quiet when everything is present: it asks dpkg first and
# touches apt only for what is missing. `apt-get update` runs at most once,
# and only when the package lists are absent or apt does not know a package.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

# ---- The package list: one package per line, each with its reason ----------
PACKAGES=(
  cmake            # the build system (CMakeLists.txt needs >= 3.25)
  ninja-build      # the generator every script uses
  pkg-config       # cmake/FarmemDeps.cmake finds verbs, jemalloc, urcu with it
  g++              # the default compiler (C++20)
  clang            # the fuzz build (libFuzzer) and a second compiler for warnings
  clang-format     # tools/format-check.sh
  @CLANG_RT@       # libFuzzer and sanitizer runtimes matching Debian's clang (resolved below)
  libibverbs-dev   # verbs transport: ibv_* headers and library
  librdmacm-dev    # verbs transport: rdma_cm connection set-up
  rdma-core        # verbs transport: rdma tools and udev rules (Soft-RoCE set-up)
  ibverbs-providers  # verbs transport: the user-space drivers, rxe among them
  libjemalloc-dev  # the far-memory allocator's arenas
  liburcu-dev      # RCU for read-mostly tables (placement, donors)
  libgtest-dev     # googletest: the unit tests
  libgmock-dev     # googletest: gmock matchers used by the tests
  libbenchmark-dev # Google Benchmark: bench/
  iproute2         # `ss`: tools/demo.sh finds the port farmemd bound and waits for it
  python3          # tests/allocator: an unmodified Debian python3 runs under the preload library
  sqlite3          # tests/allocator: an unmodified sqlite3 runs under the preload library
  time             # /usr/bin/time: tools/demo.sh reports run time and peak RSS
  memcached        # bench/eval: an unmodified memcached runs under the preload library (eval_quick)
  gnuplot-nox      # bench/eval: renders the evaluation plots (PNG, pngcairo) without X
  xz-utils         # bench/eval --set programs: xz -7 is the large-window compressor run unmodified
  coreutils        # bench/eval --set programs: GNU sort -S runs unmodified (Essential; listed for the record)
  zstd             # bench/eval --set programs: zstd -19 --long=27 (128 MiB window) runs unmodified
  valgrind         # bench/eval/lru_reference.py: cachegrind models an exact-LRU memory of 4 KiB pages
  # ---- Later issues: Soft-RoCE guest packages (qemu, kernel image, ...) go here.
  # FARMEM-DEPS-SOFTROCE
)

log() { printf 'install-deps: %s\n' "$*" >&2; }

check_only=false
case "${1:-}" in
  --check) check_only=true ;;
  "") ;;
  -h | --help)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 0
    ;;
  *)
    log "unknown argument '$1'; use --check or nothing"
    exit 2
    ;;
esac

# Runs a command as root: directly when we are root (CI), with sudo when it
# is available, otherwise explains what to run and fails.
as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo DEBIAN_FRONTEND=noninteractive "$@"
  else
    log "need root to run: $*"
    log "run this script as root, or install sudo, or run the command above as root yourself"
    exit 1
  fi
}

installed() {  # true when the package is fully installed
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true) == installed ]]
}

known() {  # true when apt has a candidate version for the package
  local cand
  cand=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
  [[ -n $cand && $cand != "(none)" ]]
}

lists_present() {
  compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null
}

updated=false
apt_update() {
  if ! $updated; then
    log "refreshing the package lists (apt-get update)"
    as_root apt-get update -qq
    updated=true
  fi
}

# The libFuzzer/sanitizer runtime must match the clang that `clang` runs.
# Debian 12 has the meta package libclang-rt-dev (-> libclang-rt-14-dev);
# without it, derive the version from clang itself or from the clang meta
# package, and fall back to libclang-common-N-dev (where Debian 11 put them).
resolve_clang_rt() {
  if installed libclang-rt-dev || known libclang-rt-dev; then
    echo libclang-rt-dev
    return
  fi
  local major=""
  if command -v clang >/dev/null 2>&1; then
    major=$(clang -dumpversion 2>/dev/null | cut -d. -f1)
  fi
  if [[ -z $major ]]; then
    major=$(apt-cache depends clang 2>/dev/null | sed -n 's/.*Depends: clang-\([0-9][0-9]*\)$/\1/p' |
      head -n1)
  fi
  if [[ -n $major ]] && known "libclang-rt-$major-dev"; then
    echo "libclang-rt-$major-dev"
  elif [[ -n $major ]]; then
    echo "libclang-common-$major-dev"
  else
    echo libclang-rt-dev  # let apt report it as unknown
  fi
}

# Missing packages, with the clang runtime resolved. The fast path (all
# present) runs only dpkg-query.
missing_packages() {
  local p rt=""
  for p in "${PACKAGES[@]}"; do
    if [[ $p == @CLANG_RT@ ]]; then
      installed libclang-rt-dev && continue
      rt=${rt:-$(resolve_clang_rt)}
      p=$rt
    fi
    installed "$p" || echo "$p"
  done
}

mapfile -t missing < <(missing_packages)
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if $check_only; then
  log "missing: ${missing[*]}"
  exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
  log "this is not a Debian-like system (no apt-get); install the equivalents of: ${missing[*]}"
  exit 1
fi
if [[ $(id -u) -ne 0 ]] && ! command -v sudo >/dev/null 2>&1; then
  log "missing packages: ${missing[*]}"
  log "installing them needs root and there is no sudo; as root, run:"
  log "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
  exit 1
fi

lists_present || apt_update
for p in "${missing[@]}"; do
  if ! known "$p"; then
    apt_update
    break
  fi
done
# The clang runtime name may depend on lists that were just fetched.
mapfile -t missing < <(missing_packages)

log "installing: ${missing[*]}"
if ! as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  log "apt-get install failed (see its message above); fix the apt sources or install by hand: ${missing[*]}"
  exit 1
fi

mapfile -t still < <(missing_packages)
if [[ ${#still[@]} -ne 0 ]]; then
  log "still missing after apt-get install: ${still[*]}; check the apt output above"
  exit 1
fi
log "all packages present"
