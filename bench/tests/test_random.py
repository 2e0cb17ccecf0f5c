"""The random-access swap experiment (issue 30): its rounds and rotation against the fake
system (every configuration set up and torn down each round, nothing left), its summaries and
its table from a synthetic results dict."""

import io

from bench import exp_random, params, report
from bench.context import Context
from bench.runner import Progress
from bench.system import Ledger

from .fakes import FakeSystem

MiB = 1 << 20
CONFIGS = ["zram-lz4", "disk", "compcache-swapon"]


def _ctx(fs, ledger):
    return Context(fs, ledger, Progress(io.StringIO()), "/work", "/repo", [], "/repo/tools/scan/scan",
                   "/bin/compcache", ("v1", "/sys/fs/cgroup/memory"))


def test_rotated_moves_the_first_configuration_each_round():
    assert exp_random.rotated(CONFIGS, 0) == CONFIGS
    assert exp_random.rotated(CONFIGS, 1) == ["disk", "compcache-swapon", "zram-lz4"]
    assert exp_random.rotated(CONFIGS, 3) == CONFIGS
    assert exp_random.rotated([], 2) == []


def test_parse_lookup_output_takes_the_last_json_line():
    out = exp_random.parse_lookup_output('warming up\n{"lookup_s": 1.5, "majflt_lookup": 9}\n')
    assert out == {"lookup_s": 1.5, "majflt_lookup": 9}


def test_params_make_the_table_larger_than_the_cgroup():
    for profile in ("quick", "full"):
        p = params.get(profile)["random"]
        assert p["table_mib"] << 20 >= 2 * p["limit_bytes"], "most lookups must wait for a swap-in"
        assert p["baseline"] in p["configs"]
        assert p["scan"]["mib"] << 20 > p["scan"]["limit_bytes"]


def test_rounds_alternate_and_leave_nothing_behind():
    fs, ledger = FakeSystem(), Ledger()
    p = dict(params.get("quick")["random"], rounds=2, configs=CONFIGS)
    out = exp_random.run(_ctx(fs, ledger), p)
    assert out["order"] == [CONFIGS, ["disk", "compcache-swapon", "zram-lz4"]]
    for name in CONFIGS:
        rounds = out["configs"][name]["rounds"]
        assert [r["round"] for r in rounds] == [0, 1]
        for r in rounds:
            assert "error" not in r and "leftovers" not in r, r
            assert r["lookup"]["status"] == "ok" and r["lookup"]["out"]["majflt_lookup"] == 7
            assert r["lookup"]["vmstat"] == {"pswpin": 5, "pswpout": 9, "pgmajfault": 6}
            # The fake's /proc/stat is 1.5 s busier at every read: 1.5 s over 14 pages swapped.
            assert r["lookup"]["cpu_busy_s"] == 1.5
            assert r["scan"]["status"] == "ok" and r["scan"]["out"]["mib"] == 1
    # compcache swapon's device was set up by swapon and taken down by compcache swapoff.
    assert any(c[1:3] == ["swapon", "--frontend"] for c in fs.commands)
    assert any(c[1:2] == ["swapoff"] for c in fs.commands)
    assert fs.swaps == [] and fs.loops == [] and ledger.leftovers(fs) == []
    assert ("/sys/class/zram-control/hot_remove", "5") in fs.writes
    s = out["summary"]["lookup:lookup_s"]["configs"]
    assert s["zram-lz4"]["ratio_median"] == 1.0 and s["compcache-swapon"]["times"] == [1.0, 1.0]
    assert round(s["zram-lz4"]["cpu_us_per_page"]) == round(1.5e6 / 14)


