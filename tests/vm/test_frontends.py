"""The kernel front ends on the machine running the tests: `compcache ublk` (/dev/ublkbN)
and `compcache nbd-attach` (/dev/nbdN), and `compcache swapon` choosing between them.

Where the kernel has the feature (and we are root) a device is created, written, read back
and removed for real; where it lacks it, the test checks that compcache says so and what to
do, and the real test skips with the reason. The VM test (vm/run-test.sh, run by
scripts/test) runs both front ends for real as swap in a guest kernel that has them.
Every server started here is stopped by its PID in teardown.
"""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import need_root, run


def has_ublk():
    return os.path.exists("/dev/ublk-control")


def has_nbd():
    return os.path.exists("/sys/block/nbd0")


class Device:
    """A `compcache ublk|nbd-attach` server, stopped (SIGTERM, then SIGKILL) on close."""

    def __init__(self, binary, kind, *args):
        self.p = subprocess.Popen([binary, kind, "--size", "16M", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        m = re.search(r"compcache: (/dev/\S+) is up", line)
        if not m:
            self.close()
            raise AssertionError(f"{kind} did not come up: {line}{self.p.stderr.read()}")
        self.dev = m.group(1)

    def close(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def round_trip(binary, kind):
    need_root(f"creating a {kind} block device")
    d = Device(binary, kind)
    try:
        pattern = bytes((i * 7 + 3) % 251 for i in range(4096)) * 256   # 1 MiB
        with open(d.dev, "r+b", buffering=0) as f:
            f.write(pattern)
            os.fsync(f.fileno())
        subprocess.run(["blockdev", "--flushbufs", d.dev], check=False)
        with open(d.dev, "rb", buffering=0) as f:
            assert f.read(len(pattern)) == pattern
        assert d.close() == 0
        # Clean shutdown removes the device (ublk) or disconnects it (nbd: size back to 0).
        deadline = time.time() + 10
        while time.time() < deadline:
            name = os.path.basename(d.dev)
            size_path = f"/sys/block/{name}/size"
            gone = not os.path.exists(d.dev) or (os.path.exists(size_path) and open(size_path).read().strip() == "0")
            if gone:
                break
            time.sleep(0.1)
        assert gone, f"{d.dev} still there after the server stopped"
    finally:
        d.close()


# Each front end: whether the kernel has it, what the server says when it does not, and the
# skip's reason then.
FRONT_ENDS = {
    "ublk": (has_ublk, ("ublk is not available", "modprobe ublk_drv"), "no ublk (no /dev/ublk-control)"),
    "nbd-attach": (has_nbd, ("kernel NBD is not available", "modprobe nbd"), "no nbd driver (no /sys/block/nbd0)"),
}


@pytest.mark.parametrize("command", list(FRONT_ENDS))
def test_round_trip_or_says_why(compcache_bin, command):
    present, says, missing = FRONT_ENDS[command]
    if not present():
        p = run([compcache_bin, command, "--size", "16M"], check=False, timeout=60)
        assert p.returncode != 0
        assert all(s in p.stderr for s in says), p.stderr
        pytest.skip(f"this kernel has {missing}: checked the message; the VM test covers it")
    round_trip(compcache_bin, command)


def test_swapon_explains_what_is_missing(compcache_bin):
    """A front end the kernel lacks, asked for by name, fails before touching anything and says
    what to load. (`auto` would fall back to the FUSE front end, which really enables swap:
    tests/test_fuse.py does that, under the host-swap lock.)"""
    need_root("swapon checks for root first")
    before = open("/proc/swaps").read()
    for frontend, has, words in (("ublk", has_ublk, ("ublk is not available", "modprobe ublk_drv")),
                                 ("nbd", has_nbd, ("kernel NBD is not available", "modprobe nbd"))):
        if has():
            continue
        p = run([compcache_bin, "swapon", "--no-config", "--size", "16M", "--frontend", frontend], check=False, timeout=60)
        assert p.returncode != 0
        assert all(w in p.stderr for w in words), p.stderr
    assert open("/proc/swaps").read() == before, "swapon enabled swap although it failed"
    if has_ublk() and has_nbd():
        pytest.skip("this kernel has both front ends; swapon would really enable swap (the VM test does that)")


def test_swapoff_with_nothing_recorded_is_a_no_op(compcache_bin):
    # Records are <device>.json; <device>.stats.json are final statistics, not records (as
    # swapon's own listing tells them apart).
    if os.path.isdir("/run/compcache/swap") and any(
            n.endswith(".json") and not n.endswith(".stats.json") for n in os.listdir("/run/compcache/swap")):
        pytest.skip("compcache swap devices are recorded on this machine; not touching them")
    p = run([compcache_bin, "swapoff"], timeout=60)
    assert "no compcache swap devices" in p.stdout
