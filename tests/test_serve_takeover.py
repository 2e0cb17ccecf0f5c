"""`compcache serve` whose device outlives the server (issue 29; docs/nbd.md, "A server that
dies"; docs/swap.md, "When the server dies").

The test plays the holder (systemd's file descriptor store protocol, `crates/cli/src/fdstore.rs`):
a datagram socket named by NOTIFY_SOCKET that keeps the descriptors the server stores there
(`FDSTORE=1`) and starts each successor with `--takeover` and those descriptors as LISTEN_FDS
from 3 (LISTEN_FDNAMES, and LISTEN_PID the successor's own pid, as systemd sets it). qemu-io is
the client, connected with `reconnect-delay`:

- the server stores the store's state, its NBD listener and its control listener, before it
  serves;
- SIGKILL five times while qemu-io writes and reads back patterns: every command succeeds,
  and every acknowledged write reads back from the last successor (the figure printed: how long
  the one qemu-io operation that met each kill took, and the successor's start);
- SIGUSR2 three times in the same way: each server exits HANDED_OVER (75), leaving the socket
  files; its successor serves on the same listeners;
- a client that connects while no server runs waits in the listen backlog, and is served once
  the successor comes; started as systemd restarts a service (no `--takeover`, LISTEN_PID its
  own), the server takes the device over too;
- a successor started with other settings refuses the state in one line (TAKEOVER_REFUSED, 78)
  and leaves it as it was; SIGTERM still stops a successor and removes its socket files;
- with no successor and the holder gone too, reads fail with an I/O error, never wrong data;
- `--listen` (TCP): the TCP listener is handed over too, and qemu-io reconnects over TCP;
- `--metrics`: its listener is handed over too; a scrape that connects while no server runs
  is answered by the successor;
- `compcache supervise -- serve`: the supervisor as the holder, four SIGKILLs and a hand-over
  under the same qemu-io traffic (root: the supervisor locks its memory).

Every server is killed by its PID, every held descriptor closed and the directory removed in
teardown, also when a test fails. Needs qemu-io.
"""
import contextlib
import fcntl
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import EXPORT_NAME, run, wait_for
from test_takeover import alive as ours

MiB = 1 << 20
HANDED_OVER = 75
TAKEOVER_REFUSED = 78
HELD = {"compcache-store", "compcache-nbd-listen", "compcache-control-listen"}
READY_TIMEOUT_S = 30

# Runs in the successor's process before it execs compcache: moves the held descriptors (at
# numbers far above them) to 3.. and sets LISTEN_PID to its own pid, which exec keeps.
EXEC_HELPER = """
import os, sys
n = int(sys.argv[1])
src = [int(x) for x in sys.argv[2:2 + n]]
for i, fd in enumerate(src):
    os.dup2(fd, 3 + i)
for fd in src:
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2 + n], sys.argv[2 + n:])
"""


def need_qemu_io():
    if shutil.which("qemu-io") is None:
        pytest.skip("needs qemu-io (scripts/install-deps tests)")


