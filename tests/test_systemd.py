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
- `compcache restart --supervisor MAINPID` (the unit's ExecReload) and SIGUSR2 to swapon: the
  server hands over to a successor, each time;
- the server killed: swapon, its supervisor, starts a successor that takes the device over
  (the store's state and the FUSE connection survive the server; swapon stored the
  connection's descriptors in "systemd"'s store, FDSTORE=1, which this test's socket keeps);
  with the cold tier too (its blocks are in the store's memfd since issue 29): a successor
  takes the device over and reads the pages that had gone cold;
- swapon itself killed (Restart= starts it again): the new one gets the stored descriptors
  (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID), the running server hands over, a successor serves,
  READY; its SIGTERM takes everything down and removes the descriptors (FDSTOREREMOVE=1);
- zram-generator's rules set nothing up (`systemd.zram=0` in a fake root's proc/cmdline):
  READY=1 with the reason as STATUS, then exit 3 (the unit's SuccessExitStatus), so that
  systemd ends the unit inactive instead of failing a Type=notify start.
"""
import array
import os
import signal
import socket
import subprocess

import pytest

from conftest import need, need_root, run, wait_for
from test_fuse import compcache_devices, host_swap_lock, need_fuse

TIMEOUT = 120


class Notify:
    """A NOTIFY_SOCKET: the datagrams a service sends systemd. The file descriptor store is
    kept as systemd keeps it: FDSTORE=1 adds the message's descriptors under its FDNAME,
    FDSTOREREMOVE=1 drops the name's (`store`, `removed`)."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(TIMEOUT)
        self.store, self.removed = [], []

    def next(self):
        """The next message that is not about the descriptor store."""
        while True:
            data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
            msg = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            fds = array.array("i")
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
            if msg.get("FDSTORE") == "1":
                self.store += [(msg.get("FDNAME", "stored"), fd) for fd in fds]
            elif msg.get("FDSTOREREMOVE") == "1":
                self.removed.append(msg.get("FDNAME"))
                for name, fd in [x for x in self.store if x[0] == msg.get("FDNAME")]:
                    os.close(fd)
                self.store = [x for x in self.store if x[0] != msg.get("FDNAME")]
            else:
                for fd in fds:
                    os.close(fd)
                return msg

    def drain(self):
        """Reads what is queued (store messages) without waiting."""
        self.sock.settimeout(0.2)
        try:
            while True:
                self.next()
        except (socket.timeout, BlockingIOError):
            pass
        finally:
            self.sock.settimeout(TIMEOUT)

    def close(self):
        for _, fd in self.store:
            os.close(fd)
        self.sock.close()


ARGV = ["swapon", "--foreground", "--frontend", "fuse", "--no-config", "--size", "128M", "--reserve", "8M", "--priority", "7"]


def start(compcache_bin, tmp_path, notify, env_extra=None, extra=(), handed=()):
    """`swapon --foreground` as systemd starts it; `handed`: (name, fd) pairs from the store,
    passed as systemd passes them (LISTEN_FDS from 3, LISTEN_FDNAMES, LISTEN_PID: set by a
    shell that then execs, so that it is the pid of the process that gets them)."""
    env = dict(os.environ, NOTIFY_SOCKET=notify.path, **(env_extra or {}))
    argv = [compcache_bin, *ARGV, *extra]
    log = open(tmp_path / "swapon.log", "ab")
    if not handed:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    env.update(LISTEN_FDS=str(len(handed)), LISTEN_FDNAMES=":".join(n for n, _ in handed))
    high = [os.dup(fd) + 0 for _, fd in handed]
    moved = [fcntl_dup_above(fd, 3 + len(high)) for fd in high]
    for fd in high:
        os.close(fd)

    def place():
        for i, fd in enumerate(moved):
            os.dup2(fd, 3 + i, inheritable=True)

    try:
        return subprocess.Popen(["/bin/sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$@"', "sh", *argv], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=place, close_fds=False)
    finally:
        for fd in moved:
            os.close(fd)


def fcntl_dup_above(fd, low):
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low)


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

        def go(env_extra=None, extra=()):
            p = start(compcache_bin, tmp_path, notify, env_extra, extra)
            procs.append(p)
            msg = notify.next()
            assert msg.get("READY") == "1", (msg, log_of(tmp_path))
            new = set(compcache_devices()) - before
            assert len(new) == 1, (compcache_devices(), log_of(tmp_path))
            dev = new.pop()
            assert "/dev/zram-compcache-" + os.path.basename(dev) in swaps(), "READY only once it is swap"
            assert msg["STATUS"].startswith(f"compcache: swapon {dev}: 128M lz4, ") and ", priority 7, fuse" in msg["STATUS"], msg
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


def kill_the_server_and_see_it_taken_over(p, dev, tmp_path):
    """SIGKILLs the server of `dev` (supervised by swapon `p`): a successor takes the device
    over, swapon stays up, the device stays swap and serves reads."""
    state = compcache_devices()[dev]
    assert state["supervisor"] == p.pid and state["takeover"], state
    os.kill(state["pid"], signal.SIGKILL)
    wait_for(lambda: compcache_devices()[dev]["pid"] != state["pid"], "a successor", timeout=60)
    assert p.poll() is None, log_of(tmp_path)
    assert "/dev/zram-compcache-" + os.path.basename(dev) in swaps(), "the device stays swap"
    run(["dd", f"if={dev}", "of=/dev/null", "bs=64k", "count=16", "iflag=direct"])


def test_a_killed_server_is_taken_over(fg, tmp_path, compcache_bin):
    go, notify = fg
    p, dev = go()
    notify.drain()
    names = sorted({n for n, _ in notify.store})
    assert names == ["compcache-fuse", "compcache-fuse-init", "compcache-store"], notify.store
    kill_the_server_and_see_it_taken_over(p, dev, tmp_path)
    # systemctl reload (ExecReload: compcache restart --supervisor $MAINPID): handed over.
    before = compcache_devices()[dev]["pid"]
    r = run([compcache_bin, "restart", "--supervisor", str(p.pid)], timeout=TIMEOUT)
    assert f"restart {dev}: server pid {before} handed over" in r.stdout, r.stdout
    assert "ended (handed over)" in log_of(tmp_path), log_of(tmp_path)
    # SIGUSR2 to swapon does the same.
    before = compcache_devices()[dev]["pid"]
    os.kill(p.pid, signal.SIGUSR2)
    wait_for(lambda: compcache_devices()[dev]["pid"] != before, "the server handed over on SIGUSR2", timeout=60)
    run(["dd", f"if={dev}", "of=/dev/null", "bs=64k", "count=16", "iflag=direct"])
    os.kill(p.pid, signal.SIGTERM)
    assert notify.next().get("STOPPING") == "1"
    assert p.wait(timeout=TIMEOUT) == 0, log_of(tmp_path)
    notify.drain()
    assert sorted(set(notify.removed)) == names and notify.store == [], (notify.removed, notify.store)
    assert dev not in compcache_devices() and "zram-compcache" not in swaps()


def test_a_restarted_supervisor_adopts_the_device(fg, tmp_path, compcache_bin):
    go, notify = fg
    p, dev = go()
    notify.drain()
    state = compcache_devices()[dev]
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=TIMEOUT)
    assert os.path.exists(f"/proc/{state['pid']}"), "the server outlives its supervisor"
    p2 = start(compcache_bin, tmp_path, notify, handed=list(notify.store))
    fg_procs = [p2]
    try:
        msg = notify.next()
        assert msg.get("READY") == "1" and "taken over from the descriptors systemd kept" in msg.get("STATUS", ""), (msg, log_of(tmp_path))
        new = compcache_devices()[dev]
        assert new["supervisor"] == p2.pid and new["pid"] != state["pid"], new
        assert not os.path.exists(f"/run/compcache/swap/notify-{p.pid}.sock"), "the killed swapon's notify socket is left"
        wait_for(lambda: not os.path.exists(f"/proc/{state['pid']}") or "compcache" not in open(f"/proc/{state['pid']}/cmdline").read(),
                 "the old server to hand over and exit")
        run(["dd", f"if={dev}", "of=/dev/null", "bs=64k", "count=16", "iflag=direct"])
        os.kill(p2.pid, signal.SIGTERM)
        assert notify.next().get("STOPPING") == "1"
        assert p2.wait(timeout=TIMEOUT) == 0, log_of(tmp_path)
        assert dev not in compcache_devices() and "zram-compcache" not in swaps()
    finally:
        for q in fg_procs:
            if q.poll() is None:
                os.kill(q.pid, signal.SIGTERM)
                q.wait(timeout=TIMEOUT)


def test_with_the_cold_tier_a_killed_server_is_taken_over(fg, tmp_path):
    """With the cold tier the store's state is all in its memfd (`Store::state_fd` is Some: the
    tier's compressed blocks are a region of it, `backing/blocks.rs`; before issue 29 they were
    the server's heap and a killed server took the device with it, swapon ending with exit 1):
    it is stored, and a killed server's successor takes the device over. (That the successor
    serves every cold page is crates/store/tests/takeover.rs's `cold_*`.)"""
    go, notify = fg
    p, dev = go(extra=["--cold-tier", "8M", "--cold-idle", "1", "--cold-level", "3"])
    notify.drain()
    assert "compcache-store" in {n for n, _ in notify.store}, (notify.store, log_of(tmp_path))
    kill_the_server_and_see_it_taken_over(p, dev, tmp_path)
    os.kill(p.pid, signal.SIGTERM)
    assert notify.next().get("STOPPING") == "1"
    assert p.wait(timeout=TIMEOUT) == 0, log_of(tmp_path)
    assert dev not in compcache_devices() and "zram-compcache" not in swaps()


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
