"""The FUSE front end over io_uring (`compcache fuse --io-uring`, crates/fuse/src/uring.rs).

- the page store's model through the FUSE file with the io_uring transport (the same random
  pread/pwrite/fallocate against a byte array as test_fuse.py), and proof that the requests
  went through the rings (the server's log: the transport it chose, and how many requests it
  answered through io_uring);
- fio with verify=crc32c on the loop device, served through io_uring;
- kill -9 of a server serving through io_uring: reads fail with an I/O error, never data;
- the kernel swaps the verified workload (swap_workload.py) in a memory cgroup three times
  smaller than it to `compcache fuse --io-uring` through its loop device (mkswap and swapon
  --discard by hand: `compcache swapon` does not pass --io-uring), under the host-swap lock;
- without the host-wide switch, `--io-uring` falls back to /dev/fuse and says why.

FUSE over io_uring needs Linux 6.14+ with CONFIG_FUSE_IO_URING; it is switched on host-wide by
/sys/module/fuse/parameters/enable_uring. Each test that needs it sets it to Y for its own run
only and restores the value it found, also on failure (the `fuse_uring` fixture); skipped with
the reason when the kernel lacks it. Needs root, /dev/fuse and losetup, as test_fuse.py.
"""
import os
import re

import pytest

from conftest import need, need_memory_cgroup, run
from test_fuse import MiB, check_store_model, fuse_server, host_swap_lock, need_fuse, swap_through_fuse  # noqa: F401 (fixture)
from test_fuse import test_fio_verifies_on_the_loop_device as fio_on_loop
from test_fuse import test_killed_server_means_io_errors_not_data as killed_server

ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


def set_enable_uring(value):
    with open(ENABLE_URING, "w") as f:
        f.write(value)


@pytest.fixture
def fuse_uring():
    """enable_uring = Y for this test only; the value found is restored afterwards."""
    need_fuse()
    if not os.path.exists(ENABLE_URING):
        pytest.skip("this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)")
    with open(ENABLE_URING) as f:
        found = f.read().strip()
    set_enable_uring("Y")
    try:
        yield
    finally:
        set_enable_uring(found)


def answered_through_uring(log):
    m = re.search(r"fuse transport: (\d+) requests answered through io_uring", log)
    return int(m.group(1)) if m else None


def test_store_model_through_io_uring(fuse_uring, fuse_server):
    size = 16 * MiB
    srv = fuse_server(size, "--no-loop", "--io-uring", "--reserve", "0", "--threads", "2")
    log = srv.log()
    assert "fuse transport: io_uring" in log, log
    check_store_model(srv, size)  # ends with a clean stop
    served = answered_through_uring(srv.log())
    print(f"requests answered through io_uring: {served}")
    # The model's 3000 operations and the final reads, at least one request each.
    assert served is not None and served > 3000, srv.log()


def test_fio_verifies_through_io_uring(fuse_uring, fuse_server, tmp_path, monkeypatch):
    need("fio")
    started = []

    def start(size, *extra):
        s = fuse_server(size, *extra, "--io-uring")
        started.append(s)
        return s

    fio_on_loop(start, tmp_path, [])
    log = started[0].log()
    assert "fuse transport: io_uring" in log, log
    served = answered_through_uring(log)
    assert served is not None and served > 1000, log


def test_killed_server_through_io_uring(fuse_uring, fuse_server):
    started = []

    def start(size, *extra):
        s = fuse_server(size, *extra, "--io-uring")
        started.append(s)
        return s

    killed_server(start)
    assert "fuse transport: io_uring" in started[0].log(), started[0].log()


def test_swap_through_io_uring(fuse_uring, fuse_server):
    need("mkswap")
    need("swapon")
    cg_parent, cg_version = need_memory_cgroup()
    swapped_on = False
    with host_swap_lock():
        srv = fuse_server(512 * MiB, "--io-uring", "--reserve", "16M")
        try:
            assert "fuse transport: io_uring" in srv.log(), srv.log()
            assert srv.loop, srv.ready
            run(["mkswap", "-q", srv.loop])
            run(["swapon", "--discard", "-p", "32767", srv.loop])
            swapped_on = True
            swap_through_fuse(cg_parent, cg_version, "compcache-fuse-uring-test", srv.loop, srv.stat)
        finally:
            if swapped_on:
                run(["swapoff", srv.loop], check=False, timeout=600)
        assert srv.loop not in open("/proc/swaps").read()
        assert srv.stop() == 0, srv.log()
        served = answered_through_uring(srv.log())
        print(f"requests answered through io_uring: {served}")
        assert served is not None and served > 1000, srv.log()


def test_without_the_switch_it_falls_back_to_dev_fuse(fuse_server):
    need_fuse()
    if not os.path.exists(ENABLE_URING):
        pytest.skip("this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)")
    with open(ENABLE_URING) as f:
        if f.read().strip() != "N":
            pytest.skip("enable_uring is Y on this host: the fallback cannot be observed")
    srv = fuse_server(16 * MiB, "--no-loop", "--io-uring", "--reserve", "0")
    log = srv.log()
    assert "fuse transport: /dev/fuse (FUSE over io_uring is off" in log, log
    with open(srv.file, "r+b", buffering=0) as f:
        f.write(b"x" * 4096)
        f.seek(0)
        assert f.read(4096) == b"x" * 4096
    assert srv.stop() == 0, srv.log()
    assert answered_through_uring(srv.log()) is None
