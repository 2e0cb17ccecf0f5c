"""Experiment random (issue 30): a real program that touches its swapped memory at random,
beside the seed's sequential scan, A/B against kernel zram in one run, alternating.

Sequential swapping hides what one swap-in costs: the kernel's swap readahead brings
neighbours in batches, and scan's next page is usually already on its way. A program that
looks things up at random in a table larger than its memory waits for every page on its
own. The program here is SQLite (Debian's python3 and its sqlite3 module,
bench/apps/sqlite_lookup.py): it builds an in-memory table of real text (the machine's package
file lists) larger than the memory cgroup, then answers point lookups by random key; each
lookup reads one leaf page of the table's B-tree chosen at random. Its build phase is
sequential (rows appended in key order), so it reports the build and the lookups apart.

Each round sets up every configuration in turn (the order rotates from round to round, so no
configuration always runs first or after the same one), runs the lookup program in a fresh
memory cgroup and then, if asked (`scan`), the seed's `scan MIB PASSES` recipe in another, and
tears the configuration down. A ratio is taken within a round (t_config / t_baseline, the
baseline being kernel zram lz4): the machine's load changes from minute to minute, and a
ratio of two runs minutes apart measures that too.

Per run it records the wall time, the program's own figures, the change in /proc/vmstat's
pswpin, pswpout and pgmajfault (machine-wide: the experiment holds the host-swap lock, so
nobody else swaps), the cgroup's own major faults (memory.stat pgmajfault) and the device's
read and write requests (num_reads, num_writes: zram's and compcache's; a swap file has none),
and the CPU time the whole machine was busy during the run (/proc/stat: user, nice, system, irq
and softirq over every CPU; not idle, iowait or steal). That last one over the pages swapped
(pswpin + pswpout) is the CPU a swapped page costs, wherever it was spent: zram compresses in
the reclaiming task and kswapd, compcache in its server, with the loop worker and ksoftirqd
between. It includes the program's own work (the same for every configuration of a round)
and whatever else the machine ran meanwhile, so it compares configurations, not machines.
"""

from __future__ import annotations

import json
import os
import statistics

from .parse import parse_flat_keyed, parse_proc_stat_busy_s, parse_scan_output
from .runner import run_workload

APP = os.path.join(os.path.dirname(__file__), "apps", "sqlite_lookup.py")
PYTHON = "/usr/bin/python3"  # Debian's interpreter and its libsqlite3
VMSTAT_KEYS = ("pswpin", "pswpout", "pgmajfault")
DEVICE_KEYS = ("num_reads", "num_writes")
WORKLOADS = ("lookup", "scan")


def rotated(configs: list, round_no: int) -> list:
    """The order of round `round_no`: the list rotated by that many places."""
    k = round_no % len(configs) if configs else 0
    return list(configs[k:]) + list(configs[:k])


def lookup_argv(p: dict) -> list:
    return [PYTHON, APP, str(p["table_mib"]), str(p["lookups"]), str(p.get("seed", 30))]


def scan_argv(ctx, sc: dict) -> list:
    return [ctx.scan_bin, "-m", sc.get("mode", "cyclic"), str(sc["mib"]), str(sc["passes"])]


