"""`compcache swapon` standing in for zram-generator, end to end (the rules themselves are unit
tested beside the parser, crates/cli/src/cmd/zramconf/):

- a fake root (`--config-root`) with a zram-generator.conf of two `[zramN]` sections, a `set!`
  line and a drop-in, and compcache's own compcache.conf choosing the FUSE front end: one swap
  device per section, each with its section's size and priority (`-1`: the kernel's), both
  taken down by `compcache swapoff` of the two devices;
- `run/systemd/container` in the fake root: swapon sets nothing up from the configuration, as
  zram-generator does in containers, and says so in its exit status (3) and in `--json`
  (`"stood_down"`), so that a script can tell (a `--size` on the command line is an explicit
  request and is set up: test_cli_devices.py);
- `systemd.zram=0` in the fake root's proc/cmdline: likewise.

Devices are taken down in `finally`, also on failure, by name (never every recorded device:
other tests' devices may be up). Needs root, /dev/fuse, losetup and mkswap (the FUSE front end;
ublk and nbd are not needed): skipped with the reason otherwise.
"""
import json
import os

from conftest import need, need_root, run
from test_fuse import compcache_devices, host_swap_lock, mounted, need_fuse

MiB = 1 << 20


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def swaps():
    """/proc/swaps as {device: (size KiB, priority)}; `compcache swapon` enables swap through
    /dev/zram-compcache-<device> (docs/swap.md, "Hibernation"), listed here as /dev/<device>."""
    with open("/proc/swaps") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {r[0].replace("/dev/zram-compcache-", "/dev/"): (int(r[2]), int(r[4])) for r in rows}


def test_two_sections_are_two_swap_devices(compcache_bin, tmp_path):
    need_fuse()
    need("mkswap")
    root = str(tmp_path / "root")
    write(root, "usr/lib/systemd/zram-generator.conf",
          "set!small = echo 24 + 8\n[zram0]\nzram-size = 64\nswap-priority = 10\n")
    # /etc's drop-in adds a section; the main file above is the only one (no /etc main file).
    write(root, "etc/systemd/zram-generator.conf.d/50-second.conf",
          "[zram1]\nzram-size = small\nswap-priority = -1\noptions = discard,nofail\nmemory-limit = none\n")
    write(root, "etc/compcache/compcache.conf",
          "[zram0]\nfrontend = fuse\nreserve = 8M\n[zram1]\nfrontend = fuse\nreserve = 4M\n")
    new = []
    with host_swap_lock():
        before = set(compcache_devices())
        try:
            p = run([compcache_bin, "swapon", "--config-root", root, "--json"], check=False, timeout=300)
            print(p.stdout, p.stderr)
            new = sorted(set(compcache_devices()) - before)
            assert p.returncode == 0, p.stderr
            assert "memory-limit is an obsolete name of host-memory-limit" in p.stderr, p.stderr
            assert len(new) == 2, (p.stdout, compcache_devices())
            states = compcache_devices()
            assert all(states[d]["frontend"] == "fuse" for d in new), states
            on = swaps()
            got = sorted((on[d][0] * 1024 // MiB, on[d][1]) for d in new)
            # zram1: 24 + 8 = 32 MiB at the kernel's (negative) priority; zram0: 64 MiB at
            # priority 10 (less the swap header's page, which is not swap space).
            assert [size for size, _ in got] == [31, 63], (got, on)
            assert got[0][1] < 0 and got[1][1] == 10, got
            report = {d["section"]: d for d in json.loads(p.stdout)["devices"]}
            assert set(report) == {"zram0", "zram1"}, p.stdout
            assert report["zram0"]["priority"] == 10 and report["zram0"]["frontend"] == "fuse", report
            assert {report[s]["device"] for s in report} == set(new), (report, new)
            assert all(report[s]["swap_name"].startswith("/dev/zram-compcache-") for s in report), report
        finally:
            if new:
                off = run([compcache_bin, "swapoff", "--json", *new], check=False, timeout=600)
                print(off.stdout, off.stderr)
        assert off.returncode == 0, off.stderr
        done = {d["device"]: d for d in json.loads(off.stdout)["devices"]}
        assert set(done) == set(new) and all(d["final_stats"]["num_writes"] > 0 for d in done.values()), off.stdout
        on = swaps()
        for d in new:
            assert d not in on
            pid = states[d]["pid"]
            assert not mounted(f"/run/compcache/fuse-{pid}")


def test_no_devices_in_a_container(compcache_bin, tmp_path):
    need_root("swapon checks for root first")
    root = str(tmp_path / "root")
    write(root, "etc/systemd/zram-generator.conf", "[zram0]\nzram-size = 64\n")
    write(root, "run/systemd/container", "docker\n")
    before = set(compcache_devices())
    p = run([compcache_bin, "swapon", "--config-root", root, "--frontend", "fuse"], check=False, timeout=60)
    assert "running in a container (docker)" in p.stdout and "--ignore-container" in p.stdout, p.stdout
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert p.stderr == "", "standing down is no error: " + p.stderr
    p = run([compcache_bin, "swapon", "--config-root", root, "--frontend", "fuse", "--json"], check=False, timeout=60)
    assert p.returncode == 3, (p.returncode, p.stderr)
    out = json.loads(p.stdout)
    assert out["devices"] == [] and out["stood_down"]["rule"] == "container", out
    assert out["stood_down"]["container"] == "docker" and "--size" in out["stood_down"]["message"], out
    assert set(compcache_devices()) == before


def test_no_devices_with_systemd_zram_0(compcache_bin, tmp_path):
    need_root("swapon checks for root first")
    root = str(tmp_path / "root")
    write(root, "etc/systemd/zram-generator.conf", "[zram0]\nzram-size = 64\n")
    write(root, "proc/cmdline", "quiet systemd.zram=1 systemd.zram=0\n")
    before = set(compcache_devices())
    p = run([compcache_bin, "swapon", "--config-root", root, "--frontend", "fuse", "--json"], check=False, timeout=60)
    assert p.returncode == 3, (p.returncode, p.stderr)
    out = json.loads(p.stdout)
    assert out == {"devices": [], "stood_down": {"rule": "systemd.zram=0", "container": None,
                                                 "message": out["stood_down"]["message"]}}, out
    assert "systemd.zram=0" in out["stood_down"]["message"], out
    assert set(compcache_devices()) == before
