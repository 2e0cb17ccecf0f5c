#!/usr/bin/env python3
"""Loop-device benchmark for kernels without ublk or nbd: fio 4 KiB random read and write on
the block device the kernel would swap to, at queue depth 32 (throughput) and at queue depth 1
(latency: what one page fault waits for), in one run, for
  - compcache (FUSE):     `compcache fuse`: store -> FUSE file -> loop (direct I/O, 4 KiB sectors);
  - compcache (FUSE, base): the same with another binary (--base-bin), for an A/B of a change;
  - compcache (FUSE, io_uring): the same with `--io-uring`: FUSE over io_uring (Linux 6.14+);
                          /sys/module/fuse/parameters/enable_uring is set to Y only while the
                          server starts (the kernel reads it at INIT and at ring registration;
                          a connection that negotiated io_uring keeps it) and restored to the
                          value found, also on failure; the server's log must say it serves
                          through io_uring, else the run fails;
  - compcache (nbdfuse):  `compcache serve` -> nbdfuse -> loop (direct I/O), the demo's chain;
  - zram:                 a kernel zram device of our own (hot_add, lz4; hot_remove after);
  - disk:                 a file on the machine's disk (--disk-dir), read and written with
                          direct I/O: what a swap file there costs (the kernel swaps to a file's
                          blocks directly, without a loop device).
and the ratios against zram (throughput: IOPS / zram's; latency: percentile / zram's). With
--rounds N every device runs N times, in the listed order in odd rounds and the reverse order
in even ones (this machine is shared: alternation spreads the load's drift; and a device's
place in a round was seen to matter: in two runs of 2 rounds on 2026-11-28 the FUSE device
run second had a 7-11 us lower QD1 p50 whichever binary it was), and each figure is the median
over the rounds: use an even number of rounds to compare two devices.

Each device is first filled (fio sequential write, 64 KiB, buffers that compress about 2:1
with buffer_compress_percentage=50), then:
  randread-qd32, randwrite-qd32   io_uring, direct, one job: IOPS (and p99 completion latency);
  randread-qd1, randwrite-qd1     psync (one pread/pwrite at a time, as a page fault waits for
                                  its page), direct, one job: p50, p99 and p99.9 latency;
each for --runtime seconds. --taskset pins fio (not the servers) to a CPU list. Everything
started is stopped by PID, the loop devices detached, the mounts unmounted, the zram device
reset and removed and the disk file deleted, also on failure. Needs root, fio, losetup,
nbdfuse, fusermount3 and the compcache binary.

Usage: bench/device/fio_loop.py [--size 512M] [--runtime 10] [--bin target/release/compcache]
           [--base-bin OTHER] [--only fuse,fuse-base,fuse-uring,nbdfuse,zram,disk] [--rounds 1]
           [--workloads randread-qd1,...] [--taskset 0-1] [--out-json bench/results/fio-loop.json]
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
from bench.parse import parse_size  # noqa: E402
from bench.ready import read_ready_line  # noqa: E402

# (name, fio rw, queue depth, engine)
WORKLOADS = [("randread-qd32", "randread", 32, "io_uring"), ("randwrite-qd32", "randwrite", 32, "io_uring"),
             ("randread-qd1", "randread", 1, "psync"), ("randwrite-qd1", "randwrite", 1, "psync")]
# fio's default completion-latency percentiles include these.
PERCENTILES = {"p50_us": "50.000000", "p99_us": "99.000000", "p99.9_us": "99.900000"}
KEYS = ["fuse", "fuse-base", "fuse-uring", "nbdfuse", "zram", "disk"]
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


def sh(cmd, check=True, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}: {p.stderr.strip()}")
    return p


def cpu_seconds(proc):
    """User + system CPU time of a process and all its threads so far (/proc/<pid>/stat), or
    None for a device without a server process (zram, disk)."""
    if proc is None:
        return None
    with open(f"/proc/{proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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

    def __init__(self, binary, size, tmp, uring=False, extra=(), name=None, key=None):
        self.binary, self.size, self.tmp, self.uring, self.extra = binary, size, tmp, uring, list(extra)
        self.proc = None
        self.found = None  # enable_uring as found, while we have changed it
        if uring:
            self.name, self.key = "compcache (FUSE, io_uring)", "fuse-uring"
        if name:
            self.name, self.key = name, key

    def file(self):
        """The FUSE file the loop device reads (`compcache fuse` mounts /run/compcache/fuse-<pid>)."""
        return f"/run/compcache/fuse-{self.proc.pid}/device"

    def start(self):
        r, w = os.pipe()
        self.log_path = os.path.join(self.tmp, f"{self.key}.log")
        self.log = open(self.log_path, "wb")
        argv = [self.binary, "fuse", "--size", str(self.size), "--ready-fd", str(w)] + self.extra
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


class DiskTarget:
    """A file on the machine's disk, read and written by fio with direct I/O."""
    name = "disk (file, direct I/O)"
    key = "disk"

    def __init__(self, size, directory):
        self.size, self.directory = size, directory
        self.dev = None

    def start(self):
        fd, self.dev = tempfile.mkstemp(prefix="fio-loop-disk-", dir=self.directory)
        os.close(fd)
        os.truncate(self.dev, self.size)

    def stop(self):
        if self.dev:
            with contextlib.suppress(OSError):
                os.unlink(self.dev)


