"""Runtime control of a running server (`compcache set`, `compcache writeback`, the control
protocol's `set` and `writeback` commands, docs/cli.md): real pages are written with nbdcopy,
the memory limit and writeback settings are changed while it serves, an idle writeback moves
pages to the backing file within a re-armed limit, and every page still reads back exactly.
"""
import json
import os

from conftest import file_sha256, need, run

MiB = 1 << 20
KiB = 1 << 10


def compcache(server, *args, check=True):
    return run([server.binary, *args, "--control", server.control], check=check, timeout=60)


def settings(server):
    return json.loads(compcache(server, "set", "--json").stdout)


def test_set_and_writeback_change_a_running_device(start_server, page_files, tmp_path):
    need("nbdcopy")
    src = page_files["mixed"]
    size = os.path.getsize(src)
    backing = tmp_path / "backing.img"
    srv = start_server(str(size), "--mem-limit", "256M", "--backing", str(backing))
    run(["nbdcopy", "--flush", src, srv.uri])

    # Shown as set at start; the defaults of zram-generator-like servers (90% / 70%).
    s = settings(srv)
    assert s["mem_limit"] == 256 * MiB and s["writeback"]["limit_bytes"] == 0, s
    text = compcache(srv, "set").stdout
    assert text.startswith("memory limit 256M, mem_used_max "), text
    assert "writeback: from " in text and "rate none, limit none" in text, text

    # A refused change says why, exits 1 and changes nothing.
    p = compcache(srv, "set", "--mem-limit", "1G", "--writeback-high", "10", check=False)
    assert p.returncode == 1 and "watermarks high 10%" in p.stderr, p.stderr
    assert settings(srv)["mem_limit"] == 256 * MiB

    # Idle writeback within a limit: nothing is idle for an hour yet; everything is for 0 s,
    # but the limit (512 KiB) stops it, until it is re-armed.
    compcache(srv, "set", "--writeback-limit", "512K")
    out = json.loads(compcache(srv, "writeback", "--idle", "1h", "--json").stdout)
    assert out["report"]["pages"] == 0, out
    out = json.loads(compcache(srv, "writeback", "--idle", "0", "--json").stdout)
    first = out["report"]
    assert 0 < first["bytes"] <= 512 * KiB + 4 * KiB, first
    assert settings(srv)["writeback"]["limit_left_bytes"] <= 4 * KiB
    compcache(srv, "set", "--writeback-limit", "2M")
    text = compcache(srv, "writeback", "--idle", "0").stdout
    assert text.startswith("written back: "), text
    st = srv.stat()
    assert st["bd_writeback_pages"] > first["pages"], st
    assert st["bd_count"] == st["bd_writeback_pages"], st

    # The memory limit and the peak: lowered under the peak, mem_used_max reset to what is used.
    before = st["mem_used_max"]
    s = json.loads(compcache(srv, "set", "--mem-limit", "64M", "--reset-mem-used-max", "--json").stdout)
    assert s["ok"] and s["mem_limit"] == 64 * MiB and s["mem_used_max"] <= before, s
    st = srv.stat()
    assert st["mem_limit"] == 64 * MiB and st["mem_used_max"] == s["mem_used_max"], st

    # Every page reads back exactly, from RAM and from the backing file.
    out_file = tmp_path / "out.bin"
    run(["nbdcopy", srv.uri, str(out_file)])
    assert file_sha256(out_file) == file_sha256(src), "data read back differs from data written"
    assert srv.stat()["bd_reads"] > 0


def test_writeback_without_a_backing_device_is_refused(start_server):
    srv = start_server("64M")
    p = compcache(srv, "writeback", "--idle", "0", check=False)
    assert p.returncode == 1 and "no backing device" in p.stderr and "--backing" in p.stderr, p.stderr
    text = compcache(srv, "set", "--mem-limit", "32M").stdout
    assert text == "memory limit 32M, mem_used_max 0B\nwriteback: no backing device\n", text
    p = compcache(srv, "writeback", "--idle", "2w", check=False)
    assert p.returncode == 2 and "give seconds" in p.stderr, p.stderr


def test_list_shows_every_device_it_is_given(start_server, tmp_path):
    """`compcache list` with `--control` for two servers (the default directory may hold
    others: only these two are checked): one row each, sizes as zramctl prints them, a long
    socket path widening its column, `--json` with the schema version and sizes in bytes."""
    a = start_server("64M")
    b = start_server("128M", "--algorithm", "zstd", "--mem-limit", "32M", "--backing", str(tmp_path / "b.img"))
    # A stale control socket (its server gone) is skipped without a word.
    stale = tmp_path / "stale.ctl"
    import socket as socketlib
    s = socketlib.socket(socketlib.AF_UNIX)
    s.bind(str(stale))
    s.close()
    args = [a.binary, "list", "--control", a.control, "--control", b.control, "--control", str(stale)]
    listed = json.loads(run(args + ["--json"]).stdout)
    assert listed["schema_version"] == 1
    mine = {d["control"]: d for d in listed["devices"] if d["control"] in (a.control, b.control)}
    assert set(mine) == {a.control, b.control}, listed
    assert mine[a.control]["name"] == a.socket and mine[a.control]["disksize"] == 64 * MiB
    assert mine[a.control]["frontend"] == "nbd-server" and mine[a.control]["priority"] is None
    assert (mine[b.control]["algorithm"], mine[b.control]["mem-limit"]) == ("zstd", 32 * MiB), mine[b.control]

    p = run(args + ["-o", "NAME,DISKSIZE,ALGORITHM,MEM-LIMIT,BACKING"])
    assert p.stderr == "", p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DISKSIZE", "ALGORITHM", "MEM-LIMIT", "BACKING"], lines
    row_b = next(line for line in lines if line.startswith(b.socket + " "))
    assert row_b.split() == [b.socket, "128M", "zstd", "32M", str(tmp_path / "b.img")], row_b
    # Aligned: ALGORITHM starts at the same column on every line.
    starts = {line.index("lz4") if "lz4" in line else line.index("zstd") for line in lines[1:] if line.startswith(("/", "?"))}
    assert len(starts) == 1 and lines[0].index("ALGORITHM") in starts, p.stdout

    p = run(args + ["-o", "NAME,DATA", "--bytes", "--noheadings"])
    assert any(line.split() == [a.socket, "0"] for line in p.stdout.splitlines()), p.stdout
    p = run(args + ["-o", "NAME,STREAMS"], check=False)
    assert p.returncode == 2 and "unknown column" in p.stderr and "PRIORITY" in p.stderr, p.stderr

    # `stat --json` carries the device and the layout's version beside the statistics.
    st = a.stat()
    assert st["schema_version"] == 1 and st["protocol"] == 3, st
    assert st["device"]["frontend"] == "nbd-server" and st["device"]["nbd_socket"] == a.socket, st["device"]
