"""One run of the suite: preflight, machine record, experiments, results, cleanup check."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys

from . import cgroup as cgroup_mod
from . import exp_app, exp_fio, exp_random, exp_scan, exp_zcache, params as params_mod
from .context import Context
from .parse import parse_proc_swaps
from .runner import Progress
from .swapconf import ALL_CONFIGS, find_compcache, make_config
from .system import Ledger, System

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = ("scan", "fio", "app", "zcache", "random")
# What `run` does without --experiments: zcache (seed 003's cache, ~8 more minutes in --quick)
# and random (issue 30's random-access swap, 10-12 minutes) run only when named.
DEFAULT_EXPERIMENTS = ("scan", "fio", "app")
BASE_TOOLS = ("mkswap", "swapon", "swapoff", "make", "gcc")
EXPERIMENT_TOOLS = {"fio": ("fio",), "app": ("/usr/bin/python3",), "scan": (), "random": ("/usr/bin/python3",),
                    "zcache": ("fio", "mkfs.ext4", "truncate", "cp", "mount", "umount", "df", "losetup", "nbdkit",
                               "nbdfuse", "fusermount3")}
APT_HINT = {"fio": "fio", "nbdkit": "nbdkit", "nbdfuse": "libnbd-bin", "fusermount3": "fuse3", "gcc": "gcc",
            "make": "make", "losetup": "mount", "fallocate": "util-linux", "/usr/bin/python3": "python3",
            "mkfs.ext4": "e2fsprogs", "mount": "mount", "umount": "mount", "truncate": "coreutils", "cp": "coreutils",
            "df": "coreutils"}


def start_results(prog: str, problems: list, out: str | None, kind: str) -> tuple[str, str] | None:
    """The start of a standalone experiment (`bench.exp_backing`, `bench.soak`): None, after
    saying why on stderr, when the preflight found `problems`; else the run's UTC stamp and
    its results directory (`out`, or bench/results/<stamp>-<kind>), made."""
    if problems:
        print(f"{prog}: refusing to start:\n  " + "\n  ".join(problems), file=sys.stderr)
        return None
    stamp = dt.datetime.utcnow().strftime("%Y%m%dT%H%M%SZ")
    out_dir = out or os.path.join(REPO_ROOT, "bench", "results", f"{stamp}-{kind}")
    os.makedirs(out_dir, exist_ok=True)
    return stamp, out_dir


class Interrupted(BaseException):
    """SIGTERM, turned into an exception so that every context manager tears down."""


def _on_sigterm(signum, frame):
    raise Interrupted(f"signal {signum}")


def preflight(system: System, experiments: list, configs: list, compcache_bin) -> list[str]:
    """Problems that stop the run before anything is touched: not root, missing tools, no
    memory cgroup. Returns messages; empty means go."""
    problems = []
    if not system.is_root():
        problems.append("must run as root: it creates cgroups, swap devices, loop devices and zram devices")
    need = set(BASE_TOOLS)
    for e in experiments:
        need.update(EXPERIMENT_TOOLS[e])
    for c in configs:
        cfg = make_config(c, system, Ledger(), "/nonexistent", 0, compcache_bin)
        if cfg.unavailable() is None:
            need.update(cfg.tools)
    for tool in sorted(need):
        found = system.exists(tool) if tool.startswith("/") else system.which(tool)
        if not found:
            problems.append(f"required tool missing: {tool} (Debian package {APT_HINT.get(tool, tool)}; "
                            "run scripts/install-deps)")
    if cgroup_mod.detect(system) is None:
        problems.append("no memory cgroup controller (v1 /sys/fs/cgroup/memory or v2 with memory enabled)")
    return problems


def _cmd_version(argv) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        lines = (p.stdout or p.stderr).strip().splitlines()
        return lines[0] if lines else f"(no output, exit {p.returncode})"
    except Exception as e:  # recorded, not fatal
        return f"unavailable ({e.__class__.__name__})"


def machine_record(system: System, compcache_bin) -> dict:
    rec = {"hostname": platform.node(), "kernel": platform.release(), "kernel_version": platform.version(),
           "arch": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        for line in system.read("/proc/cpuinfo").splitlines():
            if line.startswith("model name"):
                rec["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in system.read("/proc/meminfo").splitlines():
            if line.startswith("MemTotal:"):
                rec["mem_total_kib"] = int(line.split()[1])
    except OSError:
        pass
    rec["cgroup"] = list(cgroup_mod.detect(system) or ())
    try:  # how busy the shared machine was: read the results in its light
        rec["loadavg_at_start"] = system.read("/proc/loadavg").split()[:3]
    except OSError:
        pass
    rec["versions"] = {
        "fio": _cmd_version(["fio", "--version"]),
        "nbdkit": _cmd_version(["nbdkit", "--version"]),
        "nbdfuse": _cmd_version(["nbdfuse", "--version"]),
        "gcc": _cmd_version(["gcc", "--version"]),
        "compcache": _cmd_version([compcache_bin, "--version"]) if compcache_bin else "not built",
    }
    try:
        import matplotlib

        rec["versions"]["matplotlib"] = matplotlib.__version__
    except ImportError:
        rec["versions"]["matplotlib"] = "not installed"
    rec["git_commit"] = _cmd_version(["git", "-C", REPO_ROOT, "rev-parse", "HEAD"])
    zs = "/sys/module/zswap/parameters"
    if system.exists(zs):
        rec["zswap"] = {p: system.read(f"{zs}/{p}").strip() for p in ("enabled", "compressor", "max_pool_percent")
                        if system.exists(f"{zs}/{p}")}
    try:
        rec["swaps_at_start"] = parse_proc_swaps(system.read("/proc/swaps"))
    except OSError:
        rec["swaps_at_start"] = []
    return rec


def build_scan(system: System) -> str:
    d = os.path.join(REPO_ROOT, "tools", "scan")
    system.run(["make", "-s", "-C", d, "scan"])
    return os.path.join(d, "scan")


def run_suite(profile: str, experiments: list, configs: list, out_dir: str, workdir: str,
              system: System | None = None, fio_configs: list | None = None, app_backend: str | None = None,
              overrides: dict | None = None) -> dict:
    system = system or System()
    compcache_bin = find_compcache(REPO_ROOT)
    problems = preflight(system, experiments, configs, compcache_bin)
    if problems:
        raise SystemExit("bench: refusing to start:\n  " + "\n  ".join(problems))
    p = params_mod.get(profile)
    for exp, kv in (overrides or {}).items():
        p[exp].update(kv)
    progress = Progress()
    ledger = Ledger()
    os.makedirs(out_dir, exist_ok=True)
    system.mkdir(workdir)
    results = {
        "suite": "compcache bench", "profile": profile, "started_utc": dt.datetime.utcnow().isoformat() + "Z",
        "command": None, "machine": machine_record(system, compcache_bin), "configs": configs,
        "experiments": {},
    }
    if results["machine"]["swaps_at_start"]:
        progress("warning: swap devices of others are active; the kernel may also use them for our cgroups: "
                 + ", ".join(s["filename"] for s in results["machine"]["swaps_at_start"]))
    ctx = Context(system, ledger, progress, workdir, REPO_ROOT, configs, build_scan(system), compcache_bin,
                  cgroup_mod.detect(system))
    compcache_ok = ctx.config("compcache", 0).unavailable() is None
    results["machine"]["compcache_usable"] = compcache_ok
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if "scan" in experiments:
            progress(f"experiment scan (seed 004), configs: {', '.join(configs)}")
            results["experiments"]["scan"] = exp_scan.run(ctx, p["scan"])
            _save(results, out_dir)
        if "fio" in experiments:
            with_cfg = fio_configs or ["noswap", "compcache" if compcache_ok else "zram-lz4"]
            progress(f"experiment fio (seeds 000, 003), configs: {', '.join(with_cfg)}")
            results["experiments"]["fio"] = exp_fio.run(ctx, p["fio"], with_cfg)
            _save(results, out_dir)
        if "app" in experiments:
            backend = app_backend or ("compcache" if compcache_ok else "zram-lz4")
            progress(f"experiment app cycle (seeds 001, 002), compressed device: {backend}")
            results["experiments"]["app"] = exp_app.run(ctx, p["app"], backend)
            _save(results, out_dir)
        if "zcache" in experiments:
            progress(f"experiment zcache (seed 003), variants {', '.join(p['zcache']['variants'])}, configs: "
                     f"{', '.join(p['zcache']['configs'])}")
            results["experiments"]["zcache"] = exp_zcache.run(ctx, p["zcache"], compcache_bin)
            _save(results, out_dir)
        if "random" in experiments:
            progress(f"experiment random (issue 30), {p['random']['rounds']} rounds, configs: "
                     f"{', '.join(p['random']['configs'])}")
            from .soak import HostSwapLock

            results["experiments"]["random"] = exp_random.run(ctx, p["random"], HostSwapLock(log=progress))
            _save(results, out_dir)
    finally:
        signal.signal(signal.SIGTERM, old)
        left = ledger.leftovers(system)
        results["leftovers"] = left
        results["finished_utc"] = dt.datetime.utcnow().isoformat() + "Z"
        results["elapsed_s"] = round(progress.elapsed(), 1)
        try:
            results["machine"]["loadavg_at_end"] = system.read("/proc/loadavg").split()[:3]
        except OSError:
            pass
        _save(results, out_dir)
        if left:
            progress("ERROR: left behind: " + ", ".join(left))
        else:
            progress("cleanup verified: no swap, loop, mount, zram device, cgroup or process of ours is left")
    return results


def _save(results: dict, out_dir: str) -> None:
    tmp = os.path.join(out_dir, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, sort_keys=False, default=str)
    os.replace(tmp, os.path.join(out_dir, "results.json"))


__all__ = ["run_suite", "preflight", "ALL_CONFIGS", "EXPERIMENTS", "DEFAULT_EXPERIMENTS", "Interrupted"]
