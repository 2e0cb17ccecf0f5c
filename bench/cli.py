"""Command line: python3 -m bench {run,report,plot,check}."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

from .suite import ALL_CONFIGS, DEFAULT_EXPERIMENTS, EXPERIMENTS, REPO_ROOT

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results")
DEFAULT_WORK = "/var/tmp/compcache-bench"


def _csv(value: str, allowed) -> list:
    items = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown: {', '.join(bad)} (choose from {', '.join(allowed)})")
    return items


def _write_outputs(results: dict, out_dir: str) -> None:
    from . import report

    md = report.markdown(results)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(md)
    print(md)
    try:
        from . import plots

        for p in plots.plot_all(results, out_dir):
            print(f"plot: {p}")
    except ImportError as e:
        print(f"plots skipped: {e} (pip install -r scripts/deps/pip-bench.txt)", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench", description="compcache seed benchmarks")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the experiments (root)")
    prof = r.add_mutually_exclusive_group()
    prof.add_argument("--quick", dest="profile", action="store_const", const="quick",
                      help="everything in under 10 minutes (default)")
    prof.add_argument("--full", dest="profile", action="store_const", const="full", help="the seeds' sizes; hours")
    r.add_argument("--experiments", type=lambda v: _csv(v, EXPERIMENTS), default=list(DEFAULT_EXPERIMENTS),
                   help=f"comma list of {','.join(EXPERIMENTS)} (default {','.join(DEFAULT_EXPERIMENTS)}: "
                        "zcache runs only when named)")
    r.add_argument("--configs", type=lambda v: _csv(v, ALL_CONFIGS), default=list(ALL_CONFIGS),
                   help=f"scan configurations, comma list of {','.join(ALL_CONFIGS)}")
    r.add_argument("--fio-configs", type=lambda v: _csv(v, ALL_CONFIGS), default=None,
                   help="the two fio configurations, baseline first (default noswap,compcache, zram-lz4 "
                        "standing in while compcache is not built)")
    r.add_argument("--app-backend", choices=[c for c in ALL_CONFIGS if c != "noswap"], default=None,
                   help="compressed device for the app cycle (default compcache, else zram-lz4)")
    r.add_argument("--pages", default=None, metavar="FILE",
                   help="fill scan's memory from a raw page dump (e.g. data/pages-mixed.bin from tools/pagedump)")
    r.add_argument("--set", action="append", default=[], metavar="EXP.KEY=JSON",
                   help="override a parameter, e.g. --set scan.recipe_runs=3")
    r.add_argument("--out", default=None, help=f"results directory (default {DEFAULT_OUT}/<UTC time>)")
    r.add_argument("--workdir", default=DEFAULT_WORK, help="scratch directory on the machine's disk")
    r.set_defaults(profile="quick")
    for name in ("report", "plot"):
        s = sub.add_parser(name, help=f"{'Markdown tables' if name == 'report' else 'PNG plots'} from results.json")
        s.add_argument("results")
    sub.add_parser("check", help="preflight only: root, tools, cgroup")
    a = ap.parse_args(argv)

    if a.cmd in ("report", "plot"):
        with open(a.results) as f:
            results = json.load(f)
        out_dir = os.path.dirname(os.path.abspath(a.results))
        if a.cmd == "report":
            from . import report

            print(report.markdown(results))
        else:
            from . import plots

            for p in plots.plot_all(results, out_dir):
                print(p)
        return 0
    if a.cmd == "check":
        from .suite import preflight
        from .swapconf import find_compcache
        from .system import System

        problems = preflight(System(), list(EXPERIMENTS), list(ALL_CONFIGS), find_compcache(REPO_ROOT))
        print("\n".join(problems) if problems else "ok")
        return 1 if problems else 0

    overrides: dict = {}
    for item in a.set:
        key, _, val = item.partition("=")
        exp, _, k = key.partition(".")
        if exp not in EXPERIMENTS or not k or not val:
            ap.error(f"--set wants EXP.KEY=VALUE with EXP in {EXPERIMENTS}, got {item!r}")
        overrides.setdefault(exp, {})[k] = json.loads(val)
    if a.pages:
        overrides.setdefault("scan", {})["pages_file"] = os.path.abspath(a.pages)
    stamp = dt.datetime.utcnow().strftime("%Y%m%dT%H%M%SZ")
    out_dir = a.out or os.path.join(DEFAULT_OUT, f"{stamp}-{a.profile}")
    from .suite import run_suite

    from .suite import Interrupted

    try:
        results = run_suite(a.profile, a.experiments, a.configs, out_dir, os.path.join(a.workdir, stamp),
                            fio_configs=a.fio_configs, app_backend=a.app_backend, overrides=overrides)
    except (Interrupted, KeyboardInterrupt) as e:
        # Teardown has run by now (and said whether anything is left); partial results stay.
        print(f"bench: interrupted ({e or 'Ctrl-C'}); partial results in {out_dir}", file=sys.stderr)
        return 130
    results["command"] = "python3 -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    _write_outputs(results, out_dir)
    print(f"results: {out_dir}")
    return 1 if results.get("leftovers") else 0
