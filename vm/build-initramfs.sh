#!/usr/bin/env bash
# Builds the guest's initramfs for the VM end-to-end test: busybox-static, the guest init
# script, the modules vm/fetch-kernel.sh extracted (ublk_drv, nbd, loop, virtio_blk, and ext4
# with its dependencies), the compcache binary (with the shared libraries it needs, found by
# ldd, if it is not static), this machine's mkfs.ext4 and e2fsck (e2fsprogs, with their
# libraries: the cache step's filesystem), this machine's losetup (util-linux, with its
# libraries: the fuse step attaches the FUSE file with --direct-io=on --sector-size 4096,
# which busybox's losetup lacks) and the scan program (static). Output:
# vm/cache/initramfs.cpio.gz (gitignored).
#
# Inputs (all optional):
#   COMPCACHE_BIN  the compcache binary to put in (default: target/release/compcache)
#   SCAN_BIN       a static scan binary (default: built from tools/scan/scan.c into vm/cache)
#   INITRAMFS_OUT  where to write it (default: vm/cache/initramfs.cpio.gz); its staging tree
#                  is the same path with .root, so runs with different outputs do not collide
#   NBD_CLIENT_DIR Debian's nbd-client unpacked by vm/fetch-nbd-client.sh (vm/cache/nbd-client):
#                  its sbin/nbd-client goes in as /bin/nbd-client with its libraries, found by
#                  ldd in that tree first, then on this machine (default: none, no nbd-client)
# Run vm/fetch-kernel.sh first (vm/run-test.sh does both).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
cache="$here/cache"
kdir="$cache/kernel"
out="${INITRAMFS_OUT:-$cache/initramfs.cpio.gz}"
root="$out.root"

compcache_bin="${COMPCACHE_BIN:-$repo/target/release/compcache}"
[ -x "$compcache_bin" ] || { echo "build-initramfs: no compcache binary at $compcache_bin" >&2; exit 1; }
[ -s "$kdir/modules/virtio_blk.ko" ] && [ -s "$kdir/modules/ext4.ko" ] && [ -s "$kdir/modules/loop.ko" ] || { echo "build-initramfs: run vm/fetch-kernel.sh first" >&2; exit 1; }
for tool in mke2fs e2fsck; do
  command -v "$tool" >/dev/null || { echo "build-initramfs: needs $tool (apt-get install e2fsprogs)" >&2; exit 1; }
done
command -v losetup >/dev/null || { echo "build-initramfs: needs losetup (apt-get install mount)" >&2; exit 1; }
busybox="$(command -v busybox || true)"
if [ -z "$busybox" ] || ! file -L "$busybox" | grep -q 'statically linked'; then
  echo "build-initramfs: needs a static busybox (apt-get install busybox-static)" >&2; exit 1
fi

scan_bin="${SCAN_BIN:-$cache/scan-static}"
if [ -z "${SCAN_BIN:-}" ] && { [ ! -x "$scan_bin" ] || [ "$repo/tools/scan/scan.c" -nt "$scan_bin" ]; }; then
  gcc -O2 -std=gnu99 -static -o "$scan_bin" "$repo/tools/scan/scan.c"
fi

rm -rf "$root"
mkdir -p "$root"/{bin,dev,proc,sys,run,tmp,etc,lib/modules}
cp "$busybox" "$root/bin/busybox"
cp "$here/guest/init" "$root/init"
chmod 755 "$root/init"
cp "$kdir"/modules/*.ko "$root/lib/modules/"
# A dynamic (glibc) binary brings its loader and libraries, at the same paths as here.
with_libs() {
  file -L "$1" | grep -q 'statically linked' && return 0
  for lib in $(ldd "$1" | grep -oE '/[^ ]+'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
cp "$compcache_bin" "$root/bin/compcache"
strip "$root/bin/compcache" 2>/dev/null || true
with_libs "$compcache_bin"
# A debugging aid, not part of the test (CC_VM_STRACE=1 vm/run-test.sh ...): strace in the
# guest; the kill steps then trace the standby's file reads to the console (vm/guest/init).
if [ -n "${CC_VM_STRACE:-}" ] && command -v strace >/dev/null; then
  cp "$(command -v strace)" "$root/bin/strace"
  with_libs "$(command -v strace)"
fi
# The cache step makes and checks an ext4 filesystem (busybox has neither tool for ext4).
mke2fs_bin=$(command -v mke2fs) e2fsck_bin=$(command -v e2fsck)
cp "$mke2fs_bin" "$root/bin/mke2fs" && ln -s mke2fs "$root/bin/mkfs.ext4"
cp "$e2fsck_bin" "$root/bin/e2fsck"
with_libs "$mke2fs_bin"
with_libs "$e2fsck_bin"
[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$root/etc/mke2fs.conf"
# The fuse step: `compcache fuse` runs `losetup --find --show --direct-io=on --sector-size
# 4096`; busybox's losetup has neither option. In /bin, so `busybox --install -s` (which
# keeps existing files) leaves it in place.
losetup_bin=$(command -v losetup)
cp "$losetup_bin" "$root/bin/losetup"
with_libs "$losetup_bin"
if [ -n "${NBD_CLIENT_DIR:-}" ]; then
  nbd_root="$(cd "$NBD_CLIENT_DIR" && pwd)/root"
  [ -x "$nbd_root/sbin/nbd-client" ] || { echo "build-initramfs: no nbd-client in $nbd_root: run vm/fetch-nbd-client.sh" >&2; exit 1; }
  cp "$nbd_root/sbin/nbd-client" "$root/bin/nbd-client"
  # Libraries unpacked beside it (those this machine lacks) come from there, the rest from here;
  # either way they land at the standard paths, where the guest's loader looks.
  libs=$(LD_LIBRARY_PATH="$nbd_root/lib/x86_64-linux-gnu:$nbd_root/usr/lib/x86_64-linux-gnu" ldd "$nbd_root/sbin/nbd-client")
  if echo "$libs" | grep -q 'not found'; then
    echo "build-initramfs: nbd-client's libraries are missing:" >&2; echo "$libs" | grep 'not found' >&2; exit 1
  fi
  for lib in $(echo "$libs" | grep -oE '/[^ ]+'); do
    dest="${lib#"$nbd_root"}"
    mkdir -p "$root$(dirname "$dest")"
    cp -L "$lib" "$root$dest"
  done
fi
cp "$scan_bin" "$root/bin/scan"
cp "$here/guest/zram-generator.conf" "$root/etc/compcache-test.conf"
cp "$here/guest/zram-generator-backing.conf" "$root/etc/compcache-backing.conf"
# The kernel opens /dev/console for init before devtmpfs is mounted: it must be in the archive.
mknod -m 600 "$root/dev/console" c 5 1
(cd "$root" && find . | LC_ALL=C sort | cpio --quiet -o -H newc --owner 0:0) | gzip -1 >"$out.tmp"
mv "$out.tmp" "$out"
rm -rf "$root"
echo "build-initramfs: $(du -h "$out" | cut -f1) -> $out"
