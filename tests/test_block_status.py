"""Structured replies and block status (`base:allocation`) through real clients: `nbdinfo
--map` sees data, holes and zero-filled pages where they were written; `qemu-img map` tells
data from zeroes; `nbdcopy` and `qemu-img convert` copy a sparse image out reading only its
data pages (the server's `num_reads`) and produce identical bytes.

Every page the store holds is either a hole that reads as zeroes (never written, trimmed,
zeroed, or written with zeroes) or data (anything else, including a page same-filled with a
non-zero byte): see docs/nbd.md."""
import json
import os
import random

from conftest import PAGE, file_sha256, need, qemu_io, run

MiB = 1 << 20
SIZE = 64 * MiB


def write_layout(uri):
    """Writes, on a fresh 64 MiB device:
    [0, 1M) data (0x5a: same-filled, not zero), [1M, 2M) unwritten, [2M, 3M) written with
    zeroes, [3M, 4M) unwritten, [4M, 5M) data then [4M+256K, 4M+512K) discarded, [5M, 6M)
    data (0x33) then its first half WRITE_ZEROES, the rest unwritten."""
    qemu_io(uri, "write -P 0x5a 0 1M", "write -P 0 2M 1M", "write -P 0x11 4M 1M",
            "discard 4352k 256k", "write -P 0x33 5M 1M", "write -z 5M 512k")


# (offset, length, is data) of write_layout, merged.
LAYOUT = [
    (0, 1 * MiB, True),
    (1 * MiB, 3 * MiB, False),
    (4 * MiB, 256 << 10, True),
    (4 * MiB + (256 << 10), 256 << 10, False),
    (4 * MiB + (512 << 10), 512 << 10, True),
    (5 * MiB, 512 << 10, False),
    (5 * MiB + (512 << 10), 512 << 10, True),
    (6 * MiB, SIZE - 6 * MiB, False),
]


def nbdinfo_map(uri, *args):
    return json.loads(run(["nbdinfo", "--map", "--json", *args, uri]).stdout)


def test_nbdinfo_map_shows_data_holes_and_zeroes(start_server):
    need("nbdinfo", "qemu-io")
    srv = start_server(str(SIZE))
    write_layout(srv.uri)
    extents = nbdinfo_map(srv.uri)
    got = [(e["offset"], e["length"], e["type"]) for e in extents]
    want = [(o, n, 0 if data else 3) for o, n, data in LAYOUT]
    assert got == want, f"nbdinfo --map:\n{json.dumps(extents, indent=1)}"
    for e in extents:
        assert e["description"] == ("data" if e["type"] == 0 else "hole,zero"), e

    # --totals: how much of the device is data and how much is hole,zero.
    totals = {t["type"]: t["size"] for t in nbdinfo_map(srv.uri, "--totals")}
    data = sum(n for _, n, d in LAYOUT if d)
    assert totals == {0: data, 3: SIZE - data}, totals


def test_nbdinfo_map_of_an_empty_device_is_one_hole(start_server):
    need("nbdinfo")
    srv = start_server(str(SIZE))
    assert [(e["offset"], e["length"], e["type"]) for e in nbdinfo_map(srv.uri)] == [(0, SIZE, 3)]


def test_qemu_img_map_tells_data_from_zeroes(start_server):
    need("qemu-img", "qemu-io")
    srv = start_server(str(SIZE))
    write_layout(srv.uri)
    for uri in (srv.uri, srv.qemu_uri):
        got = json.loads(run(["qemu-img", "map", "--output=json", "-f", "raw", uri]).stdout)
        merged = []
        for m in got:
            assert m["present"] is True
            # qemu: NBD_STATE_HOLE clear = data; NBD_STATE_ZERO = zero.
            assert m["data"] != m["zero"], m
            if merged and merged[-1][2] == m["data"] and merged[-1][0] + merged[-1][1] == m["start"]:
                merged[-1] = (merged[-1][0], merged[-1][1] + m["length"], m["data"])
            else:
                merged.append((m["start"], m["length"], m["data"]))
        assert merged == LAYOUT, f"qemu-img map {uri}:\n{json.dumps(got, indent=1)}"


def sparse_image(path, seed=7):
    """A 64 MiB sparse file: 40 runs of 1-16 pages of random bytes at random places (and a
    page at the very end); holes everywhere else. Returns the indexes of the data pages."""
    rng = random.Random(seed)
    pages = set()
    with open(path, "wb") as f:
        f.truncate(SIZE)
        runs = [(rng.randrange(SIZE // PAGE - 16), rng.randint(1, 16)) for _ in range(40)]
        runs.append((SIZE // PAGE - 1, 1))
        for first, n in runs:
            f.seek(first * PAGE)
            f.write(rng.randbytes(n * PAGE))
            pages.update(range(first, first + n))
    return pages


def test_nbdcopy_skips_holes_in_and_out(start_server, tmp_path):
    need("nbdcopy")
    src = tmp_path / "sparse.img"
    pages = sparse_image(src)
    data_pages = len(pages)
    srv = start_server(str(SIZE))

    run(["nbdcopy", "--flush", str(src), srv.uri])
    st = srv.stat()
    # Only the data pages were written: nbdcopy found the file's holes and zeroed (or skipped)
    # them on the device instead of writing zero pages.
    assert srv.stat_value("num_writes") == data_pages, st

    out = tmp_path / "out.img"
    run(["nbdcopy", srv.uri, str(out)])
    assert os.path.getsize(out) == SIZE
    assert file_sha256(out) == file_sha256(src), "the copy out differs from the image copied in"
    # Block status told nbdcopy where the holes are. It reads in requests of 256 KiB (its
    # default --request-size) and reads a whole request that holds any data: so it read the
    # requests with data pages in them and skipped the rest (without block status it reads
    # all 16384 pages).
    per_request = (256 << 10) // PAGE
    with_data = len({p // per_request for p in pages}) * per_request
    reads = srv.stat_value("num_reads")
    assert data_pages <= reads <= with_data, (reads, data_pages, with_data)
    assert reads < SIZE // PAGE // 4, reads
    # And the copy is sparse again (nbdcopy punched or skipped the holes in the file).
    assert os.stat(out).st_blocks * 512 < SIZE // 2, os.stat(out)
    for k in ("failed_reads", "failed_writes", "invalid_io"):
        assert srv.stat_value(k) == 0, k


def test_qemu_img_convert_reads_only_data_and_is_identical(start_server, tmp_path):
    need("qemu-img", "nbdcopy")
    src = tmp_path / "sparse.img"
    data_pages = len(sparse_image(src, seed=11))
    srv = start_server(str(SIZE))
    run(["nbdcopy", str(src), srv.uri])
    reads_before = srv.stat_value("num_reads")

    out = tmp_path / "converted.raw"
    run(["qemu-img", "convert", "-f", "raw", "-O", "raw", srv.qemu_uri, str(out)])
    assert os.path.getsize(out) == SIZE
    assert file_sha256(out) == file_sha256(src), "qemu-img convert's copy differs"
    # qemu-img convert asked for block status and read the data pages only (it may read
    # a little around them: it works in clusters, up to 64 KiB here).
    reads = srv.stat_value("num_reads") - reads_before
    assert data_pages <= reads <= data_pages + 41 * 16, (reads, data_pages)
    assert reads < SIZE // PAGE // 4, (reads, SIZE // PAGE)
