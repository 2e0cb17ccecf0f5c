"""Hostile NBD clients against a real `compcache serve`: what they pin (server RSS, threads)
and whether a well-behaved client still gets its 1 MiB read through (issue 27).

    python3 bench/stall_attack.py --bin target/release/compcache [--attackers 6] [--scenario NAME ...]

Each scenario starts a fresh server (256 MiB device, default limits) on a Unix socket, opens
the attacking connections, waits two seconds, samples the server's RSS and thread count, then
times one 1 MiB READ on a new connection from another process (given up after --patience
seconds; the time includes starting that Python process, about 0.05 s), and closes
everything. Run it against two binaries (before and after) and compare the tables; this is a
measurement, not a test (tests/test_stalls.py asserts the behaviour).

Scenarios (N = --attackers connections, each from this one process):
  silent      announce a 32 MiB WRITE, then send nothing
  trickle     announce a 32 MiB WRITE, then send its payload a byte every 50 ms
  fill        announce a 32 MiB WRITE, send all but its last byte, then stop
  noread      send eight 32 MiB READs and never read a reply
  idle        N idle connections in transmission (use --attackers 256 for the issue's case)
  handshake   N connections that greet and then stop in the middle of the handshake

The raw client here (`connect_go`, `request`) is shared with tests/test_stalls.py.
"""
import argparse
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20
EXPORT = b"compcache"
IHAVEOPT = b"IHAVEOPT"
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
CMD_READ, CMD_WRITE = 0, 1
OPT_GO, REP_ACK = 7, 1


def recv_exactly(s, n):
    """`n` bytes from `s`; fewer only when the peer closed the connection."""
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def greet(s):
    """The server's greeting and our client flags (FIXED_NEWSTYLE | NO_ZEROES)."""
    hello = recv_exactly(s, 18)
    if hello[:16] != b"NBDMAGIC" + IHAVEOPT:
        raise ConnectionError(f"no NBD greeting (got {hello!r}): refused?")
    s.sendall(struct.pack(">I", 3))


def connect_go(path, timeout=30):
    """A Unix socket connection to `path` in transmission (NBD_OPT_GO on the export)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    try:
        greet(s)
        data = struct.pack(">I", len(EXPORT)) + EXPORT + struct.pack(">H", 0)
        s.sendall(IHAVEOPT + struct.pack(">II", OPT_GO, len(data)) + data)
        while True:
            hdr = recv_exactly(s, 20)
            if len(hdr) < 20:
                raise ConnectionError("closed during the handshake")
            _, _, rtype, rlen = struct.unpack(">QIII", hdr)
            recv_exactly(s, rlen)
            if rtype == REP_ACK:
                return s
            if rtype & (1 << 31):
                raise ConnectionError(f"NBD_OPT_GO refused ({rtype:#x})")
    except BaseException:
        s.close()
        raise


def request(cmd, handle, offset, length):
    return struct.pack(">IHHQQI", REQUEST_MAGIC, 0, cmd, handle, offset, length)


def read(s, offset, length, handle=1):
    """One READ; its data (raises on an error reply or a closed connection)."""
    s.sendall(request(CMD_READ, handle, offset, length))
    hdr = recv_exactly(s, 16)
    if len(hdr) < 16:
        raise ConnectionError("closed before the reply")
    magic, error, h = struct.unpack(">IIQ", hdr)
    if magic != SIMPLE_REPLY_MAGIC or error != 0 or h != handle:
        raise ConnectionError(f"bad reply: magic {magic:#x} error {error} handle {h}")
    data = recv_exactly(s, length)
    if len(data) < length:
        raise ConnectionError("closed in the middle of the data")
    return data


def proc_status(pid):
    """VmRSS (bytes) and Threads of process `pid`."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k == "VmRSS":
                out["rss"] = int(v.split()[0]) * 1024
            elif k == "Threads":
                out["threads"] = int(v)
    return out


class Attack:
    """The attacking connections of one scenario, and their helper threads."""

    def __init__(self):
        self.socks = []
        self.stop = threading.Event()
        self.threads = []

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


