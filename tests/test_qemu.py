"""qemu-img and qemu-io against the export: unaligned writes and reads with pattern
verification, FUA, flush, write-zeroes and discard. qemu-io exits non-zero when a pattern
check or an I/O fails; the output is checked as well."""
import json

from conftest import need, qemu_io, run

MiB = 1 << 20


def test_qemu_img_info(server):
    need("qemu-img")
    for uri in (server.uri, server.qemu_uri):
        info = json.loads(run(["qemu-img", "info", "--output=json", uri]).stdout)
        assert info["virtual-size"] == 256 * MiB
        assert info["format"] == "raw"


def test_unaligned_writes_read_back(server):
    need("qemu-io")
    u = server.uri
    qemu_io(u, "write -P 0xab 1000 5000", "read -P 0xab 1000 5000",
            "read -P 0 0 1000", "read -P 0 6000 8192")
    # A 2-byte write across a page boundary inside the first write (read-modify-write of
    # two pages), then everything around it is unchanged.
    qemu_io(u, "write -P 0xcd 4095 2", "read -P 0xab 1000 3095", "read -P 0xcd 4095 2",
            "read -P 0xab 4097 1903", "read -P 0 6000 4096")
    # Large unaligned write spanning many pages, with FUA, via the other URI spelling.
    qemu_io(server.qemu_uri, "write -f -P 0x5a 1234567 3000000", "flush",
            "read -P 0x5a 1234567 3000000", "read -P 0 1230000 4567",
            "read -P 0 4234567 10000")
    # Data written by earlier connections is still there.
    qemu_io(u, "read -P 0xab 1000 3095", "read -P 0x5a 1234567 3000000")


def test_last_bytes_of_device(server):
    need("qemu-io")
    end = 256 * MiB
    qemu_io(server.uri, f"write -P 0x77 {end - 5000} 5000", f"read -P 0x77 {end - 5000} 5000",
            f"read -P 0 {end - 9096} 4096")
    # Beyond the end is refused, and the refusal changes nothing.
    p = run(["qemu-io", "-f", "raw", server.uri, "-c", f"write -P 0x11 {end - 4096} 8192"],
            check=False)
    assert p.returncode != 0 or "error" in (p.stdout + p.stderr).lower()
    qemu_io(server.uri, f"read -P 0x77 {end - 5000} 5000")


def test_discard_and_write_zeroes_read_zeroes(server):
    need("qemu-io")
    u = server.uri
    # A one-byte pattern makes same-filled pages: stored as a fill word, counted in
    # orig_data_size and same_pages.
    qemu_io(u, f"write -P 0x3c 0 {4 * MiB}")
    assert server.stat_value("orig_data_size") == 4 * MiB
    assert server.stat_value("same_pages") == 1024
    # Whole-page discard: the pages read as zeroes and leave the store.
    qemu_io(u, f"discard {MiB} {MiB}", f"read -P 0 {MiB} {MiB}",
            f"read -P 0x3c 0 {MiB}", f"read -P 0x3c {2 * MiB} {2 * MiB}")
    assert server.stat_value("orig_data_size") == 3 * MiB
    assert server.stat_value("notify_free") >= 256
    # Unaligned write-zeroes (with and without unmap): exactly that range reads zero.
    qemu_io(u, f"write -z {2 * MiB + 1000} 10000", f"read -P 0 {2 * MiB + 1000} 10000",
            f"read -P 0x3c {2 * MiB} 1000", f"read -P 0x3c {2 * MiB + 11000} 5000",
            f"write -z -u {3 * MiB} {64 * 1024}", f"read -P 0 {3 * MiB} {64 * 1024}",
            f"read -P 0x3c {3 * MiB + 64 * 1024} 4096")
    # An unaligned discard may keep partial pages (discard is advisory) but must never
    # damage data outside its range.
    qemu_io(u, "discard 100 5000", "read -P 0x3c 0 100", "read -P 0x3c 5100 3092")
