"""Prometheus/OpenMetrics metrics (docs/metrics.md), read with the Python prometheus_client
parsers (a real parser, not ours): the server's `--metrics` endpoint and `compcache stat
--prometheus` (node_exporter's textfile collector reads the latter), checked value by value
against `compcache stat --json` after real pages were written and read with nbdcopy; the
latency histograms count the requests and give p50/p99 bounds; a port that is taken fails the
start with a clear error.
"""
import json
import os
import socket
import urllib.error
import urllib.request

import pytest

from conftest import need, run

openmetrics_parser = pytest.importorskip("prometheus_client.openmetrics.parser")
text_parser = pytest.importorskip("prometheus_client.parser")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def samples(families):
    """{(sample name, device label): value} and the families by name."""
    out, by_name = {}, {}
    for f in families:
        by_name[f.name] = f
        for s in f.samples:
            key = (s.name, s.labels.get("device"), s.labels.get("le"))
            out[key] = s.value
    return out, by_name


def check_against_stat(text, st, dev, parse):
    values, fams = samples(parse(text))
    assert fams["compcache_num_reads"].type == "counter"
    # (The OpenMetrics parser names a family with its unit; Prometheus' text parser as written.)
    gauge = fams.get("compcache_orig_data_size_bytes") or fams["compcache_orig_data_size"]
    assert gauge.type == "gauge"
    exact = {
        "compcache_orig_data_size_bytes": st["orig_data_size"],
        "compcache_compr_data_size_bytes": st["compr_data_size"],
        "compcache_disksize_bytes": st["disksize"],
        "compcache_same_pages": st["same_pages"],
        "compcache_num_writes_total": st["num_writes"],
        "compcache_failed_reads_total": st["failed_reads"],
        "compcache_bd_writes_total": st["bd_writes"],
    }
    for name, want in exact.items():
        assert values[(name, dev, None)] == want, (name, values.get((name, dev, None)), want)
    return values


def test_metrics_endpoint_and_textfile_match_stat(start_server, page_files, tmp_path):
    need("nbdcopy")
    src = page_files["mixed"]
    port = free_port()
    srv = start_server(str(os.path.getsize(src)), "--metrics", str(port), "--mem-limit", "64M",
                       "--backing", str(tmp_path / "b.img"))
    run(["nbdcopy", "--flush", src, srv.uri])
    run(["nbdcopy", srv.uri, str(tmp_path / "out.bin")])
    st = srv.stat()  # nothing runs between this and the scrapes: the counters stand still
    dev = srv.socket

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("application/openmetrics-text")
        body = r.read().decode()
    values = check_against_stat(body, st, dev, openmetrics_parser.text_string_to_metric_families)

    # Latency: one histogram sample per request; the store's reads and writes were counted,
    # +Inf is the count, and the buckets grow monotonically.
    reads = values[("compcache_read_latency_seconds_count", dev, None)]
    writes = values[("compcache_write_latency_seconds_count", dev, None)]
    assert reads > 0 and writes > 0, (reads, writes)
    assert values[("compcache_read_latency_seconds_bucket", dev, "+Inf")] == reads
    bounds = sorted((float(le), v) for (n, d, le), v in values.items()
                    if n == "compcache_read_latency_seconds_bucket" and le != "+Inf" and d == dev)
    counts = [v for _, v in bounds]
    assert counts == sorted(counts), "cumulative buckets"
    p50 = next(b for b, v in bounds if v >= reads * 0.5)
    p99 = next((b for b, v in bounds if v >= reads * 0.99), float("inf"))
    print(f"reads {reads:.0f}: p50 <= {p50 * 1e6:.0f} us, p99 <= {p99 * 1e6:.0f} us")
    assert p50 <= p99 < 1.0
    sum_s = values[("compcache_read_latency_seconds_sum", dev, None)]
    assert 0 < sum_s < reads * 1.0

    # The textfile form, in Prometheus' text format parser as node_exporter would read it.
    text = run([srv.binary, "stat", "--prometheus", "--control", srv.control]).stdout
    check_against_stat(text, st, dev, text_parser.text_string_to_metric_families)
    info = [line for line in text.splitlines() if line.startswith("compcache_device_info{")]
    assert len(info) == 1 and 'frontend="nbd-server"' in info[0] and str(tmp_path / "b.img") in info[0], info

    # Every device, in one file.
    text = run([srv.binary, "list", "--prometheus", "--control", srv.control]).stdout
    values, _ = samples(openmetrics_parser.text_string_to_metric_families(text))
    assert values[("compcache_disksize_bytes", dev, None)] == st["disksize"]

    # Any other path: 404.
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
    assert e.value.code == 404


def test_a_taken_metrics_port_fails_the_start(compcache_bin, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        p = run([compcache_bin, "serve", "--size", "16M", "--socket", str(tmp_path / "s.sock"),
                 "--metrics", str(port)], check=False, timeout=30)
        assert p.returncode == 1 and f"--metrics 127.0.0.1:{port}: cannot listen" in p.stderr, p.stderr
        p = run([compcache_bin, "serve", "--size", "16M", "--socket", str(tmp_path / "s.sock"),
                 "--metrics", "localhost"], check=False, timeout=30)
        assert p.returncode == 2 and "give a port" in p.stderr, p.stderr
    finally:
        s.close()
