"""fio job text for its nbd engine (libnbd inside fio; Debian's fio 3.33 has it, see
`fio --enghelp=nbd`): one place for the integration tests (tests/conftest.py) and the soak
(bench/soak.py)."""


def fio_global(uri, job_mib, jobs):
    """fio's [global] section for `jobs` NBD connections to `uri`, each on its own `job_mib`
    region, any verification error fatal."""
    return f"""[global]
ioengine=nbd
uri={uri}
size={job_mib}m
offset_increment={job_mib}m
numjobs={jobs}
group_reporting=1
verify_fatal=1
randrepeat=0
"""


def fio_verify_job(name, rw, iodepth):
    """A fio job `name` that writes (`rw`) and then reads back and checks every block it
    wrote (crc32c)."""
    return f"""[{name}]
rw={rw}
iodepth={iodepth}
verify=crc32c
do_verify=1
"""


# A fio job that, after the jobs before it, reads everything back and checks it is zeroes.
FIO_ZEROES_JOB = """[zeroes]
stonewall
rw=read
bs=64k
iodepth=8
verify=pattern
verify_pattern=0x00
verify_only=1
"""
