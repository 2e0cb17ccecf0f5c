"""The soak's pure parts (bench/soak.py): the leak check on RSS beyond the store, the scan
progress parser, the totals and verdict, and the markdown report. The soak itself needs root
and an hour; these need neither."""

from bench import soak

MiB = 1 << 20
GiB = 1 << 30


def series(n, rss_of_t, store_of_t, dt=5.0):
    return [{"t": i * dt, "rss": rss_of_t(i * dt), "store": store_of_t(i * dt)} for i in range(n)]


def test_store_growth_alone_is_not_a_leak():
    # The store grows and shrinks with what is swapped out; RSS follows it with a fixed
    # overhead: no leak however big the store gets.
    s = series(360, lambda t: 40 * MiB + int(t * 200_000) % (300 * MiB), lambda t: int(t * 200_000) % (300 * MiB))
    r = soak.leak_check(s, 16 * MiB)
    assert not r["leak"]
    assert r["overhead_growth_bytes"] == 0
    assert r["overhead_first_quarter_bytes"] == r["overhead_last_quarter_bytes"] == 40 * MiB
    assert r["rss_max_bytes"] > r["rss_min_bytes"]
    assert "no leak" in r["verdict"]


def test_overhead_growing_steadily_is_a_leak():
    # 1 MiB a minute beyond the store for 30 minutes: about 20 MiB between the quarters.
    s = series(360, lambda t: 100 * MiB + int(t / 60 * MiB), lambda t: 60 * MiB)
    r = soak.leak_check(s, 16 * MiB)
    assert r["leak"], r
    assert r["overhead_growth_bytes"] > 16 * MiB
    assert abs(r["overhead_slope_bytes_per_hour"] - 60 * MiB) < MiB
    assert r["verdict"].startswith("LEAK")


