"""The swap configurations, one class each, set up and torn down as context managers.

Each class owns everything it creates and records it in the Ledger as it goes, so that
teardown undoes exactly what was done, in reverse order, even if setup failed half-way
(teardown runs from `__exit__` and from `SwapConfig.__enter__`'s failure path). Teardown
steps never stop at the first error: each is tried, errors are collected and raised at the
end, so one stuck step does not leave the rest behind.

  noswap        no swap; the cgroup may not swap at all
  disk          a swap file on the machine's disk
  disk-hdd      a swap file behind `nbdkit file` with the seed's hard disk imposed by nbdkit
                filters (SEED_HDD), via nbdfuse + loop device: disk swap as the seeds had it
                (this machine's virtual disk is cached by its host, and as fast as zram here)
  zram-lz4      kernel zram, lz4          (a device of our own from zram-control/hot_add)
  zram-lzo-rle  kernel zram, lzo-rle (the kernel default)
  zswap         zswap in front of the disk swap file
  nbdkit-zstd   nbdkit memory allocator=zstd, via nbdfuse + loop device
  compcache     compcache serve, via nbdfuse + loop device
  compcache-fuse  compcache fuse: its own FUSE file + loop device ("compcache (FUSE)")
  compcache-fuse-recompress  the same with --recompress on (idle after 10 s; docs/store.md)
  compcache-fuse-cold  the same with a cold tier as large as the device (--cold-tier; pages
                idle 30 s go there; docs/backing.md "The cold tier")
  compcache-fuse-uring  the same with --io-uring: FUSE over io_uring (Linux 6.14+); the
                module's enable_uring is Y only while the server starts, then as found
  compcache-swapon  `compcache swapon --frontend fuse`: what a user gets, swapon's defaults
                (recompression on); `compcache swapoff` takes it down
  compcache-swapon-ra0  the same with the kernel's swap readahead off (`vm.page-cluster` 0)
                while the device is up, then as found: what zram gets anyway (a synchronous
                device's swap-ins skip readahead), for random access (docs/swap.md)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

from .parse import parse_block_stat, parse_proc_status_kib, parse_zram_mm_stat
from .system import CommandError, Ledger, System

SWAP_PRIORITY = 100

# The seeds' hard disk: ~75 MB/s sequential, ~700 random 4 KiB reads/s (seed 003's iozone
# random read at 4 KiB records: 2770 KB/s). Used for the zcache experiment's slow origin and
# for `disk-hdd` swap.
# FUSE over io_uring is offered to new connections only while this is Y (Linux 6.14+).
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"

SEED_HDD = {"seq_bytes_per_s": 75e6, "read_delay_ms": 1.4, "write_delay_ms": 1.4, "burstiness_s": 0.1}


def slow_disk_filters(seq_bytes_per_s: float, read_delay_ms: float, write_delay_ms: float,
                      burstiness_s: float) -> tuple:
    """nbdkit filter flags and parameters that make a fast file look like a hard disk.

    - noparallel serialize=all-requests: one request at a time over all connections (one
      actuator; nbdfuse opens several connections),
    - delay: a fixed time per read and per write request (the seek and rotation),
    - rate: the sequential transfer rate (bits per second for nbdkit). Its token bucket
      refills while the delay sleeps, so a request costs about max(delay, bytes / rate):
      4 KiB random reads are bound by the delay (1.4 ms: ~700/s), large sequential ones by
      the rate."""
    return (["--filter=noparallel", "--filter=rate", "--filter=delay"],
            ["serialize=all-requests", f"rate={int(seq_bytes_per_s * 8)}", f"burstiness={burstiness_s:g}",
             f"rdelay={read_delay_ms:g}ms", f"wdelay={write_delay_ms:g}ms"])


class TeardownError(RuntimeError):
    pass


class SwapConfig:
    """One swap configuration. Subclasses implement _setup/_teardown_steps/stats."""

    name = "base"
    label = "base"
    allow_swap = True
    # Tools this configuration needs; the suite refuses to start without them.
    tools: tuple = ()

    def __init__(self, system: System, ledger: Ledger, workdir: str, size_bytes: int):
        self.system = system
        self.ledger = ledger
        self.workdir = workdir
        self.size_bytes = size_bytes
        self.info: dict = {}  # recorded in the results (device, dio, versions...)

    def server_rss_bytes(self) -> int | None:
        """Resident size of the configuration's userspace server (`self.server`), if it has one."""
        srv = getattr(self, "server", None)
        if srv is None:
            return None
        try:
            kib = parse_proc_status_kib(self.system.read(f"/proc/{srv.pid}/status"))
        except OSError:
            return None
        return None if kib is None else kib * 1024

    def unavailable(self) -> str | None:
        """Why this configuration cannot run on this machine, or None."""
        return None

    def __enter__(self):
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def setup(self) -> None:
        pass

    def teardown(self) -> None:
        errors = []
        for step in self._teardown_steps():
            try:
                step()
            except Exception as e:  # keep going: every later step still has to run
                errors.append(f"{getattr(step, '__name__', step)}: {e}")
        if errors:
            raise TeardownError(f"{self.name} teardown: " + "; ".join(errors))

    def _teardown_steps(self) -> list:
        return []

    def stats(self) -> dict:
        """Device statistics with zram's names where they exist."""
        return {}

    # Shared helpers -----------------------------------------------------------------
    def _swapon(self, dev: str, discard: str | None = None) -> None:
        self.system.run(["mkswap", dev])
        if discard:
            try:
                self.system.run(["swapon", f"--discard={discard}", "-p", str(SWAP_PRIORITY), dev])
                self.info["swap_discard"] = discard
                self.ledger.add("swaps", dev)
                return
            except CommandError:
                self.info["swap_discard"] = None  # the device cannot discard: swap without
        self.system.run(["swapon", "-p", str(SWAP_PRIORITY), dev])
        self.ledger.add("swaps", dev)

    def _swapoff(self, dev: str) -> None:
        if dev in self.ledger.swaps:
            self.system.run(["swapoff", dev], timeout=600)
            self.ledger.drop("swaps", dev)

    def _make_swapfile(self) -> None:
        """`self.path`: a new file of the device's size in the work directory, mode 0600."""
        self.path = os.path.join(self.workdir, f"{self.name}.swapfile")
        self.system.run(["fallocate", "-l", str(self.size_bytes), self.path])
        self.ledger.add("files", self.path)
        self.system.run(["chmod", "600", self.path])
        self.info["swapfile"] = self.path

    def _remove_file(self, path: str | None) -> None:
        """Removes `path` if this run made it (it is in the ledger)."""
        if path and path in self.ledger.files:
            if self.system.exists(path):
                self.system.remove(path)
            self.ledger.drop("files", path)


