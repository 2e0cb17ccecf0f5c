"""Parsers for what the kernel, the tools and our programs print. Pure functions, unit-tested."""

from __future__ import annotations

import json
import os
import re

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'512M', '1.5G', '4k', '4096', '16MiB' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtb]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 1G, 4k)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def format_size(nbytes: int) -> str:
    """Bytes -> the shortest exact binary-unit string: 4096 -> '4k', 1<<30 -> '1g'."""
    for unit, mult in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if nbytes % mult == 0 and nbytes >= mult:
            return f"{nbytes // mult}{unit}"
    return str(nbytes)


def parse_proc_swaps(text: str) -> list[dict]:
    """/proc/swaps -> [{filename, type, size_kib, used_kib, priority}]."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 5:
            continue
        out.append(
            {"filename": f[0], "type": f[1], "size_kib": int(f[2]), "used_kib": int(f[3]), "priority": int(f[4])}
        )
    return out


ZRAM_MM_STAT_FIELDS = (
    "orig_data_size",
    "compr_data_size",
    "mem_used_total",
    "mem_limit",
    "mem_used_max",
    "same_pages",
    "pages_compacted",
    "huge_pages",
    "huge_pages_since",
)


def parse_zram_mm_stat(text: str) -> dict:
    """/sys/block/zramN/mm_stat -> dict with zram's field names (older kernels print fewer)."""
    vals = [int(v) for v in text.split()]
    return dict(zip(ZRAM_MM_STAT_FIELDS, vals))


def parse_block_stat(text: str) -> dict:
    """/sys/block/DEV/stat -> completed reads and writes (I/Os) and sectors."""
    f = [int(v) for v in text.split()]
    return {"num_reads": f[0], "read_sectors": f[2], "num_writes": f[4], "write_sectors": f[6]}


def parse_flat_keyed(text: str) -> dict:
    """'key value' lines (memory.stat, memory.oom_control, memory.events) -> {key: int}."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 2:
            try:
                out[f[0]] = int(f[1])
            except ValueError:
                pass
    return out


_SCAN_RE = re.compile(r"^scan\s+(.*)$", re.M)


def parse_scan_output(text: str) -> dict:
    """The summary line of tools/scan -> dict (numbers converted)."""
    m = _SCAN_RE.search(text)
    if not m:
        raise ValueError("no 'scan ...' summary line in output")
    out = {}
    for tok in m.group(1).split():
        k, _, v = tok.partition("=")
        for conv in (int, float):
            try:
                out[k] = conv(v)
                break
            except ValueError:
                continue
        else:
            out[k] = v
    return out


def parse_fio_json(text: str) -> dict:
    """fio --output-format=json of one job -> {read_bw_bytes, write_bw_bytes, bw_bytes, ...}.

    bw_bytes is the throughput of the direction the job did (the sum if both), so one number
    describes each iozone-style test. fio may print warnings before the JSON; skip them."""
    m = re.search(r"^\{", text, re.M)
    if not m:
        raise ValueError("no JSON object in fio output")
    data, _ = json.JSONDecoder().raw_decode(text[m.start():])
    job = data["jobs"][0]
    rd, wr = job["read"], job["write"]
    return {
        "read_bw_bytes": rd["bw_bytes"],
        "write_bw_bytes": wr["bw_bytes"],
        "bw_bytes": rd["bw_bytes"] + wr["bw_bytes"],
        "read_io_bytes": rd["io_bytes"],
        "write_io_bytes": wr["io_bytes"],
        "runtime_ms": max(rd.get("runtime", 0), wr.get("runtime", 0)),
        "error": job.get("error", 0),
        "fio_version": data.get("fio version", ""),
    }


def compression_ratio(stats: dict) -> float | None:
    """orig_data_size / mem_used_total, the seed's measure (memory actually used, with
    allocator overhead, not just compressed bytes). None when nothing is stored."""
    orig = stats.get("orig_data_size")
    used = stats.get("mem_used_total")
    if not orig or not used:
        return None
    return orig / used


def parse_proc_status_kib(text: str, key: str = "VmRSS") -> int | None:
    """/proc/PID/status -> value of KEY in KiB."""
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def parse_proc_io(text: str) -> dict:
    """/proc/PID/io ('rchar: N' lines) -> {key: int}."""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and v.strip().isdigit():
            out[k.strip()] = int(v)
    return out


# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice,
# in clock ticks. Busy: user, nice, system, irq, softirq (guest time is inside user already).
BUSY_FIELDS = (0, 1, 2, 5, 6)


def parse_proc_stat_busy_s(stat_text: str) -> float | None:
    """Seconds every CPU together was busy since boot, from /proc/stat's text; None if it has
    no "cpu" line."""
    for line in stat_text.splitlines():
        f = line.split()
        if f and f[0] == "cpu":
            ticks = [int(x) for x in f[1:]]
            return sum(ticks[i] for i in BUSY_FIELDS if i < len(ticks)) / os.sysconf("SC_CLK_TCK")
    return None
