"""The control socket under clients that hang (issue 27), on the real `compcache serve`:

- clients that connect and send nothing, send half a request, or pipeline requests and never
  read the answers, more of them than the server serves at once (16): `compcache stat`,
  `compact` and `list` are still answered, every time, while they stay connected;
- each of those clients is closed by the server at its deadline (10 s to send a request, 10 s
  to read an answer), and the server's threads go back to what they were.

The server's threads and resident memory are printed before, under and after the attack
(`pytest -s tests/test_control_clients.py`; docs/cli.md, "The control protocol", quotes the
figures). The limits themselves are tested in Rust too (crates/control/src/tests.rs), with
short deadlines.
"""
import contextlib
import json
import socket

from conftest import run, wait_for

# More than the 16 clients the control server serves at once.
SILENT = 16
HALF = 8
NO_READ = 8


def threads_and_rss(pid):
    """(threads, VmRSS in KiB) of a process, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    return s


def pipeline_without_reading(s):
    """Sends stat requests until the socket takes no more (the server blocked on answers this
    client never reads); returns how many were sent."""
    s.setblocking(False)
    line = b'{"cmd":"stat"}\n'
    sent = 0
    try:
        while sent < 1_000_000:
            sent += s.send(line) // len(line)
    except BlockingIOError:
        pass
    return sent


def closed_by_server(s):
    """Whether the server has closed `s` (reads reach the end; answers before it are drained)."""
    s.setblocking(False)
    try:
        while True:
            data = s.recv(1 << 16)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def ask(compcache_bin, *args):
    """Runs `compcache ARGS`: (exit code, stdout, stderr)."""
    p = run([compcache_bin, *args], check=False, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_clients_that_hang_do_not_blind_stat(compcache_bin, start_server):
    server = start_server("64M")
    pid = server.proc.pid
    assert ask(compcache_bin, "stat", "--control", server.control)[0] == 0
    before = threads_and_rss(pid)
    clients = []
    try:
        for _ in range(SILENT):
            clients.append(connect(server.control))
        # (A server that turns clients away once it serves 16 closes these at once: their
        # writes may fail, and the attack goes on with the ones it holds.)
        for _ in range(HALF):
            s = connect(server.control)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(b'{"cmd":"st')
            clients.append(s)
        for _ in range(NO_READ):
            s = connect(server.control)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                pipeline_without_reading(s)
            clients.append(s)
        # Every tool asks, again and again, while the clients hang on.
        under = threads_and_rss(pid)
        answers = []
        for _ in range(3):
            under = max(under, threads_and_rss(pid))
            answers.append(("stat", ask(compcache_bin, "stat", "--json", "--control", server.control)))
            answers.append(("compact", ask(compcache_bin, "compact", "--json", "--control", server.control)))
            answers.append(("list", ask(compcache_bin, "list", "--json", "--control", server.control)))
        failed = [(cmd, err.strip()) for cmd, (code, _, err) in answers if code != 0]
        # The figures first, so that a server without the limits shows its own too.
        print(f"\ncontrol clients: {SILENT} silent, {HALF} half a request, {NO_READ} never reading:"
              f" server threads/RSS KiB before {before}, under the attack {under};"
              f" {len(answers) - len(failed)} of {len(answers)} commands answered {failed[:1]}")
        assert not failed, failed
        for cmd, (_, out, _) in answers:
            if cmd == "stat":
                assert json.loads(out)["disksize"] == 64 << 20, out
            if cmd == "list":
                assert [d["control"] for d in json.loads(out)["devices"]].count(server.control) == 1, out
        # The clients still connected are closed at their deadlines (10 s, 30 s allowed), and
        # the server is back to the threads it had.
        wait_for(lambda: all(closed_by_server(s) for s in clients), "the server to close every hanging client")
        wait_for(lambda: threads_and_rss(pid)[0] <= before[0], "the control threads to end")
        print(f"after the deadlines: threads/RSS KiB {threads_and_rss(pid)}")
        assert server.alive(), server.log()
    finally:
        for s in clients:
            s.close()
