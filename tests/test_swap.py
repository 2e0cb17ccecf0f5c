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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from conftest import need, need_root, run, wait_for

MiB = 1 << 20
WORKLOAD_MIB = 192
CGROUP_LIMIT = 64 * MiB
DEVICE = "512M"
HERE = os.path.dirname(os.path.abspath(__file__))


def memory_cgroup_parent():
    """(directory, version) where a memory cgroup can be made, or (None, reason)."""
    v1 = "/sys/fs/cgroup/memory"
    if os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
        return v1, 1
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        try:
            with open(os.path.join(root, "cgroup.subtree_control")) as f:
                if "memory" in f.read().split():
                    return root, 2
        except OSError:
            pass
    return None, "no cgroup v1 memory controller and no cgroup v2 tree with memory enabled"


def write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def swap_used_kib(dev):
    """Used KiB of `dev` in /proc/swaps (0 if absent)."""
    real = os.path.realpath(dev)
    with open("/proc/swaps") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts and os.path.realpath(parts[0]) == real:
                return int(parts[3])
    return 0




def remove_cgroup(path: str) -> bool:
    """Removes a memory cgroup whose tasks have exited (the kernel may take a moment to let
    go of it); whether it is gone."""
    for _ in range(50):
        try:
            os.rmdir(path)
            return True
        except OSError:
            time.sleep(0.1)
    return False


def kill_pid(proc):
    if proc is not None and proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def test_kernel_swaps_to_compcache(start_server, record_property):
    need_root("swapon, losetup, FUSE mounts and memory cgroups need root")
    need("nbdfuse", "losetup", "fusermount3", "mkswap", "swapon", "swapoff")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    cg_parent, cg_version = memory_cgroup_parent()
    if cg_parent is None:
        pytest.skip(cg_version)

    srv = start_server(DEVICE, "--mlock")
    mnt = tempfile.mkdtemp(prefix="compcache-swap-")
    fuse_file = os.path.join(mnt, "compcache")
    fuse = loop = workload = None
    swap_on = False
    cgroup = os.path.join(cg_parent, f"compcache-test-{uuid.uuid4().hex[:8]}")
    cgroup_made = False
    steps = []
    try:
        fuse = subprocess.Popen(["nbdfuse", fuse_file, srv.uri], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: os.path.exists(fuse_file) and os.path.getsize(fuse_file) > 0
                 or fuse.poll() is not None, "nbdfuse to mount")
        assert fuse.poll() is None, f"nbdfuse exited: {fuse.stdout.read().decode()}"
        steps.append("nbdfuse")

        p = run(["losetup", "--find", "--show", "--direct-io=on", fuse_file], check=False)
        direct_io = p.returncode == 0
        if not direct_io:
            p = run(["losetup", "--find", "--show", fuse_file])
        loop = p.stdout.strip()
        assert loop.startswith("/dev/loop"), p.stdout
        steps.append(f"losetup {loop} direct-io={'on' if direct_io else 'off'}")
        record_property("loop_direct_io", direct_io)
        print(f"loop device {loop}, direct I/O {'on' if direct_io else 'off (fallback)'}")

        run(["mkswap", loop])
        run(["swapon", "-p", "32767", loop])
        swap_on = True
        steps.append("swapon")

        os.mkdir(cgroup)
        cgroup_made = True
        if cg_version == 1:
            write(os.path.join(cgroup, "memory.limit_in_bytes"), CGROUP_LIMIT)
            try:
                write(os.path.join(cgroup, "memory.swappiness"), 100)
            except OSError:
                pass
        else:
            write(os.path.join(cgroup, "memory.max"), CGROUP_LIMIT)
        steps.append(f"cgroup v{cg_version} {cgroup}")
        procs = os.path.join(cgroup, "cgroup.procs")

        workload = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "swap_workload.py"), str(WORKLOAD_MIB)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            # Only the workload joins the limited cgroup (before it execs); the server and
            # nbdfuse stay where pytest is.
            preexec_fn=lambda: write(procs, os.getpid()))
        # The server must not be limited with the workload, and its memory is locked.
        with open(f"/proc/{srv.proc.pid}/cgroup") as f:
            assert os.path.basename(cgroup) not in f.read()
        with open(f"/proc/{srv.proc.pid}/status") as f:
            vmlck = [int(l.split()[1]) for l in f if l.startswith("VmLck:")]
        assert vmlck and vmlck[0] > 0, "compcache serve --mlock should lock its memory"
        lines, swapped_kib, stats_at_fill = [], 0, None
        deadline = time.monotonic() + 300
        for line in workload.stdout:
            lines.append(line.rstrip())
            if line.startswith("FILLED"):
                swapped_kib = swap_used_kib(loop)
                stats_at_fill = srv.stat()
            if time.monotonic() > deadline:
                break
        rc = workload.wait(timeout=60)
        out = "\n".join(lines)
        assert rc == 0, f"workload exited {rc} (SIGKILL -9 means the OOM killer):\n{out}"
        assert f"VERIFIED {WORKLOAD_MIB * MiB // 4096}" in out, out
        print(f"swap used at fill: {swapped_kib} KiB; server stats at fill: {stats_at_fill}")
        assert swapped_kib > 0, "nothing was swapped to our device"

        num_writes = srv.stat_value("num_writes")
        orig = max(srv.stat_value("orig_data_size"),
                   (stats_at_fill or {}).get("orig_data_size", 0))
        assert num_writes > 0 and orig > 0, "swap-out did not reach compcache"
        assert srv.stat_value("num_reads") > 0, "swap-in did not reach compcache"
        for k in ("failed_reads", "failed_writes"):
            assert srv.stat_value(k) == 0
        assert srv.alive()
    finally:
        errors = []
        kill_pid(workload)
        if cgroup_made and not remove_cgroup(cgroup):
            errors.append(f"could not remove {cgroup}")
        if swap_on:
            p = run(["swapoff", loop], check=False, timeout=300)
            if p.returncode:
                errors.append(f"swapoff {loop}: {p.stderr}")
        if loop:
            p = run(["losetup", "-d", loop], check=False)
            if p.returncode:
                errors.append(f"losetup -d {loop}: {p.stderr}")
        if fuse is not None:
            p = run(["fusermount3", "-u", mnt], check=False)
            try:
                fuse.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_pid(fuse)
                run(["fusermount3", "-uz", mnt], check=False)
            fuse.stdout.close()
        shutil.rmtree(mnt, ignore_errors=True)
        print("set up:", "; ".join(steps))
        if errors:
            print("teardown problems:", errors)
    assert not errors, errors
