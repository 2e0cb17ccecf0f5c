"""Experiment: the backing tier (issue 6), on seed 004's scan.

Seed 004 ran ramzswap with a memory limit and the disk swap partition as its backing swap
device. Here, in one run and one memory cgroup per point:

  disk                plain disk swap (a swap file in the work directory)
  zswap               zswap in front of that disk swap file
  compcache           compcache with no memory limit: the reference, and the measure of what
                      compcache needs (peak mem_used_total at each point)
  compcache-backing   compcache limited to FRACTION of what it needed at that point, with a
                      backing file on the same disk (--backing WORKDIR/...): overflow writes
                      and cold-page writeback go to the file

Every point is `scan M PASSES` (cyclic) in a LIMIT MiB cgroup, RUNS runs, mean of runs 2..;
speedup against disk swap is the seed's (t_disk - t) / t_disk. The compcache device's
statistics (bd_reads, bd_writes, bd_space_bytes, bd_efficiency_pct, mem_used_max) are sampled
and reported at their peaks.

    sudo python3 -m bench.exp_backing              # quick: 64 MiB cgroup, M = 2x and 2.5x
    sudo python3 -m bench.exp_backing --full       # 512 MiB cgroup, M = 1.5x .. 2.5x
    sudo python3 -m bench.exp_backing --fraction 0.25 --out DIR --workdir DIR

Lives beside the suite (python3 -m bench) and reuses its configurations, cgroups, runner and
cleanup check; it writes results.json and results.md to bench/results/<time>-backing/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

from . import cgroup as cgroup_mod
from .context import Context
from .exp_scan import _runs, scan_argv, summarize_runs
from .runner import Progress, Sampler
from .swapconf import CompcacheSwap, find_compcache
from .system import Ledger, System

MiB = 1 << 20
CONFIGS = ("disk", "zswap", "compcache", "compcache-backing")

QUICK = {
    "limit_bytes": 64 * MiB,
    "factors": [2.0, 2.5],
    "mode": "cyclic",
    "passes": 3,
    "runs": 3,
    "fraction": 0.25,
    "swap_size_bytes": 512 * MiB,
    "run_timeout_s": 600,
}
FULL = dict(QUICK, limit_bytes=512 * MiB, factors=[1.5, 2.0, 2.5], passes=5, runs=5,
            swap_size_bytes=2048 * MiB, run_timeout_s=3600)


class CompcacheBackingSwap(CompcacheSwap):
    """compcache with --mem-limit and a backing file in the work directory."""

    def __init__(self, system, ledger, workdir, size_bytes, binary, mem_limit_bytes: int, extra_args: tuple = ()):
        super().__init__(system, ledger, workdir, size_bytes, binary, extra_args=extra_args)
        self.name = "compcache-backing"
        self.label = f"compcache + backing ({mem_limit_bytes / MiB:.1f} MiB RAM)"
        self.mem_limit_bytes = mem_limit_bytes

    def setup(self) -> None:
        self.backing = os.path.join(self.workdir, f"{self.name}.img")
        self.ledger.add("files", self.backing)
        self.info.update({"backing_file": self.backing, "mem_limit_bytes": self.mem_limit_bytes})
        super().setup()

    def server_argv(self, socket):
        return super().server_argv(socket) + ["--mem-limit", str(self.mem_limit_bytes),
                                              "--backing", getattr(self, "backing", ""),
                                              "--backing-size", str(self.size_bytes)]

    def _teardown_steps(self):
        def remove_backing():
            self._remove_file(getattr(self, "backing", None))

        return super()._teardown_steps() + [remove_backing]


def run(ctx: Context, p: dict, configs=CONFIGS) -> dict:
    out = {"params": p, "points": []}
    limit = p["limit_bytes"]
    for factor in p["factors"]:
        mib = int(round(factor * (limit >> 20)))
        point = {"factor": factor, "mib": mib, "configs": {}}
        argv = scan_argv(ctx.scan_bin, mib, p["passes"], p["mode"])
        needed = None
        for name in configs:
            if name == "compcache-backing":
                ref = point["configs"].get("compcache", {}).get("peak_mem_used_total")
                # Without the reference: the swapped-out part at an assumed 2:1.
                needed = ref or (mib * MiB - limit) // 2
                cfg = CompcacheBackingSwap(ctx.system, ctx.ledger, ctx.workdir, p["swap_size_bytes"],
                                           ctx.compcache_bin, max(MiB, int(needed * p["fraction"]) // 4096 * 4096))
            else:
                cfg = ctx.config(name, p["swap_size_bytes"])

            def body(res):
                with cfg:
                    res["info"] = dict(cfg.info)
                    with ctx.cgroup(limit, True) as cg, Sampler(cfg, cg) as smp:
                        runs = _runs(ctx, cfg, cg, argv, p["runs"], p["run_timeout_s"],
                                     f"{p['mode']} {mib} MiB ({factor:g}x) x{p['passes']}")
                    res.update({"runs": runs, **summarize_runs(runs), **smp.summary()})

            point["configs"][name] = ctx.run_config(f"backing scan {mib} MiB [{name}]", cfg, {"label": cfg.label}, body)
        disk = point["configs"].get("disk", {}).get("mean_s")
        for res in point["configs"].values():
            if disk and res.get("mean_s"):
                res["speedup_vs_disk"] = round((disk - res["mean_s"]) / disk, 4)
        out["points"].append(point)
    return out


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def markdown(results: dict) -> str:
    exp = results["backing_scan"]
    p = exp["params"]
    m = results["machine"]
    lines = [f"### backing tier: scan {p['mode']} x{p['passes']} in a {p['limit_bytes'] >> 20} MiB cgroup, "
             f"compcache-backing limited to {p['fraction']:.0%} of what compcache needed",
             "",
             f"Kernel {m.get('kernel')}, {m.get('cpus')} CPUs ({m.get('cpu_model', '?')}), "
             f"{(m.get('mem_total_kib') or 0) >> 20} GiB; {results['started_utc']}; commit {m.get('git_commit', '?')[:10]}.",
             ""]
    for point in exp["points"]:
        lines += [f"#### M = {point['mib']} MiB ({point['factor']:g}x the limit), {p['runs']} runs, mean of runs 2..", "",
                  "| config | runs (s) | mean 2.. (s) | speedup vs disk | RAM MiB (peak) | bd_writes | bd_reads "
                  "| backing MiB (peak) | efficiency |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, r in point["configs"].items():
            if "skipped" in r or "error" in r:
                lines.append(f"| {r['label']} | {r.get('skipped') or r.get('error')} | | | | | | | |")
                continue
            runs = " ".join(_f(x["wall_s"]) if x["status"] == "ok" else x["status"] for x in r.get("runs", []))
            ram = r.get("peak_mem_used_max") or r.get("peak_mem_used_total")
            lines.append(
                f"| {r['label']} | {runs} | {_f(r.get('mean_s'))} | {_f(r.get('speedup_vs_disk'), '{:+.0%}')} "
                f"| {_f(ram and ram / MiB, '{:.1f}')} | {_f(r.get('peak_bd_writes'), '{:.0f}')} "
                f"| {_f(r.get('peak_bd_reads'), '{:.0f}')} | {_f(r.get('peak_bd_space_bytes') and r['peak_bd_space_bytes'] / MiB, '{:.1f}')} "
                f"| {_f(r.get('peak_bd_efficiency_pct'), '{:.0f}%')} |")
        lines.append("")
    lines.append("RAM MiB: compcache's pool at its peak (mem_used_max), outside the cgroup; zswap's pool is "
                 "charged to the cgroup. bd_writes / bd_reads: pages written to / read from the backing "
                 "file. Backing MiB: segments in use (bd_space_bytes); efficiency: live compressed bytes per "
                 "byte of used segments (bd_efficiency_pct), peak.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from .suite import REPO_ROOT, build_scan, machine_record, preflight, start_results

    ap = argparse.ArgumentParser(prog="python3 -m bench.exp_backing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="512 MiB cgroup, more points and runs")
    ap.add_argument("--fraction", type=float, default=None, help="compcache-backing's memory limit as a share "
                    "of what compcache needed (default 0.25)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {','.join(CONFIGS)}")
    ap.add_argument("--out", default=None)
    ap.add_argument("--workdir", default="/var/tmp/compcache-bench")
    a = ap.parse_args(argv)
    p = dict(FULL if a.full else QUICK)
    if a.fraction is not None:
        p["fraction"] = a.fraction
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    system = System()
    compcache_bin = find_compcache(REPO_ROOT)
    started = start_results("bench.exp_backing", preflight(system, ["scan"], [c for c in configs if c != "compcache-backing"],
                                                           compcache_bin), a.out, "backing")
    if started is None:
        return 2
    _, out_dir = started
    system.mkdir(a.workdir)
    progress, ledger = Progress(), Ledger()
    results = {"suite": "compcache bench: backing tier", "started_utc": dt.datetime.utcnow().isoformat() + "Z",
               "command": " ".join(["python3 -m bench.exp_backing"] + (argv if argv is not None else sys.argv[1:])),
               "machine": machine_record(system, compcache_bin)}
    if results["machine"]["swaps_at_start"]:
        progress("warning: swap devices of others are active; the kernel may also use them for our cgroups: "
                 + ", ".join(s["filename"] for s in results["machine"]["swaps_at_start"]))
    ctx = Context(system, ledger, progress, a.workdir, REPO_ROOT, configs, build_scan(system), compcache_bin,
                  cgroup_mod.detect(system))
    try:
        results["backing_scan"] = run(ctx, p, configs)
    finally:
        results["leftovers"] = ledger.leftovers(system)
        results["elapsed_s"] = round(progress.elapsed(), 1)
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
        if results["leftovers"]:
            progress("ERROR: left behind: " + ", ".join(results["leftovers"]))
    md = markdown(results)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(md)
    print(md)
    progress(f"results in {out_dir}")
    return 1 if results["leftovers"] else 0


if __name__ == "__main__":
    sys.exit(main())
