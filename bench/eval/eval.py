#!/usr/bin/env python3
"""farmem evaluation harness: workloads at 100/75/50/25% local memory under
all-local, farmem (loopback and tcp) and Linux swap (zswap off and on).

Run it through bench/eval/run.sh, which builds what it needs first:

    bench/eval/run.sh                    # the default set (~20 min on 2 cores)
    bench/eval/run.sh --quick            # small sizes, ratios 100 and 50 (CI)
    bench/eval/run.sh --out DIR --workloads kv,scan --systems local,fm-tcp,swap
    bench/eval/run.sh --set programs     # unmodified Debian programs at the same peak RSS
    bench/eval/run.sh --set programs --quick   # its CI variant (ctest eval_programs_quick)

--set programs (issue 16: xz, GNU sort, zstd, plain / swap / zswap / farmem
at R x the plain peak RSS, outputs sha256-compared) is bench/eval/programs.py;
its header says how the limits are derived and what is reported. What
follows is the default set, --set micro.

Systems
  local        the workload as it is: the reference for checksums and speed
  fm-loopback  LD_PRELOAD=libfarmem_preload.so, FARMEM_TRANSPORT=loopback: an
               in-process donor, so this is the pager's own cost
  fm-tcp       the same against a farmemd on 127.0.0.1 (token file, port 0)
               with --local-clients=off: every READ and WRITE over tcp, as
               against a donor on another host
  fm-local     the same farmemd's default for a client on its host: slabs
               read and written one-sided (process_vm_readv), no request on
               the wire (runtime/tcp_transport.cc "Local donors")
  swap         the process in a cgroup-v1 memory limit, swapfile on disk, zswap off
  zswap        the same with zswap on

Local budget at ratio R (ws = the working set the workload reports, B = its
non-heap baseline = peak RSS of the all-local run - ws):
  farmem  FARMEM_LOCAL_MEM = R * ws + B - L: the same peak RSS as swap's
          limit. L is what the farmem process holds outside the far heap
          (program text, stacks, farmem's own memory): its peak RSS minus
          the far heap's resident peak in a calibration run with a budget
          far above the heap, once per workload and farmem system. Since
          small allocations are far (FARMEM_MIN_FAR 0) part of B is far
          heap, so R * ws alone left the data no room at 100%. Without a
          calibration (it failed) the budget is R * ws, with a note.
  swap    memory.limit_in_bytes = R * ws + B, where B is measured in the
          all-local run, which runs in an unlimited cgroup of its own:
          B = max(peak RSS, memory.max_usage_in_bytes) - ws. Peak RSS counts
          the mapped program and library pages (charged to the group once
          they are reclaimed and fault back); max_usage counts page tables
          and kernel objects. Memcached's ws is its VmHWM minus its RSS
          before the load started.

--runs N (default 1): every farmem and swap cell runs N times, each run
next to a fresh all-local run, and its normalized performance is the median
of the N pairs' ratios (throughput / the paired all-local throughput; every
pair is kept in "pairs"). The machine's speed drifts by up to 25% over
minutes while a timed region is 15-500 ms long, so one run of each cannot
tell 0.95 from 1.05.

Output in --out: results.json (every cell with its counters and histograms),
results.csv (one row per cell), table.md, and PNGs: <workload>.png
(normalized performance vs local ratio, one line per system), faultlat-cdf.png
and eval.png (all of them on one page).

A cell FAILS when the workload exits non-zero, times out, or prints a
checksum different from the all-local run; the exit status is then 1.
A swap cell that the kernel's memcg OOM killer ends is retried once; if it
is killed again it is reported as "oom" (a property of the baseline, not
of farmem or the harness) and does not fail the run.
Swap needs root and cgroup-v1 memory; without them the swap systems are
skipped with the reason printed and recorded (not a failure).

Everything the harness sets up is undone on every exit path, Ctrl-C
included: children killed, swapoff and the swapfile deleted, cgroups
removed, zswap's setting restored, farmemd stopped.
"""

import argparse
import csv
import datetime
import itertools
import json
import os
import platform
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

SYSTEMS = ["local", "fm-loopback", "fm-tcp", "fm-local", "swap", "zswap"]
WORKLOADS = ["kv", "sort", "pagerank", "scan", "memcached", "faultlat"]
CG_ROOT = "/sys/fs/cgroup/memory"
ZSWAP = "/sys/module/zswap/parameters/enabled"
MiB = 1 << 20

# Workload arguments. The default set is sized for ~20 minutes on 2 cores
# (farmem's slow cells dominate); --quick for well under 3.
SIZES = {
    "default": {
        "kv": ["--mib", "64", "--ops", "500000"],
        "sort": ["--mib", "48"],
        "pagerank": ["--scale", "17", "--edge-factor", "16", "--iters", "10"],
        "scan": ["--mib", "64", "--passes", "2"],
        "memcached": ["--keys", "50000", "--ops", "50000", "--value-size", "1000"],
        "faultlat": ["--mib", "64", "--reads", "20000"],
    },
    "quick": {
        "kv": ["--mib", "16", "--ops", "30000"],
        "sort": ["--mib", "16"],
        "pagerank": ["--scale", "13", "--edge-factor", "16", "--iters", "3"],
        "scan": ["--mib", "24", "--passes", "1"],
        "memcached": ["--keys", "10000", "--ops", "10000", "--value-size", "1000"],
        "faultlat": ["--mib", "16", "--reads", "5000"],
    },
}
BINARY = {
    "kv": "farmem_eval_kv",
    "sort": "farmem_eval_sort",
    "pagerank": "farmem_eval_pagerank",
    "scan": "farmem_eval_scan",
    "faultlat": "farmem_eval_faultlat",
}


