#!/usr/bin/env bash
# Anonymous mmap in far memory (issue 17 part 2; preload/shim.cc, "Anonymous
# mmap"): preload_mmap_test checks each semantic once with the kernel's own
# mmap (no library: the test itself is right) and once under the preload
# library against a real farmemd at an 8 MiB budget, where its qualifying
# mappings must be far (userfaultfd-registered) and the rest the kernel's.
#
#   preload_mmap.sh path/to/preload_mmap_test
#
# Environment (set by ctest): FARMEMD, FARMEM_PRELOAD_LIB.
set -euo pipefail
exec </dev/null
source "$(dirname "${BASH_SOURCE[0]}")/preload_lib.sh"
TEST=$(realpath "$1")
preload_check_env
preload_workdir farmem-mmap
preload_start_farmemd farmemd.log 1G 16M

echo "== $TEST without the library"
"$TEST"
echo "== $TEST under the preload library (budget 8M, donor 127.0.0.1:$PORT)"
if ! env LD_PRELOAD="$FARMEM_PRELOAD_LIB" FARMEM_SERVERS=127.0.0.1:$PORT \
    FARMEM_TOKEN_FILE="$WORK/token" FARMEM_LOCAL_MEM=8M FARMEM_STATS=1 MMAP_TEST_FAR=1 \
    "$TEST" 2> err.far; then
  cat err.far >&2
  echo "FAIL: preload_mmap_test under the preload library" >&2
  exit 1
fi
grep '^farmem: stats' err.far || true
if ! grep -q 'anonymous mmap: [1-9][0-9]* mappings far' err.far; then
  echo "FAIL: no mapping went to far memory" >&2
  exit 1
fi
# Every protected range was made read-write or unmapped again: nothing is
# left pinned; the 32 MiB mprotect over the pin limit was refused.
if ! grep -q 'mprotect: [1-9][0-9]* calls, 0 B protected (held resident), 1 refused' err.far; then
  echo "FAIL: protected far memory left pinned, or the refusal not counted" >&2
  exit 1
fi
echo "PASS"
