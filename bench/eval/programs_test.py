#!/usr/bin/env python3
"""Test of bench/eval/programs.py's fitting of a swap cell's limit to its
target peak RSS (ctest eval_programs_fit): Programs.fit_swap_limit() with
the cell runs replaced by a model of the kernel, whose peak RSS is what a
limit leaves after a fixed page-cache charge, so what the fit does is known
in advance. No root, no cgroup, no program run.

    python3 bench/eval/programs_test.py
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import programs as pr  # noqa: E402

MiB = 1 << 20
failures = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        failures.append(what)


class Model(pr.Programs):
    """A Programs whose cells come from a model: limit L = target + k -
    lowered; the program's peak RSS is min(want, L - cache), where `cache`
    is the page cache the run charges beside the heap (0 when the kernel
    reclaimed it: at most `cache_kept` stays). A limit below `oom_below`
    ends the run OOM-killed."""

    def __init__(self, target, k, want, cache_kept, oom_below=0):
        self.target, self.k, self.want = target, k, want
        self.cache_kept, self.oom_below = cache_kept, oom_below
        self.limits = []

    def log(self, msg):
        print("  log: " + msg)

    def safe_run_cell(self, prog, system, ratio, raise_pct=0, lower_bytes=0):
        limit = self.target + self.k - lower_bytes
        self.limits.append(limit)
        c = {"workload": prog, "system": system, "ratio": ratio, "status": "ok",
             "notes": [], "target_rss_bytes": self.target, "limit_bytes": limit}
        if lower_bytes:
            c["limit_lowered_bytes"] = lower_bytes
        if limit < self.oom_below:
            c["status"] = "oom"
            return c
        c["peak_rss_bytes"] = min(self.want, limit - self.cache_kept)
        c["off"] = round((c["peak_rss_bytes"] - self.target) / self.target, 4)
        return c


def first(m):
    return m.safe_run_cell("sort", "swap", 70)


# The plain run charged 80 MiB of page cache beyond its RSS (k), which
# the kernel gives back to the heap under the limit: 180 MiB of heap
# against a 100 MiB target. One lowering by the 80 MiB overshoot fits.
m = Model(target=100 * MiB, k=80 * MiB, want=260 * MiB, cache_kept=0)
c = m.fit_swap_limit(first(m), "sort", "swap", 70)
check(abs(c["off"]) <= pr.OFF_LIMIT, "an overshooting cell is fitted (off %+.3f)" % c["off"])
check(m.limits == [180 * MiB, 100 * MiB], "one re-run, limit lowered by the overshoot: %s"
      % [x // MiB for x in m.limits])
check(c.get("limit_lowered_bytes") == 80 * MiB, "the cell says how far its limit was lowered")
check(any("lowered" in n for n in c["notes"]), "and notes it")

# The kernel gives only part of a lowering to the heap: each re-run
# comes closer, never more than FIT_RUNS of them, the closest counts.
class Sticky(Model):
    """The kernel keeps less cache charged as the limit tightens: half the
    lowering comes out of the cache, half out of the heap."""

    def safe_run_cell(self, prog, system, ratio, raise_pct=0, lower_bytes=0):
        c = Model.safe_run_cell(self, prog, system, ratio, raise_pct, lower_bytes)
        if c["status"] == "ok":
            c["peak_rss_bytes"] = min(self.want, self.target + self.k - lower_bytes // 2)
            c["off"] = round((c["peak_rss_bytes"] - self.target) / self.target, 4)
        return c


m = Sticky(target=100 * MiB, k=80 * MiB, want=260 * MiB, cache_kept=0)
c = m.fit_swap_limit(first(m), "sort", "swap", 70)
check(len(m.limits) == 1 + pr.FIT_RUNS, "at most %d re-runs (%d runs)" % (pr.FIT_RUNS,
                                                                           len(m.limits)))
check(c["off"] < 0.8 and c["peak_rss_bytes"] < 180 * MiB,
      "the closest run counts (%d MiB)" % (c["peak_rss_bytes"] // MiB))

# A cell on target is not run again.
m = Model(target=100 * MiB, k=2 * MiB, want=260 * MiB, cache_kept=0)
c = m.fit_swap_limit(first(m), "sort", "swap", 70)
check(len(m.limits) == 1 and "limit_lowered_bytes" not in c, "a cell on target runs once")

# OOM-killed at the lowered limit: the earlier run stays, with a note.
m = Model(target=100 * MiB, k=80 * MiB, want=260 * MiB, cache_kept=0, oom_below=150 * MiB)
c = m.fit_swap_limit(first(m), "sort", "swap", 70)
check(c["status"] == "ok" and c["limit_bytes"] == 180 * MiB,
      "an OOM at the lower limit keeps the earlier run")
check(any("ended oom" in n for n in c["notes"]), "and says so")

# Farmem cells and cells run at a raised limit (after OOM kills) are
# never refitted.
m = Model(target=100 * MiB, k=80 * MiB, want=260 * MiB, cache_kept=0)
c = m.fit_swap_limit(dict(first(m), system="fm-local"), "sort", "fm-local", 70)
check(len(m.limits) == 1, "a farmem cell is left alone")
m = Model(target=100 * MiB, k=80 * MiB, want=260 * MiB, cache_kept=0)
c = m.fit_swap_limit(dict(first(m), limit_raised_pct=3), "sort", "swap", 70)
check(len(m.limits) == 1, "a cell run at a raised limit is left alone")

if failures:
    print("FAILED: %d checks" % len(failures))
    sys.exit(1)
print("all checks passed")
