#!/usr/bin/env bash
# Builds compcache's Debian package with cargo-deb and prints the path of the .deb.
#
#   packaging/build-deb.sh [--units DIR] [--output DIR] [CARGO-DEB FLAGS...]
#
# 1. the release binary (cargo build --release -p compcache --locked);
# 2. into TARGET/release/packaging/ (TARGET: cargo's target directory, CARGO_TARGET_DIR too):
#    man/*.1.gz (`compcache generate man`, gzipped), completions/ (`compcache generate
#    completions`: bash, zsh, fish) and systemd/ (the unit files of packaging/systemd/, or of
#    --units DIR);
# 3. cargo deb --no-build, with the `systemd` variant of crates/cli/Cargo.toml when there are
#    unit files. The package lands in TARGET/debian/, or --output DIR, with its debug symbols
#    beside it (compcache-dbgsym_*.ddeb); the .deb's path is printed on stdout.
#
# What the package holds and where: docs/packaging.md. Needs cargo-deb
# (scripts/install-deps packaging installs the pinned version). Runs as any user.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

units_dir=packaging/systemd
output=
deb_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --units) units_dir=${2:?--units needs a directory}; shift 2 ;;
    --output) output=${2:?--output needs a directory}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) deb_args+=("$1"); shift ;;
  esac
done

die() { echo "build-deb: $*" >&2; exit 1; }

command -v cargo >/dev/null || die "cargo is not installed: run scripts/install-deps packaging as root (or install Rust with rustup)"
cargo deb --version >/dev/null 2>&1 \
  || die "cargo-deb is not installed: run scripts/install-deps packaging as root, or: cargo install --locked cargo-deb --version 3.8.0"
command -v gzip >/dev/null || die "gzip is not installed (apt-get install gzip)"

target=$(cargo metadata --format-version 1 --no-deps --locked \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])') \
  || die "cargo metadata failed (see above): is Cargo.lock up to date?"

echo "build-deb: building the release binary" >&2
cargo build --release -p compcache --locked >&2
bin=$target/release/compcache

stage=$target/release/packaging
rm -rf "$stage"
mkdir -p "$stage/systemd"
"$bin" generate man --out "$stage/man" >/dev/null
gzip -9n "$stage"/man/*.1
"$bin" generate completions --out "$stage/completions" >/dev/null

# Unit files only: every file in the units directory is installed in /usr/lib/systemd/system,
# so anything else there is a mistake to report, not to package.
variant=()
if [ -d "$units_dir" ]; then
  shopt -s nullglob
  for f in "$units_dir"/*; do
    case ${f##*/} in
      *.service|*.socket|*.swap|*.target|*.timer|*.path|*.mount|*.automount|*.slice|*.scope) cp "$f" "$stage/systemd/" ;;
      *) die "$f is not a systemd unit file (.service, .swap, .socket, ...): only units go in $units_dir; other files need their own asset line in crates/cli/Cargo.toml" ;;
    esac
  done
  shopt -u nullglob
fi
if [ -n "$(ls -A "$stage/systemd")" ]; then
  variant=(--variant systemd)
  echo "build-deb: with the systemd units of $units_dir: $(ls "$stage/systemd" | tr '\n' ' ')" >&2
else
  echo "build-deb: no systemd units ($units_dir has none)" >&2
fi

out_dir=${output:-$target/debian}
mkdir -p "$out_dir"
# cargo-deb prints the paths of the packages it wrote on stdout: the debug symbols'
# compcache-dbgsym_*.ddeb (crates/cli/Cargo.toml: dbgsym), then compcache_*.deb.
printed=$(cargo deb -p compcache --no-build --locked --output "$out_dir" "${variant[@]}" "${deb_args[@]}")
deb=$(grep '\.deb$' <<<"$printed" | tail -n 1) || true
[ -n "$deb" ] && [ -f "$deb" ] || die "cargo deb did not report a .deb it wrote (it printed: $printed)"
echo "$deb"
