"""Experiment 2, seeds 000 and 003: iozone-style file I/O through mmap, with and without
compcache swap.

iozone -a -B runs, per file size and record size, write, rewrite, read, reread, random
read and write, backward read, record rewrite and stride read, all through mmap'd files.
fio has no iozone mode, so each test is one fio job with the mmap engine:

  write       rw=write on a fresh file          rewrite     rw=write again
  read        rw=read                           reread      rw=read again
  randread    rw=randread                       randwrite   rw=randwrite
  bkwdread    rw=read:-2*bs (offset steps back one record after each read)
  recrewrite  rw=randwrite:1e6 with rw_sequencer=identical (the same record, rewritten)
  strideread  rw=read:16*bs (every 17th record, iozone's default stride)

Jobs are capped at runtime_s, so a slow test measures throughput over part of the file
rather than run for ever; the byte counts are recorded. Besides the file I/O the machine
holds a ballast of anonymous memory (ballast_factor of the limit, filled by `scan -H`):
that is what swap can move out of the page cache's way, or, as seed 000 found, what makes
swap compete with the page cache.
"""

from __future__ import annotations

import os
import subprocess

from .parse import parse_fio_json
from .runner import Sampler, run_workload

TEST_NAMES = {
    "write": "write", "rewrite": "re-write", "read": "read", "reread": "re-read",
    "randread": "random read", "randwrite": "random write", "bkwdread": "backward read",
    "recrewrite": "record rewrite", "strideread": "stride read",
}


def fio_argv(test: str, path: str, file_bytes: int, bs: int, runtime_s: int | None, engine: str = "mmap") -> list:
    """One iozone-style test as a fio command line; runtime_s None: the whole file, uncapped."""
    rw = {
        "write": "write", "rewrite": "write", "read": "read", "reread": "read",
        "randread": "randread", "randwrite": "randwrite", "bkwdread": f"read:-{2 * bs}",
        "recrewrite": "randwrite:1000000", "strideread": f"read:{16 * bs}",
    }[test]
    argv = ["fio", f"--name={test}", f"--filename={path}", f"--size={file_bytes}", f"--bs={bs}",
            f"--rw={rw}", f"--ioengine={engine}", "--output-format=json"]
    if runtime_s is not None:
        argv.append(f"--runtime={runtime_s}")
    if test == "recrewrite":
        argv.append("--rw_sequencer=identical")
    return argv


def fio_point(point: dict, r: dict) -> dict:
    """`point` completed with one fio run's outcome (`run_workload`'s result `r`): its status,
    time and OOM kills, and fio's JSON figures; a run whose output does not parse is
    "unparsed" (unless it already failed), with the error and fio's stderr kept."""
    point.update({"status": r["status"], "wall_s": r["wall_s"], "oom_kills": r["oom_kills"]})
    try:
        point.update(parse_fio_json(r["stdout"]))
    except (ValueError, KeyError) as e:
        point["status"] = point["status"] if point["status"] != "ok" else "unparsed"
        point["error_text"] = (str(e) + " " + r["stderr"])[-500:]
    return point


def start_ballast(ctx, cg, mib: int):
    """A scan process that fills MIB of anonymous memory and keeps it; returns when filled."""
    proc = ctx.system.spawn(cg.wrap([ctx.scan_bin, "-H", str(mib), "1"]), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, new_session=False)
    line = proc.stdout.readline().decode()
    if not line.startswith("scan"):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"ballast of {mib} MiB did not start (exit {proc.poll()})")
    return proc


def run(ctx, p: dict, configs: list) -> dict:
    out = {"params": p, "configs": {}, "order": configs}
    for name in configs:
        cfg = ctx.config(name, p["swap_size_bytes"])
        out["configs"][name] = ctx.run_config(f"fio [{name}]", cfg, {"label": cfg.label},
                                              lambda res: _run_config(ctx, p, cfg, name, res))
    return out


def _run_config(ctx, p, cfg, name, res):
    ctx.log(f"fio [{name}] setting up ({cfg.label})")
    res["points"] = []
    with cfg:
        res["info"] = dict(cfg.info)
        limit = p["limit_bytes"]
        for ff in p["file_factors"]:
            file_bytes = int(ff * limit)
            path = os.path.join(ctx.workdir, f"fio-{name}.dat")
            with ctx.cgroup(limit, cfg.allow_swap) as cg, Sampler(cfg, cg) as smp:
                ballast_mib = int(p["ballast_factor"] * (limit >> 20))
                ballast = start_ballast(ctx, cg, ballast_mib) if ballast_mib else None
                try:
                    for bs in p["record_sizes"]:
                        ctx.ledger.add("files", path)
                        for test in p["tests"]:
                            r = run_workload(ctx.system, cg, fio_argv(test, path, file_bytes, bs, p["runtime_s"]),
                                             p["run_timeout_s"])
                            point = {"file_factor": ff, "file_bytes": file_bytes, "record_bytes": bs, "test": test}
                            res["points"].append(fio_point(point, r))
                            bw = point.get("bw_bytes")
                            ctx.log(f"fio [{name}] file {file_bytes >> 20} MiB rec {bs >> 10} KiB {test}: "
                                    f"{point['status']} " + (f"{bw / 1e6:.1f} MB/s" if bw is not None else ""))
                        if ctx.system.exists(path):
                            ctx.system.remove(path)
                        ctx.ledger.drop("files", path)
                finally:
                    if ballast is not None:
                        ballast.kill()
                        ballast.wait()
                    if ctx.system.exists(path):
                        ctx.system.remove(path)
                    ctx.ledger.drop("files", path)
            res.setdefault("device", []).append({"file_factor": ff, **smp.summary()})


def compare(points_a: list, points_b: list) -> list:
    """Pairs throughput of the same (file, record, test) point of two configurations:
    [{test, file_bytes, record_bytes, a_bw, b_bw, ratio}] with ratio = b / a."""
    key = lambda pt: (pt["file_bytes"], pt["record_bytes"], pt["test"])  # noqa: E731
    b_by = {key(pt): pt for pt in points_b}
    out = []
    for pa in points_a:
        pb = b_by.get(key(pa))
        if pb is None:
            continue
        a, b = pa.get("bw_bytes"), pb.get("bw_bytes")
        out.append({"test": pa["test"], "file_bytes": pa["file_bytes"], "record_bytes": pa["record_bytes"],
                    "a_bw": a, "b_bw": b, "ratio": round(b / a, 3) if a and b is not None else None})
    return out
