"""The host kernel swaps to compcache.

compcache serve (with --mlock, outside any limited cgroup) -> nbdfuse exposes the export as
a file -> losetup makes it a block device (direct I/O when the kernel and FUSE allow it) ->
mkswap, swapon -p 32767 (only this device) -> a workload in a 64 MiB memory cgroup fills
192 MiB of anonymous memory with page-number-derived contents and verifies it all. The pages
must have gone through swap, i.e. through compcache: its stats show writes and stored data.

Everything set up is torn down in `finally`, also when the test fails: the workload and
nbdfuse are killed by PID, the cgroup removed, swapoff, losetup -d, fusermount3 -u; the server
is stopped by the fixture afterwards.

Needs root, nbdfuse, losetup, fusermount3, mkswap, swapon/swapoff, /dev/fuse, a loop device
and a memory cgroup controller (v1 at /sys/fs/cgroup/memory, or v2 with memory enabled).
"""
import os

import pytest

from conftest import nbdfuse_loop, need, need_memory_cgroup, need_root, run, run_swap_workload

MiB = 1 << 20
WORKLOAD_MIB = 192
CGROUP_LIMIT = 64 * MiB
DEVICE = "512M"


def test_kernel_swaps_to_compcache(start_server, record_property):
    need_root("swapon, losetup, FUSE mounts and memory cgroups need root")
    need("nbdfuse", "losetup", "fusermount3", "mkswap", "swapon", "swapoff")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    cg_parent, cg_version = need_memory_cgroup()

    srv = start_server(DEVICE, "--mlock")
    swap_on = False
    steps, errors = [], []
    try:
        with nbdfuse_loop(srv.uri, prefix="compcache-swap-") as dev:
            loop, direct_io = dev.loop, dev.direct_io
            steps.append("nbdfuse")
            steps.append(f"losetup {loop} direct-io={'on' if direct_io else 'off'}")
            record_property("loop_direct_io", direct_io)
            print(f"loop device {loop}, direct I/O {'on' if direct_io else 'off (fallback)'}")
            try:
                run(["mkswap", loop])
                run(["swapon", "-p", "32767", loop])
                swap_on = True
                steps.append("swapon")

                def started(cgroup):
                    steps.append(f"cgroup v{cg_version} {cgroup}")
                    # The server must not be limited with the workload, and its memory is locked.
                    with open(f"/proc/{srv.proc.pid}/cgroup") as f:
                        assert os.path.basename(cgroup) not in f.read()
                    with open(f"/proc/{srv.proc.pid}/status") as f:
                        vmlck = [int(l.split()[1]) for l in f if l.startswith("VmLck:")]
                    assert vmlck and vmlck[0] > 0, "compcache serve --mlock should lock its memory"

                at_fill = {}
                w = run_swap_workload(cg_parent, cg_version, "compcache-test", loop,
                                      mib=WORKLOAD_MIB, limit=CGROUP_LIMIT, started=started,
                                      filled=lambda: at_fill.update(srv.stat()), timeout=300)
                if not w.cgroup_removed:
                    errors.append(f"could not remove {w.cgroup}")
                print(f"swap used at fill: {w.swapped_kib} KiB; server stats at fill: {at_fill or None}")
                assert w.swapped_kib > 0, "nothing was swapped to our device"

                num_writes = srv.stat_value("num_writes")
                orig = max(srv.stat_value("orig_data_size"), at_fill.get("orig_data_size", 0))
                assert num_writes > 0 and orig > 0, "swap-out did not reach compcache"
                assert srv.stat_value("num_reads") > 0, "swap-in did not reach compcache"
                for k in ("failed_reads", "failed_writes"):
                    assert srv.stat_value(k) == 0
                assert srv.alive()
            finally:
                if swap_on:
                    p = run(["swapoff", loop], check=False, timeout=300)
                    if p.returncode:
                        errors.append(f"swapoff {loop}: {p.stderr}")
            # Reported before nbdfuse_loop's teardown (losetup -d fails while swap is on).
            assert not errors, errors
    finally:
        print("set up:", "; ".join(steps))
        if errors:
            print("teardown problems:", errors)