def test_warm_up_growth_is_not_a_leak():
    # 30 MiB appear in the first two minutes (slot table, buffers), then nothing more.
    s = series(360, lambda t: 50 * MiB + min(t, 120) * 30 * MiB // 120, lambda t: 10 * MiB)
    r = soak.leak_check(s, 16 * MiB)
    assert not r["leak"], r


def test_noise_within_tolerance_is_not_a_leak_and_too_few_samples_are_no_verdict():
    s = series(100, lambda t: 50 * MiB + (3 * MiB if int(t) % 10 == 0 else 0), lambda t: 0)
    assert not soak.leak_check(s, 16 * MiB)["leak"]
    few = soak.leak_check(series(5, lambda t: t * GiB, lambda t: 0), 16 * MiB)
    assert not few["leak"] and "too few" in few["verdict"]
    # Samples where the server did not answer are left out, not counted as zero.
    gaps = series(40, lambda t: 50 * MiB, lambda t: 10 * MiB) + [{"t": 1000, "rss": None, "store": None}]
    assert soak.leak_check(gaps, 16 * MiB)["samples"] == 40


def test_scan_progress_lines():
    assert soak.parse_scan_progress("scan: pass 3/20 1.52 s") == ("pass", 3, True)
    assert soak.parse_scan_progress("scan: pass 4/20 1.52 s MISMATCH") == ("pass", 4, False)
    assert soak.parse_scan_progress("scan: MISMATCH pass 3 page 1234 (offset 5054464)") == ("mismatch", 3, 1234)
    assert soak.parse_scan_progress("scan: filled 768 MiB in 2.00 s") is None
    assert soak.parse_scan_progress("") is None


def phase(scan_bytes=0, fio_bytes=0, mismatches=0, fio_fail=0, failed=None, leak=False, bd=(5, 3)):
    stats = {"num_reads": 1000, "num_writes": 2000, "bd_writes": bd[0], "bd_reads": bd[1]}
    stats.update(failed or {})
    return {
        "minutes": 30.0,
        "scan": {"bytes_verified": scan_bytes, "mismatches": mismatches, "passes": 10, "runs": 2, "failed_runs": []},
        "fio": {"bytes_verified": fio_bytes, "verify_failures": fio_fail, "runs": 4, "failed_runs": []},
        "servers": {"swap": {"final_stats": stats, "leak": {"leak": leak, "verdict": "LEAK: x" if leak else "ok"}},
                    "fio": {"final_stats": {"failed_reads": 0}, "leak": {"leak": False}}},
        "checks_failed": [], "kernel_errors": [], "loadavg": {"mean": 3.5, "max": 7.0}, "samples": [],
    }


def test_summary_adds_up_the_phases():
    s = soak.summarize({"ram": phase(60 * GiB, 10 * GiB), "backing": phase(25 * GiB, 5 * GiB)}, [])
    assert s["ok"] and s["problems"] == []
    assert s["scan_bytes_verified"] == 85 * GiB and s["fio_bytes_verified"] == 15 * GiB
    assert s["bytes_verified"] == 100 * GiB
    assert s["swap_bytes_in"] == 2 * 1000 * 4096 and s["swap_bytes_out"] == 2 * 2000 * 4096
    assert s["mismatches"] == 0 and s["failed_requests"] == 0


def test_summary_fails_on_each_kind_of_problem():
    assert soak.summarize({"ram": phase(mismatches=3)}, [])["mismatches"] == 3
    assert not soak.summarize({"ram": phase(mismatches=3)}, [])["ok"]
    assert not soak.summarize({"ram": phase(fio_fail=1)}, [])["ok"]
    s = soak.summarize({"ram": phase(failed={"failed_reads": 2, "bd_errors": 1})}, [])
    assert s["failed_requests"] == 3 and not s["ok"]
    assert "failed_reads=2" in s["problems"][0]
    assert not soak.summarize({"ram": phase(leak=True)}, [])["ok"]
    assert not soak.summarize({"ram": phase()}, ["loop /dev/loop7"])["ok"]
    p = phase()
    p["scan"]["failed_runs"] = ["scan once run 3: exit -9 (OOM kill)"]
    assert "OOM" in soak.summarize({"ram": p}, [])["problems"][0]
    p = phase()
    p["kernel_errors"] = ["Read-error on swap-device (7:3:1234)"]
    assert not soak.summarize({"ram": p}, [])["ok"]
    assert not soak.summarize({"backing": {"error": "RuntimeError: the swap server died"}}, [])["ok"]


def test_a_recompression_soak_counts_and_requires_recompressions():
    assert soak.recompress_asked(["--recompress", "on", "--recompress-idle", "5"])
    assert soak.recompress_asked(["--recompress=on"])
    assert not soak.recompress_asked(["--recompress", "off"]) and not soak.recompress_asked([])
    ph = phase(GiB, GiB)
    ph["servers"]["swap"]["final_stats"]["recompress_done"] = 700
    ph["servers"]["fio"]["final_stats"]["recompress_done"] = 50
    s = soak.summarize({"ram": ph}, [], recompress=True)
    assert s["ok"] and s["recompressions"] == 750
    # A phase may recompress nothing (the backing phase's writeback takes the cold pages first
    # at the default idle age) as long as a swap server did in another one.
    quiet = phase(GiB, GiB)
    assert soak.summarize({"ram": ph, "backing": quiet}, [], recompress=True)["ok"]
    bad = soak.summarize({"backing": quiet}, [], recompress=True)
    assert not bad["ok"] and "no swap server recompressed" in bad["problems"][0], bad["problems"]
    results = {"started_utc": "2026-11-26T15:00:00Z", "machine": {"kernel": "6.18", "cpus": 2},
               "params": dict(soak.DEFAULTS, server_args=["--recompress", "on"]), "phases": {"ram": ph},
               "command": "python3 -m bench.soak", "summary": s}
    assert "servers started with `--recompress on`: 750 pages recompressed" in soak.markdown(results)


def test_markdown_names_the_figures():
    ph = phase(60 * GiB, 10 * GiB)
    ph["samples"] = [{"t": i * 5.0, "load1": 3.0, "swap": {"rss": 100 * MiB, "store": 60 * MiB},
                      "fio": {"rss": 50 * MiB, "store": 20 * MiB}, "cg_swap": 500 * MiB} for i in range(50)]
    ph["servers"]["swap"]["leak"] = soak.leak_check([{"t": x["t"], **x["swap"]} for x in ph["samples"]], 16 * MiB)
    results = {"started_utc": "2026-11-23T08:00:00Z", "machine": {"git_commit": "abcdef0123456", "kernel": "6.18",
                                                                  "cpus": 2, "mem_total_kib": 24 << 20},
               "params": dict(soak.DEFAULTS), "phases": {"ram": ph}, "command": "python3 -m bench.soak"}
    results["summary"] = soak.summarize(results["phases"], [])
    md = soak.markdown(results)
    assert "**PASS**: 70.0 GiB verified (60.0 GiB scan pages, 10.0 GiB fio), 0 mismatches, 0 failed requests" in md
    assert "| ram | swap | 100.0 / 100.0 / 100.0 |" in md
    assert "40.0 -> 40.0" in md
    assert md.count("\n| ") >= 8  # the RSS-over-time rows
    assert len(soak.rss_timeline(ph["samples"], 8)) == 8
    assert soak.rss_timeline(ph["samples"], 8)[-1] is ph["samples"][-1]


def test_an_interrupted_soak_does_not_pass():
    s = soak.summarize({"ram": phase(GiB, GiB)}, [], interrupted="signal 15")
    assert not s["ok"] and "interrupted" in s["problems"][0]
    assert s["bytes_verified"] == 2 * GiB  # what ran is still counted


def test_kernel_errors_are_new_ones_only_even_when_the_ring_buffer_turned():
    old = ["[100.000001] I/O error, dev loop0, sector 0 op 0x0:(READ)", "[200.5] something else"]
    after = ["[200.5] something else", "[300.25] I/O error, dev loop3, sector 8 op 0x1:(WRITE)",
             "[301.0] Write-error on swap-device (7:3:16)", "[302.0] I/O error, dev sda, sector 1"]
    # The oldest line fell out of the buffer: the old loop0 error must not count, nor sda's.
    assert soak.new_kernel_errors(old, after, ["loop3"]) == after[1:3]
    assert soak.new_kernel_errors(old, old, ["loop0"]) == []
    assert soak.new_kernel_errors([], old, ["loop0"]) == old[:1]
