#!/usr/bin/env python3
"""Device-level A/B benchmark: compcache serve against nbdkit memory (zstd and sparse
allocators) and kernel zram, in one run, with real page data.

For each device:
  1. start it (a zram device of our own via /sys/class/zram-control/hot_add, lz4);
  2. fill it with a real page file (tools/pagedump, default data/pages-mixed.bin) using
     `nbdcopy -S 0`, and record the memory it uses for that data:
       compcache: mem_used_total from `compcache stat --json` (and the RSS growth too),
       nbdkit:    RSS growth of the process since it started,
       zram:      mem_used_total from /sys/block/zramN/mm_stat;
  3. fio 4 KiB random read at QD1 and QD32 over the filled region (reads the real data);
  4. fio 4 KiB random write at QD1 and QD32, with buffer_compress_percentage set so fio's
     buffers compress about as well as the real pages did in compcache (see --compress-pct).

Engines: the NBD servers are driven by fio's `nbd` engine (libnbd in fio, one connection per
job, over a Unix socket); zram by `io_uring` with direct=1 on /dev/zramN. So the NBD rows
include the NBD protocol and a socket round trip, the zram row a kernel block device: the
compcache-vs-nbdkit ratios compare like with like, the zram ratios show the cost of userspace.

Everything started is stopped by PID, and the zram device reset and hot-removed, also on
failure. Needs root for zram (skipped with a message otherwise).

Usage: bench/device/fio_compare.py [--page-file data/pages-mixed.bin] [--runtime 10]
           [--out-json bench/results/device.json] [--markdown docs/benchmarks.md]
"""
import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools", "pagedump"))
import pagedump  # noqa: E402

PAGE = 4096
MiB = 1 << 20
# (name, rw, iodepth), in the order they run: reads first, while the device holds the real
# pages; writes after (they replace real pages with fio's buffers).
WORKLOADS = [("randread-qd1", "randread", 1), ("randread-qd32", "randread", 32),
             ("randwrite-qd1", "randwrite", 1), ("randwrite-qd32", "randwrite", 32)]


def sh(cmd, check=True, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}: {p.stderr.strip()}")
    return p


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def wait_socket(path, proc, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode} before listening")
        if os.path.exists(path) and sh(["nbdinfo", "--size", f"nbd+unix:///?socket={path}"],
                                       check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"no server on {path} after {timeout_s}s")


def stop_pid(proc):
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


class NbdTarget:
    """An NBD server process on a Unix socket in a temporary directory."""

    kind = "nbd"

    def __init__(self, name, argv_fn, tmp):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"bench-{name}-", dir=tmp)
        self.socket = os.path.join(self.dir, "sock")
        self.argv = argv_fn(self.socket)
        self.proc = None
        self.baseline_rss = 0

    @property
    def uri(self):
        return f"nbd+unix:///compcache?socket={self.socket}"

    def fio_target(self):
        return {"ioengine": "nbd", "uri": self.uri}

    def start(self):
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log, start_new_session=True)
        wait_socket(self.socket, self.proc)
        self.baseline_rss = rss_bytes(self.proc.pid)

    def fill(self, page_file):
        sh(["nbdcopy", "-S", "0", page_file, self.uri])

    def memory(self):
        return {"rss_growth_bytes": rss_bytes(self.proc.pid) - self.baseline_rss}

    def stop(self):
        stop_pid(self.proc)
        if self.proc is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class CompcacheTarget(NbdTarget):
    def __init__(self, binary, size, algorithm, tmp):
        super().__init__(f"compcache-{algorithm}", lambda s: [
            binary, "serve", "--size", str(size), "--socket", s, "--control", s + ".ctl",
            "--algorithm", algorithm], tmp)
        self.binary = binary

    def stat(self):
        return json.loads(sh([self.binary, "stat", "--json", "--control",
                              self.socket + ".ctl"]).stdout)

    def memory(self):
        st = self.stat()
        m = super().memory()
        m.update({k: st.get(k) for k in
                  ("mem_used_total", "orig_data_size", "compr_data_size", "same_pages",
                   "huge_pages", "pages_stored")})
        m["mem_bytes"] = m["mem_used_total"]
        return m


class NbdkitTarget(NbdTarget):
    def __init__(self, size, allocator, tmp):
        super().__init__(f"nbdkit-{allocator}", lambda s: [
            "nbdkit", "--foreground", "--unix", s, "--exportname", "compcache",
            "memory", f"size={size}", f"allocator={allocator}"], tmp)

    def memory(self):
        m = super().memory()
        m["mem_bytes"] = m["rss_growth_bytes"]
        return m


