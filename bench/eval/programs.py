"""The `programs` set of the evaluation harness (issue 16): unmodified
programs from Debian packages, each run plain, under Linux swap (zswap off
and on) and under farmem, at the SAME peak RSS, outputs compared by sha256.

    bench/eval/run.sh --set programs            # the full set (as root)
    bench/eval/run.sh --set programs --quick    # small inputs, 100/50%, plain + fm-tcp (CI)
    bench/eval/run.sh --set programs --programs xz --systems local,fm-tcp,swap --ratios 70

Programs (inputs are generated once per run into the harness's temp dir,
deterministic, never committed; their sha256 is in results.json):
  xz        xz -7 -T1 -c < text          xz-utils: LZMA2, 8 MiB dictionary (bt4 match finder)
  gnu-sort  LC_ALL=C sort -S 1G lines    coreutils: one in-memory buffer, merge sort of pointers
  zstd      zstd -19 --long=27 -T1 -c < text   zstd: 128 MiB long-distance window, btultra2
The text is words drawn from a zipfian vocabulary (compresses ~2.8x); the
lines are three such words and a random 32-bit number. Default: 10 MiB of
text, 3M lines (~80 MB); --quick: 1 MiB and 200k lines.

Same peak RSS. P = the plain run's peak RSS (wait4's ru_maxrss), measured
in an unlimited cgroup-v1 group whose peak charge U is read too. At ratio R:
  target   R * P: the peak RSS every system is meant to run at
  swap     memory.limit_in_bytes = R * P + max(0, U - P): the group's usage
           at R of the plain peak, plus what the kernel charges beyond RSS
           (page tables, kernel objects), which is not the heap's; a cell
           whose peak RSS still overshoots R * P by more than 5% (that
           charge held page cache, which the kernel reclaims first) runs
           again with the limit lowered by the overshoot, twice at most
  farmem   FARMEM_LOCAL_MEM covers only the far heap, so it is derived: a
           calibration run with no limit ("no limit" column: the budget is
           far above the need) measures farmem's peak RSS Pf and its far
           heap's resident peak F (FARMEM_STATS); L = Pf - F is what stays
           local (program, libraries, small allocations, farmem's own
           memory) and FARMEM_LOCAL_MEM = R * P - L.
Every cell reports its measured peak RSS next to the target and how far off
it is (the "off" column); |off| > 5% is flagged in table.md. fm-loopback's
peak RSS includes the in-process donor's memory, so it is not comparable
(reported, flagged). fm-tcp is against a farmemd on 127.0.0.1 with every op
on the wire (--local-clients=off), as with a donor on another host; fm-local
against the same daemon's default for a client on its own host, one-sided.

Per cell: wall, user and system time (wait4), peak RSS, ratio to plain and
to swap at the same R; farmem's counters from its FARMEM_STATS summary on
stderr (faults by kind, waited faults, evictions, traffic, prefetch, and
the main thread's time asleep: page faults served, I/O, locks; a CPU-bound
program's share of a run that farmem cost, steadier than wall times on a
machine whose speed drifts). Its stats socket is read (each second) only in
the last tenth of the cell's time budget (at least 5 s), so that a cell
killed at its timeout still has counters: a query maps ~0.4 MiB of code,
which would otherwise sit in the peak RSS being measured. Also farmemd's CPU
time; swap's major faults, swap-ins and swap-outs. The plain run is the fastest of
--plain-runs (default 2). With --runs N (default 1) every farmem and swap
cell at a ratio runs N times, each run next to a fresh plain run, and its
"x plain" is the median of the N pairs' ratios (the machine's speed drifts
over minutes; a pair runs at one speed). A cell is given max(--timeout-factor
(default 20; --quick 10) x plain wall, 60 s; --quick 20 s); one that exceeds it is
reported "timeout", a result, not a failure (lower ratios of that system
are then not run). A cell FAILS (exit status 1) when the program exits
non-zero or its output's sha256 differs from the plain run's.

Output in --out (default bench/eval/results-programs): results.json,
results.csv, table.md (a summary table, the goals of issue 16 checked, and a
table with every cell's figures).
"""

import bisect
import datetime
import hashlib
import json
import os
import platform
import random
import re
import select
import shutil
import signal
import subprocess
import time

import eval as ev

MiB = ev.MiB
PROGRAMS = ["xz", "gnu-sort", "zstd"]  # the default set (issue 16's goals are checked on it)
# Small-object heaps (issue 17), chosen with --programs: the interpreters'
# objects come from malloc and (python's arenas) anonymous mmap.
HEAP_PROGRAMS = ["python-dict", "perl-hash", "sqlite-mem"]
ALL_PROGRAMS = PROGRAMS + HEAP_PROGRAMS
SYSTEMS = ["local", "fm-tcp", "fm-local", "fm-loopback", "swap", "zswap"]
PACKAGE = {"xz": ("xz", "xz-utils"), "gnu-sort": ("sort", "coreutils"), "zstd": ("zstd", "zstd"),
           "python-dict": ("python3", "python3-minimal"), "perl-hash": ("perl", "perl-base"),
           "sqlite-mem": ("sqlite3", "sqlite3")}
SIZES = {
    "default": {"text_bytes": 10 * MiB, "lines": 3000000, "entries": 400000},
    "quick": {"text_bytes": 1 * MiB, "lines": 200000, "entries": 100000},
}
WORKLOADS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "allocator", "workloads")
DONOR_CAPACITY = 2048 * MiB  # farmemd's --capacity, and the loopback donor's
OFF_LIMIT = 0.05  # |peak RSS - target| / target above this is flagged


