"""How long a FUSE swap device waits when its server is SIGKILLed: from the kill to the first
request served again by the successor its supervisor starts (issue 29; docs/swap.md, "When the
server dies").

    sudo python3 bench/takeover.py --bin target/release/compcache [--kills 20] [--size 64M] [--fill-mib 0]

Sets up `compcache swapon --frontend fuse --size SIZE`, takes the device out of swap (kernel
swapoff: this measures the takeover, not swap), then KILLS times: SIGKILL to the running
server (2.1 s apart: more than five deaths in ten seconds make the supervisor pause, as for
a crash loop), and at once an O_DIRECT 4 KiB read of the loop device from this process, which the
kernel holds until the successor serves it. Prints per kill the time from the kill to the read's
return, and the supervisor's own figures (its log: from seeing the death to the successor's
READY, and how long it took to lock the dead server's state), then p50 and max; `compcache swapoff` at the end.

A measurement, not a test (tests/test_takeover.py asserts the behaviour).
"""
import argparse
import json
import mmap
import os
import re
import signal
import statistics
import subprocess
import sys
import time

STATE_DIR = "/run/compcache/swap"


def records():
    out = {}
    for name in os.listdir(STATE_DIR) if os.path.isdir(STATE_DIR) else []:
        if name.endswith(".json") and not name.endswith(".stats.json"):
            with open(os.path.join(STATE_DIR, name)) as f:
                v = json.load(f)
            out[v["device"]] = v
    return out


def swapon(binary, size, env):
    before = set(records())
    p = subprocess.run([binary, "swapon", "--frontend", "fuse", "--no-config", "--size", size, "--priority", "32767",
                        "--reserve", "8M"], env=env, capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        sys.exit(f"swapon failed: {p.stderr}")
    new = set(records()) - before
    return new.pop()


def fill(dev, mib):
    """`mib` MiB past the first, 1 MiB at a time: pages alternately of repeated text and random
    bytes, so that the store holds compressed and huge pages."""
    chunk = mmap.mmap(-1, 1 << 20)
    text = (b"compcache takeover bench " * 200)[:4096]
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        for m in range(mib):
            for p in range(256):
                chunk[p * 4096:(p + 1) * 4096] = text if p % 2 == 0 else os.urandom(4096)
            os.pwritev(fd, [chunk], (1 + m) << 20)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="target/release/compcache")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--fill-mib", type=int, default=0, help="MiB of data (half text, half random) written past the first MiB before the kills")
    a = ap.parse_args()
    binary = os.path.abspath(a.bin)
    env = dict(os.environ)
    dev = swapon(binary, a.size, env)
    rec = records()[dev]
    print(f"{binary}: {dev}, supervisor pid {rec['supervisor']}")
    try:
        if not rec["takeover"]:
            sys.exit("the device's store does not outlive its server: nothing to time")
        subprocess.run(["swapoff", "/dev/zram-compcache-" + os.path.basename(dev)], check=True)
        if a.fill_mib:
            fill(dev, a.fill_mib)
        buf = mmap.mmap(-1, 4096)
        fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
        os.preadv(fd, [buf], 0)
        served_ms = []
        for i in range(a.kills):
            old = records()[dev]["pid"]
            t = time.monotonic()
            os.kill(old, signal.SIGKILL)
            os.preadv(fd, [buf], (i * 4096) % (1 << 20))
            served_ms.append((time.monotonic() - t) * 1e3)
            while records()[dev]["pid"] == old:
                time.sleep(0.01)
            # More than five deaths in ten seconds is a crash loop to the supervisor, which
            # then pauses before the next successor: keep the kills 2.1 s apart.
            time.sleep(max(0.0, 2.1 - (time.monotonic() - t)))
        os.close(fd)
        with open(rec["log"]) as f:
            log = f.read()
        seen_ms = [float(m) for m in re.findall(r"serves \S+ ([0-9.]+) ms after the server's end was seen", log)][-a.kills:]
        for i, ms in enumerate(served_ms):
            print(f"kill {i + 1:2}: read served {ms:7.1f} ms after SIGKILL"
                  + (f"; supervisor: successor READY {seen_ms[i]:7.1f} ms after it saw the death" if i < len(seen_ms) else ""))
        print(f"SIGKILL -> read served: p50 {statistics.median(served_ms):.1f} ms, max {max(served_ms):.1f} ms over {len(served_ms)} kills")
        if seen_ms:
            print(f"death seen -> successor READY (supervisor's log): p50 {statistics.median(seen_ms):.1f} ms, max {max(seen_ms):.1f} ms")
        recovered = [float(m) for m in re.findall(r"took the store over: .* in ([0-9.]+) ms", log)][-a.kills:]
        if recovered:
            print(f"Store::recover in the successor: p50 {statistics.median(recovered):.1f} ms, max {max(recovered):.1f} ms")
        standby = log.count(" (the standby) serves ")
        print(f"successors that were the standby started in advance: {standby} of {len(seen_ms)}")
        # The supervisor locks the dead server's state before it starts the successor.
        pins = [(float(mib), float(ms)) for mib, ms in
                re.findall(r"locked the state's ([0-9.]+) MiB in memory until a successor is up \(([0-9.]+) ms\)", log)][-a.kills:]
        if pins:
            ms = [p[1] for p in pins]
            print(f"state locked by the supervisor: {pins[-1][0]:.1f} MiB in p50 {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms")
    finally:
        p = subprocess.run([binary, "swapoff", dev], env=env, capture_output=True, text=True)
        print(p.stdout.strip() or p.stderr.strip())


if __name__ == "__main__":
    main()