def attack(path, scenario, n):
    a = Attack()
    big = 32 * MiB
    for i in range(n):
        try:
            if scenario == "handshake":
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(30)
                s.connect(path)
                greet(s)
                s.sendall(IHAVEOPT)  # and nothing more
                a.socks.append(s)
                continue
            s = connect_go(path)
        except (OSError, ConnectionError):
            continue  # refused: counted by the server's log, not here
        a.socks.append(s)
        offset = (i * big) % (192 * MiB)
        if scenario in ("silent", "trickle", "fill"):
            s.sendall(request(CMD_WRITE, 1, offset, big))
        if scenario == "fill":
            s.sendall(b"\x5a" * (big - 1))
        elif scenario == "trickle":
            def trickle(s=s):
                while not a.stop.wait(0.05):
                    try:
                        s.send(b"\x5a")
                    except OSError:
                        return
            t = threading.Thread(target=trickle, daemon=True)
            t.start()
            a.threads.append(t)
        elif scenario == "noread":
            for h in range(8):
                s.sendall(request(CMD_READ, h, (h * big) % (224 * MiB), big))
    return a


def good_read(path, patience):
    """Seconds a new client took for a 1 MiB READ, or an explanation. The client runs in a
    process of its own, as a real one would (the server caps connections per process)."""
    start = time.monotonic()
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--good-client", path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=patience)
    except subprocess.TimeoutExpired:
        return f"no answer in {patience} s"
    if p.returncode != 0:
        return "failed: " + (p.stdout.strip().splitlines() or ["?"])[-1]
    return f"{time.monotonic() - start:.2f} s"


def good_client(path):
    s = connect_go(path)
    try:
        read(s, 0, MiB)
    finally:
        s.close()


def run_scenario(binary, scenario, n, patience, after=0):
    d = tempfile.mkdtemp(prefix="compcache-stall-")
    sock = os.path.join(d, "nbd.sock")
    log = open(os.path.join(d, "server.log"), "wb")
    proc = subprocess.Popen([binary, "serve", "--size", "256M", "--socket", sock, "--control", sock + ".ctl"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    a = None
    try:
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        time.sleep(0.3)
        before = proc_status(proc.pid)
        a = attack(sock, scenario, n)
        time.sleep(2)
        during = proc_status(proc.pid)
        result = good_read(sock, patience)
        held = sum(1 for s in a.socks if s.fileno() >= 0)
        time.sleep(after)
        later = proc_status(proc.pid)
        return {"scenario": scenario, "attackers": n, "open": held,
                "rss_before": before["rss"], "rss_during": during["rss"], "rss_later": later["rss"],
                "threads_before": before["threads"], "threads_during": during["threads"],
                "good_read": result}
    finally:
        if a is not None:
            a.close()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def main():
    if sys.argv[1:2] == ["--good-client"]:
        return good_client(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the compcache binary")
    p.add_argument("--attackers", type=int, default=6)
    p.add_argument("--patience", type=int, default=60, help="seconds the good client waits")
    p.add_argument("--after", type=int, default=0,
                   help="also sample RSS this many seconds after the good client (35: past the 30 s request deadline)")
    p.add_argument("--scenario", action="append",
                   choices=["silent", "trickle", "fill", "noread", "idle", "handshake"])
    args = p.parse_args()
    scenarios = args.scenario or ["silent", "trickle", "fill", "noread", "idle", "handshake"]
    print(f"binary: {args.bin}, {args.attackers} attacking connections, good client: 1 MiB READ")
    later = f" -> {args.after} s later" if args.after else ""
    print(f"| scenario | attackers | server RSS before -> during{later} | threads before -> during | good client's read |")
    print("|---|---|---|---|---|")
    for sc in scenarios:
        r = run_scenario(args.bin, sc, args.attackers, args.patience, args.after)
        rss = f"{r['rss_before'] / MiB:.1f} -> {r['rss_during'] / MiB:.1f}"
        if args.after:
            rss += f" -> {r['rss_later'] / MiB:.1f}"
        print(f"| {sc} | {r['attackers']} | {rss} MiB "
              f"| {r['threads_before']} -> {r['threads_during']} | {r['good_read']} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
