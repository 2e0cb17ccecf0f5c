#!/usr/bin/env python3
"""pagedump: real anonymous memory pages from real programs, for tests and benchmarks.

Starts a program that builds realistic data structures (Python dicts/lists/strings, Node.js
objects/Maps/arrays, Java collections of objects; see programs/), waits until it prints READY,
stops it (SIGSTOP), and copies its resident anonymous pages into a page file: raw
concatenated 4096-byte pages, with a JSON sidecar (PATH.json) describing them. Then it kills
the program by its PID.

Which pages: mappings from /proc/PID/maps that are private, readable and anonymous (no
backing inode: unnamed mappings, [heap], [stack], [anon:...]); of those, pages whose
/proc/PID/pagemap entry has bit 63 (present) set and bit 62 (swapped) clear. File-backed
mappings (even their private copy-on-write pages), [vdso]/[vvar]/[vsyscall] and shared
mappings are skipped. Page contents come from /proc/PID/mem.

Privileges: none beyond owning the program. Since Linux 4.2 an unprivileged reader of
pagemap gets the flag bits (present, swapped, file/shared) with the PFN zeroed, and we never
use the PFN; /proc/PID/mem of our own child is readable by its owner. Root works too.

Usage:
  pagedump.py --program python --out data/pages-python.bin [--mib 64]
  pagedump.py --all [--data-dir data] [--mib 64]       # python, node, java and mixed
  pagedump.py --ensure [--data-dir data] [--mib 64]    # --all, only for missing files
"""
import argparse
import json
import os
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

PAGE_SIZE = 4096
PROGRAMS = ("python", "node", "java")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_DATA_DIR = os.path.join(REPO, "data")
READY_TIMEOUT_S = 300
# Pages taken from each source in turn when interleaving the mixed file (64 KiB runs, like
# the clusters the kernel's swap-out tends to write).
MIX_RUN_PAGES = 16

# /proc/PID/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
PM_PRESENT = 1 << 63
PM_SWAPPED = 1 << 62
PM_FILE_OR_SHARED_ANON = 1 << 61
PM_EXCLUSIVE = 1 << 56
PM_SOFT_DIRTY = 1 << 55
PM_PFN_MASK = (1 << 55) - 1


# ---------------------------------------------------------------------------------------------
# Parsing /proc/PID/maps and /proc/PID/pagemap (pure functions, unit-tested)


def parse_maps_line(line):
    """Parses one /proc/PID/maps line into a dict.

    Format: "start-end perms offset major:minor inode [pathname]"; pathname may hold spaces
    and is empty for unnamed anonymous mappings.
    """
    parts = line.rstrip("\n").split(None, 5)
    if len(parts) < 5:
        raise ValueError(f"not a maps line: {line!r}")
    start_s, _, end_s = parts[0].partition("-")
    start, end = int(start_s, 16), int(end_s, 16)
    if end < start:
        raise ValueError(f"mapping ends before it starts: {line!r}")
    return {
        "start": start,
        "end": end,
        "perms": parts[1],
        "offset": int(parts[2], 16),
        "dev": parts[3],
        "inode": int(parts[4]),
        "path": parts[5].strip() if len(parts) > 5 else "",
    }


def is_private_anonymous(mapping):
    """True for the mappings whose pages we dump: private, readable, not backed by a file.

    Anonymous means no inode and either no name, [heap], [stack], [stack:TID] or a name set
    with PR_SET_VMA_ANON_NAME ([anon:...]). Kernel special mappings ([vdso], [vvar],
    [vsyscall], [uprobes]) and memfd/shmem files (which have an inode) are excluded.
    """
    perms = mapping["perms"]
    if len(perms) < 4 or perms[0] != "r" or perms[3] != "p":
        return False
    if mapping["inode"] != 0:
        return False
    path = mapping["path"]
    return (path == "" or path == "[heap]" or path.startswith("[stack")
            or path.startswith("[anon:"))


def decode_pagemap_entry(entry):
    """Splits a 64-bit pagemap entry into its flags (and the PFN, zero when unprivileged)."""
    present = bool(entry & PM_PRESENT)
    swapped = bool(entry & PM_SWAPPED)
    return {
        "present": present,
        "swapped": swapped,
        "file_or_shared": bool(entry & PM_FILE_OR_SHARED_ANON),
        "exclusive": bool(entry & PM_EXCLUSIVE),
        "soft_dirty": bool(entry & PM_SOFT_DIRTY),
        # When swapped, bits 0-54 hold the swap type and offset instead of a PFN.
        "pfn": entry & PM_PFN_MASK if present else 0,
    }


def is_dumpable_entry(entry):
    """A page we copy: resident in RAM (bit 63) and not in swap (bit 62)."""
    return bool(entry & PM_PRESENT) and not entry & PM_SWAPPED


