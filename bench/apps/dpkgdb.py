"""The app-cycle program: Debian's python3 holding a real data set, the machine's own
package database, in memory, like a document viewer holds a document.

Run with /usr/bin/python3 (Debian's interpreter, not a venv's) as

    python3 dpkgdb.py TARGET_MIB START

It parses the file lists of installed packages (/var/lib/dpkg/info/*.list, split into path
components) and records of /var/lib/dpkg/status (one dict per package), starting at index
START and wrapping around, repeating with fresh objects until its resident size reaches
TARGET_MIB. That is what an interpreter with a loaded data set looks like in memory:
dicts, lists, short strings and object headers, not synthetic patterns.

Then it answers one line on stdin at a time:
    go   "make this instance active": walk every object it holds (like re-rendering a
         document when its window comes to the front) and reply "done CHECKSUM"
    EOF  exit
It prints "ready RSS_KIB" once loaded. Standard library only.
"""

import glob
import os
import sys


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def parse_status(path="/var/lib/dpkg/status"):
    """Yields one dict per package record of the dpkg status file."""
    cur, key = {}, None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line == "\n":
                if cur:
                    yield cur
                cur, key = {}, None
            elif line[0] in " \t" and key:
                cur[key] += line
            else:
                key, _, value = line.partition(":")
                cur[key] = value.strip()
    if cur:
        yield cur


def load_status(first, count):
    """Package records number first, first+1, ... (wrapping around), count of them."""
    pkgs = []
    while len(pkgs) < count:
        n = -1
        for n, rec in enumerate(parse_status()):
            if n >= first:
                pkgs.append(rec)
                if len(pkgs) == count:
                    return pkgs
        if n < 0:
            break
        first = first % (n + 1) if first > n else 0
    return pkgs


def load_list(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n").split("/") for line in f]


def walk(data):
    """Touches every object: the cost of making the instance active again."""
    h = 0
    for pkgs, lists in data:
        for p in pkgs:
            for k, v in p.items():
                h = (h * 31 + len(k) + len(v)) & 0xFFFFFFFF
        for name, paths in lists.items():
            h = (h + len(name)) & 0xFFFFFFFF
            for comps in paths:
                for c in comps:
                    h = (h * 131 + len(c)) & 0xFFFFFFFF
    return h


def main():
    target_kib = int(sys.argv[1]) * 1024
    start = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    # Small lists only (most packages), so that the size grows in small steps.
    lists = sorted(p for p in glob.glob("/var/lib/dpkg/info/*.list") if os.path.getsize(p) < 128 << 10)
    if not lists:
        print("error no /var/lib/dpkg/info/*.list", flush=True)
        return 1
    data = []
    i = start
    while rss_kib() < target_kib:
        chunk = {}
        for _ in range(16):
            path = lists[i % len(lists)]
            chunk[path] = load_list(path)
            i += 1
            if rss_kib() >= target_kib:
                break
        pkgs = load_status((start + len(data) * 64) % 4096, 64)
        data.append((pkgs, chunk))
    print(f"ready {rss_kib()}", flush=True)
    for line in sys.stdin:
        if line.strip() == "go":
            print(f"done {walk(data)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
