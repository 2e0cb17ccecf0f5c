"""The backing tier on a block device (docs/backing.md, "The backing device holds other
processes' memory"), with a loop device over a sparse file in a private directory:

- the server takes the device as its backing device, pages spill to it (their bytes are on
  the device) and read back identical;
- the data area is discarded when the server opens the device (stale bytes are gone) and
  again when it exits (nothing written through the server is left on the device);
- one server per device: a second one is refused while the first runs (the kernel's
  O_EXCL claim, EBUSY), with a message saying so, and the first one's data stays intact;
- a symbolic link to the device, owned by root or this user, is followed; a link to a
  regular file, or one owned by another user, is refused and its target left untouched;
- a --backing-size larger than the device is refused.

Root only (loop devices); skipped with the reason when not root or without loop support.
Every loop device is detached in the fixture's teardown, also when the test fails. Nothing
here enables swap, so the host-swap lock is not needed.
"""
import os
import shutil
import subprocess
import tempfile

import pytest

from conftest import file_sha256, need, need_root, run

MiB = 1 << 20
PAGE = 4096
SUPERBLOCK = 4096
SIGNATURE = b"compcache backing device"
LOOP_BYTES = 64 * MiB
DATA_MIB = 16
# The server's memory limit: with --backing-incompressible every incompressible page goes
# straight to the device anyway; the limit keeps the rest off RAM as well.
MEM_LIMIT = "2M"


