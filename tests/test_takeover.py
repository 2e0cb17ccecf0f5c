"""A FUSE swap server that dies or is replaced while the kernel uses its device (issue 29;
docs/swap.md, "When the server dies").

`compcache swapon --frontend fuse` runs every server under a supervisor that holds its
descriptors; a successor started with `--takeover` serves the same FUSE connection and has the
kernel send the requests in flight again (FUSE_NOTIFY_RESEND).

- O_DIRECT readers and writers on the loop device (taken out of swap: kernel swapoff), each
  page tagged when written and checked when read, while the server is SIGKILLed five times and
  `compcache restart` replaces it with a different build installed at the same path: no request
  fails, no page is wrong, each successor is a new process of the binary at that path, and
  `compcache swapoff` leaves no mount, loop device, process or /run state;
- a successor that refuses the state (a binary that exits TAKEOVER_REFUSED, 78): the supervisor
  pauses, growing, keeps the descriptors and the state's pages locked (VmLck), and the device's
  users wait rather than fail; once a
  compcache that can read the state is installed again, the waiting read is served;
- supervisor gone too: the last holder of the connection is gone, so reads fail with an I/O
  error, never data;
- `compcache fuse` with a holder (NOTIFY_SOCKET) stores the state, the INIT record and all of
  its /dev/fuse descriptors before READY, and serves through /dev/fuse even with --io-uring;
- a cache (`compcache supervise -- fuse --origin`): O_DIRECT traffic on its file while the
  server is SIGKILLed and handed over (SIGUSR2); no request fails, no page read is wrong, and
  after the stop every acknowledged write is on the origin (write-through; the successor starts
  with an empty cache);
- the kernel swaps a workload whose every page is checked (tools/scan -V, in a memory cgroup
  three times smaller than it) to the device while its server is SIGKILLed several times and
  restarted once to a different build: the workload exits 0.

The first three take the device out of swap (kernel swapoff) to use it as a plain block device.

Everything set up is torn down in `finally` (swapoff; else the recorded supervisor and server
killed by PID, the loop device detached, the mount detached). Needs root, /dev/fuse, losetup,
mkswap; two builds of this compcache (target/debug and target/release) for the restart to a
different build.
"""
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import mmap
import re
import struct

import pytest

from conftest import REPO, need, need_memory_cgroup, remove_cgroup, run, swap_used_kib, wait_for, write
from test_fuse import HOST_SWAP_LOCK, host_swap_lock, mounted, need_fuse  # noqa: F401

MiB = 1 << 20
PAGE = 4096
ZERO_PAGE = bytes(PAGE)
STATE_DIR = "/run/compcache/swap"


def other_build(compcache_bin):
    """The build that is not `compcache_bin` (debug or release), if it has `restart`."""
    for kind in ("release", "debug"):
        p = os.path.join(REPO, "target", kind, "compcache")
        if os.path.realpath(p) != os.path.realpath(compcache_bin) and os.access(p, os.X_OK):
            if subprocess.run([p, "restart", "--help"], capture_output=True).returncode == 0:
                return p
    return None


