#!/usr/bin/env python3
"""Swap-out under a fast allocator: how often the memory cgroup's OOM killer strikes when the
swap device completes its writes late. GNU sort with a 600 MiB buffer over 160 MiB of text,
in a 192 MiB memory cgroup (cgroup v1), swapping to `compcache swapon --frontend fuse` (the
defaults a user gets) or to a kernel zram device of our own (lz4), alternating, N rounds.

Per run: the time, whether sort was OOM-killed (memory.oom_control's oom_kill grew, or sort
died of SIGKILL), memory.failcnt, and the most pages under writeback seen (the cgroup's
memory.stat `writeback`, sampled every 20 ms): a page being swapped out is freed only when
the device completes its write, and zram completes it inside the reclaimer.

Holds the host-swap lock (/run/lock/compcache-host-swap.lock, the tests' and the soak's) for
the whole run. Everything it sets up is torn down by it, also on failure: the swap areas
(swapoff), the compcache server (`compcache swapoff`), the zram device (reset, hot_remove),
the cgroup, the text file.

Usage: sudo python3 bench/device/sort_oom.py [--rounds 5] [--bin target/release/compcache]
           [--text-mib 160] [--limit-mib 192] [--buffer 600M]
"""
import argparse
import contextlib
import fcntl
import json
import os
import random
import signal
import subprocess
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from bench.device.fio_loop import ZramTarget  # noqa: E402
LOCK = "/run/lock/compcache-host-swap.lock"
CG_ROOT = "/sys/fs/cgroup/memory"


def sh(cmd, check=True, timeout=600):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}: {p.stderr.strip()}")
    return p


def make_text(path, mib, seed=30):
    """`mib` MiB of lines of words (a vocabulary of 20000 made-up words, Zipf-like use)."""
    rnd = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    vocab = ["".join(rnd.choice(letters[:rnd.randint(6, 26)]) for _ in range(rnd.randint(2, 12))) for _ in range(20000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    with open(path, "w") as f:
        written = 0
        while written < mib << 20:
            words = rnd.choices(vocab, weights, k=4096)
            chunk = "\n".join(" ".join(words[i:i + rnd.randint(4, 14)]) for i in range(0, 4096, 9)) + "\n"
            f.write(chunk)
            written += len(chunk)


class Zram(ZramTarget):
    """fio_loop's zram device of our own (hot_add, lz4; reset and hot_remove), as swap."""
    name = "zram lz4"

    def __init__(self, size):
        super().__init__(size)
        self.dev, self.on = None, False

    def start(self):
        super().start()
        sh(["mkswap", self.dev])
        sh(["swapon", "-p", "32767", self.dev])
        self.on = True

    def stop(self):
        if self.on:
            sh(["swapoff", self.dev], check=False)
        super().stop()


class Compcache:
    name = "compcache swapon (fuse)"

    def __init__(self, binary, size):
        self.binary, self.size, self.dev = binary, size, None

    def start(self):
        before = set(self.devices())
        p = sh([self.binary, "swapon", "--frontend", "fuse", "--no-config", "--size", str(self.size),
                "--priority", "32767"], check=False, timeout=180)
        new = set(self.devices()) - before
        self.dev = new.pop() if new else None
        if p.returncode != 0 or self.dev is None:
            raise RuntimeError(f"compcache swapon failed: {p.stderr.strip()}")

    @staticmethod
    def devices():
        d = "/run/compcache/swap"
        return [n[:-5] for n in os.listdir(d) if n.endswith(".json") and not n.endswith(".stats.json")] \
            if os.path.isdir(d) else []

    def stop(self):
        if self.dev:
            dev = json.load(open(f"/run/compcache/swap/{self.dev}.json"))["device"] \
                if os.path.exists(f"/run/compcache/swap/{self.dev}.json") else None
            if dev:
                sh([self.binary, "swapoff", dev], check=False)


def cg_read(cg, name):
    with open(os.path.join(cg, name)) as f:
        return f.read()


def run_sort(text, limit_mib, buffer):
    """sort in a fresh memory cgroup; its figures."""
    cg = os.path.join(CG_ROOT, f"sort-oom-{os.getpid()}")
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit_mib << 20))
        peak_wb = [0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                with contextlib.suppress(OSError):
                    for line in cg_read(cg, "memory.stat").splitlines():
                        if line.startswith("writeback "):
                            peak_wb[0] = max(peak_wb[0], int(line.split()[1]) >> 12)
                time.sleep(0.02)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        tasks = os.path.join(cg, "cgroup.procs")
        t0 = time.monotonic()
        p = subprocess.run(["sort", "-S", buffer, "-T", tempfile.gettempdir(), text], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=dict(os.environ, LC_ALL="C"),
                           preexec_fn=lambda: open(tasks, "w").write(str(os.getpid())))
        elapsed = time.monotonic() - t0
        done.set()
        th.join()
        oom = {k: int(v) for k, v in (line.split() for line in cg_read(cg, "memory.oom_control").splitlines())}
        return {"seconds": elapsed, "rc": p.returncode, "oom_kill": oom.get("oom_kill", 0),
                "killed": p.returncode == -signal.SIGKILL or oom.get("oom_kill", 0) > 0,
                "failcnt": int(cg_read(cg, "memory.failcnt")), "peak_writeback_pages": peak_wb[0],
                "max_usage_mib": int(cg_read(cg, "memory.memsw.max_usage_in_bytes") if os.path.exists(
                    os.path.join(cg, "memory.memsw.max_usage_in_bytes")) else 0) >> 20}
    finally:
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)