def fio_job(dev, name, rw, qd, engine, size, runtime):
    """The fio job file's text: 4 KiB random I/O for `runtime` seconds, or a 64 KiB fill."""
    timed = "" if rw == "write" else f"time_based=1\nruntime={runtime}\n"
    return (f"[{name}]\nfilename={dev}\nioengine={engine}\ndirect=1\nrw={rw}\n"
            f"bs={'64k' if rw == 'write' else '4k'}\niodepth={qd}\nsize={size}\n{timed}"
            "buffer_compress_percentage=50\nrefill_buffers=1\nrandrepeat=0\n")


def fio_result(out, rw):
    """fio's JSON output -> IOPS, MiB/s and completion-latency percentiles (microseconds)."""
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    pcts = side.get("clat_ns", {}).get("percentile", {})
    r = {"iops": side["iops"], "bw_mib_s": side["bw_bytes"] / (1 << 20)}
    for key, p in PERCENTILES.items():
        r[key] = pcts.get(p, 0) / 1000
    r["clat_p99_us"] = r["p99_us"]
    return r


def fio(dev, name, rw, qd, size, runtime, tmp, engine="io_uring", taskset=None):
    path = os.path.join(tmp, f"{name}.fio")
    with open(path, "w") as f:
        f.write(fio_job(dev, name, rw, qd, engine, size, runtime))
    cmd = (["taskset", "-c", taskset] if taskset else []) + ["fio", "--output-format=json", path]
    return fio_result(sh(cmd, timeout=runtime * 10 + 600).stdout, rw)


def fio_qd1(dev, rw, size, runtime, tmp, fill=False, taskset=None):
    """Fills `dev` first if asked, then 4 KiB `rw` at queue depth 1 (psync, direct)."""
    if fill:
        fio(dev, "fill", "write", 8, size, runtime, tmp)
    return fio(dev, f"{rw}-qd1", rw, 1, size, runtime, tmp, engine="psync", taskset=taskset)


def summarize(runs):
    """Per device, the median over its runs of every figure, workload by workload."""
    results = {}
    for n, rs in runs.items():
        med = {"fill_mib_s": statistics.median(r["fill_mib_s"] for r in rs), "runs": rs}
        for name in {w for r in rs for w in r if w != "fill_mib_s"}:
            keys = rs[0][name].keys()
            med[name] = {k: statistics.median(r[name][k] for r in rs) for k in keys}
        results[n] = med
    return results


def ratios(results, base_name="zram (kernel)"):
    """Lines "device / base: ..." for every device against `base_name`: QD32 IOPS as a ratio
    (above 1: faster), QD1 latency percentiles as a ratio (above 1: slower)."""
    lines = []
    base = results.get(base_name)
    if not base:
        return lines
    for n, r in results.items():
        if n == base_name:
            continue
        parts = []
        for w in ("randread-qd32", "randwrite-qd32"):
            if w in r and w in base and base[w]["iops"]:
                parts.append(f"{w} IOPS {r[w]['iops'] / base[w]['iops']:.2f}x")
        for w in ("randread-qd1", "randwrite-qd1"):
            if w in r and w in base and base[w]["p50_us"] and base[w]["p99_us"]:
                parts.append(f"{w} p50 {r[w]['p50_us'] / base[w]['p50_us']:.1f}x p99 {r[w]['p99_us'] / base[w]['p99_us']:.1f}x")
        if parts:
            lines.append(f"{n} / {base_name}: " + ", ".join(parts))
    return lines


def table(results, workloads):
    """The Markdown tables: QD32 IOPS, then QD1 latency percentiles."""
    out = []
    qd32 = [w for w in workloads if w.endswith("qd32")]
    qd1 = [w for w in workloads if w.endswith("qd1")]
    if qd32:
        out.append("| device | runs | fill 64K MiB/s | " + " | ".join(f"{w} IOPS" for w in qd32) + " |")
        out.append("| --- | --- | --- |" + " --- |" * len(qd32))
        for n, r in results.items():
            cells = " | ".join(f"{r[w]['iops']:.0f}" for w in qd32)
            out.append(f"| {n} | {len(r['runs'])} | {r['fill_mib_s']:.0f} | {cells} |")
    cpu = [w for w in workloads if any(r[w].get("server_cpu_us_per_io") for r in results.values())]
    if cpu:
        out.append("")
        out.append("| device | " + " | ".join(f"{w} server CPU us/IO" for w in cpu) + " |")
        out.append("| --- |" + " --- |" * len(cpu))
        for n, r in results.items():
            if any(r[w].get("server_cpu_us_per_io") for w in cpu):
                out.append(f"| {n} | " + " | ".join(f"{r[w]['server_cpu_us_per_io']:.1f}" for w in cpu) + " |")
    if qd1:
        out.append("")
        out.append("| device | " + " | ".join(f"{w} p50 / p99 / p99.9 us" for w in qd1) + " |")
        out.append("| --- |" + " --- |" * len(qd1))
        for n, r in results.items():
            cells = " | ".join(f"{r[w]['p50_us']:.1f} / {r[w]['p99_us']:.1f} / {r[w]['p99.9_us']:.1f}" for w in qd1)
            out.append(f"| {n} | {cells} |")
    return out


