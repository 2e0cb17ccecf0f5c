"""fio with its nbd engine (libnbd inside fio: fio-3.33 on Debian has it, see
`fio --enghelp=nbd`), every job its own NBD connection. Random writes are verified with
crc32c, at 4 KiB and at mixed block sizes, with numjobs=4 (four concurrent connections, each on
its own region); a trim workload is verified by reading trimmed regions back as zeroes.
fio exits non-zero on any verification error (verify_fatal)."""
import json

import pytest

from conftest import need, run

MiB = 1 << 20
JOB_MIB = 12
JOBS = 4


def fio(tmp_path, uri, name, body):
    job = tmp_path / f"{name}.fio"
    job.write_text(f"""[global]
ioengine=nbd
uri={uri}
size={JOB_MIB}m
offset_increment={JOB_MIB}m
numjobs={JOBS}
group_reporting=1
verify_fatal=1
randrepeat=0
{body}""")
    out = tmp_path / f"{name}.json"
    # cwd: fio leaves its verify state files (*-verify.state) in the working directory.
    p = run(["fio", "--output-format=json", f"--output={out}", str(job)], check=False,
            timeout=240, cwd=tmp_path)
    text = out.read_text() if out.exists() else ""
    assert p.returncode == 0, f"fio {name} failed ({p.returncode}):\n{p.stderr}\n{text[-3000:]}"
    result = json.loads(text[text.index("{"):])
    for j in result["jobs"]:
        assert j["error"] == 0, f"fio job {j['jobname']} error {j['error']}"
    return {j["jobname"]: j for j in result["jobs"]}


@pytest.fixture
def fio_server(start_server):
    need("fio")
    p = run(["fio", "--enghelp=nbd"], check=False)
    if p.returncode != 0 or "uri" not in p.stdout:
        pytest.skip("this fio has no nbd engine")
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
[zeroes]
stonewall
rw=read
bs=64k
iodepth=8
verify=pattern
verify_pattern=0x00
verify_only=1
""")
    assert jobs["trimwrite"]["trim"]["io_bytes"] > 0
    assert jobs["trim-all"]["trim"]["io_bytes"] == JOBS * JOB_MIB * MiB
    assert jobs["zeroes"]["read"]["io_bytes"] == JOBS * JOB_MIB * MiB
    assert fio_server.stat_value("orig_data_size") == 0
    assert fio_server.stat_value("notify_free") > 0