class NoSwap(SwapConfig):
    name = "noswap"
    label = "no swap"
    allow_swap = False


class DiskSwap(SwapConfig):
    name = "disk"
    label = "disk swap"
    tools = ("mkswap", "swapon", "swapoff", "fallocate")

    def setup(self) -> None:
        self._make_swapfile()
        self._swapon(self.path)

    def _teardown_steps(self):
        def swapoff():
            self._swapoff(getattr(self, "path", ""))

        def remove_file():
            self._remove_file(getattr(self, "path", None))

        return [swapoff, remove_file]


class ZramSwap(SwapConfig):
    tools = ("mkswap", "swapon", "swapoff")
    control = "/sys/class/zram-control"

    def __init__(self, system, ledger, workdir, size_bytes, algorithm: str):
        super().__init__(system, ledger, workdir, size_bytes)
        self.algorithm = algorithm
        self.name = f"zram-{algorithm}"
        self.label = f"zram {algorithm}"
        self.zram_id: int | None = None

    def unavailable(self):
        if not self.system.exists(f"{self.control}/hot_add"):
            return "kernel has no zram hot_add (/sys/class/zram-control)"
        return None

    def setup(self) -> None:
        self.zram_id = int(self.system.read(f"{self.control}/hot_add").strip())
        self.ledger.add("zrams", self.zram_id)
        base = f"/sys/block/zram{self.zram_id}"
        algs = self.system.read(f"{base}/comp_algorithm")
        if self.algorithm not in algs.replace("[", " ").replace("]", " ").split():
            raise RuntimeError(f"zram has no {self.algorithm} compressor (has: {algs.strip()})")
        self.system.write(f"{base}/comp_algorithm", self.algorithm)
        self.system.write(f"{base}/disksize", str(self.size_bytes))
        self.dev = f"/dev/zram{self.zram_id}"
        self.info.update({"device": self.dev, "comp_algorithm": self.algorithm})
        self._swapon(self.dev)

    def _teardown_steps(self):
        def swapoff():
            if self.zram_id is not None:
                self._swapoff(f"/dev/zram{self.zram_id}")

        def remove_device():
            if self.zram_id is None or self.zram_id not in self.ledger.zrams:
                return
            base = f"/sys/block/zram{self.zram_id}"
            if self.system.exists(base):
                self.system.write(f"{base}/reset", "1")
                self.system.write(f"{self.control}/hot_remove", str(self.zram_id))
            self.ledger.drop("zrams", self.zram_id)

        return [swapoff, remove_device]

    def stats(self) -> dict:
        if self.zram_id is None:
            return {}
        base = f"/sys/block/zram{self.zram_id}"
        try:
            out = parse_zram_mm_stat(self.system.read(f"{base}/mm_stat"))
            out.update(parse_block_stat(self.system.read(f"{base}/stat")))
            return out
        except OSError:
            return {}