def summary(runs: dict) -> list:
    """The table's lines: per device, its runs, OOM kills and the medians (of the runs that
    completed, for the time; the mean of the middle two for an even count)."""
    lines = ["| device | runs | OOM-killed | median s (completed runs) | median failcnt | median peak writeback pages |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, rs in runs.items():
        ok = [r["seconds"] for r in rs if not r["killed"]]
        med = statistics.median(ok) if ok else float("nan")
        fc = statistics.median(r["failcnt"] for r in rs)
        wb = statistics.median(r["peak_writeback_pages"] for r in rs)
        lines.append(f"| {name} | {len(rs)} | {sum(r['killed'] for r in rs)} | {med:.1f} | {fc:.0f} | {wb:.0f} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "compcache"))
    ap.add_argument("--text-mib", type=int, default=160)
    ap.add_argument("--limit-mib", type=int, default=192)
    ap.add_argument("--buffer", default="600M")
    ap.add_argument("--out-json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("sort_oom: needs root (swap, zram, memory cgroup)", file=sys.stderr)
        return 2
    if not os.path.isdir(CG_ROOT):
        print(f"sort_oom: no cgroup v1 memory controller at {CG_ROOT}", file=sys.stderr)
        return 2
    size = 1 << 30
    runs = {}
    fd, text = tempfile.mkstemp(prefix="sort-oom-", suffix=".txt", dir="/var/tmp")
    os.close(fd)
    try:
        make_text(text, a.text_mib)
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for rnd in range(a.rounds):
                for dev in (Compcache(a.bin, size), Zram(size)):
                    try:
                        dev.start()
                        r = run_sort(text, a.limit_mib, a.buffer)
                    finally:
                        dev.stop()
                    r["load"] = os.getloadavg()[0]
                    runs.setdefault(dev.name, []).append(r)
                    print(f"sort_oom: round {rnd} {dev.name}: {r['seconds']:.1f} s, "
                          f"{'OOM-killed' if r['killed'] else 'ok'} (rc {r['rc']}), failcnt {r['failcnt']}, "
                          f"peak writeback {r['peak_writeback_pages']} pages, load {r['load']:.1f}", file=sys.stderr, flush=True)
    finally:
        os.unlink(text)
    for line in summary(runs):
        print(line)
    if a.out_json:
        with open(a.out_json, "w") as f:
            json.dump(runs, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