def command(name, inputs):
    """(argv, stdin path or None, extra environment)."""
    if name == "xz":
        return ["xz", "-7", "-T1", "-c"], inputs["text"], {}
    if name == "gnu-sort":
        # -S: large enough that sort never spills to temporary files (those
        # would be page cache charged to the swap group, and disk I/O).
        return ["sort", "-S", "1G", inputs["lines"]], None, {"LC_ALL": "C", "TMPDIR": inputs["tmp"]}
    if name == "zstd":
        return ["zstd", "-q", "-19", "--long=27", "-T1", "-c"], inputs["text"], {}
    # The programs of issue 17 (tests/allocator/workloads; entries: 400k by default).
    n = str(inputs.get("entries", 400000))
    if name == "python-dict":
        return ["python3", os.path.join(WORKLOADS, "big_dict.py"), n], None, {}
    if name == "perl-hash":
        return ["perl", os.path.join(WORKLOADS, "big_hash.pl"), n], None, {}
    if name == "sqlite-mem":  # ~130 MiB in-memory database, one size
        return ["sqlite3"], os.path.join(WORKLOADS, "big_db.sql"), {}
    raise ValueError(name)


# ---- inputs ------------------------------------------------------------------
def _vocabulary(seed):
    """A PRNG and a 2^20-entry table of words whose frequencies are zipfian."""
    r = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = list(range(26, 0, -1))
    vocab = ["".join(r.choices(letters, weights=weights, k=2 + int(r.expovariate(0.35)) % 12))
             for _ in range(50000)]
    cum, t = [], 0.0
    for i in range(len(vocab)):
        t += 1.0 / (i + 1)
        cum.append(t)
    m = 1 << 20
    table = [vocab[min(bisect.bisect(cum, (k + 0.5) / m * t), len(vocab) - 1)] for k in range(m)]
    return r, table


def gen_text(path, size, seed=1):
    r, table = _vocabulary(seed)
    sp = [w + " " for w in table]
    nl = [w + "\n" for w in table]
    out, n = [], 0
    while n < size:
        idx = memoryview(r.randbytes(4 << 16)).cast("I")
        chunk = "".join([nl[i & 0xFFFFF] if (i >> 28) == 0 else sp[i & 0xFFFFF]
                         for i in idx]).encode()
        out.append(chunk)
        n += len(chunk)
    with open(path, "wb") as f:
        f.write(b"".join(out)[:size])


def gen_lines(path, count, seed=2):
    r, table = _vocabulary(seed)
    out, left = [], count
    while left:
        k = min(left, 1 << 16)
        x = memoryview(r.randbytes(16 * k)).cast("I")
        out.append("".join(["%s %s %s %d\n" % (table[x[j] & 0xFFFFF], table[x[j + 1] & 0xFFFFF],
                                                table[x[j + 2] & 0xFFFFF], x[j + 3])
                            for j in range(0, 4 * k, 4)]))
        left -= k
    with open(path, "w") as f:
        f.write("".join(out))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


# ---- parsing farmem's output -----------------------------------------------
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _size(s):
    v, _, u = s.strip().partition(" ")
    return int(float(v) * _UNITS.get(u, 1))


def parse_summary(text):
    """The FARMEM_STATS=1 summary (preload/shim.cc print_stats); sizes are
    rounded to 0.1 of their unit there."""
    out = {}
    m = re.search(r"far heap: (\d+) allocations, (\d+) frees, ([\d.]+ \w+) live; (\d+) large "
                  r"allocations served locally", text)
    if m:
        out.update(far_mallocs=int(m.group(1)), far_frees=int(m.group(2)),
                   far_live_bytes=_size(m.group(3)), local_fallbacks=int(m.group(4)))
    m = re.search(r"resident: peak ([\d.]+ \w+) of a ([\d.]+ \w+) budget; "
                  r"remote ([\d.]+ \w+)", text)
    if m:
        out.update(resident_peak_bytes=_size(m.group(1)), budget_bytes=_size(m.group(2)),
                   remote_bytes=_size(m.group(3)))
    m = re.search(r"faults: (\d+) zero-fill, (\d+) remote, (\d+) victim-cache, "
                  r"(\d+) write-protect; fetch p50 (\d+) us, p99 (\d+) us", text)
    if m:
        for k, v in zip(("faults_zero", "faults_remote", "faults_victim", "faults_wp",
                         "fetch_p50_us", "fetch_p99_us"), m.groups()):
            out[k] = int(v)
    m = re.search(r"evictions: (\d+) clean, (\d+) dirty; traffic: ([\d.]+ \w+) read, "
                  r"([\d.]+ \w+) written", text)
    if m:
        out.update(evictions_clean=int(m.group(1)), evictions_dirty=int(m.group(2)),
                   bytes_read=_size(m.group(3)), bytes_written=_size(m.group(4)))
    m = re.search(r"prefetch: (\d+) issued, (\d+) used, (\d+) unused; zero-fill "
                  r"fault-around: (\d+) blocks; faults that waited: (\d+)", text)
    if m:
        for k, v in zip(("prefetch_issued", "prefetch_used", "prefetch_unused", "zero_around",
                         "faults_waited"), m.groups()):
            out[k] = int(v)
    m = re.search(r"zero fill at allocation: (\d+) blocks", text)
    if m:
        out["populated_blocks"] = int(m.group(1))
    m = re.search(r"main thread: ([\d.]+) s on a CPU, ([\d.]+) s waiting for one, "
                  r"([\d.]+) s asleep", text)
    if m:
        out.update(main_cpu_s=float(m.group(1)), main_runq_s=float(m.group(2)),
                   main_asleep_s=float(m.group(3)))
    return out


SOCK_KEYS = ("faults_zero", "faults_remote", "faults_victim", "faults_wp", "faults_waited",
             "evictions_clean", "evictions_dirty", "bytes_read", "bytes_written",
             "prefetch_issued", "prefetch_used", "prefetch_unused", "zero_around",
             "populated_bytes", "resident_peak_bytes", "budget_bytes")


def proc_times(pid):
    """(utime, stime) of a live process in seconds, or None."""
    st = ev.read_file("/proc/%d/stat" % pid)
    if not st:
        return None
    f = st.rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(f[11]) / hz, int(f[12]) / hz


