"""Fixtures for compcache's integration tests: a real `compcache serve` on a temporary Unix
socket, driven by real NBD clients (nbdinfo, nbdcopy, qemu-img/qemu-io, fio, nbdfuse).

Every server a test starts is killed by its PID and its files removed in teardown, also when
the test fails. Nothing here touches devices, mounts or processes it did not create.

Environment:
  COMPCACHE_BIN       the compcache binary (default: target/release/compcache, built with
                      `cargo build --release -p compcache` when missing)
  COMPCACHE_PAGE_MIB  MiB per program for the real page files (default 64; see
                      tools/pagedump)
"""
import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools", "pagedump"))
sys.path.insert(0, REPO)
import pagedump  # noqa: E402
from bench.fio_nbd import FIO_ZEROES_JOB, fio_global, fio_verify_job  # noqa: E402,F401  (shared with the soak)

PAGE = 4096
MiB = 1 << 20
EXPORT_NAME = "compcache"
SERVER_READY_TIMEOUT_S = 30
SWAP_WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "swap_workload.py")


def run(cmd, check=True, timeout=300, **kw):
    """Runs a command, capturing text output; on failure the assertion shows all of it."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {p.returncode}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def need(*tools):
    """Skips the test, saying which, when a client program is not installed."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (scripts/install-deps tests; lists in scripts/deps/)")


def need_fio_nbd():
    """Skips the test unless fio has its nbd engine (libnbd inside fio; Debian's fio-3.33 has)."""
    need("fio")
    p = run(["fio", "--enghelp=nbd"], check=False)
    if p.returncode != 0 or "uri" not in p.stdout:
        pytest.skip("this fio has no nbd engine")


def run_fio(tmp_path, name, text, expect_ok=True, timeout=600):
    """Runs fio job file `text` in tmp_path (where fio leaves its verify state files); returns
    (jobs by name, stderr, return code). With expect_ok, a failure shows fio's output."""
    job = tmp_path / f"{name}.fio"
    job.write_text(text)
    out = tmp_path / f"{name}.json"
    p = run(["fio", "--output-format=json", f"--output={out}", str(job)], check=False,
            timeout=timeout, cwd=tmp_path)
    body = out.read_text() if out.exists() else ""
    if expect_ok:
        assert p.returncode == 0, f"fio {name} failed ({p.returncode}):\n{p.stderr[-3000:]}\n{body[-3000:]}"
    result = json.loads(body[body.index("{"):]) if "{" in body else {"jobs": []}
    return {j["jobname"]: j for j in result["jobs"]}, p.stderr, p.returncode