class Holder:
    """The test as the holder of one `compcache serve` device (module docs)."""

    def __init__(self, binary, size="64M", extra=()):
        self.binary, self.size, self.extra = binary, size, list(extra)
        self.dir = tempfile.mkdtemp(prefix="compcache-serve-takeover-")
        self.socket = os.path.join(self.dir, "nbd.sock")
        self.control = self.socket + ".ctl"
        self.log_path = os.path.join(self.dir, "server.log")
        self.log = open(self.log_path, "ab")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(os.path.join(self.dir, "notify"))
        self.notify.setblocking(False)
        self.held = []  # (name, fd)
        self.servers = []  # every process started, for teardown
        self.server = None

    def argv(self, size=None):
        return [self.binary, "serve", "--size", size or self.size, "--socket", self.socket,
                "--control", self.control, *self.extra]

    def drain(self):
        """Keeps the descriptors of every FDSTORE=1 message queued on the notify socket."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.notify, 4096, 64)
            except BlockingIOError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            if fields.get("FDSTORE") == "1":
                self.held += [(fields.get("FDNAME", "stored"), fd) for fd in fds]
            else:
                for fd in fds:
                    os.close(fd)

    def names(self):
        return {n for n, _ in self.held}

    def start(self, takeover=False, size=None, flag=True):
        """Starts a server (a successor with `takeover`: `--takeover` unless not `flag`, as
        systemd restarts a service); returns (process, READY text or None if it exited
        first)."""
        r, w = os.pipe()
        # Far above 3 + the held descriptors, so that the helper's dup2 overwrites none.
        ready = fcntl.fcntl(w, fcntl.F_DUPFD, 200)
        os.close(w)
        argv = [*self.argv(size), "--ready-fd", str(ready)]
        env = {**os.environ, "NOTIFY_SOCKET": os.path.join(self.dir, "notify")}
        moved = []
        try:
            if takeover:
                moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 300) for _, fd in self.held]
                env["LISTEN_FDS"] = str(len(moved))
                env["LISTEN_FDNAMES"] = ":".join(n for n, _ in self.held)
                argv = [sys.executable, "-c", EXEC_HELPER, str(len(moved)), *map(str, moved),
                        *argv, *(["--takeover"] if flag else [])]
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                    stderr=self.log, pass_fds=[ready, *moved], start_new_session=True)
        finally:
            os.close(ready)
            for fd in moved:
                os.close(fd)
        self.servers.append(proc)
        line = b""
        deadline = time.monotonic() + READY_TIMEOUT_S
        with os.fdopen(r, "rb") as pipe:
            while time.monotonic() < deadline and not line.endswith(b"\n"):
                if not select.select([pipe], [], [], 0.2)[0]:
                    if proc.poll() is not None:
                        break
                    continue
                chunk = os.read(pipe.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
        self.drain()
        text = line.decode().strip()
        if text.startswith("READY "):
            self.server = proc
            return proc, text[len("READY "):]
        proc.wait(timeout=30)
        return proc, None

    def start_ok(self, takeover=False, flag=True):
        proc, ready = self.start(takeover, flag=flag)
        assert ready == self.socket, f"server not ready (exit {proc.returncode}):\n{self.text()}"
        return proc

    def kill(self):
        """SIGKILL to the running server, reaped (its pid is no longer a zombie)."""
        os.kill(self.server.pid, signal.SIGKILL)
        self.server.wait(timeout=30)

    def release(self):
        """The holder lets go: the descriptors it kept are closed."""
        for _, fd in self.held:
            os.close(fd)
        self.held = []

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-8000:].decode(errors="replace")

    def close(self):
        for p in self.servers:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        self.release()
        self.notify.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def holder(compcache_bin):
    need_qemu_io()
    h = Holder(compcache_bin)
    yield h
    h.close()


def image_opts(sock, reconnect_delay=None):
    opts = f"driver=nbd,server.type=unix,server.path={sock},export={EXPORT_NAME}"
    if reconnect_delay is not None:
        opts += f",reconnect-delay={reconnect_delay}"
    return ["qemu-io", "--image-opts", opts]


def qemu_io_argv(sock, cmds, reconnect_delay=None):
    argv = image_opts(sock, reconnect_delay)
    for c in cmds:
        argv += ["-c", c]
    return argv


# Step i writes region i % REGIONS (256 KiB each, 60 MiB of the 64 MiB device) with pattern
# byte 1..251, which changes from one pass over the regions to the next.
STEP = 256 << 10
REGIONS = 240


def pattern_of(i):
    return i % 251 + 1


def write_read_steps(steps):
    """qemu-io commands: each step writes its region's pattern and reads it back (verified)."""
    cmds = []
    for i in range(steps):
        off = i % REGIONS * STEP
        cmds += [f"write -P {pattern_of(i)} {off} {STEP}", f"read -P {pattern_of(i)} {off} {STEP}"]
    return cmds


