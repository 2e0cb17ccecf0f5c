#!/usr/bin/env python3
"""Writes the starting corpus of each fuzz target into fuzz/seeds/<target>/ (committed).

The NBD seeds are crates/nbd/fuzz/seeds (the malformed-client cases that
`cargo test -p compcache-nbd seed_corpus` replays) and the malformed-client cases of
crates/nbd/src/tests.rs and tests/test_malformed_client.py, rebuilt here byte for byte where
they are fixed (their random noise is replaced by fixed noise). The other targets' seeds are
small valid and invalid inputs in the format each harness decodes (fuzz/src/*.rs).

The fuzzer grows each corpus from these; the minimised result is in fuzz/corpus/<target>/.
Run again after changing a harness's input format: `python3 fuzz/make-seeds.py`.
"""
import os
import random
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
NBD_SEEDS = os.path.join(ROOT, "..", "crates", "nbd", "fuzz", "seeds")

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REQUEST_MAGIC = 0x25609513
OPT = dict(EXPORT_NAME=1, ABORT=2, LIST=3, STARTTLS=5, INFO=6, GO=7, STRUCTURED_REPLY=8,
           LIST_META_CONTEXT=9, SET_META_CONTEXT=10, EXTENDED_HEADERS=11)
CMD = dict(READ=0, WRITE=1, DISC=2, FLUSH=3, TRIM=4, CACHE=5, WRITE_ZEROES=6, BLOCK_STATUS=7)
FUA, NO_HOLE = 1, 2
NAME = b"compcache"


def flags(f=3):
    return struct.pack(">I", f)


def option(opt, data=b""):
    return struct.pack(">QII", IHAVEOPT, opt, len(data)) + data


def info_data(name=NAME, requests=()):
    return struct.pack(">I", len(name)) + name + struct.pack(">H", len(requests)) + b"".join(
        struct.pack(">H", r) for r in requests)


def go_prefix():
    return flags(3) + option(OPT["GO"], info_data())


def request(cmd, offset=0, length=0, fl=0, handle=0x1234, payload=b""):
    return struct.pack(">IHHQQI", REQUEST_MAGIC, fl, cmd, handle, offset, length) + payload


def noise(seed, n):
    r = random.Random(seed)
    return bytes(r.randrange(256) for _ in range(n))


