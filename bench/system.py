"""The system layer: every file write, command and process the suite touches goes through here.

`System` is the real machine. Tests substitute `bench.tests.fakes.FakeSystem`, which records
calls and simulates sysfs, so the setup/teardown logic can be tested as non-root without
touching anything.

`Ledger` records what this run created (swap devices, loop devices, FUSE mounts, zram
devices, cgroups, processes, files) so that teardown touches only those and `leftovers()`
can prove afterwards that nothing of ours is left. Other engineers create zram devices,
loop devices and swap on the same machine at the same time: nothing that is not in the
ledger is ever removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field


class CommandError(RuntimeError):
    """A command exited non-zero; carries the command and its stderr."""

    def __init__(self, argv, returncode, stderr):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"{' '.join(map(str, argv))} exited {returncode}: {stderr.strip()[:500]}")


class System:
    """Real machine access. Methods are small so that fakes can stand in for each."""

    def read(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def write(self, path: str, value: str) -> None:
        with open(path, "w") as f:
            f.write(value)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mkdir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def remove(self, path: str) -> None:
        os.remove(path)

    def open_log(self, path: str):
        """A file to receive a server's output (kept in the run's work directory)."""
        return open(path, "w")

    def which(self, tool: str) -> str | None:
        return shutil.which(tool)

    def is_root(self) -> bool:
        return os.geteuid() == 0

    def run(self, argv, check: bool = True, timeout: float = 120) -> str:
        p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise CommandError(argv, p.returncode, p.stderr)
        return p.stdout

    def spawn(self, argv, stdout=None, stderr=None, stdin=None, new_session: bool = True):
        """Start a long-running process. Servers get their own session so that a Ctrl-C in
        the terminal reaches only the suite, which then tears down in order (swapoff
        while the server is still alive), instead of killing the server first."""
        return subprocess.Popen(
            [str(a) for a in argv],
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            start_new_session=new_session,
        )

    def pid_alive(self, pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie still answers kill(0); count it as gone.
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False

    def kill(self, pid: int, sig: int = signal.SIGTERM) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class Ledger:
    """What this run created, by kind. Teardown code removes entries as it undoes them."""

    swaps: list = field(default_factory=list)  # device or file paths given to swapon
    loops: list = field(default_factory=list)  # /dev/loopN
    mounts: list = field(default_factory=list)  # FUSE mount points
    zrams: list = field(default_factory=list)  # zram device ids (int)
    cgroups: list = field(default_factory=list)  # cgroup directories
    pids: list = field(default_factory=list)  # server and helper processes
    files: list = field(default_factory=list)  # swap files, sockets, fio files

    def add(self, kind: str, item) -> None:
        getattr(self, kind).append(item)

    def drop(self, kind: str, item) -> None:
        lst = getattr(self, kind)
        if item in lst:
            lst.remove(item)

    def leftovers(self, system: System) -> list[str]:
        """Checks the live system for anything of ours that is still there."""
        left = []
        try:
            from .parse import parse_proc_swaps

            active = {s["filename"] for s in parse_proc_swaps(system.read("/proc/swaps"))}
        except OSError:
            active = set()
        left += [f"swap {s}" for s in self.swaps if s in active]
        try:
            loops_out = system.run(["losetup", "--list", "--noheadings", "--output", "NAME"], check=False)
            live_loops = set(loops_out.split())
        except Exception:
            live_loops = set()
        left += [f"loop {d}" for d in self.loops if d in live_loops]
        try:
            mounts = system.read("/proc/self/mounts")
            live_mounts = {line.split()[1] for line in mounts.splitlines() if len(line.split()) > 1}
        except OSError:
            live_mounts = set()
        left += [f"mount {m}" for m in self.mounts if m in live_mounts]
        left += [f"zram{z}" for z in self.zrams if system.exists(f"/sys/block/zram{z}")]
        left += [f"cgroup {c}" for c in self.cgroups if system.exists(c)]
        left += [f"process {p}" for p in self.pids if system.pid_alive(p)]
        return left
