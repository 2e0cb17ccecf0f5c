"""The FUSE front end (`compcache fuse`, `compcache swapon --frontend fuse`).

- the page store's model through the FUSE file: random pread/pwrite/fallocate (punch hole,
  zero range) at any alignment against a byte array, plus the file's edges (end of file,
  ENOSPC past it, EOPNOTSUPP for unsupported fallocate modes);
- fio with verify=crc32c on the loop device `compcache fuse` attaches (direct I/O, 4 KiB
  sectors), then a clean stop that detaches the loop device and unmounts;
- the serving threads take no page fault while they serve writes, reads and discards;
- kill -9 of the server: reads of the loop device (O_DIRECT) and of the file then fail with
  an I/O error, never return data;
- `compcache swapon --frontend fuse`: the kernel swaps the verified workload
  (swap_workload.py) in a memory cgroup three times smaller than it to compcache through
  FUSE; `compcache swapoff` takes all of it down. Holds the host-swap lock
  (/run/lock/compcache-host-swap.lock) while anything of it is swap.

Everything set up is torn down in `finally`, also on failure; servers are killed by PID.
Needs root, /dev/fuse, losetup (and fio, a memory cgroup for the last ones): skipped with the
reason otherwise.
"""
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import random
import signal
import subprocess

import pytest
from bench.ready import read_ready_line  # (conftest puts the repository on the path)

from conftest import (FIO_ZEROES_JOB, kill_pid, need, need_memory_cgroup, need_root, run, run_fio,
                      run_swap_workload, swap_used_kib, wait_for)

MiB = 1 << 20
PAGE = 4096
HOST_SWAP_LOCK = "/run/lock/compcache-host-swap.lock"

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]


def fallocate(fd, mode, offset, length):
    """fallocate(2) with a mode (Python's os.posix_fallocate has none); raises OSError."""
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def need_fuse():
    need_root("FUSE mounts, loop devices and mlock need root")
    need("losetup")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse (modprobe fuse)")


class FuseServer:
    """One `compcache fuse` process; `ready` is the device (or file) it announced."""

    def __init__(self, binary, tmp_path, size, *extra):
        self.log_path = tmp_path / "fuse-server.log"
        r, w = os.pipe()
        self._log = open(self.log_path, "wb")
        self.argv = [binary, "fuse", "--size", str(size), "--ready-fd", str(w), *map(str, extra)]
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, pass_fds=(w,),
                                     start_new_session=True)
        os.close(w)
        self.mount_dir = f"/run/compcache/fuse-{self.proc.pid}"
        self.file = os.path.join(self.mount_dir, "device")
        line = read_ready_line(r)
        if not line.startswith(b"READY "):
            self.stop()
            raise AssertionError(f"compcache fuse did not come up: {self.argv}\n{self.log()}")
        self.ready = line.decode().split()[1]
        self.loop = self.ready if self.ready.startswith("/dev/loop") else None
        name = os.path.basename(self.loop) if self.loop else f"fuse-{self.proc.pid}"
        self.control = f"/run/compcache/{name}.ctl"

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stat(self):
        p = run([self.argv[0], "stat", "--json", "--control", self.control], timeout=30)
        return json.loads(p.stdout)

    def stop(self, timeout=60):
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        rc = None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_pid(self.proc)
        else:
            rc = self.proc.returncode
        self.cleanup()
        return rc

    def cleanup(self):
        """What a dead server leaves behind: its loop device, its mount, its directory."""
        if self.loop and os.path.exists(f"/sys/block/{os.path.basename(self.loop)}/loop/backing_file"):
            with open(f"/sys/block/{os.path.basename(self.loop)}/loop/backing_file") as f:
                backing = f.read().strip()
            if backing.startswith(self.mount_dir):
                run(["losetup", "-d", self.loop], check=False)
        if os.path.ismount(self.mount_dir) or mounted(self.mount_dir):
            run(["umount", "-l", self.mount_dir], check=False)
        with contextlib.suppress(OSError):
            os.rmdir(self.mount_dir)
        self._log.close()


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


