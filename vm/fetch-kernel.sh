#!/usr/bin/env bash
# Fetches a guest kernel for the VM end-to-end test: Debian's bookworm-backports
# linux-image-6.12.*-amd64 (the first Debian kernel that ships ublk_drv.ko; bookworm's 6.1 has
# none), downloaded with apt through a private sources list so the machine's own apt
# configuration is left alone. Everything lands in vm/cache/ (gitignored):
#   vm/cache/kernel/vmlinuz          the kernel image
#   vm/cache/kernel/modules/*.ko     ublk_drv.ko, nbd.ko, loop.ko (the fuse step's loop device;
#                                    FUSE itself is built in: CONFIG_FUSE_FS=y),
#                                    virtio_blk.ko (the backing and cache
#                                    steps' disks), and ext4 with what it needs (crc16, mbcache,
#                                    jbd2, crc32c_generic: the cache step's filesystem)
#                                    (decompressed, for busybox insmod)
#   vm/cache/kernel/version          the kernel release string
#   vm/cache/kernel/zram/*.ko        with --zram only (vm/zram-mem.sh): zram.ko and the modules
#                                    it depends on (zsmalloc, its compression backends' libraries),
#                                    found by modinfo; zram/order lists them dependencies first
# Idempotent: a second run with the cache present only prints what it has (with --zram, a cache
# without the zram modules is fetched again, all from one package).
# Override the package with KERNEL_PKG=linux-image-6.12.NN+deb12-amd64.
set -euo pipefail
cd "$(dirname "$0")"
cache="$PWD/cache"
out="$cache/kernel"
zram=0
case "${1:-}" in
  --zram) zram=1 ;;
  "") ;;
  *) echo "usage: vm/fetch-kernel.sh [--zram]" >&2; exit 2 ;;
esac

modules="ublk_drv nbd loop virtio_blk crc16 mbcache jbd2 crc32c_generic ext4"
have=1
for m in $modules; do [ -s "$out/modules/$m.ko" ] || have=0; done
[ "$zram" = 1 ] && [ ! -s "$out/zram/order" ] && have=0
if [ -s "$out/vmlinuz" ] && [ "$have" = 1 ]; then
  echo "fetch-kernel: have $(cat "$out/version") in $out"
  exit 0
fi

apt_dir="$cache/apt"
# shellcheck source=vm/private-apt.sh
. "$PWD/private-apt.sh"
private_apt "$apt_dir" "deb http://deb.debian.org/debian bookworm-backports main" fetch-kernel

pkg="${KERNEL_PKG:-}"
if [ -z "$pkg" ]; then
  # Newest generic 6.12 image (not -cloud: it drops many modules; not -rt).
  pkg=$(apt-cache "${apt_opts[@]}" pkgnames linux-image-6.12 \
          | grep -E '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' | sort -V | tail -n 1)
fi
[ -n "$pkg" ] || { echo "fetch-kernel: no linux-image-6.12.*-amd64 in bookworm-backports" >&2; exit 1; }
echo "fetch-kernel: downloading $pkg"
# The signed image package is a meta-less real package; its files are in the package itself.
(cd "$apt_dir/deb" && apt-get "${apt_opts[@]}" download "$pkg")
deb=$(ls -t "$apt_dir/deb/${pkg}"_*.deb | head -n 1)

rm -rf "$out.tmp" && mkdir -p "$out.tmp/root" "$out.tmp/modules"
dpkg-deb -x "$deb" "$out.tmp/root"
release=$(ls "$out.tmp/root/lib/modules" | head -n 1)
cp "$out.tmp/root/boot/vmlinuz-$release" "$out.tmp/vmlinuz"
moddir="$out.tmp/root/lib/modules/$release"
# extract NAME DIR: the module NAME (modinfo's spelling, _ for -), decompressed into DIR/NAME.ko.
extract() {
  local f
  f=$(find "$moddir" \( -name "$1.ko*" -o -name "${1//_/-}.ko*" \) | head -n 1)
  [ -n "$f" ] || { echo "fetch-kernel: $pkg has no $1 module" >&2; exit 1; }
  case "$f" in
    *.xz) xz -dc "$f" >"$2/$1.ko" ;;
    *.zst) zstd -qdc "$f" >"$2/$1.ko" ;;
    *.gz) gzip -dc "$f" >"$2/$1.ko" ;;
    *) cp "$f" "$2/$1.ko" ;;
  esac
}
for m in $modules; do extract "$m" "$out.tmp/modules"; done
# zram and, first, what it depends on (recursively, as modinfo says), each once, in load order.
with_deps() {
  grep -qx "$1" "$out.tmp/zram/order" 2>/dev/null && return 0
  extract "$1" "$out.tmp/zram"
  local d
  for d in $(modinfo -F depends "$out.tmp/zram/$1.ko" | tr ',' ' '); do with_deps "$d"; done
  echo "$1" >>"$out.tmp/zram/order"
}
if [ "$zram" = 1 ]; then
  command -v modinfo >/dev/null || { echo "fetch-kernel: --zram needs modinfo (apt-get install kmod)" >&2; exit 1; }
  mkdir "$out.tmp/zram"
  with_deps zram
  echo "fetch-kernel: zram modules: $(tr '\n' ' ' <"$out.tmp/zram/order")"
fi
# No modules.dep: the guest loads them in dependency order by hand (ext4 depends on crc16,
# mbcache and jbd2; the others only on built-in code: virtio and virtio_pci are built in;
# crc32c_generic is what ext4's and jbd2's checksums ask the crypto API for).
echo "$release" >"$out.tmp/version"
rm -rf "$out.tmp/root" "$out" "$deb"
mv "$out.tmp" "$out"
echo "fetch-kernel: $release -> $out"
