"""The disks of the zcache experiment (seed 003): an origin block device, and four ways of
putting a filesystem on it, one class each, set up and torn down as context managers the way
bench/swapconf.py's configurations are (everything in the Ledger as soon as it exists;
teardown in reverse order, every step tried, errors collected).

The origin (the "disk" without any cache), in two variants:

  fast         the ext4 image file itself, on this machine's virtual disk (which the host
               caches: fast). What reached it is counted per process (/proc/PID/io of the
               server that reads it; the loop device's own counters for `direct`).
  SlowOrigin   the same image behind `nbdkit file` with a hard disk's figures imposed by
               nbdkit filters (one request at a time, a fixed delay per request, a rate
               limit), through nbdfuse and a loop device with direct I/O. Every
               configuration reads and writes that block device, so its /sys/block/loopN/stat
               counts what reached the "disk" in every configuration alike.

The four configurations over an origin (`device` is what ext4 is mounted from):

  direct           the origin itself (an image file on a loop device of our own with direct
                   I/O, `losetup --direct-io=on`): the baseline "without zcache"
  nbdkit-file      `nbdkit file ORIGIN cache=none fadvise=random` via nbdfuse + loop: the
                   transport, no cache
  nbdkit-cache     nbdkit's cache filter (uncompressed, cache file on a tmpfs of our own) in
                   front of the same `nbdkit file` server, via nbdfuse + loop
  compcache-cache  `compcache serve --origin ORIGIN --mem-limit BUDGET` via nbdfuse + loop
  compcache-cache-zstd  the same with `--algorithm zstd` (denser, slower to decompress: on a
                   slow disk, more of the file in the same budget may beat lz4's speed)
  compcache-fuse-cache  `compcache fuse --origin ORIGIN --mem-limit BUDGET`: the same cache
                   through compcache's own FUSE file, attached by the server to a loop device
                   (one userspace hop, where the nbdfuse chain has two)
"""

from __future__ import annotations

import os
import subprocess

from .swapconf import (CompcacheFuseSwap, NbdLoopSwap, SwapConfig, compcache_stats, compcache_unavailable,
                       recompression_as_asked, slow_disk_filters)
from .system import CommandError

CACHE_CONFIGS = ("direct", "nbdkit-file", "nbdkit-cache", "compcache-cache", "compcache-cache-zstd",
                 "compcache-fuse-cache")
LABELS = {"direct": "direct", "nbdkit-file": "nbdkit file", "nbdkit-cache": "nbdkit cache",
          "compcache-cache": "compcache cache", "compcache-cache-zstd": "compcache cache (zstd)",
          "compcache-fuse-cache": "compcache cache (FUSE)"}
# The configurations that are compcache's cache mode (their statistics are compcache's).
COMPCACHE_CACHES = ("compcache-cache", "compcache-cache-zstd", "compcache-fuse-cache")


def _loop_dio(system, loop: str) -> bool | None:
    try:
        return system.read(f"/sys/block/{os.path.basename(loop)}/loop/dio").strip() == "1"
    except OSError:
        return None


class SlowOrigin(NbdLoopSwap):
    """The image behind `nbdkit file` with a hard disk's figures imposed (slow_disk_filters),
    exposed as a block device through nbdfuse and a loop device with direct I/O."""

    label = "image behind nbdkit (HDD figures)"
    tools = ("losetup", "nbdfuse", "fusermount3", "nbdkit")

    def __init__(self, system, ledger, workdir, image: str, slow: dict, tag: str = "origin-slow"):
        super().__init__(system, ledger, workdir, 0)
        self.name = tag
        self.image = image
        self.slow = slow
        self.device: str | None = None

    def server_argv(self, socket):
        filters, args = slow_disk_filters(self.slow["seq_bytes_per_s"], self.slow["read_delay_ms"],
                                          self.slow["write_delay_ms"], self.slow["burstiness_s"])
        return ["nbdkit", "-f", "-U", socket, *filters, "file", self.image, "cache=none", *args]

    def setup(self) -> None:
        self._attach()
        self.device = self.loop
        self.info["device"] = self.device


class CacheDisk(SwapConfig):
    """A configuration over an origin block device: after setup, `self.device` carries ext4."""

    cache_name = "base"

    def __init__(self, system, ledger, workdir, origin: str, budget_bytes: int, tag: str):
        super().__init__(system, ledger, workdir, budget_bytes)
        self.origin = origin
        self.budget_bytes = budget_bytes
        self.name = tag
        self.device: str | None = None


def is_block_device(path: str) -> bool:
    return path.startswith("/dev/")