class ZswapDisk(DiskSwap):
    name = "zswap"
    label = "zswap + disk"
    param_dir = "/sys/module/zswap/parameters"

    def unavailable(self):
        if not self.system.exists(f"{self.param_dir}/enabled"):
            return "kernel has no zswap (/sys/module/zswap/parameters/enabled)"
        return None

    def setup(self) -> None:
        self.saved_enabled = self.system.read(f"{self.param_dir}/enabled").strip()
        self.info["zswap_enabled_before"] = self.saved_enabled
        for p in ("compressor", "zpool", "max_pool_percent"):
            if self.system.exists(f"{self.param_dir}/{p}"):
                self.info[f"zswap_{p}"] = self.system.read(f"{self.param_dir}/{p}").strip()
        # Disk swap first, then zswap on: no page is stored before both exist.
        super().setup()
        self.system.write(f"{self.param_dir}/enabled", "Y")

    def _teardown_steps(self):
        steps = super()._teardown_steps()  # swapoff writes back/invalidates zswap's entries

        def restore_enabled():
            saved = getattr(self, "saved_enabled", None)
            if saved is not None:
                self.system.write(f"{self.param_dir}/enabled", saved)

        return steps + [restore_enabled]

    def stats(self) -> dict:
        d = "/sys/kernel/debug/zswap"
        out = {}
        try:
            if self.system.exists(f"{d}/pool_total_size"):
                out["mem_used_total"] = int(self.system.read(f"{d}/pool_total_size"))
                out["orig_data_size"] = int(self.system.read(f"{d}/stored_pages")) * 4096
        except (OSError, ValueError):
            pass
        return out