def write(target, name, data):
    d = os.path.join(ROOT, "seeds", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def nbd():
    """Handshake seeds (what a client sends after connecting) and transmission seeds (a mode
    byte: bit 0 set = raw, clear = after a valid GO; bit 1 = two workers)."""
    hs = {}
    for f in sorted(os.listdir(NBD_SEEDS)):
        with open(os.path.join(NBD_SEEDS, f), "rb") as fh:
            hs["nbd-" + f[:-4]] = fh.read()
    # crates/nbd/src/tests.rs malformed_clients_lose_nothing, and the option tests.
    hs["empty"] = b""
    hs["half-flags"] = b"\0\0"
    hs["unknown-flags"] = b"\xff\xff\xff\xff"
    hs["wrong-option-magic"] = flags(1) + b"NOTMAGIC\0\0\0\x07\0\0\0\0"
    hs["go-truncated-3"] = go_prefix()[:-3]
    hs["list-info-unsupported-go"] = (
        flags(1) + option(OPT["INFO"], info_data(NAME, (1, 2, 3))) + option(OPT["LIST"]) + option(OPT["LIST"], b"x")
        + b"".join(option(o) for o in (5, 8, 9, 10, 11, 4242)) + option(OPT["GO"], info_data(b"", (0, 1, 2, 3))))
    hs["info-unknown-export"] = flags(3) + option(OPT["INFO"], info_data(b"nosuch")) + option(OPT["ABORT"])
    hs["info-bad-count"] = flags(3) + option(OPT["GO"], struct.pack(">I", 0) + struct.pack(">H", 3) + b"\0\1")
    hs["export-name"] = flags(1) + option(OPT["EXPORT_NAME"], NAME)
    hs["export-name-default"] = flags(3) + option(OPT["EXPORT_NAME"])
    hs["export-name-unknown"] = flags(3) + option(OPT["EXPORT_NAME"], b"other")
    hs["option-too-big-skipped"] = flags(3) + struct.pack(">QII", IHAVEOPT, 3, 20000) + bytes(20000) + option(OPT["ABORT"])
    # tests/test_malformed_client.py: flags then an option with a huge length and garbage.
    hs["py-huge-option"] = flags(3) + struct.pack(">QII", IHAVEOPT, 7, 0xFFFFFFF0) + noise(2, 1000)
    hs["py-garbage-flags"] = noise(1, 4096)
    hs["many-options"] = flags(3) + option(OPT["LIST"]) * 130
    for i in range(3):
        hs[f"noise-after-flags-{i}"] = flags(1) + noise(10 + i, 64 + i * 300)
    for k, v in hs.items():
        write("nbd_handshake", k, v)
        write("nbd_transmission", "raw-" + k, b"\x01" + v)

    tx = {}
    page = bytes(range(256)) * 16
    tx["valid-all-commands"] = (
        request(CMD["WRITE"], 4096, 4096, payload=page) + request(CMD["READ"], 4096, 4096)
        + request(CMD["WRITE"], 100, 10, FUA, payload=b"0123456789") + request(CMD["READ"], 0, 8192, FUA)
        + request(CMD["FLUSH"]) + request(CMD["TRIM"], 0, 8192) + request(CMD["WRITE_ZEROES"], 1, 5000, NO_HOLE)
        + request(CMD["WRITE_ZEROES"], 8192, 8192) + request(CMD["READ"], 0, 3 * 4096) + request(CMD["DISC"]))
    tx["pipelined-writes-flush"] = b"".join(
        request(CMD["WRITE"], i * 4096, 4096, handle=i, payload=bytes([i]) * 4096) for i in range(8)) + request(
        CMD["FLUSH"], handle=99) + request(CMD["READ"], 0, 8 * 4096, handle=100)
    tx["bad-magic"] = b"\xde\xad\xbe\xef" + bytes(24)
    tx["truncated-header"] = request(CMD["WRITE"], 0, 4096)[:20]
    tx["truncated-payload"] = request(CMD["WRITE"], 1 << 19, 4096) + b"\x55" * 1000
    tx["write-4gib"] = request(CMD["WRITE"], 0, 0xFFFFFFFF)
    tx["rejects"] = (request(CMD["READ"], 0, 0xFFFFFFFF) + request(99, 0, 1) + request(CMD["READ"], 2**64 - 1, 4096)
                     + request(CMD["READ"], 0, 0) + request(CMD["FLUSH"], 1, 1) + request(CMD["READ"], 0, 1, 0x80)
                     + request(CMD["CACHE"], 0, 4096) + request(CMD["BLOCK_STATUS"], 0, 4096)
                     + request(CMD["WRITE"], (1 << 20) - 10, 20, payload=bytes(20)) + request(CMD["TRIM"], 1 << 20, 1))
    tx["py-bad-type-bad-magic"] = struct.pack(">IHHQQI", REQUEST_MAGIC, 0, 77, 1, 1 << 62, 4096) + b"\xde\xad\xbe\xef" * 64
    tx["unaligned-io"] = (request(CMD["WRITE"], 4000, 200, payload=noise(3, 200)) + request(CMD["READ"], 3990, 300)
                          + request(CMD["TRIM"], 4000, 9000) + request(CMD["READ"], 0, 16384))
    for i in range(3):
        tx[f"noise-{i}"] = noise(20 + i, 64 + i * 500)
    for k, v in tx.items():
        write("nbd_transmission", k, b"\x00" + v)
        write("nbd_transmission", k + "-2workers", b"\x02" + v)


def control():
    lines = {
        "stat": b'{"cmd":"stat"}\n',
        "compact": b'{"cmd":"compact"}\n',
        "info": b'{"cmd":"info"}',
        "all-three": b'{"cmd":"stat"}\n{"cmd":"info"}\n\n{"cmd":"compact"}\n',
        "unknown": b'{"cmd":"format"}\n',
        "not-json": b"stat\n",
        "no-cmd": b'{"command":"stat"}\n',
        "cmd-not-string": b'{"cmd":1}\n{"cmd":null}\n{"cmd":["stat"]}\n',
        "array": b'[{"cmd":"stat"}]\n',
        "nested": b'{"cmd":"stat","x":' + b"[" * 200 + b"]" * 200 + b"}\n",
        "unicode": '{"cmd":"st\\u0061t","n":"\u00e9\u4e2d"}\n'.encode(),
        "bad-utf8": b'{"cmd":"\xff\xfe"}\n',
        "numbers": b'{"cmd":"info","a":1e999,"b":-0,"c":123456789012345678901234567890}\n',
        "crlf": b'{"cmd":"stat"}\r\n {"cmd":"info"} \r\n',
        "set": b'{"cmd":"set","mem_limit":1048576,"reset_mem_used_max":true}\n{"cmd":"set","mem_limit":0}\n',
        "set-writeback": b'{"cmd":"set","writeback":{"high_pct":80,"low_pct":50,"rate_bytes":1,"limit_bytes":0}}\n',
        "set-bad": b'{"cmd":"set","mem_limit":-1}\n{"cmd":"set","x":1}\n{"cmd":"set","reset_mem_used_max":1}\n',
        "writeback": b'{"cmd":"writeback","idle_secs":0,"max_bytes":4096}\n{"cmd":"writeback","idle_secs":"a"}\n',
        "recompress": b'{"cmd":"recompress","set":{"idle_secs":1},"run_ms":1}\n',
    }
    for k, v in lines.items():
        write("control", k, v)


def zramconf():
    confs = {
        "tests-full": "# comment\n[zram0]\nzram-size = ram / 2\ncompression-algorithm = zstd(level=5)\nswap-priority = 50\n"
                      "zram-resident-limit = 256\nwriteback-device = /dev/disk/by-partuuid/2d54ffa0-01\noptions = discard\n",
        "empty-section": "[zram0]\n",
        "host-limit": "[zram0]\nhost-memory-limit = 512\ncompression-algorithm = lzo-rle\n",
        "host-limit-none": "[zram0]\nhost-memory-limit = none\nzram-size = min(ram, 8192)\n",
        "fs-type": "[zram1]\nfs-type = ext4\n",
        "outside": "zram-size = 1\n",
        "two-sections": "[zram0]\nzram-size = max(512, ram / 4) + 1\n; c\n[zram1]\nzram-size = -(2 - 8) * 2\nswap-priority = -1\n",
        "recompress": "[zram0]\ncompression-algorithm = lzo-rle zstd(level=9) (type=idle)\nzram-size = 4096\n",
        "bad-expr": "[zram0]\nzram-size = ram +\nzram-resident-limit = disk\n",
        "div-zero": "[zram0]\nzram-size = ram / 0\n",
        "min-one-arg": "[zram0]\nzram-size = min(1)\n",
        "small": "[zram0]\nzram-size = 0.5 * 2 / 3\nzram-resident-limit = -5\n",
        "bad-priority": "[zram0]\nswap-priority = high\ncompression-algorithm = zstd(level=x)\n",
        "empty-writeback": "[ zram0 ]\nwriteback-device =\nzram-size=ram*1.5\n",
        "nested-parens": "[zram0]\nzram-size = ((((ram)))) * (1 + (2 * (3 - 1)))\n",
        "expression-line": "min(ram / 2, 4096)\n",
        "set-directive": "set!x = echo 1\nfoo = bar\n[zram0]\nzram-size = x * 2 ^ 3 % 7\n",
        "quotes": "[zram0]\nzram-size = \"min(ram, 2k)\" \ncompression-algorithm: 'zstd'\noptions = discard,\\\n nofail\n",
        "obsolete": "[zram0]\nmemory-limit = none\nzram-fraction = 0.25\nmax-zram-size = 2048\n[zram1]\nmax-zram-size = none\n",
        "functions": "[zram0]\nzram-size = round(64, log(2, ram) * ceil(pi()) + int(e()) + abs(sign(-1)))\n",
        "not-swap": "[zram2]\nmount-point = /var/tmp\n[zram3]\nwriteback-device = relative/path\nswap-priority = -1\n",
    }
    for k, v in confs.items():
        write("zramconf", k, v.encode())


def ublk():
    """Compact records: head (bit 7 clear; bit 6 unaligned start, bit 5 unaligned length,
    low bits content), op index, swap flag, start page, length in pages (mod 40)."""
    def rec(op, page, pages, head=0, swap=0):
        return bytes([head & 0x7F, op, swap, page, pages])

    def raw(op_flags, start, nr):
        return bytes([0x80]) + struct.pack("<IQI", op_flags, start, nr)

    R, W, F, D, Z, SAME, ZA, RZ = range(8)
    seeds = {
        "write-read": rec(W, 0, 1, 3) + rec(R, 0, 1) + rec(W, 4, 16, 2) + rec(R, 0, 20 % 40),
        "all-ops": rec(W, 1, 4, 2) + rec(F, 0, 0) + rec(D, 1, 1) + rec(Z, 2, 1) + rec(R, 0, 8) + rec(SAME, 0, 1)
                   + rec(ZA, 0, 1) + rec(RZ, 0, 1),
        "past-end": rec(W, 60, 8) + rec(R, 255, 1) + rec(D, 0, 39),
        "unaligned": rec(R, 0, 1, 0x40) + rec(W, 0, 1, 0x20),
        "swap-flag": rec(W, 3, 2, 4, 1) + rec(R, 3, 2, 0, 1),
        "raw-overflow": raw(1, 2**64 - 8, 8) + raw(0, (2**64 - 1) >> 9 & ~7, 8) + raw(0x10000 | 3, 0, 2**32 - 1),
        "raw-valid": raw(1, 8, 8) + raw(0, 8, 8) + raw(2, 0, 0) + raw(0xffffffff, 0, 0),
    }
    for k, v in seeds.items():
        write("ublk_request", k, v)


def store():
    """Config byte, then operations: opcode (mod 11) and operands (see fuzz/src/store_ops.rs)."""
    def wp(index, kind):
        return bytes([0, index, kind])

    def w(off, length, kind):
        return bytes([1]) + struct.pack("<HH", off, length - 1) + bytes([kind])

    def r(off, length):
        return bytes([2]) + struct.pack("<HH", off, length - 1)

    def disc(off, length):
        return bytes([4]) + struct.pack("<HH", off, length - 1)

    def zero(off, length):
        return bytes([5]) + struct.pack("<HH", off, length - 1)

    compact, gc, flush = bytes([6]), bytes([9]) + struct.pack("<H", 0xFFFF), bytes([10, 0])

    def age(s):
        return bytes([7, s])

    def wb(idle, budget):
        return bytes([8, idle]) + struct.pack("<H", budget)

    def maintain(ms10):
        return bytes([10, 1, ms10])

    basic = (wp(0, 2) + wp(1, 3) + wp(2, 1) + wp(3, 4) + r(0, 4096 * 3) + w(4000, 300, 2) + r(3900, 600)
             + disc(4096, 8192) + r(0, 12288) + zero(10, 5000) + r(0, 8192) + compact + flush + r(0, 4096))
    fill = b"".join(wp(i, 2 + i % 3) for i in range(32)) + r(0, 12288) + r(60000, 5000)
    backing = (b"".join(wp(i, 2 + i % 3) for i in range(16)) + age(40) + wb(5, 0xFFFF) + r(0, 12288) + gc
               + b"".join(wp(i, 3) for i in range(8)) + wb(0, 100) + maintain(50) + r(8192, 12288) + disc(0, 30000) + gc
               + r(0, 4096))
    seeds = {
        "basic-lz4": bytes([0]) + basic,
        "basic-zstd": bytes([2]) + basic,
        "limit-3-fill": bytes([0x04]) + fill,
        "limit-12-fill-zstd": bytes([0x0E]) + fill,
        "backing-limit-6": bytes([0x09]) + backing,
        "backing-incompressible": bytes([0x19]) + backing,
        "backing-no-promote": bytes([0x2D]) + backing + fill,
        "cold-tier": bytes([0x81]) + backing + age(10) + maintain(50) + r(0, 12288) + r(0, 12288),
        "cold-tier-limit-6-recompress": bytes([0xC9]) + backing + fill + age(10) + maintain(50) + r(0, 12288),
    }
    for k, v in seeds.items():
        write("store_ops", k, v)


def store_recover():
    """Config byte, operations up to 0xff, damage up to 0xff (see fuzz/src/store_recover.rs)."""
    def wp(index, kind, version):
        return bytes([0, index, kind, version])

    def disc(index):
        return bytes([2, index])

    step = bytes([3])  # compaction, the clock on, recompression

    def damage(region, off, val):
        return bytes([region]) + struct.pack("<II", off, val)

    ops = b"".join(wp(i, i % 5, 1) for i in range(32)) + disc(3) + disc(7) + step + wp(5, 2, 2) + wp(6, 4, 3) + step
    seeds = {
        "clean": bytes([0]) + ops + b"\xff" + b"\xff",
        "recompressed-zstd": bytes([3]) + ops + step + step + b"\xff" + b"\xff",
        "locks-and-marks": bytes([2]) + ops + b"\xff" + damage(0, 5, 0x8E) + damage(0, 6, 0x80) + b"\xff",
        "descriptors": bytes([0]) + ops + b"\xff" + damage(1, 0, 7) + damage(1, 0x10001, 0xFFFFFFFF) + damage(1, 0x20002, 3) + b"\xff",
        "journal": bytes([0]) + ops + b"\xff" + damage(2, 3, 0) + damage(2, 4, 1) + damage(2, 5, 0x502) + b"\xff",
        "anything": bytes([1]) + ops + b"\xff" + damage(4, 0, 0xdeadbeef) + damage(4, 70000, 0x12345678) + b"\xff",
    }

    # The cold tier (config bit 2; bit 3 a pool of 12 pages instead of 6): the opcode mod 8 is
    # 0, 1, 4 WRITE, 2 DISCARD, 3, 6 the step, 5 READ (13: twice, promoting), 7 the tier's
    # maintenance, whose operand's low 2 bits are the budget (3: unlimited) and the rest the
    # seconds the clock moves on.
    def read(index, twice=False):
        return bytes([13 if twice else 5, index])

    def tier(secs, budget=3):
        return bytes([7, secs << 2 | budget])

    # Every page written, the tier's maintenance after each four (pages idle 8 s go to it),
    # some read back from it (twice: promoted), discarded and rewritten, the tier collected.
    cold_ops = (b"".join(wp(i, i % 5, 1) + (tier(8) if i % 4 == 3 else b"") for i in range(32)) + read(1) + read(2, True)
                + read(9, True) + disc(3) + disc(12) + wp(5, 2, 2) + tier(8, 1) + wp(6, 4, 3) + step + tier(30, 0) + read(17))
    cold = bytes([0x04]) + cold_ops + b"\xff"
    # Damage of the tier's regions (5-9 mod 10), as fuzz/src/store_recover.rs decodes it.
    seeds.update({
        "cold-clean": cold + b"\xff",
        "cold-zstd-recompress-pool-12": bytes([0x0F]) + cold_ops + step + tier(60) + b"\xff" + b"\xff",
        # Derived: the block being written named (block 2, then none, then block 7).
        "cold-writing-block": cold + damage(5, 0, 3) + damage(5, 1, 9) + damage(5, 2, 8) + b"\xff",
        # Unused bytes: eight places among them (the dictionary area, slots, tail words, tail
        # pages).
        "cold-unused": cold + b"".join(damage(6, k * 0x10001 + 3, 0xA5A5A5A5 + k) for k in range(8)) + b"\xff",
        # The two blocks cold-clean leaves (0 and 1): block 1's entry flipped, block 0's sealed
        # again naming its other slot.
        "cold-entries": cold + damage(7, 1, 0x10) + damage(7, 0 | 1 << 9, 0x20000) + b"\xff",
        # Block 0's tail word forged to name block 1's tail (byte 3672): overlapping tails.
        "cold-tail-words": cold + damage(7, 0 | 3 << 9, 3672 // 8 + 1) + b"\xff",
        # Block 1's tail word flipped.
        "cold-tail-word-flipped": cold + damage(7, 1 | 2 << 9, 0x4) + b"\xff",
        # The bytes of live blobs.
        "cold-blobs": cold + damage(8, 0, 0x11111111) + damage(8, 0x40001, 0x22222222) + b"\xff",
        # Header words: keep.rs's run identifier (2) set to 1, the generation counter (13)
        # raised by 3, the blocks' dictionary length (25) set to 100.
        "cold-headers": cold + damage(9, 2, 1) + damage(9, 13 | 1 << 16, 3) + damage(9, 25, 100) + b"\xff",
        # Derived and unused damage, the RAM's and the tier's.
        "cold-derived-mixed": cold + damage(0, 5, 0x8E) + damage(1, 0, 7) + damage(5, 0, 1) + damage(6, 77, 0xFFFFFFFF) + b"\xff",
        # Anything: a journal byte, and keep.rs's state word zeroed (refused).
        "cold-anything": cold + damage(4, 0x1000, 0xdeadbeef) + damage(9, 0, 0) + b"\xff",
    })
    for k, v in seeds.items():
        write("store_recover", k, v)


def cache():
    """Config byte, then operations: opcode (mod 12) and operands (see fuzz/src/cache_ops.rs)."""
    P = 4096

    def wp(index, pages, kind):
        return bytes([0, index, pages - 1, kind])

    def w(off, length, kind):
        return bytes([1]) + struct.pack("<IH", off, length - 1) + bytes([kind])

    def r(off, length):
        return bytes([2]) + struct.pack("<IH", off, length - 1)

    def seq(first, count):
        return bytes([4, first, count - 1])

    def disc(off, length):
        return bytes([5]) + struct.pack("<IH", off, length - 1)

    def zero(off, length):
        return bytes([6]) + struct.pack("<IH", off, length - 1)

    flush, check = bytes([7]), bytes([9])

    def faults(bits):
        return bytes([8, bits])

    def compact(maintain=False):
        return bytes([10, 1 if maintain else 0])

    def status(off, length):
        return bytes([11]) + struct.pack("<IH", off, length - 1)

    def recompress(retrain=False):
        # Op 10 with an odd operand whose bit 1 is set: a recompression run (config bit 6).
        return bytes([10, 0x83 if retrain else 0x03])

    basic = (r(0, 8 * P) + wp(2, 2, 2) + r(0, 4 * P) + w(4000, 300, 3) + r(3900, 600) + disc(P, 2 * P) + r(0, 3 * P)
             + zero(10, 5000) + r(0, 2 * P) + flush + check + compact() + status(0, 16 * P) + r(0, P))
    scan = seq(0, 16) + seq(16, 16) + seq(32, 16) + seq(48, 16) + r(0, 8 * P) + seq(0, 8) + check + compact(True)
    fill = b"".join(wp(i, 4, 3 + i % 2) for i in range(0, 64, 4)) + r(0, 8 * P) + check + flush
    # EIO on reads, then short reads: reads of uncached pages fail, cached ones are served.
    read_faults = r(0, 8 * P) + faults(1) + r(0, 8 * P) + r(40 * P, 8 * P) + check + faults(2) + r(20 * P, 3 * P) + faults(0) + r(40 * P, 8 * P)
    # A torn write (the first page reaches the origin), a partial write needing an origin read
    # while reads fail, a failed sync, failed discard and zeroing.
    write_faults = (r(0, 8 * P) + faults(4) + wp(1, 3, 2) + r(0, 8 * P) + faults(1) + w(10 * P + 100, 200, 2)
                    + w(P, 100, 2) + faults(8) + wp(5, 1, 2) + flush + faults(16) + disc(0, 4 * P) + zero(8 * P, 2 * P)
                    + zero(100, 50) + faults(0) + flush + check + r(0, 16 * P))
    seeds = {
        "basic-memory-lz4": bytes([0x00]) + basic,
        "basic-file-zstd": bytes([0x03]) + basic,
        "scan-budget-48-ra-256": bytes([0x3C]) + scan,
        "scan-file-budget-24-ra-16": bytes([0x29]) + scan,
        "fill-budget-4": bytes([0x00]) + fill,
        "fill-budget-8-zstd": bytes([0x06]) + fill,
        "read-faults-ra-2": bytes([0x1C]) + read_faults,
        "write-faults-file": bytes([0x09]) + write_faults,
        "write-faults-memory": bytes([0x3E]) + write_faults + scan,
        # Recompression of cached pages (bit 6): cached text, recompressed, read, rewritten,
        # evicted by a scan, recompressed again after a retrain; and under read faults.
        "recompress-budget-24": bytes([0x48]) + fill + recompress() + r(0, 8 * P) + wp(1, 2, 2) + recompress()
        + scan + recompress(True) + check + r(0, 16 * P) + flush,
        "recompress-file-zstd-budget-8-faults": bytes([0x47]) + fill + recompress() + faults(1) + r(0, 8 * P)
        + check + faults(0) + recompress(True) + r(0, 8 * P) + write_faults,
    }
    for k, v in seeds.items():
        write("cache_ops", k, v)


def clear_made_seeds():
    """Removes the seeds this script made, keeping the inputs that once crashed a target
    (`crash-*`, put there by hand when the bug was fixed: they are regression tests)."""
    seeds = os.path.join(ROOT, "seeds")
    for t in os.listdir(seeds) if os.path.isdir(seeds) else []:
        for f in os.listdir(os.path.join(seeds, t)):
            if not f.startswith("crash-"):
                os.remove(os.path.join(seeds, t, f))


if __name__ == "__main__":
    clear_made_seeds()
    nbd()
    control()
    zramconf()
    ublk()
    store()
    store_recover()
    cache()
    for t in sorted(os.listdir(os.path.join(ROOT, "seeds"))):
        print(t, len(os.listdir(os.path.join(ROOT, "seeds", t))), "seeds")
