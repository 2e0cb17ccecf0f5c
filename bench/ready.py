"""The servers' `--ready-fd` handshake (`compcache fuse`, and the swap servers `swapon`
starts): the server writes one line, `READY <device> ...`, to the descriptor once its device
is up, and closes it without one if it fails to start. One place for the benchmarks
(bench/device/fio_loop.py) and the tests (tests/test_fuse.py)."""

import os
import select
import time


def read_ready_line(fd: int, timeout_s: float = 120) -> bytes:
    """Reads the server's line from the pipe's read end `fd` and closes it. Returns the line
    with its newline, or what came before the server closed the pipe or `timeout_s` passed
    (b"" if nothing): the caller checks for `READY `."""
    line = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            if select.select([fd], [], [], 0.5)[0]:
                chunk = os.read(fd, 256)
                if not chunk:
                    break
                line += chunk
    finally:
        os.close(fd)
    return line
