#!/usr/bin/env python3
"""NBD over TLS against plain TCP (and the Unix socket), interleaved in one run.

Each round starts, in turn (the order alternates from round to round), one `compcache serve`
per transport: plain TCP (`--insecure-plain-tcp`), TLS over TCP (`--tls-certificates`, client
certificate; certificates made by openssl in a temporary directory), and the Unix socket
(no TLS) for reference. On each: `nbdcopy` writes a 256 MiB file of pages that compress to
about 43% (default: four connections, 256 KiB requests), `nbdcopy` reads the device back to
`null:`, and `nbdcopy` reads it again in 4 KiB requests over one connection at queue depth 1
and 16 (`--connections=1 --request-size=4096 --requests=N`). fio's nbd engine cannot do TLS with certificates: libnbd refuses
the `tls-certificates` file in a URI unless the program allows local files, and fio does not.
Reports the median (min-max) of the rounds and each variant's ratio of medians against plain
TCP. `uptime` is printed before and after: the machine is shared.

Usage: bench/device/tls_ab.py [--binary target/release/compcache] [--rounds 5]
"""
import argparse
import json
import os
import re
import select
import signal
import statistics
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE_MIB = 256

WORKLOADS = [
    # name, unit (higher is better)
    ("nbdcopy write 256 MiB", "MiB/s"),
    ("nbdcopy read 256 MiB", "MiB/s"),
    ("nbdcopy read 4k QD1, 1 connection", "IOPS"),
    ("nbdcopy read 4k QD16, 1 connection", "IOPS"),
]


def sh(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def make_credentials(base):
    """CA, server (localhost/127.0.0.1) and client certificates: (server dir, client dir)."""
    ca, srv, cli = (os.path.join(base, n) for n in ("ca", "server", "client"))
    for d in (ca, srv, cli):
        os.mkdir(d)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sh(["openssl", "req", "-x509", *ec, "-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2",
        "-subj", "/CN=bench CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign"], cwd=ca)
    with open(os.path.join(ca, "ext.cnf"), "w") as f:
        f.write("[server]\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
                "[client]\nextendedKeyUsage=clientAuth\n")
    for role, d in (("server", srv), ("client", cli)):
        sh(["openssl", "req", "-new", *ec, "-keyout", f"{d}/{role}-key.pem", "-out", f"{role}.csr",
            "-subj", f"/CN={'localhost' if role == 'server' else 'bench client'}"], cwd=ca)
        sh(["openssl", "x509", "-req", "-in", f"{role}.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem",
            "-CAcreateserial", "-days", "2", "-out", f"{d}/{role}-cert.pem", "-extfile", "ext.cnf",
            "-extensions", role], cwd=ca)
        os.chmod(f"{d}/{role}-key.pem", 0o600)
        with open(os.path.join(ca, "ca-cert.pem")) as f, open(os.path.join(d, "ca-cert.pem"), "w") as g:
            g.write(f.read())
    return srv, cli


def make_page_file(path):
    """SIZE_MIB of 4 KiB pages, each 43% random bytes and the rest zeroes (lz4 keeps ~45%)."""
    with open(path, "wb") as f:
        for _ in range(SIZE_MIB * 256):
            f.write(os.urandom(1760) + bytes(4096 - 1760))


class Server:
    """One `compcache serve`; `uri` is its NBD URI (libnbd), `qemu` its qemu-img arguments."""

    def __init__(self, binary, variant, tmp, creds):
        self.dir = tempfile.mkdtemp(dir=tmp)
        sock = os.path.join(self.dir, "nbd.sock")
        argv = [binary, "serve", "--size", f"{SIZE_MIB}M", "--control", sock + ".ctl"]
        if variant == "unix":
            argv += ["--socket", sock]
        elif variant == "plain-tcp":
            argv += ["--listen", "127.0.0.1:0", "--insecure-plain-tcp"]
        else:
            argv += ["--listen", "127.0.0.1:0", "--tls-certificates", creds[0]]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        r, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if r else ""
        if not line:
            self.stop()
            raise RuntimeError(f"{variant}: server did not start")
        if variant == "unix":
            self.uri = f"nbd+unix:///compcache?socket={sock}"
            self.qemu = ["--image-opts", f"driver=nbd,server.type=unix,server.path={sock},export=compcache"]
            return
        port = re.search(r"tcp:127\.0\.0\.1:(\d+)", line).group(1)
        opts = f"driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export=compcache"
        if variant == "plain-tcp":
            self.uri = f"nbd://127.0.0.1:{port}/compcache"
            self.qemu = ["--image-opts", opts]
        else:
            self.uri = f"nbds://127.0.0.1:{port}/compcache?tls-certificates={creds[1]}"
            self.qemu = ["--object", f"tls-creds-x509,id=tls0,dir={creds[1]},endpoint=client",
                         "--image-opts", opts + ",tls-creds=tls0"]

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def timed(cmd):
    t = time.monotonic()
    sh(cmd, timeout=600)
    return time.monotonic() - t


def run_workloads(srv, page_file):
    """The four figures of WORKLOADS for one server, in order."""
    write_s = timed(["nbdcopy", page_file, srv.uri])
    read_s = timed(["nbdcopy", srv.uri, "null:"])
    out = []
    for depth in (1, 16):
        s = timed(["nbdcopy", "--connections=1", "--request-size=4096", f"--requests={depth}", srv.uri, "null:"])
        out.append(SIZE_MIB * 256 / s)
    return [SIZE_MIB / write_s, SIZE_MIB / read_s, *out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "compcache"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out-json", default=os.path.join(REPO, "bench", "results", "tls_ab.json"))
    args = ap.parse_args()
    variants = ["plain-tcp", "tls-tcp", "unix"]
    results = {v: {w[0]: [] for w in WORKLOADS} for v in variants}
    print("uptime before:", subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="tls-ab-") as tmp:
        creds = make_credentials(tmp)
        page_file = os.path.join(tmp, "pages.bin")
        make_page_file(page_file)
        for rnd in range(args.rounds):
            order = variants if rnd % 2 == 0 else variants[::-1]
            for v in order:
                srv = Server(args.binary, v, tmp, creds)
                try:
                    for (name, _), value in zip(WORKLOADS, run_workloads(srv, page_file)):
                        results[v][name].append(value)
                finally:
                    srv.stop()
            print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    print("uptime after:", subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip())
    print("\n| workload | variant | median (min-max) | ratio to plain TCP |\n| --- | --- | --- | --- |")
    for name, metric in WORKLOADS:
        base = statistics.median(results["plain-tcp"][name])
        for v in variants:
            vals = results[v][name]
            med = statistics.median(vals)
            print(f"| {name} ({metric}) | {v} | {med:,.0f} ({min(vals):,.0f}-{max(vals):,.0f}) | {med / base:.2f}x |")
    os.makedirs(os.path.dirname(args.out_json), exist_ok=True)
    with open(args.out_json, "w") as f:
        json.dump({"rounds": args.rounds, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
