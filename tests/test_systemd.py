"""`compcache swapon --foreground`, the main process of compcache-swap@.service
(packaging/systemd/, docs/swap.md "systemd"), run here as systemd would run it: with a
NOTIFY_SOCKET of the test's own (a real datagram socket, read the way systemd reads it), on
the FUSE front end (the one this host has; root).

- READY=1 and a STATUS line arrive only once the device is swap (through its
  hibernation-safe name); the server is named `@compcache` (spared by systemd's final kill);
- SIGTERM: STOPPING=1, swap off, server stopped, nothing left behind, exit 0;
- SIGTERM while the system shuts down (`systemctl is-system-running` says `stopping`; a
  `systemctl` of the test's, first in PATH, says it): swap and server stay, exit 0; the test
  takes them down with `compcache swapoff`;
- the server killed: swapon exits 1 and says the device is gone;
- zram-generator's rules set nothing up (`systemd.zram=0` in a fake root's proc/cmdline):
  READY=1 with the reason as STATUS, then exit 3 (the unit's SuccessExitStatus), so that
  systemd ends the unit inactive instead of failing a Type=notify start.
"""
import os
import signal
import socket
import subprocess

import pytest

from conftest import need, need_root, run
from test_fuse import compcache_devices, host_swap_lock, need_fuse

TIMEOUT = 120


class Notify:
    """A NOTIFY_SOCKET: the datagrams a service sends systemd."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(TIMEOUT)

    def next(self):
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines() if "=" in line)

    def close(self):
        self.sock.close()


def start(compcache_bin, tmp_path, notify, env_extra=None):
    env = dict(os.environ, NOTIFY_SOCKET=notify.path, **(env_extra or {}))
    argv = [compcache_bin, "swapon", "--foreground", "--frontend", "fuse", "--no-config", "--size", "128M",
            "--reserve", "8M", "--priority", "7"]
    log = open(tmp_path / "swapon.log", "wb")
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def log_of(tmp_path):
    return (tmp_path / "swapon.log").read_text(errors="replace")


def swaps():
    return open("/proc/swaps").read()


@pytest.fixture
def fg(compcache_bin, tmp_path):
    """(start, notify): start() runs `swapon --foreground` and returns (proc, device) once it
    notified READY; everything it set up is taken down after the test, whatever happened."""
    need_fuse()
    need("mkswap")
    notify = Notify(tmp_path / "notify.sock")
    procs = []
    with host_swap_lock():
        before = set(compcache_devices())

        def go(env_extra=None):
            p = start(compcache_bin, tmp_path, notify, env_extra)
            procs.append(p)
            msg = notify.next()
            assert msg.get("READY") == "1", (msg, log_of(tmp_path))
            new = set(compcache_devices()) - before
            assert len(new) == 1, (compcache_devices(), log_of(tmp_path))
            dev = new.pop()
            assert "/dev/zram-compcache-" + os.path.basename(dev) in swaps(), "READY only once it is swap"
            assert msg["STATUS"].startswith(f"compcache: swapon {dev}: 128M lz4, priority 7, fuse"), msg
            return p, dev

        try:
            yield go, notify
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGTERM)
                    try:
                        p.wait(timeout=TIMEOUT)
                    except subprocess.TimeoutExpired:
                        os.kill(p.pid, signal.SIGKILL)
                        p.wait()
            for dev in set(compcache_devices()) - before:
                run([compcache_bin, "swapoff", dev], check=False, timeout=600)
            notify.close()


def server_argv0(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[0].decode()


def test_sigterm_takes_the_swap_down(fg, tmp_path):
    go, notify = fg
    p, dev = go()
    state = compcache_devices()[dev]
    assert server_argv0(state["pid"]) == "@compcache", "the server must survive systemd's final kill"
    assert state["log"].startswith("the journal"), state
    os.kill(p.pid, signal.SIGTERM)
    assert notify.next().get("STOPPING") == "1"
    assert p.wait(timeout=TIMEOUT) == 0, log_of(tmp_path)
    assert "zram-compcache" not in swaps() and dev not in compcache_devices()
    assert not os.path.exists(f"/proc/{state['pid']}") or "compcache" not in open(f"/proc/{state['pid']}/cmdline").read()
    out = log_of(tmp_path)
    assert f"compcache: swapoff {dev}: done (fuse)" in out and "statistics" in out, out


def test_at_shutdown_the_swap_and_server_stay(fg, tmp_path, compcache_bin):
    go, notify = fg
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text("#!/bin/sh\n[ \"$1\" = is-system-running ] && echo stopping\n")
    fake.chmod(0o755)
    p, dev = go({"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    state = compcache_devices()[dev]
    os.kill(p.pid, signal.SIGTERM)
    assert notify.next().get("STOPPING") == "1"
    assert p.wait(timeout=TIMEOUT) == 0, log_of(tmp_path)
    assert "while the system shuts down" in log_of(tmp_path)
    assert "/dev/zram-compcache-" + os.path.basename(dev) in swaps(), "swap stays on at shutdown"
    assert os.path.exists(f"/proc/{state['pid']}"), "and its server stays up"
    p = run([compcache_bin, "swapoff", dev], timeout=600)
    assert "zram-compcache" not in swaps()


def test_a_dead_server_is_an_error(fg, tmp_path):
    go, _ = fg
    p, dev = go()
    pid = compcache_devices()[dev]["pid"]
    os.kill(pid, signal.SIGKILL)
    assert p.wait(timeout=TIMEOUT) == 1, log_of(tmp_path)
    out = log_of(tmp_path)
    assert "exited: the device and every page swapped out to it are gone (its swap is off" in out, out
    # Nothing was swapped out, so the swap came off, and what the dead server left (its loop
    # device, its FUSE mount) went with it.
    assert dev not in compcache_devices() and "zram-compcache" not in swaps()
    assert not os.path.exists(f"/sys/block/{os.path.basename(dev)}/loop/backing_file"), "loop device left attached"
    assert f"/run/compcache/fuse-{pid} " not in open("/proc/self/mountinfo").read(), "FUSE mount left"


def test_standing_down_is_a_clean_stop_for_systemd(compcache_bin, tmp_path):
    need_root("swapon checks for root first")
    root = tmp_path / "root"
    (root / "etc/systemd").mkdir(parents=True)
    (root / "etc/systemd/zram-generator.conf").write_text("[zram0]\nzram-size = 64\n")
    (root / "proc").mkdir()
    (root / "proc/cmdline").write_text("quiet systemd.zram=0\n")
    notify = Notify(tmp_path / "notify.sock")
    try:
        env = dict(os.environ, NOTIFY_SOCKET=notify.path)
        p = subprocess.run([compcache_bin, "swapon", "--foreground", "--section", "zram0", "--config-root", str(root),
                            "--frontend", "fuse"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
        msg = notify.next()
        assert msg.get("READY") == "1", msg
        assert "systemd.zram=0" in msg.get("STATUS", ""), msg
        unit = open(os.path.join(os.path.dirname(__file__), "..", "packaging", "systemd",
                                 "compcache-swap@.service")).read()
        assert "\nSuccessExitStatus=3\n" in unit
    finally:
        notify.close()
