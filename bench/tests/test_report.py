"""Tables and plots from a synthetic results dict shaped like a real run's."""

import os

import pytest

from bench import exp_app, exp_fio, exp_scan, plots, report

MiB = 1 << 20


def _runs(times, status="ok"):
    return [{"wall_s": t, "status": status, "returncode": 0, "oom_kills": 0} for t in times]


def _scan():
    configs = {}
    for name, label, base in (("noswap", "no swap", None), ("disk", "disk swap", 10.0), ("zram-lz4", "zram lz4", 6.0),
                              ("compcache", "compcache", None)):
        if name == "compcache":
            configs[name] = {"label": label, "skipped": "compcache binary not found"}
            continue
        if base is None:
            rec_runs = _runs([1.0, 1.1, 1.2, 1.0, 1.0])
        else:
            rec_runs = _runs([base / 2, base, base + 1, base - 1, base])
        rec = {"runs": rec_runs, **exp_scan.summarize_runs(rec_runs)}
        if name == "zram-lz4":
            rec.update({"peak_mem_used_total": 3 * MiB, "compression_ratio": 3.5})
        sweep = []
        for mode in ("cyclic", "once"):
            for f in (1.0, 2.0):
                if name == "noswap" and f > 1:
                    runs = [{"wall_s": 0.3, "status": "oom", "returncode": -9, "oom_kills": 1}]
                else:
                    runs = _runs([f * (base or 1), f * (base or 1) * 1.1])
                sweep.append({"mode": mode, "factor": f, "mib": int(f * 64), "runs": runs,
                              **exp_scan.summarize_runs(runs)})
                if name == "zram-lz4" and mode == "cyclic":
                    sweep[-1].update({"compression_ratio": 2.0 * f, "ratio_sample": {"orig_data_size": int(f * MiB)}})
        configs[name] = {"label": label, "recipe": rec, "sweep": sweep}
    params = {"recipe_mib": 480, "recipe_passes": 10, "recipe_mode": "cyclic", "recipe_limit_bytes": 512 * MiB,
              "recipe_runs": 5, "sweep_limit_bytes": 64 * MiB, "sweep_passes": 3, "sweep_modes": ["cyclic", "once"]}
    return {"params": params, "configs": configs, "speedup_vs_disk": exp_scan.speedups(configs)}


def _fio():
    tests = ["write", "read", "bkwdread"]
    cfgs = {}
    for name, label, k in (("noswap", "no swap", 1.0), ("zram-lz4", "zram lz4", 0.5)):
        pts = [{"file_bytes": 256 * MiB, "record_bytes": rb, "test": t, "status": "ok",
                "bw_bytes": int(k * 100e6 * (1 + i))} for i, rb in enumerate((4096, MiB)) for t in tests]
        cfgs[name] = {"label": label, "points": pts}
    return {"params": {"limit_bytes": 128 * MiB, "ballast_factor": 0.5, "tests": tests}, "configs": cfgs,
            "order": ["noswap", "zram-lz4"]}


def _app():
    sizes = {}
    for i, pct in enumerate((0, 50)):
        pts = [{"n": 4, "status": "ok", "total_s": 1.5 + i, "cycle_s": [0.5, 0.5, 0.5]},
               {"n": 8, "status": "oom" if pct == 0 else "ok", "total_s": 3.0, "cycle_s": [1, 1, 1]}]
        if pct:
            pts[1].update({"compression_ratio": 4.2, "ratio_sample": {"orig_data_size": 42 * MiB,
                                                                      "compr_data_size": 9 * MiB,
                                                                      "mem_used_total": 10 * MiB}})
        sizes[f"C{i}"] = {"label": f"C{i}", "percent": pct, "points": pts}
    return {"params": {"cycles": 3, "instance_mib": 16, "limit_bytes": 128 * MiB, "counts": [4, 8]},
            "backend": "zram-lz4", "sizes": sizes}


def _results():
    return {"profile": "quick", "started_utc": "2026-01-01T00:00:00Z",
            "machine": {"kernel": "6.18", "cpus": 2, "mem_total_kib": 24 << 20, "cgroup": ["v1", "/x"],
                        "versions": {"fio": "fio-3.33"}},
            "experiments": {"scan": _scan(), "fio": _fio(), "app": _app()}, "leftovers": []}


def test_summarize_runs_ignores_first_and_fails_on_oom():
    s = exp_scan.summarize_runs(_runs([9.0, 2.0, 4.0]))
    assert s["mean_s"] == 3.0 and s["median_s"] == 3.0 and s["counted_runs"] == 2
    assert exp_scan.summarize_runs(_runs([5.0]))["mean_s"] == 5.0
    bad = _runs([1.0]) + [{"wall_s": 1, "status": "oom"}]
    assert exp_scan.summarize_runs(bad) == {"status": "oom", "mean_s": None, "median_s": None, "counted_runs": 0}


