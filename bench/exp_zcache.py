"""Experiment zcache, seed 003: iozone-style file I/O on ext4 with the page cache squeezed,
without a cache, with nbdkit's cache filter and with compcache's cache mode.

The seed ran `iozone -a -B -s 1G -y 4k` (mmap files) on a machine with 1 GB of RAM, with and
without zcache, the kernel's compressed cache for clean page-cache pages. Here the machine
with little RAM is a memory cgroup whose limit is below the file's size, so the page cache
cannot hold the file, and the file lives on ext4 on one of four disks over the same origin
(bench/cacheconf.py): the origin directly, `nbdkit file` (the same NBD transport, no
cache), nbdkit's cache filter (uncompressed, in RAM) and compcache's cache mode, the two
caches with the same memory budget. What the page cache drops is re-read from the cache,
or from the origin.

Two variants of the origin: `fast`, the image on this machine's virtual disk (host-cached,
faster than any cache in front of it can help with), and `slow`, the same image behind nbdkit
filters that impose the seed's hard disk figures (about 75 MB/s sequential, 700 random
4 KiB reads/s): the regime where zcache paid.

The ext4 image is made once per run (mkfs.ext4 with the inode tables and journal written at
once, so that no lazy initialisation writes during the tests) and copied per configuration
(`cp --sparse=always`), so every configuration starts from the same bytes and a cold cache.
Each (engine, record size) writes a new file, then runs the nine tests on it in iozone's
order; the write test lays the whole file down (no time cap), the others are capped at
runtime_s. fio fills its buffers so that each page compresses about 2:1
(buffer_compress_percentage), with fresh content per write (refill_buffers).

Per test the experiment records fio's throughput, what the disk's block device was asked to
read (the page cache's misses), what reached the origin's block device (the cache's misses,
in bytes), and compcache's own counter deltas (cache_hits, cache_misses, ...).
"""

from __future__ import annotations

import os
import statistics

from .cacheconf import CACHE_CONFIGS, COMPCACHE_CACHES, LABELS, Ext4Mount, SlowOrigin, block_stat, is_block_device, make_disk, proc_io
from .exp_fio import TEST_NAMES, fio_argv, fio_point
from .parse import parse_fio_json
from .runner import Sampler, run_workload

# compcache counters whose per-test change is recorded (names of crates/store/src/stats.rs).
CACHE_COUNTERS = ("cache_hits", "cache_misses", "cache_inserts", "cache_evictions", "origin_reads",
                  "origin_read_bytes", "origin_writes", "origin_write_bytes", "origin_errors", "readahead_pages",
                  "readahead_used", "readahead_wasted")
READ_TESTS = ("read", "reread", "randread", "bkwdread", "strideread")
MiB = 1 << 20


def image_bytes(file_bytes: int) -> int:
    """The ext4 image's size: the file, a quarter more and 64 MiB for the filesystem's own
    blocks, in whole MiB (a multiple of 4096, as compcache's origin must be)."""
    b = file_bytes + file_bytes // 4 + 64 * MiB
    return (b + MiB - 1) // MiB * MiB


def zcache_fio_argv(test: str, path: str, p: dict, bs: int, engine: str) -> list:
    """The suite's iozone-style fio job for this experiment: the write test lays down the whole
    file; iozone does not drop the page cache between tests, so neither does fio
    (invalidate=0); compressible content."""
    runtime = None if test == "write" else p["runtime_s"]
    return fio_argv(test, path, p["file_bytes"], bs, runtime, engine=engine) + [
        "--invalidate=0", f"--buffer_compress_percentage={p['compress_percentage']}", "--refill_buffers"]


def counter_delta(before: dict, after: dict, keys=CACHE_COUNTERS) -> dict:
    """after - before for the numeric counters present in both."""
    out = {}
    for k in keys:
        a, b = after.get(k), before.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out[k] = a - b
    return out


