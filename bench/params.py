"""Experiment parameters: the quick set (everything in under 10 minutes) and the full set.

Every value here is recorded in results.json, so a table can always be traced back to the
parameters that made it."""

from __future__ import annotations

import copy

from .swapconf import SEED_HDD

MiB = 1 << 20

QUICK = {
    "scan": {
        # Seed 004's recipe: `scan 480 10` in a 512 MiB machine, 5 runs, mean of runs 2..5.
        "recipe_limit_bytes": 512 * MiB,
        "recipe_mib": 480,
        "recipe_passes": 10,
        "recipe_runs": 5,
        "recipe_mode": "cyclic",
        # The recipe at the seed's memory pressure: the seed's 512 MB guest also held its OS,
        # and its scan kept 28-32 MB in swap; a cgroup holds only scan, so `scan 480` in 512 MiB
        # does not swap at all. 480 MiB in 448 MiB restores the pressure. Slow (a minute a run
        # on the NBD paths), so only in --full; None skips it.
        "pressure_recipe": None,
        # None: scan's built-in content mix; or a raw page dump such as data/pages-mixed.bin.
        "pages_file": None,
        # The sweep: M from 1.0x to 2.5x of the limit, both access patterns.
        "sweep_limit_bytes": 64 * MiB,
        # mode -> factors of the limit; the quick set samples use-once more sparsely.
        "sweep_modes": {"cyclic": [1.0, 1.5, 2.0, 2.5], "once": [2.0]},
        "sweep_passes": 2,
        "sweep_runs": 2,
        "swap_size_bytes": 1024 * MiB,
        "run_timeout_s": 180,
    },
    "fio": {
        "limit_bytes": 128 * MiB,
        "file_factors": [2.0],
        "record_sizes": [4096, 1 << 20],
        "tests": ["write", "rewrite", "read", "reread", "randread", "randwrite", "bkwdread", "recrewrite",
                  "strideread"],
        # Anonymous memory in the machine besides the file I/O: what swap can move out of
        # the way of the page cache (seed 000's point).
        "ballast_factor": 0.5,
        "runtime_s": 2,
        "swap_size_bytes": 256 * MiB,
        "run_timeout_s": 120,
    },
    "app": {
        "limit_bytes": 128 * MiB,
        "instance_mib": 16,
        "counts": [4, 8, 12, 16, 20],
        "size_percents": [0, 25, 50, 75, 100],
        "cycles": 3,
        "point_timeout_s": 120,
        # Seconds the instances stay alive and idle after the cycles before the device's
        # figures are read again ("settled": recompression's idle pages; 0: not done).
        "settle_s": 0,
    },
    "zcache": {
        # Seed 003 had a 1 GiB file and 1 GiB of RAM (the page cache's share of it smaller
        # still). Here the page cache is a memory cgroup well below the file, and the budget
        # of both caches is half the file: compressed about 2:1, compcache can hold most of
        # the file; uncompressed, nbdkit's cache filter can hold half of it. With the page
        # cache beside it, compressed page cache + compressed cache ~ file, as in the seed
        # (~800 MB page cache + three 10% pools). 96 MiB cgroup, 256 MiB file, 128 MiB budget.
        "file_bytes": 256 * MiB,
        "limit_bytes": 96 * MiB,
        "budget_bytes": 128 * MiB,
        "record_sizes": [4096, 1 << 20],
        # mmap: iozone -B, as in the seed; psync: plain read(2)/write(2).
        "engines": ["mmap"],
        "tests": ["write", "rewrite", "read", "reread", "randread", "randwrite", "bkwdread", "recrewrite",
                  "strideread"],
        # Every test but write (which lays the file down) stops after runtime_s.
        "runtime_s": 2,
        "run_timeout_s": 180,
        # fio's buffer_compress_percentage: each page about half random, half zeros (~2:1).
        "compress_percentage": 50,
        "variants": ["fast", "slow"],
        # compcache's cache both through nbdfuse + loop (compcache-cache: two userspace hops) and
        # through its own FUSE file + loop (compcache-fuse-cache: one).
        "configs": ["direct", "nbdkit-file", "nbdkit-cache", "compcache-cache", "compcache-fuse-cache"],
        # zstd only on the slow disk, where a miss costs most (compcache-cache-zstd).
        "slow_configs": ["direct", "nbdkit-file", "nbdkit-cache", "compcache-cache", "compcache-fuse-cache",
                         "compcache-cache-zstd"],
        # The seed's hard disk: ~75 MB/s sequential, ~700 random 4 KiB reads/s (its iozone
        # random read at 4 KiB records: 2770 KB/s). See bench/cacheconf.py's slow_disk_filters.
        "slow_disk": dict(SEED_HDD),
        # Seconds of fio on the slow origin alone, per run, to record what it delivers (0: skip).
        "calibrate_s": 2,
    },
    "random": {
        # Issue 30: SQLite (bench/apps/sqlite_lookup.py) builds an in-memory table of
        # table_mib, two and a half times what the cgroup lets it keep in RAM, then answers `lookups`
        # point queries by random key: most lookups wait for a swap-in.
        "limit_bytes": 128 * MiB,
        "table_mib": 320,
        "lookups": 150000,
        "seed": 30,
        # Each round sets up every configuration in turn (the order rotated per round) and
        # runs the program, then the scan recipe below, against it.
        "rounds": 3,
        "configs": ["zram-lz4", "disk", "compcache-swapon"],
        # Ratios are taken to this configuration's run in the same round.
        "baseline": "zram-lz4",
        # The README's sequential figure: `scan 480 10` in 256 MiB. None: the program only.
        "scan": {"mib": 480, "passes": 10, "limit_bytes": 256 * MiB, "mode": "cyclic"},
        "swap_size_bytes": 1024 * MiB,
        "run_timeout_s": 600,
    },
}