def test_a_failing_configuration_is_recorded_and_the_others_go_on():
    fs, ledger = FakeSystem(), Ledger()
    fs.fail["/bin/compcache"] = {2}  # the first call is `swapon --help`; the second, swapon itself
    p = dict(params.get("quick")["random"], rounds=1, configs=CONFIGS, scan=None)
    out = exp_random.run(_ctx(fs, ledger), p)
    assert "error" in out["configs"]["compcache-swapon"]["rounds"][0]
    assert out["configs"]["disk"]["rounds"][0]["lookup"]["status"] == "ok"
    assert "scan" not in out["configs"]["disk"]["rounds"][0]
    assert fs.swaps == [] and ledger.leftovers(fs) == []


def _synthetic():
    def run(lookup_s, wall_s, pswpin, status="ok"):
        return {"status": status, "wall_s": wall_s, "out": {"lookup_s": lookup_s, "build_s": wall_s - lookup_s,
                                                             "majflt_lookup": pswpin // 2},
                "vmstat": {"pswpin": pswpin, "pswpout": 2 * pswpin}, "device": {"num_reads": pswpin},
                "cg_pgmajfault": pswpin, "cpu_busy_s": 0.03 * pswpin}

    def cfg(label, lookups, scans):
        return {"label": label, "rounds": [{"round": i, "lookup": run(t, t + 10, 1000 * (i + 1)),
                                            "scan": {"status": "ok", "wall_s": sc}}
                                           for i, (t, sc) in enumerate(zip(lookups, scans))]}

    p = dict(params.get("quick")["random"], rounds=3)
    cfgs = {"zram-lz4": cfg("zram lz4", [2.0, 4.0, 2.0], [20.0, 20.0, 30.0]),
            "compcache-swapon": cfg("compcache swapon (FUSE, defaults)", [5.0, 6.0, 8.0], [25.0, 30.0, 30.0])}
    cfgs["compcache-swapon"]["rounds"][2]["lookup"]["status"] = "oom"
    cfgs["disk"] = {"label": "disk swap", "rounds": [{"round": 0, "skipped": "no fallocate"}]}
    out = {"params": p, "baseline": "zram-lz4", "configs": cfgs}
    out["summary"] = exp_random.summarize(out)
    return out


def test_summary_takes_ratios_within_each_round():
    s = _synthetic()["summary"]
    lk = s["lookup:lookup_s"]["configs"]["compcache-swapon"]
    # Rounds 1 and 2 (round 3 was OOM-killed): 5/2 and 6/4.
    assert lk["ratios"] == [2.5, 1.5] and lk["ratio_median"] == 2.0 and lk["failed"] == 1
    assert lk["majflt"] == 750 and lk["pswpin"] == 1500 and lk["device_reads"] == 1500
    # 0.03 s per swap-in over three pages swapped per swap-in: 10,000 us a page, every run.
    assert lk["cpu_us_per_page"] == 10000.0
    sc = s["scan:wall_s"]["configs"]["compcache-swapon"]
    assert sc["ratios"] == [1.25, 1.5, 1.0] and sc["ratio_min"] == 1.0 and sc["ratio_max"] == 1.5
    assert "disk" not in s["scan:wall_s"]["configs"]


def test_random_tables():
    md = report.random_tables(_synthetic())
    assert "- disk swap: round 1: no fallocate" in md
    assert "| compcache swapon (FUSE, defaults) | 5.00 6.00 (1 failed) | 5.50 | 2.00x (1.50-2.50) | 750 | 1500 | 3000 | 1500 | 10000.0 |" in md
    assert "| zram lz4 | 20.00 20.00 30.00 | 20.00 | 1.00x (1.00-1.00) |" in md
    assert "`scan 480 10` (cyclic) in a 256 MiB machine" in md
    res = {"profile": "quick", "machine": {}, "experiments": {"random": _synthetic()}}
    assert "random-access swap (issue 30)" in report.markdown(res)


def test_cpu_per_page_needs_busy_time_and_swapping():
    assert exp_random.cpu_us_per_page({"cpu_busy_s": 1.0, "vmstat": {"pswpin": 0, "pswpout": 0}}) is None
    assert exp_random.cpu_us_per_page({"vmstat": {"pswpin": 5}}) is None
