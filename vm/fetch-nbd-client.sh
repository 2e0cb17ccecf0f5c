#!/usr/bin/env bash
# Fetches Debian bookworm's standard nbd-client (3.24; netlink by default) for the VM test's
# nbd-client step, downloaded with apt through a private sources list (the machine's own apt
# configuration is left alone, and the package is never installed here: its maintainer
# scripts would set up a service) and unpacked with dpkg-deb into vm/cache/ (gitignored):
#   vm/cache/nbd-client/root/        the unpacked packages: sbin/nbd-client, and the
#                                    libraries it needs that this machine has not installed
#                                    (libnl-3-200, libnl-genl-3-200, libgnutls30)
#   vm/cache/nbd-client/version      the package's version
# build-initramfs.sh (NBD_CLIENT_DIR) copies the binary and, found by ldd, its libraries.
# Idempotent: a second run with the cache present only prints what it has.
set -euo pipefail
cd "$(dirname "$0")"
cache="$PWD/cache"
out="$cache/nbd-client"

if [ -x "$out/root/sbin/nbd-client" ] && [ -s "$out/version" ]; then
  echo "fetch-nbd-client: have nbd-client $(cat "$out/version") in $out"
  exit 0
fi

apt_dir="$cache/apt-bookworm"
# shellcheck source=vm/private-apt.sh
. "$PWD/private-apt.sh"
private_apt "$apt_dir" "deb http://deb.debian.org/debian bookworm main" fetch-nbd-client

# The libraries come from this machine when it has them (build-initramfs.sh finds them with
# ldd); those it lacks are unpacked next to the binary.
pkgs=(nbd-client)
for p in libnl-3-200 libnl-genl-3-200 libgnutls30; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || pkgs+=("$p")
done
echo "fetch-nbd-client: downloading ${pkgs[*]}"
rm -f "$apt_dir"/deb/*.deb
(cd "$apt_dir/deb" && apt-get "${apt_opts[@]}" download "${pkgs[@]}")

rm -rf "$out.tmp" && mkdir -p "$out.tmp/root"
for deb in "$apt_dir"/deb/*.deb; do dpkg-deb -x "$deb" "$out.tmp/root"; done
dpkg-deb -f "$(ls "$apt_dir"/deb/nbd-client_*.deb)" Version >"$out.tmp/version"
[ -x "$out.tmp/root/sbin/nbd-client" ] || { echo "fetch-nbd-client: the package has no sbin/nbd-client" >&2; exit 1; }
rm -rf "$out" "$apt_dir"/deb/*.deb
mv "$out.tmp" "$out"
echo "fetch-nbd-client: nbd-client $(cat "$out/version") -> $out"
