"""fio with its nbd engine (libnbd inside fio: fio-3.33 on Debian has it, see
`fio --enghelp=nbd`), every job its own NBD connection. Random writes are verified with
crc32c, at 4 KiB and at mixed block sizes, with numjobs=4 (four concurrent connections, each on
its own region); a trim workload is verified by reading trimmed regions back as zeroes.
fio exits non-zero on any verification error (verify_fatal)."""
import pytest

from conftest import FIO_ZEROES_JOB, fio_global, need_fio_nbd, run_fio

MiB = 1 << 20
JOB_MIB = 12
JOBS = 4


def fio(tmp_path, uri, name, body):
    jobs, _, _ = run_fio(tmp_path, name, fio_global(uri, JOB_MIB, JOBS) + body, timeout=240)
    for jobname, j in jobs.items():
        assert j["error"] == 0, f"fio job {jobname} error {j['error']}"
    return jobs


@pytest.fixture
def fio_server(start_server):
    need_fio_nbd()
    return start_server(f"{JOB_MIB * JOBS}M")


def test_random_write_verify_4k(fio_server, tmp_path):
    jobs = fio(tmp_path, fio_server.uri, "rw4k", """
[randwrite-4k]
rw=randwrite
bs=4k
iodepth=16
verify=crc32c
do_verify=1
""")
    j = jobs["randwrite-4k"]
    assert j["write"]["io_bytes"] == JOBS * JOB_MIB * MiB
    assert j["read"]["io_bytes"] == j["write"]["io_bytes"], "every written block is verified"
    # fio's buffers are random: every page is stored, none is same-filled.
    assert fio_server.stat_value("orig_data_size") == JOBS * JOB_MIB * MiB
    assert fio_server.stat_value("same_pages") == 0
    assert fio_server.stat_value("failed_writes") == 0


def test_random_write_verify_mixed_sizes(fio_server, tmp_path):
    jobs = fio(tmp_path, fio_server.uri, "rwmixed", """
[randwrite-mixed]
rw=randwrite
bssplit=512/10:4k/40:8k/15:12k/10:64k/15:256k/10
iodepth=8
verify=crc32c
do_verify=1
buffer_compress_percentage=60
buffer_compress_chunk=512
""")
    j = jobs["randwrite-mixed"]
    assert j["read"]["io_bytes"] >= j["write"]["io_bytes"] > 0
    assert fio_server.stat_value("failed_writes") == 0
    assert fio_server.stat_value("invalid_io") == 0


def test_trim_workload(fio_server, tmp_path):
    # 1. Trim-then-write mix (iodepth 1: a trim and the write that follows it at the same
    #    offset are not reordered), verified; 2. trim everything at random; 3. read it all
    #    back as zeroes with a pattern check.
    jobs = fio(tmp_path, fio_server.uri, "trim", """
[trimwrite]
rw=randtrimwrite
bs=4k
iodepth=1
verify=crc32c
do_verify=1
[trim-all]
stonewall
rw=randtrim
bs=16k
iodepth=8
""" + FIO_ZEROES_JOB)
    assert jobs["trimwrite"]["trim"]["io_bytes"] > 0
    assert jobs["trim-all"]["trim"]["io_bytes"] == JOBS * JOB_MIB * MiB
    assert jobs["zeroes"]["read"]["io_bytes"] == JOBS * JOB_MIB * MiB
    assert fio_server.stat_value("orig_data_size") == 0
    assert fio_server.stat_value("notify_free") > 0