def test_speedup_is_the_seeds_formula():
    sp = exp_scan.speedups({"disk": {"recipe": {"mean_s": 206.0}}, "zram": {"recipe": {"mean_s": 137.0}},
                            "noswap": {"recipe": {"mean_s": None}}})
    assert sp["zram"]["speedup"] == pytest.approx(0.335, abs=1e-3)  # seed 004: 33%
    assert sp["disk"]["speedup"] == 0 and "noswap" not in sp


def test_time_against_the_hdd_disk_swap():
    cfgs = {"disk": {"label": "disk swap", "recipe": {"mean_s": 20.0}},
            "disk-hdd": {"label": "disk swap (HDD figures)", "recipe": {"mean_s": 200.0}},
            "compcache-fuse": {"label": "compcache (FUSE)", "recipe": {"mean_s": 22.0}}}
    sp = exp_scan.speedups(cfgs)
    assert sp["compcache-fuse"]["x_over_disk_hdd"] == pytest.approx(0.11)
    assert sp["disk"]["speedup"] == 0 and "x_over_disk_hdd" not in exp_scan.speedups({"disk": cfgs["disk"]})["disk"]
    line = report._hdd_line(cfgs, sp)[0]
    assert "compcache (FUSE) 0.11x" in line and "disk swap 0.10x" in line and "(HDD figures) 1.00x" not in line
    # Without disk, only the HDD figure: the seed's speedup column stays empty, no KeyError.
    assert "speedup" not in exp_scan.speedups({k: v for k, v in cfgs.items() if k != "disk"})["compcache-fuse"]


def test_fio_compare_pairs_points():
    f = _fio()
    pairs = exp_fio.compare(f["configs"]["noswap"]["points"], f["configs"]["zram-lz4"]["points"])
    assert len(pairs) == 6 and all(p["ratio"] == 0.5 for p in pairs)


def test_fio_argv_mirrors_iozone_tests():
    a = exp_fio.fio_argv("bkwdread", "/f", 256 * MiB, 4096, 3)
    assert "--rw=read:-8192" in a and "--ioengine=mmap" in a
    assert "--rw=read:65536" in exp_fio.fio_argv("strideread", "/f", MiB, 4096, 3)
    assert "--rw_sequencer=identical" in exp_fio.fio_argv("recrewrite", "/f", MiB, 4096, 3)


def test_markdown_has_every_table():
    md = report.markdown(_results())
    assert "scan recipe: `scan 480 10`" in md
    assert "| disk swap | 5.00 10.00 11.00 9.00 10.00 | 10.00 | 10.00 | 9.00-11.00 | +0% |" in md
    assert "4.00:1 (cyclic 2x)" in md
    assert "+40%" in md  # zram: (10 - 6) / 10
    assert "3.50:1" in md
    assert "skipped: compcache binary not found" in md
    assert "scan sweep, cyclic" in md and "scan sweep, once" in md
    assert "| 2x | 128 | OOM |" in md
    assert "no swap / zram lz4" in md and "| backward read | 150 | 75 | 0.50 | 0.50 |" in md
    assert "| 8 | OOM | 3.00 |" in md
    assert "| C1 | 8 | 42.0 | 9.0 | 10.0 | 4.20:1 |" in md


def test_markdown_reports_leftovers():
    r = _results()
    r["leftovers"] = ["swap /dev/zram9"]
    assert "Left behind after the run:** swap /dev/zram9" in report.markdown(r)


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    made = plots.plot_all(_results(), str(tmp_path))
    names = sorted(os.path.basename(m) for m in made)
    assert names == ["app_cycle.png", "fio_256MiB.png", "scan_recipe.png", "scan_sweep_cyclic.png",
                     "scan_sweep_once.png"]
    for m in made:
        with open(m, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_app_settled_figures_are_read_and_reported():
    st = exp_app.settled({"orig_data_size": 200 << 20, "mem_used_total": 50 << 20, "recompress_done": 9000,
                          "bd_count": 7000}, 60)
    assert st == {"after_s": 60, "orig_data_size": 200 << 20, "mem_used_total": 50 << 20, "recompress_done": 9000,
                  "bd_count": 7000, "compression_ratio": 4.0}
    assert exp_app.settled({"orig_data_size": 1 << 20, "mem_used_total": 1 << 18}, 60)["compression_ratio"] is None
    app = {"params": {"cycles": 3, "instance_mib": 16, "limit_bytes": 128 << 20, "counts": [20]},
           "backend": "compcache-fuse-recompress",
           "sizes": {"C4": {"percent": 100, "points": [{"n": 20, "status": "ok", "total_s": 3.8,
                                                        "compression_ratio": 2.89,
                                                        "ratio_sample": {"orig_data_size": 200 << 20},
                                                        "settled": st}]}}}
    md = report.app_tables(app)
    assert "| C4 | 20 | 60 | 200.0 | 50.0 | 9000 | 7000 | 4.00:1 |" in md
    st["bd_count"] = 0  # no cold tier, or nothing in it
    assert "| C4 | 20 | 60 | 200.0 | 50.0 | 9000 | - | 4.00:1 |" in report.app_tables(app)
    del app["sizes"]["C4"]["points"][0]["settled"]
    assert "idle" not in report.app_tables(app)
