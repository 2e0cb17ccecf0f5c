"""`compcache swapon` asked for a device in a container, and the commands that find that
device afterwards (issue 27), on the real binary with the FUSE front end:

- in a container (a fake root's `run/systemd/container`; this machine is a Docker container
  too), `swapon` with a `--size` on the command line is an explicit request: the device is set
  up, where the configuration alone sets nothing up (exit 3, and `"stood_down"` in `--json`:
  test_zramgen.py);
- `compcache stat DEVICE` finds it by any of its names (`loopN`, `/dev/loopN`, the
  hibernation-safe name), and a plain `compcache stat` shows it when it is the only device on
  the machine (with several, it lists them and says how to pick one);
- the table lists the counters of what the device uses (no `bd_*` without a backing device,
  no `cache_*` on a swap device), `--all` and `--json` every one;
- `compcache swapoff DEVICE` without `--json` prints lines for people, and no JSON.

Each test sets up its own 64 MiB device under the host-swap lock (the second with
`--no-config`, so that it does not depend on the container rule) and takes it down in
`finally` by name, also on failure. Needs root, /dev/fuse,
losetup and mkswap: skipped with the reason otherwise.
"""
import contextlib
import json
import os

from conftest import need, run
from test_fuse import compcache_devices, host_swap_lock, need_fuse
from test_zramgen import write


def counters(table):
    """The counter names a `compcache stat` table lists (its lines after the summary)."""
    return {line.split()[0] for line in table.splitlines()[3:] if line and not line.startswith("(")}


@contextlib.contextmanager
def swap_device(compcache_bin, *args):
    """`compcache swapon --frontend fuse --size 64M ARGS --json` under the host-swap lock:
    yields (the swapon run, the new device or None); the device is taken down after, by name,
    also on failure."""
    need_fuse()
    need("mkswap")
    with host_swap_lock():
        before = set(compcache_devices())
        new = []
        try:
            p = run([compcache_bin, "swapon", "--frontend", "fuse", "--size", "64M", "--reserve", "4M", "--json", *args],
                    check=False, timeout=300)
            new = sorted(set(compcache_devices()) - before)
            assert len(new) <= 1, new
            yield p, (new[0] if new else None)
        finally:
            for dev in new:
                if dev in compcache_devices():
                    print(run([compcache_bin, "swapoff", "--json", dev], check=False, timeout=600).stdout)


def test_a_size_on_the_command_line_is_set_up_in_a_container(compcache_bin, tmp_path):
    root = str(tmp_path / "root")
    write(root, "run/systemd/container", "docker\n")
    with swap_device(compcache_bin, "--config-root", root) as (p, dev):
        assert p.returncode == 0, (p.stdout, p.stderr)
        out = json.loads(p.stdout)
        assert out["stood_down"] is None and [d["device"] for d in out["devices"]] == [dev], p.stdout
        assert dev is not None and os.path.exists(dev), dev


def test_stat_finds_the_device_by_name_and_lists_what_it_uses(compcache_bin):
    with swap_device(compcache_bin, "--no-config") as (p, dev):
        assert p.returncode == 0 and dev is not None, (p.stdout, p.stderr)
        name = os.path.basename(dev)

        # By name, in each of its spellings.
        for spelling in (name, dev, f"/dev/zram-compcache-{name}"):
            s = run([compcache_bin, "stat", "--json", spelling], check=False, timeout=60)
            assert s.returncode == 0, (spelling, s.stderr)
            assert json.loads(s.stdout)["device"]["export_name"] == dev, s.stdout
        missing = run([compcache_bin, "stat", "nosuchdevice0"], check=False, timeout=60)
        assert missing.returncode == 1 and "compcache list" in missing.stderr, missing.stderr

        # Without a name: the only device, or the list of them (other servers may be up).
        listed = json.loads(run([compcache_bin, "list", "--json"], timeout=60).stdout)["devices"]
        plain = run([compcache_bin, "stat"], check=False, timeout=60)
        if len(listed) == 1:
            assert plain.returncode == 0, plain.stderr
            assert plain.stdout.splitlines()[1].split()[0] == dev, plain.stdout
        else:
            assert plain.returncode == 2 and f"  {dev}" in plain.stderr and "name one" in plain.stderr, plain.stderr

        # The counters of what the device uses; every one with --all and in --json.
        table = run([compcache_bin, "stat", "--control", f"/run/compcache/{name}.ctl"], timeout=60).stdout
        shown = counters(table)
        assert "orig_data_size" in shown and "num_writes" in shown, table
        assert not any(k.startswith(("bd_", "cache_", "origin_", "readahead_")) for k in shown), table
        assert "left out; --all lists them" in table, table
        every = counters(run([compcache_bin, "stat", "--all", name], timeout=60).stdout)
        stats = json.loads(run([compcache_bin, "stat", "--json", name], timeout=60).stdout)
        assert {"bd_count", "cache_hits", "origin_reads"} <= every and {"bd_count", "cache_hits"} <= set(stats)
        assert shown < every and every <= set(stats), (shown, every)

        # swapoff without --json: lines for people only.
        off = run([compcache_bin, "swapoff", dev], check=False, timeout=600)
        assert off.returncode == 0, off.stderr
        assert f"swapoff {dev}: done (fuse)" in off.stdout and "statistics: DATA" in off.stdout, off.stdout
        assert "{" not in off.stdout and "}" not in off.stdout, off.stdout
