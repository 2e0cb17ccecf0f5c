"""The zcache experiment (seed 003): its parsers, summaries, tables and plot from a synthetic
results dict, and the setup and teardown of its disks against the fake system."""

import os

import pytest

from bench import cacheconf, exp_zcache, params, plots, report
from bench.parse import parse_proc_io
from bench.system import Ledger

from .fakes import FakeSystem

MiB = 1 << 20
TESTS = ["write", "read", "randread"]


# Parsers ---------------------------------------------------------------------------------

def test_parse_proc_io():
    io = parse_proc_io("rchar: 123\nwchar: 4\nsyscr: 5\nread_bytes: 81920\nwrite_bytes: 4096\n"
                       "cancelled_write_bytes: 0\n")
    assert io["read_bytes"] == 81920 and io["write_bytes"] == 4096 and io["rchar"] == 123


def test_parse_df_used():
    assert cacheconf.parse_df_used("     Used\n134217728\n") == 134217728
    with pytest.raises(ValueError):
        cacheconf.parse_df_used("df: /x: No such file or directory\n")


# Parameters and command lines ---------------------------------------------------------------

@pytest.mark.parametrize("profile", ["quick", "full"])
def test_params_make_the_file_larger_than_the_page_cache_and_the_budget(profile):
    p = params.get(profile)["zcache"]
    assert p["file_bytes"] > p["limit_bytes"], "the page cache must not hold the file"
    assert p["budget_bytes"] < p["file_bytes"], "an uncompressed cache must not hold the file"
    assert set(p["configs"]) <= set(cacheconf.CACHE_CONFIGS)
    assert exp_zcache.image_bytes(p["file_bytes"]) % 4096 == 0


def test_image_holds_the_file_and_the_filesystem():
    b = exp_zcache.image_bytes(256 * MiB)
    assert b >= 256 * MiB + 64 * MiB and b % MiB == 0


def test_fio_argv_writes_the_whole_file_and_caps_the_rest():
    p = params.get("quick")["zcache"]
    w = exp_zcache.zcache_fio_argv("write", "/m/f", p, 4096, "mmap")
    assert not any(a.startswith("--runtime") for a in w), "write lays the whole file down"
    assert "--ioengine=mmap" in w and "--invalidate=0" in w and "--buffer_compress_percentage=50" in w
    r = exp_zcache.zcache_fio_argv("randread", "/m/f", p, 4096, "psync")
    assert f"--runtime={p['runtime_s']}" in r and "--ioengine=psync" in r and "--rw=randread" in r


def test_slow_disk_filters_impose_the_seeds_disk():
    filters, args = cacheconf.slow_disk_filters(75e6, 1.4, 1.4, 0.1)
    assert filters == ["--filter=noparallel", "--filter=rate", "--filter=delay"]
    assert "rate=600000000" in args  # nbdkit's rate is in bits per second
    assert "rdelay=1.4ms" in args and "wdelay=1.4ms" in args and "serialize=all-requests" in args


# Summaries -----------------------------------------------------------------------------------

def test_counter_delta_only_numbers_in_both():
    d = exp_zcache.counter_delta({"cache_hits": 5, "cache_misses": 1, "comp_algorithm": "lz4"},
                                 {"cache_hits": 9, "cache_misses": 4, "origin_reads": 2})
    assert d == {"cache_hits": 4, "cache_misses": 3}


def test_hit_ratio():
    assert exp_zcache.hit_ratio({"cache_hits": 3, "cache_misses": 1}) == 0.75
    assert exp_zcache.hit_ratio({"cache_hits": 0, "cache_misses": 0}) is None
    assert exp_zcache.hit_ratio({}) is None


def test_memory_per_cached_byte():
    assert exp_zcache.memory_per_cached_byte({"orig_data_size": 100, "mem_used_total": 45}) == 0.45
    assert exp_zcache.memory_per_cached_byte({"orig_data_size": 0, "mem_used_total": 45}) is None


def _points(k, cache=None, fail=None):
    pts = []
    for i, rb in enumerate((4096, MiB)):
        for t in TESTS:
            pt = {"engine": "mmap", "record_bytes": rb, "test": t, "file_bytes": 256 * MiB, "status": "ok",
                  "bw_bytes": int(k * 1024 * 1000 * (1 + i)), "dev_read_bytes": 100 * MiB if t != "write" else 0,
                  "origin_read_bytes": int(100 * MiB * (1 / k)) if t != "write" else 0}
            if cache is not None and t != "write":
                pt["cache"] = dict(cache)
            if fail == (rb, t):
                pt.update(status="timeout", bw_bytes=None)
            pts.append(pt)
    return pts


def test_averages_ratios_and_read_traffic():
    direct = {"points": _points(1.0, fail=(MiB, "randread"))}
    comp = {"points": _points(2.0, cache={"cache_hits": 30, "cache_misses": 10})}
    a = exp_zcache.averages_per_test(direct, TESTS)
    assert a["write"] == 1.5 * 1024 * 1000 and a["randread"] == 1024 * 1000  # the timed-out point left out
    b = exp_zcache.averages_per_test(comp, TESTS, "mmap")
    assert exp_zcache.ratios_vs(a, b)["write"] == 2.0
    assert exp_zcache.averages_per_test(comp, TESTS, "psync") == {}
    tr = exp_zcache.read_traffic(comp)
    assert tr["dev_read_bytes"] == 400 * MiB and tr["origin_per_read"] == 0.5
    assert tr["cache"] == {"cache_hits": 120, "cache_misses": 40} and tr["hit_ratio"] == 0.75