def log(msg):
    print("eval: " + msg, flush=True)


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def read_file(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def write_file(path, text):
    with open(path, "w") as f:
        f.write(text)


def vmstat():
    out = {}
    for line in read_file("/proc/vmstat").splitlines():
        k, _, v = line.partition(" ")
        if k in ("pswpin", "pswpout", "zswpin", "zswpout", "pgmajfault"):
            out[k] = int(v)
    return out


def mem_stat(cg):
    out = {}
    for line in read_file(os.path.join(cg, "memory.stat")).splitlines():
        k, _, v = line.partition(" ")
        if v.isdigit():
            out[k] = int(v)
    return out


def proc_status_kib(pid, field):
    m = re.search(r"^%s:\s+(\d+) kB" % field, read_file("/proc/%d/status" % pid), re.M)
    return int(m.group(1)) if m else 0


def parse_stats_socket(text):
    """The farmem stats socket text format (runtime/stats_socket.h)."""
    out = {"counters": {}, "histograms": {}}
    for line in text.splitlines():
        parts = line.split(" ")
        if parts[0] in ("counter", "gauge") and len(parts) >= 4:
            if parts[2] == "-":
                out["counters"][parts[1]] = int(parts[3])
        elif parts[0] == "histogram" and len(parts) >= 4:
            buckets = []
            for b in parts[3].split(","):
                le, _, n = b.partition(":")
                buckets.append([None if le == "inf" else int(le), int(n)])
            out["histograms"][parts[1]] = buckets
    out["complete"] = text.rstrip().endswith("end")
    return out


def read_stats_socket(path, timeout=5.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
        return parse_stats_socket(b"".join(chunks).decode(errors="replace"))
    finally:
        s.close()


class Harness:
    def __init__(self, args):
        self.a = args
        self.build = args.build_dir
        self.out = args.out
        self.sizes = SIZES["quick" if args.quick else "default"]
        self.work = tempfile.mkdtemp(prefix="farmem-eval.")
        os.chmod(self.work, 0o700)
        self.children = []  # Popen objects still running
        self.report_seq = itertools.count()  # spawn_launched()'s report files
        self.cgroups = []  # paths created
        self.swapfile = None
        self.swap_on = False
        self.zswap_orig = None
        self.farmemd = None  # fm-tcp's (--local-clients=off)
        self.farmemd_port = None
        self.farmemds = {}  # system -> (Popen, port): fm-tcp, fm-local
        self.token = os.path.join(self.work, "token")
        self.cells = []
        self.local = {}  # workload -> local cell
        self.fm_local = {}  # (workload, fm system) -> farmem's own local bytes (calibration)
        self.swap_skip = None  # reason, when the swap systems cannot run
        self.cg_seq = 0

    # ---- set-up and tear-down ------------------------------------------------
    def check_swap_possible(self):
        if os.geteuid() != 0:
            return "not root (swapon, cgroups and zswap need root)"
        if not os.path.exists(os.path.join(CG_ROOT, "memory.limit_in_bytes")):
            return "cgroup-v1 memory controller not mounted at %s (see `mount | grep cgroup`)" % CG_ROOT
        for tool in ("swapon", "swapoff", "mkswap"):
            if not any(os.access(os.path.join(d, tool), os.X_OK)
                       for d in ("/sbin", "/usr/sbin", "/bin", "/usr/bin")):
                return "%s not found (Debian package util-linux)" % tool
        return None

    def setup_swap(self, size_bytes):
        path = self.a.swapfile or "/var/tmp/farmem-eval-%d.swap" % os.getpid()
        self.swapfile = path
        log("creating a %d MiB swapfile at %s" % (size_bytes // MiB, path))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            return "cannot create swapfile %s: %s (set --swapfile)" % (path, e)
        try:
            # Written, not fallocated: swapon refuses files with holes or
            # unwritten extents on some filesystems.
            chunk = b"\0" * (4 * MiB)
            left = size_bytes
            while left > 0:
                left -= os.write(fd, chunk[: min(left, len(chunk))])
            os.fsync(fd)
        finally:
            os.close(fd)
        r = subprocess.run(["mkswap", path], capture_output=True, text=True)
        if r.returncode != 0:
            return "mkswap %s failed: %s" % (path, r.stderr.strip())
        # Highest priority, so that this file is what the cgroup swaps to
        # even when the machine has other swap.
        r = subprocess.run(["swapon", "-p", "32767", path], capture_output=True, text=True)
        if r.returncode != 0:
            return ("swapon %s failed: %s (a filesystem that cannot hold swap? set --swapfile)"
                    % (path, r.stderr.strip()))
        self.swap_on = True
        if os.path.exists(ZSWAP):
            self.zswap_orig = read_file(ZSWAP).strip()
        return None

    def set_zswap(self, on):
        if not os.path.exists(ZSWAP):
            return "zswap is not built into this kernel (%s missing)" % ZSWAP
        try:
            write_file(ZSWAP, "Y" if on else "N")
        except OSError as e:
            return "cannot set %s: %s" % (ZSWAP, e)
        return None

    def start_farmemd(self, capacity, system="fm-tcp"):
        """farmemd on 127.0.0.1 for `system`: fm-tcp's with
        --local-clients=off (every op on the wire), fm-local's with the
        default (one-sided for a client on this host)."""
        if not os.path.exists(self.token):
            with open(self.token, "w") as f:
                f.write(os.urandom(32).hex())
            os.chmod(self.token, 0o600)
        logp = os.path.join(self.work, "farmemd-%s.log" % system)
        cmd = [os.path.join(self.build, "runtime", "farmemd"), "--listen", "127.0.0.1:0",
               "--capacity", "%dM" % (capacity // MiB), "--token-file", self.token,
               "--log-level", "warn"]
        if system == "fm-tcp":
            cmd += ["--local-clients", "off"]
        p = subprocess.Popen(cmd, stdout=open(logp, "w"), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        self.children.append(p)
        deadline = time.time() + 10
        while time.time() < deadline:
            if p.poll() is not None:
                return "farmemd exited at start: " + read_file(logp).strip()
            m = re.search(r"listening on [^ ]*:(\d+)", read_file(logp))
            if m:
                port = int(m.group(1))
                self.farmemds[system] = (p, port)
                if system == "fm-tcp":
                    self.farmemd, self.farmemd_port, self.farmemd_log = p, port, logp
                log("farmemd for %s (pid %d) listens on 127.0.0.1:%d, capacity %d MiB"
                    % (system, p.pid, port, capacity // MiB))
                return None
            time.sleep(0.05)
        return "farmemd did not print its port within 10 s: " + read_file(logp).strip()

    def is_farmemd(self, p):
        return any(p is q for q, _ in self.farmemds.values())

    def start_farmemds(self, systems, capacity):
        for s in ("fm-tcp", "fm-local"):
            if s in systems:
                err = self.start_farmemd(capacity, s)
                if err:
                    raise SystemExit("eval: cannot start farmemd: %s" % err)

    def kill(self, p, sig=signal.SIGKILL):
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except OSError:
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p in self.children:
            self.children.remove(p)

    def remove_cgroup(self, cg):
        # Only our own children are ever put in these groups; one still there
        # (an interrupted cell) is killed by its pid so the group can go.
        for pid in read_file(os.path.join(cg, "cgroup.procs")).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            log("warning: could not remove cgroup %s" % cg)
            return
        if cg in self.cgroups:
            self.cgroups.remove(cg)

    def cleanup(self):
        for p in list(self.children):
            if self.is_farmemd(p):
                continue
            self.kill(p)
        for p, _ in self.farmemds.values():
            self.kill(p, signal.SIGTERM)
        self.farmemds = {}
        self.farmemd = None
        for cg in list(self.cgroups):
            self.remove_cgroup(cg)
        if self.swap_on:
            r = subprocess.run(["swapoff", self.swapfile], capture_output=True, text=True)
            if r.returncode != 0:
                log("warning: swapoff %s failed: %s" % (self.swapfile, r.stderr.strip()))
            else:
                self.swap_on = False
        if self.swapfile and not self.swap_on and os.path.exists(self.swapfile):
            os.unlink(self.swapfile)
        if self.zswap_orig is not None:
            try:
                write_file(ZSWAP, self.zswap_orig)
            except OSError:
                pass
        subprocess.run(["rm", "-rf", self.work])

    @staticmethod
    def clean_stale():
        """Leftovers of a harness that was SIGKILLed: its cgroups and swapfile."""
        if os.path.isdir(CG_ROOT):
            for name in os.listdir(CG_ROOT):
                m = re.match(r"farmem-eval-(\d+)-\d+$", name)
                if m and not os.path.exists("/proc/" + m.group(1)):
                    try:
                        os.rmdir(os.path.join(CG_ROOT, name))
                    except OSError:
                        pass
        for line in read_file("/proc/swaps").splitlines()[1:]:
            path = line.split()[0]
            m = re.match(r"/var/tmp/farmem-eval-(\d+)\.swap$", path)
            if m and not os.path.exists("/proc/" + m.group(1)):
                subprocess.run(["swapoff", path])
                try:
                    os.unlink(path)
                except OSError:
                    pass

    # ---- one run -------------------------------------------------------------
    def system_env(self, system, budget, ws):
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        for k in list(env):
            if k.startswith("FARMEM_"):
                del env[k]
        if system.startswith("fm-"):
            env["LD_PRELOAD"] = os.path.join(self.build, "preload", "libfarmem_preload.so")
            env["FARMEM_LOCAL_MEM"] = str(budget)
            env["FARMEM_STATS"] = "1"
            env["XDG_RUNTIME_DIR"] = self.work
            if system == "fm-loopback":
                env["FARMEM_TRANSPORT"] = "loopback"
                cap = max(64 * MiB, (2 * ws + 64 * MiB) // (16 * MiB) * (16 * MiB))
                env["FARMEM_LOOPBACK_CAPACITY"] = str(cap)
            else:
                env["FARMEM_TRANSPORT"] = "tcp"
                env["FARMEM_SERVERS"] = "127.0.0.1:%d" % self.farmemds[system][1]
                env["FARMEM_TOKEN_FILE"] = self.token
        return env

    def new_cgroup(self, limit):
        self.cg_seq += 1
        cg = os.path.join(CG_ROOT, "farmem-eval-%d-%d" % (os.getpid(), self.cg_seq))
        os.mkdir(cg)
        self.cgroups.append(cg)
        if limit is not None:
            write_file(os.path.join(cg, "memory.limit_in_bytes"), str(limit))
        return cg

    def swap_usable(self):
        return self.swap_on and not self.swap_skip

    def spawn(self, cmd, env, cg, stdin=subprocess.PIPE, stdout=subprocess.PIPE):
        def enter():
            os.setpgid(0, 0)
            if cg:
                write_file(os.path.join(cg, "cgroup.procs"), str(os.getpid()))
        errp = os.path.join(self.work, "stderr.%d" % len(self.cells))
        p = subprocess.Popen(cmd, env=env, stdin=stdin, stdout=stdout,
                             stderr=open(errp, "w"), preexec_fn=enter)
        p.errpath = errp
        self.children.append(p)
        return p

    def spawn_launched(self, argv, env, cg, stdin=subprocess.PIPE, stdout=subprocess.PIPE):
        """Spawns argv through farmem_eval_runprog (bench/eval/workloads/
        runprog.cc): wait4's ru_maxrss survives execve, so a program forked
        straight from this (15 MiB) Python process would report the
        harness's RSS as its peak when its own is smaller. LD_PRELOAD in env
        goes to the program only. Returns (p, report path); see
        launched_pid() and launched_report()."""
        rep = os.path.join(self.work, "report.%d" % next(self.report_seq))
        launcher = [os.path.join(self.build, "bench", "eval", "farmem_eval_runprog"), rep]
        if "LD_PRELOAD" in env:
            launcher += ["--preload", env.pop("LD_PRELOAD")]
        return self.spawn(launcher + ["--"] + argv, env, cg, stdin=stdin, stdout=stdout), rep

    @staticmethod
    def launched_pid(rep):
        """The program's pid once farmem_eval_runprog started it, else None."""
        m = re.match(r"pid (\d+)", read_file(rep))
        return int(m.group(1)) if m else None

    @staticmethod
    def launched_report(rep):
        """farmem_eval_runprog's report once the program ended (status,
        signal, wall_s, user_s, sys_s, maxrss_kib), else None."""
        try:
            return json.loads(read_file(rep).splitlines()[-1])
        except (IndexError, ValueError):
            return None

    @staticmethod
    def wait_rusage(p, timeout):
        """wait4 with a deadline: (status, ru_maxrss KiB) or None on timeout."""
        deadline = time.time() + timeout
        while True:
            if p.returncode is not None:  # already reaped by poll(): no rusage left
                return p.returncode, 0
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                return p.returncode, ru.ru_maxrss
            if time.time() > deadline:
                return None
            time.sleep(0.02)

    def far_stats(self, pid, cell):
        path = os.path.join(self.work, "farmem", "%d.sock" % pid)
        try:
            st = read_stats_socket(path)
        except OSError as e:
            cell["notes"].append("stats socket %s: %s" % (path, e))
            return
        c = st["counters"]
        for k in ("faults_zero", "faults_remote", "faults_victim", "faults_wp", "faults_waited",
                  "evictions_clean", "evictions_dirty", "bytes_read", "bytes_written",
                  "prefetch_issued", "prefetch_used", "resident_peak_bytes", "budget_bytes"):
            if k in c:
                cell[k] = c[k]
        cell["faults"] = c.get("faults_remote", 0)
        cell["bytes_moved"] = c.get("bytes_read", 0) + c.get("bytes_written", 0)
        if "fetch_latency_us" in st["histograms"]:
            cell["fetch_hist_us"] = st["histograms"]["fetch_latency_us"]

    def fm_local_bytes(self, workload, system, ws, base):
        """farmem's local part for (workload, system): peak RSS minus the far
        heap's resident peak in a run with a budget far above the heap (once
        per pair); None when that run failed."""
        key = (workload, system)
        if key not in self.fm_local:
            cal = {"workload": workload, "system": system, "ratio": None, "status": "ok",
                   "notes": []}
            env = self.system_env(system, (4 * (ws + base) + 64 * MiB) // MiB * MiB, ws)
            try:
                if workload == "memcached":
                    self.run_memcached(cal, env, None)
                else:
                    self.run_program(cal, workload, env, None)
            except Exception as e:  # a harness problem costs the calibration only
                cal.update(status="fail", reason=str(e))
            L = None
            if cal["status"] == "ok" and cal.get("peak_rss_bytes") and \
                    cal.get("resident_peak_bytes") is not None:
                L = max(0, cal["peak_rss_bytes"] - cal["resident_peak_bytes"])
            log("%s %s: calibration %s, local part %s" % (
                workload, system, cal["status"], "%.1f MiB" % (L / MiB) if L is not None else "-"))
            self.fm_local[key] = L
        return self.fm_local[key]

    def run_cell(self, workload, system, ratio):
        cell = {"workload": workload, "system": system, "ratio": ratio, "status": "ok",
                "notes": []}
        local = self.local.get(workload)
        ws = local["ws_bytes"] if local else 0
        base = local["baseline_bytes"] if local else 0
        budget = limit = 0
        if system.startswith("fm-"):
            # The same peak RSS as swap's limit (R x ws + B): what the
            # process holds outside the far heap (program text, stacks,
            # farmem's own memory) comes out of it, as measured by a run
            # without a limit (fm_local_bytes()).
            L = self.fm_local_bytes(workload, system, ws, base)
            if L is None:
                budget = max(1 * MiB, (ws * ratio // 100) // 4096 * 4096)
                cell["notes"].append("no calibration: budget R x ws")
            else:
                budget = max(1 * MiB, (ws * ratio // 100 + base - L) // 4096 * 4096)
                cell["local_part_bytes"] = L
            cell["budget_bytes"] = budget
        elif system in ("swap", "zswap"):
            limit = (ws * ratio // 100 + base + 4095) // 4096 * 4096
            cell["limit_bytes"] = limit
            err = self.set_zswap(system == "zswap")
            if err:
                cell.update(status="skipped", reason=err)
                return cell
        env = self.system_env(system, budget, ws)
        cg = None
        if limit:
            cg = self.new_cgroup(limit)
        elif system == "local" and self.swap_usable():
            # Unlimited: its peak charge is the fair baseline for the swap limit.
            cg = self.new_cgroup(None)
        vm0 = vmstat() if cg else None
        t0 = time.time()
        try:
            if workload == "memcached":
                self.run_memcached(cell, env, cg)
            else:
                self.run_program(cell, workload, env, cg)
        finally:
            cell["wall_s"] = round(time.time() - t0, 3)
            if cg:
                vm1 = vmstat()
                st = mem_stat(cg)
                cell["pgmajfault"] = st.get("total_pgmajfault", st.get("pgmajfault", 0))
                for k in ("pswpin", "pswpout", "zswpin", "zswpout"):
                    if k in vm0:
                        cell[k] = vm1[k] - vm0[k]
                cell["faults"] = cell["pgmajfault"]
                cell["bytes_moved"] = 4096 * (cell.get("pswpin", 0) + cell.get("pswpout", 0) +
                                              cell.get("zswpin", 0) + cell.get("zswpout", 0))
                cell["max_usage_bytes"] = int(read_file(os.path.join(cg, "memory.max_usage_in_bytes"), "0") or 0)
                cell["cgroup_failcnt"] = int(read_file(os.path.join(cg, "memory.failcnt"), "0") or 0)
                m = re.search(r"^oom_kill (\d+)", read_file(os.path.join(cg, "memory.oom_control")), re.M)
                if m and int(m.group(1)) > 0 and cell["status"] != "ok":
                    cell.update(status="oom", reason="killed by the kernel's memcg OOM killer "
                                "(cgroup v1 reclaim gave up while swap-in readahead charged pages)")
                self.remove_cgroup(cg)
        self.judge(cell)
        return cell

    def read_result_line(self, p, cell, deadline):
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.time()
            if left <= 0:
                cell.update(status="timeout", reason="no result within %d s" % self.a.timeout)
                return None
            r, _, _ = select.select([p.stdout], [], [], min(left, 1.0))
            if r:
                b = os.read(p.stdout.fileno(), 65536)
                if not b:
                    break
                buf += b
        line = buf.split(b"\n", 1)[0].decode(errors="replace").strip()
        if not line:
            return None
        try:
            return json.loads(line)
        except ValueError:
            cell.update(status="fail", reason="bad result line: %r" % line[:200])
            return None

    def absorb(self, cell, res):
        for k in ("runtime_s", "throughput", "throughput_unit", "p50_us", "p99_us", "checksum",
                  "ws_bytes", "hist_ns", "misses"):
            if k in res:
                cell[k] = res[k]

    def fail_from(self, cell, p, what):
        err = read_file(p.errpath).strip().splitlines()
        tail = " | ".join(err[-4:])
        if cell["status"] == "ok":
            cell.update(status="fail", reason="%s: %s" % (what, tail or "no stderr"))

    def run_program(self, cell, workload, env, cg):
        """Runs a workload through farmem_eval_runprog (spawn_launched()):
        forked from here, pagerank (14 MiB) reported the harness's RSS, and
        farmem's local part L, and so its budget, came out 1 MiB off."""
        cmd = [os.path.join(self.build, "bench", "eval", BINARY[workload])] + self.sizes[workload]
        env["FARMEM_EVAL_HOLD"] = "1"
        p, rep = self.spawn_launched(cmd, env, cg)
        deadline = time.time() + self.a.timeout
        res = self.read_result_line(p, cell, deadline)
        if res is not None:
            self.absorb(cell, res)
            pid = self.launched_pid(rep)
            if cell["system"].startswith("fm-") and pid:
                self.far_stats(pid, cell)
        try:
            p.stdin.close()
        except OSError:
            pass
        w = self.wait_rusage(p, max(5.0, deadline - time.time()))
        if w is None:
            self.kill(p)
            if cell["status"] == "ok":
                cell.update(status="timeout", reason="did not exit within %d s" % self.a.timeout)
            return
        self.children.remove(p)
        rc = w[0]
        report = self.launched_report(rep) or {}
        cell["peak_rss_bytes"] = report.get("maxrss_kib", 0) * 1024
        if rc != 0:
            self.fail_from(cell, p, "exit status %d" % rc)
        elif res is None:
            self.fail_from(cell, p, "no result line")
        elif not report:
            self.fail_from(cell, p, "no report from farmem_eval_runprog")

    def run_memcached(self, cell, env, cg):
        portfile = os.path.join(self.work, "mc.ports.%d" % len(self.cells))
        env["MEMCACHED_PORT_FILENAME"] = portfile
        if os.path.exists(portfile):  # a retried cell: the old port is stale
            os.unlink(portfile)
        cmd = ["memcached", "-l", "127.0.0.1", "-p", "-1", "-U", "0", "-t", "2", "-m", "8192",
               "-c", "64"]
        if os.geteuid() == 0:
            cmd += ["-u", "root"]
        mc = self.spawn(cmd, env, cg, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        port = None
        deadline = time.time() + 15
        while time.time() < deadline and mc.poll() is None:
            m = re.search(r"TCP INET: (\d+)", read_file(portfile))
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.05)
        if port is None:
            self.fail_from(cell, mc, "memcached did not start")
            self.kill(mc)
            return
        start_rss = proc_status_kib(mc.pid, "VmRSS") * 1024
        load = [os.path.join(self.build, "bench", "eval", "farmem_eval_mcload"), "--port",
                str(port)] + self.sizes["memcached"]
        lenv = self.system_env("local", 0, 0)
        lp = self.spawn(load, lenv, None, stdin=subprocess.DEVNULL)
        res = self.read_result_line(lp, cell, time.time() + self.a.timeout)
        w = self.wait_rusage(lp, 10 if res is not None else 0.1)
        if w is None:
            self.kill(lp)
        else:
            self.children.remove(lp)
            if w[0] != 0:
                self.fail_from(cell, lp, "load generator exit status %d" % w[0])
        if res is not None:
            self.absorb(cell, res)
            # memcached's own heap: what it grew by while holding the keys.
            cell["ws_bytes"] = proc_status_kib(mc.pid, "VmHWM") * 1024 - start_rss
            cell["start_rss_bytes"] = start_rss
            if cell["system"].startswith("fm-"):
                self.far_stats(mc.pid, cell)
        elif cell["status"] == "ok":
            self.fail_from(cell, lp, "no result from the load generator")
        if mc.poll() is not None:
            self.fail_from(cell, mc, "memcached exited during the run (status %s)" % mc.returncode)
        mc.send_signal(signal.SIGTERM)
        w = self.wait_rusage(mc, 15)
        if w is None:
            self.kill(mc)
        else:
            self.children.remove(mc)
            cell["peak_rss_bytes"] = w[1] * 1024

    def judge(self, cell):
        if cell["status"] != "ok":
            return
        local = self.local.get(cell["workload"])
        if cell["system"] == "local":
            return
        if cell.get("checksum") != local.get("checksum"):
            cell.update(status="fail", reason="checksum %s differs from all-local %s"
                        % (cell.get("checksum"), local.get("checksum")))
            return
        if cell.get("misses"):
            cell["notes"].append("%d gets missed" % cell["misses"])
        if local.get("throughput") and cell.get("throughput"):
            cell["norm"] = cell["throughput"] / local["throughput"]
            cell["slowdown"] = local["throughput"] / cell["throughput"]

    # ---- the whole run -------------------------------------------------------
    def plan(self):
        systems = [s for s in self.a.systems if s != "local"]
        cells = []
        for w in self.a.workloads:
            cells.append((w, "local", 100))
            ratios = self.a.ratios
            if w == "faultlat":  # a probe: one ratio is enough for the CDF
                ratios = [min(ratios)]
            for s in systems:
                for r in ratios:
                    cells.append((w, s, r))
        return cells

    def run(self):
        meta = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "mode": "quick" if self.a.quick else "default",
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "mem_total_kib": proc_status_kib_meminfo(),
            "cpu_model": cpu_model(),
            "loadavg_start": read_file("/proc/loadavg").split()[:3],
            "sizes": self.sizes,
            "ratios": self.a.ratios,
            "runs": self.a.runs,
        }
        want_swap = any(s in ("swap", "zswap") for s in self.a.systems)
        if want_swap:
            self.swap_skip = self.check_swap_possible()
            if self.swap_skip is None:
                self.clean_stale()
                biggest = 256 * MiB if not self.a.quick else 32 * MiB
                self.swap_skip = self.setup_swap(max(biggest * 2, 256 * MiB))
            if self.swap_skip:
                log("SWAP BASELINE SKIPPED: %s; running the farmem systems only" % self.swap_skip)
        self.start_farmemds(self.a.systems, 1024 * MiB if self.a.quick else 2048 * MiB)
        meta["swap_skipped"] = self.swap_skip
        meta["swaps"] = read_file("/proc/swaps")
        meta["zswap"] = {k: read_file("/sys/module/zswap/parameters/" + k).strip()
                         for k in ("compressor", "max_pool_percent")} if os.path.exists(ZSWAP) else None

        for w, s, r in self.plan():
            if s == "local":
                pass
            elif w not in self.local or self.local[w]["status"] != "ok":
                cell = {"workload": w, "system": s, "ratio": r, "status": "skipped",
                        "reason": "the all-local run failed", "notes": []}
                self.report(cell)
                continue
            slow = next((c for c in self.cells if c["workload"] == w and c["system"] == s
                         and c["status"] == "timeout" and c["ratio"] > r), None)
            if slow is not None:
                # Less memory will not be faster: do not spend another timeout.
                cell = {"workload": w, "system": s, "ratio": r, "status": "timeout",
                        "reason": "not run: already timed out at %d%%" % slow["ratio"],
                        "notes": []}
                self.report(cell)
                continue
            if s in ("swap", "zswap") and self.swap_skip:
                cell = {"workload": w, "system": s, "ratio": r, "status": "skipped",
                        "reason": self.swap_skip, "notes": []}
                self.report(cell)
                continue
            cell = self.safe_run_cell(w, s, r)
            if cell["status"] == "oom":
                # The v1 memcg OOM killer fires now and then under a small
                # limit even with free swap; once is weather, twice is data.
                log("%s %s %d%%: OOM-killed by the kernel; one retry" % (w, s, r))
                cell = self.safe_run_cell(w, s, r)
                cell["notes"].append("OOM-killed once before this run")
            if s != "local":
                cell = self.repeat_cell(cell, w, s, r)
            if s == "local" and cell["status"] == "ok":
                cell["norm"] = 1.0
                # What the process holds beyond its working set: its peak
                # RSS (mapped library and program pages count: under a limit
                # they are charged to the group as soon as they are
                # reclaimed and fault back), or the cgroup's peak charge
                # (page tables, kernel objects) if that is larger.
                peak = max(cell.get("max_usage_bytes") or 0, cell.get("peak_rss_bytes", 0))
                cell["baseline_bytes"] = max(0, peak - cell["ws_bytes"])
                self.local[w] = cell
            self.report(cell)
        meta["loadavg_end"] = read_file("/proc/loadavg").split()[:3]
        return meta

    def repeat_cell(self, c, w, s, r):
        """--runs N: the cell runs N times in all, each run next to a fresh
        all-local run; its norm is the median of the pairs' throughput
        ratios, and the run with that ratio gives the cell's counters
        (repeat_paired())."""
        if c["status"] != "ok" or self.a.runs <= 1 or not c.get("throughput"):
            return c
        med, best = repeat_paired(c, self.a.runs, lambda: self.safe_run_cell(w, s, r),
                                  lambda: self.safe_run_cell(w, "local", 100),
                                  lambda x: x.get("throughput"), "all-local")
        if med is not None:
            best["norm"] = med
            best["slowdown"] = 1 / med
        return best

    def safe_run_cell(self, w, s, r):
        try:
            return self.run_cell(w, s, r)
        except Interrupted:
            raise
        except Exception as e:  # a harness bug must cost one cell, not the run
            for p in list(self.children):
                if not self.is_farmemd(p):
                    self.kill(p)
            return {"workload": w, "system": s, "ratio": r, "status": "fail",
                    "reason": "harness error: %r" % e, "notes": []}

    def report(self, c):
        self.cells.append(c)
        if self.a.out:  # after every cell, so that a crash keeps what was measured
            os.makedirs(self.a.out, exist_ok=True)
            with open(os.path.join(self.a.out, "results.partial.json"), "w") as f:
                json.dump({"cells": self.cells}, f)
        if c["status"] == "ok":
            extra = ""
            if "norm" in c and c["system"] != "local":
                extra = " norm %.3f" % c["norm"]
            if c.get("faults") is not None and c["system"] != "local":
                extra += " faults %d" % c.get("faults", 0)
            p99 = " p99 %.1fus" % c["p99_us"] if "p99_us" in c else ""
            log("%-9s %-11s %3d%%  ok  %.3fs %.4g %s%s%s" % (
                c["workload"], c["system"], c["ratio"], c.get("runtime_s", 0),
                c.get("throughput", 0), c.get("throughput_unit", ""), p99, extra))
        else:
            log("%-9s %-11s %3d%%  %s: %s" % (c["workload"], c["system"], c["ratio"],
                                            c["status"].upper(), c.get("reason", "")))


def repeat_paired(c, n, rerun, run_ref, value, ref_name):
    """--runs N, both sets: c (a finished cell) and n - 1 more runs
    (rerun()), each followed by a fresh reference run (run_ref()); value()
    is the figure compared (throughput, wall time). Returns the median of
    the pairs' ratios value(run) / value(reference) and the run with that
    ratio, which gets c's notes and every pair in "pairs" ([run's figure,
    reference's figure]); (None, c) when no pair ran. A run or reference
    that fails ends the series with a note in c."""
    runs = []
    for i in range(n):
        c2 = c if i == 0 else rerun()
        if c2["status"] != "ok" or not value(c2):
            c["notes"].append("repeat run %d ended %s: %s" % (
                i + 1, c2["status"], c2.get("reason", "")))
            break
        p = run_ref()
        if p["status"] != "ok" or not value(p):
            c["notes"].append("the %s run paired with run %d failed" % (ref_name, i + 1))
            break
        runs.append((value(c2) / value(p), c2, value(p)))
    if not runs:
        return None, c
    runs.sort(key=lambda x: x[0])
    ratio, best, _ = runs[(len(runs) - 1) // 2]
    best["notes"] = c["notes"] + [m for m in best["notes"] if m not in c["notes"]]
    best["pairs"] = [[value(x[1]), x[2]] for x in runs]
    return ratio, best


def proc_status_kib_meminfo():
    m = re.search(r"^MemTotal:\s+(\d+)", read_file("/proc/meminfo"), re.M)
    return int(m.group(1)) if m else 0


def cpu_model():
    m = re.search(r"^model name\s*:\s*(.*)$", read_file("/proc/cpuinfo"), re.M)
    return m.group(1).strip() if m else platform.machine()


# ---- output ------------------------------------------------------------------
CSV_FIELDS = ["workload", "system", "ratio", "status", "runtime_s", "throughput",
              "throughput_unit", "norm", "slowdown", "p50_us", "p99_us", "faults",
              "bytes_moved", "faults_remote", "faults_victim", "faults_zero", "bytes_read",
              "bytes_written", "pgmajfault", "pswpin", "pswpout", "zswpin", "zswpout",
              "budget_bytes", "limit_bytes", "ws_bytes", "peak_rss_bytes", "checksum", "wall_s",
              "reason"]


def write_outputs(out, meta, cells, fields=None, table=None, fix_row=None):
    """results.json, results.csv (fields, default CSV_FIELDS; fix_row(cell,
    row) may adjust a row) and table.md (table, default markdown_table())
    in out; returns the table."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "cells": cells}, f, indent=1)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields or CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for c in cells:
            row = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in c.items()}
            if fix_row:
                fix_row(c, row)
            w.writerow(row)
    if table is None:
        table = markdown_table(cells)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table)
    return table


def markdown_table(cells):
    """Normalized performance (throughput / all-local) per workload, system
    and ratio; p99 in brackets where the workload has one."""
    ratios = sorted({c["ratio"] for c in cells if c["system"] != "local"}, reverse=True)
    systems = [s for s in SYSTEMS if s != "local" and any(c["system"] == s for c in cells)]
    lines = ["| workload | all-local | system | " + " | ".join("%d%%" % r for r in ratios) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in ratios) + " |"]
    for w in WORKLOADS:
        local = next((c for c in cells if c["workload"] == w and c["system"] == "local"), None)
        if local is None:
            continue
        lt = "%.4g %s" % (local.get("throughput", 0), local.get("throughput_unit", ""))
        if "p99_us" in local:
            lt += " (p99 %.1f us)" % local["p99_us"]
        first = True
        for s in systems:
            row = []
            for r in ratios:
                c = next((c for c in cells if c["workload"] == w and c["system"] == s
                          and c["ratio"] == r), None)
                if c is None:
                    row.append("")
                elif c["status"] != "ok":
                    row.append(c["status"])
                else:
                    t = "%.2f" % c.get("norm", 0)
                    if "p99_us" in c:
                        t += " (%.0f us)" % c["p99_us"]
                    row.append(t)
            lines.append("| %s | %s | %s | %s |" % (w if first else "", lt if first else "", s,
                                                   " | ".join(row)))
            first = False
    paired = [len(c["pairs"]) for c in cells if c.get("pairs")]
    if paired:
        lines += ["", "Each farmem / swap figure: the median of %d runs' ratios, each run next to a "
                  "fresh all-local run (--runs)." % max(paired)]
    return "\n".join(lines) + "\n"


def cdf_points(buckets, scale_to_us):
    """[(x_us, cumulative fraction)] from [[upper_bound, count], ...]."""
    total = sum(n for _, n in buckets)
    if total == 0:
        return []
    pts, seen = [], 0
    for ub, n in buckets:
        if n == 0 or ub is None:
            seen += n
            continue
        seen += n
        pts.append((ub * scale_to_us, seen / total))
    return pts


def plot(out, cells, meta):
    try:
        subprocess.run(["gnuplot", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        log("gnuplot not found (Debian package gnuplot-nox): no plots")
        return []
    colors = {"fm-loopback": "#1f77b4", "fm-tcp": "#2ca02c", "fm-local": "#9467bd",
              "swap": "#d62728",
              "zswap": "#ff7f0e"}
    datdir = os.path.join(out, "data")
    os.makedirs(datdir, exist_ok=True)
    perf_plots = []  # (workload, gnuplot plot command)
    for w in WORKLOADS:
        series = []
        for s in SYSTEMS[1:]:
            pts = sorted((c["ratio"], c["norm"]) for c in cells
                         if c["workload"] == w and c["system"] == s and c["status"] == "ok"
                         and "norm" in c)
            if not pts or w == "faultlat":
                continue
            dat = os.path.join(datdir, "%s-%s.dat" % (w, s))
            with open(dat, "w") as f:
                f.write("".join("%d %.6f\n" % p for p in pts))
            series.append("'%s' using 1:2 with linespoints lw 2 pt 7 lc rgb '%s' title '%s'"
                          % (dat, colors[s], s))
        if series:
            series.insert(0, "1 with lines dt 2 lc rgb '#555555' title 'all-local'")
            perf_plots.append((w, "plot " + ", ".join(series)))
    cdf_series = []
    for c in cells:
        if c["workload"] != "faultlat" or c["status"] != "ok" or c["system"] == "local":
            continue
        for key, scale, label in (("hist_ns", 1e-3, "%s read (probe)"),
                                  ("fetch_hist_us", 1.0, "%s fetch (pager stats)")):
            if key not in c:
                continue
            pts = cdf_points(c[key], scale)
            if not pts:
                continue
            dat = os.path.join(datdir, "cdf-%s-%s.dat" % (c["system"], key))
            with open(dat, "w") as f:
                f.write("".join("%.4f %.6f\n" % p for p in pts))
            dt = "1" if key == "hist_ns" else "3"
            cdf_series.append("'%s' using 1:2 with steps lw 2 dt %s lc rgb '%s' title '%s'"
                              % (dat, dt, colors[c["system"]], label % c["system"]))
    cdf_ratio = next((c["ratio"] for c in cells if c["workload"] == "faultlat"
                      and c["system"] != "local"), 25)
    common = ("set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)';"
              " set ylabel 'performance / all-local (log)'; set xrange [20:105];"
              " set logscale y; set yrange [0.0005:3]; set format y '%g';"
              " set xtics (25, 50, 75, 100);")
    cdf_setup = ("set grid; set key bottom right font ',8'; set logscale x; set xrange [0.05:*];"
                 " set yrange [0:1]; set xlabel 'latency (us, log)'; set ylabel 'fraction';"
                 " set title 'fault latency, random reads at %d%% local';" % cdf_ratio)
    made = []
    script = ["set terminal pngcairo size 640,440 font 'sans,10'"]
    for w, cmd in perf_plots:
        png = os.path.join(out, "%s.png" % w)
        script += ["set output '%s'" % png, "reset", common, "set title '%s'" % w, cmd]
        made.append(png)
    if cdf_series:
        png = os.path.join(out, "faultlat-cdf.png")
        script += ["set output '%s'" % png, "reset", cdf_setup, "plot " + ", ".join(cdf_series)]
        made.append(png)
    # Everything on one page, for the README.
    n = len(perf_plots) + (1 if cdf_series else 0)
    if n:
        cols = 3
        rows = (n + cols - 1) // cols
        png = os.path.join(out, "eval.png")
        title = "farmem vs Linux swap: %s, %d cpus, %d GiB, load %s" % (
            meta.get("kernel", ""), meta.get("cpus", 0), meta.get("mem_total_kib", 0) // (1 << 20),
            "/".join(meta.get("loadavg_start", [])))
        script += ["set terminal pngcairo size %d,%d font 'sans,9'" % (cols * 480, rows * 340),
                   "set output '%s'" % png,
                   "set multiplot layout %d,%d title '%s'" % (rows, cols, title)]
        for w, cmd in perf_plots:
            script += ["reset", common, "set title '%s'" % w, cmd]
        if cdf_series:
            script += ["reset", cdf_setup, "plot " + ", ".join(cdf_series)]
        script += ["unset multiplot"]
        made.append(png)
    gp = os.path.join(datdir, "plots.gp")
    with open(gp, "w") as f:
        f.write("\n".join(script) + "\n")
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    if r.returncode != 0:
        log("gnuplot failed: %s" % r.stderr.strip()[-500:])
        return []
    return made


def listarg(v, allowed, default):
    """A comma-list option: its items, each one of allowed; default when empty."""
    if not v:
        return default
    items = [x for x in v.split(",") if x]
    bad = [x for x in items if x not in allowed]
    if bad:
        raise SystemExit("eval: unknown %s; choose from %s" % (",".join(bad), ",".join(allowed)))
    return items


def programs_main(a):
    """--set programs: the options, then bench/eval/programs.py runs it."""
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    import programs

    if not a.build_dir:
        raise SystemExit("eval: --build-dir is required (run.sh passes it)")
    if a.workloads:
        raise SystemExit("eval: --workloads is for --set micro; use --programs")

    a.programs = listarg(a.programs, programs.ALL_PROGRAMS, programs.PROGRAMS)
    a.systems = listarg(a.systems, programs.SYSTEMS,
                        ["local", "fm-tcp", "fm-local"] if a.quick
                        else ["local", "fm-tcp", "fm-local", "swap", "zswap"])
    a.systems = ["local"] + [s for s in a.systems if s != "local"]
    if a.ratios:
        try:
            a.ratios = sorted({int(x) for x in a.ratios.split(",")}, reverse=True)
        except ValueError:
            raise SystemExit("eval: --ratios wants integers, e.g. 100,70")
        if any(r < 1 or r > 100 for r in a.ratios):
            raise SystemExit("eval: --ratios must be percentages in 1..100")
    else:
        a.ratios = [100, 50] if a.quick else [100, 70, 50]
    if a.plain_runs is None:
        a.plain_runs = 1 if a.quick else 2
    if a.plain_runs < 1:
        raise SystemExit("eval: --plain-runs must be at least 1")
    if a.runs < 1:
        raise SystemExit("eval: --runs must be at least 1")
    if a.timeout_factor is None:
        a.timeout_factor = 10 if a.quick else 20
    if a.timeout_factor <= 0:
        raise SystemExit("eval: --timeout-factor must be positive")
    a.out = os.path.abspath(a.out or os.path.join(os.path.dirname(__file__), "results-programs"))
    a.build_dir = os.path.abspath(a.build_dir)
    return programs.main(a)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, ratios 100 and 50")
    ap.add_argument("--out", help="result directory (default bench/eval/results)")
    ap.add_argument("--build-dir")
    ap.add_argument("--replot", metavar="DIR",
                    help="only re-render table.md and the PNGs from DIR/results.json")
    ap.add_argument("--systems", help="comma list of " + ",".join(SYSTEMS))
    ap.add_argument("--workloads", help="comma list of " + ",".join(WORKLOADS))
    ap.add_argument("--ratios", help="comma list of local-memory percentages")
    ap.add_argument("--timeout", type=int, help="seconds per cell")
    ap.add_argument("--swapfile", help="swapfile path (default /var/tmp/farmem-eval-PID.swap)")
    ap.add_argument("--set", choices=["micro", "programs"], default="micro",
                    help="micro: the workloads above (default); programs: unmodified Debian "
                    "programs at the same peak RSS (bench/eval/programs.py)")
    ap.add_argument("--programs", help="--set programs: comma list of xz,gnu-sort,zstd (the default) and "
                    "python-dict,perl-hash,sqlite-mem (issue 17's small-object heaps)")
    ap.add_argument("--timeout-factor", type=float,
                    help="--set programs: a cell's timeout is max(this x plain wall, 60 s) "
                    "(default 20; --quick: 10, and 20 s)")
    ap.add_argument("--plain-runs", type=int,
                    help="--set programs: plain runs per program, the fastest counts "
                    "(default 2, --quick 1)")
    ap.add_argument("--runs", type=int, default=1,
                    help="runs per farmem / swap cell at each ratio, each next to a fresh plain "
                    "(all-local) run; the cell's ratio to plain is the median of the pairs' "
                    "ratios (default 1)")
    a = ap.parse_args()
    if a.set == "programs":
        if a.replot:
            sys.dont_write_bytecode = True
            import programs

            with open(os.path.join(a.replot, "results.json")) as f:
                d = json.load(f)
            print(programs.write_outputs(a.replot, d["meta"], d["cells"]))
            return 0
        return programs_main(a)
    if a.replot:
        with open(os.path.join(a.replot, "results.json")) as f:
            d = json.load(f)
        print(write_outputs(a.replot, d["meta"], d["cells"]))
        pngs = plot(a.replot, d["cells"], d["meta"])
        log("re-rendered %s" % ", ".join(os.path.basename(p) for p in pngs))
        return 0
    if not a.build_dir:
        raise SystemExit("eval: --build-dir is required (run.sh passes it)")

    a.systems = listarg(a.systems, SYSTEMS,
                        ["local", "fm-tcp", "swap"] if a.quick else SYSTEMS)
    if "local" not in a.systems:
        a.systems.insert(0, "local")  # the reference every cell is judged against
    a.workloads = listarg(a.workloads, WORKLOADS, WORKLOADS)
    if a.ratios:
        try:
            a.ratios = sorted({int(x) for x in a.ratios.split(",")}, reverse=True)
        except ValueError:
            raise SystemExit("eval: --ratios wants integers, e.g. 100,50")
        if any(r < 1 or r > 100 for r in a.ratios):
            raise SystemExit("eval: --ratios must be percentages in 1..100")
    else:
        a.ratios = [100, 50] if a.quick else [100, 75, 50, 25]
    a.timeout = a.timeout or (90 if a.quick else 60)
    if a.runs < 1:
        raise SystemExit("eval: --runs must be at least 1")
    a.out = os.path.abspath(a.out or os.path.join(os.path.dirname(__file__), "results"))
    a.build_dir = os.path.abspath(a.build_dir)

    h = Harness(a)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    t0 = time.time()
    meta = {}
    try:
        meta = h.run()
    except Interrupted as e:
        log("interrupted (%s): cleaning up" % e)
        return 130
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        h.cleanup()
    meta["elapsed_s"] = round(time.time() - t0, 1)
    table = write_outputs(a.out, meta, h.cells)
    try:
        os.unlink(os.path.join(a.out, "results.partial.json"))
    except OSError:
        pass
    pngs = plot(a.out, h.cells, meta)
    failed = [c for c in h.cells if c["status"] in ("fail", "timeout")]
    oom = [c for c in h.cells if c["status"] == "oom"]
    skipped = [c for c in h.cells if c["status"] == "skipped"]
    ok = [c for c in h.cells if c["status"] == "ok"]
    print()
    print(table)
    log("results in %s (results.json, results.csv, table.md%s)" % (
        a.out, ", " + ", ".join(os.path.basename(p) for p in pngs) if pngs else ""))
    log("load average at start %s, at end %s; %.0f s" % (
        "/".join(meta.get("loadavg_start", [])), "/".join(meta.get("loadavg_end", [])),
        meta["elapsed_s"]))
    if h.swap_skip:
        log("the swap baseline was SKIPPED: %s" % h.swap_skip)
    for c in oom:
        log("swap baseline OOM-killed twice (reported, not a harness failure): %s %s %d%%"
            % (c["workload"], c["system"], c["ratio"]))
    for c in failed:
        log("FAILED: %s %s %d%%: %s" % (c["workload"], c["system"], c["ratio"], c.get("reason")))
    print("eval: %d passed, %d failed, %d skipped" % (len(ok), len(failed), len(skipped) + len(oom)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