def verify_all(sock, steps):
    """A new qemu-io reads every region back from the server now running: the last pattern
    written there."""
    last = {i % REGIONS: i for i in range(steps)}
    cmds = [f"read -P {pattern_of(i)} {r * STEP} {STEP}" for r, i in sorted(last.items())]
    p = run(qemu_io_argv(sock, cmds), check=False, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "failed" not in out and out.count("read ") == len(cmds), out[-3000:]


def op_seconds(out):
    """The durations qemu-io reported for its operations (`...; 00.05 sec (...)`)."""
    return [float(m) for m in re.findall(r"; (\d+\.\d+) sec", out)]


def replace_servers(h, qemu, times, how):
    """While `qemu` runs, ends the server `times` times (`how`: 'kill' or 'usr2') and starts a
    successor each time; returns (ms from each end to the successor's READY, the exit codes)."""
    gaps, codes = [], []
    for _ in range(times):
        time.sleep(0.25)
        if qemu.poll() is not None:
            break
        t0 = time.monotonic()
        if how == "kill":
            h.kill()
        else:
            os.kill(h.server.pid, signal.SIGUSR2)
            h.server.wait(timeout=30)
            assert os.path.exists(h.socket) and os.path.exists(h.control), "a server that handed over removed its sockets"
        codes.append(h.server.returncode)
        h.start_ok(takeover=True)
        gaps.append((time.monotonic() - t0) * 1000)
    return gaps, codes


@contextlib.contextmanager
def qemu_io_running(argv, stdout=subprocess.PIPE):
    """qemu-io started with `argv` in the background, its output (text, with stderr) to
    `stdout` (a pipe unless given); killed on the way out if it is still running."""
    qemu = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT, text=True)
    try:
        yield qemu
    finally:
        if qemu.poll() is None:
            qemu.kill()
            qemu.wait()


def run_through_replacements(h, how, times, steps=4000):
    h.start_ok()
    assert h.names() == HELD, h.names()
    # Its output to a file: a pipe nobody reads while the servers are replaced would fill and
    # stop qemu-io (then no request would be in flight at the kills).
    out_path = os.path.join(h.dir, "qemu-io.out")
    with open(out_path, "w") as out_file, qemu_io_running(qemu_io_argv(h.socket, write_read_steps(steps), reconnect_delay=30),
                                                            out_file) as qemu:
        wait_for(lambda: os.path.getsize(out_path) > 0 or qemu.poll() is not None, "qemu-io's first request")
        gaps, codes = replace_servers(h, qemu, times, how)
        qemu.wait(timeout=300)
    with open(out_path) as f:
        out = f.read()
    assert len(gaps) == times, f"qemu-io finished after {len(gaps)} of {times} replacements: make it longer"
    assert qemu.returncode == 0 and "failed" not in out, out[-3000:]
    assert out.count("wrote ") == steps and out.count("read ") == steps, out[-3000:]
    verify_all(h.socket, steps)
    ops = sorted(op_seconds(out))
    print(f"{how}: {times} servers replaced during {steps} write+verify steps; end to successor READY "
          f"{', '.join(f'{g:.0f}' for g in gaps)} ms; slowest qemu-io operations "
          f"{', '.join(f'{s * 1000:.0f}' for s in ops[-times:])} ms (median {ops[len(ops) // 2] * 1000:.1f} ms)")
    return codes


def test_sigkill_during_qemu_io_loses_no_acknowledged_write(holder):
    codes = run_through_replacements(holder, "kill", times=5)
    assert codes == [-signal.SIGKILL] * 5
    assert "took the store over" in holder.text()


def test_sigusr2_hands_over_to_a_successor_on_the_same_listeners(holder):
    codes = run_through_replacements(holder, "usr2", times=3)
    assert codes == [HANDED_OVER] * 3, holder.text()
    assert "handed over; exiting" in holder.text()


def test_a_client_connecting_meanwhile_waits_in_the_backlog(holder):
    h = holder
    h.start_ok()
    run(qemu_io_argv(h.socket, ["write -P 0x5a 1M 1M"]))
    h.kill()
    # Nobody serves; the held listener queues the connection.
    with qemu_io_running(qemu_io_argv(h.socket, ["read -P 0x5a 1M 1M"])) as qemu:
        time.sleep(0.5)
        assert qemu.poll() is None, f"qemu-io ended with no server: {qemu.stdout.read()}"
        h.start_ok(takeover=True)
        out, _ = qemu.communicate(timeout=60)
    assert qemu.returncode == 0 and "failed" not in out, out