def present_pages(pagemap_bytes, start):
    """Addresses of dumpable pages, given the pagemap bytes for a range starting at `start`."""
    n = len(pagemap_bytes) // 8
    entries = struct.unpack(f"<{n}Q", pagemap_bytes[: n * 8])
    return [start + i * PAGE_SIZE for i, e in enumerate(entries) if is_dumpable_entry(e)]


def select_evenly(items, limit):
    """At most `limit` items spread evenly over `items`, order kept (so a capped dump samples
    every mapping rather than only the lowest addresses)."""
    n = len(items)
    if limit is None or n <= limit:
        return list(items)
    if limit <= 0:
        return []
    return [items[(i * n) // limit] for i in range(limit)]


def runs_of_pages(addrs, max_run_pages=256):
    """Groups sorted page addresses into (start, page_count) runs of consecutive pages."""
    runs = []
    for a in addrs:
        if runs and runs[-1][0] + runs[-1][1] * PAGE_SIZE == a and runs[-1][1] < max_run_pages:
            runs[-1][1] += 1
        else:
            runs.append([a, 1])
    return [tuple(r) for r in runs]


def is_same_filled(page):
    """True when the page is one 8-byte word repeated (zram's same-filled page test)."""
    return page[:8] * (PAGE_SIZE // 8) == page


def page_counts(data):
    """(pages, zero_pages, same_filled_pages) of a buffer of whole pages."""
    zero = bytes(PAGE_SIZE)
    pages = len(data) // PAGE_SIZE
    zeros = same = 0
    for i in range(pages):
        p = data[i * PAGE_SIZE:(i + 1) * PAGE_SIZE]
        if p == zero:
            zeros += 1
            same += 1
        elif is_same_filled(p):
            same += 1
    return pages, zeros, same


# ---------------------------------------------------------------------------------------------
# Dumping a live process


def read_maps(pid):
    with open(f"/proc/{pid}/maps") as f:
        return [parse_maps_line(line) for line in f if line.strip()]


def dump_process(pid, max_pages=None):
    """Returns (page bytes, details) of the resident private anonymous pages of `pid`."""
    maps = read_maps(pid)
    details = {"mappings_total": len(maps), "mappings_anonymous": 0, "pages_present": 0,
               "pages_swapped": 0, "pages_not_present": 0, "pages_unreadable": 0}
    addrs = []
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        for m in maps:
            if not is_private_anonymous(m):
                continue
            details["mappings_anonymous"] += 1
            npages = (m["end"] - m["start"]) // PAGE_SIZE
            raw = os.pread(pm.fileno(), npages * 8, (m["start"] // PAGE_SIZE) * 8)
            entries = struct.unpack(f"<{len(raw) // 8}Q", raw)
            for i, e in enumerate(entries):
                if e & PM_SWAPPED:
                    details["pages_swapped"] += 1
                elif e & PM_PRESENT:
                    addrs.append(m["start"] + i * PAGE_SIZE)
                else:
                    details["pages_not_present"] += 1
    details["pages_present"] = len(addrs)
    chosen = select_evenly(addrs, max_pages)
    out = bytearray()
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for start, count in runs_of_pages(chosen):
            try:
                out += os.pread(fd, count * PAGE_SIZE, start)
            except OSError:
                # A run with an unreadable page (e.g. a guard page): retry page by page.
                for k in range(count):
                    try:
                        page = os.pread(fd, PAGE_SIZE, start + k * PAGE_SIZE)
                    except OSError:
                        page = b""
                    if len(page) == PAGE_SIZE:
                        out += page
                    else:
                        details["pages_unreadable"] += 1
    finally:
        os.close(fd)
    out = bytes(out[: len(out) // PAGE_SIZE * PAGE_SIZE])
    return out, details


def program_command(program, mib, workdir):
    """The argv that runs `program`'s holder, compiling the Java one into `workdir` first."""
    if program == "python":
        return [sys.executable, os.path.join(HERE, "programs", "hold.py"), str(mib)]
    if program == "node":
        node = shutil.which("node") or shutil.which("nodejs")
        if not node:
            raise RuntimeError("node is not installed")
        return [node, os.path.join(HERE, "programs", "hold.js"), str(mib)]
    if program == "java":
        if not shutil.which("javac") or not shutil.which("java"):
            raise RuntimeError("javac/java are not installed")
        subprocess.run(["javac", "-d", workdir, os.path.join(HERE, "programs", "Hold.java")],
                       check=True)
        # A small initial heap so the dump is mostly the program's objects, not untouched
        # heap; the serial collector keeps the JVM to one GC thread on small machines.
        return ["java", "-XX:+UseSerialGC", "-Xms8m", f"-Xmx{max(64, 4 * mib)}m",
                "-cp", workdir, "Hold", str(mib)]
    raise ValueError(f"unknown program {program!r} (one of {', '.join(PROGRAMS)})")


def wait_ready(proc, timeout_s):
    """Waits for a line starting with READY on the program's stdout; returns that line."""
    deadline = time.monotonic() + timeout_s
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stdout], [], [], 1.0)
        if r:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"program exited before READY (status {proc.wait()})")
            buf += chunk
            for line in buf.split(b"\n")[:-1]:
                if line.startswith(b"READY"):
                    return line.decode(errors="replace")
        elif proc.poll() is not None:
            raise RuntimeError(f"program exited before READY (status {proc.returncode})")
    raise TimeoutError(f"no READY within {timeout_s}s")


def write_page_file(path, data, meta):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pages, zeros, same = page_counts(data)
    meta = dict(meta, pages=pages, bytes=pages * PAGE_SIZE, page_size=PAGE_SIZE,
                zero_pages=zeros, same_filled_pages=same, file=os.path.basename(path),
                created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                kernel=platform.release())
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    with open(tmp + ".json", "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    # Page file last, so a present page file always has its sidecar.
    os.replace(tmp + ".json", path + ".json")
    os.replace(tmp, path)
    return meta


def dump_program(program, out, mib):
    """Runs `program`'s holder, dumps at most `mib` MiB of its anonymous pages into `out`."""
    with tempfile.TemporaryDirectory(prefix="pagedump-") as work:
        argv = program_command(program, mib, work)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=work)
        try:
            ready = wait_ready(proc, READY_TIMEOUT_S)
            # Stopped, the program (and its GC/JIT threads) cannot change pages under us.
            os.kill(proc.pid, signal.SIGSTOP)
            data, details = dump_process(proc.pid, max_pages=mib * 1024 * 1024 // PAGE_SIZE)
        finally:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()
    meta = {"source": "pagedump", "program": program, "command": argv, "target_mib": mib,
            "ready_line": ready, "uid": os.getuid(), **details}
    meta = write_page_file(out, data, meta)
    print(f"pagedump: {program}: {meta['pages']} pages ({meta['zero_pages']} zero, "
          f"{meta['same_filled_pages']} same-filled) -> {out}", file=sys.stderr)
    return meta


def mix_page_files(sources, out, run_pages=MIX_RUN_PAGES):
    """Interleaves page files in runs of `run_pages` pages, round robin, until all are used."""
    blobs = []
    for s in sources:
        with open(s, "rb") as f:
            blobs.append(f.read())
    run_bytes = run_pages * PAGE_SIZE
    pos = [0] * len(blobs)
    out_data = bytearray()
    while any(p < len(b) for p, b in zip(pos, blobs)):
        for i, b in enumerate(blobs):
            if pos[i] < len(b):
                out_data += b[pos[i]:pos[i] + run_bytes]
                pos[i] += run_bytes
    meta = {"source": "pagedump", "program": "mixed", "run_pages": run_pages,
            "sources": [os.path.basename(s) for s in sources],
            "command": ["pagedump.py", "--mix"] + [os.path.basename(s) for s in sources]}
    meta = write_page_file(out, bytes(out_data), meta)
    print(f"pagedump: mixed: {meta['pages']} pages -> {out}", file=sys.stderr)
    return meta


def page_file_path(data_dir, program):
    return os.path.join(data_dir, f"pages-{program}.bin")


def sidecar(path):
    """The JSON sidecar of a page file, or {} when the file or its sidecar is missing."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path + ".json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def ensure_data(data_dir=DEFAULT_DATA_DIR, mib=64, programs=PROGRAMS, mixed=True):
    """Makes data/pages-{program}.bin (and pages-mixed.bin) unless present with a sidecar
    saying they were made for `mib` MiB.

    Returns {name: path}. Tests and benchmarks call this so page files exist when needed.
    """
    paths, made = {}, False
    for p in programs:
        path = page_file_path(data_dir, p)
        if sidecar(path).get("target_mib") != mib:
            dump_program(p, path, mib)
            made = True
        paths[p] = path
    if mixed:
        path = page_file_path(data_dir, "mixed")
        if made or not sidecar(path):
            mix_page_files([paths[p] for p in programs], path)
        paths["mixed"] = path
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", choices=PROGRAMS, help="the program to run and dump")
    ap.add_argument("--out", help="page file to write (sidecar: OUT.json)")
    ap.add_argument("--all", action="store_true",
                    help="dump python, node and java into DATA_DIR and make pages-mixed.bin")
    ap.add_argument("--ensure", action="store_true", help="like --all, only for missing files")
    ap.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    ap.add_argument("--mib", type=int, default=64, help="MiB of pages per program (default 64)")
    args = ap.parse_args(argv)
    if args.ensure:
        ensure_data(args.data_dir, args.mib)
    elif args.all:
        paths = [page_file_path(args.data_dir, p) for p in PROGRAMS]
        for p, path in zip(PROGRAMS, paths):
            dump_program(p, path, args.mib)
        mix_page_files(paths, page_file_path(args.data_dir, "mixed"))
    elif args.program:
        dump_program(args.program, args.out or page_file_path(args.data_dir, args.program),
                     args.mib)
    else:
        ap.error("give --program NAME [--out PATH], --all or --ensure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
