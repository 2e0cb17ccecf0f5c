"""The Debian package (packaging/build-deb.sh, docs/packaging.md):

- it is built by packaging/build-deb.sh (cargo-deb) into a temporary directory;
- its contents (dpkg-deb -c): the binary, a gzipped man page per subcommand (the set
  `compcache generate man` makes), the bash, zsh and fish completions where those shells look,
  the example zram-generator configuration and the documentation; every file root's, under
  /usr only (nothing in /etc, /run or /var); its control fields (name, version, Depends);
- installed with `dpkg --root` into a new, empty root in a temporary directory (its package
  database is a copy of this machine's, so Depends are checked against what is installed
  here, where the binary runs): the installed `compcache --version`; `man compcache-serve`
  found in the root's man path and rendered, and `man -l` of every installed page; the bash
  completion passes `bash -n` and, loaded, completes `compcache se<TAB>` to `serve` and
  `compcache swapon --mem<TAB>` to `--mem-limit` (zsh -n and fish -n when those shells are
  installed); `dpkg --root -r` then removes every file;
- systemd units: a package built with a unit directory of the test's own (`--units`: a
  service running the installed binary) ships it in /usr/lib/systemd/system, and
  `systemd-analyze verify --root` accepts it there; units in packaging/systemd/, if the tree
  has any, are verified the same way from the main package.

Root only (dpkg --root refuses to install as another user); skipped with the reason when not
root, or when dpkg, cargo-deb or man is missing. The temporary directories (packages and
roots) are removed in teardown, also when a test fails; nothing is installed on this system.
Like the other tests, it leaves the release build in target/ (build-deb.sh also writes the
generated pages and completions to target/release/packaging/).
"""
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from conftest import REPO, need, need_root, run

BUILD_DEB = os.path.join(REPO, "packaging", "build-deb.sh")
# Building the release binary from nothing takes minutes on 2 cores.
BUILD_TIMEOUT_S = 3600
MAN1 = "usr/share/man/man1"
COMPLETIONS = {
    "bash": "usr/share/bash-completion/completions/compcache",
    "zsh": "usr/share/zsh/vendor-completions/_compcache",
    "fish": "usr/share/fish/vendor_completions.d/compcache.fish",
}
DOC = "usr/share/doc/compcache"
UNIT_DIR = "usr/lib/systemd/system"
# The test's own unit, for the units path of the package (packaging/systemd/ may be empty).
TEST_UNIT_NAME = "compcache-package-test.service"
TEST_UNIT = """[Unit]
Description=compcache packaging test unit (tests/test_package.py)

[Service]
Type=oneshot
ExecStart=/usr/bin/compcache stat --control /run/compcache/compcache.sock.ctl
"""


