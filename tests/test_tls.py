"""TLS (NBD_OPT_STARTTLS) with real clients: nbdinfo (libnbd) and qemu-io (qemu's
tls-creds-x509) with certificates made at test time by openssl, over TCP and the Unix socket;
a client without TLS, or with TLS but without a client certificate, gets nothing; `serve
--listen` without credentials refuses to start, and starts with --insecure-plain-tcp, warning.
"""
import os
import re
import socket
import struct
import subprocess

import pytest

from conftest import EXPORT_NAME, need, qemu_io, recv_exactly, run

MiB = 1 << 20
NBDMAGIC = b"NBDMAGIC"
IHAVEOPT = b"IHAVEOPT"
OPT_EXPORT_NAME, OPT_GO = 1, 7
REP_ERR_TLS_REQD = (1 << 31) + 5


def openssl(*args, cwd):
    run(["openssl", *args], cwd=cwd)


def make_credentials(base):
    """A CA, a server certificate (localhost, 127.0.0.1) and a client certificate, in the
    layout nbdkit, qemu and libnbd share. Returns (server dir, client dir, client dir without
    a client certificate)."""
    need("openssl")
    ca_dir, srv, cli, nocert = (base / n for n in ("ca", "server", "client", "nocert"))
    for d in (ca_dir, srv, cli, nocert):
        d.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2",
            "-subj", "/CN=compcache test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=ca_dir)
    (ca_dir / "ext.cnf").write_text(
        "[server]\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "[client]\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n")
    for role, cn, d in (("server", "localhost", srv), ("client", "compcache test client", cli)):
        openssl("req", "-new", *ec, "-keyout", f"{d}/{role}-key.pem", "-out", f"{role}.csr",
                "-subj", f"/CN={cn}", cwd=ca_dir)
        openssl("x509", "-req", "-in", f"{role}.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-days", "2", "-out", f"{d}/{role}-cert.pem",
                "-extfile", "ext.cnf", "-extensions", role, cwd=ca_dir)
        os.chmod(d / f"{role}-key.pem", 0o600)
    ca = (ca_dir / "ca-cert.pem").read_bytes()
    for d in (srv, cli, nocert):
        (d / "ca-cert.pem").write_bytes(ca)
    return srv, cli, nocert


@pytest.fixture
def creds(tmp_path):
    return make_credentials(tmp_path)


def tcp_port(server):
    m = re.search(r"tcp:127\.0\.0\.1:(\d+)", server.ready_line or "")
    assert m, f"no TCP address in the ready line: {server.ready_line!r}"
    return int(m.group(1))


def nbdinfo_size(uri):
    import json
    return json.loads(run(["nbdinfo", "--json", uri], timeout=60).stdout)["exports"][0]["export-size"]


def qemu_io_tls(port, client_dir, *cmds, check=True):
    image = ["--object", f"tls-creds-x509,id=tls0,dir={client_dir},endpoint=client", "--image-opts",
             f"driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},"
             f"export={EXPORT_NAME},tls-creds=tls0"]
    return qemu_io(image, *cmds, check=check, timeout=120)


def test_nbdinfo_over_tls_on_tcp_and_unix(start_server, creds):
    need("nbdinfo")
    srv_dir, cli_dir, _ = creds
    server = start_server("64M", "--listen", "127.0.0.1:0", "--tls-certificates", srv_dir)
    port = tcp_port(server)
    assert nbdinfo_size(f"nbds://127.0.0.1:{port}/{EXPORT_NAME}?tls-certificates={cli_dir}") == 64 * MiB
    # The Unix socket offers TLS (and, being owner-only, does not require it).
    assert nbdinfo_size(f"nbds+unix:///{EXPORT_NAME}?socket={server.socket}"
                        f"&tls-certificates={cli_dir}") == 64 * MiB
    assert nbdinfo_size(server.uri) == 64 * MiB


def test_qemu_io_writes_and_reads_a_pattern_over_tls(start_server, creds):
    need("qemu-io")
    srv_dir, cli_dir, _ = creds
    server = start_server("64M", "--listen", "127.0.0.1:0", "--tls-certificates", srv_dir)
    port = tcp_port(server)
    qemu_io_tls(port, cli_dir, "write -P 0xa5 12345 3000000", "read -P 0xa5 12345 3000000",
                "read -P 0 0 12345")
    # A second TLS connection sees it, and so does a plain client of the Unix socket: the data
    # went through TLS into the device, not somewhere else.
    qemu_io_tls(port, cli_dir, "read -P 0xa5 12345 3000000")
    p = run(["qemu-io", "-f", "raw", server.uri, "-c", "read -P 0xa5 12345 3000000"], check=False)
    assert p.returncode == 0 and "failed" not in p.stdout + p.stderr, p.stdout + p.stderr


def test_a_client_without_tls_gets_nothing(start_server, creds):
    need("nbdinfo", "qemu-io")
    srv_dir, cli_dir, _ = creds
    server = start_server("64M", "--listen", "127.0.0.1:0", "--tls-certificates", srv_dir)
    port = tcp_port(server)
    qemu_io_tls(port, cli_dir, "write -P 0x3c 0 1M")
    writes, reads = server.stat_value("num_writes"), server.stat_value("num_reads")

    p = run(["nbdinfo", "--json", f"nbd://127.0.0.1:{port}/{EXPORT_NAME}"], check=False, timeout=60)
    assert p.returncode != 0 and "export-size" not in p.stdout, p.stdout + p.stderr
    p = run(["qemu-io", "-f", "raw", f"nbd://127.0.0.1:{port}/{EXPORT_NAME}", "-c", "read -v 0 512"],
            check=False, timeout=60)
    assert p.returncode != 0 and "3c 3c" not in p.stdout, p.stdout + p.stderr

    # By hand: GO is answered with TLS_REQD (no export information), EXPORT_NAME closes.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        assert recv_exactly(s, 18)[:16] == NBDMAGIC + IHAVEOPT
        s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
        data = struct.pack(">I", len(EXPORT_NAME)) + EXPORT_NAME.encode() + struct.pack(">H", 0)
        s.sendall(IHAVEOPT + struct.pack(">II", OPT_GO, len(data)) + data)
        magic, opt, rep, length = struct.unpack(">QIII", recv_exactly(s, 20))
        assert (opt, rep) == (OPT_GO, REP_ERR_TLS_REQD)
        recv_exactly(s, length)
        s.sendall(IHAVEOPT + struct.pack(">II", OPT_EXPORT_NAME, len(EXPORT_NAME)) + EXPORT_NAME.encode())
        assert recv_exactly(s, 4096) == b"", "the server sent export data to a client without TLS"

    assert (server.stat_value("num_writes"), server.stat_value("num_reads")) == (writes, reads)
    assert server.alive()


def test_verify_peer_refuses_a_client_without_a_certificate(start_server, creds):
    need("nbdinfo", "qemu-io")
    srv_dir, _, nocert_dir = creds
    server = start_server("64M", "--listen", "127.0.0.1:0", "--tls-certificates", srv_dir)
    port = tcp_port(server)
    p = run(["nbdinfo", "--json", f"nbds://127.0.0.1:{port}/{EXPORT_NAME}?tls-certificates={nocert_dir}"],
            check=False, timeout=60)
    assert p.returncode != 0 and "export-size" not in p.stdout, p.stdout + p.stderr
    rc, out = qemu_io_tls(port, nocert_dir, "read 0 512", check=False)
    assert rc != 0, out
    assert "TLS handshake failed" in server.log()
    assert server.alive()


def test_tls_require_on_the_unix_socket(start_server, creds):
    need("nbdinfo")
    srv_dir, cli_dir, _ = creds
    server = start_server("16M", "--tls-certificates", srv_dir, "--tls", "require")
    p = run(["nbdinfo", "--json", server.uri], check=False, timeout=60)
    assert p.returncode != 0 and "export-size" not in p.stdout, p.stdout + p.stderr
    assert nbdinfo_size(f"nbds+unix:///{EXPORT_NAME}?socket={server.socket}"
                        f"&tls-certificates={cli_dir}") == 16 * MiB


def serve_once(compcache_bin, tmp_path, *args):
    """Runs `compcache serve` expecting it to refuse to start; returns (code, stderr). A server
    that starts prints its ready line: it is killed and the test fails."""
    sock = tmp_path / "refused.sock"
    p = subprocess.Popen([compcache_bin, "serve", "--size", "16M", "--socket", sock,
                          "--control", tmp_path / "refused.ctl", *map(str, args)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    ready = p.stdout.readline()
    if ready:
        p.kill()
        p.communicate()
        pytest.fail(f"compcache serve {' '.join(map(str, args))} started: {ready}")
    _, err = p.communicate(timeout=30)
    assert not sock.exists(), "a refused start left its socket behind"
    return p.returncode, err


def test_listen_needs_credentials_or_the_explicit_opt_out(compcache_bin, start_server, tmp_path):
    need("nbdinfo")
    code, err = serve_once(compcache_bin, tmp_path, "--listen", "127.0.0.1:0")
    assert code == 2 and "TCP needs TLS" in err and "--insecure-plain-tcp" in err, err

    server = start_server("16M", "--listen", "127.0.0.1:0", "--insecure-plain-tcp")
    assert "WARNING: --insecure-plain-tcp" in server.log()
    assert nbdinfo_size(f"nbd://127.0.0.1:{tcp_port(server)}/{EXPORT_NAME}") == 16 * MiB


def test_a_private_key_others_can_read_is_refused(compcache_bin, creds, tmp_path):
    srv_dir, _, _ = creds
    os.chmod(srv_dir / "server-key.pem", 0o644)
    code, err = serve_once(compcache_bin, tmp_path, "--listen", "127.0.0.1:0", "--tls-certificates", srv_dir)
    assert code != 0 and "chmod o-rwx" in err, err