def wait_for(cond, what, timeout=30.0):
    """Polls `cond` until it holds; fails with `what` after `timeout` seconds (a safety net,
    not a measurement: the waits in these tests normally end within a second or two)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def qemu_io(image, *cmds, check=True, timeout=300):
    """Runs qemu-io with the commands `cmds` on `image`: an NBD URI (a raw image), or the list
    of qemu-io options that name one (`--object ... --image-opts ...`). With `check`, a
    non-zero exit or "failed" in the output (a failed I/O or pattern check) fails the test.
    Returns (return code, output)."""
    argv = ["qemu-io", *(["-f", "raw", image] if isinstance(image, str) else image)]
    for c in cmds:
        argv += ["-c", c]
    p = run(argv, check=False, timeout=timeout)
    out = p.stdout + p.stderr
    if check:
        assert p.returncode == 0 and "failed" not in out, out
    return p.returncode, out


def recv_exactly(s, n):
    """`n` bytes from socket `s`; fewer only when the peer closed the connection."""
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def need_root(why):
    if os.geteuid() != 0:
        pytest.skip(f"needs root: {why}")


def file_sha256(path, length=None):
    h = hashlib.sha256()
    left = length
    with open(path, "rb") as f:
        while left is None or left > 0:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def stat_of(stats, key):
    """A statistic of `compcache stat --json` (one flat object, zram's names), failing the
    test when the server has none of that name."""
    assert key in stats, f"`compcache stat --json` has no {key}"
    return stats[key]


class Server:
    """One `compcache serve` process on a Unix socket in its own temporary directory."""

    def __init__(self, binary, size, extra_args=(), cwd=None):
        self.binary = binary
        self.size = size
        self.dir = tempfile.mkdtemp(prefix="compcache-test-")
        self.socket = os.path.join(self.dir, "nbd.sock")
        self.control = self.socket + ".ctl"
        self.log_path = os.path.join(self.dir, "server.log")
        # size None: no --size (a cache device, `--origin`, has its origin's size).
        sized = [] if size is None else ["--size", str(size)]
        self.argv = [binary, "serve", *sized, "--socket", self.socket,
                     "--control", self.control, *map(str, extra_args)]
        self.proc = None
        self.ready_line = None

    # NBD URIs of the export, in libnbd's and qemu's spelling.
    @property
    def uri(self):
        return f"nbd+unix:///{EXPORT_NAME}?socket={self.socket}"

    @property
    def qemu_uri(self):
        return f"nbd:unix:{self.socket}:exportname={EXPORT_NAME}"

    def start(self):
        self._log = open(self.log_path, "wb")
        # Own session: a signal meant for pytest's process group never reaches the server,
        # and the server is never left in a test's cgroup (it stays in pytest's).
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._log, start_new_session=True)
        deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"compcache serve exited {self.proc.returncode} before "
                                     f"ready: {' '.join(self.argv)}\n{self.log()}")
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r and self.ready_line is None:
                line = self.proc.stdout.readline()
                if line:
                    self.ready_line = line.decode(errors="replace").strip()
            # The socket accepting connections is what counts; the ready line (asserted by
            # test_nbdinfo) is recorded when the server has printed it by then.
            if self._connectable():
                if self.ready_line is None:
                    r, _, _ = select.select([self.proc.stdout], [], [], 1.0)
                    if r:
                        self.ready_line = self.proc.stdout.readline().decode(errors="replace").strip()
                return self
        raise AssertionError(f"compcache serve not ready within {SERVER_READY_TIMEOUT_S}s "
                             f"(ready line: {self.ready_line!r})\n{self.log()}")

    def _connectable(self):
        if not os.path.exists(self.socket):
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(2)
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-8000:].decode(errors="replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stat(self):
        p = run([self.binary, "stat", "--json", "--control", self.control], timeout=30)
        return json.loads(p.stdout)

    def stat_value(self, key):
        return stat_of(self.stat(), key)

    def stop(self):
        """Kills the server by its PID (TERM, then KILL) and removes its files."""
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    os.kill(self.proc.pid, signal.SIGTERM)
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
                except ProcessLookupError:
                    pass
            self.proc.stdout.close()
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def build_binary():
    """Path of the compcache binary, building it once if needed; None with a reason if not."""
    env_bin = os.environ.get("COMPCACHE_BIN")
    if env_bin:
        return (env_bin, None) if os.access(env_bin, os.X_OK) else (None, f"COMPCACHE_BIN={env_bin} is not executable")
    path = os.path.join(REPO, "target", "release", "compcache")
    if not os.access(path, os.X_OK):
        cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
        if not os.access(cargo, os.X_OK):
            return None, "cargo is not installed and target/release/compcache is missing"
        p = subprocess.run([cargo, "build", "--release", "-p", "compcache"], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0 or not os.access(path, os.X_OK):
            return None, "cargo build --release -p compcache failed:\n" + p.stdout[-3000:]
    return path, None


@pytest.fixture(scope="session")
def compcache_bin():
    path, why = build_binary()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture
def start_server(compcache_bin):
    """Factory: start_server(size, *extra_args) -> a ready Server (size None: no --size);
    all are stopped after."""
    servers = []

    def start(size="256M", *extra_args):
        s = Server(compcache_bin, size, extra_args)
        servers.append(s)
        return s.start()

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def server(start_server):
    """A 256 MiB lz4 device."""
    return start_server("256M")


@pytest.fixture(scope="session")
def page_files():
    """Real page files (tools/pagedump): {'python'|'node'|'java'|'mixed': path}."""
    mib = int(os.environ.get("COMPCACHE_PAGE_MIB", "64"))
    missing = [t for t in ("node", "javac", "java") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"making real page files needs {', '.join(missing)}")
    return pagedump.ensure_data(os.path.join(REPO, "data"), mib)


def page_file_meta(path):
    with open(path + ".json") as f:
        return json.load(f)


def kill_pid(proc):
    """SIGKILL to a process this test started (by its PID), and wait for it."""
    if proc is not None and proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def same_device(a, b):
    """Whether paths `a` and `b` are the same file or block device (by device number: swap
    enabled through another node of the device, as `compcache swapon` does, is that device's)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return stat.S_ISBLK(sa.st_mode) and stat.S_ISBLK(sb.st_mode) and sa.st_rdev == sb.st_rdev


def swap_used_kib(dev):
    """Used KiB of `dev` in /proc/swaps (0 if absent)."""
    with open("/proc/swaps") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts and same_device(parts[0], dev):
                return int(parts[3])
    return 0


def memory_cgroup_parent():
    """(directory, version) where a memory cgroup can be made, or (None, reason)."""
    v1 = "/sys/fs/cgroup/memory"
    if os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
        return v1, 1
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        try:
            with open(os.path.join(root, "cgroup.subtree_control")) as f:
                if "memory" in f.read().split():
                    return root, 2
        except OSError:
            pass
    return None, "no cgroup v1 memory controller and no cgroup v2 tree with memory enabled"


def need_memory_cgroup():
    """(directory, version) from memory_cgroup_parent(); skips the test, saying why, if none."""
    cg_parent, cg_version = memory_cgroup_parent()
    if cg_parent is None:
        pytest.skip(cg_version)
    return cg_parent, cg_version


def remove_cgroup(path: str) -> bool:
    """Removes a memory cgroup whose tasks have exited (the kernel may take a moment to let
    go of it); whether it is gone."""
    for _ in range(50):
        try:
            os.rmdir(path)
            return True
        except OSError:
            time.sleep(0.1)
    return False


class SwapWorkloadRun:
    """What run_swap_workload saw: the workload's output, the KiB of the swap device in use
    when it printed FILLED, and whether its cgroup was removed afterwards."""

    def __init__(self, output, swapped_kib, cgroup, cgroup_removed):
        self.output = output
        self.swapped_kib = swapped_kib
        self.cgroup = cgroup
        self.cgroup_removed = cgroup_removed


def run_swap_workload(cg_parent, cg_version, prefix, swap_dev, mib=192, limit=64 * MiB,
                      started=None, filled=None, timeout=600, hold=False):
    """Runs swap_workload.py `mib` in a new memory cgroup (`prefix`-<random>, under
    `cg_parent` from memory_cgroup_parent()) limited to `limit` bytes, so its pages go through
    swap. Only the workload joins the cgroup (before it execs); the caller and its servers stay
    where pytest is. `started(cgroup)` is called once the workload runs, `filled()` when it has
    printed FILLED; with `hold`, the workload waits (its pages swapped out, untouched) until
    `filled()` has returned, then checks them. Fails the test unless the workload exits 0
    having verified every page.

    The workload is killed by its PID and the cgroup removed in `finally`, also on failure.
    Reading stops after `timeout` seconds; the exit is then awaited for what is left of it
    (at least 60 s)."""
    cgroup = os.path.join(cg_parent, f"{prefix}-{uuid.uuid4().hex[:8]}")
    cgroup_made = cgroup_removed = False
    workload = None
    try:
        os.mkdir(cgroup)
        cgroup_made = True
        if cg_version == 1:
            write(os.path.join(cgroup, "memory.limit_in_bytes"), limit)
            with contextlib.suppress(OSError):
                write(os.path.join(cgroup, "memory.swappiness"), 100)
        else:
            write(os.path.join(cgroup, "memory.max"), limit)
        procs = os.path.join(cgroup, "cgroup.procs")
        workload = subprocess.Popen(
            [sys.executable, SWAP_WORKLOAD, str(mib), *(["--hold"] if hold else [])],
            stdin=subprocess.PIPE if hold else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: write(procs, os.getpid()))
        if started is not None:
            started(cgroup)
        lines, swapped_kib = [], 0
        deadline = time.monotonic() + timeout
        for line in workload.stdout:
            lines.append(line.rstrip())
            if line.startswith("FILLED"):
                swapped_kib = swap_used_kib(swap_dev)
                if filled is not None:
                    filled()
                if hold:
                    workload.stdin.write("\n")
                    workload.stdin.close()
            if time.monotonic() > deadline:
                break
        rc = workload.wait(timeout=max(60, deadline - time.monotonic()))
        out = "\n".join(lines)
        assert rc == 0, f"workload exited {rc} (-9: the OOM killer):\n{out}"
        assert f"VERIFIED {mib * MiB // PAGE}" in out, out
    finally:
        kill_pid(workload)
        if workload is not None:
            workload.stdout.close()
        if cgroup_made:
            cgroup_removed = remove_cgroup(cgroup)
            if not cgroup_removed:
                print(f"could not remove {cgroup}")
    return SwapWorkloadRun(out, swapped_kib, cgroup, cgroup_removed)


class NbdfuseLoop:
    """The loop device nbdfuse_loop attached, and whether it does direct I/O."""

    def __init__(self, loop, direct_io):
        self.loop = loop
        self.direct_io = direct_io


@contextlib.contextmanager
def nbdfuse_loop(uri, prefix="compcache-nbdfuse-"):
    """The NBD export `uri` as a block device: nbdfuse exposes it as a file in a new temporary
    directory, losetup attaches that (direct I/O when the kernel and FUSE allow it, else
    buffered). Yields a NbdfuseLoop. Needs root, nbdfuse, losetup, fusermount3, /dev/fuse.

    Torn down on leaving, also on failure: losetup -d, fusermount3 -u (then nbdfuse is killed
    by its PID and the mount lazily unmounted if it does not exit), the directory removed. A
    teardown step that fails fails the test when nothing else did (else it is printed)."""
    fusedir = tempfile.mkdtemp(prefix=prefix)
    fuse_file = os.path.join(fusedir, "nbd")
    fuse = loop = None
    errors, failed = [], False
    try:
        fuse = subprocess.Popen(["nbdfuse", fuse_file, uri], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: os.path.exists(fuse_file) and os.path.getsize(fuse_file) > 0
                 or fuse.poll() is not None, "nbdfuse to mount")
        assert fuse.poll() is None, f"nbdfuse exited: {fuse.stdout.read().decode()}"
        p = run(["losetup", "--find", "--show", "--direct-io=on", fuse_file], check=False)
        direct_io = p.returncode == 0
        if not direct_io:
            p = run(["losetup", "--find", "--show", fuse_file])
        loop = p.stdout.strip()
        assert loop.startswith("/dev/loop"), p.stdout
        yield NbdfuseLoop(loop, direct_io)
    except BaseException:
        failed = True
        raise
    finally:
        if loop:
            p = run(["losetup", "-d", loop], check=False)
            if p.returncode:
                errors.append(f"losetup -d {loop}: {p.stderr}")
        if fuse is not None:
            run(["fusermount3", "-u", fusedir], check=False)
            try:
                fuse.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_pid(fuse)
                run(["fusermount3", "-uz", fusedir], check=False)
            fuse.stdout.close()
        shutil.rmtree(fusedir, ignore_errors=True)
        if errors:
            print("teardown problems:", errors)
            if not failed:
                raise AssertionError(f"teardown: {errors}")
