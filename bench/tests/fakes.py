"""A fake of bench.system.System: an in-memory sysfs and command log, so that setup and
teardown logic can be tested as non-root without touching the machine."""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess

from bench.system import CommandError


class FakeProc:
    _pids = itertools.count(40000)

    def __init__(self, argv, on_start=None):
        self.argv = argv
        self.pid = next(self._pids)
        self.returncode = None
        if on_start:
            on_start(self)

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.returncode = 0
        return self.returncode

    def kill(self):
        self.returncode = -9

    def communicate(self, timeout=None):
        """Workloads: answer like scan does, or like bench/apps/sqlite_lookup.py."""
        self.returncode = 0
        if any(str(a).endswith("sqlite_lookup.py") for a in self.argv):
            return (b'{"build_s": 2.0, "lookup_s": 1.0, "lookups": 10, "rows": 100, "db_bytes": 4096, '
                    b'"majflt_build": 3, "majflt_lookup": 7, "rss_kib": 1024, "checksum": 1}\n', b"")
        return (b"scan mib=1 passes=1 mode=cyclic total_s=0.1 verify=off mismatches=0\n", b"")


class FakeSystem:
    """Files live in `self.files` (path -> str). Commands are logged in `self.commands` and
    answered by `self.answers` (first word -> str or callable). `fail` maps a first word
    (or 'write:PATH') to the number of the call that should fail (1 = first), or a set of them."""

    def __init__(self, root=True):
        self.root = root
        self.files: dict = {}
        self.dirs: set = set()
        self.commands: list = []
        self.writes: list = []
        self.procs: list = []
        self.fail: dict = {}
        self._calls: dict = {}
        self.tools = {"mkswap", "swapon", "swapoff", "losetup", "nbdfuse", "fusermount3", "nbdkit", "fio", "make",
                      "gcc", "fallocate", "chmod", "mount", "umount", "df", "mkfs.ext4", "truncate", "cp"}
        self.swaps: list = []
        self.loops: list = []
        self.mounts: list = []
        self.next_loop = 7
        self.loop_backing: dict = {}
        self.next_zram = 5
        # What `compcache serve --help` prints (a test may give it --origin).
        self.serve_help = "Usage: compcache serve --size SIZE --socket PATH"
        self.fuse_help = "Usage: compcache fuse --threads N --origin PATH"
        self.files["/dev/fuse"] = ""
        self.files["/sys/class/zram-control/hot_add"] = ""
        self.files["/sys/module/zswap/parameters/enabled"] = "N\n"
        self.files["/sys/module/fuse/parameters/enable_uring"] = "N\n"
        self.logs: dict = {}  # path -> StringIO of open_log
        self.files["/sys/module/zswap/parameters/compressor"] = "lzo\n"
        self.files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712\n"
        self.vmstat_reads = 0
        self.stat_reads = 0
        self.files["/proc/loadavg"] = "1.50 2.00 2.50 3/100 1234\n"
        self.files["/proc/sys/vm/page-cluster"] = "3\n"

    # helpers -------------------------------------------------------------------------
    def _maybe_fail(self, key):
        n = self._calls[key] = self._calls.get(key, 0) + 1
        f = self.fail.get(key)
        if f == n or (isinstance(f, (set, tuple, list)) and n in f):
            raise CommandError([key], 1, f"injected failure of {key}")

    # System interface ----------------------------------------------------------------
    def read(self, path):
        if path == "/sys/class/zram-control/hot_add":
            z = self.next_zram
            self.next_zram += 1
            base = f"/sys/block/zram{z}"
            self.dirs.add(base)
            self.files[f"{base}/comp_algorithm"] = "[lzo-rle] lzo lz4\n"
            self.files[f"{base}/mm_stat"] = "8388608 2097152 2359296 0 2359296 10 0 3 3\n"
            self.files[f"{base}/stat"] = "10 0 80 0 20 0 160 0 0 0 0 0 0 0 0 0 0\n"
            return f"{z}\n"
        if path == "/proc/vmstat":  # every read a little later: 5 more swap-ins, 9 more swap-outs
            self.vmstat_reads += 1
            n = self.vmstat_reads
            return f"pgmajfault {100 + 6 * n}\npswpin {10 + 5 * n}\npswpout {20 + 9 * n}\n"
        if path == "/proc/stat":  # every read 1.5 s of busy CPU later (150 ticks at USER_HZ 100)
            self.stat_reads += 1
            n = self.stat_reads
            return f"cpu {100 * n} 0 {50 * n} 9000 7 0 0 3 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
        if path == "/proc/swaps":
            return "Filename Type Size Used Priority\n" + "".join(f"{s} partition 1024 0 100\n" for s in self.swaps)
        if path == "/proc/self/mounts":
            return "".join(f"nbdfuse {m} fuse rw 0 0\n" for m in self.mounts)
        if path.startswith("/proc/") and path.endswith("/io") and path not in self.files:
            return "rchar: 10\nread_bytes: 8192\nwrite_bytes: 4096\n"
        if path in self.files:
            return self.files[path]
        if path in self.logs:
            return self.logs[path].getvalue()
        raise FileNotFoundError(path)

    def write(self, path, value):
        self._maybe_fail(f"write:{path}")
        self.writes.append((path, value))
        if path.endswith("/hot_remove"):
            self.dirs.discard(f"/sys/block/zram{value}")
        if path.endswith("/cgroup.procs"):
            return
        self.files[path] = value

    def exists(self, path):
        return path in self.files or path in self.dirs or any(f.startswith(path + "/") for f in self.files)

    def mkdir(self, path):
        self.dirs.add(path)
        if "/sys/fs/cgroup/" in path:
            self.files[f"{path}/cgroup.procs"] = ""
            self.files[f"{path}/memory.oom_control"] = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"
            self.files[f"{path}/memory.stat"] = "rss 100\ncache 50\nswap 7\n"
            self.files[f"{path}/memory.memsw.limit_in_bytes"] = ""

    def rmdir(self, path):
        self._maybe_fail(f"rmdir:{path}")
        self.dirs.discard(path)
        for f in [f for f in self.files if f.startswith(path + "/")]:
            del self.files[f]

    def remove(self, path):
        self.files.pop(path, None)

    def open_log(self, path):
        self.logs[path] = io.StringIO()
        return self.logs[path]

    def which(self, tool):
        return f"/usr/bin/{tool}" if tool in self.tools else None

    def is_root(self):
        return self.root

    def run(self, argv, check=True, timeout=120):
        argv = [str(a) for a in argv]
        self.commands.append(argv)
        self._maybe_fail(argv[0])
        cmd = argv[0]
        if cmd == "losetup" and "--find" in argv:
            dev = f"/dev/loop{self.next_loop}"
            self.next_loop += 1
            self.loops.append(dev)
            self.files[f"/sys/block/loop{dev[len('/dev/loop'):]}/loop/dio"] = "1\n"
            return dev + "\n"
        if cmd == "losetup" and argv[1] == "-d":
            self.loops.remove(argv[2])
        if cmd == "losetup" and "-j" in argv:
            f = argv[argv.index("-j") + 1]
            return "".join(f"{d}: [0045]:2 ({b})\n" for d, b in self.loop_backing.items() if b == f and d in self.loops)
        if cmd == "losetup" and "--list" in argv:
            return "\n".join(self.loops)
        if cmd == "swapon":
            self.swaps.append(argv[-1])
        if cmd == "swapoff":
            self.swaps.remove(argv[-1])
        if cmd == "fusermount3":
            m = argv[-1]
            if m in self.mounts:
                self.mounts.remove(m)
            self.files.pop(f"{m}/nbd", None)
        if cmd == "fallocate":
            self.files[argv[-1]] = ""
        if cmd == "mount":
            self.mounts.append(argv[-1])
        if cmd == "umount":
            self.mounts.remove(argv[-1])
        if cmd == "df":
            return "     Used\n 1048576\n"
        if argv[1:3] == ["serve", "--help"]:
            return self.serve_help
        if argv[1:3] == ["fuse", "--help"]:
            return self.fuse_help
        if argv[1:3] == ["swapon", "--help"]:
            return "Usage: compcache swapon [--frontend <auto|ublk|nbd|fuse>]"
        if argv[1:2] == ["swapon"]:  # compcache swapon --frontend fuse: a server, a loop device, swap
            dev = f"/dev/loop{self.next_loop}"
            self.next_loop += 1
            self.loops.append(dev)
            server = FakeProc([argv[0], "fuse", "--supervised"])
            self.procs.append(server)
            name = f"/dev/zram-compcache-{os.path.basename(dev)}"
            self.swaps.append(name)
            return json.dumps({"devices": [{"device": dev, "swap_name": name, "pid": server.pid, "frontend": "fuse",
                                            "control": f"/run/compcache/{os.path.basename(dev)}.ctl"}],
                               "stood_down": None})
        if argv[1:2] == ["swapoff"]:  # compcache swapoff DEV: swapoff, the server stops and takes its loop down
            dev = argv[-1]
            self.swaps.remove(f"/dev/zram-compcache-{os.path.basename(dev)}")
            self.loops.remove(dev)
            for p in self.procs:
                if p.argv[1:3] == ["fuse", "--supervised"] and p.returncode is None:
                    p.returncode = 0
            return '{"devices": []}'
        if argv[1:3] == ["stat", "--json"]:
            return '{"orig_data_size": 4096000, "mem_used_total": 1024000}'
        return ""

    def spawn(self, argv, stdout=None, stderr=None, stdin=None, new_session=True):
        argv = [str(a) for a in argv]
        self.commands.append(argv)
        self._maybe_fail(f"spawn:{os.path.basename(argv[0])}")

        def started(proc):
            if "-U" in argv:  # nbdkit
                self.files[argv[argv.index("-U") + 1]] = "socket"
            if "--socket" in argv:  # compcache
                self.files[argv[argv.index("--socket") + 1]] = "socket"
            if argv[1:2] == ["fuse"]:  # compcache fuse: its own mount and loop device
                dev = f"/dev/loop{self.next_loop}"
                self.next_loop += 1
                self.loops.append(dev)
                self.loop_backing[dev] = f"/run/compcache/fuse-{proc.pid}/device"
                self.files[self.loop_backing[dev]] = "file"
                self.files[f"/sys/block/{os.path.basename(dev)}/loop/dio"] = "1\n"
                # What the real server logs: io_uring only if asked for and offered.
                uring = "--io-uring" in argv and self.files["/sys/module/fuse/parameters/enable_uring"].strip() == "Y"
                if stdout is not None:
                    stdout.write("fuse transport: " + ("io_uring (2 queues x 32 entries)" if uring else "/dev/fuse") + "\n")
            if argv[0] == "nbdfuse":
                self.files[argv[1]] = "file"
                self.mounts.append(os.path.dirname(argv[1]))

        p = FakeProc(argv, started)
        self.procs.append(p)
        return p

    def pid_alive(self, pid):
        return any(p.pid == pid and p.returncode is None for p in self.procs)

    def kill(self, pid, sig=15):
        for p in self.procs:
            if p.pid == pid and p.returncode is None:
                p.returncode = -sig
                if p.argv[1:2] == ["fuse"] and sig == 15:  # it detaches its loop device and unmounts
                    for d, b in list(self.loop_backing.items()):
                        if b == f"/run/compcache/fuse-{pid}/device" and d in self.loops:
                            self.loops.remove(d)
                            self.files.pop(b, None)

    def sleep(self, seconds):
        pass

    def monotonic(self):
        return 0.0


__all__ = ["FakeSystem", "FakeProc", "subprocess"]
