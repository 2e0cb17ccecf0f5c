"""Setup/teardown of every configuration against a fake system: everything created is
undone, also when a step fails half-way, and nothing not ours is touched."""

import signal

import pytest

from bench import suite
from bench.cgroup import MemoryCgroup
from bench.swapconf import ALL_CONFIGS, TeardownError, make_config
from bench.system import CommandError, Ledger

from .fakes import FakeSystem

MiB = 1 << 20


def _config(name, fs, ledger):
    return make_config(name, fs, ledger, "/work", 64 * MiB, compcache_bin="/bin/compcache")


def _assert_clean(fs, ledger):
    assert ledger.leftovers(fs) == []
    assert not any(getattr(ledger, k) for k in ("swaps", "loops", "mounts", "zrams", "cgroups", "pids", "files"))
    assert fs.swaps == [] and fs.loops == [] and fs.mounts == []


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_each_config_sets_up_and_leaves_nothing(name):
    fs, ledger = FakeSystem(), Ledger()
    with _config(name, fs, ledger) as cfg:
        if name != "noswap":
            assert len(fs.swaps) == 1, "one swap device while the configuration is active"
            assert cfg.info
        cfg.stats()
    _assert_clean(fs, ledger)


def test_zram_uses_own_device_and_removes_only_it():
    fs, ledger = FakeSystem(), Ledger()
    fs.dirs.add("/sys/block/zram0")  # someone else's device
    with _config("zram-lz4", fs, ledger) as cfg:
        assert cfg.info["device"] == "/dev/zram5"
        assert ("/sys/block/zram5/comp_algorithm", "lz4") in fs.writes
        st = cfg.stats()
        assert st["orig_data_size"] == 8388608 and st["num_writes"] == 20
    assert ("/sys/class/zram-control/hot_remove", "5") in fs.writes
    assert "/sys/block/zram0" in fs.dirs
    assert not any("zram0" in p for p, _ in fs.writes)


def test_zram_rejects_missing_algorithm_and_cleans_up():
    fs, ledger = FakeSystem(), Ledger()
    cfg = make_config("zram-zstd", fs, ledger, "/work", MiB)
    with pytest.raises(RuntimeError, match="no zstd"):
        with cfg:
            pass
    _assert_clean(fs, ledger)
    assert ("/sys/class/zram-control/hot_remove", "5") in fs.writes


def _set_up_failing(name, failing):
    """Sets configuration `name` up on a fake system whose step `failing` fails; checks that
    the failure is raised and everything undone, and returns the fake system."""
    fs, ledger = FakeSystem(), Ledger()
    fs.fail[failing] = 1
    with pytest.raises(CommandError):
        with _config(name, fs, ledger):
            pass
    _assert_clean(fs, ledger)
    return fs


def test_zswap_restores_enabled_even_when_swapon_fails():
    fs = _set_up_failing("zswap", "swapon")
    assert fs.files["/sys/module/zswap/parameters/enabled"] == "N"
    assert "/work/zswap.swapfile" not in fs.files


def test_zswap_restores_after_run():
    fs, ledger = FakeSystem(), Ledger()
    with _config("zswap", fs, ledger):
        assert fs.files["/sys/module/zswap/parameters/enabled"] == "Y"
    assert fs.files["/sys/module/zswap/parameters/enabled"] == "N"


def test_readahead_off_only_while_the_device_is_up_and_restored_when_setup_fails():
    fs, ledger = FakeSystem(), Ledger()
    with _config("compcache-swapon-ra0", fs, ledger) as cfg:
        assert fs.files["/proc/sys/vm/page-cluster"] == "0"
        assert cfg.info["page_cluster_before"] == "3"
    assert fs.files["/proc/sys/vm/page-cluster"] == "3"
    _assert_clean(fs, ledger)
    fs = _set_up_failing("compcache-swapon-ra0", "/bin/compcache")
    assert fs.files["/proc/sys/vm/page-cluster"] == "3"


