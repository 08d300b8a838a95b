#!/usr/bin/env bash
# No donor reachable at start-up: FARMEM_ON_NO_DONOR=fail stops the program
# with a message naming the donor and the variable; =local runs it all-local
# with a warning and unchanged output. Also: a bad FARMEM_* value is refused
# at start-up, and a program that never makes a large allocation never
# contacts a donor. Env: FARMEM_PRELOAD_LIB.
set -uo pipefail
exec </dev/null
: "${FARMEM_PRELOAD_LIB:?}"
PROG=(/usr/bin/python3 -c 'print(sum(len(bytes(200000)) for _ in range(20)))')
want=$("${PROG[@]}")
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$(LD_PRELOAD=$FARMEM_PRELOAD_LIB FARMEM_SERVERS=127.0.0.1:1 FARMEM_CONNECT_TIMEOUT_MS=500 \
  "${PROG[@]}" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "ON_NO_DONOR=fail: exit status $rc, expected 1 ($out)"
grep -q '127.0.0.1:1' <<<"$out" || fail "message does not name the donor: $out"
grep -q 'FARMEM_ON_NO_DONOR=local' <<<"$out" || fail "message does not name the way out: $out"

out=$(LD_PRELOAD=$FARMEM_PRELOAD_LIB FARMEM_SERVERS=127.0.0.1:1 FARMEM_CONNECT_TIMEOUT_MS=500 \
  FARMEM_ON_NO_DONOR=local "${PROG[@]}" 2>err.txt); rc=$?
[[ $rc -eq 0 && $out == "$want" ]] || fail "ON_NO_DONOR=local: status $rc, output '$out', want '$want'"
grep -q 'running all-local' err.txt || fail "no warning: $(cat err.txt)"
rm -f err.txt

out=$(LD_PRELOAD=$FARMEM_PRELOAD_LIB FARMEM_MIN_FAR=lots "${PROG[@]}" 2>&1); rc=$?
[[ $rc -eq 1 ]] && grep -q 'FARMEM_MIN_FAR' <<<"$out" || fail "bad FARMEM_MIN_FAR accepted: $rc $out"

# Small allocations only: no donor is ever needed (policy fail, no server).
out=$(LD_PRELOAD=$FARMEM_PRELOAD_LIB /bin/echo hello 2>&1); rc=$?
[[ $rc -eq 0 && $out == hello ]] || fail "a small program paid for far memory: $rc $out"
echo "PASS: 4 policy checks"
