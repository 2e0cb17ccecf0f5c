"""bench/device/fio_loop.py's and fuse_trace.py's pure parts: the fio job, fio's JSON turned into
IOPS and latency percentiles, the medians over rounds, the ratios against zram, and the
latency breakdown cut from perf's tracepoint text (no root, nothing started)."""

import json

from bench.device import fio_loop, fuse_trace


def fio_json(rw, iops, p50_ns, p99_ns, p999_ns):
    side = {"iops": iops, "bw_bytes": iops * 4096,
            "clat_ns": {"percentile": {"50.000000": p50_ns, "99.000000": p99_ns, "99.900000": p999_ns}}}
    other = {"iops": 0, "bw_bytes": 0}
    job = {"read": side if "read" in rw else other, "write": other if "read" in rw else side}
    # fio may print notes before its JSON.
    return "fio: note\n" + json.dumps({"jobs": [job]})


def test_the_qd1_job_is_synchronous_4k_random_direct_and_timed():
    job = fio_loop.fio_job("/dev/loop7", "randread-qd1", "randread", 1, "psync", "512M", 10)
    lines = set(job.splitlines())
    assert {"filename=/dev/loop7", "ioengine=psync", "direct=1", "rw=randread", "bs=4k", "iodepth=1",
            "time_based=1", "runtime=10"} <= lines
    fill = set(fio_loop.fio_job("/dev/zram3", "fill", "write", 8, "io_uring", "512M", 10).splitlines())
    assert "bs=64k" in fill and not any(line.startswith("runtime") for line in fill)


def test_fio_result_reads_the_percentiles_of_the_right_side():
    r = fio_loop.fio_result(fio_json("randread", 30000, 33000, 70144, 120000), "randread")
    assert r["iops"] == 30000
    assert (r["p50_us"], r["p99_us"], r["p99.9_us"]) == (33.0, 70.144, 120.0)
    w = fio_loop.fio_result(fio_json("randwrite", 5000, 100000, 200000, 400000), "randwrite")
    assert (w["iops"], w["p50_us"]) == (5000, 100.0)


def run(iops32, p50, p99):
    return {"fill_mib_s": 100.0,
            "randread-qd32": {"iops": iops32, "p50_us": 0.0, "p99_us": 0.0, "p99.9_us": 0.0},
            "randread-qd1": {"iops": 1e6 / p50, "p50_us": p50, "p99_us": p99, "p99.9_us": p99 * 2}}


def test_medians_over_rounds_and_ratios_against_zram():
    runs = {"compcache (FUSE)": [run(80000, 30.0, 70.0), run(90000, 10.0, 40.0), run(85000, 12.0, 35.0)],
            "zram (kernel)": [run(170000, 5.0, 7.0), run(180000, 4.0, 6.0), run(175000, 5.0, 6.5)]}
    res = fio_loop.summarize(runs)
    assert res["compcache (FUSE)"]["randread-qd1"]["p50_us"] == 12.0
    assert res["compcache (FUSE)"]["randread-qd32"]["iops"] == 85000
    assert res["zram (kernel)"]["randread-qd1"]["p99_us"] == 6.5
    lines = fio_loop.ratios(res)
    assert lines == ["compcache (FUSE) / zram (kernel): randread-qd32 IOPS 0.49x, randread-qd1 p50 2.4x p99 6.2x"]
    table = fio_loop.table(res, ["randread-qd32", "randread-qd1"])
    assert "| compcache (FUSE) | 12.0 / 40.0 / 80.0 |" in table
    # Without zram in the run there is nothing to compare with.
    assert fio_loop.ratios({"compcache (FUSE)": res["compcache (FUSE)"]}) == []


# One read through loop and FUSE, as `perf script --ns` prints it (fields trimmed), with a
# compile job's unrelated wake-up and a pread of another fio process mixed in.
TRACE = """\
             fio  4000 [000]   100.000000000: syscalls:sys_enter_pread64: fd: 0x00000003, buf: 0x7f, count: 0x00001000, pos: 0x1000
             fio  4000 [000]   100.000001000: block:block_rq_issue: 7,0 R 4096 () 8 + 8 [fio]
             fio  4000 [000]   100.000001500: sched:sched_waking: comm=kworker/u8:3 pid=90 prio=120 target_cpu=001
     kworker/u8:3    90 [001]   100.000004000: workqueue:workqueue_execute_start: work struct 0xff: function loop_rootcg_workfn
     kworker/u8:3    90 [001]   100.000005000: fuse:fuse_request_send: connection 62 req 88 opcode 15 (FUSE_READ) len 80
     kworker/u8:3    90 [001]   100.000005200: sched:sched_waking: comm=fuse-1 pid=501 prio=120 target_cpu=000
          swapper     0 [000]   100.000012000: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=fuse-1 next_pid=501 next_prio=120
          fuse-1   501 [000]   100.000013000: syscalls:sys_exit_read: 0x50
          fuse-1   501 [000]   100.000016000: syscalls:sys_enter_writev: fd: 0x00000007, vec: 0x7f, vlen: 0x00000002
          fuse-1   501 [000]   100.000017000: fuse:fuse_request_end: connection 62 req 88 len 4112 error 0
          fuse-1   501 [000]   100.000017500: block:block_rq_complete: 7,0 R () 8 + 8 [0]
          fuse-1   501 [000]   100.000018000: sched:sched_waking: comm=fio pid=4000 prio=120 target_cpu=001
          swapper     0 [001]   100.000025000: sched:sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=fio pid=4000 next_pid=4000 next_prio=120
             fio  4000 [001]   100.000026000: syscalls:sys_exit_pread64: 0x1000
"""


def test_the_breakdown_cuts_one_read_into_its_stages():
    reads = fuse_trace.breakdown(fuse_trace.parse(TRACE), with_loop=True)
    assert len(reads) == 1
    stages, srv_woken, srv_idle, fio_idle = reads[0]
    us = {k: v / 1000 for k, v in stages.items()}
    assert us == {"submit": 1.0, "loop hop": 3.0, "loop worker": 1.0, "server wake": 8.0, "server work": 3.0,
                  "reply": 1.0, "loop done": 0.5, "wake reader": 8.5, "total": 26.0}
    assert (srv_woken, srv_idle, fio_idle) == (True, True, True)
    assert sum(v for k, v in stages.items() if k != "total") == stages["total"]


def test_a_read_with_a_missing_event_is_left_out():
    # Without the FUSE request (say, its tracepoint is missing) the read cannot be cut.
    text = "\n".join(line for line in TRACE.splitlines() if "fuse_request_send" not in line)
    assert fuse_trace.breakdown(fuse_trace.parse(text), with_loop=True) == []


def test_rounds_alternate_the_order_so_each_device_runs_first_as_often():
    assert fio_loop.run_order(["fuse", "fuse-base"], 4) == ["fuse", "fuse-base", "fuse-base", "fuse", "fuse", "fuse-base", "fuse-base", "fuse"]
    assert fio_loop.run_order(["fuse", "zram", "disk"], 1) == ["fuse", "zram", "disk"]
    assert fio_loop.run_order(["zram"], 0) == ["zram"]
