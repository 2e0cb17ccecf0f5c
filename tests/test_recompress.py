"""Recompression through a real server and real clients: `compcache serve --recompress on`
re-encodes the pages nbdcopy wrote (real process pages, tools/pagedump) in the background,
`compcache stat` shows it, the memory goes down, and every byte reads back as written."""
import json
import os
import time

from conftest import file_sha256, need, need_root, run, stat_of, wait_for


def test_real_pages_are_recompressed_in_the_background_and_read_back(start_server, page_files, tmp_path):
    need("nbdcopy")
    src = page_files["mixed"]
    size = os.path.getsize(src)
    # Idle after 0 s, and the whole of a core: the test waits for the thread, not for time.
    srv = start_server(str(size), "--recompress", "on", "--recompress-idle", "0", "--recompress-cpu", "100")
    run(["nbdcopy", "-S", "0", "--flush", src, srv.uri])
    before = srv.stat()

    def settled():
        st = srv.stat()
        return stat_of(st, "recompress_done") > 0 and st["dicts_installed"] >= 1 and st["recomp_dict_pages"] > 0

    wait_for(settled, "the recompression thread to recompress pages with a trained dictionary", timeout=120)
    wait_for(lambda: srv.stat()["mem_used_total"] < before["mem_used_total"] * 0.85,
             "mem_used_total to fall by 15% as pages are recompressed", timeout=120)
    out = tmp_path / "out.bin"
    run(["nbdcopy", srv.uri, str(out)])
    assert file_sha256(out) == file_sha256(src), "data read back differs from data written"
    st = srv.stat()
    assert st["failed_reads"] == 0 and st["failed_writes"] == 0
    assert st["recomp_pages"] <= st["pages_stored"]
    assert st["recompress_cpu_ms"] > 0


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_locked_server_gives_back_what_the_dictionary_trainer_used(start_server, compcache_bin, page_files):
    """Under `mlockall` glibc cannot give back freed heap pages, and zstd's trainer uses about
    10 MiB for each training: a server that kept it would grow by that at its first retrain
    (measured: 7 MiB at one of the first three, before the server fixed malloc's mmap
    threshold; 0.2 MiB after). Three forced retrains may grow it by 3 MiB at most."""
    need("nbdcopy")
    need_root("--mlock needs root (or CAP_IPC_LOCK)")
    src = page_files["mixed"]
    srv = start_server(str(os.path.getsize(src)), "--mlock", "--recompress", "on", "--recompress-idle", "0",
                       "--recompress-cpu", "100")
    run(["nbdcopy", "-S", "0", "--flush", src, srv.uri])
    wait_for(lambda: srv.stat()["dicts_installed"] >= 1, "the first dictionary", timeout=120)
    before = rss_kib(srv.proc.pid)
    for n in (2, 3, 4):
        run([compcache_bin, "recompress", "--control", srv.control, "--retrain"])
        wait_for(lambda: srv.stat()["dicts_installed"] >= n, f"dictionary {n} (a forced retrain)", timeout=120)
    grown = rss_kib(srv.proc.pid) - before
    assert grown < 3 * 1024, f"the server's RSS grew by {grown} KiB over three retrains: freed trainer memory stays locked"


def test_recompression_is_on_by_default_and_tuned_without_saying_on(start_server, compcache_bin):
    for extra in ((), ("--recompress-idle", "300", "--dict", "none")):
        srv = start_server("16M", *extra)
        said = json.loads(run([compcache_bin, "recompress", "--control", srv.control, "--json"]).stdout)
        idle, dictionary = ("300", "none") if extra else ("60", "train")
        assert (said["settings"]["idle_secs"], said["settings"]["dict"]) == (int(idle), dictionary), said


def test_tuning_recompression_while_turning_it_off_is_an_error(compcache_bin):
    r = run([compcache_bin, "serve", "--size", "16M", "--recompress", "off", "--dict", "none"], check=False, timeout=30)
    assert r.returncode != 0
    assert "--recompress off turns off" in r.stderr, r.stderr


def test_recompression_is_tuned_paused_and_run_through_the_control_socket(start_server, compcache_bin, page_files):
    need("nbdcopy")
    src = page_files["python"]
    srv = start_server(str(os.path.getsize(src)), "--recompress", "on", "--recompress-idle", "0")
    ctl = ["--control", srv.control]
    out = run([compcache_bin, "recompress", *ctl, "--pause", "--json"]).stdout
    assert '"paused": true' in out, out
    run(["nbdcopy", "-S", "0", "--flush", src, srv.uri])
    # Paused: the thread takes steps (every 200 ms) but does nothing.
    time.sleep(1.5)
    assert srv.stat()["recompress_done"] == 0
    said = run([compcache_bin, "recompress", *ctl, "--now", "10"]).stdout
    assert "pages recompressed" in said, said
    assert srv.stat()["recompress_done"] > 0
    said = run([compcache_bin, "recompress", *ctl, "--idle", "30", "--cpu", "20"]).stdout
    assert "recompression paused: pages idle 30 s" in said and "CPU 20%" in said, said
    bad = run([compcache_bin, "recompress", *ctl, "--cpu", "0"], check=False)
    assert bad.returncode != 0 and "outside 1..=100" in bad.stderr, bad.stderr
    run([compcache_bin, "recompress", *ctl, "--resume"])


def test_recompress_on_a_device_without_it_says_why(start_server, compcache_bin):
    srv = start_server("16M", "--recompress", "off")
    r = run([compcache_bin, "recompress", "--control", srv.control], check=False)
    assert r.returncode != 0 and "started with --recompress off" in r.stderr, r.stderr
