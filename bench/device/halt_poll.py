"""Run one command with the guest's halt polling set to a value, and put the old value back.

A VM guest whose idle driver is cpuidle-haltpoll halts an idle vCPU at once when
`guest_halt_poll_ns` is 0 (this machine's kernel command line sets it so); waking a task on a
halted vCPU is then an interrupt, a VM exit and a re-entry, and every hand-off of a swap-in
through FUSE and loop pays it (docs/swap.md, "Where a page fault's time goes"). The kernel's
own default is 200000 ns: an idle vCPU polls that long for work before it halts.

This measures what that host setting does to a benchmark; compcache never changes it itself
(it is host-wide, and a provider that sets 0 chose not to burn the host's CPU on idle guests).

    sudo python3 bench/device/halt_poll.py 200000 -- python3 bench/device/fio_loop.py ...

The old value is written back when the command ends, fails or is interrupted.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

PARAM = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"
DRIVER = "/sys/devices/system/cpu/cpuidle/current_driver"


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ns", type=int, help="guest_halt_poll_ns while the command runs")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the command and its arguments")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command given (put it after --)")
    if a.ns < 0:
        ap.error("ns must be 0 or more")
    try:
        driver = read(DRIVER)
        old = read(PARAM)
    except OSError as e:
        print(f"halt_poll: this kernel has no guest halt polling to set ({e.filename}: "
              f"{e.strerror}); it is a VM guest's cpuidle-haltpoll setting", file=sys.stderr)
        return 2
    if driver != "haltpoll":
        print(f"halt_poll: warning: the idle driver is {driver!r}, not haltpoll: "
              f"{PARAM} has no effect here", file=sys.stderr)
    # A SIGTERM would skip the finally below; turn it into an exception that does not.
    old_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        write(PARAM, str(a.ns))
        print(f"halt_poll: {PARAM} {old} -> {a.ns} while the command runs", file=sys.stderr)
        return subprocess.call(cmd)
    finally:
        write(PARAM, old)
        signal.signal(signal.SIGTERM, old_handler)
        print(f"halt_poll: {PARAM} back to {old}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