def test_the_tcp_listener_is_handed_over_too(compcache_bin):
    """`--listen` (port 0: a free one): the successor serves on the same TCP listener, and a
    qemu-io connected over TCP when the server is killed reconnects to it."""
    need_qemu_io()
    h = Holder(compcache_bin, extra=["--listen", "127.0.0.1:0", "--insecure-plain-tcp"])
    try:
        h.start_ok()
        port = int(re.search(r"tcp:127\.0\.0\.1:(\d+)", h.text()).group(1))
        opts = f"driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export={EXPORT_NAME},reconnect-delay=30"
        cmds = ["write -P 0x2c 5M 1M", "sleep 800", "read -P 0x2c 5M 1M"]
        with qemu_io_running(["qemu-io", "--image-opts", opts, *[a for c in cmds for a in ("-c", c)]]) as qemu:
            time.sleep(0.4)  # qemu-io has written and sleeps: the kill comes between its requests
            h.kill()
            h.start_ok(takeover=True)
            out, _ = qemu.communicate(timeout=60)
        assert qemu.returncode == 0 and "failed" not in out and out.count("read 1048576/1048576") == 1, out
        assert h.text().count(f"tcp:127.0.0.1:{port}") == 2, h.text()
    finally:
        h.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(sock):
    """Sends GET /metrics on the connected `sock` and returns the whole answer."""
    sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data.decode(errors="replace")


def test_the_metrics_port_is_held_across_a_takeover(compcache_bin):
    """`--metrics`: the listener is given to the holder with the others; while no server runs
    a scrape connects (it waits in the backlog, the port is never free for another program)
    and the successor answers it on the same listener; the holder keeps one such descriptor."""
    port = free_port()
    h = Holder(compcache_bin, extra=["--metrics", f"127.0.0.1:{port}"])
    try:
        h.start_ok()
        assert "compcache-metrics-listen" in h.names(), h.names()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            assert "compcache_disksize_bytes" in http_get(c)
        h.kill()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.settimeout(60)
            h.start_ok(takeover=True)
            answer = http_get(c)
        assert answer.startswith("HTTP/1.") and " 200 " in answer.splitlines()[0], answer[:300]
        assert "compcache_disksize_bytes" in answer
        assert [n for n, _ in h.held].count("compcache-metrics-listen") == 1, h.held
        # A second takeover, and the port still answers.
        h.kill()
        h.start_ok(takeover=True)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            assert "compcache_disksize_bytes" in http_get(c)
    finally:
        h.close()


def test_as_systemd_restarts_it_no_takeover_flag_is_needed(holder):
    """systemd gives a restarted service its stored descriptors on the same command line, with
    LISTEN_PID: that alone makes the server take the device over."""
    h = holder
    h.start_ok()
    run(qemu_io_argv(h.socket, ["write -P 0x66 3M 1M"]))
    h.kill()
    h.start_ok(takeover=True, flag=False)
    run(qemu_io_argv(h.socket, ["read -P 0x66 3M 1M"]))
    assert "took the device over" in h.text()


def test_other_settings_are_refused_and_sigterm_still_cleans_up(holder):
    h = holder
    h.start_ok()
    run(qemu_io_argv(h.socket, ["write -P 0x33 0 2M"]))
    h.kill()
    proc, ready = h.start(takeover=True, size="128M")
    assert ready is None and proc.returncode == TAKEOVER_REFUSED, h.text()
    refusal = [line for line in h.text().splitlines() if "cannot take the device over" in line]
    assert len(refusal) == 1 and refusal[0].count("cannot take") == 1 and "64 MiB" in refusal[0], h.text()
    # The state is as it was: the right settings take it over.
    h.start_ok(takeover=True)
    run(qemu_io_argv(h.socket, ["read -P 0x33 0 2M"]))
    os.kill(h.server.pid, signal.SIGTERM)
    assert h.server.wait(timeout=30) == 0, h.text()
    assert not os.path.exists(h.socket) and not os.path.exists(h.control), os.listdir(h.dir)


def test_with_no_successor_reads_fail_never_wrong_data(holder):
    h = holder
    h.start_ok()
    cmds = ["write -P 0x77 0 1M", "read -P 0x77 0 1M", "sleep 1500", "read -P 0x77 0 1M"]
    with qemu_io_running(qemu_io_argv(h.socket, cmds, reconnect_delay=2)) as qemu:
        time.sleep(0.7)
        h.kill()
        h.release()
        out, _ = qemu.communicate(timeout=120)
    assert out.count("read 1048576/1048576") == 1, out
    assert "read failed" in out and "Pattern verification failed" not in out, out
    p = run(qemu_io_argv(h.socket, ["read -P 0x77 0 1M"]), check=False, timeout=60)
    assert p.returncode != 0 and "Pattern verification failed" not in p.stdout + p.stderr, p.stdout + p.stderr