def install(src, dst):
    """Installs `src` at `dst` as a package upgrade does: a new file renamed over the old one
    (the running binary keeps its deleted inode)."""
    tmp = dst + ".new"
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def alive(pid):
    """Whether `pid` is a live compcache server or supervisor (argv[0] `@compcache...`), not a
    zombie: pids are reused quickly on a busy machine (pid_max 32768 here), so a pid alone does
    not say it is still ours."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"@compcache")
    except OSError:
        return False


class Device:
    """One device `compcache swapon --frontend fuse` set up from the binary at `exe`."""

    def __init__(self, exe, env, size="64M", extra=()):
        self.exe, self.env = exe, {**os.environ, **env}
        # By device and server: a record a killed test run left behind may name the same device.
        before = {(d, r.get("pid")) for d, r in self.records().items()}
        p = run([exe, "swapon", "--frontend", "fuse", "--no-config", "--size", size, "--priority", "32767",
                 "--reserve", "8M", *extra], env=self.env, timeout=180)
        print(p.stdout, p.stderr)
        new = {d for d, r in self.records().items() if (d, r.get("pid")) not in before}
        assert len(new) == 1, (p.stdout, p.stderr)
        self.dev = new.pop()
        self.first = self.record()
        self.alias = "/dev/zram-compcache-" + os.path.basename(self.dev)

    @staticmethod
    def records():
        out = {}
        for name in os.listdir(STATE_DIR) if os.path.isdir(STATE_DIR) else []:
            if name.endswith(".json") and not name.endswith(".stats.json"):
                with open(os.path.join(STATE_DIR, name)) as f:
                    v = json.load(f)
                out[v["device"]] = v
        return out

    def record(self):
        return self.records()[self.dev]

    def log(self):
        with open(self.first["log"]) as f:
            return f.read()

    def log_if_any(self):
        """The servers' log, if it is still there (for a failure's message)."""
        with contextlib.suppress(OSError):
            return self.log()[-6000:]
        return "(no log left)"

    def out_of_swap(self):
        """Kernel swapoff only: the mechanics tests use the device as a plain block device."""
        run(["swapoff", self.alias])

    def kill_server(self):
        """SIGKILL to the running server; waits for the successor (a new pid in the record)."""
        old = self.record()["pid"]
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: self.record()["pid"] != old and alive(self.record()["pid"]), "a successor", timeout=60)
        return self.record()["pid"]

    def leftovers(self, pids=()):
        """What of the device is still there (`pids`: every server it had)."""
        name = os.path.basename(self.dev)
        left = [f"pid {p}" for p in pids if alive(p)]
        left += [p for p in (f"/run/compcache/{name}.ctl", f"/run/compcache/fuse-{self.first['pid']}") if os.path.exists(p)]
        if os.path.exists(f"/sys/block/{name}/loop/backing_file"):
            left.append(f"{self.dev} attached")
        with open("/proc/self/mountinfo") as f:
            left += [l.split()[4] for l in f if "/run/compcache/fuse-" in l.split()[4]]
        left += [f"pid {p}" for p in (self.first["supervisor"], self.first["pid"]) if alive(p)]
        if os.path.exists(os.path.join(STATE_DIR, name + ".json")):
            left.append("its record")
        left += [n for n in os.listdir(STATE_DIR) if n == f"notify-{self.first['supervisor']}.sock"]
        left += [self.alias] if os.path.exists(self.alias) else []
        return left

    def swapoff(self):
        p = run([self.exe, "swapoff", self.dev], env=self.env, check=False, timeout=600)
        print(p.stdout, p.stderr)
        return p

    def teardown(self):
        """swapoff; if that failed, whatever is left is taken down by hand."""
        if os.path.exists(os.path.join(STATE_DIR, os.path.basename(self.dev) + ".json")):
            self.swapoff()
        rec = self.records().get(self.dev, self.first)
        for pid in (rec["supervisor"], rec["pid"]):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        name = os.path.basename(self.dev)
        if os.path.exists(f"/sys/block/{name}/loop/backing_file"):
            run(["swapoff", self.alias], check=False)
            run(["losetup", "-d", self.dev], check=False)
        with open("/proc/self/mountinfo") as f:
            for d in [l.split()[4] for l in f if "/run/compcache/fuse-" in l.split()[4]]:
                run(["umount", "-l", d], check=False)
        with contextlib.suppress(OSError):
            os.remove(os.path.join(STATE_DIR, name + ".json"))
        with contextlib.suppress(OSError):
            os.remove(self.alias)


class Traffic:
    """Threads doing O_DIRECT reads and writes of 1-16 pages at random offsets of `dev`, each
    in its own region (past the first MiB, where mkswap's header is), until stopped. Every page
    written carries a tag (thread, counter) and every page read is compared with the last tag
    written there (zeros if none): errors and wrong pages are kept."""

    def __init__(self, dev, size, threads=4):
        self.dev, self.stop_flag = dev, threading.Event()
        self.region = (size - MiB) // threads // PAGE * PAGE
        self.errors, self.done, self.checked = [], 0, 0
        # Each thread's acknowledged writes when it ended: (first byte, {page: tag}).
        self.written = [None] * threads
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, me):
        rng = random.Random(me)
        base = MiB + me * self.region
        pages = self.region // PAGE
        want = {}
        counter = 0
        buf = mmap.mmap(-1, 16 * PAGE)
        fd = os.open(self.dev, os.O_RDWR | os.O_DIRECT)
        try:
            while not self.stop_flag.is_set():
                n = rng.choice((1, 4, 16))
                first = rng.randrange(0, pages - n)
                view = memoryview(buf)[:n * PAGE]
                try:
                    if rng.random() < 0.5:
                        tags = []
                        for k in range(n):
                            counter += 1
                            tag = struct.pack("<II", me, counter) * (PAGE // 8)
                            buf[k * PAGE:(k + 1) * PAGE] = tag
                            tags.append(tag)
                        os.pwritev(fd, [view], base + first * PAGE)
                        for k, tag in enumerate(tags):
                            want[first + k] = tag
                    else:
                        os.preadv(fd, [view], base + first * PAGE)
                        for k in range(n):
                            got = bytes(buf[k * PAGE:(k + 1) * PAGE])
                            if got != want.get(first + k, ZERO_PAGE):
                                with self.lock:
                                    self.errors.append(f"wrong data in page {base // PAGE + first + k}")
                        with self.lock:
                            self.checked += n
                except OSError as e:
                    with self.lock:
                        self.errors.append(f"{base + first * PAGE}+{n * PAGE}: {e}")
                with self.lock:
                    self.done += 1
        finally:
            os.close(fd)
            self.written[me] = (base, want)

    def count(self):
        with self.lock:
            return self.done

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=120)
        return self.errors


@pytest.fixture
def builds(compcache_bin, tmp_path):
    """(installed path, the other build): `compcache_bin` copied to a private directory, as if
    installed there, and the build a restart upgrades it to."""
    need_fuse()
    need("mkswap")
    other = other_build(compcache_bin)
    if other is None:
        pytest.skip("the restart to a different build needs both target/debug/compcache and target/release/compcache of this tree")
    d = tmp_path / "bin"
    d.mkdir()
    exe = str(d / "compcache")
    install(compcache_bin, exe)
    return exe, other


def test_kills_and_a_restart_to_another_build_fail_no_request(builds):
    exe, other = builds
    dev = None
    with host_swap_lock():
        try:
            dev = Device(exe, {})
            rec = dev.first
            assert rec["supervisor"] and rec["takeover"], rec
            dev.out_of_swap()
            traffic = Traffic(dev.dev, 64 * MiB)
            pids = [rec["pid"]]
            for _ in range(5):
                time.sleep(0.5)
                pids.append(dev.kill_server())
            # An upgrade: the new build renamed over the installed one, then `compcache restart`.
            install(other, exe)
            before = dev.record()["pid"]
            p = run([exe, "restart", dev.dev], env=dev.env, timeout=180)
            print(p.stdout)
            new = dev.record()["pid"]
            assert new != before and f"handed over to pid {new}" in p.stdout, p.stdout
            assert os.readlink(f"/proc/{new}/exe") == exe, "the successor is not the newly installed binary"
            assert os.stat(f"/proc/{new}/exe").st_ino == os.stat(exe).st_ino
            assert os.readlink(f"/proc/{rec['supervisor']}/exe").endswith("(deleted)"), "the supervisor kept running the old binary"
            served = traffic.count()
            wait_for(lambda: traffic.count() > served + 100, "requests served by the restarted server")
            errors = traffic.stop()
            assert not errors, f"{len(errors)} failed requests or wrong pages, e.g. {errors[:5]}\n{dev.log()}"
            print(f"{traffic.count()} requests, {traffic.checked} pages read back and checked")
            log = dev.log()
            print("\n".join(l for l in log.splitlines() if "successor" in l or "took" in l or "hand" in l))
            assert log.count("starting a successor") >= 5 and "handed over" in log, log
            # Each kill's successor was the standby started in advance; the hand-over's is a
            # standby of the build installed since, started (and the old build's dismissed) when
            # `compcache restart` asked the supervisor, pinned before the server handed over.
            assert log.count("(the standby) serves") >= 6 and "of the installed binary is pinned" in log, log
            # Every successor says what its takeover cost (time and page faults).
            costs = re.findall(r"serving \S+ again: [0-9.]+ ms and [0-9]+ page faults \([0-9]+ major\)", log)
            assert len(costs) >= 6, log
            assert "FUSE_NOTIFY_RESEND)" in log and "refused FUSE_NOTIFY_RESEND" not in log, log
            pids.append(new)
            assert len(set(pids)) == 7
            p = dev.swapoff()
            assert p.returncode == 0, p.stderr
            assert dev.leftovers(pids) == [], dev.log_if_any()
        finally:
            if dev:
                dev.teardown()


def test_a_refused_state_keeps_the_device_waiting_not_failing(builds):
    """A successor that cannot use the state exits 78: the supervisor pauses before the next one
    (growing), keeps the descriptors, and a read waits; once a compcache that can take the
    device over is installed, the read is served."""
    exe, _ = builds
    good = exe + ".good"
    shutil.copy2(exe, good)
    dev = None
    with host_swap_lock():
        try:
            dev = Device(exe, {})
            dev.out_of_swap()
            # 8 MiB of random pages (stored as they are: incompressible) for the supervisor to
            # lock while no server holds them.
            fd = os.open(dev.dev, os.O_WRONLY | os.O_DIRECT)
            buf = mmap.mmap(-1, MiB)
            for i in range(8):
                buf[:] = os.urandom(MiB)
                os.pwrite(fd, buf, (i + 2) * MiB)
            os.close(fd)
            sup = dev.first["supervisor"]
            locked_before = locked_kib(sup)
            with open(exe + ".refusing", "w") as f:
                f.write("#!/bin/sh\necho 'compcache: cannot take the device over: the state has layout 99' >&2\nexit 78\n")
            os.chmod(exe + ".refusing", 0o755)
            os.replace(exe + ".refusing", exe)
            old = dev.record()["pid"]
            # An upgrade to it (a kill would be taken over by the standby, started from the
            # good build before the replacement).
            os.kill(sup, signal.SIGUSR2)
            wait_for(lambda: not alive(old), "the server to hand over")
            result = {}

            def read():
                fd = os.open(dev.dev, os.O_RDONLY | os.O_DIRECT)
                buf = mmap.mmap(-1, 4096)
                t = time.monotonic()
                try:
                    result["n"] = os.preadv(fd, [buf], 0)
                except OSError as e:
                    result["error"] = e
                finally:
                    result["s"] = time.monotonic() - t
                    os.close(fd)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            wait_for(lambda: dev.log().count("refused the state") >= 3, "three refused successors", timeout=60)
            assert reader.is_alive() and not result, f"the read did not wait: {result}"
            log = dev.log()
            assert "in 1s" in log and "in 2s" in log, "the supervisor did not pause, growing:\n" + log
            # No server holds the state's pages locked meanwhile: the supervisor does.
            during = locked_kib(sup)
            pinned = during - locked_before
            assert pinned >= 8 * 1024 and state_mapped(sup) and "locked the state's" in log, (pinned, log)
            install(good, exe)
            reader.join(timeout=60)
            assert result.get("n") == 4096, result
            print(f"the read waited {result['s']:.1f} s and was served; meanwhile the supervisor's VmLck was {pinned} KiB"
                  " higher (the whole mapping of the state file counts), and its log says: "
                  + next(l for l in log.splitlines() if "locked the state's" in l))
            wait_for(lambda: alive(dev.record()["pid"]) and dev.record()["pid"] != old, "the good successor")
            # Once the successor is up the supervisor keeps the lock: a successor locks only the
            # pages it touches (state_pin.rs), and an unlocked page of the state could be swapped
            # out to this very device.
            time.sleep(1)
            assert state_mapped(sup) and locked_kib(sup) >= during - 1024, (locked_kib(sup), during)
        finally:
            if dev:
                dev.teardown()


def state_mapped(pid):
    """Whether `pid` maps the store's state (a memfd named compcache-state; the supervisor also
    maps the small records it holds, locked for as long as it holds them)."""
    with open(f"/proc/{pid}/maps") as f:
        return any("/memfd:compcache-state" in l for l in f)


def locked_kib(pid):
    """VmLck of `pid`, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(l for l in f if l.startswith("VmLck:")).split()[1])