class NbdLoopSwap(SwapConfig):
    """An NBD server exposed to the kernel as nbdfuse file -> loop device -> swap.

    The host has no nbd.ko; nbdfuse turns the export into a file on a FUSE mount and the
    loop device turns that into a block device. Direct I/O on the loop device is asked
    for, so swapped pages are not cached a second time (and charged as page cache) on the
    FUSE file; whether the kernel granted it is recorded in info["loop_dio"]. Swap is
    enabled with --discard=pages, so freed slots reach the server as NBD trims."""

    tools = ("mkswap", "swapon", "swapoff", "losetup", "nbdfuse", "fusermount3")

    def server_argv(self, socket: str) -> list:
        raise NotImplementedError

    def setup(self) -> None:
        self._attach()
        # zram learns of every freed swap slot at once (swap_slot_free_notify); a loop device
        # only through discard. Without it, a userspace store keeps every page ever swapped
        # out, and its memory use and speed are not comparable with zram's.
        self._swapon(self.loop, discard="pages")

    def _attach(self) -> None:
        """The server, nbdfuse and the loop device (direct I/O): `self.loop` is the block
        device. Everything is in the ledger as soon as it exists."""
        base = os.path.join(self.workdir, self.name)
        self.system.mkdir(base)
        self.socket = os.path.join(base, "nbd.sock")
        self.mnt = os.path.join(base, "mnt")
        self.system.mkdir(self.mnt)
        self.server_log = self.system.open_log(os.path.join(base, "server.log"))
        self.server = self.system.spawn(self.server_argv(self.socket), stdout=self.server_log,
                                        stderr=subprocess.STDOUT)
        self.ledger.add("pids", self.server.pid)
        self.info["server_argv"] = self.server_argv(self.socket)
        self._wait_for(lambda: self.system.exists(self.socket), f"{self.name} server socket {self.socket}",
                       proc=self.server)
        self.fuse_log = self.system.open_log(os.path.join(base, "nbdfuse.log"))
        self.fuse = self.system.spawn(["nbdfuse", f"{self.mnt}/nbd", "--unix", self.socket],
                                      stdout=self.fuse_log, stderr=subprocess.STDOUT)
        self.ledger.add("pids", self.fuse.pid)
        self.ledger.add("mounts", self.mnt)
        self.file = f"{self.mnt}/nbd"
        self._wait_for(lambda: self.system.exists(self.file), f"nbdfuse file {self.file}", proc=self.fuse)
        try:
            self.loop = self.system.run(["losetup", "--find", "--show", "--direct-io=on", self.file]).strip()
            self.info["loop_dio_requested"] = True
        except CommandError:
            self.loop = self.system.run(["losetup", "--find", "--show", self.file]).strip()
            self.info["loop_dio_requested"] = False
        self.ledger.add("loops", self.loop)
        try:
            dio = self.system.read(f"/sys/block/{os.path.basename(self.loop)}/loop/dio").strip()
            self.info["loop_dio"] = dio == "1"
        except OSError:
            self.info["loop_dio"] = None
        self.info["loop_device"] = self.loop

    def _wait_for(self, cond, what: str, proc=None, timeout: float = 30.0) -> None:
        deadline = self.system.monotonic() + timeout
        while not cond():
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what}: process exited with {proc.returncode} before it was ready")
            if self.system.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
            self.system.sleep(0.05)

    def _stop(self, proc, timeout: float = 10.0) -> None:
        if proc is None or proc.pid not in self.ledger.pids:
            return
        if proc.poll() is None:
            self.system.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.system.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        self.ledger.drop("pids", proc.pid)

    def _teardown_steps(self):
        def swapoff():
            if getattr(self, "loop", None):
                self._swapoff(self.loop)

        def detach_loop():
            loop = getattr(self, "loop", None)
            if loop and loop in self.ledger.loops:
                self.system.run(["losetup", "-d", loop])
                self.ledger.drop("loops", loop)

        def unmount():
            mnt = getattr(self, "mnt", None)
            if mnt and mnt in self.ledger.mounts:
                try:
                    self.system.run(["fusermount3", "-u", mnt])
                except CommandError:
                    if self.system.exists(f"{mnt}/nbd"):  # still mounted: lazy unmount
                        self.system.run(["fusermount3", "-u", "-z", mnt])
                self.ledger.drop("mounts", mnt)

        def stop_fuse():
            self._stop(getattr(self, "fuse", None))

        def stop_server():
            self._stop(getattr(self, "server", None))

        def close_logs():
            for f in (getattr(self, "server_log", None), getattr(self, "fuse_log", None)):
                if f is not None:
                    f.close()

        return [swapoff, detach_loop, unmount, stop_fuse, stop_server, close_logs]


class DiskHddSwap(NbdLoopSwap):
    """Disk swap with the seeds' hard disk: a swap file on this machine's disk served by
    `nbdkit file` (cache=none) behind slow_disk_filters(SEED_HDD), via nbdfuse and a loop
    device with direct I/O. The chain's own cost (tens of microseconds a request) is small
    beside the 1.4 ms every request waits. No discard, as `disk`."""

    name = "disk-hdd"
    label = "disk swap (HDD figures)"
    tools = NbdLoopSwap.tools + ("nbdkit", "fallocate")

    def server_argv(self, socket):
        filters, args = slow_disk_filters(**SEED_HDD)
        # --swap: nbdkit mlockall()s itself, as a server the kernel swaps to must.
        return ["nbdkit", "--swap", "-f", "-U", socket, *filters, "file", self.path, "cache=none", *args]

    def setup(self) -> None:
        self._make_swapfile()
        self.info["hdd"] = dict(SEED_HDD)
        self._attach()
        self._swapon(self.loop)

    def _teardown_steps(self):
        def remove_file():
            self._remove_file(getattr(self, "path", None))

        return super()._teardown_steps() + [remove_file]


