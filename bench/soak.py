"""The soak (issue 10): the host kernel swapping hard to compcache for a long time, every page
checked, while the servers are watched for failed requests and memory growth.

Two phases, each MINUTES long:

  ram      `compcache serve --mlock` is the host's swap (nbdfuse -> loop -> swapon
           --discard=pages, the bench suite's `compcache` configuration). In a memory cgroup
           much smaller than its working set, tools/scan runs again and again with -V (a
           64-bit hash of every page checked after every pass), rotating through: cyclic
           with a dirtying write per page (every page swapped in and out every pass),
           use-once (fresh content every pass, freed with MADV_DONTNEED: swap-free and
           discard), and cyclic filled from real page dumps (data/pages-mixed.bin,
           tools/pagedump) when they exist. Alongside, a second `compcache serve` is driven by
           fio's nbd engine in a loop (four connections, random writes at 4 KiB and at mixed
           sizes with compressible buffers, and a trim/write mix, all verified with crc32c).
  backing  the same with `--backing FILE` and a `--mem-limit` far below what the pages need,
           on both servers: overflow writes and writeback to the file, reads and promotion
           back from it. The phase fails if bd_writes or bd_reads stay 0.

Every few seconds it samples both servers: VmRSS, VmLck, `compcache stat --json`
(mem_used_total, mem_reserve_free, failed_reads/writes, bd_*), the load average and the
cgroup's swap. At the end it reports the bytes verified (scan passes + fio verify reads),
mismatches, failed requests, and a leak check per server: the server's RSS minus the store's
own memory (mem_used_total + mem_reserve_free) must not grow between the first and the last
quarter of the phase (after a warm-up tenth) by more than --leak-tolerance.

    python3 -m bench.soak                          # 30 minutes per phase, both phases
    python3 -m bench.soak --minutes-per-phase 2    # smoke run, about 6 minutes in all
    python3 -m bench.soak --phases backing --out DIR --workdir DIR

Root. It takes the host-swap lock (/run/lock/compcache-host-swap.lock) itself for the whole
run (or uses it when started under `flock` on that file). Results: results.json and
results.md in --out (default bench/results/<UTC time>-soak/). Exit status 0 only if nothing
mismatched, no request failed, no run failed, no leak was seen and nothing is left behind.
Not part of scripts/test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import os
import select
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

from . import cgroup as cgroup_mod
from .exp_backing import CompcacheBackingSwap
from .fio_nbd import fio_global
from .parse import parse_proc_status_kib, parse_scan_output
from .runner import Progress
from .swapconf import CompcacheSwap, find_compcache, recompress_flag, recompression_as_asked
from .system import Ledger, System

MiB = 1 << 20
GiB = 1 << 30
PAGE = 4096
LOCK_PATH = "/run/lock/compcache-host-swap.lock"
PHASES = ("ram", "backing")
EXPORT_NAME = "compcache"

DEFAULTS = {
    "minutes_per_phase": 30.0,
    "cgroup_limit_mib": 256,  # the "machine" the scan runs in
    "scan_mib": 768,  # its working set: 3x the limit, so every pass goes through swap
    "scan_passes": 4,  # passes per scan run (rotating kinds); a run is cut at the phase's end
    "swap_device_mib": 2048,
    "swap_mem_limit_mib": 48,  # backing phase: the swap server's pool limit
    "fio_device_mib": 256,  # 4 jobs x 64 MiB
    "fio_jobs": 4,
    "fio_mem_limit_mib": 24,  # backing phase: the fio server's pool limit
    "fio_nice": 10,  # fio and its server yield the CPU to the swap path (2 shared cores)
    "sample_s": 5.0,
    "leak_tolerance_mib": 16,
    "server_args": [],  # more arguments for both servers (--server-args)
}

# fio jobs the loop rotates through. Each writes every block of its region once (fio's random
# map) and then reads and checks all of it; buffer_compress_percentage gives buffers that
# compress about as well as real pages (fio cannot fill its buffers from a page dump).
FIO_JOBS = {
    "randwrite-4k": """[randwrite-4k]
rw=randwrite
bs=4k
iodepth=16
verify=crc32c
do_verify=1
buffer_compress_percentage=55
buffer_compress_chunk=4096
""",
    "randwrite-mixed": """[randwrite-mixed]
rw=randwrite
bssplit=4k/40:8k/15:12k/10:64k/20:256k/15
iodepth=8
verify=crc32c
do_verify=1
buffer_compress_percentage=60
buffer_compress_chunk=512
""",
    "trimwrite": """[trimwrite]