class Loop:
    """A loop device over a sparse file in a private (0700) directory of its own."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="compcache-blockdev-")
        self.file = os.path.join(self.dir, "loop.img")
        self.dev = None

    def attach(self, stale=b""):
        """Makes the file (with `stale` bytes written into its data area at a few places,
        as an earlier user of the device would have left them) and attaches it."""
        with open(self.file, "wb") as f:
            f.truncate(LOOP_BYTES)
            for off in (SUPERBLOCK, 5 * MiB + 123, 40 * MiB - 7):
                if stale:
                    f.seek(off)
                    f.write(stale)
        p = run(["losetup", "--find", "--show", self.file], check=False, timeout=60)
        if p.returncode != 0:
            pytest.skip(f"no loop device: losetup --find --show failed: {p.stderr.strip()}")
        self.dev = p.stdout.strip()
        return self

    def file_holds(self, needle):
        """How often `needle` stands in the loop device's backing file, after the device's
        dirty pages were written to it (fsync of the device: a non-exclusive open, allowed
        while a server holds the device's O_EXCL claim)."""
        fd = os.open(self.dev, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(self.file, "rb") as f:
            return f.read().count(needle)

    def device_holds(self, needle):
        """How often `needle` reads back from the device itself (its page cache included)."""
        with open(self.dev, "rb") as f:
            return f.read().count(needle)

    def allocated_bytes(self):
        return os.stat(self.file).st_blocks * 512

    def detach(self):
        if self.dev is not None:
            p = run(["losetup", "-d", self.dev], check=False, timeout=60)
            assert p.returncode == 0, f"losetup -d {self.dev}: {p.stderr}"
            self.dev = None
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def loop():
    """An unattached Loop; whatever the test attached is detached after it, pass or fail."""
    need_root("makes loop devices")
    need("losetup")
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("no loop support (/dev/loop-control is missing: modprobe loop)")
    lo = Loop()
    try:
        yield lo
    finally:
        lo.detach()


def marker_pages(path, marker, pages):
    """A file of `pages` incompressible pages, each starting with `marker`."""
    with open(path, "wb") as f:
        for i in range(pages):
            head = marker + b"%08d" % i
            f.write(head + os.urandom(PAGE - len(head)))


def start_on(start_server, backing, *extra):
    return start_server(f"{DATA_MIB}M", "--mem-limit", MEM_LIMIT, "--backing", backing,
                        "--backing-incompressible", *extra)


def refused_start(compcache_bin, backing, *extra):
    """Runs a server on `backing` that must refuse to start; returns its stderr."""
    sock_dir = tempfile.mkdtemp(prefix="compcache-refused-")
    sock = os.path.join(sock_dir, "nbd.sock")
    try:
        p = run([compcache_bin, "serve", "--size", f"{DATA_MIB}M", "--socket", sock, "--control",
                 sock + ".ctl", "--mem-limit", MEM_LIMIT, "--backing", backing, *extra],
                check=False, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a server on {backing} started (still running after 60 s), where it must be refused")
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert p.returncode != 0, f"a server on {backing} started:\n{p.stderr}"
    return p.stderr


# The whole device, and a part of it that is no whole number of sectors; records sealed under
# the run's key (the default) and in plaintext (where the pages' bytes are visible on the
# device, which shows that they really went there).
@pytest.mark.parametrize("backing_size,plaintext", [(None, False), (50_000_000, False), (None, True)])
def test_spills_to_a_block_device_and_leaves_nothing_on_it(loop, start_server, tmp_path, backing_size, plaintext):
    need("nbdcopy")
    stale = b"STALE-" + os.urandom(8).hex().encode()
    loop.attach(stale=stale)
    assert loop.file_holds(stale) == 3

    extra = (["--backing-size", str(backing_size)] if backing_size else []) + (["--backing-plaintext"] if plaintext else [])
    server = start_on(start_server, loop.dev, *extra)
    # Opened: the superblock is written and the data area discarded (stale bytes gone).
    with open(loop.dev, "rb") as f:
        assert f.read(len(SIGNATURE)) == SIGNATURE
    assert loop.file_holds(stale) == 0, "the device's old contents survived the server's start"
    assert server.stat_value("bd_size_bytes") > LOOP_BYTES // 2

    marker = b"compcache-blockdev-marker-" + os.urandom(8).hex().encode() + b"-"
    pages = DATA_MIB * MiB // PAGE
    src = tmp_path / "pages.bin"
    marker_pages(src, marker, pages)
    run(["nbdcopy", "-S", "0", "--flush", str(src), server.uri])
    st = server.stat()
    assert st["bd_writes"] >= pages // 2 and st["bd_count"] >= pages // 2, st
    assert st["bd_errors"] == 0, st
    on_device = loop.file_holds(marker)
    if plaintext:
        # The pages' bytes are on the device (incompressible pages are stored as they are).
        assert on_device == pages, f"{on_device} of {pages} marked pages reached the loop device's file"
    else:
        # Sealed under the run's key: the pages went to the device, their bytes are not there.
        assert on_device == 0, f"{on_device} of {pages} marked pages readable on the device despite encryption"

    out = tmp_path / "out.bin"
    run(["nbdcopy", server.uri, str(out)])
    assert file_sha256(out) == file_sha256(src), "data read back from the block device differs"
    st = server.stat()
    assert st["bd_reads"] >= pages // 2 and st["failed_reads"] == 0 and st["bd_errors"] == 0, st

    server.stop()
    # Closed: the data area was discarded on the way out (BLKDISCARD, which the loop driver
    # turns into punched holes). Neither the file nor the device holds a marked page.
    assert loop.file_holds(marker) == 0, "swapped-out data outlived the server on the device"
    assert loop.device_holds(marker) == 0
    # What stays allocated is the superblock (and what the file system rounds it up to).
    assert loop.allocated_bytes() <= 64 * 1024, f"{loop.allocated_bytes()} bytes still allocated"


def test_a_second_server_on_the_device_is_refused_while_the_first_runs(loop, start_server, compcache_bin, tmp_path):
    need("nbdcopy")
    loop.attach()
    # In plaintext, so that the first server's pages can be seen on the device.
    first = start_on(start_server, loop.dev, "--backing-plaintext")
    marker = b"compcache-first-server-" + os.urandom(8).hex().encode() + b"-"
    src = tmp_path / "pages.bin"
    marker_pages(src, marker, DATA_MIB * MiB // PAGE)
    run(["nbdcopy", "-S", "0", "--flush", str(src), first.uri])
    on_device = loop.file_holds(marker)
    assert on_device > 0

    err = refused_start(compcache_bin, loop.dev)
    assert loop.dev in err and "is in use" in err, err
    # The refused start touched nothing: the first server's pages are still on the device
    # (not discarded) and read back.
    assert loop.file_holds(marker) == on_device
    assert first.alive()
    out = tmp_path / "out.bin"
    run(["nbdcopy", first.uri, str(out)])
    assert file_sha256(out) == file_sha256(src)
    assert first.stat_value("bd_errors") == 0

    # Once the first server is gone, the device is free again.
    first.stop()
    second = start_on(start_server, loop.dev)
    assert second.stat_value("bd_size_bytes") > 0


def test_a_root_owned_link_to_the_device_is_followed(loop, start_server):
    loop.attach()
    link = os.path.join(loop.dir, "by-id-link")
    os.symlink(loop.dev, link)
    assert os.lstat(link).st_uid == os.geteuid()
    server = start_on(start_server, link)
    assert server.stat_value("bd_size_bytes") > LOOP_BYTES // 2
    # It is the device that is in use, under its own name as well.
    with open(loop.dev, "rb") as f:
        assert f.read(len(SIGNATURE)) == SIGNATURE


def test_a_link_to_a_regular_file_is_refused_untouched(loop, compcache_bin):
    loop.attach()  # only for its private directory and the cleanup
    target = os.path.join(loop.dir, "precious")
    with open(target, "wb") as f:
        f.write(os.urandom(8 * MiB))
    before = file_sha256(target)
    link = os.path.join(loop.dir, "link")
    os.symlink(target, link)
    err = refused_start(compcache_bin, link)
    assert "symbolic link" in err and link in err, err
    assert file_sha256(target) == before and os.path.getsize(target) == 8 * MiB


def test_a_link_to_the_device_owned_by_another_user_is_refused(loop, compcache_bin):
    loop.attach()
    os.chmod(loop.dir, 0o755)  # another user's link must be able to stand there
    link = os.path.join(loop.dir, "planted")
    os.symlink(loop.dev, link)
    os.lchown(link, 65534, 65534)
    err = refused_start(compcache_bin, link)
    assert "symbolic link" in err and link in err, err
    with open(loop.dev, "rb") as f:
        assert f.read(len(SIGNATURE)) != SIGNATURE, "the refused start wrote to the device"


def test_a_chain_of_links_through_another_users_link_is_refused(loop, compcache_bin, start_server):
    """Every link on the way must be trusted: this user's link to another user's link to the
    device is as good as the other user's link (which could point anywhere)."""
    loop.attach()
    os.chmod(loop.dir, 0o755)
    planted = os.path.join(loop.dir, "planted")
    os.symlink(loop.dev, planted)
    os.lchown(planted, 65534, 65534)
    ours = os.path.join(loop.dir, "ours")
    os.symlink(planted, ours)
    err = refused_start(compcache_bin, ours)
    assert "symbolic link" in err and ours in err, err
    with open(loop.dev, "rb") as f:
        assert f.read(len(SIGNATURE)) != SIGNATURE, "the refused start wrote to the device"
    # A chain of trusted links (as /dev/disk/by-* to /dev/mapper ones) is followed.
    os.lchown(planted, os.geteuid(), os.getegid())
    server = start_on(start_server, ours)
    assert server.stat_value("bd_size_bytes") > LOOP_BYTES // 2


def test_a_backing_size_beyond_the_device_is_refused(loop, compcache_bin):
    loop.attach()
    err = refused_start(compcache_bin, loop.dev, "--backing-size", str(LOOP_BYTES))
    assert loop.dev in err and "usable bytes" in err, err
