"""Builds realistic Python data structures until the process holds about TARGET_MIB MiB of
anonymous memory, prints READY and waits for stdin to close (or to be killed).

The data: Debian's package database (/var/lib/dpkg/status) parsed into dicts, then a stream
of generated records derived from it (dicts of str/int/float/list, an index dict and a word
index), as a long-running Python service would hold them.

Usage: python3 hold.py TARGET_MIB
"""
import random
import sys

STATUS = "/var/lib/dpkg/status"


def rss_anon_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def parse_dpkg_status(path):
    """Parses deb822 stanzas into dicts; continuation lines are appended to the field."""
    packages, cur, last = [], {}, None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if not line:
                    if cur:
                        packages.append(cur)
                    cur, last = {}, None
                elif line[0] in " \t" and last:
                    cur[last] += "\n" + line.strip()
                elif ":" in line:
                    key, _, value = line.partition(":")
                    cur[key] = value.strip()
                    last = key
    except OSError:
        pass
    if cur:
        packages.append(cur)
    if not packages:  # no dpkg database: a small synthetic one keeps the shapes the same
        packages = [{"Package": f"pkg{i}", "Version": f"1.{i}", "Description": "generated package"}
                    for i in range(500)]
    return packages


def main():
    target_kib = int(sys.argv[1]) * 1024
    rng = random.Random(1234)
    packages = parse_dpkg_status(STATUS)
    words = sorted({w.strip(".,()") for p in packages for w in p.get("Description", "").split()} - {""})
    records, by_name, by_word = [], {}, {}
    i = 0
    while True:
        for _ in range(2000):
            pkg = packages[i % len(packages)]
            desc = rng.sample(words, min(len(words), rng.randint(5, 40)))
            rec = {
                "id": i,
                "name": f"{pkg.get('Package', 'x')}-{i}",
                "version": pkg.get("Version", "0") + f"+r{i % 97}",
                "arch": pkg.get("Architecture", "all"),
                "depends": [d.strip() for d in pkg.get("Depends", "").split(",") if d.strip()],
                "installed_kib": int(pkg.get("Installed-Size", "0") or 0) + rng.randint(0, 512),
                "score": rng.random(),
                "history": [rng.randint(0, 1 << 20) for _ in range(rng.randint(0, 12))],
                "summary": " ".join(desc),
                "maintainer": pkg.get("Maintainer", ""),
            }
            records.append(rec)
            by_name[rec["name"]] = rec
            for w in desc[:3]:
                by_word.setdefault(w, []).append(i)
            i += 1
        if rss_anon_kib() >= target_kib:
            break
    print(f"READY records={len(records)} rss_anon_kib={rss_anon_kib()}", flush=True)
    sys.stdin.read()  # the dumper holds stdin open until it has dumped us


if __name__ == "__main__":
    main()