def run_order(listed, rounds):
    """The devices to run, round after round: the listed order, then the reverse, and so on
    (module docs: a device's place in a round matters)."""
    return [k for rnd in range(max(1, rounds)) for k in (listed if rnd % 2 == 0 else listed[::-1])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="512M")
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "compcache"))
    ap.add_argument("--base-bin", help="a second compcache binary: the fuse-base device (an A/B of a change)")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra argument for compcache fuse (not the base)")
    ap.add_argument("--disk-dir", default="/var/tmp", help="where the disk device's file goes")
    ap.add_argument("--out-json")
    ap.add_argument("--only", help="comma-separated subset: " + ",".join(KEYS))
    ap.add_argument("--workloads", help="comma-separated subset: " + ",".join(w[0] for w in WORKLOADS))
    ap.add_argument("--taskset", help="CPU list fio runs on (taskset -c)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every device, in alternating order (median; even for an A/B)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("fio_loop: needs root (loop devices, FUSE mounts, zram)", file=sys.stderr)
        return 2
    size = a.size
    size_bytes = parse_size(size)
    wanted = a.only.split(",") if a.only else [k for k in KEYS if k not in ("fuse-base", "disk")]
    if a.base_bin and "fuse-base" not in wanted and not a.only:
        wanted.append("fuse-base")
    unknown = [k for k in wanted if k not in KEYS]
    if unknown:
        print(f"fio_loop: unknown device(s) {','.join(unknown)}; choose from {','.join(KEYS)}", file=sys.stderr)
        return 2
    if "fuse-base" in wanted and not a.base_bin:
        print("fio_loop: fuse-base needs --base-bin", file=sys.stderr)
        return 2
    if "fuse-uring" in wanted and not os.path.exists(ENABLE_URING):
        print("fio_loop: no FUSE over io_uring in this kernel: fuse-uring left out", file=sys.stderr)
        wanted.remove("fuse-uring")
    workloads = [w for w in WORKLOADS if not a.workloads or w[0] in a.workloads.split(",")]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="fio-loop-") as tmp:
        make = {"fuse": lambda: FuseTarget(a.bin, size_bytes, tmp, extra=a.server_arg),
                "fuse-base": lambda: FuseTarget(a.base_bin, size_bytes, tmp, name="compcache (FUSE, base)", key="fuse-base"),
                "fuse-uring": lambda: FuseTarget(a.bin, size_bytes, tmp, uring=True, extra=a.server_arg),
                "nbdfuse": lambda: NbdfuseTarget(a.bin, size_bytes, tmp),
                "zram": lambda: ZramTarget(size_bytes),
                "disk": lambda: DiskTarget(size_bytes, a.disk_dir)}
        order = run_order([k for k in KEYS if k in wanted], a.rounds)
        for k in order:
            t = make[k]()
            try:
                t.start()
                print(f"fio_loop: {t.name} on {t.dev} (load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
                fill = fio(t.dev, "fill", "write", 8, size, a.runtime, tmp)
                r = {"fill_mib_s": fill["bw_mib_s"]}
                for name, rw, qd, engine in workloads:
                    cpu0 = cpu_seconds(getattr(t, "proc", None))
                    r[name] = fio(t.dev, name, rw, qd, size, a.runtime, tmp, engine=engine, taskset=a.taskset)
                    cpu1 = cpu_seconds(getattr(t, "proc", None))
                    ios = r[name]["iops"] * a.runtime
                    # The server's CPU time per request (zram's is spent in fio's own context).
                    r[name]["server_cpu_us_per_io"] = (cpu1 - cpu0) * 1e6 / ios if cpu0 is not None and ios else 0.0
                    print(f"fio_loop: {t.name} {name}: {r[name]['iops']:.0f} IOPS, p50 {r[name]['p50_us']:.1f} us, "
                          f"p99 {r[name]['p99_us']:.1f} us, server CPU {r[name]['server_cpu_us_per_io']:.1f} us/IO",
                          file=sys.stderr)
                runs.setdefault(t.name, []).append(r)
            finally:
                t.stop()
    results = summarize(runs)
    for line in table(results, [w[0] for w in workloads]):
        print(line)
    for line in ratios(results):
        print(line)
    if a.out_json:
        os.makedirs(os.path.dirname(os.path.abspath(a.out_json)), exist_ok=True)
        with open(a.out_json, "w") as fh:
            json.dump({"size": size, "runtime_s": a.runtime, "results": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
