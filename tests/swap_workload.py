"""Workload for test_swap: fills N MiB of private anonymous memory with page-number-derived
contents (half text, which compresses; half seeded pseudo-random bytes, which does not),
prints FILLED, reads every page back and checks it, prints VERIFIED and exits 0 only if every
page was correct. Run inside a memory cgroup smaller than N, so the pages go through swap.
With --hold it waits for a line on stdin between FILLED and the check (the pages stay swapped
out meanwhile, untouched: what a test of idle pages wants).

Usage: python3 swap_workload.py MIB [--hold]
"""
import random
import sys

PAGE = 4096


def page_contents(i):
    text = (f"page {i:010d} of the compcache swap test; " * 64).encode()[: PAGE // 2]
    return text + random.Random(i).randbytes(PAGE // 2)


def main():
    pages = int(sys.argv[1]) * (1 << 20) // PAGE
    mem = bytearray(pages * PAGE)  # malloc'd: private anonymous memory
    for i in range(pages):
        mem[i * PAGE:(i + 1) * PAGE] = page_contents(i)
    print(f"FILLED {pages}", flush=True)
    if "--hold" in sys.argv[2:]:
        sys.stdin.readline()
    bad = [i for i in range(pages) if mem[i * PAGE:(i + 1) * PAGE] != page_contents(i)]
    if bad:
        print(f"BAD {len(bad)} pages, first {bad[:10]}", flush=True)
        return 1
    print(f"VERIFIED {pages}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