# Tables and plot -------------------------------------------------------------------------------

def _zcache():
    p = dict(params.get("quick")["zcache"], tests=TESTS, record_sizes=[4096, MiB])
    cfgs = {
        "direct": {"label": "direct", "points": _points(1.0)},
        "nbdkit-file": {"label": "nbdkit file", "error": "RuntimeError: nbdfuse died"},
        "nbdkit-cache": {"label": "nbdkit cache", "points": _points(1.5),
                         "device": {"peak_cache_file_bytes": 120 * MiB}},
        "compcache-cache": {"label": "compcache cache", "points": _points(3.0, {"cache_hits": 9, "cache_misses": 1}),
                            "device": {"ratio_sample": {"orig_data_size": 200 * MiB, "mem_used_total": 90 * MiB}}},
    }
    slow = {"configs": {"direct": {"label": "direct", "points": _points(1.0)},
                        "compcache-cache": {"label": "compcache cache",
                                            "skipped": "compcache binary x has no cache mode yet"}},
            "order": ["direct", "compcache-cache"], "slow_disk": p["slow_disk"],
            "calibration": {"seq_read_1m": {"bw_bytes": 77e6, "iops": 73.4}, "rand_read_4k": {"bw_bytes": 2.9e6,
                                                                                            "iops": 708.0}}}
    return {"params": p, "variants": {"fast": {"configs": cfgs, "order": list(cfgs)}, "slow": slow}}


def test_zcache_tables_in_the_seeds_layout():
    md = report.zcache_tables(_zcache())
    # Average KB/s per test, ratio to direct in brackets: (1000 + 2000) / 2 = 1500 KB/s for direct.
    assert "| write | 1500 | 2250 (1.50) | 4500 (3.00) |" in md
    assert "- nbdkit file: error: RuntimeError: nbdfuse died" in md
    assert "- compcache cache: skipped: compcache binary x has no cache mode yet" in md
    # The cache table: hit ratio from compcache's counters, memory per cached byte 90/200.
    assert "| compcache cache | 400.0 | 133.3 | 0.33 | 90.0% | 200.0 | 90.0 | 0.45 |" in md
    assert "| nbdkit cache | 400.0 | 266.7 | 0.67 | - | 120.0 | 120.0 | 1 (uncompressed) |" in md
    assert "| read | 18 | 2 | 90.0% |" in md  # compcache's counters per test, over both record sizes
    # The seed's results matrix per configuration: KB, reclen, one column per test.
    assert "| 262144 | 4 | 3000 | 3000 | 3000 |" in md
    assert "77.0 MB/s sequential (1 MiB reads), 708 random 4 KiB reads/s" in md


def test_markdown_includes_zcache():
    res = {"profile": "quick", "machine": {}, "experiments": {"zcache": _zcache()}}
    assert "### zcache (seed 003)" in report.markdown(res)


