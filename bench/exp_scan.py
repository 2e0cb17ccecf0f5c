"""Experiment 1, seed 004: the `scan` program in a memory-starved machine.

Recipe: `scan 480 10` in a 512 MiB machine, 5 runs per configuration, mean wall time of
runs 2..5 (the seed ignores run 1, which ran much faster for it), speedup against disk
swap as (disk - x) / disk (seed: 33%). Sweep: M from 1.0x to 2.5x of the limit, cyclic
and use-once, for every configuration; no-swap records OOM kills where M does not fit.
"""

from __future__ import annotations

import statistics

from .parse import parse_scan_output
from .runner import Sampler, run_workload


def scan_argv(scan_bin: str, mib: int, passes: int, mode: str, pages_file: str | None = None) -> list:
    """pages_file: fill from a raw page dump (tools/pagedump) instead of the built-in mix."""
    return [scan_bin, "-m", mode] + (["-p", pages_file] if pages_file else []) + [str(mib), str(passes)]


def sweep_points(p: dict) -> list:
    """[(mode, [factors])]: sweep_modes is a dict mode -> factors, or a list of modes that
    share sweep_factors."""
    modes = p["sweep_modes"]
    if isinstance(modes, dict):
        return list(modes.items())
    return [(m, p["sweep_factors"]) for m in modes]


def summarize_runs(runs: list, skip_first: bool = True) -> dict:
    """Mean and median over the runs that count (2.. when there are at least 2), or the
    failure status if any run failed (a failed point has no time)."""
    failed = [r["status"] for r in runs if r["status"] != "ok"]
    if failed:
        return {"status": failed[0], "mean_s": None, "median_s": None, "counted_runs": 0}
    times = [r["wall_s"] for r in runs]
    counted = times[1:] if skip_first and len(times) > 1 else times
    return {
        "status": "ok",
        "mean_s": round(statistics.mean(counted), 4),
        "median_s": round(statistics.median(counted), 4),
        "min_s": min(counted),
        "max_s": max(counted),
        "counted_runs": len(counted),
    }


def _runs(ctx, cfg, cg, argv, n, timeout, label) -> list:
    runs = []
    for i in range(n):
        r = run_workload(ctx.system, cg, argv, timeout)
        try:
            r["scan"] = parse_scan_output(r["stdout"])
        except ValueError:
            r["scan"] = None
        del r["stdout"]
        if r["status"] == "ok":
            r["stderr"] = ""
        runs.append(r)
        ctx.log(f"scan {label} [{cfg.name}] run {i + 1}/{n}: {r['status']} {r['wall_s']:.2f} s")
        if r["status"] != "ok":
            break  # an OOM or a timeout will not get better by repeating
    return runs


def run(ctx, p: dict) -> dict:
    out = {"params": p, "configs": {}}
    for name in ctx.configs:
        cfg = ctx.config(name, p["swap_size_bytes"])
        out["configs"][name] = ctx.run_config(f"scan [{name}]", cfg, {"label": cfg.label},
                                              lambda res: _run_config(ctx, p, cfg, name, res))
    out["speedup_vs_disk"] = speedups(out["configs"])
    out["pressure_speedup_vs_disk"] = speedups(out["configs"], "pressure")
    return out


def _run_config(ctx, p, cfg, name, res):
    ctx.log(f"scan [{name}] setting up ({cfg.label}, {p['swap_size_bytes'] >> 20} MiB)")
    with cfg:
        res["info"] = dict(cfg.info)
        limit = p["recipe_limit_bytes"]
        argv = scan_argv(ctx.scan_bin, p["recipe_mib"], p["recipe_passes"], p["recipe_mode"], p.get("pages_file"))
        with ctx.cgroup(limit, cfg.allow_swap) as cg, Sampler(cfg, cg) as smp:
            runs = _runs(ctx, cfg, cg, argv, p["recipe_runs"], p["run_timeout_s"],
                         f"recipe {p['recipe_mib']} MiB x{p['recipe_passes']} in {limit >> 20} MiB")
        res["recipe"] = {"runs": runs, **summarize_runs(runs), **smp.summary()}
        pr = p.get("pressure_recipe")
        if pr:
            argv = scan_argv(ctx.scan_bin, pr["mib"], pr["passes"], pr["mode"], p.get("pages_file"))
            with ctx.cgroup(pr["limit_bytes"], cfg.allow_swap) as cg, Sampler(cfg, cg) as smp:
                runs = _runs(ctx, cfg, cg, argv, pr["runs"], p["run_timeout_s"],
                             f"pressure recipe {pr['mib']} MiB x{pr['passes']} in {pr['limit_bytes'] >> 20} MiB")
            res["pressure"] = {"runs": runs, **summarize_runs(runs), **smp.summary()}
        res["sweep"] = []
        limit = p["sweep_limit_bytes"]
        for mode, factors in sweep_points(p):
            for factor in factors:
                mib = int(round(factor * (limit >> 20)))
                argv = scan_argv(ctx.scan_bin, mib, p["sweep_passes"], mode, p.get("pages_file"))
                with ctx.cgroup(limit, cfg.allow_swap) as cg, Sampler(cfg, cg) as smp:
                    runs = _runs(ctx, cfg, cg, argv, p["sweep_runs"], p["run_timeout_s"],
                                 f"sweep {mode} {mib} MiB ({factor:g}x)")
                res["sweep"].append({"mode": mode, "factor": factor, "mib": mib, "runs": runs,
                                     **summarize_runs(runs), **smp.summary()})


def speedups(configs: dict, key: str = "recipe") -> dict:
    """The seed's measure, within this run: (t_disk - t_x) / t_disk of recipe means; and, when
    `disk-hdd` ran, t_x / t_disk-hdd (the time against swap on the seeds' hard disk)."""
    disk = configs.get("disk", {}).get(key, {}).get("mean_s")
    hdd = configs.get("disk-hdd", {}).get(key, {}).get("mean_s")
    out = {}
    for name, res in configs.items():
        t = res.get(key, {}).get("mean_s")
        if disk and t:
            out[name] = {"speedup": round((disk - t) / disk, 4), "disk_over_x": round(disk / t, 4)}
        if hdd and t:
            out.setdefault(name, {})["x_over_disk_hdd"] = round(t / hdd, 4)
    return out