class DirectDisk(CacheDisk):
    """No cache: ext4 straight on the origin, an image file attached to a loop device of our
    own with direct I/O asked for (so the machine's page cache does not hold a second copy),
    or the origin's own block device."""

    cache_name = "direct"
    label = LABELS["direct"]
    tools = ("losetup",)

    def setup(self) -> None:
        if is_block_device(self.origin):
            self.device = self.origin
        else:
            self.device = self.system.run(["losetup", "--find", "--show", "--direct-io=on", self.origin]).strip()
            self.ledger.add("loops", self.device)
            self.info["loop_dio"] = _loop_dio(self.system, self.device)
        self.info["device"] = self.device

    def _teardown_steps(self):
        def detach():
            if self.device and self.device in self.ledger.loops:
                self.system.run(["losetup", "-d", self.device])
                self.ledger.drop("loops", self.device)

        return [detach]

    def origin_reader_pid(self) -> int | None:
        return None  # the origin is read by the loop device: its own counters tell


class _NbdCacheDisk(NbdLoopSwap):
    """An NBD server in front of the origin, via nbdfuse + loop (NbdLoopSwap's chain,
    without the swap)."""

    tools = ("losetup", "nbdfuse", "fusermount3")

    def __init__(self, system, ledger, workdir, origin: str, budget_bytes: int, tag: str):
        super().__init__(system, ledger, workdir, budget_bytes)
        self.origin = origin
        self.budget_bytes = budget_bytes
        self.name = tag
        self.device: str | None = None

    def setup(self) -> None:
        self._attach()
        self.device = self.loop
        self.info["device"] = self.device

    def origin_reader_pid(self) -> int | None:
        """The process whose reads and writes reach the origin."""
        srv = getattr(self, "server", None)
        return None if srv is None else srv.pid


def nbdkit_file_argv(socket: str, origin: str) -> list:
    # cache=none: nbdkit drops what it read or wrote from the machine's page cache, and
    # fadvise=random turns the kernel's readahead off for it, so that the page cache of the
    # origin does not become a second cache outside the configuration's budget: what nbdkit
    # reads is what its client asked for, as with compcache's O_DIRECT origin.
    return ["nbdkit", "-f", "-U", socket, "file", origin, "cache=none", "fadvise=random"]


class NbdkitFileDisk(_NbdCacheDisk):
    cache_name = "nbdkit-file"
    label = LABELS["nbdkit-file"]
    tools = _NbdCacheDisk.tools + ("nbdkit",)

    def server_argv(self, socket):
        return nbdkit_file_argv(socket, self.origin)


class NbdkitCacheDisk(_NbdCacheDisk):
    """nbdkit's cache filter, in its own server, in front of the same `nbdkit file` server
    as nbdkit-file (over a Unix socket: the cache filter owns the `cache=` key, so the file
    plugin's cache=none cannot be given in the same server).

    The filter keeps its cache in an unlinked temporary file in $TMPDIR (nbdkit-cache-filter(1),
    default /var/tmp). On a disk that file would live in the machine's page cache, outside
    any budget; here TMPDIR is a tmpfs of our own, so the cache is RAM, bounded by
    cache-max-size=BUDGET, and what it holds is the tmpfs's used size (`cache_file_bytes`).
    The tmpfs may hold twice the budget so that an overshoot shows in the figures instead
    of failing the filter's writes. cache=writethrough, like compcache's cache mode;
    cache-on-read=true, so reads fill it too; blocks of 64 KiB (the filter's default).

    The blocksize filter in front splits requests to one cache block (maxlen=64K): the cache
    filter reclaims two blocks per request once over its high threshold, so with the loop
    device's large requests (up to 1 MiB) it grew to 2-4x cache-max-size on this workload
    (measured: 300-430 MB of tmpfs for a 64 MiB maximum), and with one block per request it
    stays under it (55-63 MB)."""

    cache_name = "nbdkit-cache"
    block_bytes = 64 << 10
    label = LABELS["nbdkit-cache"]
    tools = _NbdCacheDisk.tools + ("nbdkit", "mount", "umount", "df")

    def server_argv(self, socket):
        return ["env", f"TMPDIR={self.tmpfs}", "nbdkit", "-f", "-U", socket, "--filter=blocksize", "--filter=cache",
                "nbd", f"socket={self.inner_socket}", f"maxlen={self.block_bytes}", "cache=writethrough",
                f"cache-max-size={self.budget_bytes}", "cache-on-read=true"]

    def setup(self) -> None:
        base = os.path.join(self.workdir, self.name)
        self.system.mkdir(base)
        self.tmpfs = os.path.join(base, "cache-tmpfs")
        self.system.mkdir(self.tmpfs)
        self.system.run(["mount", "-t", "tmpfs", "-o", f"size={2 * self.budget_bytes},mode=0700", "tmpfs",
                         self.tmpfs])
        self.ledger.add("mounts", self.tmpfs)
        self.inner_socket = os.path.join(base, "file.sock")
        self.inner_log = self.system.open_log(os.path.join(base, "file-server.log"))
        argv = nbdkit_file_argv(self.inner_socket, self.origin)
        self.inner = self.system.spawn(argv, stdout=self.inner_log, stderr=subprocess.STDOUT)
        self.ledger.add("pids", self.inner.pid)
        self.info["file_server_argv"] = argv
        self._wait_for(lambda: self.system.exists(self.inner_socket), f"nbdkit file socket {self.inner_socket}",
                       proc=self.inner)
        super().setup()
        self.info["cache_tmpfs"] = self.tmpfs

    def _teardown_steps(self):
        def stop_inner():
            self._stop(getattr(self, "inner", None))

        def unmount_tmpfs():
            t = getattr(self, "tmpfs", None)
            if t and t in self.ledger.mounts:
                self.system.run(["umount", t])
                self.ledger.drop("mounts", t)

        def close_inner_log():
            if getattr(self, "inner_log", None) is not None:
                self.inner_log.close()

        return super()._teardown_steps() + [stop_inner, unmount_tmpfs, close_inner_log]

    def origin_reader_pid(self) -> int | None:
        inner = getattr(self, "inner", None)
        return None if inner is None else inner.pid

    def stats(self) -> dict:
        t = getattr(self, "tmpfs", None)
        if not t or t not in self.ledger.mounts:
            return {}
        try:
            used = parse_df_used(self.system.run(["df", "-B1", "--output=used", t], timeout=10))
        except Exception:
            return {}
        out = {"cache_file_bytes": used}
        rss = self.server_rss_bytes()
        if rss is not None:
            out["server_rss_bytes"] = rss
        return out


