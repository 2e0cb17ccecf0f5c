"""Experiment 3, seeds 001 and 002: cycle through N instances of a real program.

The seeds opened N copies of a thesis in evince/xpdf on a 256/512 MB machine and timed
three cycles through them, for compcache sizes C0..C4 = 0, 25, 50, 75, 100% of RAM, raising
N until the machine could take no more. Here the program is Debian's python3 holding the
machine's package database (bench/apps/dpkgdb.py, instance_mib each); "making an instance
active" is asking it to walk all its data. Each (size, N) point starts N instances in a
fresh cgroup, then times three cycles of activating each in turn. An instance killed by the
OOM killer marks the point "OOM" and larger N are not tried for that size.

The compressed device is compcache when its binary exists, else kernel zram (lz4) as a
stand-in: the record says which ("backend"). The compression ratio is the seed's,
orig_data_size / mem_used_total, at the moment the device held most data.
"""

from __future__ import annotations

import os
import select
import subprocess
import time

from .runner import Sampler, stored_ratio

APP = os.path.join(os.path.dirname(__file__), "apps", "dpkgdb.py")
PYTHON = "/usr/bin/python3"  # Debian's interpreter: the "real program from Debian's packages"


class InstanceDied(Exception):
    pass


def _readline(proc, deadline: float) -> str:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("instance did not answer in time")
        r, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
        if r:
            line = proc.stdout.readline().decode()
            if not line:
                raise InstanceDied(f"instance {proc.pid} exited ({proc.wait()})")
            return line


def run_point(ctx, cg, n: int, instance_mib: int, cycles: int, timeout_s: float, settle_s: float = 0,
              stats=None) -> dict:
    """Starts n instances, cycles through them; returns times or the failure. With `settle_s`,
    the instances then stay alive and idle that long and `stats()` (the device's statistics)
    is read at the end: what the device holds once its pages have aged ("settled"), which is
    when background recompression has had its turn."""
    deadline = time.monotonic() + timeout_s
    procs = []
    res = {"n": n, "status": "ok", "cycle_s": [], "start_s": None}
    try:
        t0 = time.monotonic()
        for i in range(n):
            procs.append(ctx.system.spawn(cg.wrap([PYTHON, APP, str(instance_mib), str(i * 37)]),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, new_session=False))
            _readline(procs[-1], deadline)  # "ready": load one at a time, like opening documents
        res["start_s"] = round(time.monotonic() - t0, 4)
        for _ in range(cycles):
            t0 = time.monotonic()
            for p in procs:
                p.stdin.write(b"go\n")
                p.stdin.flush()
                _readline(p, deadline)
            res["cycle_s"].append(round(time.monotonic() - t0, 4))
        res["total_s"] = round(sum(res["cycle_s"]), 4)
        if settle_s and stats is not None:
            ctx.system.sleep(settle_s)
            res["settled"] = settled(stats(), settle_s)
    except (InstanceDied, BrokenPipeError) as e:
        res["status"] = "oom" if cg.oom_kills_since_setup() > 0 else "died"
        res["error"] = str(e)
    except TimeoutError as e:
        res["status"] = "timeout"
        res["error"] = str(e)
    finally:
        res["oom_kills"] = cg.oom_kills_since_setup()
        if res["oom_kills"] and res["status"] == "ok":
            res["status"] = "oom"  # a kill during the cycle that the survivors did not notice
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except OSError:
                    pass
    return res


def settled(st: dict, after_s: float) -> dict:
    """The device's figures after the settling pause, with the seed's ratio."""
    out = {"after_s": after_s, **{k: st.get(k) for k in ("orig_data_size", "mem_used_total", "recompress_done", "bd_count")}}
    ratio = stored_ratio(st)
    out["compression_ratio"] = None if ratio is None else round(ratio, 3)
    return out


def run(ctx, p: dict, backend: str) -> dict:
    out = {"params": p, "backend": backend, "sizes": {}}
    limit = p["limit_bytes"]
    for pct in p["size_percents"]:
        label = f"C{p['size_percents'].index(pct)}"
        size = limit * pct // 100
        name = "noswap" if pct == 0 else backend
        cfg = ctx.config(name, size)
        entry = {"label": label, "percent": pct, "size_bytes": size, "config": name, "points": []}
        out["sizes"][label] = ctx.run_config(f"app {label} [{name}]", cfg, entry,
                                             lambda e: _run_size(ctx, p, cfg, e, label, limit))
    return out


def _run_size(ctx, p, cfg, entry, label, limit):
    ctx.log(f"app {label} ({entry['percent']}% = {entry['size_bytes'] >> 20} MiB {cfg.label}) setting up")
    with cfg:
        entry["info"] = dict(cfg.info)
        for n in p["counts"]:
            with ctx.cgroup(limit, cfg.allow_swap) as cg, Sampler(cfg, cg) as smp:
                settle = p.get("settle_s", 0)
                pt = run_point(ctx, cg, n, p["instance_mib"], p["cycles"], p["point_timeout_s"] + settle, settle,
                               cfg.stats)
            pt.update(smp.summary())
            entry["points"].append(pt)
            ratio = pt.get("compression_ratio")
            ctx.log(f"app {label} N={n}: {pt['status']} "
                    + (f"{pt['total_s']:.2f} s" if pt["status"] == "ok" else f"({pt.get('error', '')})")
                    + (f" ratio {ratio:.2f}:1" if ratio else "")
                    + (f"; after {pt['settled']['after_s']:g} s idle {pt['settled']['compression_ratio']}:1"
                       if pt.get("settled") else ""))
            if pt["status"] != "ok":
                break
