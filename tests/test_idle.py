"""An idle swap server sleeps: what it costs a phone or a netbook on battery while nothing is
swapped.

A `compcache fuse` swap server (`--no-loop`: the same threads as with the loop device) with a
memory limit, a backing file and recompression on, given some real pages and then left alone.
Each thread's wake-ups (voluntary and involuntary context switches, /proc/PID/task/TID/status)
are counted over a window once it has settled. Its background threads sleep until there is
work: the reserve's keeper until an allocation drains the reserve, the writeback thread until
the pool passes its high watermark, the recompression thread backs off while a pass finds
nothing to do, and the main thread looks at the front end once a second. Before that they
polled: the keeper every 10 ms, writeback every 100 ms, recompression every 200 ms, the main
thread every 200 ms (about 120 wake-ups a second in all).

`python3 -m pytest tests/test_idle.py -s` prints the counts per thread (COMPCACHE_BIN=... for
another binary; COMPCACHE_IDLE_WINDOW=60 for a longer window, as in docs/swap.md).
Needs root and /dev/fuse; the server is stopped (SIGTERM, then killed by PID) in any case.
"""
import collections
import os
import time

from test_fuse import FuseServer, fuse_server, need_fuse  # noqa: F401 (fuse_server: fixture)

MiB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = os.path.join(REPO, "data", "pages-mixed.bin")

# Wake-ups per second of idle, at most, by thread name. The threads that serve requests (FUSE,
# control) block in the kernel and must not wake at all.
MOST_PER_SECOND = {"reserve": 1.5, "writeback": 1.5, "recompress": 1.0, "compcache": 1.5}


def wakeups(pid):
    """{tid: (thread name, context switches so far)} of process `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n = sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        out[tid] = (name, n)
    return out


def test_an_idle_server_wakes_its_threads_about_once_a_second_at_most(fuse_server, tmp_path):  # noqa: F811
    need_fuse()
    window = float(os.environ.get("COMPCACHE_IDLE_WINDOW", "20"))
    srv = fuse_server(256 * MiB, "--no-loop", "--threads", "2", "--mem-limit", "16M",
                      "--backing", tmp_path / "backing", "--recompress", "on",
                      "--recompress-idle", "300")
    # Some real pages (past the memory limit, so that writeback and GC have had work), then
    # nothing. Without the page dumps, pages of text do.
    if os.path.exists(PAGES):
        with open(PAGES, "rb") as f:
            data = f.read(48 * MiB)
    else:
        data = b"".join(b"page %08d of an idle device " % i * 128 for i in range(12288))
    with open(srv.file, "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    # Settle: the writes drained, the recompression thread's sleep grown (0.2 s doubling to
    # 5 s takes about 6 s once a pass finds nothing: the pages stay young for 300 s, so none
    # is recompressed during the test, which would be work, not idleness).
    time.sleep(12)
    before = wakeups(srv.proc.pid)
    time.sleep(window)
    after = wakeups(srv.proc.pid)
    per = collections.Counter()
    for tid, (name, n) in after.items():
        per[name] += n - before.get(tid, (name, 0))[1]
    print(f"\nwake-ups in {window:.0f} s of idle, by thread: {dict(sorted(per.items()))}, "
          f"total {sum(per.values())} ({sum(per.values()) / window:.1f}/s)")
    # The main thread is named after the binary (at most 15 characters).
    main = os.path.basename(srv.argv[0])[:15]
    if main != "compcache":
        per["compcache"] += per.pop(main, 0)
    for name, most in MOST_PER_SECOND.items():
        assert per[name] <= most * window + 2, f"{name} woke {per[name]} times in {window} s: {dict(per)}"
    for name in per:
        if name.startswith("fuse-") or name == "control":
            assert per[name] == 0, f"{name} woke {per[name]} times while nothing was asked: {dict(per)}"
    assert srv.stop() == 0, srv.log()