def server_of(supervisor):
    """The supervisor's running server (its one child), if any."""
    try:
        with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
            kids = [int(p) for p in f.read().split()]
    except OSError:
        return None
    return kids[0] if kids else None


def test_supervised_serve_through_kills_and_a_hand_over(compcache_bin):
    """`compcache supervise -- serve ...`: the supervisor is the holder and starts the
    successors (four SIGKILLs, then SIGUSR2 to the supervisor: a hand-over) while qemu-io
    writes and verifies; SIGTERM to the supervisor stops the last server, which removes its
    socket files."""
    need_qemu_io()
    if os.geteuid() != 0:
        pytest.skip("needs root: the supervisor locks its memory")
    d = tempfile.mkdtemp(prefix="compcache-supervise-serve-")
    sock, log = os.path.join(d, "nbd.sock"), os.path.join(d, "servers.log")
    sup = subprocess.Popen([compcache_bin, "supervise", "--log", log, "--", "serve", "--size", "64M", "--socket", sock,
                            "--control", sock + ".ctl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    qemu, pids, steps = None, [], 4000
    try:
        line = sup.stdout.readline()
        assert f"supervise: {sock} served by pid" in line and "a successor takes over" in line, \
            (line, sup.stderr.read() if sup.poll() is not None else "")
        pids.append(server_of(sup.pid))
        out_path = os.path.join(d, "qemu-io.out")
        with open(out_path, "w") as out_file:
            qemu = subprocess.Popen(qemu_io_argv(sock, write_read_steps(steps), reconnect_delay=30),
                                    stdout=out_file, stderr=subprocess.STDOUT)
        wait_for(lambda: os.path.getsize(out_path) > 0 or qemu.poll() is not None, "qemu-io's first request")
        for i in range(5):
            time.sleep(0.25)
            assert qemu.poll() is None, "qemu-io finished before the servers were replaced: make it longer"
            old = pids[-1]
            os.kill(sup.pid if i == 4 else old, signal.SIGUSR2 if i == 4 else signal.SIGKILL)
            wait_for(lambda: server_of(sup.pid) not in (None, old), "a successor", timeout=60)
            pids.append(server_of(sup.pid))
        qemu.wait(timeout=300)
        with open(out_path) as f:
            out = f.read()
        assert qemu.returncode == 0 and "failed" not in out, out[-3000:]
        assert out.count("wrote ") == steps and out.count("read ") == steps, out[-3000:]
        verify_all(sock, steps)
        ops = sorted(op_seconds(out))
        print(f"supervised: 4 kills and a hand-over; slowest qemu-io operations "
              f"{', '.join(f'{s * 1000:.0f}' for s in ops[-5:])} ms")
        sup.send_signal(signal.SIGTERM)
        code, own = sup.wait(timeout=60), sup.stderr.read()
        assert code == 0, own
        with open(log) as f:
            text = f.read()
        assert text.count("took the device over") == 5 and "handed over; exiting" in text, text
        # The supervisor starts a standby once each server is up: a kill's successor is it.
        assert "(the standby) serves" in own, own
        print("successors: " + "; ".join(l.split("successor ", 1)[1] for l in own.splitlines() if "successor pid" in l))
        assert len(set(pids)) == 6 and not any(ours(p) for p in pids), pids
        assert not os.path.exists(sock) and not os.path.exists(sock + ".ctl"), os.listdir(d)
    finally:
        if qemu is not None and qemu.poll() is None:
            qemu.kill()
            qemu.wait()
        if sup.poll() is None:
            sup.send_signal(signal.SIGTERM)
            try:
                sup.wait(timeout=60)
            except subprocess.TimeoutExpired:
                sup.kill()
                sup.wait()
        for p in pids:
            if p and ours(p):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        sup.stdout.close()
        sup.stderr.close()
        shutil.rmtree(d, ignore_errors=True)