class ZramTarget:
    """A zram device of our own (hot_add), lz4, driven by io_uring with O_DIRECT."""

    kind = "zram"

    def __init__(self, size, algorithm="lz4"):
        self.name = f"zram-{algorithm}"
        self.size = size
        self.algorithm = algorithm
        self.index = None

    @property
    def dev(self):
        return f"/dev/zram{self.index}"

    def sys(self, attr):
        return f"/sys/block/zram{self.index}/{attr}"

    def fio_target(self):
        return {"ioengine": "io_uring", "filename": self.dev, "direct": "1"}

    def start(self):
        with open("/sys/class/zram-control/hot_add") as f:
            self.index = int(f.read().strip())
        self.name = f"zram-{self.algorithm}"
        print(f"fio_compare: made our own {self.dev}", file=sys.stderr)
        with open(self.sys("comp_algorithm"), "w") as f:
            f.write(self.algorithm)
        with open(self.sys("disksize"), "w") as f:
            f.write(str(self.size))
        for _ in range(50):
            if os.path.exists(self.dev):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.dev} did not appear")

    def fill(self, page_file):
        sh(["nbdcopy", "-S", "0", page_file, self.dev])

    def memory(self):
        with open(self.sys("mm_stat")) as f:
            cols = [int(x) for x in f.read().split()]
        # mm_stat: orig_data_size compr_data_size mem_used_total mem_limit mem_used_max
        #          same_pages pages_compacted huge_pages [huge_pages_since]
        return {"orig_data_size": cols[0], "compr_data_size": cols[1],
                "mem_used_total": cols[2], "same_pages": cols[5], "huge_pages": cols[7],
                "mem_bytes": cols[2]}

    def stop(self):
        if self.index is None:
            return
        try:
            with open(self.sys("reset"), "w") as f:
                f.write("1")
        except OSError:
            pass
        with open("/sys/class/zram-control/hot_remove", "w") as f:
            f.write(str(self.index))
        self.index = None


def run_fio(target, rw, iodepth, region_bytes, runtime_s, compress_pct, tmp):
    opts = {"name": "bench", "rw": rw, "bs": "4k", "iodepth": str(iodepth),
            "size": str(region_bytes), "time_based": "1", "runtime": str(runtime_s),
            "ramp_time": "1", "norandommap": "1", "randrepeat": "0", "group_reporting": "1",
            **target.fio_target()}
    if rw == "randwrite":
        opts.update({"buffer_compress_percentage": str(compress_pct),
                     "buffer_compress_chunk": "512", "refill_buffers": "1"})
    job = os.path.join(tmp, "job.fio")
    with open(job, "w") as f:
        f.write("[bench]\n" + "".join(f"{k}={v}\n" for k, v in opts.items() if k != "name"))
    out = os.path.join(tmp, "fio.json")
    sh(["fio", "--output-format=json", f"--output={out}", job])
    with open(out) as f:
        text = f.read()
    j = json.loads(text[text.index("{"):])["jobs"][0]
    d = j["read" if rw == "randread" else "write"]
    pct = d["clat_ns"].get("percentile", {})
    return {"iops": d["iops"], "mb_s": d["bw_bytes"] / 1e6,
            "p50_us": pct.get("50.000000", 0) / 1000, "p99_us": pct.get("99.000000", 0) / 1000,
            "ios": d["total_ios"], "error": j["error"]}


def compress_pct_for(ratio):
    """fio's buffer_compress_percentage giving about `ratio`: N% compressible, the rest random."""
    return max(0, min(95, round(100 * (1 - 1 / ratio))))


def fmt_bytes(n):
    return f"{n / MiB:.1f} MiB"


