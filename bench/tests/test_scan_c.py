"""tools/scan/scan.c built into a temporary directory and run on a few MiB (no privileges)."""

import os
import shutil
import subprocess

import pytest

from bench.parse import parse_scan_output

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "scan", "scan.c")


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed")
    exe = str(tmp_path_factory.mktemp("scan") / "scan")
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu99", "-o", exe, SRC], check=True)
    return exe


def _run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60)


def test_cyclic_verified(scan):
    p = _run(scan, "-V", "-w", "4", "3")
    assert p.returncode == 0, p.stderr
    s = parse_scan_output(p.stdout)
    assert s["verify"] == "ok" and s["mismatches"] == 0 and s["mode"] == "cyclic"
    assert s["same_pages"] + s["text_pages"] + s["struct_pages"] + s["random_pages"] == 4 * 256


def test_use_once_refills_every_pass(scan):
    s = parse_scan_output(_run(scan, "-V", "-m", "once", "2", "3").stdout)
    assert s["mode"] == "once" and s["verify"] == "ok"
    assert s["same_pages"] + s["text_pages"] + s["struct_pages"] + s["random_pages"] == 3 * 2 * 256


def test_mix_is_respected_and_deterministic(scan, tmp_path):
    s = parse_scan_output(_run(scan, "-x", "0:0:0:100", "1", "1").stdout)
    assert s["random_pages"] == 256
    a, b = tmp_path / "a", tmp_path / "b"
    _run(scan, "-D", a, "1", "0")
    _run(scan, "-D", b, "1", "0")
    assert a.read_bytes() == b.read_bytes() and len(a.read_bytes()) == 1 << 20
    _run(scan, "-s", "2", "-D", b, "1", "0")
    assert a.read_bytes() != b.read_bytes()


def test_page_file_content(scan, tmp_path):
    pages = tmp_path / "pages.bin"
    pages.write_bytes(bytes(range(256)) * 16 * 3 + b"partial")  # 3 whole pages and a tail
    dump = tmp_path / "dump"
    p = _run(scan, "-V", "-p", pages, "-D", dump, "1", "1")
    assert p.returncode == 0, p.stderr
    assert parse_scan_output(p.stdout)["content"] == "file"
    assert dump.read_bytes()[:4096] == bytes(range(256)) * 16


@pytest.mark.parametrize("args", [["-x", "50:50:50:0", "1", "1"], ["0", "1"], ["-m", "sideways", "1", "1"], ["1"],
                                  ["-p", "/nonexistent", "1", "1"]])
def test_bad_arguments_exit_1(scan, args):
    p = _run(scan, *args)
    assert p.returncode == 1 and p.stderr
