"""A "machine with little RAM": a memory cgroup with a hard limit, v1 or v2.

The workload runs inside it; swap servers, nbdfuse and the suite itself stay outside (a
userspace server that serves swap must never wait for reclaim of the memory it is asked
to free). Note what follows from that, and report it: memory used by zram, nbdkit and
compcache to store swapped pages is not charged to the limit, while zswap's pool is
charged to the cgroup of the pages it holds.
"""

from __future__ import annotations

import os
import signal

from .parse import parse_flat_keyed
from .system import Ledger, System

V1_ROOT = "/sys/fs/cgroup/memory"
V2_CANDIDATES = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


def detect(system: System) -> tuple[str, str] | None:
    """Returns (version, root) of a usable memory controller, preferring v2 where it has
    the memory controller enabled for children, else v1."""
    for root in V2_CANDIDATES:
        ctl = os.path.join(root, "cgroup.subtree_control")
        if system.exists(ctl):
            try:
                if "memory" in system.read(ctl).split():
                    return "v2", root
            except OSError:
                pass
    if system.exists(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
        return "v1", V1_ROOT
    return None


class MemoryCgroup:
    """Context manager: creates the cgroup on enter, kills what is left in it and removes it
    on exit. `allow_swap=False` also forbids swap for the cgroup (memsw / swap.max), so that
    "no swap" holds even when someone else has swap enabled on the machine."""

    def __init__(self, system: System, ledger: Ledger, name: str, limit_bytes: int, allow_swap: bool,
                 swappiness: int | None = None, detected: tuple[str, str] | None = None):
        self.system = system
        self.ledger = ledger
        self.limit_bytes = limit_bytes
        self.allow_swap = allow_swap
        self.swappiness = swappiness
        found = detected or detect(system)
        if not found:
            raise RuntimeError("no memory cgroup controller found (need v1 at /sys/fs/cgroup/memory or v2 with memory enabled)")
        self.version, root = found
        self.path = os.path.join(root, name)
        self._oom_base = 0

    def _f(self, name: str) -> str:
        return os.path.join(self.path, name)

    def __enter__(self):
        self.setup()
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def setup(self) -> None:
        self.system.mkdir(self.path)
        self.ledger.add("cgroups", self.path)
        if self.version == "v1":
            self.system.write(self._f("memory.limit_in_bytes"), str(self.limit_bytes))
            memsw = self._f("memory.memsw.limit_in_bytes")
            if not self.allow_swap:
                if self.system.exists(memsw):
                    self.system.write(memsw, str(self.limit_bytes))
                else:
                    self.system.write(self._f("memory.swappiness"), "0")
            if self.swappiness is not None and self.allow_swap:
                self.system.write(self._f("memory.swappiness"), str(self.swappiness))
        else:
            self.system.write(self._f("memory.max"), str(self.limit_bytes))
            if self.system.exists(self._f("memory.swap.max")):
                self.system.write(self._f("memory.swap.max"), "max" if self.allow_swap else "0")
        self._oom_base = self.oom_kills()

    def procs_file(self) -> str:
        return self._f("cgroup.procs")

    def wrap(self, argv: list) -> list:
        """argv that enters this cgroup and then execs the command: the shell moves itself
        in before exec, so the command's first page is already charged to the cgroup."""
        return ["/bin/sh", "-c", f'echo $$ > {self.procs_file()} && exec "$@"', "sh", *map(str, argv)]

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.system.read(self.procs_file()).split()]
        except OSError:
            return []

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        try:
            return parse_flat_keyed(self.system.read(self._f(name))).get("oom_kill", 0)
        except OSError:
            return 0

    def oom_kills_since_setup(self) -> int:
        return self.oom_kills() - self._oom_base

    def memory_stat(self) -> dict:
        try:
            return parse_flat_keyed(self.system.read(self._f("memory.stat")))
        except OSError:
            return {}

    def usage(self) -> dict:
        """Current memory and swap use of the cgroup, in bytes."""
        st = self.memory_stat()
        if self.version == "v1":
            return {"anon_bytes": st.get("rss", 0), "file_bytes": st.get("cache", 0), "swap_bytes": st.get("swap", 0)}
        out = {"anon_bytes": st.get("anon", 0), "file_bytes": st.get("file", 0), "zswap_bytes": st.get("zswap", 0)}
        try:
            out["swap_bytes"] = int(self.system.read(self._f("memory.swap.current")))
        except (OSError, ValueError):
            out["swap_bytes"] = 0
        return out

    def teardown(self) -> None:
        if self.path not in self.ledger.cgroups:
            return
        # Everything inside is ours (we put it there). Kill it, then remove the group.
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                self.system.kill(pid, signal.SIGKILL)
            self.system.sleep(0.1)
        last_err = None
        for _ in range(50):
            try:
                self.system.rmdir(self.path)
                last_err = None
                break
            except FileNotFoundError:
                last_err = None
                break
            except OSError as e:  # EBUSY while the last task exits
                last_err = e
                self.system.sleep(0.1)
        if last_err is not None:
            raise RuntimeError(f"could not remove cgroup {self.path}: {last_err}")
        self.ledger.drop("cgroups", self.path)