@pytest.mark.parametrize("name", ["nbdkit-zstd", "compcache", "disk-hdd"])
@pytest.mark.parametrize("failing", ["mkswap", "swapon", "losetup", "spawn:nbdfuse", "spawn:server"])
def test_nbd_chain_undone_when_a_setup_step_fails(name, failing):
    fs, ledger = FakeSystem(), Ledger()
    if failing == "spawn:server":
        failing = "spawn:compcache" if name == "compcache" else "spawn:nbdkit"
    fs.fail[failing] = {1, 2}  # losetup: with and without direct I/O
    with pytest.raises(CommandError):
        with _config(name, fs, ledger):
            pass
    _assert_clean(fs, ledger)
    assert all(p.returncode is not None for p in fs.procs), "server and nbdfuse stopped"


def test_loop_falls_back_to_buffered_io_and_records_it():
    fs, ledger = FakeSystem(), Ledger()
    fs.fail["losetup"] = 1
    with _config("nbdkit-zstd", fs, ledger) as cfg:
        assert cfg.info["loop_dio_requested"] is False
    _assert_clean(fs, ledger)


def test_nbd_teardown_order_swapoff_before_server_stops():
    fs, ledger = FakeSystem(), Ledger()
    with _config("nbdkit-zstd", fs, ledger) as cfg:
        server = cfg.server
    cmds = [c[0] for c in fs.commands]
    assert cmds.index("swapoff") < cmds.index("losetup", cmds.index("swapoff")) < cmds.index("fusermount3")
    assert server.returncode is not None
    assert "--swap" in cfg.info["server_argv"], "nbdkit locks itself in memory"


def test_compcache_served_with_mlock_and_discard():
    fs, ledger = FakeSystem(), Ledger()
    with _config("compcache", fs, ledger) as cfg:
        assert "--mlock" in cfg.info["server_argv"]
        assert cfg.info["swap_discard"] == "pages"
        assert any(c[0] == "swapon" and "--discard=pages" in c for c in fs.commands)
        assert cfg.stats()["orig_data_size"] == 4096000


def test_compcache_configs_measure_lz4_alone_unless_they_ask_for_recompression():
    # compcache recompresses by default; the suite's "compcache lz4" must not.
    for name, want in (("compcache", ["--recompress", "off"]), ("compcache-fuse-recompress", ["--recompress", "on"])):
        fs, ledger = FakeSystem(), Ledger()
        with _config(name, fs, ledger):
            argv = next(c for c in fs.commands if c[0] == "/bin/compcache" and c[1] in ("serve", "fuse") and "--help" not in c)
            at = argv.index("--recompress")
            assert argv[at:at + 2] == want and argv.count("--recompress") == 1, argv


def test_the_cold_tier_config_gives_the_tier_the_device_size_in_whole_mib():
    fs, ledger = FakeSystem(), Ledger()
    with _config("compcache-fuse-cold", fs, ledger):
        argv = next(c for c in fs.commands if c[0] == "/bin/compcache" and c[1] == "fuse" and "--help" not in c)
        size = int(argv[argv.index("--size") + 1])
        assert argv[argv.index("--cold-tier") + 1] == f"{max(4, size >> 20)}M", argv
        assert argv[argv.index("--recompress") + 1] == "on" and "--cold-idle" in argv, argv


def test_disk_hdd_is_a_swap_file_behind_the_seeds_disk():
    fs, ledger = FakeSystem(), Ledger()
    with _config("disk-hdd", fs, ledger) as cfg:
        argv = cfg.info["server_argv"]
        assert argv[:2] == ["nbdkit", "--swap"] and "--filter=delay" in argv and "rdelay=1.4ms" in argv
        assert argv[argv.index("file") + 1] == cfg.path == "/work/disk-hdd.swapfile"
        assert cfg.path in ledger.files
        swapon = [c for c in fs.commands if c[0] == "swapon"]
        assert len(swapon) == 1 and not any(a.startswith("--discard") for a in swapon[0]), "no discard, as disk swap"
    assert cfg.path not in fs.files
    _assert_clean(fs, ledger)


