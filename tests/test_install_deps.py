"""scripts/install-deps in groups (issue 27, "First run"): `core`, what scripts/demo installs,
asks apt for the packages of scripts/deps/apt-core.txt alone and builds nothing from source;
no group (what scripts/test runs) asks for every list and installs cargo-afl and cargo-deb.

The script runs for real, with `apt-get`, `dpkg-query`, `python3` and `cargo` replaced by
programs on PATH that record their arguments (and report every package missing), so that it
installs nothing here. Needs root (the script refuses other users before it does anything).
"""

import os
import subprocess
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE = {
    # Every package is missing, so that the script asks apt-get for all it wants.
    "dpkg-query": "exit 1",
    "apt-get": 'echo "apt-get $*" >> "$LOG"',
    "python3": 'echo "python3 $*" >> "$LOG"',
    # No cargo-afl, no cargo-deb; `cargo install` is recorded; rustc for the AFL++ check.
    "cargo": 'echo "cargo $*" >> "$LOG"; case "$1" in afl|deb) [ "$2" = --version ] && exit 1;; esac; exit 0',
    "rustc": 'echo "rustc 1.90.0 (1159e78c4 2025-09-14)"',
}


def list_packages(name):
    with open(os.path.join(REPO, "scripts", "deps", name)) as f:
        return {w for line in f for w in line.split("#")[0].split()}


def run_install_deps(*groups):
    """Runs scripts/install-deps GROUPS with the fakes; returns (exit code, recorded calls)."""
    with tempfile.TemporaryDirectory(prefix="compcache-install-deps-") as d:
        bindir = os.path.join(d, "bin")
        os.mkdir(bindir)
        for name, body in FAKE.items():
            path = os.path.join(bindir, name)
            with open(path, "w") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(path, 0o755)
        log = os.path.join(d, "log")
        open(log, "w").close()
        env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": d, "LOG": log}
        p = subprocess.run([os.path.join(REPO, "scripts", "install-deps"), *groups], env=env,
                           capture_output=True, text=True, timeout=60)
        with open(log) as f:
            return p.returncode, p.stderr, f.read().splitlines()


def apt_installs(calls):
    """The packages of the `apt-get install` call."""
    installs = [c.split() for c in calls if c.startswith("apt-get") and " install " in c]
    assert len(installs) == 1, calls
    return {w for w in installs[0] if not w.startswith("-") and w not in ("apt-get", "install")}


@pytest.fixture(autouse=True)
def need_root():
    if os.geteuid() != 0:
        pytest.skip("scripts/install-deps runs as root only (it refuses other users before anything else)")


def test_core_installs_only_what_building_and_running_needs():
    rc, err, calls = run_install_deps("core")
    assert rc == 0, err
    assert apt_installs(calls) == list_packages("apt-core.txt")
    assert not [c for c in calls if c.startswith("cargo install") or c.startswith("python3")], calls
    for heavy in ("default-jdk-headless", "nodejs", "qemu-system-x86", "nbdkit", "fio"):
        assert heavy not in apt_installs(calls)


def test_no_group_installs_everything_as_scripts_test_needs():
    rc, err, calls = run_install_deps()
    assert rc == 0, err
    every = set()
    for name in os.listdir(os.path.join(REPO, "scripts", "deps")):
        if name.startswith("apt-"):
            every |= list_packages(name)
    assert apt_installs(calls) == every
    installed = " ".join(c for c in calls if c.startswith("cargo install"))
    assert "cargo-afl" in installed and "cargo-deb" in installed, calls
    assert any("pip install" in c and "pip-tests.txt" in c for c in calls), calls


def test_groups_add_to_core_and_an_unknown_group_is_refused():
    rc, err, calls = run_install_deps("packaging")
    assert rc == 0, err
    assert apt_installs(calls) == list_packages("apt-core.txt") | list_packages("apt-packaging.txt")
    installed = " ".join(c for c in calls if c.startswith("cargo install"))
    assert "cargo-deb" in installed and "cargo-afl" not in installed, calls
    rc, err, calls = run_install_deps("everything")
    assert rc == 2 and "unknown group 'everything'" in err and not calls, err


def test_the_demo_installs_core_alone():
    with open(os.path.join(REPO, "scripts", "demo")) as f:
        lines = [line.strip() for line in f if "install-deps" in line and not line.strip().startswith("#")]
    assert lines == ["scripts/install-deps core"], lines
