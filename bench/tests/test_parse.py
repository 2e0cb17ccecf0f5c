import json
import os

import pytest

from bench import parse


def test_parse_size_units():
    assert parse.parse_size("512M") == 512 << 20
    assert parse.parse_size("1.5G") == 3 << 29
    assert parse.parse_size("4k") == 4096
    assert parse.parse_size("16MiB") == 16 << 20
    assert parse.parse_size("4096") == 4096
    with pytest.raises(ValueError):
        parse.parse_size("lots")


def test_format_size_round_trips():
    for n in (4096, 1 << 20, 3 << 30, 4097):
        assert parse.parse_size(parse.format_size(n)) == n


def test_proc_swaps():
    text = ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
            "/dev/zram3                              partition\t1048572\t\t4\t\t100\n"
            "/var/tmp/x.swapfile                     file\t\t524284\t\t0\t\t-2\n")
    s = parse.parse_proc_swaps(text)
    assert s[0] == {"filename": "/dev/zram3", "type": "partition", "size_kib": 1048572, "used_kib": 4, "priority": 100}
    assert s[1]["priority"] == -2
    assert parse.parse_proc_swaps("Filename Type Size Used Priority\n") == []


def test_zram_mm_stat_names_and_short_lines():
    st = parse.parse_zram_mm_stat("185520128 2852864 3190784 0 3190784 218 0 5 7\n")
    assert st["orig_data_size"] == 185520128
    assert st["mem_used_total"] == 3190784
    assert st["same_pages"] == 218 and st["huge_pages"] == 5 and st["huge_pages_since"] == 7
    assert parse.parse_zram_mm_stat("1 2 3") == {"orig_data_size": 1, "compr_data_size": 2, "mem_used_total": 3}


def test_block_stat():
    st = parse.parse_block_stat("   10 0 80 3 20 0 160 4 0 7 7 0 0 0 0 0 0\n")
    assert st == {"num_reads": 10, "read_sectors": 80, "num_writes": 20, "write_sectors": 160}


def test_flat_keyed_skips_non_numbers():
    st = parse.parse_flat_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\nweird a b\nname text\n")
    assert st == {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 3}


def test_scan_output():
    out = ("noise\nscan mib=480 passes=10 mode=cyclic content=generated same_pages=12 fill_s=0.412 "
           "scan_s=3.2 total_s=3.612 verify=ok mismatches=0 sink=1\n")
    s = parse.parse_scan_output(out)
    assert s["mib"] == 480 and s["mode"] == "cyclic" and s["total_s"] == 3.612 and s["verify"] == "ok"
    with pytest.raises(ValueError):
        parse.parse_scan_output("nothing here")


def _fio_json(read_bw=0, write_bw=0):
    return json.dumps({"fio version": "fio-3.33", "jobs": [{
        "jobname": "t", "error": 0,
        "read": {"bw_bytes": read_bw, "io_bytes": read_bw * 2, "runtime": 2000},
        "write": {"bw_bytes": write_bw, "io_bytes": write_bw * 2, "runtime": 0}}]}, indent=2)


def test_fio_json_with_leading_warning():
    text = "fio: some warning {not json}\n" + _fio_json(read_bw=5_000_000)
    # The warning has a brace; the parser must find the real object (at a line start).
    r = parse.parse_fio_json(text)
    assert r["bw_bytes"] == 5_000_000 and r["read_io_bytes"] == 10_000_000 and r["runtime_ms"] == 2000
    assert r["fio_version"] == "fio-3.33"


def test_fio_json_write_job():
    r = parse.parse_fio_json(_fio_json(write_bw=7))
    assert r["write_bw_bytes"] == 7 and r["bw_bytes"] == 7


def test_compression_ratio():
    assert parse.compression_ratio({"orig_data_size": 400, "mem_used_total": 100}) == 4.0
    assert parse.compression_ratio({"orig_data_size": 0, "mem_used_total": 100}) is None
    assert parse.compression_ratio({}) is None


def test_proc_status():
    assert parse.parse_proc_status_kib("Name:\tx\nVmRSS:\t  1234 kB\n") == 1234
    assert parse.parse_proc_status_kib("Name:\tx\n") is None


def test_proc_stat_busy_takes_the_busy_fields_of_the_cpu_line():
    # user 100, nice 20, system 30, idle 5000, iowait 40, irq 6, softirq 4, steal 70: 160 ticks busy.
    hz = os.sysconf("SC_CLK_TCK")
    assert parse.parse_proc_stat_busy_s("cpu  100 20 30 5000 40 6 4 70 0 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n") == 160 / hz
    assert parse.parse_proc_stat_busy_s("intr 1 2 3\n") is None
