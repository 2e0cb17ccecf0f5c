"""What every experiment needs: the system layer, the ledger, progress, and factories for
swap configurations and cgroups that register everything they create."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

from .cgroup import MemoryCgroup
from .runner import Progress
from .swapconf import SwapConfig, make_config
from .system import Ledger, System


@dataclass
class Context:
    system: System
    ledger: Ledger
    progress: Progress
    workdir: str  # on the machine's disk: swap files, fio files, sockets
    repo_root: str
    configs: list  # configuration names selected for this run
    scan_bin: str
    compcache_bin: str | None = None
    cgroup_detected: tuple | None = None
    _counter: itertools.count = field(default_factory=itertools.count)

    def config(self, name: str, size_bytes: int) -> SwapConfig:
        return make_config(name, self.system, self.ledger, self.workdir, size_bytes, self.compcache_bin)

    def cgroup(self, limit_bytes: int, allow_swap: bool) -> MemoryCgroup:
        name = f"compcache-bench-{os.getpid()}-{next(self._counter)}"
        return MemoryCgroup(self.system, self.ledger, name, limit_bytes, allow_swap, detected=self.cgroup_detected)

    def verify_clean(self, what: str) -> list:
        """After each configuration's teardown: is anything of ours still there?"""
        left = self.ledger.leftovers(self.system)
        if left:
            self.progress(f"ERROR: after {what}, left behind: {', '.join(left)}")
        return left

    def run_config(self, tag: str, cfg: SwapConfig, res: dict, body) -> dict:
        """One configuration of an experiment, the same way in every experiment: skipped with
        the reason when it is unavailable (`res["skipped"]`); otherwise `body(res)`, whose
        failure is recorded (`res["error"]`) so that the experiment goes on with the next
        configuration; then the check that its teardown left nothing (`res["leftovers"]`).
        `tag` names the configuration in the log. Returns `res`."""
        why = cfg.unavailable()
        if why:
            self.log(f"{tag} skipped: {why}")
            res["skipped"] = why
            return res
        try:
            body(res)
        except Exception as e:  # record and go on with the next configuration
            res["error"] = f"{e.__class__.__name__}: {e}"
            self.log(f"{tag} FAILED: {res['error']}")
        left = self.verify_clean(tag)
        if left:
            res["leftovers"] = left
        return res

    def log(self, msg: str) -> None:
        self.progress(msg)