class NbdkitSwap(NbdLoopSwap):
    name = "nbdkit-zstd"
    label = "nbdkit zstd"
    tools = NbdLoopSwap.tools + ("nbdkit",)

    def server_argv(self, socket):
        # --swap: nbdkit mlockall()s itself, the documented way to serve swap; the zstd
        # allocator has no mlock=true of its own (only allocator=malloc has).
        return ["nbdkit", "--swap", "-f", "-U", socket, "memory", str(self.size_bytes), "allocator=zstd"]

    def stats(self) -> dict:
        rss = self.server_rss_bytes()
        # nbdkit reports no store statistics; its resident size is what storing costs.
        return {} if rss is None else {"server_rss_bytes": rss, "mem_used_total": rss}


def find_compcache(repo_root: str) -> str | None:
    env = os.environ.get("COMPCACHE_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    for sub in ("target/release/compcache", "target/debug/compcache"):
        p = os.path.join(repo_root, sub)
        if os.access(p, os.X_OK):
            return p
    return None


def compcache_unavailable(system, binary: str | None, subcommand: str, marker: str, missing: str) -> str | None:
    """Why `binary SUBCOMMAND` cannot be used, or None: its --help must name `marker`."""
    if not binary:
        return "compcache binary not found: build with cargo build --release -p compcache"
    try:
        usage = system.run([binary, subcommand, "--help"], check=False, timeout=10)
    except Exception as e:
        return f"compcache binary {binary} does not run: {e}"
    if marker not in usage:
        return f"compcache binary {binary} {missing}"
    return None


def recompress_flag(args) -> str | None:
    """The value `args` give `--recompress` (`--recompress X` or `--recompress=X`), or None."""
    a = [str(x) for x in args]
    for i, x in enumerate(a):
        if x.startswith("--recompress="):
            return x.split("=", 1)[1]
        if x == "--recompress":
            return a[i + 1] if i + 1 < len(a) else ""
    return None


def recompression_as_asked(extra_args) -> list:
    """`--recompress off` unless `extra_args` say something about recompression. compcache
    recompresses by default (docs/store.md, "On by default"); the suite's compcache
    configurations measure the store's codec alone ("compcache lz4" against "zram lz4"), except
    the ones that ask for recompression."""
    return [] if recompress_flag(extra_args) is not None else ["--recompress", "off"]


def compcache_stats(system, binary: str, control: str, rss_bytes: int | None) -> dict:
    """`compcache stat --json` of the server on `control`, plus its RSS if known."""
    try:
        out = json.loads(system.run([binary, "stat", "--json", "--control", control], timeout=10))
    except Exception:
        out = {}
    if rss_bytes is not None:
        out["server_rss_bytes"] = rss_bytes
    return out


class CompcacheSwap(NbdLoopSwap):
    name = "compcache"
    label = "compcache"

    def __init__(self, system, ledger, workdir, size_bytes, binary: str | None, algorithm: str = "lz4",
                 extra_args: tuple = ()):
        super().__init__(system, ledger, workdir, size_bytes)
        self.binary = binary
        self.algorithm = algorithm
        self.extra_args = list(extra_args)

    def unavailable(self):
        return compcache_unavailable(self.system, self.binary, "serve", "--socket",
                                     "has no working `serve` yet (its serve --help names no --socket)")

    def server_argv(self, socket):
        return [self.binary, "serve", "--size", str(self.size_bytes), "--socket", socket,
                "--control", socket + ".ctl", "--algorithm", self.algorithm, "--mlock",
                *recompression_as_asked(self.extra_args), *self.extra_args]

    def stats(self) -> dict:
        sock = getattr(self, "socket", None)
        if not sock:
            return {}
        return compcache_stats(self.system, self.binary, sock + ".ctl", self.server_rss_bytes())


class CompcacheFuseSwap(SwapConfig):
    """`compcache fuse`: the store as a file on compcache's own FUSE mount, attached by the
    server to a loop device (direct I/O, 4 KiB sectors), swap with --discard=pages. One
    userspace hop, where the nbdfuse chain has two. The server detaches the loop device and
    unmounts when it is stopped (after swapoff)."""

    name = "compcache-fuse"
    label = "compcache (FUSE)"
    tools = ("mkswap", "swapon", "swapoff", "losetup")

    def __init__(self, system, ledger, workdir, size_bytes, binary: str | None, algorithm: str = "lz4",
                 extra_args: tuple = ()):
        super().__init__(system, ledger, workdir, size_bytes)
        self.binary = binary
        self.algorithm = algorithm
        self.extra_args = list(extra_args)

    def unavailable(self):
        if self.binary and not self.system.exists("/dev/fuse"):
            return "no /dev/fuse"
        return compcache_unavailable(self.system, self.binary, "fuse", "--threads", "has no `fuse` subcommand")

    def server_argv(self) -> list:
        return [self.binary, "fuse", "--size", str(self.size_bytes), "--algorithm", self.algorithm,
                *recompression_as_asked(self.extra_args), *self.extra_args]

    def setup(self) -> None:
        self._attach()
        self._swapon(self.loop, discard="pages")

    def _attach(self) -> None:
        """The server, which mounts its file and attaches it to a loop device: `self.loop`."""
        base = os.path.join(self.workdir, self.name)
        self.system.mkdir(base)
        self.log_path = os.path.join(base, "server.log")
        self.server_log = self.system.open_log(self.log_path)
        argv = self.server_argv()
        self.info["server_argv"] = argv
        self.server = self.system.spawn(argv, stdout=self.server_log, stderr=subprocess.STDOUT)
        self.ledger.add("pids", self.server.pid)
        # The server mounts /run/compcache/fuse-<pid>/device and attaches it to a loop device.
        file = f"/run/compcache/fuse-{self.server.pid}/device"
        deadline = self.system.monotonic() + 120
        self.loop = None
        while self.loop is None:
            out = self.system.run(["losetup", "-j", file], check=False) if self.system.exists(file) else ""
            if out.strip():
                self.loop = out.split(":")[0]
            else:
                if self.server.poll() is not None:
                    raise RuntimeError(f"compcache fuse exited {self.server.returncode}: {self.system.read(self.log_path)[-2000:]}")
                if self.system.monotonic() > deadline:
                    raise RuntimeError("timed out waiting for compcache fuse")
                self.system.sleep(0.05)
        try:
            self.info["loop_dio"] = self.system.read(f"/sys/block/{os.path.basename(self.loop)}/loop/dio").strip() == "1"
        except OSError:
            self.info["loop_dio"] = None
        self.info["loop_device"] = self.loop

    def _teardown_steps(self):
        def swapoff():
            if getattr(self, "loop", None):
                self._swapoff(self.loop)

        def stop_server():
            # SIGTERM: the server detaches its loop device, unmounts and exits.
            proc = getattr(self, "server", None)
            if proc is None or proc.pid not in self.ledger.pids:
                return
            if proc.poll() is None:
                self.system.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.system.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
                    raise RuntimeError("compcache fuse did not exit on SIGTERM; killed (its loop device and mount may remain)")
            self.ledger.drop("pids", proc.pid)

        def close_log():
            if getattr(self, "server_log", None) is not None:
                self.server_log.close()

        return [swapoff, stop_server, close_log]

    def stats(self) -> dict:
        loop = getattr(self, "loop", None)
        if not loop:
            return {}
        return compcache_stats(self.system, self.binary, f"/run/compcache/{os.path.basename(loop)}.ctl", self.server_rss_bytes())


class CompcacheFuseRecompressSwap(CompcacheFuseSwap):
    """`compcache fuse --recompress on`: background recompression of pages idle for 10 s
    (zstd level 9 and a trained dictionary, docs/store.md "Recompression")."""

    name = "compcache-fuse-recompress"
    label = "compcache (FUSE, recompress)"

    def __init__(self, system, ledger, workdir, size_bytes, binary: str | None):
        super().__init__(system, ledger, workdir, size_bytes, binary,
                         extra_args=("--recompress", "on", "--recompress-idle", "10"))


class CompcacheFuseColdSwap(CompcacheFuseSwap):
    """`compcache fuse --recompress on --cold-tier SIZE`: recompression of pages idle for 10 s
    and, for pages idle 30 s, the cold tier (RAM compressed 64 KiB at a time with zstd 19 and
    a dictionary, docs/backing.md "The cold tier"), with room for the whole device."""

    name = "compcache-fuse-cold"
    label = "compcache (FUSE, cold tier)"

    def __init__(self, system, ledger, workdir, size_bytes, binary: str | None):
        # The tier counts whole MiB (its segments); at least 4 MiB.
        tier_mib = max(4, size_bytes >> 20)
        super().__init__(system, ledger, workdir, size_bytes, binary,
                         extra_args=("--recompress", "on", "--recompress-idle", "10",
                                     "--cold-tier", f"{tier_mib}M", "--cold-idle", "30"))


class CompcacheFuseUringSwap(CompcacheFuseSwap):
    """`compcache fuse --io-uring`: requests through FUSE over io_uring. The fuse module's
    `enable_uring` is set to Y while the server mounts (a connection keeps io_uring once it
    negotiated it) and put back as found; the server's log must say it serves through
    io_uring, else setup fails (a silent fallback would measure the classic protocol twice)."""

    name = "compcache-fuse-uring"
    label = "compcache (FUSE, io_uring)"

    def __init__(self, system, ledger, workdir, size_bytes, binary: str | None):
        super().__init__(system, ledger, workdir, size_bytes, binary, extra_args=("--io-uring",))

    def unavailable(self):
        if self.binary and not self.system.exists(ENABLE_URING):
            return "this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)"
        return super().unavailable()

    def setup(self) -> None:
        found = self.system.read(ENABLE_URING).strip()
        self.system.write(ENABLE_URING, "Y")
        try:
            super().setup()
        finally:
            self.system.write(ENABLE_URING, found)
        deadline = self.system.monotonic() + 30
        while "fuse transport:" not in (log := self.system.read(self.log_path)):
            if self.system.monotonic() > deadline:
                raise RuntimeError(f"compcache fuse never said which transport it uses; see {self.log_path}")
            self.system.sleep(0.05)
        if "fuse transport: io_uring" not in log:
            raise RuntimeError(f"compcache fuse --io-uring is not serving through io_uring; see {self.log_path}")
        self.info["transport"] = "io_uring"

class CompcacheSwaponSwap(SwapConfig):
    """`compcache swapon --frontend fuse --no-config --size SIZE`: the device a user gets, with
    swapon's defaults (recompression on, discard, a reserve, supervised: docs/swap.md), not the
    suite's `--recompress off`. swapon starts the server, which attaches its loop device, and
    runs mkswap and swapon itself; `compcache swapoff DEV` takes it out of swap and stops the
    server, which detaches its loop device and unmounts."""

    name = "compcache-swapon"
    label = "compcache swapon (FUSE, defaults)"
    tools = ("mkswap", "swapon", "swapoff", "losetup")

    def __init__(self, system, ledger, workdir, size_bytes, binary: str | None):
        super().__init__(system, ledger, workdir, size_bytes)
        self.binary = binary
        self.dev: str | None = None

    def unavailable(self):
        if self.binary and not self.system.exists("/dev/fuse"):
            return "no /dev/fuse"
        return compcache_unavailable(self.system, self.binary, "swapon", "--frontend",
                                     "has no `swapon --frontend`")

    def setup(self) -> None:
        argv = [self.binary, "swapon", "--frontend", "fuse", "--no-config", "--size", str(self.size_bytes),
                "--priority", str(SWAP_PRIORITY), "--json"]
        self.info["swapon_argv"] = argv
        devices = json.loads(self.system.run(argv, timeout=300))["devices"]
        if len(devices) != 1 or not devices[0].get("device"):
            raise RuntimeError(f"compcache swapon set up {devices!r}, not one device")
        d = devices[0]
        # In the ledger at once, so that leftovers() would name what swapoff did not take down.
        self.dev = d["device"]
        self.ledger.add("loops", self.dev)
        self.swap_name = d.get("swap_name") or self.dev
        self.ledger.add("swaps", self.swap_name)
        self.pid = d.get("pid")
        if self.pid:
            self.ledger.add("pids", self.pid)
        self.control = d.get("control")
        self.info.update({"loop_device": self.dev, "swap_name": self.swap_name, "control": self.control,
                          "server_pid": self.pid, "log": d.get("log")})

    def _teardown_steps(self):
        def swapoff():
            if self.dev is None:
                return
            self.system.run([self.binary, "swapoff", "--json", self.dev], timeout=600)
            self.ledger.drop("swaps", self.swap_name)

        def server_gone():
            # swapoff stops the server; it detaches its loop device and unmounts on the way out.
            if self.dev is None:
                return
            deadline = self.system.monotonic() + 60
            while self.pid and self.system.pid_alive(self.pid):
                if self.system.monotonic() > deadline:
                    raise RuntimeError(f"compcache server {self.pid} still running after swapoff")
                self.system.sleep(0.1)
            self.ledger.drop("pids", self.pid)
            self.ledger.drop("loops", self.dev)

        return [swapoff, server_gone]

    def server_rss_bytes(self) -> int | None:
        if not getattr(self, "pid", None):
            return None
        try:
            kib = parse_proc_status_kib(self.system.read(f"/proc/{self.pid}/status"))
        except OSError:
            return None
        return None if kib is None else kib * 1024

    def stats(self) -> dict:
        if not getattr(self, "control", None):
            return {}
        return compcache_stats(self.system, self.binary, self.control, self.server_rss_bytes())


class CompcacheSwaponNoReadahead(CompcacheSwaponSwap):
    """`compcache-swapon` with `vm.page-cluster` 0 while it is up (machine-wide: the suite
    holds the host-swap lock, and only this device swaps). Kernel zram is a synchronous device
    (`SWP_SYNCHRONOUS_IO`), whose swap-ins skip the swap cache and readahead; through a loop
    device every swap-in reads up to 2^page-cluster pages around it, which a program touching
    its memory at random mostly does not use. Set before the device is swap, written back
    after it is gone, also when setup fails half-way."""

    name = "compcache-swapon-ra0"
    label = "compcache swapon (FUSE, defaults, page-cluster 0)"
    page_cluster = "/proc/sys/vm/page-cluster"

    def setup(self) -> None:
        self.saved_page_cluster = self.system.read(self.page_cluster).strip()
        self.info["page_cluster_before"] = self.saved_page_cluster
        self.system.write(self.page_cluster, "0")
        super().setup()

    def _teardown_steps(self):
        def restore_page_cluster():
            saved = getattr(self, "saved_page_cluster", None)
            if saved is not None:
                self.system.write(self.page_cluster, saved)

        return super()._teardown_steps() + [restore_page_cluster]


ALL_CONFIGS = ("noswap", "disk", "disk-hdd", "zram-lz4", "zram-lzo-rle", "zswap", "nbdkit-zstd", "compcache",
               "compcache-fuse", "compcache-fuse-recompress", "compcache-fuse-cold", "compcache-fuse-uring",
               "compcache-swapon", "compcache-swapon-ra0")


def make_config(name: str, system: System, ledger: Ledger, workdir: str, size_bytes: int,
                compcache_bin: str | None = None) -> SwapConfig:
    if name == "noswap":
        return NoSwap(system, ledger, workdir, size_bytes)
    if name == "disk":
        return DiskSwap(system, ledger, workdir, size_bytes)
    if name == "disk-hdd":
        return DiskHddSwap(system, ledger, workdir, size_bytes)
    if name.startswith("zram-"):
        return ZramSwap(system, ledger, workdir, size_bytes, name[len("zram-"):])
    if name == "zswap":
        return ZswapDisk(system, ledger, workdir, size_bytes)
    if name == "nbdkit-zstd":
        return NbdkitSwap(system, ledger, workdir, size_bytes)
    if name == "compcache":
        return CompcacheSwap(system, ledger, workdir, size_bytes, compcache_bin)
    if name == "compcache-fuse":
        return CompcacheFuseSwap(system, ledger, workdir, size_bytes, compcache_bin)
    if name == "compcache-fuse-recompress":
        return CompcacheFuseRecompressSwap(system, ledger, workdir, size_bytes, compcache_bin)
    if name == "compcache-fuse-cold":
        return CompcacheFuseColdSwap(system, ledger, workdir, size_bytes, compcache_bin)
    if name == "compcache-fuse-uring":
        return CompcacheFuseUringSwap(system, ledger, workdir, size_bytes, compcache_bin)
    if name == "compcache-swapon":
        return CompcacheSwaponSwap(system, ledger, workdir, size_bytes, compcache_bin)
    if name == "compcache-swapon-ra0":
        return CompcacheSwaponNoReadahead(system, ledger, workdir, size_bytes, compcache_bin)
    raise ValueError(f"unknown configuration {name!r} (known: {', '.join(ALL_CONFIGS)})")