def test_supervisor_gone_too_means_io_errors_not_data(builds):
    exe, _ = builds
    dev = None
    with host_swap_lock():
        try:
            dev = Device(exe, {})
            dev.out_of_swap()
            rec = dev.record()
            os.kill(rec["supervisor"], signal.SIGKILL)
            wait_for(lambda: not alive(rec["supervisor"]), "the supervisor to die")
            os.kill(rec["pid"], signal.SIGKILL)
            wait_for(lambda: not alive(rec["pid"]), "the server to die")
            p = run(["dd", f"if={dev.dev}", "of=/dev/null", "bs=64k", "count=16", "iflag=direct"], check=False)
            assert p.returncode != 0 and "Input/output error" in p.stderr, p.stderr
            p = dev.swapoff()
            assert p.returncode == 0, p.stderr
            assert dev.leftovers() == [], dev.log_if_any()
        finally:
            if dev:
                dev.teardown()


def scan_binary():
    d = os.path.join(REPO, "tools", "scan")
    if subprocess.run(["make", "-s", "-C", d, "scan"], capture_output=True).returncode != 0:
        pytest.skip("tools/scan does not build (make, gcc)")
    return os.path.join(d, "scan")


# The store's kinds the kills come to (issue 29: "also with a backing file, with a cold tier,
# and with recompression working when the kill comes"): the flags, the statistic that shows
# the kind at work just before a kill (greater than 0 at one kill at least), and whether the
# scan pauses for 1.5 s before each kill: recompression skips its steps while the device is
# busy, so with the scan swapping all along it never ran; in the pause it works on the idle
# pages, and the kill comes while it does.
KINDS = {
    "ram": ([], None, False),
    "recompressing": (["--recompress-idle", "1", "--recompress-cpu", "50"], "recomp_pages", True),
    "backing-file": (["--backing", "{tmp}/backing", "--mem-limit", "16M"], "bd_count", False),
    "cold-tier": (["--cold-tier", "256M", "--cold-idle", "1", "--cold-level", "3"], "bd_count", False),
}


