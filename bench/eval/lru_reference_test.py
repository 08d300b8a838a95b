#!/usr/bin/env python3
"""Test of bench/eval/lru_reference.py (ctest eval_lru_reference): the LRU
model's geometry and its reading of cachegrind, then a real run on
farmem_eval_scan, whose misses are known in advance. STREAM over 8 MiB
(three arrays of 683 pages), two passes: at 4 MiB of LRU memory every kernel
sweeps more pages than fit (2 or 3 arrays, 1366+ pages > 1024), so every
page of every sweep misses: 2 passes x 10 array sweeps x 683 pages; at 32
MiB nothing misses twice. The footprint is the arrays plus the program's
stack, libraries and code.

    python3 bench/eval/lru_reference_test.py BUILD_DIR/bench/eval/farmem_eval_scan
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lru_reference as lr  # noqa: E402

failures = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        failures.append(what)


def main(scan):
    # Geometry: a power of two of sets, 32 to 128 ways, never more than
    # asked for and within 1/128 of it; whole MiB up to 128 MiB exactly.
    for cap in (4 << 20, 72 << 20, 75 << 20, 181 << 20, 258 << 20, 1 << 30, 12345678):
        sets, ways = lr.geometry(cap, 32)
        modelled = sets * ways * lr.PAGE
        check(sets & (sets - 1) == 0 and 32 <= ways <= 128 and modelled <= cap and
              modelled > cap * (1 - 1 / 128), "geometry %d B -> %d x %d" % (cap, sets, ways))
    check(all(lr.geometry(m << 20, 32)[0] * lr.geometry(m << 20, 32)[1] == m << 8
              for m in range(1, 129)), "1..128 MiB modelled exactly")
    check(lr.geometry(64 * 4096, 128) == (1, 64), "fewer pages than ways: one set")
    check(lr.parse_misses("==1== LL misses:   1,427,472  (  1,403,871 rd   +   23,601 wr)") ==
          (1427472, 1403871, 23601), "cachegrind's LL line read")
    check(lr.parse_misses("no summary") is None, "no LL line: None")
    check(lr.parse_size("72M") == 72 << 20 and lr.parse_size("4096") == 4096, "sizes")

    # Bad input: a clear error, exit status 2, no run.
    r = subprocess.run([sys.executable, os.path.join(HERE, "lru_reference.py"), "--capacity",
                        "2G", "--", "true"], capture_output=True, text=True)
    check(r.returncode == 2 and "1 GiB" in r.stderr, "capacity over 1 GiB refused: " +
          r.stderr.strip().splitlines()[-1])
    r = subprocess.run([sys.executable, os.path.join(HERE, "lru_reference.py"), "--capacity",
                        "12X", "--", "true"], capture_output=True, text=True)
    check(r.returncode == 2 and "12X" in r.stderr, "bad size refused")

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "lru.json")
        r = subprocess.run([sys.executable, os.path.join(HERE, "lru_reference.py"), "--capacity",
                            "4M,32M", "--json", out, "--", scan, "--mib", "8", "--passes", "2"],
                           capture_output=True, text=True)
        print(r.stdout + r.stderr)
        check(r.returncode == 0, "the tool ran (exit status %d)" % r.returncode)
        if r.returncode != 0:
            return
        res = json.load(open(out))["results"]
    arrays = 3 * ((8 << 20) // 3 // 8 * 8 // lr.PAGE)  # pages of the three arrays
    fp = res[0]["footprint_pages"]
    check(arrays <= fp <= arrays + 2000, "footprint %d pages: the arrays (%d) and a little more"
          % (fp, arrays))
    sweeps = 2 * 10 * arrays // 3
    check(res[0]["noncompulsory_misses"] >= 0.95 * sweeps,
          "4 MiB: %d misses beyond the footprint, every sweep misses (>= %d)"
          % (res[0]["noncompulsory_misses"], int(0.95 * sweeps)))
    check(res[1]["noncompulsory_misses"] <= 50,
          "32 MiB: %d misses beyond the footprint (everything fits)" % res[1]["noncompulsory_misses"])
    check(res[0]["capacity"] == 4 << 20 and res[1]["capacity"] == 32 << 20, "capacities modelled")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: lru_reference_test.py PATH/farmem_eval_scan")
    main(sys.argv[1])
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)