def test_zcache_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    made = plots.plot_all({"experiments": {"zcache": _zcache()}}, str(tmp_path))
    assert sorted(os.path.basename(m) for m in made) == ["zcache_fast.png", "zcache_slow.png"]
    for m in made:
        with open(m, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# Setup and teardown against the fake system -----------------------------------------------------

def _assert_clean(fs, ledger):
    assert ledger.leftovers(fs) == []
    assert not any(getattr(ledger, k) for k in ("swaps", "loops", "mounts", "zrams", "cgroups", "pids", "files"))
    assert fs.loops == [] and fs.mounts == [] and fs.swaps == []


def _disk(name, fs, ledger, origin="/work/img"):
    return cacheconf.make_disk(name, fs, ledger, "/work", origin, 128 * MiB, f"fast-{name}", "/bin/compcache")


@pytest.mark.parametrize("name", cacheconf.CACHE_CONFIGS)
def test_each_disk_sets_up_and_leaves_nothing(name):
    fs, ledger = FakeSystem(), Ledger()
    fs.serve_help = "Usage: compcache serve --origin PATH --socket PATH"
    disk = _disk(name, fs, ledger)
    assert disk.unavailable() is None
    with disk:
        assert disk.device.startswith("/dev/loop")
        with cacheconf.Ext4Mount(fs, ledger, disk.device, "/work/mnt"):
            assert "/work/mnt" in fs.mounts
            disk.stats()
        assert not fs.swaps, "no swap in the cache experiment"
    _assert_clean(fs, ledger)


def test_direct_on_a_block_device_creates_nothing():
    fs, ledger = FakeSystem(), Ledger()
    with _disk("direct", fs, ledger, origin="/dev/loop3") as d:
        assert d.device == "/dev/loop3"
    assert not any(c[0] == "losetup" for c in fs.commands)


def test_nbdkit_cache_runs_a_cache_server_in_front_of_nbdkit_file_on_its_own_tmpfs():
    fs, ledger = FakeSystem(), Ledger()
    with _disk("nbdkit-cache", fs, ledger) as d:
        spawned = [c for c in fs.commands if "nbdkit" in c]
        inner, outer = spawned
        assert inner[-4:] == ["file", "/work/img", "cache=none", "fadvise=random"]
        assert outer[0] == "env" and outer[1] == f"TMPDIR={d.tmpfs}"
        assert "--filter=cache" in outer and f"socket={d.inner_socket}" in outer
        assert "cache=writethrough" in outer and f"cache-max-size={128 * MiB}" in outer
        assert "cache-on-read=true" in outer and "maxlen=65536" in outer
        assert d.tmpfs in fs.mounts
        assert d.stats()["cache_file_bytes"] == 1048576
        assert d.origin_reader_pid() == next(p.pid for p in fs.procs if p.argv == inner)
    _assert_clean(fs, ledger)


# losetup fails twice: without direct I/O it is tried again.
@pytest.mark.parametrize("step,calls", [("mount", 1), ("spawn:env", 1), ("spawn:nbdfuse", 1), ("losetup", {1, 2})])
def test_nbdkit_cache_cleans_up_when_a_setup_step_fails(step, calls):
    fs, ledger = FakeSystem(), Ledger()
    fs.fail[step] = calls
    with pytest.raises(Exception):
        with _disk("nbdkit-cache", fs, ledger):
            pass
    _assert_clean(fs, ledger)
    assert all(p.returncode is not None for p in fs.procs), "every process we started is stopped"


def test_compcache_cache_needs_a_binary_with_origin():
    fs, ledger = FakeSystem(), Ledger()
    assert "no cache mode yet" in _disk("compcache-cache", fs, ledger).unavailable()
    fs.serve_help = "Usage: compcache serve --origin PATH"
    d = _disk("compcache-cache", fs, ledger)
    assert d.unavailable() is None
    argv = d.server_argv("/s")
    assert argv[:6] == ["/bin/compcache", "serve", "--origin", "/work/img", "--mem-limit", str(128 * MiB)]
    assert "--readahead" not in argv
    fs.serve_help = "Usage: compcache serve --origin PATH --readahead SIZE"
    assert d.server_argv("/s")[-2:] == ["--readahead", "1M"]
    assert "--algorithm" not in d.server_argv("/s"), "lz4, the default, is not named"


def test_compcache_cache_zstd_is_the_same_disk_with_zstd():
    fs, ledger = FakeSystem(), Ledger()
    fs.serve_help = "Usage: compcache serve --origin PATH --readahead SIZE"
    d = _disk("compcache-cache-zstd", fs, ledger)
    argv = d.server_argv("/s")
    assert argv[:4] == ["/bin/compcache", "serve", "--origin", "/work/img"]
    assert argv[-2:] == ["--algorithm", "zstd"] and "--readahead" in argv
    assert d.label == "compcache cache (zstd)"


def test_slow_origin_is_a_loop_device_behind_the_filters():
    fs, ledger = FakeSystem(), Ledger()
    slow = params.get("quick")["zcache"]["slow_disk"]
    with cacheconf.SlowOrigin(fs, ledger, "/work", "/work/img", slow, tag="slow-direct-origin") as o:
        assert o.device.startswith("/dev/loop")
        srv = next(c for c in fs.commands if c[0] == "nbdkit")
        assert "--filter=noparallel" in srv and "cache=none" in srv and "/work/img" in srv
    _assert_clean(fs, ledger)


def test_ext4_mount_unmounts_lazily_when_busy():
    fs, ledger = FakeSystem(), Ledger()
    fs.fail["umount"] = {1, 2}
    with cacheconf.Ext4Mount(fs, ledger, "/dev/loop7", "/work/mnt"):
        pass
    assert ["umount", "-l", "/work/mnt"] in fs.commands
    assert ledger.mounts == []


def test_compcache_fuse_cache_is_one_server_on_its_own_loop_device_without_swap():
    fs, ledger = FakeSystem(), Ledger()
    with _disk("compcache-fuse-cache", fs, ledger) as d:
        argv = d.info["server_argv"]
        assert argv[1:2] == ["fuse"] and "--origin" in argv and "--mem-limit" in argv
        assert "--size" not in argv, "a cache has its origin's size"
        assert argv[argv.index("--recompress") + 1] == "off"
        assert argv[argv.index("--reserve") + 1] == "0", "no reserve priming: it would read the whole origin"
        assert d.device in fs.loops and not fs.swaps
        assert not any(c[0] == "nbdfuse" for c in fs.commands)
        assert d.origin_reader_pid() == d.server.pid
        assert d.stats()["orig_data_size"] == 4096000
    _assert_clean(fs, ledger)


def test_compcache_fuse_cache_needs_fuse_origin():
    fs, ledger = FakeSystem(), Ledger()
    fs.fuse_help = "Usage: compcache fuse --threads N"
    assert "names no --origin" in _disk("compcache-fuse-cache", fs, ledger).unavailable()