def parse_df_used(text: str) -> int:
    """`df -B1 --output=used PATH` -> bytes used."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    if len(lines) < 2 or not lines[-1].isdigit():
        raise ValueError(f"unexpected df output: {text!r}")
    return int(lines[-1])


class CompcacheCacheDisk(_NbdCacheDisk):
    """compcache's cache mode: `compcache serve --origin ORIGIN --mem-limit BUDGET`."""

    cache_name = "compcache-cache"
    label = LABELS["compcache-cache"]

    def __init__(self, system, ledger, workdir, origin, budget_bytes, tag, binary: str | None):
        super().__init__(system, ledger, workdir, origin, budget_bytes, tag)
        self.binary = binary

    # The readahead window asked for where `serve` has --readahead (its default, made explicit
    # so that the results say what ran).
    readahead = "1M"
    # `--algorithm` (None: the default, lz4).
    algorithm: str | None = None

    def unavailable(self):
        return compcache_unavailable(self.system, self.binary, "serve", "--origin",
                                     "has no cache mode yet (its serve --help names no --origin)")

    def _has_readahead(self) -> bool:
        try:
            return "--readahead" in self.system.run([self.binary, "serve", "--help"], check=False, timeout=10)
        except Exception:
            return False

    def server_argv(self, socket):
        argv = [self.binary, "serve", "--origin", self.origin, "--mem-limit", str(self.budget_bytes),
                "--socket", socket, "--control", socket + ".ctl", *recompression_as_asked(())]
        if self._has_readahead():
            argv += ["--readahead", self.readahead]
        if self.algorithm:
            argv += ["--algorithm", self.algorithm]
        return argv

    def stats(self) -> dict:
        sock = getattr(self, "socket", None)
        if not sock or getattr(self, "server", None) is None or self.server.pid not in self.ledger.pids:
            return {}
        return compcache_stats(self.system, self.binary, sock + ".ctl", self.server_rss_bytes())


class CompcacheZstdCacheDisk(CompcacheCacheDisk):
    """compcache's cache mode with zstd: `compcache serve --origin ... --algorithm zstd`."""

    cache_name = "compcache-cache-zstd"
    label = LABELS["compcache-cache-zstd"]
    algorithm = "zstd"