def test_fuse_uring_enables_uring_only_while_the_server_starts():
    fs, ledger = FakeSystem(), Ledger()
    with _config("compcache-fuse-uring", fs, ledger) as cfg:
        assert "--io-uring" in cfg.info["server_argv"] and cfg.info["transport"] == "io_uring"
        assert fs.read("/sys/module/fuse/parameters/enable_uring") == "N", "put back as found"
    assert [v for p, v in fs.writes if p.endswith("enable_uring")] == ["Y", "N"]
    _assert_clean(fs, ledger)


def test_fuse_uring_refuses_a_server_that_fell_back_to_dev_fuse():
    fs, ledger = FakeSystem(), Ledger()
    fs.fail["write:/sys/module/fuse/parameters/enable_uring"] = 1  # the kernel refuses Y
    with pytest.raises(CommandError):
        with _config("compcache-fuse-uring", fs, ledger):
            pass
    _assert_clean(fs, ledger)
    fs, ledger = FakeSystem(), Ledger()
    orig = fs.write
    fs.write = lambda path, v: None if path.endswith("enable_uring") else orig(path, v)  # ignored
    with pytest.raises(RuntimeError, match="not serving through io_uring"):
        with _config("compcache-fuse-uring", fs, ledger):
            pass
    _assert_clean(fs, ledger)


def test_compcache_missing_binary_is_a_skip_reason():
    fs = FakeSystem()
    cfg = make_config("compcache", fs, Ledger(), "/work", MiB, compcache_bin=None)
    assert "cargo build --release" in cfg.unavailable()


def test_teardown_runs_every_step_and_reports_failures():
    fs, ledger = FakeSystem(), Ledger()
    cfg = _config("nbdkit-zstd", fs, ledger)
    cfg.setup()
    fs.fail["swapoff"] = 1
    with pytest.raises(TeardownError, match="swapoff"):
        cfg.teardown()
    # Later steps still ran: loop detached, mount gone, processes stopped.
    assert fs.loops == [] and fs.mounts == []
    assert all(p.returncode is not None for p in fs.procs)


def test_cgroup_v1_noswap_limits_memsw_and_kills_leftover_tasks():
    fs, ledger = FakeSystem(), Ledger()
    with MemoryCgroup(fs, ledger, "cg", 128 * MiB, allow_swap=False) as cg:
        assert cg.version == "v1"
        assert fs.files["/sys/fs/cgroup/memory/cg/memory.limit_in_bytes"] == str(128 * MiB)
        assert fs.files["/sys/fs/cgroup/memory/cg/memory.memsw.limit_in_bytes"] == str(128 * MiB)
        assert cg.wrap(["scan", "1", "1"])[-3:] == ["scan", "1", "1"]
        p = fs.spawn(["sleep"])
        fs.files[cg.procs_file()] = f"{p.pid}\n"
        fs.files["/sys/fs/cgroup/memory/cg/memory.oom_control"] = "oom_kill 2\n"
        assert cg.oom_kills_since_setup() == 2
        assert cg.usage() == {"anon_bytes": 100, "file_bytes": 50, "swap_bytes": 7}
        fs.files[cg.procs_file()] = ""  # the fake does not move tasks out by itself
        fs.kill(p.pid, signal.SIGKILL)
    assert "/sys/fs/cgroup/memory/cg" not in fs.dirs
    assert ledger.cgroups == []


def test_cgroup_v2_sets_swap_max():
    fs, ledger = FakeSystem(), Ledger()
    fs.files["/sys/fs/cgroup/unified/cgroup.subtree_control"] = "cpu memory"
    with MemoryCgroup(fs, ledger, "cg", 64 * MiB, allow_swap=False) as cg:
        fs.files["/sys/fs/cgroup/unified/cg/memory.swap.max"] = ""
        assert cg.version == "v2"
        assert fs.files["/sys/fs/cgroup/unified/cg/memory.max"] == str(64 * MiB)
    assert ledger.cgroups == []


def test_nested_failure_unwinds_cgroup_and_config():
    """An exception inside an experiment step tears down the cgroup, then the device."""
    fs, ledger = FakeSystem(), Ledger()
    with pytest.raises(KeyboardInterrupt):
        with _config("zram-lzo-rle", fs, ledger):
            with MemoryCgroup(fs, ledger, "cg", MiB, allow_swap=True):
                raise KeyboardInterrupt  # Ctrl-C; SIGTERM raises suite.Interrupted the same way
    _assert_clean(fs, ledger)