def proc_cpu_s(pid):
    """utime + stime of a process in seconds (farmemd's work for fm-tcp)."""
    t = proc_times(pid)
    return None if t is None else t[0] + t[1]


def kill_group(h, p):
    """Kills a child spawned by Harness.spawn (its own process group: the
    launcher and the program) and reaps it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    h.kill(p)


# ---- the harness -----------------------------------------------------------
class Programs:
    def __init__(self, h, a):
        self.h = h  # eval.Harness: swap, cgroups, farmemd, children, clean-up
        self.a = a
        self.sizes = SIZES["quick" if a.quick else "default"]
        self.inputs = {}
        self.cells = []
        self.plain = {}  # program -> local cell
        self.calib = {}  # (program, system) -> calibration cell
        # Root with cgroup-v1 memory: every cell runs in a group of its own
        # (unlimited but for swap), so that its peak charge is reported.
        self.use_cg = h.check_swap_possible() is None

    def log(self, msg):
        ev.log(msg)

    def make_inputs(self, meta):
        d = os.path.join(self.h.work, "inputs")
        os.makedirs(d)
        t0 = time.time()
        self.inputs = {"text": os.path.join(d, "text"), "lines": os.path.join(d, "lines"),
                       "tmp": os.path.join(self.h.work, "tmp"), "entries": self.sizes["entries"]}
        os.makedirs(self.inputs["tmp"])
        if any(p in self.a.programs for p in ("xz", "zstd")):
            gen_text(self.inputs["text"], self.sizes["text_bytes"])
        if "gnu-sort" in self.a.programs:
            gen_lines(self.inputs["lines"], self.sizes["lines"])
        meta["inputs"] = {}
        for k in ("text", "lines"):
            p = self.inputs[k]
            if os.path.exists(p):
                meta["inputs"][k] = {"bytes": os.path.getsize(p), "sha256": sha256_file(p)}
        self.log("inputs generated in %.1f s: %s" % (time.time() - t0, ", ".join(
            "%s %.1f MiB" % (k, v["bytes"] / MiB) for k, v in meta["inputs"].items())))

    # ---- one run ---------------------------------------------------------
    def spawn_and_wait(self, cell, argv, stdin_path, env, cg, timeout):
        """Runs argv through farmem_eval_runprog (its rusage is the
        program's own) with stdout hashed by us: a pipe, so no page cache is
        charged to the group. Fills wall/user/sys/peak RSS, checksum, stats."""
        fin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
        h = hashlib.sha256()
        nbytes = 0
        fm = cell["system"].startswith("fm-")
        fd = self.h.farmemds.get(cell["system"], (None, 0))[0]
        fd_cpu0 = proc_cpu_s(fd.pid) if fd else None
        t0 = time.time()
        try:
            p, rep = self.h.spawn_launched(argv, env, cg, stdin=fin, stdout=subprocess.PIPE)
        finally:
            if stdin_path:
                fin.close()
        deadline = t0 + timeout
        child = None
        next_poll = t0 + 1.0
        snap = None
        snap_window = max(5.0, 0.1 * timeout)
        out = p.stdout.fileno()
        eof = False
        done = False
        while True:
            now = time.time()
            if now > deadline:
                break
            if not eof:
                r, _, _ = select.select([out], [], [], min(0.25, max(0.0, deadline - now)))
                if r:
                    b = os.read(out, 1 << 20)
                    if b:
                        h.update(b)
                        nbytes += len(b)
                    else:
                        eof = True
            if p.poll() is not None:
                done = True
                break
            if eof:
                time.sleep(0.003)
            if child is None:
                child = self.h.launched_pid(rep)
            # The stats socket is read only in the last part of the cell's
            # time, for a cell killed at its timeout (the exit summary has
            # the counters otherwise): a query maps ~0.4 MiB of farmem's and
            # libc's code, which would sit in the peak RSS being measured.
            if fm and child and time.time() >= max(next_poll, deadline - snap_window):
                next_poll = time.time() + 1.0
                sock = os.path.join(self.h.work, "farmem", "%d.sock" % child)
                if os.path.exists(sock):
                    try:
                        snap = ev.read_stats_socket(sock, timeout=2.0)
                    except OSError:
                        pass
        if done and not eof:  # drain what the pipe still holds
            while True:
                b = os.read(out, 1 << 20)
                if not b:
                    break
                h.update(b)
                nbytes += len(b)
        p.stdout.close()
        if not done:
            if child:  # where its time went, read before it is killed
                t = proc_times(child)
                if t:
                    cell.update(user_s=round(t[0], 2), sys_s=round(t[1], 2))
                hwm = ev.proc_status_kib(child, "VmHWM")
                if hwm:
                    cell["peak_rss_bytes"] = hwm * 1024
            kill_group(self.h, p)
            cell.update(status="timeout", reason="did not finish within %.0f s" % timeout,
                        wall_s=round(timeout, 3))
        else:
            self.h.children.remove(p)
            r = self.h.launched_report(rep)
            if r is None:
                err = ev.read_file(p.errpath).strip().splitlines()
                cell.update(status="fail", reason="launcher exit status %d, no report: %s" % (
                    p.returncode, " | ".join(err[-4:]) or "no stderr"))
            else:
                cell.update(wall_s=round(r["wall_s"], 3), user_s=round(r["user_s"], 3),
                            sys_s=round(r["sys_s"], 3), peak_rss_bytes=r["maxrss_kib"] * 1024,
                            checksum=h.hexdigest(), output_bytes=nbytes)
                if r["status"] != 0:
                    err = ev.read_file(p.errpath).strip().splitlines()
                    what = ("exit status %d" % r["status"] if r["status"] >= 0
                            else "killed by signal %d" % r["signal"])
                    cell.update(status="fail", reason="%s: %s" % (
                        what, " | ".join(err[-4:]) or "no stderr"))
        if fd_cpu0 is not None:
            c1 = proc_cpu_s(fd.pid)
            if c1 is not None:
                cell["farmemd_cpu_s"] = round(c1 - fd_cpu0, 3)
        if fm:
            if snap is not None:
                c = snap["counters"]
                cell["sock"] = {k: c[k] for k in SOCK_KEYS if k in c}
            summ = parse_summary(ev.read_file(p.errpath))
            if summ:
                cell.update(summ)
            elif snap is not None:  # killed: the last snapshot is all there is
                cell.update(cell["sock"])
                cell["notes"].append("farmem counters from the last stats-socket snapshot")
            for k in ("faults_waited", "prefetch_issued", "prefetch_used", "prefetch_unused",
                      "zero_around", "populated_bytes"):
                if k not in cell and "sock" in cell and k in cell["sock"]:
                    cell[k] = cell["sock"][k]

    def run_cell(self, prog, system, ratio, raise_pct=0, lower_bytes=0):
        """ratio None: the plain run (local) or farmem's calibration run.
        raise_pct: swap / zswap only, the limit raised by that share of P
        (the retries after the memcg OOM killer, see run_program).
        lower_bytes: swap / zswap only, the limit lowered by that much (the
        re-runs of a cell whose peak RSS overshot its target, run_program)."""
        h = self.h
        cell = {"workload": prog, "set": "programs", "system": system, "ratio": ratio,
                "status": "ok", "notes": []}
        plain = self.plain.get(prog)
        argv, stdin_path, extra = command(prog, self.inputs)
        cg_limit = None
        budget = 0
        if system == "local":
            timeout = self.a.timeout or 900
        else:
            P = plain["peak_rss_bytes"]
            timeout = self.a.timeout or max(self.a.timeout_factor * plain["wall_s"],
                                            20 if self.a.quick else 60)
            if ratio is not None:
                cell["target_rss_bytes"] = P * ratio // 100
            if system.startswith("fm-"):
                if ratio is None:
                    budget = (4 * P + 64 * MiB) // MiB * MiB
                else:
                    cal = self.calib[(prog, system)]
                    budget = max(4 * MiB, (cell["target_rss_bytes"] - cal["local_part_bytes"])
                                 // 4096 * 4096)
                cell["budget_bytes_set"] = budget
            else:
                k = max(0, plain.get("max_usage_bytes", 0) - P)
                cg_limit = (cell["target_rss_bytes"] + k + P * raise_pct // 100 - lower_bytes
                            + 4095) // 4096 * 4096
                cell["limit_bytes"] = cg_limit
                if raise_pct:
                    cell["limit_raised_pct"] = raise_pct
                if lower_bytes:
                    cell["limit_lowered_bytes"] = lower_bytes
                err = h.set_zswap(system == "zswap")
                if err:
                    cell.update(status="skipped", reason=err)
                    return cell
        cell["timeout_s"] = round(timeout, 1)
        env = h.system_env(system, budget, 0)
        if system == "fm-loopback":
            # As large as farmemd's capacity for fm-tcp: a far region too
            # small for the program's biggest allocation sends it to glibc.
            env["FARMEM_LOOPBACK_CAPACITY"] = str(DONOR_CAPACITY)
        env.update(extra)
        cg = None
        if cg_limit is not None:
            cg = h.new_cgroup(cg_limit)
        elif self.use_cg:
            cg = h.new_cgroup(None)  # unlimited: its peak charge is reported
        vm0 = ev.vmstat() if cg else None
        try:
            self.spawn_and_wait(cell, argv, stdin_path, env, cg, timeout)
        finally:
            if cg:
                vm1 = ev.vmstat()
                st = ev.mem_stat(cg)
                cell["pgmajfault"] = st.get("total_pgmajfault", st.get("pgmajfault", 0))
                for k in ("pswpin", "pswpout", "zswpin", "zswpout"):
                    if k in vm0:
                        cell[k] = vm1[k] - vm0[k]
                cell["max_usage_bytes"] = int(ev.read_file(
                    os.path.join(cg, "memory.max_usage_in_bytes"), "0") or 0)
                m = re.search(r"^oom_kill (\d+)", ev.read_file(
                    os.path.join(cg, "memory.oom_control")), re.M)
                if m and int(m.group(1)) > 0 and cell["status"] != "ok":
                    cell.update(status="oom", reason="killed by the kernel's memcg OOM killer")
                h.remove_cgroup(cg)
        self.judge(cell)
        return cell

    def judge(self, cell):
        if cell["status"] != "ok" or cell["system"] == "local":
            return
        plain = self.plain[cell["workload"]]
        if cell.get("checksum") != plain.get("checksum"):
            cell.update(status="fail", reason="output sha256 %s differs from plain %s"
                        % (cell.get("checksum"), plain.get("checksum")))
            return
        cell["x_plain"] = round(cell["wall_s"] / plain["wall_s"], 3)
        # CPU time (user + system) against plain's: less sensitive to other
        # load than wall time, blind to time spent waiting for I/O.
        pc = plain["user_s"] + plain["sys_s"]
        if pc > 0:
            cell["cpu_x_plain"] = round((cell["user_s"] + cell["sys_s"]) / pc, 3)
        t = cell.get("target_rss_bytes")
        if t:
            cell["off"] = round((cell["peak_rss_bytes"] - t) / t, 4)
        if cell["system"] == "fm-loopback":
            cell["notes"].append("peak RSS includes the in-process loopback donor")
        if cell.get("local_fallbacks"):
            cell["notes"].append("%d large allocations were served by glibc, not the far heap"
                                 % cell["local_fallbacks"])

    def safe_run_cell(self, prog, system, ratio, raise_pct=0, lower_bytes=0):
        try:
            return self.run_cell(prog, system, ratio, raise_pct, lower_bytes)
        except ev.Interrupted:
            raise
        except Exception as e:  # a harness bug costs one cell, not the run
            for p in list(self.h.children):
                if not self.h.is_farmemd(p):
                    kill_group(self.h, p)
            return {"workload": prog, "set": "programs", "system": system, "ratio": ratio,
                    "status": "fail", "reason": "harness error: %r" % e, "notes": []}

    def skipped(self, prog, system, ratio, status, reason):
        return {"workload": prog, "set": "programs", "system": system, "ratio": ratio,
                "status": status, "reason": reason, "notes": []}

    # ---- the whole run ---------------------------------------------------
    def run(self):
        h, a = self.h, self.a
        meta = {
            "set": "programs",
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "mode": "quick" if a.quick else "default",
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "mem_total_kib": ev.proc_status_kib_meminfo(),
            "cpu_model": ev.cpu_model(),
            "loadavg_start": ev.read_file("/proc/loadavg").split()[:3],
            "sizes": self.sizes,
            "ratios": a.ratios,
            "timeout_factor": a.timeout_factor,
            "plain_runs": a.plain_runs,
            "runs": a.runs,
            "commands": {p: " ".join(command(p, {"text": "TEXT", "lines": "LINES", "tmp": "T"})[0])
                         for p in a.programs},
            "versions": {},
        }
        for p in a.programs:
            exe, pkg = PACKAGE[p]
            if shutil.which(exe) is None:
                raise SystemExit("eval: %s not found (Debian package %s; tools/install-deps.sh)"
                                 % (exe, pkg))
            v = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True,
                               text=True)
            meta["versions"][pkg] = v.stdout.strip() or "?"
        self.make_inputs(meta)
        if any(s in ("swap", "zswap") for s in a.systems):
            h.swap_skip = h.check_swap_possible()
            if h.swap_skip is None:
                h.clean_stale()
                h.swap_skip = h.setup_swap(512 * MiB)
            if h.swap_skip:
                self.log("SWAP BASELINE SKIPPED: %s; running plain and farmem only" % h.swap_skip)
        h.start_farmemds(a.systems, DONOR_CAPACITY)
        meta["swap_skipped"] = h.swap_skip
        meta["swaps"] = ev.read_file("/proc/swaps")
        meta["zswap"] = ({k: ev.read_file("/sys/module/zswap/parameters/" + k).strip()
                          for k in ("compressor", "max_pool_percent")}
                         if os.path.exists(ev.ZSWAP) else None)
        for prog in a.programs:
            self.run_program(prog)
        meta["loadavg_end"] = ev.read_file("/proc/loadavg").split()[:3]
        return meta

    def run_program(self, prog):
        a = self.a
        c = self.safe_run_cell(prog, "local", None)
        # The plain run is the yardstick of every ratio: on a shared machine
        # one run can be slow by chance, so it runs --plain-runs times and
        # the fastest counts (the others are kept in "plain_walls").
        walls = [c.get("wall_s")]
        for _ in range(a.plain_runs - 1):
            if c["status"] != "ok":
                break
            c2 = self.safe_run_cell(prog, "local", None)
            if c2["status"] != "ok" or c2.get("checksum") != c.get("checksum"):
                c = c2 if c2["status"] != "ok" else dict(c2, status="fail", reason=(
                    "plain runs disagree: sha256 %s then %s" % (c["checksum"], c2["checksum"])))
                break
            walls.append(c2["wall_s"])
            if c2["wall_s"] < c["wall_s"]:
                c2["peak_rss_bytes"] = max(c2["peak_rss_bytes"], c["peak_rss_bytes"])
                c = c2
            else:
                c["peak_rss_bytes"] = max(c2["peak_rss_bytes"], c["peak_rss_bytes"])
        if len(walls) > 1:
            c["plain_walls"] = walls
        self.report(c)
        if c["status"] != "ok":
            for s in a.systems[1:]:
                self.report(self.skipped(prog, s, None, "skipped", "the plain run failed"))
            return
        self.plain[prog] = c
        for s in a.systems:
            if s == "local":
                continue
            if s in ("swap", "zswap") and self.h.swap_skip:
                for r in a.ratios:
                    self.report(self.skipped(prog, s, r, "skipped", self.h.swap_skip))
                continue
            if s.startswith("fm-"):
                cal = self.safe_run_cell(prog, s, None)
                cal["calibration"] = True
                if cal["status"] == "ok":
                    if "resident_peak_bytes" not in cal:
                        cal.update(status="fail", reason="no FARMEM_STATS summary on stderr")
                    else:
                        cal["local_part_bytes"] = max(0, cal["peak_rss_bytes"] -
                                                      cal["resident_peak_bytes"])
                self.report(cal)
                if cal["status"] != "ok":
                    for r in a.ratios:
                        self.report(self.skipped(prog, s, r, "skipped",
                                                 "the calibration run did not succeed"))
                    continue
                self.calib[(prog, s)] = cal
            slow = None
            for r in a.ratios:
                if slow is not None:
                    self.report(self.skipped(prog, s, r, "timeout",
                                             "not run: already timed out at %d%%" % slow))
                    continue
                c = self.safe_run_cell(prog, s, r)
                if c["status"] == "oom":
                    self.log("%s %s %d%%: OOM-killed by the kernel; one retry" % (prog, s, r))
                    c = self.safe_run_cell(prog, s, r)
                    c["notes"].append("OOM-killed once before this run")
                # The kernel's memcg OOM killer fires at a tight limit even
                # with swap to spare (Linux 6.18, cgroup v1: a swap-in
                # charge that reclaim cannot meet): the cell is then run
                # at a limit raised by a few percent of P, so that swap
                # still has a figure, reported with the limit it ran at
                # (its peak RSS is off the target by as much).
                for bump in RAISE_AFTER_OOM_PCT:
                    if c["status"] != "oom" or s not in ("swap", "zswap"):
                        break
                    self.log("%s %s %d%%: OOM-killed again; retry with the limit raised by "
                             "%d%% of the plain peak" % (prog, s, r, bump))
                    c = self.safe_run_cell(prog, s, r, raise_pct=bump)
                    c["notes"].append("OOM-killed at the target limit; run with the limit "
                                      "raised by %d%% of the plain peak RSS" % bump)
                c = self.fit_swap_limit(c, prog, s, r)
                c = self.repeat_cell(c, prog, s, r)
                if c["status"] == "timeout":
                    slow = r
                self.report(c)
        # Ratio to swap at the same R, once swap's cells are in.
        for c in self.cells:
            if c["workload"] != prog or c["status"] != "ok" or c["ratio"] is None:
                continue
            sw = self.find(prog, "swap", c["ratio"])
            if sw and sw["status"] == "ok" and c["system"] != "swap":
                # Both divided by plain (paired runs with --runs: medians).
                c["x_swap"] = round(c["x_plain"] / sw["x_plain"], 3)
            elif sw and sw["status"] == "timeout" and c["system"] != "swap":
                c["x_swap"] = "<%.2f" % (c["wall_s"] / sw["wall_s"])

    def fit_swap_limit(self, c, prog, system, ratio):
        """A swap / zswap cell whose peak RSS overshot its target by more
        than OFF_LIMIT runs again with the limit lowered by the overshoot,
        up to FIT_RUNS times. The limit is the target plus the plain run's
        peak charge beyond its RSS, and that charge holds page cache (GNU
        sort's 80 MB input is charged to the group as it is read), which
        the kernel reclaims before any anonymous page: the heap then keeps
        the room the cache had (sort at 70%: 230 MiB against a 185 MiB
        target), and swap would be compared at a larger RSS than farmem.
        The run closest to the target counts; one that ends otherwise
        (OOM-killed at the lower limit) keeps the earlier run."""
        if system not in ("swap", "zswap") or c["status"] != "ok" or \
                c.get("limit_raised_pct") or not c.get("target_rss_bytes"):
            return c
        best = c
        lower = 0
        for _ in range(FIT_RUNS):
            if best.get("off") is None or best["off"] <= OFF_LIMIT:
                break
            lower += best["peak_rss_bytes"] - best["target_rss_bytes"]
            self.log("%s %s %d%%: peak RSS %s is %+.1f%% off the target; again with the limit "
                     "lowered by %s" % (prog, system, ratio, mib(best["peak_rss_bytes"]),
                                        100 * best["off"], mib(lower)))
            c2 = self.safe_run_cell(prog, system, ratio, lower_bytes=lower)
            if c2["status"] != "ok":
                best["notes"].append("a run with the limit lowered by %s to meet the target "
                                     "ended %s" % (mib(lower), c2["status"]))
                break
            c2["notes"].append("limit lowered by %s: at the plain run's charge the peak "
                               "RSS overshot the target" % mib(lower))
            if abs(c2["off"]) < abs(best["off"]):
                best = c2
        return best

    def repeat_cell(self, c, prog, system, ratio):
        """--runs N: the cell runs N times in all, each run next to a fresh
        plain run, and its ratio to plain is the median of the N pairs'
        ratios; the run with that ratio gives the cell's wall time and
        counters (every pair is kept in "pairs": cell wall, plain wall).
        This machine's CPU speed drifts by up to 25% over minutes, and the
        set runs a program's cells one system after the other, so a cell
        and the plain run it is divided by ran at different speeds: one run
        of each cannot settle a 5% question (zstd at no limit: 1.15x in the
        set, 0.98-1.01x in three interleaved pairs)."""
        if c["status"] != "ok" or self.a.runs <= 1:
            return c
        med, best = ev.repeat_paired(
            c, self.a.runs,
            lambda: self.safe_run_cell(prog, system, ratio, raise_pct=c.get("limit_raised_pct", 0),
                                       lower_bytes=c.get("limit_lowered_bytes", 0)),
            lambda: self.safe_run_cell(prog, "local", None), lambda x: x.get("wall_s"), "plain")
        if med is not None:
            best["x_plain"] = round(med, 3)
        return best

    def find(self, prog, system, ratio):
        return next((c for c in self.cells if c["workload"] == prog and c["system"] == system
                     and c["ratio"] == ratio), None)

    def report(self, c):
        self.cells.append(c)
        if self.a.out:
            os.makedirs(self.a.out, exist_ok=True)
            with open(os.path.join(self.a.out, "results.partial.json"), "w") as f:
                json.dump({"cells": self.cells}, f)
        rs = "plain" if c["system"] == "local" else (
            "nolimit" if c["ratio"] is None else "%d%%" % c["ratio"])
        load = ev.read_file("/proc/loadavg").split()[0]
        if c["status"] == "ok":
            extra = ""
            if "x_plain" in c:
                extra += " %.2fx plain" % c["x_plain"]
            if c.get("target_rss_bytes"):
                extra += " target %s off %+.1f%%" % (mib(c["target_rss_bytes"]), 100 * c["off"])
            if "faults_remote" in c:
                extra += " faults r/v/wp/z %d/%d/%d/%d" % (
                    c["faults_remote"], c.get("faults_victim", 0), c.get("faults_wp", 0),
                    c.get("faults_zero", 0))
            if c.get("pswpin") is not None and c["system"] in ("swap", "zswap"):
                extra += " swapin %d zswapin %d majflt %d" % (
                    c.get("pswpin", 0), c.get("zswpin", 0), c.get("pgmajfault", 0))
            self.log("%-8s %-11s %-7s ok %.2fs (u %.2f s %.2f) peak %s%s [load %s]" % (
                c["workload"], c["system"], rs, c["wall_s"], c["user_s"], c["sys_s"],
                mib(c["peak_rss_bytes"]), extra, load))
        else:
            self.log("%-8s %-11s %-7s %s: %s [load %s]" % (c["workload"], c["system"], rs,
                                                           c["status"].upper(),
                                                           c.get("reason", ""), load))


# After two memcg OOM kills at a ratio, swap is retried at a limit raised by
# these shares of the plain peak RSS, in turn, until one runs.
RAISE_AFTER_OOM_PCT = (3, 6, 10)
FIT_RUNS = 2  # re-runs of a swap cell whose peak RSS overshot its target


def mib(b):
    return "%.1f MiB" % (b / MiB)


# ---- output ----------------------------------------------------------------
CSV_FIELDS = ["workload", "system", "ratio", "status", "wall_s", "user_s", "sys_s",
              "peak_rss_bytes", "target_rss_bytes", "off", "x_plain", "cpu_x_plain", "x_swap",
              "budget_bytes_set",
              "limit_bytes", "max_usage_bytes", "timeout_s", "faults_zero", "faults_remote",
              "faults_victim", "faults_wp", "faults_waited", "evictions_clean",
              "evictions_dirty", "bytes_read", "bytes_written", "prefetch_issued",
              "prefetch_used", "zero_around", "populated_bytes", "populated_blocks",
              "resident_peak_bytes",
              "local_part_bytes", "farmemd_cpu_s", "main_asleep_s", "pgmajfault", "pswpin",
              "pswpout", "zswpin", "zswpout", "checksum", "reason"]


def _ratio_label(c):
    if c["system"] == "local":
        return "plain"
    return "no limit" if c["ratio"] is None else "%d%%" % c["ratio"]


def _fmt_x(v):
    return v if isinstance(v, str) else "%.2fx" % v


def markdown(meta, cells):
    ratios = sorted({c["ratio"] for c in cells if c["ratio"] is not None}, reverse=True)
    systems = [s for s in SYSTEMS if s != "local" and any(c["system"] == s for c in cells)]
    progs = [p for p in ALL_PROGRAMS if any(c["workload"] == p for c in cells)]
    has_nolimit = any(c["ratio"] is None and c["system"] != "local" for c in cells)
    cols = (["no limit"] if has_nolimit else []) + ["%d%%" % r for r in ratios]
    L = ["Wall time; x plain; (x swap at the same ratio of the plain peak RSS). "
         "Plain: the fastest of %d runs; farmem and swap at each ratio: %s. "
         "Load average %s at the start, %s at the end." % (
             meta.get("plain_runs", 1),
             "one run" if meta.get("runs", 1) <= 1 else
             "%d runs, each next to a fresh plain run, x plain the median of the pairs' ratios"
             % meta["runs"],
             "/".join(meta.get("loadavg_start", [])), "/".join(meta.get("loadavg_end", []))),
         "",
         "| program | plain | system | " + " | ".join(cols) + " |",
         "| --- | --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for p in progs:
        plain = next((c for c in cells if c["workload"] == p and c["system"] == "local"), None)
        if plain is None:
            continue
        pt = (plain["status"] if plain["status"] != "ok" else
              "%.2f s, %s" % (plain["wall_s"], mib(plain["peak_rss_bytes"])))
        first = True
        for s in systems:
            row = []
            for col in cols:
                r = None if col == "no limit" else int(col[:-1])
                c = next((c for c in cells if c["workload"] == p and c["system"] == s
                          and c["ratio"] == r), None)
                if c is None:
                    row.append("" if r is not None else "-")
                elif c["status"] == "timeout":
                    row.append("**timeout** (>%.0f s)" % c["timeout_s"] if "timeout_s" in c
                               else "**timeout** (not run)")
                elif c["status"] != "ok":
                    row.append("**%s**" % c["status"])
                else:
                    t = "%.2f s %s" % (c["wall_s"], _fmt_x(c["x_plain"]))
                    if r is None:  # farmem unconstrained: its own RSS
                        t += ", %s" % mib(c["peak_rss_bytes"])
                    if "x_swap" in c:
                        t += " (%s)" % _fmt_x(c["x_swap"])
                    if c.get("off") is not None and abs(c["off"]) > OFF_LIMIT:
                        t += " rss%+.0f%%" % (100 * c["off"])
                    if c.get("local_fallbacks"):
                        t += " **glibc-fallback**"
                    row.append(t)
            L.append("| %s | %s | %s | %s |" % (p if first else "", pt if first else "", s,
                                                " | ".join(row)))
            first = False
    L += ["", "`rss+N%%`: the cell's peak RSS was N%% off its target (R x plain peak; more "
          "than %d%% off is flagged). fm-loopback's RSS includes its in-process donor. "
          "`glibc-fallback`: a large allocation did not fit the far region and went to glibc "
          "(FARMEM_STATS), so farmem did not manage all of the heap." % (100 * OFF_LIMIT), ""]
    L += goals(cells)
    L += ["", "Every cell:", "",
          "| program | system | R | status | wall s | user s | sys s | peak RSS MiB | target MiB "
          "| off | x plain | cpu x plain | x swap "
          "| farmem faults remote/victim/wp/zero/waited | evictions clean/dirty "
          "| MiB read/written | prefetch issued/used | farmemd cpu s "
          "| main thread asleep s | swap majflt/swapin/zswapin |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | "
          "--- | --- | --- | --- | --- | --- |"]
    for c in cells:
        def g(k, fmt="%d"):
            v = c.get(k)
            return "" if v is None else (v if isinstance(v, str) else fmt % v)
        fm = c["system"].startswith("fm-") and "faults_remote" in c
        sw = c["system"] in ("swap", "zswap") and "pswpin" in c
        L.append("| %s |" % " | ".join([
            c["workload"], c["system"], _ratio_label(c),
            c["status"] if c["status"] == "ok" else "**%s**" % c["status"],
            g("wall_s", "%.2f"), g("user_s", "%.2f"), g("sys_s", "%.2f"),
            "%.1f" % (c["peak_rss_bytes"] / MiB) if "peak_rss_bytes" in c else "",
            "%.1f" % (c["target_rss_bytes"] / MiB) if "target_rss_bytes" in c else "",
            "%+.1f%%" % (100 * c["off"]) if c.get("off") is not None else "",
            _fmt_x(c["x_plain"]) if "x_plain" in c else "",
            _fmt_x(c["cpu_x_plain"]) if "cpu_x_plain" in c else "",
            _fmt_x(c["x_swap"]) if "x_swap" in c else "",
            "%d/%d/%d/%d/%s" % (c["faults_remote"], c.get("faults_victim", 0),
                                c.get("faults_wp", 0), c.get("faults_zero", 0),
                                g("faults_waited")) if fm else "",
            "%d/%d" % (c.get("evictions_clean", 0), c.get("evictions_dirty", 0)) if fm else "",
            "%.0f/%.0f" % (c.get("bytes_read", 0) / MiB, c.get("bytes_written", 0) / MiB)
            if fm else "",
            "%s/%s" % (g("prefetch_issued"), g("prefetch_used")) if fm else "",
            g("farmemd_cpu_s", "%.2f"), g("main_asleep_s", "%.2f"),
            "%d/%d/%d" % (c.get("pgmajfault", 0), c.get("pswpin", 0), c.get("zswpin", 0))
            if sw else ""]))
    notes = [c for c in cells if c["status"] not in ("ok",) and c.get("reason")]
    if notes:
        L += ["", "Cells that did not finish:", ""]
        for c in notes:
            L.append("- %s %s %s: %s: %s" % (c["workload"], c["system"], _ratio_label(c),
                                             c["status"], c["reason"]))
    return "\n".join(L) + "\n"


def goals(cells):
    """Issue 16's bar: at 70%, farmem <= 1.2x swap and <= 1.5x plain on
    every program; at 100%, <= 1.05x plain."""
    out = ["Goals of issue 16 (timings are only meaningful on an idle machine, at the "
           "default sizes):", ""]
    progs = [p for p in PROGRAMS if any(c["workload"] == p for c in cells)]
    for s in ("fm-tcp", "fm-local", "fm-loopback"):
        for r, key, bound in ((70, "x_swap", 1.2), (70, "x_plain", 1.5), (100, "x_plain", 1.05)):
            res = []
            for p in progs:
                c = next((c for c in cells if c["workload"] == p and c["system"] == s
                          and c["ratio"] == r), None)
                if c is None:
                    continue
                if c["status"] == "timeout":
                    res.append((p, "timeout", False))
                elif c["status"] != "ok":
                    res.append((p, c["status"], None))
                elif key not in c or isinstance(c[key], str):
                    sw = next((x for x in cells if x["workload"] == p and x["system"] == "swap"
                               and x["ratio"] == r), None)
                    why = "swap %s" % sw["status"] if sw is not None else "no swap cell"
                    res.append((p, "%s (%s)" % (c.get(key, "n/a"), why), None))
                else:
                    res.append((p, "%.2fx" % c[key], c[key] <= bound))
            if not res:
                continue
            verdict = ("met" if all(ok for _, _, ok in res) else
                       "MISSED" if any(ok is False for _, _, ok in res) else "unknown")
            out.append("- %s at %d%%: %s <= %.2f: **%s** (%s)" % (
                s, r, "time / swap's" if key == "x_swap" else "time / plain", bound, verdict,
                ", ".join("%s %s" % (p, v) for p, v, _ in res)))
    return out if len(out) > 2 else []


def derive(cells):
    """Ratios that a results.json from an older harness may lack (--replot)."""
    for c in cells:
        plain = next((p for p in cells if p["workload"] == c["workload"]
                      and p["system"] == "local"), None)
        if (c["status"] != "ok" or c["system"] == "local" or plain is None
                or plain["status"] != "ok" or "cpu_x_plain" in c):
            continue
        pc = plain["user_s"] + plain["sys_s"]
        if pc > 0:
            c["cpu_x_plain"] = round((c["user_s"] + c["sys_s"]) / pc, 3)


def write_outputs(out, meta, cells):
    derive(cells)

    def fix_row(c, row):
        if c["ratio"] is None:
            row["ratio"] = "plain" if c["system"] == "local" else "nolimit"

    return ev.write_outputs(out, meta, cells, CSV_FIELDS, markdown(meta, cells), fix_row)


def main(a):
    """Called by eval.main with parsed arguments when --set programs."""
    h = ev.Harness(a)
    p = Programs(h, a)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, ev.on_signal)
    t0 = time.time()
    meta = {}
    try:
        meta = p.run()
    except ev.Interrupted as e:
        ev.log("interrupted (%s): cleaning up" % e)
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for c in list(h.children):  # the programs first: farmemd serves them
            if not h.is_farmemd(c):
                kill_group(h, c)
        h.cleanup()
    meta["elapsed_s"] = round(time.time() - t0, 1)
    table = write_outputs(a.out, meta, p.cells)
    try:
        os.unlink(os.path.join(a.out, "results.partial.json"))
    except OSError:
        pass
    failed = [c for c in p.cells if c["status"] == "fail"]
    timeouts = [c for c in p.cells if c["status"] == "timeout"]
    ok = [c for c in p.cells if c["status"] == "ok"]
    print()
    print(table)
    ev.log("results in %s (results.json, results.csv, table.md)" % a.out)
    ev.log("load average at start %s, at end %s; %.0f s" % (
        "/".join(meta.get("loadavg_start", [])), "/".join(meta.get("loadavg_end", [])),
        meta["elapsed_s"]))
    if h.swap_skip:
        ev.log("the swap baseline was SKIPPED: %s" % h.swap_skip)
    for c in failed:
        ev.log("FAILED: %s %s %s: %s" % (c["workload"], c["system"], _ratio_label(c),
                                         c.get("reason")))
    print("eval: %d ok, %d timed out (a result), %d failed, %d skipped" % (
        len(ok), len(timeouts), len(failed),
        len(p.cells) - len(ok) - len(timeouts) - len(failed)))
    return 1 if failed else 0