def run(ctx, p: dict, compcache_bin: str | None = None) -> dict:
    out = {"params": p, "variants": {}}
    base = os.path.join(ctx.workdir, "zcache")
    ctx.system.mkdir(base)
    master = os.path.join(base, "master.img")
    ctx.ledger.add("files", master)
    try:
        ctx.system.run(["truncate", "-s", str(image_bytes(p["file_bytes"])), master])
        # -b 4096: below 512 MiB mke2fs would pick 1 KiB blocks ("small"), which a loop device
        # with 4 KiB sectors (compcache fuse attaches its file so) cannot mount.
        ctx.system.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                        master], timeout=600)
        for variant in p["variants"]:
            names = p["configs"] if variant == "fast" else p["slow_configs"]
            v = {"configs": {}, "order": list(names)}
            if variant == "slow":
                v["slow_disk"] = dict(p["slow_disk"])
            out["variants"][variant] = v
            for name in names:
                probe = make_disk(name, ctx.system, ctx.ledger, base, "/nonexistent", p["budget_bytes"], "probe",
                                  compcache_bin)
                res = {"label": LABELS[name]}
                v["configs"][name] = ctx.run_config(
                    f"zcache {variant} [{name}]", probe, res,
                    lambda res, name=name, variant=variant, v=v: _run_config(ctx, p, base, master, variant, name,
                                                                             res, v, compcache_bin))
    finally:
        if ctx.system.exists(master):
            ctx.system.remove(master)
        ctx.ledger.drop("files", master)
    return out


class _ImageOrigin:
    """The fast variant's origin: the image file itself, nothing to set up."""

    def __init__(self, image):
        self.device = image
        self.info = {"image": image}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _origin(ctx, p, base, variant, image, tag):
    if variant == "fast":
        return _ImageOrigin(image)
    return SlowOrigin(ctx.system, ctx.ledger, base, image, p["slow_disk"], tag=f"{tag}-origin")


def calibrate(ctx, device: str, seconds: int) -> dict:
    """What the origin delivers on its own: fio with direct I/O, one request at a time,
    1 MiB sequential reads and 4 KiB random reads of the raw device (read-only)."""
    out = {}
    for key, rw, bs in (("seq_read_1m", "read", MiB), ("rand_read_4k", "randread", 4096)):
        txt = ctx.system.run(["fio", "--name=calibrate", f"--filename={device}", f"--rw={rw}", f"--bs={bs}",
                              "--direct=1", "--ioengine=psync", "--readonly", f"--runtime={seconds}", "--time_based",
                              "--output-format=json"], timeout=seconds + 60)
        bw = parse_fio_json(txt)["bw_bytes"]
        out[key] = {"bw_bytes": bw, "iops": round(bw / bs, 1)}
    return out


def _counters(ctx, disk, origin):
    """Bytes read from the disk's block device, bytes that reached the origin (its block
    device's counters, or the storage I/O of the process that reads the image file; for
    direct on an image, its loop device is the origin's reader) and compcache's counters."""
    dev = block_stat(ctx.system, disk.device)
    if is_block_device(origin):
        org = block_stat(ctx.system, origin)
    else:
        pid = disk.origin_reader_pid()
        org = dev if pid is None else proc_io(ctx.system, pid)
    return dev, org, disk.stats() if disk.cache_name in COMPCACHE_CACHES else {}


def _run_config(ctx, p, base, master, variant, name, res, v, compcache_bin):
    tag = f"{variant}-{name}"
    image = os.path.join(base, f"{tag}.img")
    ctx.ledger.add("files", image)
    try:
        ctx.system.run(["cp", "--sparse=always", master, image], timeout=600)
        ctx.log(f"zcache {variant} [{name}] setting up")
        with _origin(ctx, p, base, variant, image, tag) as origin:
            res["origin"] = dict(origin.info)
            if variant == "slow" and p.get("calibrate_s") and "calibration" not in v:
                v["calibration"] = calibrate(ctx, origin.device, p["calibrate_s"])
                c = v["calibration"]
                ctx.log(f"zcache slow disk: {c['seq_read_1m']['bw_bytes'] / 1e6:.1f} MB/s sequential, "
                        f"{c['rand_read_4k']['iops']:.0f} random 4 KiB reads/s")
            disk = make_disk(name, ctx.system, ctx.ledger, base, origin.device, p["budget_bytes"], tag, compcache_bin)
            with disk:
                res["info"] = dict(disk.info)
                res["points"] = []
                with Ext4Mount(ctx.system, ctx.ledger, disk.device, os.path.join(base, f"{tag}.mnt")) as mnt:
                    with ctx.cgroup(p["limit_bytes"], False) as cg, Sampler(disk, cg) as smp:
                        _tests(ctx, p, variant, name, disk, origin.device, mnt.mnt, cg, res)
                    res["device"] = smp.summary()
                # After the unmount (which writes what was dirty) and before the server stops.
                res["final_stats"] = disk.stats()
    finally:
        if ctx.system.exists(image):
            ctx.system.remove(image)
        ctx.ledger.drop("files", image)