# Holds 48 MiB of compressible pages, each naming itself, untouched (so swapped out and idle
# on the device: recompressed, written back, gone cold), until its stdin closes; then checks
# every page and exits 0, or 1 naming the first wrong one.
IDLER = """
import sys
MiB = 1 << 20
def page(i):
    line = b"idle page %08d of the takeover test, kept while the server dies. " % i
    return (line * (4096 // len(line) + 1))[:4096]
buf = bytearray(48 * MiB)
for i in range(len(buf) // 4096):
    buf[i * 4096:(i + 1) * 4096] = page(i)
print("ready", flush=True)
sys.stdin.read()
for i in range(len(buf) // 4096):
    if buf[i * 4096:(i + 1) * 4096] != page(i):
        print("page %d is wrong" % i, flush=True)
        sys.exit(1)
print("idle pages ok", flush=True)
"""


@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_swaps_through_kills_and_an_upgrade(builds, tmp_path, kind):
    """tools/scan -V (every page hashed when written and checked on every pass) in a memory
    cgroup a third of its size swaps to the device while the server is SIGKILLed five times and
    restarted once to another build: it exits 0 with no mismatch. Beside it in the cgroup a
    program holds 48 MiB it leaves idle (IDLER), checked at the end. For each of the store's
    kinds (KINDS): RAM alone, recompressing, with a backing file, with the cold tier; the idle
    pages are what recompression, writeback and the cold tier take while the kills come."""
    exe, other = builds
    flags, at_work, pause = KINDS[kind]
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    cg_parent, cg_version = need_memory_cgroup()
    scan = scan_binary()
    dev = cgroup = proc = idler = None
    with host_swap_lock():
        try:
            dev = Device(exe, {}, size="512M", extra=flags)
            assert dev.first["takeover"], "the store's state does not outlive its server"
            cgroup = os.path.join(cg_parent, f"compcache-takeover-{os.getpid()}")
            os.mkdir(cgroup)
            write(os.path.join(cgroup, "memory.max" if cg_version == 2 else "memory.limit_in_bytes"), 64 * MiB)
            procs = os.path.join(cgroup, "cgroup.procs")
            idler = subprocess.Popen([sys.executable, "-c", IDLER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, preexec_fn=lambda: write(procs, os.getpid()))
            assert idler.stdout.readline().strip() == "ready"
            # Passes enough that the scan outlasts the kills and the restart on a fast machine
            # (CI's did 6 passes in 8 s, and the restart never came).
            proc = subprocess.Popen([scan, "-V", "-v", "-m", "cyclic", "-w", "192", "16"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, preexec_fn=lambda: write(procs, os.getpid()))
            swapped_kib = []
            restarted = False
            seen = 0  # the most of `at_work` the server reported just before a kill
            for i in range(6):
                time.sleep(2)
                if proc.poll() is not None:
                    break
                if pause:
                    os.kill(proc.pid, signal.SIGSTOP)
                    time.sleep(1.5)
                swapped_kib.append(swap_used_kib(dev.alias))
                if at_work:
                    st = run([exe, "stat", "--json", dev.dev], check=False, timeout=30)
                    if st.returncode == 0:
                        seen = max(seen, json.loads(st.stdout)[at_work])
                if i == 3:
                    install(other, exe)
                    run([exe, "restart", dev.dev], timeout=180)
                    restarted = True
                else:
                    dev.kill_server()
                if pause:
                    os.kill(proc.pid, signal.SIGCONT)
            out, _ = proc.communicate(timeout=900)
            print(out[-3000:])
            assert proc.returncode == 0 and "verify=ok" in out and "mismatches=0" in out, out[-3000:]
            idle_out, _ = idler.communicate(input="", timeout=300)
            assert idler.returncode == 0 and "idle pages ok" in idle_out, idle_out
            print(f"KiB in swap on the device at each kill or restart: {swapped_kib}")
            assert max(swapped_kib, default=0) > 0, "nothing was swapped to the device"
            assert restarted and len(swapped_kib) == 6, f"the scan ended before the kills and the restart: {swapped_kib}"
            # The supervisor locked the program a successor started from disk would run, and
            # after the restart the other build's (program_pin.rs).
            pinned = [l for l in dev.log().splitlines() if "locked the program's" in l]
            assert len(pinned) >= 2, dev.log()[-6000:]
            if at_work:
                print(f"{kind}: at most {seen} {at_work} at a kill or the restart")
                assert seen > 0, f"the {kind} store was not at work when the kills came: {at_work} stayed 0"
            p = dev.swapoff()
            assert p.returncode == 0, p.stderr
            assert dev.leftovers() == [], dev.log_if_any()
        finally:
            for p in (proc, idler):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait(timeout=60)
            if cgroup:
                remove_cgroup(cgroup)
            if dev:
                dev.teardown()


def test_a_held_server_stores_before_serving_and_uses_dev_fuse(compcache_bin, tmp_path):
    """`compcache fuse` with a NOTIFY_SOCKET (a holder) stores the store's state, the INIT
    record and every /dev/fuse descriptor it serves on before it reports READY, and with
    --io-uring serves through /dev/fuse all the same (a ring cannot be taken over)."""
    need_fuse()
    from test_systemd import Notify
    notify = Notify(tmp_path / "notify.sock")
    r, w = os.pipe()
    log = open(tmp_path / "fuse.log", "wb")
    proc = subprocess.Popen([compcache_bin, "fuse", "--size", "16M", "--no-loop", "--threads", "3", "--reserve", "0",
                             "--io-uring", "--ready-fd", str(w)], pass_fds=[w], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NOTIFY_SOCKET": notify.path})
    os.close(w)
    try:
        ready = os.read(r, 4096).decode()
        assert ready.startswith("READY "), (tmp_path / "fuse.log").read_text()
        notify.drain()
        names = sorted(n for n, _ in notify.store)
        assert names == ["compcache-fuse"] * 4 + ["compcache-fuse-init", "compcache-store"], names
        init = next(fd for n, fd in notify.store if n == "compcache-fuse-init")
        record = os.pread(init, 4096, 0).decode()
        assert record.startswith("fuse-init minor=") and "max_write=131072" in record and "dir=/run/compcache/fuse-" in record, record
        out = (tmp_path / "fuse.log").read_text()
        assert "fuse transport: /dev/fuse (FUSE over io_uring cannot be taken over" in out, out
        proc.terminate()
        assert proc.wait(timeout=60) == 0
        with open("/proc/self/mountinfo") as f:
            assert f"/run/compcache/fuse-{proc.pid} " not in f.read(), "a clean stop still unmounts"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        os.close(r)
        log.close()
        notify.close()


def children(pid):
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    return []


def cmdline(pid):
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    return b""


def is_standby(pid):
    return b"--standby-fd" in cmdline(pid)


def server_of(supervisor, first, err):
    """The pid of the server `supervisor` runs now: the last successor its log `err` names, else
    `first`, if it is alive."""
    with open(err) as f:
        named = re.findall(r"successor pid (\d+)", f.read())
    pid = int(named[-1]) if named else first
    return pid if alive(pid) else None


def test_a_supervised_cache_loses_no_acknowledged_write(compcache_bin, tmp_path):
    """`compcache supervise -- fuse --origin`: kills and a hand-over under write-through traffic."""
    need_fuse()
    size = 32 * MiB
    origin = tmp_path / "origin.img"
    with open(origin, "wb") as f:
        f.truncate(size)
    log = tmp_path / "servers.log"
    err = tmp_path / "supervise.err"
    with open(err, "w") as f:
        sup = subprocess.Popen([compcache_bin, "supervise", "--log", str(log), "--", "fuse", "--origin", str(origin),
                                "--mem-limit", "8M", "--no-loop"], stdout=subprocess.PIPE, stderr=f, text=True)
    traffic, pids = None, []
    try:
        line = sup.stdout.readline()
        assert "served by pid" in line and "a successor takes over" in line, (line, err.read_text())
        file = line.split("supervise: ", 1)[1].split(" served by", 1)[0]
        ctl = f"/run/compcache/{os.path.basename(os.path.dirname(file))}.ctl"
        first = int(line.split("served by pid ", 1)[1].split()[0])
        pids.append(first)
        wait_for(lambda: any(is_standby(k) for k in children(sup.pid)), "a standby")
        traffic = Traffic(file, size)
        for i in range(6):
            time.sleep(0.4)
            old = pids[-1]
            # The last one a hand-over (what `compcache restart` asks for), the others kills.
            if i == 5:
                os.kill(sup.pid, signal.SIGUSR2)
            else:
                os.kill(old, signal.SIGKILL)
            wait_for(lambda: server_of(sup.pid, first, err) not in (None, old), "a successor", timeout=60)
            pids.append(server_of(sup.pid, first, err))
            served = traffic.count()
            wait_for(lambda: traffic.count() > served + 20, "requests served by the successor")
        # `compcache stat` finds the successor at the first server's control socket.
        stats = json.loads(run([compcache_bin, "stat", "--json", "--control", ctl]).stdout)
        assert stats["disksize"] == size and stats["origin_writes"] > 0, stats
        errors = traffic.stop()
        assert not errors, f"{len(errors)} failed requests or wrong pages, e.g. {errors[:5]}\n{log.read_text()}"
        print(f"{traffic.count()} requests, {traffic.checked} pages read back and checked")
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=60) == 0, err.read_text()
        sup_err = err.read_text()
        text = log.read_text()
        assert text.count("took the FUSE connection over") == 6 and "handed over" in text, text
        # The kills' successors were standbys started in advance, and so was the hand-over's: a
        # standby of the installed binary, pinned before the server was asked to hand over.
        assert sup_err.count("(the standby) serves") == 6 and "of the installed binary is pinned" in sup_err, sup_err
        assert not [p for p in os.listdir("/proc") if p.isdigit() and str(origin).encode() in cmdline(int(p))]
        # Every acknowledged write is on the origin, and nothing else changed there.
        with open(origin, "rb") as f:
            data = f.read()
        wrong = 0
        for base, want in traffic.written:
            for page, tag in want.items():
                off = base + page * PAGE
                wrong += data[off:off + PAGE] != tag
        assert wrong == 0, f"{wrong} acknowledged page(s) not on the origin"
        written = {base + page * PAGE for base, want in traffic.written for page in want}
        assert all(data[o:o + PAGE] == ZERO_PAGE for o in range(0, size, PAGE) if o not in written)
        assert len(set(pids)) == 7 and not any(alive(p) for p in pids), pids
        assert not os.path.exists(ctl) and not os.path.exists(os.path.dirname(file))
    finally:
        if traffic:
            traffic.stop()
        if sup.poll() is None:
            sup.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                sup.wait(timeout=60)
        for p in pids:
            if p and alive(p):
                os.kill(p, signal.SIGKILL)
        if sup.poll() is None:
            sup.kill()
        with open("/proc/self/mountinfo") as f:
            for d in [l.split()[4] for l in f if "/run/compcache/fuse-" in l.split()[4]]:
                if pids and pids[0] and d.endswith(f"fuse-{pids[0]}"):
                    run(["umount", "-l", d], check=False)
