"""Cache mode (`compcache serve --origin IMAGE`, docs/cache.md): compcache as a compressed RAM
cache in front of a disk image, driven by real clients. Every comparison reads the image
directly (the file, not through the cache) while or after the server runs.

- the export has the image's size (nbdinfo); the ready line, `compcache stat` and its --json
  say it is a cache of the image and show the cache's counters;
- reads: `qemu-img compare` of the export with the image, twice: the first pass reads the
  origin, the second is served from the cache (hits, no origin reads) when the budget holds it;
  sequential reads read ahead, and `--readahead 0` turns that off;
- writes: qemu-io writes (unaligned, FUA, flush, write-zeroes, discard) through the cache are
  on the image at once (write-through), and a re-read of what was written hits the cache
  (updated, not invalidated); each FUA write and each flush is one sync of the origin
  (`origin_syncs`), a plain write none;
- fio with verify=crc32c through NBD with a budget far below the data (evictions), then
  `qemu-img compare` with the image; the budget holds;
- kill -9 of the server in the middle of a write-through workload (each write acknowledged,
  its content logged by the client): every acknowledged write is on the image; a new server
  on the same image then starts (the lock died with the process) and serves it;
- refused starts: a second server on the same image ("in use"), a missing image, an image
  that is not whole pages, `--size` other than the image's, `--backing` with `--origin`: one
  error line, a non-zero exit, nothing left behind (no socket, the image unchanged);
- as root: ext4 on the cache device through nbdfuse + loop: a copy of /usr/share/doc written,
  the file system unmounted and mounted again (its page cache dropped), every file read back
  through the cache and compared by checksum, `fsck.ext4 -fn` clean; then the image itself,
  read directly: fsck clean and the same checksums.

Servers are started and always stopped by fixtures (conftest.py); mounts, loop devices and
nbdfuse are torn down in `finally`. Skips say why (not root, a tool missing).
"""
import hashlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading

import pytest

from conftest import (Server, fio_global, nbdfuse_loop, need, need_fio_nbd, need_root, qemu_io, run,
                      run_fio, wait_for)

MiB = 1 << 20
PAGE = 4096


