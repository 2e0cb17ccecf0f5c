#!/usr/bin/env python3
"""NBD front-end A/B: two (or more) compcache binaries or settings, interleaved in one run.

For each round, every variant in turn (the order alternates from round to round, so that a
drift in machine load does not favour one side): start `compcache serve` on a Unix socket,
fill it with a real page file (`nbdcopy`), then fio 4 KiB randread QD1 and QD32 over that
data, randwrite QD1 and QD32 (fio's buffers, `buffer_compress_percentage`), stop it. fio's
`nbd` engine (libnbd, one connection), the same job files as bench/device/fio_compare.py.

Reports per workload the median (min-max) of the rounds for IOPS, p50 and p99 completion
latency, and each variant's ratio of medians against the first variant. Writes JSON to
--out-json. `uptime` is printed before and after: the machine is shared.

Usage: bench/device/nbd_ab.py --variant before=/tmp/compcache-before \\
           --variant after=target/release/compcache [--variant 'w1=target/release/compcache --workers 1'] \\
           [--rounds 3] [--runtime 5] [--page-file data/pages-node.bin]
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fio_compare as fc  # noqa: E402

REPO = fc.REPO


class Variant(fc.CompcacheTarget):
    def __init__(self, label, argv, size, tmp):
        super().__init__(argv[0], size, "lz4", tmp)
        self.argv += argv[1:]
        self.name = label


def uptime():
    return subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip()


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True,
                    help="LABEL=BINARY [serve arguments...]; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=5, help="seconds per fio workload")
    ap.add_argument("--page-file", default=os.path.join(REPO, "data", "pages-node.bin"))
    ap.add_argument("--compress-pct", type=int, default=57)
    ap.add_argument("--out-json", default=os.path.join(REPO, "bench", "results", "nbd_ab.json"))
    args = ap.parse_args()

    specs = []
    for v in args.variant:
        label, _, rest = v.partition("=")
        specs.append((label, shlex.split(rest)))
    file_bytes = os.path.getsize(args.page_file)
    pages = file_bytes // fc.PAGE
    size = (file_bytes + fc.MiB - 1) // fc.MiB * fc.MiB
    load_before = uptime()
    print(f"nbd_ab: {load_before}", file=sys.stderr)
    results = {label: {w: [] for w, _, _ in fc.WORKLOADS} for label, _ in specs}
    tmp = tempfile.mkdtemp(prefix="nbd-ab-")
    try:
        for rnd in range(args.rounds):
            order = specs if rnd % 2 == 0 else specs[::-1]
            for label, argv in order:
                t = Variant(label, argv, size, tmp)
                print(f"nbd_ab: round {rnd + 1}/{args.rounds}: {label}", file=sys.stderr)
                try:
                    t.start()
                    t.fill(args.page_file)
                    for wname, rw, qd in fc.WORKLOADS:
                        results[label][wname].append(
                            fc.run_fio(t, rw, qd, pages * fc.PAGE, args.runtime, args.compress_pct, tmp))
                finally:
                    t.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = uptime()
    print(f"nbd_ab: {load_after}", file=sys.stderr)

    table = {label: {w: {k: summary([r[k] for r in runs]) for k in ("iops", "p50_us", "p99_us")}
                     for w, runs in per.items()} for label, per in results.items()}
    base = specs[0][0]
    lines = [f"{args.rounds} rounds, interleaved; {args.runtime} s per workload after 1 s ramp; "
             f"page file `{os.path.relpath(args.page_file, REPO)}`; writes "
             f"`buffer_compress_percentage={args.compress_pct}`.",
             f"Load before: `{load_before}`; after: `{load_after}`.", "",
             "| workload | variant | IOPS median (min-max) | p50 µs median (min-max) | p99 µs median (min-max) | IOPS ratio | p99 ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]

    def cell(s, fmt):
        return f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})"

    k = lambda x: f"{x / 1000:.1f}k"  # noqa: E731
    us = lambda x: f"{x:.0f}"  # noqa: E731
    for w, _, _ in fc.WORKLOADS:
        for label, _ in specs:
            s = table[label][w]
            b = table[base][w]
            ratio = "" if label == base else f"{s['iops']['median'] / b['iops']['median']:.2f}x"
            p99r = "" if label == base else f"{s['p99_us']['median'] / b['p99_us']['median']:.2f}x"
            lines.append(f"| {w} | {label} | {cell(s['iops'], k)} | {cell(s['p50_us'], us)} | "
                         f"{cell(s['p99_us'], us)} | {ratio} | {p99r} |")
    md = "\n".join(lines) + "\n"
    print(md)
    os.makedirs(os.path.dirname(os.path.abspath(args.out_json)), exist_ok=True)
    with open(args.out_json, "w") as f:
        json.dump({"command": " ".join(["bench/device/nbd_ab.py"] + sys.argv[1:]),
                   "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                   "load_before": load_before, "load_after": load_after,
                   "variants": dict(specs), "results": table}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
