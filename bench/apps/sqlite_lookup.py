"""The random-access program: Debian's python3 with its sqlite3 module holding a table in an
in-memory SQLite database, then looking rows up by key at random, as a service answering
requests against a table it keeps in memory does.

Run with /usr/bin/python3 (Debian's interpreter and libsqlite3) as

    python3 sqlite_lookup.py TABLE_MIB LOOKUPS [SEED]

Build: a table `t(id INTEGER PRIMARY KEY, package TEXT, path TEXT, size INTEGER)` filled in key
order from the machine's own package file lists (/var/lib/dpkg/info/*.list: real paths, as in
apps/dpkgdb.py, over and over) until the database holds TABLE_MIB (page_count * page_size).
SQLite keeps an in-memory database in its page cache, which is anonymous memory: what the
kernel swaps out.

Lookups: LOOKUPS queries `SELECT path, size FROM t WHERE id = ?`, ids drawn uniformly at
random (random.Random(SEED)). Each walks the table's B-tree from the root (its few inner pages
stay hot) to one leaf page chosen at random, so when the table is larger than the memory the
program may use, most lookups wait for one page to be swapped in, and neither the kernel's swap
readahead nor the device can batch them: the access pattern of issue 30.

Prints one JSON line: build_s, lookup_s, lookups, rows, db_bytes, majflt_build, majflt_lookup
(the process's own major faults, getrusage), rss_kib, checksum. Standard library only.
"""

import glob
import json
import os
import random
import resource
import sqlite3
import sys
import time


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def majflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def file_lists():
    """[(package, path)] of every installed package's file list, in a fixed order."""
    out = []
    for p in sorted(glob.glob("/var/lib/dpkg/info/*.list")):
        pkg = os.path.basename(p)[:-len(".list")]
        with open(p, encoding="utf-8", errors="replace") as f:
            out.extend((pkg, line.rstrip("\n")) for line in f if line.strip())
    return out


def build(db, target_bytes, entries):
    """Rows in key order until the database holds target_bytes; returns the row count."""
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, package TEXT, path TEXT, size INTEGER)")
    rows, batch = 0, 50000
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    while db.execute("PRAGMA page_count").fetchone()[0] * page_size < target_bytes:
        db.executemany("INSERT INTO t VALUES (?, ?, ?, ?)",
                       ((rows + i, *entries[(rows + i) % len(entries)], (rows + i) * 7919 % 1000003)
                        for i in range(batch)))
        rows += batch
    db.commit()
    return rows


def main():
    table_mib, lookups = int(sys.argv[1]), int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    entries = file_lists()
    if not entries:
        print(json.dumps({"error": "no /var/lib/dpkg/info/*.list"}), flush=True)
        return 1
    db = sqlite3.connect(":memory:")
    t0, f0 = time.monotonic(), majflt()
    rows = build(db, table_mib << 20, entries)
    build_s, f1 = time.monotonic() - t0, majflt()
    rnd = random.Random(seed)
    h = 0
    t1 = time.monotonic()
    for _ in range(lookups):
        path, size = db.execute("SELECT path, size FROM t WHERE id = ?", (rnd.randrange(rows),)).fetchone()
        h = (h * 131 + len(path) + size) & 0xFFFFFFFF
    lookup_s = time.monotonic() - t1
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    print(json.dumps({"build_s": round(build_s, 4), "lookup_s": round(lookup_s, 4), "lookups": lookups, "rows": rows,
                      "db_bytes": db.execute("PRAGMA page_count").fetchone()[0] * page_size,
                      "majflt_build": f1 - f0, "majflt_lookup": majflt() - f1, "rss_kib": rss_kib(),
                      "checksum": h}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