FULL = copy.deepcopy(QUICK)
FULL["scan"].update({
    "pressure_recipe": {"mib": 480, "passes": 10, "mode": "cyclic", "limit_bytes": 448 * MiB, "runs": 5},
    "sweep_limit_bytes": 512 * MiB,
    "sweep_modes": {"cyclic": [1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5], "once": [1.0, 1.5, 2.0, 2.5]},
    "sweep_passes": 10,
    "sweep_runs": 5,
    "swap_size_bytes": 2048 * MiB,
    "run_timeout_s": 1800,
})
FULL["fio"].update({
    "limit_bytes": 512 * MiB,
    "file_factors": [0.5, 1.0, 2.0],
    "record_sizes": [4096 << i for i in range(0, 13)],  # 4 KiB .. 16 MiB
    "runtime_s": 10,
    "swap_size_bytes": 1024 * MiB,
    "run_timeout_s": 600,
})
FULL["zcache"].update({
    # The seed's file; a cgroup of half of it and the same budget: page cache + compressed
    # cache ~ the file again.
    "file_bytes": 1024 * MiB,
    "limit_bytes": 512 * MiB,
    "budget_bytes": 512 * MiB,
    "record_sizes": [4096 << i for i in range(0, 13)],  # 4 KiB .. 16 MiB, as iozone -a -y 4k
    "engines": ["mmap", "psync"],
    "runtime_s": 10,
    "run_timeout_s": 900,
    "calibrate_s": 5,
})
FULL["random"].update({"rounds": 5})
FULL["app"].update({
    "limit_bytes": 512 * MiB,
    "instance_mib": 32,
    "counts": [8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64],
    "point_timeout_s": 1800,
})


def get(profile: str) -> dict:
    if profile not in ("quick", "full"):
        raise ValueError(f"unknown profile {profile!r}")
    return copy.deepcopy(QUICK if profile == "quick" else FULL)
