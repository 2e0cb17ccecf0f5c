"""The backing-tier experiment (bench/exp_backing.py) against the fake system: its compcache
configuration passes the memory limit and the backing file and removes the file; a whole
run over every configuration leaves nothing behind and renders its table."""

from bench import exp_backing
from bench.context import Context
from bench.runner import Progress
from bench.system import Ledger

from .fakes import FakeSystem

MiB = 1 << 20


def test_compcache_backing_serves_with_a_limit_and_a_backing_file_and_removes_it():
    fs, ledger = FakeSystem(), Ledger()
    cfg = exp_backing.CompcacheBackingSwap(fs, ledger, "/work", 256 * MiB, "/bin/compcache", 8 * MiB)
    with cfg:
        argv = cfg.info["server_argv"]
        assert argv[argv.index("--mem-limit") + 1] == str(8 * MiB)
        assert argv[argv.index("--backing") + 1] == "/work/compcache-backing.img"
        assert "--mlock" in argv
        fs.files["/work/compcache-backing.img"] = ""  # the server created it
    assert "/work/compcache-backing.img" not in fs.files
    assert ledger.leftovers(fs) == [] and not ledger.files and not ledger.pids


def test_a_run_over_every_configuration_leaves_nothing_and_renders(tmp_path):
    fs, ledger = FakeSystem(), Ledger()
    fs.files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712"
    fs.files["/sys/module/zswap/parameters/enabled"] = "N"
    ctx = Context(fs, ledger, Progress(stream=open(tmp_path / "log", "w")), "/work", "/repo", list(exp_backing.CONFIGS),
                  "/bin/scan", "/bin/compcache", ("v1", "/sys/fs/cgroup/memory"))
    p = dict(exp_backing.QUICK, factors=[2.0], runs=2)
    out = exp_backing.run(ctx, p)
    point = out["points"][0]
    assert set(point["configs"]) == set(exp_backing.CONFIGS)
    for name, res in point["configs"].items():
        assert "error" not in res and "leftovers" not in res, (name, res)
    assert ledger.leftovers(fs) == []
    md = exp_backing.markdown({"backing_scan": out, "machine": {"kernel": "k", "cpus": 2}, "started_utc": "now"})
    assert "M = 128 MiB" in md and "compcache + backing" in md