rw=randtrimwrite
bs=16k
iodepth=1
verify=crc32c
do_verify=1
buffer_compress_percentage=50
""",
}


# ----------------------------------------------------------------------------------------
# Pure parts (unit-tested in bench/tests/test_soak.py)

def leak_check(samples: list, tolerance_bytes: int, warmup_frac: float = 0.1) -> dict:
    """Does a server's memory beyond its store grow?

    samples: [{"t": seconds, "rss": bytes, "store": bytes}] in time order, where store is the
    store's own memory (mem_used_total + mem_reserve_free). overhead = rss - store. The first
    `warmup_frac` of the time is dropped (slot-table pages, buffers and allocator arenas are
    touched for the first time then); of the rest, the median overhead of the last quarter is
    compared with that of the first quarter. leak = the growth exceeds tolerance_bytes. The
    least-squares slope (bytes per hour) is reported alongside, as a second view."""
    pts = [s for s in samples if s.get("rss") is not None and s.get("store") is not None]
    out = {"samples": len(pts), "tolerance_bytes": tolerance_bytes, "leak": False}
    if len(pts) < 8:
        out["verdict"] = f"too few samples ({len(pts)}) to judge"
        return out
    t0, t1 = pts[0]["t"], pts[-1]["t"]
    kept = [s for s in pts if s["t"] >= t0 + warmup_frac * (t1 - t0)]
    if len(kept) < 8:
        kept = pts
    q = max(1, len(kept) // 4)
    first = [s["rss"] - s["store"] for s in kept[:q]]
    last = [s["rss"] - s["store"] for s in kept[-q:]]
    growth = statistics.median(last) - statistics.median(first)
    ts = [s["t"] for s in kept]
    ys = [s["rss"] - s["store"] for s in kept]
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else 0.0
    rss = [s["rss"] for s in pts]
    out.update({
        "overhead_first_quarter_bytes": int(statistics.median(first)),
        "overhead_last_quarter_bytes": int(statistics.median(last)),
        "overhead_growth_bytes": int(growth),
        "overhead_slope_bytes_per_hour": int(slope * 3600),
        "rss_min_bytes": min(rss), "rss_max_bytes": max(rss), "rss_last_bytes": rss[-1],
        "store_last_bytes": pts[-1]["store"],
        "leak": growth > tolerance_bytes,
    })
    out["verdict"] = (f"LEAK: RSS beyond the store grew {growth / MiB:.1f} MiB (tolerance "
                      f"{tolerance_bytes / MiB:.0f} MiB)" if out["leak"] else
                      f"no leak: RSS beyond the store changed {growth / MiB:+.1f} MiB")
    return out


def parse_scan_progress(line: str):
    """One line of `scan -v` stderr -> ("pass", pass_number, ok) for a finished pass,
    ("mismatch", pass_number, page) for a reported bad page, or None."""
    f = line.split()
    if len(f) >= 3 and f[0] == "scan:" and f[1] == "pass" and "/" in f[2]:
        return ("pass", int(f[2].split("/")[0]), "MISMATCH" not in f[3:])
    if len(f) >= 6 and f[0] == "scan:" and f[1] == "MISMATCH" and f[2] == "pass" and f[4] == "page":
        return ("mismatch", int(f[3]), int(f[5]))
    return None


FAILED_KEYS = ("failed_reads", "failed_writes", "bd_errors", "invalid_io")


def failed_requests(stats: dict) -> int:
    return sum(int(stats.get(k) or 0) for k in FAILED_KEYS)


def recompress_asked(server_args: list) -> bool:
    """Whether the servers were started with background recompression on (without
    `--recompress`, the soak's servers are started with it off: `recompression_as_asked`)."""
    return recompress_flag(server_args) == "on"


def summarize(phases: dict, leftovers: list, interrupted: str | None = None, recompress: bool = False) -> dict:
    """Totals over the phases and the verdict, with every reason it failed; `recompress`: the
    servers were started with recompression on (`recompress_asked`)."""
    tot = {"scan_bytes_verified": 0, "fio_bytes_verified": 0, "mismatches": 0, "failed_requests": 0,
           "swap_bytes_in": 0, "swap_bytes_out": 0, "recompressions": 0}
    problems = []
    for name, ph in phases.items():
        if ph.get("error"):
            problems.append(f"{name}: {ph['error']}")
        scan, fio = ph.get("scan", {}), ph.get("fio", {})
        tot["scan_bytes_verified"] += scan.get("bytes_verified", 0)
        tot["fio_bytes_verified"] += fio.get("bytes_verified", 0)
        mism = scan.get("mismatches", 0) + fio.get("verify_failures", 0)
        tot["mismatches"] += mism
        if mism:
            problems.append(f"{name}: {scan.get('mismatches', 0)} scan page mismatch(es), "
                            f"{fio.get('verify_failures', 0)} fio verify failure(s)")
        for what, runs in (("scan", scan.get("failed_runs", [])), ("fio", fio.get("failed_runs", []))):
            if runs:
                problems.append(f"{name}: {len(runs)} {what} run(s) failed: {runs[0]}")
        for srv, st in ph.get("servers", {}).items():
            fr = failed_requests(st.get("final_stats", {}))
            tot["failed_requests"] += fr
            if fr:
                problems.append(f"{name}: {srv} server: {fr} failed request(s) "
                                + ", ".join(f"{k}={st['final_stats'].get(k)}" for k in FAILED_KEYS))
            if st.get("leak", {}).get("leak"):
                problems.append(f"{name}: {srv} server: {st['leak']['verdict']}")
            if st.get("died"):
                problems.append(f"{name}: {srv} server died: {st['died']}")
        for st in ph.get("servers", {}).values():
            tot["recompressions"] += int(st.get("final_stats", {}).get("recompress_done") or 0)
        if srv_sw := ph.get("servers", {}).get("swap", {}).get("final_stats"):
            tot["swap_bytes_in"] += int(srv_sw.get("num_reads") or 0) * PAGE
            tot["swap_bytes_out"] += int(srv_sw.get("num_writes") or 0) * PAGE
        if ph.get("kernel_errors"):
            problems.append(f"{name}: kernel logged {len(ph['kernel_errors'])} swap/loop error(s): "
                            f"{ph['kernel_errors'][0]}")
        for p in ph.get("checks_failed", []):
            problems.append(f"{name}: {p}")
    # Recompression asked for: the swap servers must have recompressed, over the whole soak. Only
    # the swap servers: fio keeps its server busy without a pause, and recompression backs off
    # while a device is busy (recompress_busy_skips). Not each phase: with the default idle age
    # (60 s) the backing phase's writeback moves the cold pages to the backing file before they
    # are idle that long in RAM, and a phase may rightly recompress nothing.
    swap_recompressed = sum(int(ph.get("servers", {}).get("swap", {}).get("final_stats", {}).get("recompress_done") or 0)
                            for ph in phases.values())
    if recompress and phases and not swap_recompressed:
        problems.append("recompression was asked for (--server-args), but no swap server recompressed a page")
    if leftovers:
        problems.append("left behind: " + ", ".join(leftovers))
    if interrupted:
        problems.append(f"interrupted ({interrupted}): the figures cover only what ran")
    tot["bytes_verified"] = tot["scan_bytes_verified"] + tot["fio_bytes_verified"]
    tot["problems"] = problems
    tot["ok"] = not problems
    return tot


def _gib(b) -> str:
    return f"{(b or 0) / GiB:.1f}"


def _mib(b) -> str:
    return "-" if b is None else f"{b / MiB:.1f}"


def rss_timeline(samples: list, rows: int = 8) -> list:
    """About `rows` samples evenly spaced in time (first and last included)."""
    if len(samples) <= rows:
        return list(samples)
    step = (len(samples) - 1) / (rows - 1)
    return [samples[round(i * step)] for i in range(rows)]


def markdown(results: dict) -> str:
    m = results.get("machine", {})
    s = results["summary"]
    p = results["params"]
    lines = [f"## Soak: {results.get('started_utc', '?')}, commit {str(m.get('git_commit', '?'))[:10]}",
             "",
             f"`{results.get('command', 'python3 -m bench.soak')}`: {p['minutes_per_phase']:g} minutes per phase; "
             f"scan {p['scan_mib']} MiB in a {p['cgroup_limit_mib']} MiB cgroup; fio {p['fio_jobs']} jobs on "
             f"{p['fio_device_mib']} MiB; backing phase limits {p['swap_mem_limit_mib']} MiB (swap server) and "
             f"{p['fio_mem_limit_mib']} MiB (fio server). Kernel {m.get('kernel')}, {m.get('cpus')} CPUs, "
             f"{(m.get('mem_total_kib') or 0) >> 20} GiB; the machine was shared (load average below).",
             "",
             f"**{'PASS' if s['ok'] else 'FAIL'}**: {_gib(s['bytes_verified'])} GiB verified "
             f"({_gib(s['scan_bytes_verified'])} GiB scan pages, {_gib(s['fio_bytes_verified'])} GiB fio), "
             f"{s['mismatches']} mismatches, {s['failed_requests']} failed requests; swap through compcache: "
             f"{_gib(s['swap_bytes_out'])} GiB out, {_gib(s['swap_bytes_in'])} GiB in"
             + (f"; servers started with `{' '.join(p['server_args'])}`: {s['recompressions']} pages recompressed"
                if p.get("server_args") else "") + ".",
             ""]
    for prob in s["problems"]:
        lines.append(f"- {prob}")
    if s["problems"]:
        lines.append("")
    lines += ["| phase | minutes | scan GiB verified (passes, runs) | fio GiB verified (runs) | mismatches "
              "| failed requests | swap out / in GiB | bd_writes / bd_reads (pages) | load avg (mean, max 1-min) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, ph in results["phases"].items():
        scan, fio = ph.get("scan", {}), ph.get("fio", {})
        sw = ph.get("servers", {}).get("swap", {}).get("final_stats", {})
        fs = ph.get("servers", {}).get("fio", {}).get("final_stats", {})
        fr = sum(failed_requests(x.get("final_stats", {})) for x in ph.get("servers", {}).values())
        la = ph.get("loadavg", {})
        lines.append(
            f"| {name} | {ph.get('minutes', 0):.1f} | {_gib(scan.get('bytes_verified'))} ({scan.get('passes', 0)}, "
            f"{scan.get('runs', 0)}) | {_gib(fio.get('bytes_verified'))} ({fio.get('runs', 0)}) "
            f"| {scan.get('mismatches', 0) + fio.get('verify_failures', 0)} | {fr} "
            f"| {_gib((sw.get('num_writes') or 0) * PAGE)} / {_gib((sw.get('num_reads') or 0) * PAGE)} "
            f"| swap {sw.get('bd_writes', 0)} / {sw.get('bd_reads', 0)}, fio {fs.get('bd_writes', 0)} / "
            f"{fs.get('bd_reads', 0)} | {la.get('mean', 0):.2f}, {la.get('max', 0):.2f} |")
    lines += ["", "Server memory (RSS - store = VmRSS minus mem_used_total + mem_reserve_free; the leak check "
              "compares its median over the first and last quarter after a warm-up tenth):", "",
              "| phase | server | RSS min / max / last MiB | VmLck last MiB | store last MiB | RSS - store, first -> last "
              "quarter MiB | slope MiB/h | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for name, ph in results["phases"].items():
        for srv, st in ph.get("servers", {}).items():
            lk = st.get("leak", {})
            lines.append(
                f"| {name} | {srv} | {_mib(lk.get('rss_min_bytes'))} / {_mib(lk.get('rss_max_bytes'))} / "
                f"{_mib(lk.get('rss_last_bytes'))} | {_mib(st.get('vmlck_last_bytes'))} | {_mib(lk.get('store_last_bytes'))} "
                f"| {_mib(lk.get('overhead_first_quarter_bytes'))} -> {_mib(lk.get('overhead_last_quarter_bytes'))} "
                f"| {_mib(lk.get('overhead_slope_bytes_per_hour'))} | {lk.get('verdict', '-')} |")
    for name, ph in results["phases"].items():
        tl = rss_timeline(ph.get("samples", []))
        if not tl:
            continue
        lines += ["", f"RSS over time, phase {name} (MiB; store = mem_used_total + mem_reserve_free):", "",
                  "| t (min) | swap RSS | swap store | fio RSS | fio store | cgroup swap | load 1-min |",
                  "|---|---|---|---|---|---|---|"]
        for x in tl:
            sw, fi = x.get("swap", {}), x.get("fio", {})
            lines.append(f"| {x['t'] / 60:.1f} | {_mib(sw.get('rss'))} | {_mib(sw.get('store'))} | {_mib(fi.get('rss'))} "
                         f"| {_mib(fi.get('store'))} | {_mib(x.get('cg_swap'))} | {x.get('load1', 0):.2f} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------
# The machine

class HostSwapLock:
    """flock on the shared host-swap lock for the whole run. When an ancestor already holds it
    (`flock LOCK python3 -m bench.soak`), the inherited descriptor is the same open file and
    locking it again succeeds at once; otherwise this waits for whoever holds it."""

    def __init__(self, path: str = LOCK_PATH, log=print):
        self.path = path
        self.log = log
        self.fd = None
        self.owned = False

    def _inherited(self):
        try:
            for name in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{name}") == os.path.realpath(self.path):
                        return int(name)
                except OSError:
                    continue
        except OSError:
            pass
        return None

    def __enter__(self):
        fd = self._inherited()
        if fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self.owned = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.log(f"waiting for the host-swap lock {self.path} (someone is swapping on the host)")
            fcntl.flock(fd, fcntl.LOCK_EX)
        self.fd = fd
        return self

    def __exit__(self, *exc):
        if self.fd is not None and self.owned:
            os.close(self.fd)  # releases the lock; an inherited one stays the ancestor's
        self.fd = None
        return False


class FioServer:
    """A second `compcache serve` on a Unix socket, for fio (not swap). Killed by its PID and
    its files removed on exit."""

    def __init__(self, system: System, ledger: Ledger, binary: str, workdir: str, size_bytes: int,
                 mem_limit: int | None = None, nice: int = 0, extra_args: tuple = ()):
        self.system, self.ledger, self.binary = system, ledger, binary
        self.dir = os.path.join(workdir, "fio-server")
        self.socket = os.path.join(self.dir, "nbd.sock")
        self.control = self.socket + ".ctl"
        self.backing = os.path.join(self.dir, "backing.img") if mem_limit else None
        self.argv = [binary, "serve", "--size", str(size_bytes), "--socket", self.socket, "--control", self.control]
        if mem_limit:
            self.argv += ["--mem-limit", str(mem_limit), "--backing", self.backing, "--backing-size", str(size_bytes)]
        self.argv += recompression_as_asked(extra_args) + list(extra_args)
        if nice:
            self.argv = ["nice", "-n", str(nice)] + self.argv  # nice execs: the PID is the server's
        self.proc = None
        self.log_file = None

    @property
    def uri(self):
        return f"nbd+unix:///{EXPORT_NAME}?socket={self.socket}"

    def __enter__(self):
        try:
            self.system.mkdir(self.dir)
            if self.backing:
                self.ledger.add("files", self.backing)
            self.log_file = self.system.open_log(os.path.join(self.dir, "server.log"))
            self.proc = self.system.spawn(self.argv, stdout=self.log_file, stderr=subprocess.STDOUT)
            self.ledger.add("pids", self.proc.pid)
            deadline = self.system.monotonic() + 30
            while not self.system.exists(self.socket):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"fio's compcache serve exited {self.proc.returncode}: {' '.join(self.argv)}")
                if self.system.monotonic() > deadline:
                    raise RuntimeError("fio's compcache serve did not create its socket within 30 s")
                self.system.sleep(0.05)
        except BaseException:
            self.__exit__()
            raise
        return self

    def stats(self) -> dict:
        try:
            return json.loads(self.system.run([self.binary, "stat", "--json", "--control", self.control], timeout=30))
        except Exception:
            return {}

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.pid in self.ledger.pids:
            if self.proc.poll() is None:
                self.system.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.system.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
            self.ledger.drop("pids", self.proc.pid)
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
        if self.backing and self.backing in self.ledger.files:
            if self.system.exists(self.backing):
                self.system.remove(self.backing)
            self.ledger.drop("files", self.backing)
        return False


def proc_mem(pid: int) -> dict:
    """VmRSS and VmLck of a process in bytes (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return {"rss": None, "vmlck": None}
    rss, lck = parse_proc_status_kib(text, "VmRSS"), parse_proc_status_kib(text, "VmLck")
    return {"rss": None if rss is None else rss * 1024, "vmlck": None if lck is None else lck * 1024}


STAT_KEYS = ("mem_used_total", "mem_used_max", "mem_reserve_free", "slot_table_bytes", "orig_data_size",
             "compr_data_size", "num_reads", "num_writes", "notify_free", "bd_count", "bd_reads", "bd_writes",
             "bd_space_bytes", "bd_overflow_pages", "bd_writeback_pages", "bd_promoted_pages",
             # Recompression (--server-args "--recompress on"): absent from a server without it.
             "recompress_done", "recompress_rejected", "recomp_pages", "recomp_dict_pages", "dict_version",
             "recompress_cpu_ms", "recompress_busy_skips") + FAILED_KEYS


class Watcher(threading.Thread):
    """Samples both servers, the cgroup and the load average every `interval` seconds."""

    def __init__(self, servers: dict, cgroup, interval: float, t0: float):
        super().__init__(daemon=True)
        self.servers = servers  # name -> (pid, stats callable)
        self.cgroup = cgroup
        self.interval = interval
        self.t0 = t0
        self.samples: list = []
        self.stop_event = threading.Event()

    def sample(self) -> dict:
        x = {"t": round(time.monotonic() - self.t0, 1)}
        try:
            with open("/proc/loadavg") as f:
                x["load1"] = float(f.read().split()[0])
        except OSError:
            pass
        for name, (pid, stats) in self.servers.items():
            st = stats() or {}
            mem = proc_mem(pid)
            rec = {k: st.get(k) for k in STAT_KEYS}
            rec.update(mem)
            if st.get("mem_used_total") is not None:
                rec["store"] = int(st["mem_used_total"]) + int(st.get("mem_reserve_free") or 0)
            x[name] = rec
        if self.cgroup is not None:
            try:
                x["cg_swap"] = self.cgroup.usage().get("swap_bytes")
            except Exception:
                pass
        self.samples.append(x)
        return x

    def run(self):
        while not self.stop_event.wait(self.interval):
            self.sample()

    def stop(self):
        self.stop_event.set()
        self.join(timeout=60)


class FioLoop(threading.Thread):
    """Runs the fio jobs in turn against the fio server until told to stop. Each run is one
    fio process in its own session, killed by PID if the soak is interrupted."""

    def __init__(self, uri: str, workdir: str, job_mib: int, jobs: int, log, nice: int = 0):
        super().__init__(daemon=True)
        self.uri, self.workdir, self.job_mib, self.jobs, self.log = uri, workdir, job_mib, jobs, log
        self.nice = nice
        self.stop_event = threading.Event()
        self.proc = None
        self.result = {"runs": 0, "bytes_verified": 0, "bytes_written": 0, "verify_failures": 0,
                       "failed_runs": [], "by_job": {}}

    def run(self):
        names = list(FIO_JOBS)
        i = 0
        while not self.stop_event.is_set():
            name = names[i % len(names)]
            i += 1
            self._one(name, i)

    def _one(self, name: str, i: int) -> None:
        job = os.path.join(self.workdir, f"{name}.fio")
        out = os.path.join(self.workdir, f"{name}.json")
        with open(job, "w") as f:
            f.write(fio_global(self.uri, self.job_mib, self.jobs) + FIO_JOBS[name])
        if os.path.exists(out):
            os.remove(out)
        argv = ["nice", "-n", str(self.nice), "fio", "--output-format=json", f"--output={out}", job]
        self.proc = subprocess.Popen(argv, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        _, err = self.proc.communicate()
        rc = self.proc.returncode
        self.proc = None
        if self.stop_event.is_set() and rc < 0:
            return  # killed at the end of the soak: not counted either way
        body = open(out).read() if os.path.exists(out) else ""
        try:
            data = json.loads(body[body.index("{"):])
            jobs = {j["jobname"]: j for j in data["jobs"]}
        except (ValueError, KeyError):
            jobs = {}
        j = jobs.get(name)
        text = err.decode(errors="replace")
        verify_bad = "verify" in text.lower() and ("bad" in text.lower() or "fail" in text.lower())
        if rc != 0 or j is None or j.get("error"):
            if verify_bad:
                self.result["verify_failures"] += 1
            self.result["failed_runs"].append(f"fio {name} run {i}: exit {rc}, error "
                                              f"{j.get('error') if j else '?'}: {text.strip()[-600:]}")
            self.log(f"fio {name} run {i} FAILED (exit {rc}): {text.strip()[-300:]}")
            return
        self.result["runs"] += 1
        self.result["bytes_verified"] += j["read"]["io_bytes"]
        self.result["bytes_written"] += j["write"]["io_bytes"]
        b = self.result["by_job"].setdefault(name, {"runs": 0, "bytes_verified": 0})
        b["runs"] += 1
        b["bytes_verified"] += j["read"]["io_bytes"]

    def stop(self, kill: bool, grace_s: float = 300):
        """Lets the run in progress finish (counted) unless `kill`, or it takes over grace_s."""
        self.stop_event.set()
        if not kill:
            self.join(timeout=grace_s)
        p = self.proc
        if self.is_alive() and p is not None and p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.join(timeout=60)


def scan_rotation(scan_bin: str, mib: int, passes: int, pages_file: str | None) -> list:
    """The scan command lines a phase cycles through (every one verifies every page, every pass)."""
    base = [scan_bin, "-V", "-v"]
    rot = [("cyclic-dirty", base + ["-m", "cyclic", "-w"]), ("once", base + ["-m", "once", "-w"])]
    if pages_file:
        rot.append(("cyclic-pages", base + ["-m", "cyclic", "-w", "-p", pages_file]))
    return [(name, argv + [str(mib), str(passes)]) for name, argv in rot]


def run_scan(cg, argv: list, mib: int, deadline: float, seed: int) -> dict:
    """One scan run in the cgroup, its stderr read as it goes, killed at the deadline. Counts
    the passes that finished (each verified every page) and the mismatches reported."""
    argv = argv[:1] + ["-s", str(seed)] + argv[1:]
    before = cg.oom_kills()
    proc = subprocess.Popen(cg.wrap(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    r = {"passes_ok": 0, "passes_bad": 0, "mismatch_lines": [], "cut": False}
    err_tail = []
    buf = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                r["cut"] = True
                os.kill(proc.pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([proc.stderr], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                ev = parse_scan_progress(line)
                if ev and ev[0] == "pass":
                    r["passes_ok" if ev[2] else "passes_bad"] += 1
                elif ev and ev[0] == "mismatch":
                    r["mismatch_lines"].append(line)
                elif line.strip():
                    err_tail = (err_tail + [line])[-20:]
        out = proc.stdout.read().decode(errors="replace")
    finally:
        proc.kill()  # (Popen sends nothing to a process it has already reaped)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    r["returncode"] = proc.returncode
    r["oom_kills"] = cg.oom_kills() - before
    r["bytes_verified"] = r["passes_ok"] * mib * MiB
    try:
        r["summary"] = parse_scan_output(out)
        r["mismatches"] = int(r["summary"].get("mismatches", 0))
    except ValueError:
        r["summary"] = None
        r["mismatches"] = len(r["mismatch_lines"])  # a lower bound: scan names at most 10 a pass
    if not r["cut"] and proc.returncode != 0 and not r["mismatches"]:
        r["failure"] = (f"exit {proc.returncode}{' (OOM kill)' if r['oom_kills'] else ''}: "
                        + " | ".join(err_tail[-5:]))
    elif r["cut"] and r["oom_kills"]:
        r["failure"] = f"OOM kill in the cgroup ({r['oom_kills']})"
    r["stderr_tail"] = err_tail
    return r


def dmesg_lines() -> list:
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    except Exception:
        return []


def _dmesg_time(line: str) -> float | None:
    """The timestamp of a dmesg line ("[16563.060773] ..."), or None."""
    if line.startswith("["):
        try:
            return float(line[1:line.index("]")])
        except ValueError:
            return None
    return None


def new_kernel_errors(before: list, after: list, devices: list) -> list:
    """Lines logged since `before` that report an I/O or swap error on one of `devices`
    (e.g. "loop3", "Write-error on swap-device"). The kernel's ring buffer drops its oldest
    lines as new ones come, so `after` need not start with `before`: a line is new when it is
    stamped later than the last line of `before`."""
    last = next((t for t in map(_dmesg_time, reversed(before)) if t is not None), None)
    if last is None:
        new = after[len(before):]
    else:
        new = [line for line in after if (_dmesg_time(line) or 0.0) > last]
    out = []
    for line in new:
        low = line.lower()
        if ("swap" in low and "error" in low) or any(d in line and "error" in low for d in devices):
            out.append(line.strip())
    return out


def _loadavg_stats(samples: list) -> dict:
    v = [s["load1"] for s in samples if "load1" in s]
    return {"mean": round(statistics.fmean(v), 2), "max": max(v)} if v else {}


def run_phase(ph: dict, name: str, p: dict, system: System, ledger: Ledger, log, workdir: str, compcache_bin: str,
              scan_bin: str, pages_file: str | None, cg_detected) -> dict:
    """Runs one phase, filling `ph` as it goes (so an interrupted phase keeps what it saw)."""
    ph.update({"phase": name, "checks_failed": []})
    pdir = os.path.join(workdir, name)
    system.mkdir(pdir)
    size = p["swap_device_mib"] * MiB
    if name == "backing":
        swap = CompcacheBackingSwap(system, ledger, pdir, size, compcache_bin, p["swap_mem_limit_mib"] * MiB,
                                    extra_args=p["server_args"])
        fio_limit = p["fio_mem_limit_mib"] * MiB
    else:
        swap = CompcacheSwap(system, ledger, pdir, size, compcache_bin, extra_args=p["server_args"])
        fio_limit = None
    fio_srv = FioServer(system, ledger, compcache_bin, pdir, p["fio_device_mib"] * MiB, fio_limit, p["fio_nice"],
                        extra_args=p["server_args"])
    cg = cgroup_mod.MemoryCgroup(system, ledger, f"compcache-soak-{os.getpid()}-{name}", p["cgroup_limit_mib"] * MiB,
                                 allow_swap=True, swappiness=100, detected=cg_detected)
    fio_dir = os.path.join(pdir, "fio")
    system.mkdir(fio_dir)
    dmesg0 = dmesg_lines()
    watcher = fio = None
    log(f"phase {name}: setting up ({swap.label}; fio server {p['fio_device_mib']} MiB"
        f"{f', --mem-limit {fio_limit >> 20} MiB + backing' if fio_limit else ''})")
    with swap, fio_srv, cg:
        ph["swap_info"] = dict(swap.info)
        ph["fio_server_argv"] = fio_srv.argv
        t0 = time.monotonic()
        deadline = t0 + p["minutes_per_phase"] * 60
        watcher = Watcher({"swap": (swap.server.pid, swap.stats), "fio": (fio_srv.proc.pid, fio_srv.stats)},
                          cg, p["sample_s"], t0)
        watcher.sample()
        watcher.start()
        fio = FioLoop(fio_srv.uri, fio_dir, p["fio_device_mib"] // p["fio_jobs"], p["fio_jobs"], log, p["fio_nice"])
        fio.start()
        scan = {"runs": 0, "passes": 0, "bytes_verified": 0, "mismatches": 0, "failed_runs": [], "by_kind": {},
                "mismatch_lines": []}
        rot = scan_rotation(scan_bin, p["scan_mib"], p["scan_passes"], pages_file)
        try:
            i = failed_in_a_row = 0
            while time.monotonic() < deadline:
                kind, argv = rot[i % len(rot)]
                i += 1
                r = run_scan(cg, argv, p["scan_mib"], deadline, seed=1000 * PHASES.index(name) + i)
                scan["runs"] += 1
                scan["passes"] += r["passes_ok"] + r["passes_bad"]
                scan["bytes_verified"] += r["bytes_verified"]
                scan["mismatches"] += r["mismatches"]
                scan["mismatch_lines"] += r["mismatch_lines"][:20]
                k = scan["by_kind"].setdefault(kind, {"runs": 0, "passes": 0, "bytes_verified": 0})
                k["runs"] += 1
                k["passes"] += r["passes_ok"]
                k["bytes_verified"] += r["bytes_verified"]
                if r.get("failure"):
                    scan["failed_runs"].append(f"scan {kind} run {i}: {r['failure']}")
                    failed_in_a_row += 1
                else:
                    failed_in_a_row = 0
                last = watcher.samples[-1] if watcher.samples else {}
                log(f"phase {name}: scan {kind} run {i}: {r['passes_ok']} passes ok"
                    f"{', CUT at the deadline' if r['cut'] else ''}{', ' + r['failure'] if r.get('failure') else ''}; "
                    f"{r['mismatches']} mismatches; total {scan['bytes_verified'] / GiB:.1f} GiB scan + "
                    f"{fio.result['bytes_verified'] / GiB:.1f} GiB fio verified; swap server RSS "
                    f"{_mib(last.get('swap', {}).get('rss'))} MiB, load {last.get('load1', '?')}")
                for nm, (pid, _) in watcher.servers.items():
                    if not system.pid_alive(pid):
                        raise RuntimeError(f"the {nm} server (pid {pid}) died")
                if failed_in_a_row >= 3:
                    raise RuntimeError(f"scan failed {failed_in_a_row} runs in a row: {scan['failed_runs'][-1]}")
        finally:
            ph["minutes"] = round((time.monotonic() - t0) / 60, 2)
            fio.stop(kill=False if time.monotonic() >= deadline else True)
            watcher.stop()
            ph["samples"] = watcher.samples
            final = {"swap": swap.stats(), "fio": fio_srv.stats()}
            ph["scan"] = scan
            ph["fio"] = fio.result
            ph["loadavg"] = _loadavg_stats(watcher.samples)
            ph["servers"] = {}
            for nm in ("swap", "fio"):
                pts = [{"t": s["t"], "rss": s.get(nm, {}).get("rss"), "store": s.get(nm, {}).get("store")}
                       for s in watcher.samples]
                st = {"final_stats": {k: final[nm].get(k) for k in STAT_KEYS},
                      "leak": leak_check(pts, p["leak_tolerance_mib"] * MiB)}
                lck = [s.get(nm, {}).get("vmlck") for s in watcher.samples if s.get(nm, {}).get("vmlck") is not None]
                st["vmlck_last_bytes"] = lck[-1] if lck else None
                pid = watcher.servers[nm][0]
                if not system.pid_alive(pid):
                    st["died"] = f"pid {pid} is gone"
                ph["servers"][nm] = st
            if name == "backing":
                for nm in ("swap", "fio"):
                    fs = ph["servers"][nm]["final_stats"]
                    if not fs.get("bd_writes") or not fs.get("bd_reads"):
                        ph["checks_failed"].append(f"{nm} server: the backing file was not exercised "
                                                   f"(bd_writes {fs.get('bd_writes')}, bd_reads {fs.get('bd_reads')})")
            loop = swap.info.get("loop_device", "")
            ph["kernel_errors"] = new_kernel_errors(dmesg0, dmesg_lines(), [os.path.basename(loop)] if loop else [])
    log(f"phase {name}: torn down")
    return ph


def preflight(system: System, compcache_bin) -> list:
    from .suite import preflight as suite_preflight

    problems = suite_preflight(system, ["scan", "fio"], ["compcache"], compcache_bin)
    if not compcache_bin:
        problems.append("compcache binary not found: cargo build --release -p compcache (or COMPCACHE_BIN)")
    if system.which("fio"):
        p = subprocess.run(["fio", "--enghelp=nbd"], capture_output=True, text=True)
        if p.returncode != 0 or "uri" not in p.stdout:
            problems.append("this fio has no nbd engine (Debian's fio 3.33 has it)")
    return problems


def main(argv=None) -> int:
    from .suite import REPO_ROOT, Interrupted, _on_sigterm, build_scan, machine_record, start_results

    ap = argparse.ArgumentParser(prog="python3 -m bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes-per-phase", type=float, default=DEFAULTS["minutes_per_phase"],
                    help="length of each phase (default 30; 2 for a smoke run)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {','.join(PHASES)}")
    ap.add_argument("--scan-mib", type=int, default=DEFAULTS["scan_mib"])
    ap.add_argument("--cgroup-limit-mib", type=int, default=DEFAULTS["cgroup_limit_mib"])
    ap.add_argument("--pages", default=None, metavar="FILE",
                    help="real page dump for the third scan kind (default data/pages-mixed.bin if present)")
    ap.add_argument("--fio-nice", type=int, default=DEFAULTS["fio_nice"],
                    help="nice value of fio and its server (default 10: the kernel's swap path comes first)")
    ap.add_argument("--leak-tolerance-mib", type=float, default=DEFAULTS["leak_tolerance_mib"])
    ap.add_argument("--server-args", default="", metavar="ARGS",
                    help="more arguments for both `compcache serve`s, e.g. \"--recompress on --recompress-idle 5\" "
                         "(the results then count recompressions)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--workdir", default="/var/tmp/compcache-soak")
    a = ap.parse_args(argv)
    phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    bad = [x for x in phases if x not in PHASES]
    if bad or not phases:
        ap.error(f"--phases: unknown {', '.join(bad)} (choose from {', '.join(PHASES)})")
    p = dict(DEFAULTS, minutes_per_phase=a.minutes_per_phase, scan_mib=a.scan_mib,
             cgroup_limit_mib=a.cgroup_limit_mib, fio_nice=a.fio_nice, leak_tolerance_mib=a.leak_tolerance_mib,
             server_args=shlex.split(a.server_args))
    pages = a.pages or os.path.join(REPO_ROOT, "data", "pages-mixed.bin")
    pages = os.path.abspath(pages) if os.path.exists(pages) else None
    if a.pages and not pages:
        ap.error(f"--pages {a.pages}: no such file (tools/pagedump/ensure-data.sh makes data/pages-*.bin)")
    system = System()
    compcache_bin = find_compcache(REPO_ROOT)
    started = start_results("bench.soak", preflight(system, compcache_bin), a.out, "soak")
    if started is None:
        return 2
    stamp, out_dir = started
    workdir = os.path.join(a.workdir, stamp)
    system.mkdir(workdir)
    progress, ledger = Progress(), Ledger()
    results = {"suite": "compcache soak", "started_utc": dt.datetime.utcnow().isoformat(timespec="seconds") + "Z",
               "command": " ".join(["python3 -m bench.soak"] + (argv if argv is not None else sys.argv[1:])),
               "params": p, "pages_file": pages, "phases": {},
               "machine": machine_record(system, compcache_bin)}
    scan_bin = build_scan(system)
    old = signal.signal(signal.SIGTERM, _on_sigterm)  # raises Interrupted: every `with` tears down
    rc = 0
    try:
        with HostSwapLock(log=progress):
            progress(f"host-swap lock {LOCK_PATH} held")
            others = [s["filename"] for s in results["machine"].get("swaps_at_start", [])]
            if others:
                progress("warning: other swap devices are active; the kernel may also use them: " + ", ".join(others))
            for name in phases:
                ph = results["phases"][name] = {}
                try:
                    run_phase(ph, name, p, system, ledger, progress, workdir, compcache_bin, scan_bin, pages,
                              cgroup_mod.detect(system))
                except (Interrupted, KeyboardInterrupt):
                    raise
                except Exception as e:
                    ph["error"] = f"{e.__class__.__name__}: {e}"
                    progress(f"phase {name} FAILED: {e}")
                _save(results, out_dir)
    except (Interrupted, KeyboardInterrupt) as e:
        progress(f"interrupted ({e or 'Ctrl-C'}); everything set up has been torn down")
        results["interrupted"] = str(e) or "Ctrl-C"
        rc = 130
    finally:
        signal.signal(signal.SIGTERM, old)
        results["leftovers"] = ledger.leftovers(system)
        results["finished_utc"] = dt.datetime.utcnow().isoformat(timespec="seconds") + "Z"
        try:
            results["machine"]["loadavg_at_end"] = system.read("/proc/loadavg").split()[:3]
        except OSError:
            pass
        results["summary"] = summarize(results["phases"], results["leftovers"], results.get("interrupted"),
                                       recompress_asked(results["params"]["server_args"]))
        _save(results, out_dir)
        md = markdown(results)
        with open(os.path.join(out_dir, "results.md"), "w") as f:
            f.write(md)
        print(md)
        progress(f"results in {out_dir}")
    if rc:
        return rc
    return 0 if results["summary"]["ok"] else 1


def _save(results: dict, out_dir: str) -> None:
    tmp = os.path.join(out_dir, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, default=str)
    os.replace(tmp, os.path.join(out_dir, "results.json"))


__all__ = ["leak_check", "summarize", "parse_scan_progress", "markdown", "main"]

if __name__ == "__main__":
    sys.exit(main())
