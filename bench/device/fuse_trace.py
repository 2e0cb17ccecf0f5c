#!/usr/bin/env python3
"""Where one random 4 KiB read through `compcache fuse` spends its time: a latency breakdown
from scheduler, system-call, block and FUSE tracepoints (perf record, no kprobes, no BPF).

fio reads 4 KiB at random at queue depth 1 (psync, direct) from the loop device the kernel
would swap to (or, with --no-loop, from the FUSE file itself: the FUSE cost without the loop
device's), while `perf record -a` records these tracepoints:

  syscalls:sys_{enter,exit}_pread64   fio's read, start and end (comm fio)
  block:block_rq_{issue,complete}     the request on the loop device (dev of the loop device)
  workqueue:workqueue_execute_start   the loop driver's worker starting (function loop_*)
  fuse:fuse_request_{send,end}        the FUSE request queued for the server, and its reply
                                      taken (connection of the mount)
  syscalls:sys_exit_read              a serving thread got the request (comm fuse-*)
  syscalls:sys_enter_writev           the same thread writes the reply
  sched:sched_{waking,switch}         who is woken, when it runs, and whether its CPU was idle

At queue depth 1 every event between a pread's entry and its exit belongs to that read. Each
read is cut into stages (below); the script prints each stage's median, p90 and p99 in
microseconds, and how often a woken task found its CPU idle (an idle vCPU halts: its wake-up
is a VM exit and an interrupt). Tracing adds about a microsecond per event: the sum is larger
than fio's untraced latency, which the script also measures (same device, before tracing) and
prints beside it.

  submit        pread entry -> request issued to the loop driver (the reading task)
  loop hop      issued -> the loop worker starts (queue_work, wake the worker)
  loop worker   worker start -> FUSE request queued (lo_rw_aio, fuse_direct_IO)
  server wake   FUSE request queued -> a serving thread's read returns it
  server work   read returned -> reply writev starts (decode, store read, decompress)
  reply         writev -> the kernel ends the FUSE request (copy the reply in)
  loop done     FUSE request ended -> loop request completed
  wake reader   completed -> pread returns (wake the reading task, return to user)

With --no-loop the loop stages are absent ("submit" runs to the FUSE request).

Usage: bench/device/fuse_trace.py [--bin target/release/compcache] [--size 256M] [--runtime 5]
           [--no-loop] [--server-arg=--threads=1 ...] [--taskset 0-1]
Needs root, fio, perf (Debian: linux-perf) and the tracepoints above.
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from bench.device.fio_loop import FuseTarget, fio_qd1  # noqa: E402
from bench.parse import parse_size  # noqa: E402

# perf script line: "  comm  pid [cpu] secs.nanos: event: details"
LINE = re.compile(r"^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+(\d+)\.(\d+):\s+([\w:]+):\s*(.*)$")

STAGES_LOOP = ["submit", "loop hop", "loop worker", "server wake", "server work", "reply", "loop done", "wake reader"]
STAGES_FILE = ["submit", "server wake", "server work", "reply", "wake reader"]


def dev_number(path):
    """The kernel's dev_t (MKDEV: major << 20 | minor) of a block device or a file's filesystem."""
    st = os.stat(path)
    rdev = st.st_rdev if st.st_rdev else st.st_dev
    return os.major(rdev) << 20 | os.minor(rdev)


def perf_events(loop_dev, conn):
    ev = [
        ("syscalls:sys_enter_pread64", 'comm == "fio"'),
        ("syscalls:sys_exit_pread64", 'comm == "fio"'),
        ("fuse:fuse_request_send", f"connection == {conn}"),
        ("fuse:fuse_request_end", f"connection == {conn}"),
        ("syscalls:sys_exit_read", 'comm ~ "fuse-*"'),
        ("syscalls:sys_enter_writev", 'comm ~ "fuse-*"'),
        ("sched:sched_waking", 'comm == "fio" || comm ~ "fuse-*" || comm ~ "kworker*"'),
        ("sched:sched_switch", 'next_comm == "fio" || next_comm ~ "fuse-*" || next_comm ~ "kworker*"'),
    ]
    if loop_dev is not None:
        ev += [
            ("block:block_rq_issue", f"dev == {loop_dev}"),
            ("block:block_rq_complete", f"dev == {loop_dev}"),
            ("workqueue:workqueue_execute_start", ""),
        ]
    args = []
    for name, flt in ev:
        args += ["-e", name] + (["--filter", flt] if flt else [])
    return args


def parse(text):
    """perf script text -> [(t_ns, comm, pid, cpu, event, details)] in time order."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            comm, pid, cpu, s, frac, ev, rest = m.groups()
            t = int(s) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
            out.append((t, comm, int(pid), int(cpu), ev, rest))
    out.sort(key=lambda e: e[0])
    return out


