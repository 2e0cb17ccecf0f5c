"""Unit tests for pagedump's parsing of /proc/PID/maps and /proc/PID/pagemap, and one small
end-to-end dump of a live child process. Run: python3 -m pytest tools/pagedump"""
import json
import os
import struct
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pagedump as pd  # noqa: E402

PAGE = pd.PAGE_SIZE


def test_maps_line_anonymous_unnamed():
    m = pd.parse_maps_line("7f0a1c000000-7f0a1c021000 rw-p 00000000 00:00 0 \n")
    assert m == {"start": 0x7F0A1C000000, "end": 0x7F0A1C021000, "perms": "rw-p", "offset": 0,
                 "dev": "00:00", "inode": 0, "path": ""}
    assert pd.is_private_anonymous(m)


def test_maps_line_with_path_containing_spaces():
    m = pd.parse_maps_line(
        "55d0c0a00000-55d0c0a21000 r--p 00001000 fd:01 1234567    /opt/my app/lib x.so\n")
    assert m["path"] == "/opt/my app/lib x.so"
    assert m["offset"] == 0x1000 and m["inode"] == 1234567 and m["dev"] == "fd:01"
    assert not pd.is_private_anonymous(m), "file-backed mappings are skipped"


@pytest.mark.parametrize("line,dump", [
    ("5600-7000 rw-p 00000000 00:00 0 [heap]", True),
    ("7ffd0000-7ffe0000 rw-p 00000000 00:00 0 [stack]", True),
    ("7ffd0000-7ffe0000 rw-p 00000000 00:00 0 [stack:1234]", True),
    ("7f00-8000 rw-p 00000000 00:00 0 [anon:v8 heap]", True),
    ("7f00-8000 r--p 00000000 00:00 0 [vvar]", False),
    ("7f00-8000 r-xp 00000000 00:00 0 [vdso]", False),
    ("ff600000-ff601000 --xp 00000000 00:00 0 [vsyscall]", False),
    ("7f00-8000 rw-s 00000000 00:05 42 /dev/zero (deleted)", False),   # shared anonymous
    ("7f00-8000 rw-s 00000000 00:01 77 /memfd:x (deleted)", False),     # memfd
    ("7f00-8000 ---p 00000000 00:00 0 ", False),                        # guard: unreadable
    ("7f00-8000 rw-p 00002000 08:01 99 /usr/lib/libc.so.6", False),     # private file COW
])
def test_which_mappings_are_dumped(line, dump):
    assert pd.is_private_anonymous(pd.parse_maps_line(line)) is dump


def test_malformed_maps_lines_are_rejected():
    with pytest.raises(ValueError):
        pd.parse_maps_line("garbage")
    with pytest.raises(ValueError):
        pd.parse_maps_line("9000-8000 rw-p 00000000 00:00 0")


def test_pagemap_entry_bits():
    e = pd.decode_pagemap_entry((1 << 63) | (1 << 56) | (1 << 55) | 0x1234)
    assert e == {"present": True, "swapped": False, "file_or_shared": False, "exclusive": True,
                 "soft_dirty": True, "pfn": 0x1234}
    swapped = pd.decode_pagemap_entry((1 << 62) | (5 << 5) | 3)
    assert swapped["swapped"] and not swapped["present"] and swapped["pfn"] == 0
    unprivileged = pd.decode_pagemap_entry(1 << 63)  # PFN hidden from non-root readers
    assert unprivileged["present"] and unprivileged["pfn"] == 0
    assert pd.decode_pagemap_entry(1 << 61)["file_or_shared"]


def test_present_pages_skips_swapped_and_absent():
    entries = [1 << 63, 0, 1 << 62, (1 << 63) | 7, (1 << 63) | (1 << 61)]
    raw = struct.pack("<5Q", *entries)
    assert pd.present_pages(raw, 0x10000) == [0x10000, 0x10000 + 3 * PAGE, 0x10000 + 4 * PAGE]
    assert pd.present_pages(raw[:-3], 0) == [0, 3 * PAGE], "a partial trailing entry is ignored"


def test_select_evenly_and_runs():
    items = list(range(100))
    assert pd.select_evenly(items, None) == items
    assert pd.select_evenly(items, 200) == items
    sel = pd.select_evenly(items, 10)
    assert sel == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert pd.select_evenly(items, 0) == []
    addrs = [0, PAGE, 2 * PAGE, 10 * PAGE, 11 * PAGE, 20 * PAGE]
    assert pd.runs_of_pages(addrs) == [(0, 3), (10 * PAGE, 2), (20 * PAGE, 1)]
    assert pd.runs_of_pages([0, PAGE, 2 * PAGE], max_run_pages=2) == [(0, 2), (2 * PAGE, 1)]


def test_page_counts_zero_and_same_filled():
    data = bytes(PAGE) + b"\x01\x02\x03\x04\x05\x06\x07\x08" * (PAGE // 8) + os.urandom(PAGE)
    assert pd.page_counts(data) == (3, 1, 2)


def test_mix_interleaves_runs_round_robin(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"".join(bytes([1]) * PAGE for _ in range(3)))
    b.write_bytes(bytes([2]) * PAGE)
    out = tmp_path / "m.bin"
    meta = pd.mix_page_files([str(a), str(b)], str(out), run_pages=2)
    data = out.read_bytes()
    assert [data[i * PAGE] for i in range(4)] == [1, 1, 2, 1]
    assert meta["pages"] == 4
    assert json.loads((tmp_path / "m.bin.json").read_text())["sources"] == ["a.bin", "b.bin"]


def test_dump_of_a_live_child_finds_its_pages(tmp_path):
    """A child fills 4 MiB with a marker; the dump must contain those pages verbatim."""
    code = ("import sys\n"
            "buf = bytearray(b'PAGEDUMP-MARKER!' * (4 << 16))\n"
            "print('READY', flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        pd.wait_ready(proc, 60)
        data, details = pd.dump_process(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    marker_page = b"PAGEDUMP-MARKER!" * (PAGE // 16)
    hits = sum(1 for i in range(len(data) // PAGE) if data[i * PAGE:(i + 1) * PAGE] == marker_page)
    assert hits >= 1000, f"only {hits} of ~1024 marker pages found"
    assert details["pages_present"] * PAGE == len(data)
    assert details["pages_unreadable"] == 0


def test_sidecar_missing_or_broken_is_empty(tmp_path):
    f = tmp_path / "pages-x.bin"
    assert pd.sidecar(str(f)) == {}
    f.write_bytes(bytes(PAGE))
    assert pd.sidecar(str(f)) == {}, "a page file without its sidecar is remade"
    (tmp_path / "pages-x.bin.json").write_text("{not json")
    assert pd.sidecar(str(f)) == {}
    meta = pd.write_page_file(str(f), bytes(PAGE) * 2, {"target_mib": 1})
    assert pd.sidecar(str(f))["target_mib"] == 1 and meta["zero_pages"] == 2
