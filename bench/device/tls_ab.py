#!/usr/bin/env python3
"""NBD over TLS against plain TCP (and the Unix socket), interleaved in one run.

Each round starts, in turn (the order alternates from round to round), one `compcache serve`
per transport: plain TCP (`--insecure-plain-tcp`), TLS over TCP (`--tls-certificates`, client
certificate; certificates made by openssl in a temporary directory), and the Unix socket
(no TLS) for reference. On each: fio's `nbd` engine (libnbd, one connection; the URI carries
`tls-certificates=` for TLS) runs sequential 128 KiB writes over the device, then sequential
128 KiB reads, 4 KiB random reads at QD1 and QD32, with `buffer_compress_percentage`. Reports
the median (min-max) of the rounds and each variant's ratio of medians against plain TCP.
`uptime` is printed before and after: the machine is shared.

Usage: bench/device/tls_ab.py [--binary target/release/compcache] [--rounds 5] [--runtime 5]
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
    # name, rw, bs, iodepth, metric
    ("seq write 128k QD8", "write", "128k", 8, "MiB/s"),
    ("seq read 128k QD8", "read", "128k", 8, "MiB/s"),
    ("randread 4k QD1", "randread", "4k", 1, "IOPS"),
    ("randread 4k QD32", "randread", "4k", 32, "IOPS"),
]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


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


class Server:
    """One `compcache serve`; `uri` is its NBD URI for the variant."""

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
        else:
            port = re.search(r"tcp:127\.0\.0\.1:(\d+)", line).group(1)
            self.uri = (f"nbd://127.0.0.1:{port}/compcache" if variant == "plain-tcp" else
                        f"nbds://127.0.0.1:{port}/compcache?tls-certificates={creds[1]}")

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def fio(uri, rw, bs, depth, runtime, compress_pct, tmp):
    job = os.path.join(tmp, "job.fio")
    with open(job, "w") as f:
        f.write(f"[j]\nioengine=nbd\nuri={uri}\nrw={rw}\nbs={bs}\niodepth={depth}\nsize={SIZE_MIB}m\n"
                f"buffer_compress_percentage={compress_pct}\nrefill_buffers=1\n"
                + (f"time_based=1\nruntime={runtime}\n" if rw.startswith("rand") else "")
                + "randrepeat=0\n")
    out = sh(["fio", "--output-format=json", job], cwd=tmp, timeout=600).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["write"] if "write" in rw else j["read"]
    return side["bw_bytes"] / (1 << 20), side["iops"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "compcache"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runtime", type=int, default=5, help="seconds per random-read workload")
    ap.add_argument("--compress-pct", type=int, default=57)
    ap.add_argument("--out-json", default=os.path.join(REPO, "bench", "results", "tls_ab.json"))
    args = ap.parse_args()
    variants = ["plain-tcp", "tls-tcp", "unix"]
    results = {v: {w[0]: [] for w in WORKLOADS} for v in variants}
    print("uptime before:", subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="tls-ab-") as tmp:
        creds = make_credentials(tmp)
        for rnd in range(args.rounds):
            order = variants if rnd % 2 == 0 else variants[::-1]
            for v in order:
                srv = Server(args.binary, v, tmp, creds)
                try:
                    for name, rw, bs, depth, metric in WORKLOADS:
                        mib_s, iops = fio(srv.uri, rw, bs, depth, args.runtime, args.compress_pct, tmp)
                        results[v][name].append(mib_s if metric == "MiB/s" else iops)
                finally:
                    srv.stop()
            print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    print("uptime after:", subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip())
    print("\n| workload | variant | median (min-max) | ratio to plain TCP |\n| --- | --- | --- | --- |")
    for name, _, _, _, metric in WORKLOADS:
        base = statistics.median(results["plain-tcp"][name])
        for v in variants:
            vals = results[v][name]
            med = statistics.median(vals)
            print(f"| {name} ({metric}) | {v} | {med:,.0f} ({min(vals):,.0f}-{max(vals):,.0f}) | {med / base:.2f}x |")
    os.makedirs(os.path.dirname(args.out_json), exist_ok=True)
    with open(args.out_json, "w") as f:
        json.dump({"rounds": args.rounds, "runtime_s": args.runtime, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
