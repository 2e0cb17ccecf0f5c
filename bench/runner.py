"""Running one workload inside a cgroup: timing, OOM detection, progress, device sampling."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from .parse import compression_ratio


class Progress:
    """Per-step lines with the elapsed time of the whole run, flushed at once."""

    def __init__(self, stream=None, clock=time.monotonic):
        self.stream = stream or sys.stderr
        self.clock = clock
        self.t0 = clock()

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def __call__(self, msg: str) -> None:
        e = self.elapsed()
        self.stream.write(f"[{int(e) // 60:3d}:{e % 60:05.2f}] {msg}\n")
        self.stream.flush()


def stored_ratio(stats: dict) -> float | None:
    """The seed's ratio of a device's statistics, or None below 4 MiB stored, where the
    store's fixed overhead dominates."""
    return compression_ratio(stats) if (stats.get("orig_data_size") or 0) >= 4 << 20 else None


class Sampler:
    """Polls a configuration's device statistics and the cgroup's usage in the background
    and keeps the peaks, so a run that frees its swap on exit still reports what it used.
    The compression ratio is taken at the sample where the device held most data."""

    def __init__(self, config, cgroup=None, interval: float = 0.5):
        self.config = config
        self.cgroup = cgroup
        self.interval = interval
        self.peak: dict = {}
        self.at_peak_orig: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()
        return False

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        try:
            st = dict(self.config.stats())
            if self.cgroup is not None:
                st.update({f"cg_{k}": v for k, v in self.cgroup.usage().items()})
        except Exception:
            return
        for k, v in st.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if v > self.peak.get(k, float("-inf")):
                    self.peak[k] = v
        if st.get("orig_data_size", 0) >= self.at_peak_orig.get("orig_data_size", 0) and st.get("orig_data_size"):
            self.at_peak_orig = st

    def summary(self) -> dict:
        out = {f"peak_{k}": v for k, v in self.peak.items()}
        ratio = stored_ratio(self.at_peak_orig)
        if ratio is not None:
            out["compression_ratio"] = round(ratio, 3)
            out["ratio_sample"] = {k: self.at_peak_orig.get(k) for k in
                                   ("orig_data_size", "compr_data_size", "mem_used_total", "same_pages", "huge_pages")}
        return out


def run_workload(system, cgroup, argv: list, timeout: float) -> dict:
    """Runs argv inside the cgroup and waits. Returns wall time, exit status, output and
    whether the kernel's OOM killer struck (counted by the cgroup, not guessed from -9)."""
    before = cgroup.oom_kills()
    t0 = time.monotonic()
    proc = system.spawn(cgroup.wrap(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, new_session=False)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill()
        out, err = proc.communicate()
    wall = time.monotonic() - t0
    ooms = cgroup.oom_kills() - before
    status = "ok"
    if timed_out:
        status = "timeout"
    elif ooms > 0 or proc.returncode == -9:
        status = "oom"
    elif proc.returncode != 0:
        status = f"exit {proc.returncode}"
    return {
        "wall_s": round(wall, 4),
        "returncode": proc.returncode,
        "status": status,
        "oom_kills": ooms,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace")[-4000:],
    }