def test_sigterm_becomes_a_base_exception():
    assert issubclass(suite.Interrupted, BaseException) and not issubclass(suite.Interrupted, Exception)
    with pytest.raises(suite.Interrupted):
        suite._on_sigterm(signal.SIGTERM, None)


def test_preflight_refuses_non_root_and_missing_tools():
    fs = FakeSystem(root=False)
    fs.tools.discard("fio")
    fs.tools.discard("nbdfuse")
    problems = suite.preflight(fs, ["scan", "fio"], ["noswap", "nbdkit-zstd"], None)
    text = "\n".join(problems)
    assert "must run as root" in text
    assert "required tool missing: fio" in text
    assert "required tool missing: nbdfuse (Debian package libnbd-bin" in text


def test_preflight_ok_and_ignores_tools_of_unselected_configs():
    fs = FakeSystem()
    fs.tools.discard("nbdkit")
    fs.files["/usr/bin/python3"] = ""
    assert suite.preflight(fs, ["scan"], ["noswap", "disk", "zram-lz4"], None) == []


def test_scan_experiment_survives_a_failing_config_and_leaves_nothing(tmp_path):
    from bench import exp_scan, params
    from bench.context import Context
    from bench.runner import Progress
    import io

    fs, ledger = FakeSystem(), Ledger()
    fs.fail["spawn:nbdkit"] = 1
    log = io.StringIO()
    ctx = Context(fs, ledger, Progress(stream=log), "/work", "/repo",
                  ["noswap", "nbdkit-zstd", "zram-lz4", "compcache"], "/bin/scan", None, ("v1", "/sys/fs/cgroup/memory"))
    p = params.get("quick")["scan"]
    p.update({"recipe_runs": 2, "sweep_factors": [1.0], "sweep_modes": ["cyclic"], "sweep_runs": 1})
    p["pressure_recipe"] = {"mib": 2, "passes": 1, "mode": "cyclic", "limit_bytes": MiB, "runs": 2}
    active = []
    real_spawn = fs.spawn

    def spawn(argv, **kw):
        if "/bin/scan" in argv:
            active.append(list(fs.swaps))  # which swap devices were on while each workload ran
        return real_spawn(argv, **kw)

    fs.spawn = spawn
    out = exp_scan.run(ctx, p)
    zr = out["configs"]["zram-lz4"]
    assert [len(zr[k]["runs"]) for k in ("recipe", "pressure")] == [2, 2]
    assert len(zr["sweep"]) == 1 and zr["sweep"][0]["status"] == "ok"
    # Every workload of a swap configuration ran while its device was on (noswap: none).
    assert active[:5] == [[]] * 5 and active[5:10] == [["/dev/zram5"]] * 5 and len(active) == 10
    assert "injected failure" in out["configs"]["nbdkit-zstd"]["error"]
    assert out["configs"]["zram-lz4"]["recipe"]["status"] == "ok"
    assert "cargo build" in out["configs"]["compcache"]["skipped"]
    assert "FAILED" in log.getvalue() and "skipped" in log.getvalue()
    _assert_clean(fs, ledger)
    assert not [d for d in fs.dirs if "compcache-bench" in d], "every cgroup removed"


def test_run_suite_refuses_before_touching_anything(tmp_path):
    fs = FakeSystem(root=False)
    with pytest.raises(SystemExit, match="refusing to start:\n  must run as root"):
        suite.run_suite("quick", ["scan"], ["noswap"], str(tmp_path / "out"), "/work", system=fs)
    assert fs.commands == [] and fs.writes == [] and not (tmp_path / "out").exists()


def test_cli_rejects_unknown_configs_and_bad_overrides(capsys):
    from bench import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--configs", "noswap,floppy"])
    assert "unknown: floppy" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "--set", "nosuch.key=1"])
    assert "--set wants EXP.KEY=VALUE" in capsys.readouterr().err
