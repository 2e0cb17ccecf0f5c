"""A client that sends garbage (before, during and after the handshake) does not take the
server down: nbdinfo still works and data written before is intact. The protocol-level
cases are tested in Rust by the server's author; this drives the real binary."""
import os
import socket
import struct

from conftest import need, recv_exactly, run

NBDMAGIC = b"NBDMAGIC"
IHAVEOPT = b"IHAVEOPT"


def raw_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    return s


def test_garbage_clients_do_not_hurt(server):
    need("nbdinfo", "qemu-io")
    ok = run(["qemu-io", "-f", "raw", server.uri, "-c", "write -P 0x9e 12345 100000"])
    assert "failed" not in ok.stdout

    # 1. Garbage instead of the client flags.
    s = raw_connect(server.socket)
    hello = recv_exactly(s, 18)
    assert hello[:16] == NBDMAGIC + IHAVEOPT, hello
    s.sendall(os.urandom(4096))
    s.close()

    # 2. Valid client flags, then an option with a huge length and garbage.
    s = raw_connect(server.socket)
    recv_exactly(s, 18)
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    s.sendall(IHAVEOPT + struct.pack(">II", 7, 0xFFFFFFF0) + os.urandom(1000))
    s.close()

    # 3. A full handshake (NBD_OPT_GO "compcache"), then a transmission request with bad
    #    magic, and one with a bad command type and range.
    s = raw_connect(server.socket)
    recv_exactly(s, 18)
    s.sendall(struct.pack(">I", 3))
    name = b"compcache"
    data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
    s.sendall(IHAVEOPT + struct.pack(">II", 7, len(data)) + data)
    try:
        for _ in range(8):  # option replies up to NBD_REP_ACK
            hdr = recv_exactly(s, 20)
            if len(hdr) < 20:
                break
            _, _, rtype, rlen = struct.unpack(">QIII", hdr)
            recv_exactly(s, rlen)
            if rtype == 1:  # NBD_REP_ACK
                break
        s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 77, 1, 1 << 62, 4096))  # bad type
        s.sendall(b"\xde\xad\xbe\xef" * 64)  # bad magic
    except OSError:
        pass  # the server may hang up on us: that is allowed
    s.close()

    # 4. Connect and vanish without a byte.
    raw_connect(server.socket).close()

    assert server.alive()
    p = run(["nbdinfo", "--size", server.uri])
    assert int(p.stdout) == 256 << 20
    chk = run(["qemu-io", "-f", "raw", server.uri, "-c", "read -P 0x9e 12345 100000",
               "-c", "read -P 0 0 12345"])
    assert "failed" not in chk.stdout
