"""Clients that stall must not stall anyone else (issue 27), on the real binary with raw
sockets:

- connections that announce the largest WRITEs and send nothing (or a byte at a time), stop
  a byte short of a payload or in the middle of a request header, or never read their READ
  replies (together they fill the whole in-flight budget): a well-behaved client's 1 MiB write
  and read go through at once while they are attached; the server pins no memory for
  payloads that never came; and each of them is closed within the request deadline (30 s)
  with a log line saying why;
- one client with 256 idle connections in transmission does not lock a new client out (the
  per-client cap), and an idle connection costs one server thread, not two.

The protocol-level cases are tested in Rust (crates/nbd/src/limits_tests.rs); figures under
these attacks, before and after, come from bench/stall_attack.py.
"""
import os
import select
import time

from bench.stall_attack import CMD_READ, CMD_WRITE, MiB, connect_go, proc_status, request
from conftest import need, run, wait_for

LARGEST = 32 * MiB
REQUEST_DEADLINE_S = 30


def good_client_round_trip(server):
    """A new client (qemu-io: a process of its own, so the cap per client does not count it
    with this test's connections) writes 1 MiB and reads it back; a stall shows as a
    timeout."""
    pattern = "0x%02x" % (os.getpid() & 0xff)
    out = run(["qemu-io", "-f", "raw", server.uri, "-c", f"write -P {pattern} 200M 1M",
               "-c", f"read -P {pattern} 200M 1M"], timeout=20).stdout
    assert "failed" not in out and "verification" not in out, out


def closed_by_server(s):
    """Whether the server has shut the connection down (POLLHUP/POLLRDHUP: seen without
    reading, since reading a reply would make a client that does not read one that does)."""
    p = select.poll()
    p.register(s, select.POLLRDHUP | select.POLLHUP)
    return any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in p.poll(0))


def test_stalled_requests_stall_no_one_and_are_dropped_at_the_deadline(server):
    need("qemu-io")
    path = server.socket
    rss_before = proc_status(server.proc.pid)["rss"]
    stalled = {}
    # 15 connections (the cap per client is 16). Five announce the largest WRITE and send
    # nothing: before, each took 32 MiB of the budget and of memory, and eight of them stalled
    # everyone.
    for i in range(5):
        s = connect_go(path)
        s.sendall(request(CMD_WRITE, 1, i * LARGEST % (192 * MiB), LARGEST))
        stalled[f"silent {i}"] = s
    # One that trickles its payload, one that stops a byte short of it, one that stops in a
    # header, and seven that never read the reply of a 32 MiB READ: with the one a byte short,
    # they fill the 256 MiB budget.
    s = connect_go(path)
    s.sendall(request(CMD_WRITE, 1, 0, LARGEST) + b"\x5a")
    stalled["trickle"] = s
    s = connect_go(path)
    s.sendall(request(CMD_WRITE, 1, 0, LARGEST) + b"\x5a" * (LARGEST - 1))
    stalled["a byte short"] = s
    s = connect_go(path)
    s.sendall(request(CMD_READ, 1, 0, 4096)[:10])
    stalled["mid-header"] = s
    for i in range(7):
        s = connect_go(path)
        s.sendall(request(CMD_READ, 1, i * LARGEST, LARGEST))
        stalled[f"no-read {i}"] = s
    time.sleep(1)  # let the server take in what they sent

    # A well-behaved client does not wait for any of them (a connection that holds nothing
    # has a reserve above the full budget for requests of up to 1 MiB).
    good_client_round_trip(server)
    grown = proc_status(server.proc.pid)["rss"] - rss_before
    # The READs not read and the payload a byte short pin what they hold (8 x 32 MiB), the
    # trickler a chunk; the silent writers pin nothing (before: 32 MiB each, 160 MiB more).
    assert grown < 8 * LARGEST + 48 * MiB, f"the server grew by {grown / MiB:.0f} MiB under the stalled clients"

    # Each stalled request is dropped within the deadline (the silent ones hold nothing, but
    # they are in the middle of a request all the same), with a line saying why.
    start = time.monotonic()
    for name, s in stalled.items():
        if name == "trickle":
            # A byte every 100 ms until the server hangs up.
            while not closed_by_server(s):
                assert time.monotonic() - start < 2 * REQUEST_DEADLINE_S, "the trickler was never dropped"
                try:
                    s.send(b"\x5a")
                except OSError:
                    break
                time.sleep(0.1)
            continue
        wait_for(lambda: closed_by_server(s), f"the server to drop the {name} client",
                 timeout=2 * REQUEST_DEADLINE_S)
    log = server.log()
    assert "did not arrive within 30s" in log, log
    assert "the rest of a request header did not arrive within 30s" in log, log
    assert "did not take a" in log and "it does not read its replies" in log, log
    for s in stalled.values():
        s.close()
    assert server.alive()
    good_client_round_trip(server)


def test_idle_connections_of_one_client_do_not_lock_others_out(server):
    need("qemu-io")
    path = server.socket
    base = proc_status(server.proc.pid)["threads"]
    idle = []
    try:
        # 256 connections from this process, each taken to transmission and left idle: before,
        # they took every slot (and two threads each), and the next client was closed at once.
        refused = 0
        for _ in range(256):
            try:
                idle.append(connect_go(path, timeout=10))
            except (OSError, ConnectionError):
                refused += 1
        assert len(idle) == 16 and refused == 240, (len(idle), refused)
        assert "already has 16 connections open (the limit per client)" in server.log(), server.log()
        # Another client (qemu-io here, its own process) gets in and is served.
        out = run(["qemu-io", "-f", "raw", server.uri, "-c", "write -P 0x4d 0 1M", "-c", "read -P 0x4d 0 1M"]).stdout
        assert "failed" not in out and "verification" not in out, out
        # Each idle connection costs one thread (the refused ones' threads are gone).
        wait_for(lambda: proc_status(server.proc.pid)["threads"] <= base + len(idle),
                 f"the server's threads to settle at {base} + one per idle connection "
                 f"(now {proc_status(server.proc.pid)['threads']})")
    finally:
        for s in idle:
            s.close()
