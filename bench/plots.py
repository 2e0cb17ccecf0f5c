"""results.json -> PNG figures in the manner of the seeds' graphs. One script draws them all
(`python3 -m bench plot results.json`), from the recorded results only."""

from __future__ import annotations

import os

from . import exp_zcache
from .exp_fio import TEST_NAMES


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str) -> str:
    """Lays the figure out, writes it to `path` (100 dpi) and frees it; returns the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_scan_recipe(scan: dict, path: str) -> str | None:
    cfgs = [(n, r) for n, r in scan["configs"].items() if r.get("recipe")]
    if not cfgs:
        return None
    plt = _plt()
    p = scan["params"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (n, r) in enumerate(cfgs):
        rec = r["recipe"]
        if rec.get("mean_s") is not None:
            ax.bar(i, rec["mean_s"], color="C0" if n != "compcache" else "C3", alpha=0.7)
            times = [x["wall_s"] for x in rec["runs"][1:]]
            ax.plot([i] * len(times), times, "k.", ms=4)
        else:
            ax.text(i, 0, rec.get("status", "?").upper(), ha="center", va="bottom", color="red")
    ax.set_xticks(range(len(cfgs)), [r["label"] for _, r in cfgs], rotation=20, ha="right")
    ax.set_ylabel("wall time (s), mean of runs 2.. (bars) and each run (dots)")
    ax.set_title(f"scan {p['recipe_mib']} {p['recipe_passes']} in a {p['recipe_limit_bytes'] >> 20} MiB cgroup "
                 "(seed 004)")
    return _save(plt, fig, path)


def plot_scan_sweep(scan: dict, mode: str, path: str) -> str | None:
    plt = _plt()
    p = scan["params"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    ymax = 0.0
    ooms = []
    for i, (n, r) in enumerate(scan["configs"].items()):
        pts = sorted((x for x in r.get("sweep", []) if x["mode"] == mode), key=lambda x: x["factor"])
        ok = [(x["factor"], x["median_s"]) for x in pts if x.get("median_s") is not None]
        if ok:
            ax.plot(*zip(*ok), "o-", label=r["label"], color=f"C{i}")
            ymax = max(ymax, max(y for _, y in ok))
            drawn = True
        ooms += [(x["factor"], i, r["label"]) for x in pts if x.get("status") in ("oom", "timeout")]
    if not drawn:
        plt.close(fig)
        return None
    for f, i, _ in ooms:
        ax.plot([f], [ymax * 1.05], "x", color=f"C{i}", ms=9)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("M / memory limit")
    ax.set_ylabel("wall time (s), median of runs 2..")
    ax.set_title(f"scan M {p['sweep_passes']} ({mode}) in a {p['sweep_limit_bytes'] >> 20} MiB cgroup; x = OOM")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def plot_fio(fio: dict, file_bytes: int, path: str) -> str | None:
    cfgs = [(n, fio["configs"][n]) for n in fio.get("order", []) if fio["configs"].get(n, {}).get("points")]
    if not cfgs:
        return None
    plt = _plt()
    tests = fio["params"]["tests"]
    cols = 3
    rows = (len(tests) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.2 * rows), squeeze=False)
    for ax, test in zip(axes.flat, tests):
        for i, (n, r) in enumerate(cfgs):
            pts = sorted((x for x in r["points"] if x["test"] == test and x["file_bytes"] == file_bytes
                          and x.get("bw_bytes") is not None), key=lambda x: x["record_bytes"])
            if pts:
                ax.plot([x["record_bytes"] >> 10 for x in pts], [x["bw_bytes"] / 1e6 for x in pts], "o-",
                        label=r["label"], color=f"C{i}")
        ax.set_xscale("log", base=2)
        recs = sorted({x["record_bytes"] >> 10 for _, r in cfgs for x in r["points"]})
        ax.set_xticks(recs, [f"{k // 1024}M" if k >= 1024 else f"{k}k" for k in recs], fontsize=7)
        ax.set_ylim(bottom=0)  # throughput axes start at zero: no exaggerated gaps
        ax.set_title(TEST_NAMES[test], fontsize=10)
        ax.set_xlabel("record size (KiB)", fontsize=8)
        ax.set_ylabel("MB/s", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tests):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    lim = fio["params"]["limit_bytes"] >> 20
    fig.suptitle(f"fio mmap, file {file_bytes >> 20} MiB in a {lim} MiB cgroup (seeds 000, 003)")
    return _save(plt, fig, path)


def plot_app(app: dict, path: str) -> str | None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    for i, (lab, s) in enumerate(app["sizes"].items()):
        pts = s.get("points", [])
        ok = [(x["n"], x["total_s"]) for x in pts if x["status"] == "ok"]
        if ok:
            ax.plot(*zip(*ok), "o-", color=f"C{i}", label=f"{lab} ({s['percent']}%)")
            drawn = True
        for x in pts:
            if x["status"] != "ok":
                y = ok[-1][1] if ok else 0
                ax.plot([x["n"]], [y], "x", color=f"C{i}", ms=10)
                ax.annotate(x["status"].upper(), (x["n"], y), fontsize=7, color=f"C{i}",
                            xytext=(3, 3), textcoords="offset points")
    if not drawn:
        plt.close(fig)
        return None
    p = app["params"]
    ax.set_ylim(bottom=0)
    ax.set_xlabel("N instances")
    ax.set_ylabel(f"seconds for {p['cycles']} cycles")
    ax.set_title(f"app cycle, {p['limit_bytes'] >> 20} MiB cgroup, {p['instance_mib']} MiB each, "
                 f"{app['backend']} (seeds 001, 002)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def plot_zcache(z: dict, variant: str, path: str) -> str | None:
    """One panel per test: average MB/s over record sizes per configuration (and engine),
    the ratio to direct written on each bar, as the seed's per-test graphs."""
    v = z["variants"].get(variant, {})
    cfgs = [(n, v["configs"][n]) for n in v.get("order", []) if exp_zcache.ok_points(v["configs"].get(n, {}))]
    if not cfgs:
        return None
    plt = _plt()
    p = z["params"]
    tests, engines = p["tests"], p["engines"]
    avgs = {(n, e): exp_zcache.averages_per_test(r, tests, e) for n, r in cfgs for e in engines}
    cols = 3
    rows = (len(tests) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.2 * rows), squeeze=False)
    width = 0.8 / len(cfgs)
    for ax, test in zip(axes.flat, tests):
        for i, (n, r) in enumerate(cfgs):
            for j, e in enumerate(engines):
                val = avgs[(n, e)].get(test)
                if val is None:
                    continue
                x = j + (i - (len(cfgs) - 1) / 2) * width
                ax.bar(x, val / 1e6, width, color=f"C{i}", label=r["label"] if j == 0 else None)
                base = avgs.get(("direct", e), {}).get(test)
                if base and n != "direct":
                    ax.annotate(f"{val / base:.2f}", (x, val / 1e6), ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(engines)), engines, fontsize=8)
        ax.set_ylim(bottom=0)
        ax.set_title(TEST_NAMES[test], fontsize=10)
        ax.set_ylabel("MB/s", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(tests):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"zcache (seed 003), {variant} disk: {p['file_bytes'] >> 20} MiB file, {p['limit_bytes'] >> 20} MiB "
                 f"page cache, {p['budget_bytes'] >> 20} MiB caches; ratio to direct on the bars")
    return _save(plt, fig, path)


def plot_all(results: dict, out_dir: str) -> list[str]:
    made = []
    exps = results.get("experiments", {})
    if "scan" in exps:
        made.append(plot_scan_recipe(exps["scan"], os.path.join(out_dir, "scan_recipe.png")))
        for mode in exps["scan"]["params"].get("sweep_modes", []):
            made.append(plot_scan_sweep(exps["scan"], mode, os.path.join(out_dir, f"scan_sweep_{mode}.png")))
    if "fio" in exps:
        sizes = sorted({x["file_bytes"] for r in exps["fio"]["configs"].values() for x in r.get("points", [])})
        for fb in sizes:
            made.append(plot_fio(exps["fio"], fb, os.path.join(out_dir, f"fio_{fb >> 20}MiB.png")))
    if "app" in exps:
        made.append(plot_app(exps["app"], os.path.join(out_dir, "app_cycle.png")))
    if "zcache" in exps:
        for variant in exps["zcache"].get("variants", {}):
            made.append(plot_zcache(exps["zcache"], variant, os.path.join(out_dir, f"zcache_{variant}.png")))
    return [m for m in made if m]