class CompcacheFuseCacheDisk(CompcacheFuseSwap):
    """compcache's cache mode through its own FUSE front end: `compcache fuse --origin ORIGIN
    --mem-limit BUDGET`, the file attached by the server to a loop device with direct I/O (no
    nbdfuse, no NBD socket), and no swap on it. The server reads the origin itself, so its
    /proc/PID/io is what reached the origin, as for `compcache-cache`."""

    cache_name = "compcache-fuse-cache"
    label = LABELS["compcache-fuse-cache"]
    readahead = CompcacheCacheDisk.readahead

    def __init__(self, system, ledger, workdir, origin, budget_bytes, tag, binary: str | None):
        super().__init__(system, ledger, workdir, budget_bytes, binary)
        self.origin = origin
        self.budget_bytes = budget_bytes
        self.name = tag
        self.device: str | None = None

    def unavailable(self):
        why = super().unavailable()
        if why:
            return why
        return compcache_unavailable(self.system, self.binary, "fuse", "--origin",
                                     "has no cache mode in `fuse` (its fuse --help names no --origin)")

    def server_argv(self) -> list:
        # No --size: a cache has its origin's size. --reserve 0: `fuse` primes a swap reserve
        # by reading every page of the device (crates/cli/src/cmd/reserve.rs, `prime`), which in
        # cache mode reads the whole origin and fills the cache before the first test (measured:
        # origin_read_bytes = the image's size right after start); `serve`, the nbdfuse chain's
        # server, keeps no reserve. Without one both start with a cold cache.
        return [self.binary, "fuse", "--origin", self.origin, "--mem-limit", str(self.budget_bytes),
                "--readahead", self.readahead, "--reserve", "0", *recompression_as_asked(())]

    def setup(self) -> None:
        self._attach()
        self.device = self.loop
        self.info["device"] = self.device

    def origin_reader_pid(self) -> int | None:
        srv = getattr(self, "server", None)
        return None if srv is None else srv.pid


def make_disk(name: str, system, ledger, workdir: str, origin: str, budget_bytes: int, tag: str,
              compcache_bin: str | None = None) -> SwapConfig:
    if name == "direct":
        return DirectDisk(system, ledger, workdir, origin, budget_bytes, tag)
    if name == "nbdkit-file":
        return NbdkitFileDisk(system, ledger, workdir, origin, budget_bytes, tag)
    if name == "nbdkit-cache":
        return NbdkitCacheDisk(system, ledger, workdir, origin, budget_bytes, tag)
    if name == "compcache-cache":
        return CompcacheCacheDisk(system, ledger, workdir, origin, budget_bytes, tag, compcache_bin)
    if name == "compcache-cache-zstd":
        return CompcacheZstdCacheDisk(system, ledger, workdir, origin, budget_bytes, tag, compcache_bin)
    if name == "compcache-fuse-cache":
        return CompcacheFuseCacheDisk(system, ledger, workdir, origin, budget_bytes, tag, compcache_bin)
    raise ValueError(f"unknown cache configuration {name!r} (known: {', '.join(CACHE_CONFIGS)})")


class Ext4Mount:
    """ext4 on `device`, mounted at `mnt` (in the ledger) for the length of a `with`."""

    def __init__(self, system, ledger, device: str, mnt: str):
        self.system = system
        self.ledger = ledger
        self.device = device
        self.mnt = mnt

    def __enter__(self):
        self.system.mkdir(self.mnt)
        self.system.run(["mount", "-t", "ext4", self.device, self.mnt])
        self.ledger.add("mounts", self.mnt)
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def teardown(self) -> None:
        if self.mnt not in self.ledger.mounts:
            return
        try:
            self.system.run(["umount", self.mnt], timeout=600)
        except CommandError:
            # Busy for a moment after the cgroup's last process was killed: try once more,
            # then detach lazily (the device is torn down next, which needs it gone).
            self.system.sleep(1.0)
            try:
                self.system.run(["umount", self.mnt], timeout=600)
            except CommandError:
                self.system.run(["umount", "-l", self.mnt])
        self.ledger.drop("mounts", self.mnt)


def proc_io(system, pid: int | None) -> dict:
    """/proc/PID/io of a process as bytes it made storage read and write."""
    from .parse import parse_proc_io

    if pid is None:
        return {}
    try:
        io = parse_proc_io(system.read(f"/proc/{pid}/io"))
    except (OSError, ValueError):
        return {}
    return {"read_bytes": io.get("read_bytes", 0), "write_bytes": io.get("write_bytes", 0)}


def block_stat(system, device: str) -> dict:
    """/sys/block/DEV/stat of a block device as bytes read and written (and requests)."""
    from .parse import parse_block_stat

    try:
        st = parse_block_stat(system.read(f"/sys/block/{os.path.basename(device)}/stat"))
    except (OSError, ValueError, IndexError):
        return {}
    return {"read_bytes": st["read_sectors"] * 512, "write_bytes": st["write_sectors"] * 512,
            "reads": st["num_reads"], "writes": st["num_writes"]}


__all__ = ["CACHE_CONFIGS", "COMPCACHE_CACHES", "LABELS", "SlowOrigin", "is_block_device", "make_disk", "Ext4Mount",
           "block_stat", "proc_io", "parse_df_used", "slow_disk_filters"]