def make_image(path, size, seed=1):
    """A disk image of `size` bytes whose pages all differ: text pages (compressible) and
    random pages alternate, so a page read from the wrong place or a stale page shows."""
    rng = __import__("random").Random(seed)
    with open(path, "wb") as f:
        for i in range(size // PAGE):
            if i % 3 == 2:
                f.write(rng.randbytes(PAGE))
            else:
                line = f"page {i:08d} of a compcache test image, seed {seed}\n".encode()
                f.write((line * (PAGE // len(line) + 1))[:PAGE])
    return str(path)


@pytest.fixture
def image(tmp_path):
    """A 32 MiB image in the test's directory."""
    return make_image(tmp_path / "origin.img", 32 * MiB)


def cache_server(start_server, image, *extra):
    """A ready `compcache serve --origin IMAGE` (no --size: the image's)."""
    return start_server(None, "--origin", image, *extra)


def compare(srv, image):
    """`qemu-img compare` of the image read directly with the export: identical or the test
    fails with qemu-img's first difference."""
    p = run(["qemu-img", "compare", "-U", "-f", "raw", "-F", "raw", image, srv.uri], check=False, timeout=600)
    assert p.returncode == 0, f"the export differs from the image:\n{p.stdout}{p.stderr}"


def read_image(image, offset, length):
    with open(image, "rb") as f:
        f.seek(offset)
        return f.read(length)


def test_the_export_is_the_image_and_stat_says_it_is_a_cache(start_server, image, compcache_bin):
    need("nbdinfo")
    srv = cache_server(start_server, image, "--mem-limit", "16M")
    assert f"cache of {image}" in srv.ready_line, srv.ready_line
    assert int(run(["nbdinfo", "--size", srv.uri]).stdout) == os.path.getsize(image)
    st = srv.stat()
    assert st["disksize"] == os.path.getsize(image)
    assert st["mem_limit"] == 16 * MiB
    assert st["origin"] == image
    for key in ("cache_hits", "cache_misses", "cache_inserts", "cache_evictions", "origin_reads",
                "origin_read_bytes", "origin_writes", "origin_write_bytes", "origin_syncs",
                "readahead_used", "readahead_wasted", "orig_data_size", "compr_data_size",
                "mem_used_total"):
        assert key in st, f"`compcache stat --json` has no {key}"
    table = run([compcache_bin, "stat", "--control", srv.control]).stdout
    assert "CACHE OF" in table and image in table and "HIT%" in table, table
    assert "cache_hits" in table and "mem_used_total" in table, table


def test_reads_are_the_images_and_the_second_pass_hits(start_server, image):
    need("qemu-img")
    pages = os.path.getsize(image) // PAGE
    # A budget that holds the whole (compressed) image: nothing is evicted.
    srv = cache_server(start_server, image, "--mem-limit", "64M")
    compare(srv, image)
    first = srv.stat()
    assert first["cache_misses"] > 0 and first["origin_reads"] > 0, first
    assert first["origin_read_bytes"] >= pages * PAGE, "every page came from the origin once"
    assert first["cache_inserts"] >= pages, first
    compare(srv, image)
    second = srv.stat()
    assert second["origin_read_bytes"] == first["origin_read_bytes"], "the second pass read the origin"
    assert second["cache_hits"] - first["cache_hits"] >= pages, (first, second)
    assert second["cache_evictions"] == 0
    assert second["mem_used_total"] <= 64 * MiB
    assert second["failed_reads"] == 0


def test_sequential_reads_read_ahead_unless_turned_off(start_server, image):
    need("qemu-io")
    srv = cache_server(start_server, image, "--mem-limit", "64M")
    qemu_io(srv.uri, *[f"read {o} 64k" for o in range(0, 4 * MiB, 64 * 1024)])
    st = srv.stat()
    assert st["readahead_pages"] > 0, "a sequential reader got no readahead"
    assert st["readahead_used"] > 0, st
    # The window grows: fewer origin reads than the reader's 64 requests.
    assert st["origin_reads"] < 64, st


def test_no_readahead_with_readahead_0(start_server, tmp_path):
    need("qemu-io")
    image = make_image(tmp_path / "ra0.img", 8 * MiB)
    srv = cache_server(start_server, image, "--mem-limit", "64M", "--readahead", "0")
    qemu_io(srv.uri, *[f"read {o} 64k" for o in range(0, 4 * MiB, 64 * 1024)])
    st = srv.stat()
    assert st["readahead_pages"] == 0, st
    assert st["origin_reads"] == 64, "one origin read per missed request"
    assert st["cache_misses"] == 4 * MiB // PAGE


def test_writes_reach_the_image_and_stay_cached(start_server, image):
    need("qemu-io", "qemu-img")
    srv = cache_server(start_server, image, "--mem-limit", "64M")
    # Cache the first 16 MiB first, so that the writes below meet cached pages, which must be
    # updated (a stale cached page would show in the reads through the cache).
    qemu_io(srv.uri, f"read 0 {16 * MiB}")
    before = srv.stat()
    qemu_io(srv.uri, "write -P 0xab 1000 5000", "write -f -P 0x5a 1234567 3000000", "flush",
            f"write -z {8 * MiB} {MiB}", f"discard {12 * MiB} {MiB}", "write -P 0xcd 4095 2",
            f"write -f -P 0x11 {20 * MiB} {MiB}")
    after_writes = srv.stat()
    assert after_writes["origin_writes"] > before["origin_writes"]
    assert after_writes["origin_write_bytes"] >= 5000 + 3000000 + MiB
    assert after_writes["failed_writes"] == 0
    assert after_writes["origin_syncs"] - before["origin_syncs"] >= 3, "two FUA writes and a flush"
    # Through the cache: the new bytes, and the re-read of what was written costs the origin
    # nothing (the cache was updated, not just invalidated).
    qemu_io(srv.uri, "read -P 0xab 1000 3095", "read -P 0xcd 4095 2", "read -P 0xab 4097 1903",
            "read -P 0x5a 1234567 3000000", f"read -P 0 {8 * MiB} {MiB}", f"read -P 0x11 {20 * MiB} {MiB}")
    reread = srv.stat()
    assert reread["origin_read_bytes"] == after_writes["origin_read_bytes"], \
        "re-reading written pages read the origin: the cache was not updated by the writes"
    # On the image itself, read directly while the server runs (write-through).
    assert read_image(image, 1000, 3095) == b"\xab" * 3095
    assert read_image(image, 4095, 2) == b"\xcd" * 2
    assert read_image(image, 1234567, 3000000) == b"\x5a" * 3000000
    assert read_image(image, 8 * MiB, MiB) == bytes(MiB)
    assert read_image(image, 20 * MiB, MiB) == b"\x11" * MiB
    compare(srv, image)


def test_fua_and_flush_reach_the_origin_and_plain_writes_do_not(start_server, image):
    """`origin_syncs` counts the origin's fdatasyncs: each FUA write and each FLUSH is one, a
    plain write none. qemu-io runs with `-t writeback`: its default cache mode, writethrough,
    sends every write with FUA. It flushes once when it closes the export (qemu 7.2, whatever
    was written), so each session's count is compared with a session that only reads."""
    need("qemu-io")
    srv = cache_server(start_server, image, "--mem-limit", "64M")

    def syncs_of(*cmds):
        before = srv.stat_value("origin_syncs")
        qemu_io(["-t", "writeback", "-f", "raw", srv.uri], *cmds)
        return srv.stat_value("origin_syncs") - before

    assert srv.stat_value("origin_syncs") == 0, "a new server synced its origin"
    close = syncs_of("read 0 4k")
    assert close <= 1, f"a session that only read cost {close} syncs"
    plain = syncs_of(*[f"write -P 0x22 {i * 64}k 4k" for i in range(4)])
    assert plain == close, f"four plain writes cost {plain - close} syncs"
    fua = syncs_of(*[f"write -f -P 0x23 {i * 64}k 4k" for i in range(3)])
    assert fua == 3 + close, f"three FUA writes cost {fua - close} syncs"
    flushes = syncs_of(*[c for i in range(3) for c in (f"write -P 0x24 {i * 64}k 4k", "flush")])
    assert flushes == 3 + close, f"three writes and three flushes cost {flushes - close} syncs"
    st = srv.stat()
    assert st["origin_errors"] == 0 and st["failed_writes"] == 0, st
    assert read_image(image, 2 * 64 * 1024, 4096) == b"\x24" * 4096


def test_fio_verifies_through_a_cache_far_smaller_than_the_data(start_server, tmp_path):
    need_fio_nbd()
    need("qemu-img")
    jobs, job_mib = 4, 12
    image = make_image(tmp_path / "fio.img", jobs * job_mib * MiB)
    srv = cache_server(start_server, image, "--mem-limit", "8M")
    fio_jobs, _, _ = run_fio(tmp_path, "cache-rw", fio_global(srv.uri, job_mib, jobs) + """
[randwrite-verify]
rw=randwrite
bssplit=4k/50:8k/20:64k/20:256k/10
iodepth=8
verify=crc32c
do_verify=1
buffer_compress_percentage=50
""", timeout=600)
    for name, j in fio_jobs.items():
        assert j["error"] == 0, f"fio job {name} error {j['error']}"
        assert j["read"]["io_bytes"] >= j["write"]["io_bytes"] > 0
    st = srv.stat()
    assert st["cache_evictions"] > 0, "48 MiB through an 8 MiB budget evicted nothing"
    assert st["mem_used_max"] <= 8 * MiB, f"the cache went over its budget: {st['mem_used_max']}"
    assert st["failed_writes"] == 0 and st["failed_reads"] == 0
    compare(srv, image)


# --- kill -9 in the middle of a write-through workload ---------------------------------

NBD_REQUEST_MAGIC = 0x25609513
NBD_SIMPLE_REPLY_MAGIC = 0x67446698
NBD_CMD_WRITE, NBD_CMD_FLUSH, NBD_CMD_DISC = 1, 3, 2
NBD_CMD_FLAG_FUA = 1


class NbdClient:
    """The smallest NBD client: fixed newstyle, NBD_OPT_GO, simple replies, one request at a
    time (so that "acknowledged" is exact)."""

    def __init__(self, path, name="compcache"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(path)
        self.s = s
        hello = self._recv(18)
        assert hello[:16] == b"NBDMAGICIHAVEOPT", hello
        s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
        data = struct.pack(">I", len(name)) + name.encode() + struct.pack(">H", 0)
        s.sendall(b"IHAVEOPT" + struct.pack(">II", 7, len(data)) + data)  # NBD_OPT_GO
        while True:
            _, _, rtype, rlen = struct.unpack(">QIII", self._recv(20))
            body = self._recv(rlen)
            if rtype == 1:  # NBD_REP_ACK
                break
            if rtype == 3 and struct.unpack(">H", body[:2])[0] == 0:  # NBD_INFO_EXPORT
                self.size = struct.unpack(">Q", body[2:10])[0]
            assert rtype < (1 << 31), f"NBD_OPT_GO refused: {rtype:#x} {body!r}"
        self.handle = 0

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
        return buf

    def request(self, cmd, offset=0, data=b"", flags=0):
        """Sends one request and waits for its reply; raises unless it succeeded."""
        self.handle += 1
        self.s.sendall(struct.pack(">IHHQQI", NBD_REQUEST_MAGIC, flags, cmd, self.handle, offset, len(data)) + data)
        magic, error, handle = struct.unpack(">IIQ", self._recv(16))
        assert magic == NBD_SIMPLE_REPLY_MAGIC and handle == self.handle, (magic, handle)
        if error:
            raise OSError(error, f"NBD error {error}")

    def close(self):
        try:
            self.s.sendall(struct.pack(">IHHQQI", NBD_REQUEST_MAGIC, 0, NBD_CMD_DISC, 0, 0, 0))
        except OSError:
            pass
        self.s.close()


def write_content(page, seq, offset_in_page, length):
    """What write number `seq` puts at `offset_in_page` of `page`: bytes that name both."""
    tag = struct.pack("<QQ", page, seq)
    return (tag * (length // len(tag) + 1))[:length]


def test_kill_9_loses_no_acknowledged_write(start_server, image, compcache_bin):
    """A client rewrites pages of the image through the cache (whole pages, partial pages,
    some with FUA, a FLUSH now and then), one request at a time, logging each write once it is
    acknowledged; the server is killed with SIGKILL while it runs. Every acknowledged write
    must be on the image; the one write in flight may be there whole, in part (whole pages), or
    not at all."""
    size = os.path.getsize(image)
    region_pages = 512  # 2 MiB rewritten over and over: the same pages many times
    srv = cache_server(start_server, image, "--mem-limit", "1M")  # small: evictions too
    model = bytearray(read_image(image, 0, region_pages * PAGE))
    rest = hashlib.sha256(read_image(image, region_pages * PAGE, size)).digest()
    acked = []  # (offset, data), in order
    in_flight = [None]
    stop = threading.Event()
    ended = []

    def client():
        rng = __import__("random").Random(7)
        c = NbdClient(srv.socket)
        assert c.size == size
        try:
            seq = 0
            while not stop.is_set():
                seq += 1
                page = rng.randrange(region_pages)
                kind = rng.random()
                if kind < 0.5:  # whole pages
                    n = rng.choice((1, 1, 2, 8))
                    n = min(n, region_pages - page)
                    offset, data = page * PAGE, b"".join(write_content(page + k, seq, 0, PAGE) for k in range(n))
                else:  # part of a page (read-modify-write in the cache)
                    start = rng.randrange(PAGE - 1)
                    length = rng.randrange(1, PAGE - start + 1)
                    offset, data = page * PAGE + start, write_content(page, seq, start, length)
                flags = NBD_CMD_FLAG_FUA if rng.random() < 0.2 else 0
                in_flight[0] = (offset, data)
                c.request(NBD_CMD_WRITE, offset, data, flags)
                acked.append((offset, data))
                in_flight[0] = None
                if seq % 50 == 0:
                    c.request(NBD_CMD_FLUSH)
        except (OSError, ConnectionError, AssertionError) as e:
            ended.append(repr(e))
        finally:
            c.close()

    t = threading.Thread(target=client, daemon=True)
    t.start()
    wait_for(lambda: len(acked) >= 3000 or not t.is_alive(), "3000 acknowledged writes", timeout=300)
    assert t.is_alive(), f"the client stopped before the kill: {ended}"
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(timeout=30)
    t.join(timeout=60)
    stop.set()
    assert not t.is_alive()
    assert ended, "the client saw no error although the server was killed"

    for offset, data in acked:
        model[offset:offset + len(data)] = data
    on_disk = read_image(image, 0, region_pages * PAGE)
    pending = in_flight[0]
    allowed = {}
    if pending is not None:
        offset, data = pending
        after = bytearray(model)
        after[offset:offset + len(data)] = data
        for p in range(offset // PAGE, (offset + len(data) - 1) // PAGE + 1):
            allowed[p] = bytes(after[p * PAGE:(p + 1) * PAGE])
    lost = [p for p in range(region_pages)
            if on_disk[p * PAGE:(p + 1) * PAGE] != model[p * PAGE:(p + 1) * PAGE]
            and on_disk[p * PAGE:(p + 1) * PAGE] != allowed.get(p)]
    assert not lost, f"{len(lost)} pages do not hold their last acknowledged write (first: page {lost[0]}) " \
                     f"after {len(acked)} acknowledged writes"
    # Nothing outside the region changed.
    assert hashlib.sha256(read_image(image, region_pages * PAGE, size)).digest() == rest

    # The lock died with the process: a new server on the same image starts and serves it.
    need("qemu-img")
    again = cache_server(start_server, image, "--mem-limit", "16M")
    compare(again, image)


# --- refused starts --------------------------------------------------------------------


def refused(compcache_bin, *args):
    """Runs `compcache serve ARGS` in a fresh directory expecting it to refuse to start; returns
    its one error line after checking that it exited non-zero, printed nothing else and left
    nothing behind in the directory (no socket, no control socket)."""
    d = tempfile.mkdtemp(prefix="compcache-refused-")
    try:
        sock = os.path.join(d, "nbd.sock")
        p = subprocess.run([compcache_bin, "serve", "--socket", sock, *map(str, args)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        assert p.returncode != 0, f"compcache serve {args} started:\n{p.stdout}{p.stderr}"
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, f"not one error line:\n{p.stderr}"
        assert p.stdout == "", p.stdout
        assert os.listdir(d) == [], f"left behind: {os.listdir(d)}"
        return lines[0]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_second_server_on_the_same_image_is_refused(start_server, image, compcache_bin):
    first = cache_server(start_server, image, "--mem-limit", "16M")
    digest = hashlib.sha256(read_image(image, 0, os.path.getsize(image))).digest()
    line = refused(compcache_bin, "--origin", image)
    assert "in use" in line and image in line, line
    assert first.alive()
    assert hashlib.sha256(read_image(image, 0, os.path.getsize(image))).digest() == digest


def test_a_missing_or_misshapen_origin_is_one_clear_error(tmp_path, compcache_bin):
    missing = tmp_path / "missing.img"
    line = refused(compcache_bin, "--origin", missing)
    assert str(missing) in line and "does not exist" in line, line
    assert not missing.exists(), "a missing origin was created"

    odd = tmp_path / "odd.img"
    odd.write_bytes(b"x" * (10 * PAGE + 100))
    line = refused(compcache_bin, "--origin", odd)
    assert str(odd) in line and "multiple of 4096" in line, line
    assert odd.stat().st_size == 10 * PAGE + 100, "the origin was changed"

    img = make_image(tmp_path / "sized.img", MiB)
    line = refused(compcache_bin, "--origin", img, "--size", "2M")
    assert "--size" in line and "differs from the size of --origin" in line, line
    line = refused(compcache_bin, "--origin", img, "--backing", tmp_path / "b.img")
    assert "--origin and --backing cannot be combined" in line, line
    assert not (tmp_path / "b.img").exists()
    line = refused(compcache_bin, "--origin", img, "--mem-limit", "0")
    assert "memory budget" in line, line
    if os.geteuid() != 0:
        unreadable = make_image(tmp_path / "unreadable.img", MiB)
        os.chmod(unreadable, 0)
        line = refused(compcache_bin, "--origin", unreadable)
        assert unreadable in line, line


def test_size_equal_to_the_origins_is_accepted(start_server, tmp_path):
    img = make_image(tmp_path / "sized.img", MiB)
    srv = cache_server(start_server, img, "--size", "1M", "--mem-limit", "4M")
    assert srv.stat()["disksize"] == MiB


# --- a real file system on the cache (root) ----------------------------------------------


def tree_checksums(root):
    """{relative path: sha256} of every regular file under `root`."""
    sums = {}
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            if os.path.isfile(path) and not os.path.islink(path):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                sums[os.path.relpath(path, root)] = h.hexdigest()
    return sums


def ext4_round_trip(dev, mnt, stat, budget):
    """mkfs.ext4 on `dev`, a copy of /usr/share/doc written, unmounted and mounted again (the
    file system's page cache dropped: the read-back comes through the device), every file read
    back and compared by checksum, `fsck.ext4 -fn` clean. `stat()` is the server's statistics.
    Returns the checksums written."""
    run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev], timeout=300)
    mounted = False
    try:
        run(["mount", dev, mnt])
        mounted = True
        run(["cp", "-a", DOC, os.path.join(mnt, "doc")], timeout=900)
        written = tree_checksums(os.path.join(mnt, "doc"))
        assert len(written) > 100, f"only {len(written)} files copied"
        run(["sync", "-f", mnt])
        run(["umount", mnt])
        mounted = False
        before = stat()
        run(["mount", dev, mnt])
        mounted = True
        back = tree_checksums(os.path.join(mnt, "doc"))
        after = stat()
        assert back == written, f"{sum(back.get(k) != v for k, v in written.items())} files differ after the read-back"
        assert after["num_reads"] - before["num_reads"] >= sum(
            os.path.getsize(os.path.join(mnt, "doc", k)) for k in back) // PAGE // 2, \
            "the read-back did not reach compcache (served from a page cache?)"
        assert after["cache_hits"] > before["cache_hits"], "the read-back never hit the cache"
        assert after["mem_used_max"] <= budget
        assert after["failed_reads"] == 0 and after["failed_writes"] == 0
        print("read-back:", {k: after[k] - before[k] for k in ("cache_hits", "cache_misses", "origin_reads",
                                                               "cache_evictions", "readahead_used")})
        run(["umount", mnt])
        mounted = False
    finally:
        if mounted:
            run(["umount", mnt], check=False)
    p = run(["fsck.ext4", "-fn", dev], check=False, timeout=600)
    assert p.returncode == 0, f"fsck.ext4 -fn through the cache: {p.returncode}\n{p.stdout}{p.stderr}"
    return written


def check_image_holds(image, written, mnt):
    """The image itself, read directly with the server gone: a clean file system holding the
    files written (write-through: the cache held nothing the image lacks)."""
    p = run(["fsck.ext4", "-fn", image], check=False, timeout=600)
    assert p.returncode == 0, f"fsck.ext4 -fn of the image: {p.returncode}\n{p.stdout}{p.stderr}"
    loop, mounted = None, False
    try:
        loop = run(["losetup", "--find", "--show", "--read-only", image]).stdout.strip()
        run(["mount", "-o", "ro,noload", loop, mnt])
        mounted = True
        assert tree_checksums(os.path.join(mnt, "doc")) == written, "the image differs from what was written"
    finally:
        if mounted:
            run(["umount", mnt], check=False)
        if loop:
            run(["losetup", "-d", loop], check=False)


DOC = "/usr/share/doc"
# A budget below the tree (well over 100 MiB, partly compressed files already): the read-back
# is served from the cache and from the origin.
EXT4_BUDGET = 48 * MiB
EXT4_IMAGE = 512 * MiB


def need_ext4_tools():
    need_root("FUSE mounts, loop devices and mount need root")
    need("losetup", "mkfs.ext4", "fsck.ext4", "mount", "umount")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse (modprobe fuse)")
    if not os.path.isdir(DOC):
        pytest.skip(f"no {DOC} to copy")


def sparse_image(path, size):
    """An empty (sparse) image: the file system is made through the cache."""
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def test_ext4_on_the_cache_through_nbdfuse_and_loop(start_server, tmp_path):
    need_ext4_tools()
    need("nbdfuse", "fusermount3")
    image = sparse_image(tmp_path / "ext4.img", EXT4_IMAGE)
    srv = cache_server(start_server, image, "--mem-limit", EXT4_BUDGET)
    mnt = tempfile.mkdtemp(prefix="compcache-cache-mnt-")
    try:
        # Leaving the block detaches the loop device (a failure fails the test) and unmounts
        # nbdfuse, before the server stops.
        with nbdfuse_loop(srv.uri, prefix="compcache-cache-fuse-") as dev:
            written = ext4_round_trip(dev.loop, mnt, srv.stat, EXT4_BUDGET)
        srv.stop()
        check_image_holds(image, written, mnt)
    finally:
        shutil.rmtree(mnt, ignore_errors=True)


def test_ext4_on_the_cache_through_compcache_fuse(compcache_bin, tmp_path):
    """The same through `compcache fuse --origin`: the store's own FUSE file on a loop device,
    whose fsync (the loop driver's FLUSH) is the origin's fdatasync."""
    need_ext4_tools()
    from test_fuse import FuseServer
    image = sparse_image(tmp_path / "ext4.img", EXT4_IMAGE)
    mnt = tempfile.mkdtemp(prefix="compcache-cache-mnt-")
    srv = None
    try:
        # --size may repeat the origin's size (FuseServer passes one).
        srv = FuseServer(compcache_bin, tmp_path, EXT4_IMAGE, "--origin", image, "--mem-limit", EXT4_BUDGET)
        assert srv.loop, f"no loop device: {srv.ready}"
        assert f"cache of {image}" in srv.log(), srv.log()
        written = ext4_round_trip(srv.loop, mnt, srv.stat, EXT4_BUDGET)
        assert srv.stop() == 0, srv.log()
        srv = None
        check_image_holds(image, written, mnt)
    finally:
        if srv is not None:
            srv.stop()
        shutil.rmtree(mnt, ignore_errors=True)