def _tests(ctx, p, variant, name, disk, origin_dev, mnt, cg, res):
    path = os.path.join(mnt, "zcache.dat")
    for engine in p["engines"]:
        for bs in p["record_sizes"]:
            for test in p["tests"]:
                dev0, org0, st0 = _counters(ctx, disk, origin_dev)
                r = run_workload(ctx.system, cg, zcache_fio_argv(test, path, p, bs, engine), p["run_timeout_s"])
                dev1, org1, st1 = _counters(ctx, disk, origin_dev)
                point = {"engine": engine, "record_bytes": bs, "test": test, "file_bytes": p["file_bytes"],
                         "dev_read_bytes": counter_delta(dev0, dev1, ("read_bytes",)).get("read_bytes"),
                         "origin_read_bytes": counter_delta(org0, org1, ("read_bytes",)).get("read_bytes"),
                         "origin_write_bytes": counter_delta(org0, org1, ("write_bytes",)).get("write_bytes")}
                if st0 and st1:
                    point["cache"] = counter_delta(st0, st1)
                res["points"].append(fio_point(point, r))
                bw = point.get("bw_bytes")
                ctx.log(f"zcache {variant} [{name}] {engine} rec {bs >> 10} KiB {test}: {point['status']} "
                        + (f"{bw / 1e6:.1f} MB/s" if bw is not None else ""))
            if ctx.system.exists(path):
                ctx.system.remove(path)


# Summaries: pure functions of the results, for report.py and the tests ---------------------

def ok_points(res: dict) -> list:
    return [x for x in res.get("points", []) if x.get("status") == "ok" and x.get("bw_bytes") is not None]


def averages_per_test(res: dict, tests: list, engine: str | None = None) -> dict:
    """{test: mean throughput in bytes/s over record sizes (and engines, unless one is given)}:
    the seed's "Average (KB/s)" per test."""
    out = {}
    pts = [x for x in ok_points(res) if engine is None or x["engine"] == engine]
    for t in tests:
        xs = [x["bw_bytes"] for x in pts if x["test"] == t]
        if xs:
            out[t] = statistics.mean(xs)
    return out


def ratios_vs(base: dict, other: dict) -> dict:
    """{test: other / base} for tests both have, base non-zero."""
    return {t: other[t] / base[t] for t in base if t in other and base[t]}


def hit_ratio(cache_counts: dict) -> float | None:
    """cache_hits / (cache_hits + cache_misses), None when nothing was looked up."""
    h, m = cache_counts.get("cache_hits"), cache_counts.get("cache_misses")
    if h is None or m is None or h + m == 0:
        return None
    return h / (h + m)


def read_traffic(res: dict, tests=READ_TESTS) -> dict:
    """Over the read tests: bytes the disk's block device was asked to read (the page cache's
    misses), bytes that reached the origin, and their quotient (1.0 without a cache, lower
    when the cache served reads; above 1.0 when it read more than was asked, e.g. nbdkit's
    64 KiB cache blocks)."""
    pts = [x for x in res.get("points", []) if x["test"] in tests]
    dev = sum(x.get("dev_read_bytes") or 0 for x in pts)
    org = sum(x.get("origin_read_bytes") or 0 for x in pts)
    counts = {}
    for x in pts:
        for k, val in (x.get("cache") or {}).items():
            counts[k] = counts.get(k, 0) + val
    return {"dev_read_bytes": dev, "origin_read_bytes": org, "origin_per_read": org / dev if dev else None,
            "cache": counts, "hit_ratio": hit_ratio(counts)}


def memory_per_cached_byte(stats: dict) -> float | None:
    """mem_used_total / orig_data_size: what a cached byte costs in RAM (zram's names)."""
    orig, used = stats.get("orig_data_size"), stats.get("mem_used_total")
    if not orig or used is None:
        return None
    return used / orig


__all__ = ["run", "CACHE_CONFIGS", "COMPCACHE_CACHES", "TEST_NAMES", "averages_per_test", "ratios_vs", "hit_ratio",
           "read_traffic", "memory_per_cached_byte", "image_bytes", "zcache_fio_argv", "counter_delta", "calibrate"]