def markdown(results, meta):
    names = [r["target"] for r in results]
    lines = [f"Page file: `{meta['page_file']}` ({meta['pages']} pages, "
             f"{fmt_bytes(meta['page_file_bytes'])}); fio {meta['fio']}, {meta['runtime_s']} s "
             f"per workload after 1 s ramp, 4 KiB blocks; random writes use "
             f"`buffer_compress_percentage={meta['compress_pct']}` (real pages compressed "
             f"{meta['real_ratio']:.2f}x in compcache). Kernel {meta['kernel']}, "
             f"{meta['cpus']} CPUs shared with other work. Engines: NBD targets via fio's "
             f"`nbd` engine over a Unix socket; zram via `io_uring`, direct=1.", "",
             "| workload | " + " | ".join(names) + " |",
             "| --- | " + " | ".join("---" for _ in names) + " |"]
    for w, _, _ in WORKLOADS:
        cells = []
        for r in results:
            m = r["fio"].get(w)
            cells.append("n/a" if m is None else
                         f"{m['iops']:.0f} IOPS, {m['mb_s']:.1f} MB/s, p50 {m['p50_us']:.0f} µs, "
                         f"p99 {m['p99_us']:.0f} µs")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines.append("| memory for the page file | " + " | ".join(
        fmt_bytes(r["memory"]["mem_bytes"]) for r in results) + " |")
    lines.append("| page file / memory | " + " | ".join(
        f"{meta['page_file_bytes'] / r['memory']['mem_bytes']:.2f}x" if r["memory"]["mem_bytes"]
        else "n/a" for r in results) + " |")
    lines.append("| server RSS growth (NBD) | " + " | ".join(
        fmt_bytes(r["memory"]["rss_growth_bytes"]) if "rss_growth_bytes" in r["memory"]
        else "n/a" for r in results) + " |")
    cc = next((r for r in results if r["target"].startswith("compcache")), None)
    if cc:
        lines += ["", "Ratios, compcache / baseline (IOPS: higher is better; memory: lower is "
                  "better):", "", "| baseline | " + " | ".join(w for w, _, _ in WORKLOADS)
                  + " | memory |", "| --- |" + " --- |" * (len(WORKLOADS) + 1)]
        for r in results:
            if r is cc:
                continue
            cells = []
            for w, _, _ in WORKLOADS:
                a, b = cc["fio"].get(w), r["fio"].get(w)
                cells.append(f"{a['iops'] / b['iops']:.2f}x" if a and b and b["iops"] else "n/a")
            mb = r["memory"]["mem_bytes"]
            cells.append(f"{cc['memory']['mem_bytes'] / mb:.2f}x" if mb else "n/a")
            lines.append(f"| {r['target']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page-file", default=os.path.join(REPO, "data", "pages-mixed.bin"))
    ap.add_argument("--runtime", type=int, default=10, help="seconds per fio workload")
    ap.add_argument("--compcache-bin", default=os.path.join(REPO, "target", "release", "compcache"))
    ap.add_argument("--algorithm", default="lz4", help="compcache's algorithm (zram uses lz4)")
    ap.add_argument("--compress-pct", type=int, default=None,
                    help="fio buffer_compress_percentage for writes (default: from the real "
                         "pages' ratio in compcache)")
    ap.add_argument("--targets", default="compcache,nbdkit-zstd,nbdkit-sparse,zram")
    ap.add_argument("--out-json", default=os.path.join(REPO, "bench", "results", "device.json"))
    ap.add_argument("--markdown", default=None,
                    help="also write the results into this Markdown file (docs/benchmarks.md)")
    args = ap.parse_args()

    if not os.path.exists(args.page_file):
        pagedump.ensure_data(os.path.dirname(args.page_file))
    file_bytes = os.path.getsize(args.page_file)
    pages = file_bytes // PAGE
    size = (file_bytes + MiB - 1) // MiB * MiB
    wanted = args.targets.split(",")
    tmp = tempfile.mkdtemp(prefix="fio-compare-")
    targets = []
    for t in wanted:
        if t == "compcache":
            targets.append(CompcacheTarget(args.compcache_bin, size, args.algorithm, tmp))
        elif t.startswith("nbdkit-"):
            targets.append(NbdkitTarget(size, t.split("-", 1)[1], tmp))
        elif t == "zram":
            if os.geteuid() != 0 or not os.path.exists("/sys/class/zram-control/hot_add"):
                print("fio_compare: skipping zram (needs root and zram-control)", file=sys.stderr)
                continue
            targets.append(ZramTarget(size))
        else:
            ap.error(f"unknown target {t}")

    results = []
    real_ratio = None
    compress_pct = args.compress_pct
    try:
        for t in targets:
            print(f"fio_compare: {t.name}: start, fill with {args.page_file}", file=sys.stderr)
            t.start()
            try:
                t.fill(args.page_file)
                mem = t.memory()
                if isinstance(t, CompcacheTarget) and mem.get("compr_data_size"):
                    real_ratio = mem["orig_data_size"] / mem["compr_data_size"]
                if compress_pct is None:
                    compress_pct = compress_pct_for(real_ratio or 2.5)
                fio_results = {}
                for wname, rw, qd in WORKLOADS:
                    print(f"fio_compare: {t.name}: {wname}", file=sys.stderr)
                    fio_results[wname] = run_fio(t, rw, qd, pages * PAGE, args.runtime,
                                                 compress_pct, tmp)
                results.append({"target": t.name, "engine": t.fio_target()["ioengine"],
                                "memory": mem, "fio": fio_results})
            finally:
                t.stop()
    finally:
        for t in targets:
            t.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    meta = {"page_file": os.path.relpath(args.page_file, REPO), "pages": pages,
            "page_file_bytes": file_bytes, "runtime_s": args.runtime,
            "compress_pct": compress_pct, "real_ratio": real_ratio or 0.0,
            "fio": sh(["fio", "--version"]).stdout.strip(), "kernel": platform.release(),
            "cpus": os.cpu_count(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "command": " ".join(["bench/device/fio_compare.py"] + sys.argv[1:])}
    os.makedirs(os.path.dirname(os.path.abspath(args.out_json)), exist_ok=True)
    with open(args.out_json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=2)
    md = markdown(results, meta)
    print(md)
    if args.markdown:
        write_markdown_section(args.markdown, meta, md)
    return 0


def write_markdown_section(path, meta, table):
    """Replaces (or appends) the device benchmark section of docs/benchmarks.md."""
    begin, end = "<!-- device-benchmark:begin -->", "<!-- device-benchmark:end -->"
    section = (f"{begin}\nMeasured {meta['date_utc']} UTC with:\n\n    {meta['command']}\n\n"
               f"{table}{end}")
    text = open(path).read() if os.path.exists(path) else ""
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text += ("\n" if text else "") + section + "\n"
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
