#!/usr/bin/env python3
"""Loop-device benchmark for kernels without ublk or nbd: fio 4 KiB random read and write at
QD32 on the block device the kernel would swap to, in one run, for
  - compcache (FUSE):     `compcache fuse`: store -> FUSE file -> loop (direct I/O, 4 KiB sectors);
  - compcache (FUSE, io_uring): the same with `--io-uring`: FUSE over io_uring (Linux 6.14+);
                          /sys/module/fuse/parameters/enable_uring is set to Y only while the
                          server starts (the kernel reads it at INIT and at ring registration;
                          a connection that negotiated io_uring keeps it) and restored to the
                          value found, also on failure; the server's log must say it serves
                          through io_uring, else the run fails;
  - compcache (nbdfuse):  `compcache serve` -> nbdfuse -> loop (direct I/O), the demo's chain;
  - zram:                 a kernel zram device of our own (hot_add, lz4; hot_remove after).
and the ratios (compcache FUSE / nbdfuse chain, compcache FUSE / zram, FUSE io_uring / FUSE
classic). With --rounds N the compcache FUSE variants run N times, alternating, and each
workload's median is reported (this machine is shared: alternation spreads the load's drift).

Each device is first filled (fio sequential write, 64 KiB, buffers that compress about 2:1
with buffer_compress_percentage=50), then randread QD32, then randwrite QD32, each for
--runtime seconds, io_uring with direct=1, one job. Everything started is stopped by PID,
the loop devices detached, the mounts unmounted and the zram device reset and removed, also
on failure. Needs root, fio, losetup, nbdfuse, fusermount3 and the compcache binary.

Usage: bench/device/fio_loop.py [--size 512M] [--runtime 10] [--bin target/release/compcache]
           [--only fuse,fuse-uring,nbdfuse,zram] [--rounds 1] [--out-json bench/results/fio-loop.json]
"""
import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from bench.ready import read_ready_line  # noqa: E402

WORKLOADS = [("randread-qd32", "randread", 32), ("randwrite-qd32", "randwrite", 32)]
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


def sh(cmd, check=True, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}: {p.stderr.strip()}")
    return p


def stop_pid(proc, timeout=60):
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def losetup(file, dio=True):
    args = ["losetup", "--find", "--show", "--sector-size", "4096"]
    p = sh(args + ["--direct-io=on", file], check=False) if dio else None
    if p is None or p.returncode != 0:
        p = sh(args + [file])
    return p.stdout.strip()


class FuseTarget:
    name = "compcache (FUSE)"
    key = "fuse"

    def __init__(self, binary, size, tmp, uring=False):
        self.binary, self.size, self.tmp, self.uring = binary, size, tmp, uring
        self.proc = None
        self.found = None  # enable_uring as found, while we have changed it
        if uring:
            self.name, self.key = "compcache (FUSE, io_uring)", "fuse-uring"

    def start(self):
        r, w = os.pipe()
        self.log_path = os.path.join(self.tmp, f"{self.key}.log")
        self.log = open(self.log_path, "wb")
        argv = [self.binary, "fuse", "--size", str(self.size), "--ready-fd", str(w)]
        if self.uring:
            if not os.path.exists(ENABLE_URING):
                raise RuntimeError("this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)")
            with open(ENABLE_URING) as f:
                self.found = f.read().strip()
            with open(ENABLE_URING, "w") as f:
                f.write("Y")
            argv.append("--io-uring")
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                         pass_fds=(w,), start_new_session=True)
            os.close(w)
            line = read_ready_line(r)
        finally:
            self.restore()
        if not line.startswith(b"READY "):
            raise RuntimeError("compcache fuse did not come up; see " + self.log_path)
        self.dev = line.decode().split()[1]
        if self.uring:
            with open(self.log_path, errors="replace") as f:
                log = f.read()
            if "fuse transport: io_uring" not in log:
                raise RuntimeError("compcache fuse --io-uring is not serving through io_uring; see " + self.log_path)

    def restore(self):
        """enable_uring back to the value found (the connection keeps io_uring once negotiated)."""
        if self.found is not None:
            with open(ENABLE_URING, "w") as f:
                f.write(self.found)
            self.found = None

    def stop(self):
        self.restore()
        stop_pid(self.proc)