def first(evs, i, pred):
    """Index of the first event at or after i matching pred, else None."""
    for j in range(i, len(evs)):
        if pred(evs[j]):
            return j
    return None


def breakdown(evs, with_loop):
    """Per read: a dict stage -> ns, plus the idle-wake flags."""
    reads = []
    i = 0
    n = len(evs)
    while i < n:
        if evs[i][4] != "syscalls:sys_enter_pread64":
            i += 1
            continue
        fio_pid = evs[i][2]
        end = first(evs, i + 1, lambda e: e[4] == "syscalls:sys_exit_pread64" and e[2] == fio_pid)
        if end is None:
            break
        w = evs[i:end + 1]
        i = end + 1

        def at(pred, after=0):
            j = first(w, after, pred)
            return (j, w[j][0]) if j is not None else (None, None)

        t0, t_exit = w[0][0], w[-1][0]
        marks = {}
        k = 0
        if with_loop:
            k, marks["issue"] = at(lambda e: e[4] == "block:block_rq_issue")
            if k is None:
                continue
            k, marks["worker"] = at(lambda e: e[4] == "workqueue:workqueue_execute_start" and "loop" in e[5], k)
            if k is None:
                continue
        k, marks["send"] = at(lambda e: e[4] == "fuse:fuse_request_send" and "FUSE_READ" in e[5], k)
        if k is None:
            continue
        ks = k
        k, marks["got"] = at(lambda e: e[4] == "syscalls:sys_exit_read" and e[1].startswith("fuse-"), k)
        if k is None:
            continue
        server_tid = w[k][2]
        # Was the serving thread woken (it slept in read) and did it find its CPU idle?
        jw, _ = at(lambda e: e[4] == "sched:sched_waking" and f"pid={server_tid} " in e[5], ks)
        srv_woken = jw is not None and jw < k
        js, _ = at(lambda e: e[4] == "sched:sched_switch" and f"next_pid={server_tid} " in e[5], ks)
        srv_idle = js is not None and js < k and "prev_comm=swapper" in w[js][5]
        k, marks["writev"] = at(lambda e: e[4] == "syscalls:sys_enter_writev" and e[2] == server_tid, k)
        if k is None:
            continue
        k, marks["end"] = at(lambda e: e[4] == "fuse:fuse_request_end", k)
        if k is None:
            continue
        if with_loop:
            k, marks["complete"] = at(lambda e: e[4] == "block:block_rq_complete", k)
            if k is None:
                continue
        jr, _ = at(lambda e: e[4] == "sched:sched_switch" and f"next_pid={fio_pid} " in e[5], k)
        fio_idle = jr is not None and "prev_comm=swapper" in w[jr][5]
        if with_loop:
            st = {
                "submit": marks["issue"] - t0,
                "loop hop": marks["worker"] - marks["issue"],
                "loop worker": marks["send"] - marks["worker"],
                "server wake": marks["got"] - marks["send"],
                "server work": marks["writev"] - marks["got"],
                "reply": marks["end"] - marks["writev"],
                "loop done": marks["complete"] - marks["end"],
                "wake reader": t_exit - marks["complete"],
            }
        else:
            st = {
                "submit": marks["send"] - t0,
                "server wake": marks["got"] - marks["send"],
                "server work": marks["writev"] - marks["got"],
                "reply": marks["end"] - marks["writev"],
                "wake reader": t_exit - marks["end"],
            }
        st["total"] = t_exit - t0
        reads.append((st, srv_woken, srv_idle, fio_idle))
    return reads


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def report(reads, with_loop, untraced):
    stages = (STAGES_LOOP if with_loop else STAGES_FILE) + ["total"]
    print(f"{len(reads)} reads traced")
    print("| stage | median us | p90 us | p99 us | share of median total |")
    print("| --- | --- | --- | --- | --- |")
    tot = statistics.median(r[0]["total"] for r in reads)
    for s in stages:
        xs = [r[0][s] for r in reads]
        med = statistics.median(xs)
        print(f"| {s} | {med / 1000:.1f} | {pct(xs, 90) / 1000:.1f} | {pct(xs, 99) / 1000:.1f} | {100 * med / tot:.0f}% |")
    n = len(reads)
    print(f"serving thread woken from read: {100 * sum(r[1] for r in reads) / n:.0f}% of reads, "
          f"on an idle CPU: {100 * sum(r[2] for r in reads) / n:.0f}%; "
          f"reader resumed on an idle CPU: {100 * sum(r[3] for r in reads) / n:.0f}%")
    if untraced:
        print(f"untraced fio on the same device: p50 {untraced['p50_us']:.1f} us, p99 {untraced['p99_us']:.1f} us, "
              f"{untraced['iops']:.0f} IOPS")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "compcache"))
    ap.add_argument("--size", default="256M")
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--no-loop", action="store_true", help="read the FUSE file itself (no loop device)")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra argument for compcache fuse")
    ap.add_argument("--taskset", help="CPU list for fio (e.g. 0-1)")
    ap.add_argument("--keep", help="write perf script's text to this file too")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("fuse_trace: needs root (FUSE mount, loop device, tracepoints)", file=sys.stderr)
        return 2
    size_bytes = parse_size(a.size)
    with tempfile.TemporaryDirectory(prefix="fuse-trace-") as tmp:
        extra = a.server_arg + (["--no-loop"] if a.no_loop else [])
        t = FuseTarget(a.bin, size_bytes, tmp, extra=extra)
        perf = None
        try:
            t.start()
            loop_dev = None if a.no_loop else dev_number(t.dev)
            conn = dev_number(t.file())
            untraced = fio_qd1(t.dev, "randread", a.size, a.runtime, tmp, fill=True, taskset=a.taskset)
            data = os.path.join(tmp, "perf.data")
            perf = subprocess.Popen(["perf", "record", "-q", "-a", "-o", data] + perf_events(loop_dev, conn),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            fio_qd1(t.dev, "randread", a.size, a.runtime, tmp, taskset=a.taskset)
            os.kill(perf.pid, signal.SIGINT)
            err = perf.communicate(timeout=120)[1]
            if perf.returncode not in (0, -signal.SIGINT):
                raise RuntimeError(f"perf record exited {perf.returncode}: {err.decode(errors='replace').strip()}")
            text = subprocess.run(["perf", "script", "-i", data, "--ns"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, check=True).stdout
        finally:
            if perf is not None and perf.poll() is None:
                os.kill(perf.pid, signal.SIGKILL)
                perf.wait()
            t.stop()
    if a.keep:
        with open(a.keep, "w") as f:
            f.write(text)
    reads = breakdown(parse(text), not a.no_loop)
    if not reads:
        print("fuse_trace: no complete read in the trace (are the tracepoints there?)", file=sys.stderr)
        return 1
    report(reads, not a.no_loop, untraced)
    return 0


if __name__ == "__main__":
    sys.exit(main())
