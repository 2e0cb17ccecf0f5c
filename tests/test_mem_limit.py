"""--mem-limit: once the compressed store would exceed it, writes fail with ENOSPC (the client
reports an error), data written before the limit still reads back intact, and discarding
frees room for new writes."""
import os

from conftest import file_sha256, need, qemu_io, run

MiB = 1 << 20
LIMIT = 4 * MiB
SIZE = 64 * MiB


def test_writes_fail_with_enospc_and_earlier_data_survives(start_server, page_files, tmp_path):
    need("qemu-io", "nbdcopy")
    srv = start_server(str(SIZE), "--mem-limit", str(LIMIT))
    assert srv.stat_value("mem_limit") == LIMIT

    # 1 MiB of real pages first: well within the limit.
    real = tmp_path / "real.bin"
    with open(page_files["python"], "rb") as f:
        real.write_bytes(f.read(MiB))
    rc, out = qemu_io(srv.uri, f"write -s {real} 0 {MiB}", check=False)
    assert rc == 0, out

    # Then incompressible data, far more than the limit: must fail with ENOSPC.
    rand = tmp_path / "rand.bin"
    rand.write_bytes(os.urandom(SIZE - MiB))
    rc, out = qemu_io(srv.uri, f"write -s {rand} {MiB} {SIZE - MiB}", check=False)
    assert rc != 0 and "No space left on device" in out, out
    assert srv.stat_value("failed_writes") > 0
    assert srv.stat_value("mem_used_total") <= LIMIT

    # The first MiB is intact.
    out_file = tmp_path / "out.bin"
    run(["nbdcopy", srv.uri, str(out_file)])
    assert file_sha256(out_file, MiB) == file_sha256(real)

    # Discarding the random data frees the pool; then writes succeed again.
    rc, out = qemu_io(srv.uri, f"discard {MiB} {SIZE - MiB}", check=False)
    assert rc == 0, out
    rc, out = qemu_io(srv.uri, f"write -P 0x42 {8 * MiB} {MiB}", f"read -P 0x42 {8 * MiB} {MiB}", check=False)
    assert rc == 0 and "failed" not in out, out
    run(["nbdcopy", srv.uri, str(out_file)])
    assert file_sha256(out_file, MiB) == file_sha256(real)


def test_nbdcopy_reports_enospc(start_server, tmp_path):
    need("nbdcopy")
    srv = start_server(str(SIZE), "--mem-limit", str(LIMIT))
    rand = tmp_path / "rand.bin"
    rand.write_bytes(os.urandom(SIZE))
    p = run(["nbdcopy", str(rand), srv.uri], check=False)
    assert p.returncode != 0, "nbdcopy must fail when the device is full"
    assert "No space left on device" in p.stderr or "ENOSPC" in p.stderr, p.stderr
    assert srv.stat_value("mem_used_total") <= LIMIT
    assert srv.alive(), "a full device is not a reason to exit"