@pytest.fixture
def fuse_server(compcache_bin, tmp_path):
    servers = []

    def start(size, *extra):
        s = FuseServer(compcache_bin, tmp_path, size, *extra)
        servers.append(s)
        return s

    yield start
    for s in servers:
        if s.proc.poll() is None:
            s.stop()
        else:
            s.cleanup()


def test_the_file_follows_the_store_model(fuse_server):
    need_fuse()
    size = 16 * MiB
    srv = fuse_server(size, "--no-loop", "--reserve", "0", "--threads", "2")
    check_store_model(srv, size)


def check_store_model(srv, size):
    """The page store's model through the server's file (served with --no-loop): random
    pread/pwrite/fallocate against a byte array, the file's edges, the statistics, and a clean
    stop (exit 0, unmounted, directory removed). Also used by test_fuse_uring.py."""
    assert srv.ready == srv.file
    st = os.stat(srv.file)
    assert st.st_size == size and (st.st_mode & 0o777) == 0o600
    assert (os.stat(srv.mount_dir).st_mode & 0o777) == 0o700
    model = bytearray(size)
    rng = random.Random(1234)
    fd = os.open(srv.file, os.O_RDWR)
    try:
        for step in range(3000):
            op = rng.random()
            off = rng.randrange(size)
            length = rng.choice([1, 100, PAGE, 3 * PAGE + 17, 64 * 1024, 200 * 1024])
            end = min(size, off + length)
            if rng.random() < 0.5:  # whole pages, as swap writes them
                off -= off % PAGE
                end = min(size, off + max(PAGE, (end - off) // PAGE * PAGE))
            if op < 0.45:
                kind = rng.randrange(3)
                data = (bytes([rng.randrange(1, 256)]) * (end - off) if kind == 0 else
                        rng.randbytes(end - off) if kind == 1 else
                        (b"compcache %d " % step) * ((end - off) // 12 + 1))[: end - off]
                assert os.pwrite(fd, data, off) == end - off
                model[off:end] = data
            elif op < 0.8:
                got = os.pread(fd, end - off, off)
                assert got == bytes(model[off:end]), f"step {step}: read {off}..{end} differs"
            elif op < 0.9:
                fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, end - off)
                model[off:end] = bytes(end - off)
            else:
                fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, off, end - off)
                model[off:end] = bytes(end - off)
        # The whole file, in 1 MiB reads.
        for off in range(0, size, MiB):
            assert os.pread(fd, MiB, off) == bytes(model[off:off + MiB]), f"final read at {off}"
        os.fsync(fd)
        # The edges: end of file, a write past it, a write across it, unsupported modes.
        assert os.pread(fd, PAGE, size) == b""
        assert os.pread(fd, 2 * PAGE, size - PAGE) == bytes(model[size - PAGE:])
        with pytest.raises(OSError) as e:
            os.pwrite(fd, b"x", size)
        assert e.value.errno == errno.ENOSPC
        assert os.pwrite(fd, b"y" * 2 * PAGE, size - PAGE) == PAGE
        for mode in (0, FALLOC_FL_KEEP_SIZE):
            with pytest.raises(OSError) as e:
                fallocate(fd, mode, 0, PAGE)
            assert e.value.errno == errno.EOPNOTSUPP, mode
        with pytest.raises(OSError) as e:
            os.ftruncate(fd, size // 2)
        assert e.value.errno == errno.EPERM
    finally:
        os.close(fd)
    stats = srv.stat()
    print("statistics:", {k: stats.get(k) for k in ("num_reads", "num_writes", "orig_data_size", "compr_data_size", "invalid_io")})
    assert stats["num_writes"] > 0 and stats["num_reads"] > 0
    assert stats["failed_reads"] == 0 and stats["failed_writes"] == 0
    assert srv.stop() == 0, srv.log()
    assert not mounted(srv.mount_dir) and not os.path.exists(srv.mount_dir)


# "spin": the serving threads poll /dev/fuse after each reply (`--spin-us`, off by default).
WAITS = pytest.mark.parametrize("wait", [[], ["--spin-us", "50"]], ids=["sleep", "spin"])


@WAITS
def test_fio_verifies_on_the_loop_device(fuse_server, tmp_path, wait):
    need_fuse()
    need("fio")
    # No reserve: with one the store runs fault-free, and fio's incompressible writes at full
    # speed outrun the keeper and get ENOSPC (docs/swap.md), which fio counts as errors.
    srv = fuse_server(256 * MiB, "--reserve", "0", *wait)
    assert srv.loop, srv.ready
    name = os.path.basename(srv.loop)
    with open(f"/sys/block/{name}/queue/logical_block_size") as f:
        assert f.read().strip() == "4096"
    with open(f"/sys/block/{name}/loop/dio") as f:
        dio = f.read().strip()
    print(f"{srv.loop}: direct I/O {dio}; server log:\n{srv.log()}")
    # Every page written is read back and checked (crc32c), at queue depth 32, with
    # request sizes from one page to 64 KiB; then a discard of everything reads back zeros.
    jobs, _, _ = run_fio(tmp_path, "fuse-loop", f"""[global]
filename={srv.loop}
ioengine=libaio
direct=1
size=192m
verify_fatal=1
randrepeat=0
[write-verify]
rw=randwrite
bsrange=4k-64k
bs_unaligned=0
blockalign=4k
iodepth=32
verify=crc32c
do_verify=1
[trim]
stonewall
rw=trim
bs=1m
""" + FIO_ZEROES_JOB)
    for j in jobs.values():
        assert j["error"] == 0, j
    if wait:
        # The "is up" line (written just after READY) says the threads poll.
        assert "(spin 50 us)" in srv.log() and "no polling" not in srv.log(), srv.log()
    stats = srv.stat()
    assert stats["failed_reads"] == 0 and stats["failed_writes"] == 0, stats
    assert stats["num_writes"] > 0
    assert stats["orig_data_size"] == 0, "the trim should have freed every page"
    assert srv.stop() == 0, srv.log()
    assert not os.path.exists(f"/sys/block/{name}/loop/backing_file"), "loop device still attached"
    assert not mounted(srv.mount_dir)


def thread_faults(pid, prefix):
    """Minor + major page faults of the threads of `pid` whose name starts with `prefix`."""
    total, names = 0, []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            stat = f.read()
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        if name.startswith(prefix):
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[7]) + int(fields[9])  # minflt, majflt (stat fields 10 and 12)
            names.append(name)
    return total, names


@WAITS
def test_serving_threads_do_not_fault(fuse_server, wait):
    """The classic transport's threads serve from buffers made before the mount and a
    fault-free store (the default reserve): writes, overwrites, reads and discards through the
    file cost them no page fault, from the first request on (docs/swap.md, "What the I/O
    path allocates")."""
    need_fuse()
    srv = fuse_server(64 * MiB, "--no-loop", "--threads", "2", *wait)
    before, names = thread_faults(srv.proc.pid, "fuse-")
    assert sorted(names) == ["fuse-0", "fuse-1"], names
    rng = random.Random(7)
    words = [bytes(rng.choice(b"abcdefghij ") for _ in range(rng.randint(3, 9))) for _ in range(300)]
    fd = os.open(srv.file, os.O_RDWR)
    try:
        for rnd in range(2):
            for off in range(0, 24 * MiB, 128 << 10):
                chunk = b" ".join(rng.choice(words) for _ in range(40000))[:128 << 10]
                if rnd == 1 and off % MiB == 0:
                    chunk = bytes([off >> 20 & 0xff]) * len(chunk)  # same-filled
                assert os.pwrite(fd, chunk, off) == len(chunk)
                assert os.pread(fd, len(chunk), off) == chunk
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8 * MiB)
        assert os.pread(fd, PAGE, 0) == bytes(PAGE)
    finally:
        os.close(fd)
    after, _ = thread_faults(srv.proc.pid, "fuse-")
    stats = srv.stat()
    assert stats["failed_writes"] == 0 and stats["num_writes"] > 0, stats
    assert after == before, f"the serving threads faulted {after - before} times\n{srv.log()}"


def test_killed_server_means_io_errors_not_data(fuse_server):
    need_fuse()
    need("dd")
    srv = fuse_server(64 * MiB, "--reserve", "0")
    assert srv.loop
    run(["dd", "if=/dev/urandom", f"of={srv.loop}", "bs=64k", "count=64", "oflag=direct"])
    p = run(["dd", f"if={srv.loop}", "of=/dev/null", "bs=64k", "count=64", "iflag=direct"])
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(timeout=30)
    try:
        p = run(["dd", f"if={srv.loop}", "of=/dev/null", "bs=64k", "count=64", "iflag=direct"], check=False)
        assert p.returncode != 0 and "Input/output error" in p.stderr, p.stderr
        with pytest.raises(OSError) as e:
            with open(srv.file, "rb") as f:
                f.read(PAGE)
        assert e.value.errno in (errno.ENOTCONN, errno.EIO), e.value
    finally:
        srv.cleanup()


@contextlib.contextmanager
def host_swap_lock():
    """The host-wide lock every test that swaps on the host holds (flock(1)'s lock)."""
    os.makedirs(os.path.dirname(HOST_SWAP_LOCK), exist_ok=True)
    with open(HOST_SWAP_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compcache_devices():
    """Devices `compcache swapon` recorded (/run/compcache/swap/<dev>.json)."""
    d = "/run/compcache/swap"
    out = {}
    for name in os.listdir(d) if os.path.isdir(d) else []:
        if name.endswith(".json") and not name.endswith(".stats.json"):
            with open(os.path.join(d, name)) as f:
                v = json.load(f)
            out[v["device"]] = v
    return out


def swap_through_fuse(cg_parent, cg_version, prefix, dev, stat, filled=None):
    """The verified workload in a memory cgroup three times smaller than it (run_swap_workload)
    swaps to `dev`, a FUSE server's loop device: swap was in use when it had filled its memory,
    and the server's statistics (`stat()`) show writes and reads and no failures. Also used by
    test_fuse_uring.py. `filled()`, if given, runs while the workload holds its pages swapped
    out (before it reads them back)."""
    swapped_kib = run_swap_workload(cg_parent, cg_version, prefix, dev, filled=filled, hold=filled is not None).swapped_kib
    st = stat()
    print(f"swap used at fill: {swapped_kib} KiB; statistics: num_writes {st['num_writes']} "
          f"num_reads {st['num_reads']} orig {st['orig_data_size']} compr {st['compr_data_size']}")
    assert swapped_kib > 0, "nothing was swapped to the FUSE device"
    assert st["num_writes"] > 0 and st["num_reads"] > 0
    assert st["failed_reads"] == 0 and st["failed_writes"] == 0


@pytest.mark.parametrize("extra", [[], ["--recompress", "on", "--recompress-idle", "1", "--recompress-cpu", "50"],
                                   ["--cold-tier", "256M", "--cold-idle", "1", "--cold-level", "3"]],
                         ids=["plain", "recompress", "cold"])
def test_swapon_frontend_fuse(compcache_bin, extra):
    """The kernel swaps the verified workload to `swapon --frontend fuse`; with `recompress`,
    the swap server also recompresses pages idle for a second (its thread in a locked,
    fault-free server); with `cold`, pages idle for a second move to the cold tier (RAM
    compressed 64 KiB at a time); and every page the workload reads back is still right."""
    need_fuse()
    need("mkswap")
    cg_parent, cg_version = need_memory_cgroup()
    dev = None
    with host_swap_lock():
        before = set(compcache_devices())
        try:
            p = run([compcache_bin, "swapon", "--frontend", "fuse", "--no-config", "--size", "512M",
                     "--priority", "32767", "--reserve", "16M", *extra], timeout=180)
            print(p.stdout, p.stderr)
            new = set(compcache_devices()) - before
            assert len(new) == 1, (p.stdout, compcache_devices())
            dev = new.pop()
            state = compcache_devices()[dev]
            assert dev.startswith("/dev/loop") and state["frontend"] == "fuse", state
            # Enabled through its hibernation-safe name: systemd skips /dev/zram* swap when it
            # picks where a hibernation image goes (docs/swap.md, "Hibernation").
            alias = "/dev/zram-compcache-" + os.path.basename(dev)
            swaps = open("/proc/swaps").read()
            assert swap_used_kib(dev) == 0 and alias in swaps and dev + " " not in swaps, swaps
            assert oct(os.stat(alias).st_mode & 0o777) == "0o600" and os.stat(alias).st_rdev == os.stat(dev).st_rdev
            with open(f"/proc/{state['pid']}/status") as f:
                vmlck = [int(l.split()[1]) for l in f if l.startswith("VmLck:")]
            assert vmlck and vmlck[0] > 0, "the FUSE swap server must lock its memory"

            def stat():
                return json.loads(run([compcache_bin, "stat", "--json", "--control", state["control"]]).stdout)

            def recompressed():
                # The pages sit idle in swap now: the server's thread recompresses them.
                wait_for(lambda: stat()["recomp_pages"] > 1000, "the swap server to recompress idle pages", timeout=120)
                st = stat()
                print(f"recompressed {st['recompress_done']} pages, {st['recomp_pages']} now "
                      f"({st['recomp_dict_pages']} with a dictionary), CPU {st['recompress_cpu_ms']} ms")

            def went_cold():
                # The pages sit idle in swap now: the writeback thread moves them to the tier.
                wait_for(lambda: stat()["bd_count"] > 1000, "the swap server to move idle pages to its cold tier", timeout=120)
                st = stat()
                print(f"cold tier: {st['bd_count']} pages, {st['bd_mem_bytes']} bytes of RAM; "
                      f"mem_used_total {st['mem_used_total']}")
                assert 0 < st["bd_mem_bytes"] <= st["mem_used_total"] and st["bd_errors"] == 0, st

            filled = {"--recompress": recompressed, "--cold-tier": went_cold}.get(extra[0]) if extra else None
            swap_through_fuse(cg_parent, cg_version, "compcache-fuse-test", dev, stat, filled=filled)
            # `compcache list` finds the device by its control socket in /run/compcache, with
            # its front end and swap priority.
            listed = json.loads(run([compcache_bin, "list", "--json"]).stdout)
            assert listed["schema_version"] == 1, listed
            mine = [d for d in listed["devices"] if d["name"] == dev]
            assert len(mine) == 1, listed
            assert (mine[0]["frontend"], mine[0]["priority"], mine[0]["control"]) == ("fuse", 32767, state["control"]), mine
            assert mine[0]["disksize"] == 512 << 20, mine
            rows = run([compcache_bin, "list", "-o", "NAME,FRONTEND,PRIORITY", "--noheadings", "--raw"]).stdout.splitlines()
            assert f"{dev} fuse 32767" in rows, rows
        finally:
            if dev:
                p = run([compcache_bin, "swapoff", dev], check=False, timeout=600)
                print(p.stdout, p.stderr)
        assert p.returncode == 0, p.stderr
        assert dev not in open("/proc/swaps").read() and "zram-compcache" not in open("/proc/swaps").read()
        assert not os.path.exists("/dev/zram-compcache-" + os.path.basename(dev)), "the swap name was left behind"
        name = os.path.basename(dev)
        assert not os.path.exists(f"/sys/block/{name}/loop/backing_file"), "loop device left attached"
        assert not os.path.exists(f"/proc/{state['pid']}") or "compcache" not in open(f"/proc/{state['pid']}/cmdline").read()
        assert not mounted(f"/run/compcache/fuse-{state['pid']}")