def parse_lookup_output(text: str) -> dict:
    """The program's last JSON line."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line in the lookup program's output")


def deltas(before: dict, after: dict, keys) -> dict:
    return {k: after[k] - before[k] for k in keys
            if isinstance(after.get(k), (int, float)) and isinstance(before.get(k), (int, float))}


def _vmstat(ctx) -> dict:
    try:
        return parse_flat_keyed(ctx.system.read("/proc/vmstat"))
    except OSError:
        return {}


def _cpu_busy(ctx) -> float | None:
    try:
        return parse_proc_stat_busy_s(ctx.system.read("/proc/stat"))
    except (OSError, ValueError):
        return None


def _device(cfg) -> dict:
    try:
        return cfg.stats()
    except Exception:  # statistics are a record, never a reason to fail the run
        return {}


def run_one(ctx, cfg, limit_bytes: int, argv: list, timeout_s: float, parse) -> dict:
    """One run of `argv` in a fresh cgroup that may swap to `cfg`, with its counters."""
    with ctx.cgroup(limit_bytes, cfg.allow_swap) as cg:
        vm0, dev0, cg0, cpu0 = _vmstat(ctx), _device(cfg), cg.memory_stat(), _cpu_busy(ctx)
        r = run_workload(ctx.system, cg, argv, timeout_s)
        cpu1, vm1, dev1, cg1 = _cpu_busy(ctx), _vmstat(ctx), _device(cfg), cg.memory_stat()
    try:
        r["out"] = parse(r["stdout"])
    except (ValueError, KeyError):
        r["out"] = None
    del r["stdout"]
    if r["status"] == "ok":
        r["stderr"] = ""
    r["vmstat"] = deltas(vm0, vm1, VMSTAT_KEYS)
    r["device"] = deltas(dev0, dev1, DEVICE_KEYS)
    r["cg_pgmajfault"] = deltas(cg0, cg1, ("pgmajfault",)).get("pgmajfault")
    r["cpu_busy_s"] = round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None
    r["loadavg"] = _loadavg(ctx)
    return r


def _loadavg(ctx) -> list:
    try:
        return [float(x) for x in ctx.system.read("/proc/loadavg").split()[:3]]
    except (OSError, ValueError):
        return []


def run(ctx, p: dict, lock=None) -> dict:
    """`lock`: a context manager held for the whole experiment (the host-swap lock)."""
    out = {"params": p, "baseline": p["baseline"], "configs": {}, "order": []}
    for name in p["configs"]:
        out["configs"][name] = {"label": ctx.config(name, p["swap_size_bytes"]).label, "rounds": []}
    if lock is not None:
        with lock:
            _rounds(ctx, p, out)
    else:
        _rounds(ctx, p, out)
    out["summary"] = summarize(out)
    return out


def _rounds(ctx, p, out):
    for rnd in range(p["rounds"]):
        order = rotated(p["configs"], rnd)
        out["order"].append(order)
        for name in order:
            cfg = ctx.config(name, p["swap_size_bytes"])
            res = {"round": rnd}
            out["configs"][name]["rounds"].append(ctx.run_config(
                f"random [{name}] round {rnd + 1}/{p['rounds']}", cfg, res,
                lambda res, cfg=cfg, name=name: _run_round(ctx, p, cfg, name, res)))


def _run_round(ctx, p, cfg, name, res):
    with cfg:
        res["info"] = dict(cfg.info)
        r = run_one(ctx, cfg, p["limit_bytes"], lookup_argv(p), p["run_timeout_s"], parse_lookup_output)
        res["lookup"] = r
        o = r["out"] or {}
        ctx.log(f"random [{name}] lookup {p['table_mib']} MiB table in {p['limit_bytes'] >> 20} MiB: {r['status']} "
                f"{r['wall_s']:.2f} s (build {o.get('build_s', '-')} s, {p['lookups']} lookups "
                f"{o.get('lookup_s', '-')} s, {o.get('majflt_lookup', '-')} major faults; pswpin "
                f"{r['vmstat'].get('pswpin', '-')}; load {' '.join(map(str, r['loadavg']))})")
        sc = p.get("scan")
        if sc:
            r = run_one(ctx, cfg, sc["limit_bytes"], scan_argv(ctx, sc), p["run_timeout_s"], parse_scan_output)
            res["scan"] = r
            ctx.log(f"random [{name}] scan {sc['mib']} {sc['passes']} in {sc['limit_bytes'] >> 20} MiB: "
                    f"{r['status']} {r['wall_s']:.2f} s (pswpin {r['vmstat'].get('pswpin', '-')}; load "
                    f"{' '.join(map(str, r['loadavg']))})")


# Summaries: pure functions of the results, for report.py and the tests ---------------------

def measure(run: dict | None, what: str) -> float | None:
    """The time of one run that a ratio is taken of: `lookup_s` and `build_s` from the lookup
    program's output, `wall_s` of the run otherwise; None for a failed run."""
    if not run or run.get("status") != "ok":
        return None
    if what in ("lookup_s", "build_s"):
        return (run.get("out") or {}).get(what)
    return run.get("wall_s")


MEASURES = (("lookup", "lookup_s", "lookups"), ("lookup", "build_s", "build"),
            ("lookup", "wall_s", "whole program"), ("scan", "wall_s", "scan"))


def cpu_us_per_page(run: dict) -> float | None:
    """The machine's busy CPU time during `run` over the pages it swapped in and out, in
    microseconds; None without both figures or without swapping."""
    busy, vm = run.get("cpu_busy_s"), run.get("vmstat", {})
    pages = (vm.get("pswpin") or 0) + (vm.get("pswpout") or 0)
    return busy * 1e6 / pages if busy is not None and pages > 0 else None


def summarize(out: dict) -> dict:
    """Per measure and configuration: the times, their median, and the ratios to the baseline
    in the same round (median, min, max); the median swap-ins and major faults per run."""
    base = out["baseline"]
    cfgs = out["configs"]
    summ = {}
    for workload, what, label in MEASURES:
        per = {}
        for name, c in cfgs.items():
            rounds = {r["round"]: r for r in c["rounds"]}
            times, ratios = [], []
            for rnd, r in sorted(rounds.items()):
                t = measure(r.get(workload), what)
                if t is None:
                    continue
                times.append(t)
                b = next((x for x in cfgs.get(base, {}).get("rounds", []) if x["round"] == rnd), None)
                tb = measure((b or {}).get(workload), what)
                if tb:
                    ratios.append(t / tb)
            runs = [r.get(workload) for r in c["rounds"] if r.get(workload)]
            if not runs:
                continue
            entry = {"times": times, "median_s": statistics.median(times) if times else None,
                     "failed": sum(1 for x in runs if x.get("status") != "ok")}
            if ratios:
                entry.update(ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                             ratios=ratios)
            for key, get in (("pswpin", lambda x: x.get("vmstat", {}).get("pswpin")),
                             ("pswpout", lambda x: x.get("vmstat", {}).get("pswpout")),
                             ("majflt", lambda x: (x.get("out") or {}).get("majflt_lookup") if what == "lookup_s"
                              else x.get("cg_pgmajfault")),
                             ("device_reads", lambda x: x.get("device", {}).get("num_reads")),
                             ("cpu_us_per_page", cpu_us_per_page)):
                vals = [v for x in runs if x.get("status") == "ok" and (v := get(x)) is not None]
                entry[key] = statistics.median(vals) if vals else None
            per[name] = entry
        if per:
            summ[f"{workload}:{what}"] = {"label": label, "configs": per}
    return summ


__all__ = ["run", "summarize", "rotated", "lookup_argv", "parse_lookup_output", "deltas", "cpu_us_per_page",
           "MEASURES"]
