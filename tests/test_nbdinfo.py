"""nbdinfo sees the export with the size, capabilities and block sizes the server declares."""
import json

from conftest import EXPORT_NAME, need, run


def test_export_size_flags_and_block_sizes(start_server):
    need("nbdinfo")
    size = 96 << 20
    srv = start_server(str(size))
    assert srv.ready_line, "compcache serve prints one line when ready"
    info = json.loads(run(["nbdinfo", "--json", srv.uri]).stdout)
    assert info["protocol"] == "newstyle-fixed"
    (export,) = info["exports"]
    assert export["export-name"] == EXPORT_NAME
    assert export["export-size"] == size
    assert export["is_read_only"] is False
    for cap in ("can_trim", "can_zero", "can_multi_conn", "can_flush", "can_fua"):
        assert export[cap] is True, f"{cap} should be advertised"
    # Block sizes (NBD_INFO_BLOCK_SIZE): any byte range is served, pages are preferred,
    # and the payload limit is the protocol's 32 MiB.
    assert export["block_size_minimum"] == 1
    assert export["block_size_preferred"] == 4096
    assert export["block_size_maximum"] == 32 << 20


def test_export_list_and_default_name(server):
    need("nbdinfo")
    listing = run(["nbdinfo", "--list", "--json", f"nbd+unix://?socket={server.socket}"])
    names = [e["export-name"] for e in json.loads(listing.stdout)["exports"]]
    assert EXPORT_NAME in names
    # The protocol's default (empty) export name reaches the same device.
    size = run(["nbdinfo", "--size", f"nbd+unix://?socket={server.socket}"]).stdout.strip()
    assert int(size) == 256 << 20


def test_sizes_are_rounded_down_to_pages(start_server):
    need("nbdinfo")
    srv = start_server("1000000")  # 244 pages and 576 bytes
    assert int(run(["nbdinfo", "--size", srv.uri]).stdout) == 1000000 // 4096 * 4096