class NbdfuseTarget:
    name = "compcache (nbdfuse)"
    key = "nbdfuse"

    def __init__(self, binary, size, tmp):
        self.binary, self.size, self.tmp = binary, size, tmp
        self.server = self.fuse = None
        self.dev = None
        self.mnt = tempfile.mkdtemp(prefix="nbdfuse-", dir=tmp)

    def start(self):
        sock = os.path.join(self.tmp, "nbd.sock")
        self.log = open(os.path.join(self.tmp, "serve.log"), "wb")
        self.server = subprocess.Popen([self.binary, "serve", "--mlock", "--size", str(self.size), "--socket", sock,
                                        "--control", sock + ".ctl"], stdin=subprocess.DEVNULL, stdout=self.log,
                                       stderr=self.log, start_new_session=True)
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        file = os.path.join(self.mnt, "nbd")
        self.fuse = subprocess.Popen(["nbdfuse", file, "--unix", sock], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        for _ in range(300):
            if os.path.exists(file) and os.path.getsize(file) > 0:
                break
            time.sleep(0.1)
        self.dev = losetup(file)

    def stop(self):
        if self.dev:
            sh(["losetup", "-d", self.dev], check=False)
        if self.fuse is not None:
            sh(["fusermount3", "-u", self.mnt], check=False)
            try:
                self.fuse.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop_pid(self.fuse)
                sh(["fusermount3", "-uz", self.mnt], check=False)
        stop_pid(self.server)


class ZramTarget:
    name = "zram (kernel)"
    key = "zram"

    def __init__(self, size):
        self.size = size
        self.index = None

    def start(self):
        with open("/sys/class/zram-control/hot_add") as f:
            self.index = int(f.read().strip())
        self.dev = f"/dev/zram{self.index}"
        with open(f"/sys/block/zram{self.index}/comp_algorithm", "w") as f:
            f.write("lz4")
        with open(f"/sys/block/zram{self.index}/disksize", "w") as f:
            f.write(str(self.size))

    def stop(self):
        if self.index is not None:
            with contextlib.suppress(OSError):
                with open(f"/sys/block/zram{self.index}/reset", "w") as f:
                    f.write("1")
            with contextlib.suppress(OSError):
                with open("/sys/class/zram-control/hot_remove", "w") as f:
                    f.write(str(self.index))


def fio(dev, name, rw, qd, size, runtime, tmp):
    job = f"""[{name}]
filename={dev}
ioengine=io_uring
direct=1
rw={rw}
bs={'64k' if rw == 'write' else '4k'}
iodepth={qd}
size={size}
{'' if rw == 'write' else f'time_based=1{chr(10)}runtime={runtime}'}
buffer_compress_percentage=50
refill_buffers=1
randrepeat=0
"""
    path = os.path.join(tmp, f"{name}.fio")
    with open(path, "w") as f:
        f.write(job)
    out = sh(["fio", "--output-format=json", path], timeout=runtime * 10 + 600).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    return {"iops": side["iops"], "bw_mib_s": side["bw_bytes"] / (1 << 20),
            "clat_p99_us": side.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="512M")
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "compcache"))
    ap.add_argument("--out-json")
    ap.add_argument("--only", help="comma-separated subset: fuse,fuse-uring,nbdfuse,zram")
    ap.add_argument("--rounds", type=int, default=1, help="runs of the compcache FUSE variants, alternating (median)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("fio_loop: needs root (loop devices, FUSE mounts, zram)", file=sys.stderr)
        return 2
    size = a.size
    size_bytes = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1].upper()] if size[-1].isalpha() else int(size)
    wanted = a.only.split(",") if a.only else ["fuse", "fuse-uring", "nbdfuse", "zram"]
    if "fuse-uring" in wanted and not os.path.exists(ENABLE_URING):
        print("fio_loop: no FUSE over io_uring in this kernel: fuse-uring left out", file=sys.stderr)
        wanted.remove("fuse-uring")
    runs = {}
    with tempfile.TemporaryDirectory(prefix="fio-loop-") as tmp:
        make = {"fuse": lambda: FuseTarget(a.bin, size_bytes, tmp),
                "fuse-uring": lambda: FuseTarget(a.bin, size_bytes, tmp, uring=True),
                "nbdfuse": lambda: NbdfuseTarget(a.bin, size_bytes, tmp),
                "zram": lambda: ZramTarget(size_bytes)}
        order = []
        for rnd in range(max(1, a.rounds)):
            order += [k for k in ("fuse", "fuse-uring") if k in wanted]
            if rnd == 0:
                order += [k for k in ("nbdfuse", "zram") if k in wanted]
        for k in order:
            t = make[k]()
            try:
                t.start()
                print(f"fio_loop: {t.name} on {t.dev}", file=sys.stderr)
                fill = fio(t.dev, "fill", "write", 8, size, a.runtime, tmp)
                r = {"fill_mib_s": fill["bw_mib_s"]}
                for name, rw, qd in WORKLOADS:
                    r[name] = fio(t.dev, name, rw, qd, size, a.runtime, tmp)
                    print(f"fio_loop: {t.name} {name}: {r[name]['iops']:.0f} IOPS", file=sys.stderr)
                runs.setdefault(t.name, []).append(r)
            finally:
                t.stop()
    # Per device, the median of its runs, workload by workload.
    results = {}
    for n, rs in runs.items():
        med = {"fill_mib_s": statistics.median(r["fill_mib_s"] for r in rs), "runs": rs}
        for name, _, _ in WORKLOADS:
            med[name] = {"iops": statistics.median(r[name]["iops"] for r in rs),
                         "clat_p99_us": statistics.median(r[name]["clat_p99_us"] for r in rs)}
        results[n] = med
    print("| device | runs | fill 64K MiB/s | randread 4K QD32 IOPS | randwrite 4K QD32 IOPS |")
    print("| --- | --- | --- | --- | --- |")
    for n, r in results.items():
        print(f"| {n} | {len(r['runs'])} | {r['fill_mib_s']:.0f} | {r['randread-qd32']['iops']:.0f} | {r['randwrite-qd32']['iops']:.0f} |")
    for base, other in (("compcache (FUSE)", "compcache (nbdfuse)"), ("compcache (FUSE)", "zram (kernel)"),
                        ("compcache (FUSE, io_uring)", "compcache (FUSE)"), ("compcache (FUSE, io_uring)", "compcache (nbdfuse)")):
        f, o = results.get(base), results.get(other)
        if f and o:
            print(f"{base} / {other}: randread {f['randread-qd32']['iops'] / o['randread-qd32']['iops']:.2f}x, "
                  f"randwrite {f['randwrite-qd32']['iops'] / o['randwrite-qd32']['iops']:.2f}x")
    if a.out_json:
        os.makedirs(os.path.dirname(os.path.abspath(a.out_json)), exist_ok=True)
        with open(a.out_json, "w") as fh:
            json.dump({"size": size, "runtime_s": a.runtime, "results": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
