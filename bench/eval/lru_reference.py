#!/usr/bin/env python3
"""Exact-LRU reference for the pager's replacement (issue 16): how many 4 KiB
pages an LRU memory of a given capacity would have to bring in for a real,
unmodified program, from the program's own accesses.

    bench/eval/lru_reference.py --capacity 72M,80M,96M [--stdin FILE] -- xz -7 -T1 -c
    bench/eval/lru_reference.py --capacity 258M --stdin lines -- sort -S 1G   (LC_ALL from the env)

The program runs under valgrind's cachegrind with its last-level cache
simulated as a memory of 4 KiB lines: C bytes of capacity = S sets x A ways
x 4096, S a power of two and A from --min-ways (default 32) to 4x that,
LRU within a set, the S and A that come closest to C from below (the
capacity modelled is printed; 72M, 95M and 260M are exact). So the model is
LRU over S groups of pages (a page's group is fixed by its address), a
little worse than one fully associative LRU; --min-ways 128 comes closer
and runs slower. It sees
every access the program makes (data and code, the stack and libraries
too, after the first-level caches filter re-uses of the same line: those
are hits at any capacity), all threads interleaved as valgrind serialises
them. One run per capacity, ~10-15x the plain run's time; nothing about
timing is measured.

For each capacity it prints the misses (reads and writes) and the
non-compulsory ones: misses minus the program's footprint in pages (the
misses at a capacity larger than everything it touches, one more run
unless --no-footprint; measured at 1 GiB, the most cachegrind models, so a
program touching more than that has no footprint figure). A first touch is a zero-fill fault for farmem, not
a READ, so compare the non-compulsory misses with farmem's READs (FARMEM_STATS
"traffic ... read" / 4 KiB) and remote faults at the same capacity: farmem's
FARMEM_LOCAL_MEM covers its far heap only, so the LRU capacity that matches
a budget B is B plus what the program keeps outside the heap (its stack,
globals, libraries; plain peak RSS minus its heap).

Output: one line per capacity, and with --json FILE the same as JSON.
Exit status 2 when valgrind is missing or its output cannot be read.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

PAGE = 4096
MAX_CAPACITY = 1 << 30  # cachegrind's cache sizes are 32-bit ints


def parse_size(text):
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not m:
        raise ValueError("size '%s': use bytes or a K/M/G suffix, e.g. 72M" % text)
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    return int(m.group(1)) * mult


def geometry(capacity, min_ways):
    """(sets, ways) of the largest LRU memory of 4 KiB lines at most `capacity`
    bytes with a power-of-two number of sets and min_ways to 4 x min_ways
    ways (more ways on a tie: closer to a fully associative LRU); one set of
    all the pages when they are fewer than min_ways."""
    pages = capacity // PAGE
    if pages < 1:
        raise ValueError("capacity %d: less than one page" % capacity)
    best = (1, pages)
    sets = 1
    while pages // sets >= min_ways:
        ways = pages // sets
        if ways <= 4 * min_ways and (best[1] > 4 * min_ways or sets * ways > best[0] * best[1]):
            best = (sets, ways)
        sets *= 2
    return best


LL_RE = re.compile(r"LL misses:\s+([\d,]+)\s+\(\s*([\d,]+) rd\s+\+\s+([\d,]+) wr\)")


def parse_misses(text):
    """(total, reads, writes) from cachegrind's summary, or None."""
    m = LL_RE.search(text)
    if not m:
        return None
    return tuple(int(g.replace(",", "")) for g in m.groups())


def simulate(cmd, capacity, min_ways, stdin_path):
    sets, ways = geometry(capacity, min_ways)
    argv = ["valgrind", "--tool=cachegrind", "--cache-sim=yes",
            "--cachegrind-out-file=/dev/null",
            "--LL=%d,%d,%d" % (sets * ways * PAGE, ways, PAGE)] + cmd
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    try:
        r = subprocess.run(argv, stdin=stdin, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, errors="replace")
    finally:
        if stdin_path:
            stdin.close()
    got = parse_misses(r.stderr)
    if got is None:
        tail = "\n".join(r.stderr.strip().splitlines()[-5:])
        raise RuntimeError("cachegrind printed no 'LL misses' line (exit status %d); "
                           "its last lines:\n%s" % (r.returncode, tail))
    return {"capacity_asked": capacity, "capacity": sets * ways * PAGE, "sets": sets,
            "ways": ways, "misses": got[0], "read_misses": got[1], "write_misses": got[2],
            "exit_status": r.returncode}


def main(argv):
    ap = argparse.ArgumentParser(
        description="Exact-LRU page misses of a program at given capacities (cachegrind).",
        usage="%(prog)s --capacity SIZE[,SIZE...] [options] -- command [args...]")
    ap.add_argument("--capacity", required=True,
                    help="comma-separated capacities, e.g. 72M,80M (4 KiB pages)")
    ap.add_argument("--stdin", help="file fed to the program's standard input")
    ap.add_argument("--min-ways", type=int, default=32,
                    help="ways per set at least (default 32; more is closer to full LRU)")
    ap.add_argument("--no-footprint", action="store_true",
                    help="skip the run that measures the footprint (compulsory misses)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command: put it after --")
    if a.min_ways < 1:
        ap.error("--min-ways must be at least 1")
    try:
        caps = [parse_size(c) for c in a.capacity.split(",") if c]
    except ValueError as e:
        ap.error(str(e))
    for c in caps:
        if c > MAX_CAPACITY or c < PAGE:
            ap.error("capacity %d: between 4 KiB and 1 GiB (cachegrind's sizes are 32-bit)" % c)
    if not shutil.which("valgrind"):
        print("lru_reference: valgrind is not installed (Debian package valgrind; "
              "tools/install-deps.sh installs it)", file=sys.stderr)
        return 2
    if a.stdin and not os.path.isfile(a.stdin):
        ap.error("--stdin %s: no such file" % a.stdin)
    results = []
    try:
        footprint = None
        if not a.no_footprint:
            # The largest memory cachegrind models (its sizes are 32-bit):
            # for a program that touches less, the misses are its distinct
            # pages.
            fp = simulate(cmd, MAX_CAPACITY, a.min_ways, a.stdin)
            footprint = fp["misses"]
            print("footprint: %d pages (%.1f MiB)" % (footprint, footprint * PAGE / 2**20))
        for c in caps:
            r = simulate(cmd, c, a.min_ways, a.stdin)
            r["footprint_pages"] = footprint
            r["noncompulsory_misses"] = r["misses"] - footprint if footprint is not None else None
            results.append(r)
            line = "capacity %.1f MiB (modelled %.1f MiB: %d sets x %d ways): %d misses " \
                   "(%d reads, %d writes)" % (c / 2**20, r["capacity"] / 2**20, r["sets"], r["ways"],
                                              r["misses"], r["read_misses"], r["write_misses"])
            if footprint is not None:
                line += ", %d beyond the footprint" % r["noncompulsory_misses"]
            print(line, flush=True)
    except (RuntimeError, OSError) as e:
        print("lru_reference: %s" % e, file=sys.stderr)
        return 2
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": cmd, "stdin": a.stdin, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