def need_packaging_tools():
    need_root("dpkg --root installs files owned by root and refuses to run as another user")
    need("dpkg", "dpkg-deb", "dpkg-shlibdeps", "man", "bash", "gzip", "file")
    p = subprocess.run(["cargo", "deb", "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=cargo_env())
    if p.returncode != 0:
        pytest.skip("needs cargo-deb (scripts/install-deps installs it)")


def cargo_env():
    env = dict(os.environ)
    env["PATH"] = os.path.expanduser("~/.cargo/bin") + os.pathsep + env.get("PATH", "")
    return env


def build_deb(out_dir, *args):
    """Runs packaging/build-deb.sh --output out_dir; the path of the .deb it printed."""
    p = run([BUILD_DEB, "--output", out_dir, *args], timeout=BUILD_TIMEOUT_S, env=cargo_env())
    deb = p.stdout.strip().splitlines()[-1]
    assert deb.endswith(".deb") and os.path.dirname(os.path.abspath(deb)) == os.path.abspath(out_dir), p.stdout
    assert os.path.isfile(deb), deb
    return deb


def contents(deb):
    """{path without the leading ./: (mode string, owner/group)} of the files in the package."""
    files = {}
    for line in run(["dpkg-deb", "-c", deb]).stdout.splitlines():
        mode, owner, _size, _date, _time, path = line.split(None, 5)
        path = path.split(" -> ")[0]
        files[path.removeprefix("./").rstrip("/")] = (mode, owner)
    return files


def extract(deb, tmp):
    """dpkg-deb -x of the package into a new directory under tmp; its path."""
    out = tempfile.mkdtemp(prefix="extract-", dir=tmp)
    run(["dpkg-deb", "-x", deb, out])
    return out


def field(deb, name):
    return run(["dpkg-deb", "-f", deb, name]).stdout.strip()


def expected_man_pages(binary, tmp):
    """The page names `compcache generate man` writes: one per visible subcommand."""
    out = os.path.join(tmp, "man")
    run([binary, "generate", "man", "--out", out])
    return sorted(os.listdir(out))


def release_binary():
    """The binary build-deb.sh built (in cargo's target directory, CARGO_TARGET_DIR too)."""
    meta = run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=REPO, env=cargo_env())
    return os.path.join(json.loads(meta.stdout)["target_directory"], "release", "compcache")


def repo_units():
    units_dir = os.path.join(REPO, "packaging", "systemd")
    return sorted(os.listdir(units_dir)) if os.path.isdir(units_dir) else []


class Root:
    """A new, empty root for dpkg --root in a temporary directory: the dpkg database's
    directories, and a copy of this machine's package status (so that dpkg checks Depends
    against what is installed here). Removed by remove()."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="compcache-pkgroot-")
        admin = os.path.join(self.dir, "var", "lib", "dpkg")
        for d in ("info", "updates", "triggers", "alternatives"):
            os.makedirs(os.path.join(admin, d))
        shutil.copyfile("/var/lib/dpkg/status", os.path.join(admin, "status"))
        open(os.path.join(admin, "available"), "w").close()

    def dpkg(self, *args, check=True):
        # --force-script-chrootless: maintainer scripts (cargo-deb writes none) would run
        # without a chroot; the root has no shell to chroot into.
        return run(["dpkg", f"--root={self.dir}", "--force-script-chrootless", *args], check=check, timeout=300)

    def path(self, rel):
        return os.path.join(self.dir, rel)

    def files(self):
        """Regular files and links under the root, outside dpkg's database."""
        found = []
        for top, _dirs, names in os.walk(self.dir):
            rel_top = os.path.relpath(top, self.dir)
            if rel_top == "var/lib/dpkg" or rel_top.startswith("var/lib/dpkg/"):
                continue
            found += [os.path.normpath(os.path.join(rel_top, n)) for n in names]
        return sorted(found)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def tmp_dir():
    d = tempfile.mkdtemp(prefix="compcache-pkgtest-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def deb(tmp_dir):
    """The package as packaging/build-deb.sh builds it from this tree."""
    need_packaging_tools()
    out = os.path.join(tmp_dir, "deb")
    os.mkdir(out)
    return build_deb(out)


@pytest.fixture
def root():
    r = Root()
    yield r
    r.remove()


def test_contents(deb, tmp_dir):
    files = contents(deb)
    listing = "\n".join(sorted(files))
    assert files.get("usr/bin/compcache", ("",))[0] == "-rwxr-xr-x", listing
    pages = expected_man_pages(release_binary(), tmp_dir)
    assert {"compcache.1", "compcache-serve.1", "compcache-swapon.1", "compcache-stat.1"} <= set(pages), pages
    for page in pages:
        assert f"{MAN1}/{page}.gz" in files, f"{page} not in the package:\n{listing}"
    shipped_pages = sorted(p for p in files if p.startswith(MAN1 + "/") and p != MAN1)
    assert shipped_pages == [f"{MAN1}/{p}.gz" for p in pages], "only the generated pages, all gzipped"
    for path in [*COMPLETIONS.values(), f"{DOC}/README.md", f"{DOC}/docs/cli.md", f"{DOC}/docs/swap.md",
                 f"{DOC}/docs/packaging.md", f"{DOC}/examples/zram-generator.conf.example", f"{DOC}/copyright"]:
        assert path in files and files[path][0] == "-rw-r--r--", f"{path}:\n{listing}"
    for path, (mode, owner) in files.items():
        assert owner in ("root/root", "0/0"), f"{path} belongs to {owner}"
        assert path == "usr" or path.startswith("usr/"), f"{path}: the package installs under /usr only"
    units = sorted(p.removeprefix(UNIT_DIR + "/") for p in files if p.startswith(UNIT_DIR + "/"))
    assert units == repo_units(), "the units are packaging/systemd/'s (none when it has none)"

    assert field(deb, "Package") == "compcache"
    assert field(deb, "Architecture") == run(["dpkg", "--print-architecture"]).stdout.strip()
    version = run([release_binary(), "--version"]).stdout.split()[1]
    assert field(deb, "Version").startswith(version), field(deb, "Version")
    depends = field(deb, "Depends")
    for dep in ("libc6", "mount"):
        assert re.search(rf"(^|, ){dep}\b", depends), f"Depends: {depends}"

    # The binary is stripped; its symbols are in the -dbgsym package beside it.
    assert "debug_info" not in run(["file", "-b", os.path.join(extract(deb, tmp_dir), "usr/bin/compcache")]).stdout
    dbgsym = glob.glob(os.path.join(os.path.dirname(deb), "compcache-dbgsym_*.ddeb"))
    assert len(dbgsym) == 1, os.listdir(os.path.dirname(deb))
    assert any(p.startswith("usr/lib/debug/.build-id/") and p.endswith(".debug") for p in contents(dbgsym[0]))


def test_install_run_man_completions_remove(deb, root):
    p = root.dpkg("--install", deb)
    assert "Setting up compcache" in p.stdout, p.stdout
    installed = root.dpkg("--listfiles", "compcache").stdout.split()
    assert "/usr/bin/compcache" in installed, installed

    binary = root.path("usr/bin/compcache")
    out = run([binary, "--version"]).stdout.strip()
    assert re.fullmatch(r"compcache \d+\.\d+\.\d+\S*", out), out
    assert field(deb, "Version").startswith(out.split()[1])

    # `man compcache-serve`, looked up in the root's man path only (not this system's).
    env = dict(os.environ, MANPATH=root.path("usr/share/man"), MANPAGER="cat", PAGER="cat",
               MANWIDTH="100", LC_ALL="C.UTF-8")
    env.pop("MANOPT", None)
    p = run(["man", "-w", "compcache-serve"], env=env)
    assert p.stdout.strip() == root.path(f"{MAN1}/compcache-serve.1.gz"), p.stdout
    page = run(["man", "-P", "cat", "compcache-serve"], env=env).stdout
    assert "compcache-serve" in page and "--mem-limit" in page and "SYNOPSIS" in page, page[:2000]
    assert "compcache(1)" in page, "SEE ALSO the command's page"
    for path in sorted(glob.glob(root.path(f"{MAN1}/*.1.gz"))):
        p = run(["man", "-l", "-P", "cat", path], env=env)
        name = os.path.basename(path).removesuffix(".1.gz")
        assert name in p.stdout and "NAME" in p.stdout, f"{path} renders:\n{p.stdout[:1000]}\n{p.stderr}"
        assert "warning" not in p.stderr.lower(), f"{path}: {p.stderr}"

    bash_completion = root.path(COMPLETIONS["bash"])
    run(["bash", "-n", bash_completion])
    # Loaded into a shell, the completion function completes subcommands and flags.
    script = (f"source {bash_completion}\n"
              "complete -p compcache\n"
              "COMP_WORDS=(compcache se); COMP_CWORD=1; COMP_LINE='compcache se'; COMP_POINT=${#COMP_LINE}\n"
              "_compcache compcache se compcache; echo \"sub: ${COMPREPLY[*]}\"\n"
              "COMP_WORDS=(compcache swapon --mem); COMP_CWORD=2; COMP_LINE='compcache swapon --mem'\n"
              "COMP_POINT=${#COMP_LINE}; _compcache compcache --mem swapon; echo \"flag: ${COMPREPLY[*]}\"\n")
    p = run(["bash", "--norc", "--noprofile", "-c", script])
    lines = p.stdout.splitlines()
    assert any(line.startswith("complete ") and line.endswith(" compcache") for line in lines), p.stdout
    sub = next(line for line in lines if line.startswith("sub:")).split()[1:]
    assert "serve" in sub and "generate" not in sub, p.stdout
    flag = next(line for line in lines if line.startswith("flag:")).split()[1:]
    assert "--mem-limit" in flag, p.stdout
    for shell in ("zsh", "fish"):
        if shutil.which(shell):
            run([shell, "-n", root.path(COMPLETIONS[shell])])
        else:
            print(f"{shell} is not installed: its completion was checked for presence only")
        assert os.path.getsize(root.path(COMPLETIONS[shell])) > 0

    assert root.files(), "the package installed files"
    root.dpkg("--remove", "compcache")
    assert root.files() == [], f"left behind by dpkg --remove: {root.files()}"


def verify_units(root, names):
    """systemd-analyze verify of units installed in `root`, against the root (`--root`: the
    programs the units run must be there, e.g. the installed /usr/bin/compcache). systemd's
    own units (sysinit.target, ...) are copied into the root from this machine first, after
    the install, leaving the package's files as they are: verify loads them as dependencies."""
    need("systemd-analyze")
    host_units = "/usr/lib/systemd/system"
    if not os.path.isdir(host_units):
        pytest.skip(f"{host_units} is missing: systemd-analyze verify needs systemd's own units")

    def packaged(src_dir, entries):
        """The entries the package installed already: left as they are."""
        dst_dir = os.path.join(root.path(UNIT_DIR), os.path.relpath(src_dir, host_units))
        return [n for n in entries
                if not os.path.isdir(os.path.join(src_dir, n)) and os.path.lexists(os.path.join(dst_dir, n))]

    shutil.copytree(host_units, root.path(UNIT_DIR), symlinks=True, dirs_exist_ok=True, ignore=packaged)
    # A template (`name@.service`) is verified as an instance of it, which systemd loads from
    # the template's file.
    paths = [root.path(f"{UNIT_DIR}/{n.replace('@.', '@zram0.')}") for n in names]
    # --man=no: verify would run the host's man for Documentation=man:..., where the package
    # is not installed (the pages themselves are checked in the installed root above).
    p = run(["systemd-analyze", "verify", "--man=no", f"--root={root.dir}", *paths], check=False)
    assert p.returncode == 0, f"systemd-analyze verify {names}:\n{p.stdout}\n{p.stderr}"


def test_units_installed_and_verified(tmp_dir, root):
    need_packaging_tools()
    units = os.path.join(tmp_dir, "units")
    os.makedirs(units, exist_ok=True)
    with open(os.path.join(units, TEST_UNIT_NAME), "w") as f:
        f.write(TEST_UNIT)
    out = os.path.join(tmp_dir, "deb-units")
    os.makedirs(out, exist_ok=True)
    deb = build_deb(out, "--units", units)
    files = contents(deb)
    assert files.get(f"{UNIT_DIR}/{TEST_UNIT_NAME}", ("",))[0] == "-rw-r--r--", "\n".join(sorted(files))
    assert "usr/bin/compcache" in files, "the variant keeps every other asset"
    root.dpkg("--install", deb)
    verify_units(root, [TEST_UNIT_NAME])

    # A file other than a unit in the units directory is refused, saying so.
    with open(os.path.join(units, "README"), "w") as f:
        f.write("not a unit\n")
    p = run([BUILD_DEB, "--output", out, "--units", units], check=False, timeout=BUILD_TIMEOUT_S, env=cargo_env())
    assert p.returncode != 0 and "is not a systemd unit file" in p.stderr, p.stderr


def test_repo_units_verified(deb, root):
    names = repo_units()
    if not names:
        pytest.skip("packaging/systemd/ has no units yet: nothing of the tree's to verify "
                    "(test_units_installed_and_verified covers the mechanism)")
    root.dpkg("--install", deb)
    verify_units(root, names)
