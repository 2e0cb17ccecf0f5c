#!/usr/bin/env bash
# Kernel zram's memory for page dumps, in the VM test's guest kernel (Debian bookworm-backports
# 6.12: zram with lzo-rle, lz4, zstd and algorithm_params dictionaries, which the host's kernel
# may lack), to set beside compcache's own figures (compcache-storebench --recompress,
# docs/store.md "Recompression"). Not a test: it measures and prints.
#
#   sudo vm/zram-mem.sh [--pages FILE]... [--dict auto|none|FILE] [--host]
#
# Each page dump (raw 4 KiB pages, tools/pagedump; default data/pages-mixed.bin) goes to the
# guest as a read-only virtual disk; the guest (vm/guest/zram-mem-init) writes it with O_DIRECT
# to a fresh zram device per algorithm (vm/guest/zram-mem) and prints mm_stat: lzo-rle, lz4,
# zstd (zram's default level, 3), zstd level=9, and, with a dictionary, zstd dict=... and zstd
# level=9 dict=... (algorithm_params); an algorithm its zram does not offer is skipped (Debian's
# 6.12 has no lzo-rle: --host gives the host's). Every page is read back and compared.
#   --pages FILE    a page dump (repeatable)
#   --dict auto     (default) per page dump, a dictionary trained on the host as compcache's
#                   recompression trains its own (docs/store.md "Dictionaries": 16 KiB, 576
#                   sampled pages of which every ninth is held out, gain measured at zstd
#                   level 9): `compcache dict train --from FILE --size 16K --samples 576
#                   --level 9`; it goes to the guest in the initramfs
#   --dict FILE     this dictionary for every page dump;  --dict none: no dictionary rows
#   --compcache BIN the compcache binary that trains (default target/release/compcache)
#   --host          also the host's own zram, the same script on the same files, for the
#                   algorithms it offers (a device of its own, removed afterwards): a
#                   cross-check of the guest's figures
#   --mem MIB (default 768: the largest device, about 90 MiB for 180 MiB of pages, the page
#   cache of the read-back and the kernel)   --smp N   --accel tcg|kvm   --timeout S (3600)
#
# Needs root (apt for the kernel, mknod, zram). Fetches the kernel with its zram modules
# (vm/fetch-kernel.sh --zram), builds a small initramfs of its own (busybox, the modules, the
# two scripts, the dictionaries; vm/cache/zram-mem-PID.cpio.gz, removed afterwards), boots qemu
# and prints the guest's lines and a table. The console is saved in vm/cache/zram-mem-last.log.
# Memory figures from a TCG guest are the kernel's own; its times are not, and none are printed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
cache="$here/cache"

pages=() dict=auto host=0 mem=768 smp=2 accel=tcg timeout_s=3600
compcache="$repo/target/release/compcache"
while [ $# -gt 0 ]; do
  case "$1" in
    --pages) pages+=("$2"); shift ;;
    --dict) dict="$2"; shift ;;
    --compcache) compcache="$2"; shift ;;
    --host) host=1 ;;
    --mem) mem="$2"; shift ;;
    --smp) smp="$2"; shift ;;
    --accel) accel="$2"; shift ;;
    --timeout) timeout_s="$2"; shift ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "zram-mem: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#pages[@]} -gt 0 ] || pages=("$repo/data/pages-mixed.bin")
[ "$(id -u)" = 0 ] || { echo "zram-mem: run as root (apt, mknod, zram)" >&2; exit 2; }
for f in "${pages[@]}"; do
  [ -s "$f" ] && [ $(($(stat -c %s "$f") % 4096)) = 0 ] || { echo "zram-mem: $f is not a page dump (tools/pagedump/ensure-data.sh makes data/pages-*.bin)" >&2; exit 2; }
done
busybox="$(command -v busybox || true)"
if [ -z "$busybox" ] || ! file -L "$busybox" | grep -q 'statically linked'; then
  echo "zram-mem: needs a static busybox (apt-get install busybox-static)" >&2; exit 1
fi
mkdir -p "$cache"
"$here/fetch-kernel.sh" --zram
kdir="$cache/kernel"

# The initramfs: busybox, the init, the measuring script, the modules, the dictionaries.
root="$cache/zram-mem-$$.root"
initramfs="$cache/zram-mem-$$.cpio.gz"
log="$cache/zram-mem-$$.log"
qemu_pid=
cleanup() {
  [ -z "$qemu_pid" ] || kill "$qemu_pid" 2>/dev/null || true
  rm -rf "$root" "$initramfs" "$log"
}
trap cleanup EXIT INT TERM
mkdir -p "$root"/{bin,dev,proc,sys,etc/zram-mem,lib/modules/zram}
cp "$busybox" "$root/bin/busybox"
cp "$here/guest/zram-mem-init" "$root/init"
cp "$here/guest/zram-mem" "$root/bin/zram-mem"
chmod 755 "$root/init" "$root/bin/zram-mem"
cp "$kdir/zram/"*.ko "$kdir/zram/order" "$root/lib/modules/zram/"
cp "$kdir/modules/virtio_blk.ko" "$root/lib/modules/"
labels=
for i in "${!pages[@]}"; do
  f="${pages[$i]}"
  labels="${labels:+$labels,}$(basename "$f")"
  case "$dict" in
    none) ;;
    auto)
      [ -x "$compcache" ] || { echo "zram-mem: no compcache binary at $compcache to train the dictionary (--compcache BIN, or --dict none)" >&2; exit 1; }
      echo "zram-mem: $compcache dict train --from $f --size 16K --samples 576 --level 9 --out dict$i"
      "$compcache" dict train --from "$f" --size 16K --samples 576 --level 9 --out "$root/etc/zram-mem/dict$i" ;;
    *) cp "$dict" "$root/etc/zram-mem/dict$i" ;;
  esac
done
# The kernel opens /dev/console for init before devtmpfs is mounted: it must be in the archive.
mknod -m 600 "$root/dev/console" c 5 1
(cd "$root" && find . | LC_ALL=C sort | cpio --quiet -o -H newc --owner 0:0) | gzip -1 >"$initramfs"

# The host's own zram first (quick), the same script on the same files.
host_lines=
if [ "$host" = 1 ]; then
  if [ ! -d /sys/class/zram-control ]; then
    echo "zram-mem: the host has no zram (modprobe zram): no host figures"
  else
    # What the host offers, from a device of our own (never another's zram0).
    id=$(cat /sys/class/zram-control/hot_add)
    offered=$(tr -d '[]' <"/sys/block/zram$id/comp_algorithm")
    echo "$id" >/sys/class/zram-control/hot_remove
    echo "zram-mem: host $(uname -r): zram offers $offered"
    for i in "${!pages[@]}"; do
      for run in lzo-rle lz4 zstd "zstd level=9" "zstd dict=$root/etc/zram-mem/dict$i" "zstd level=9 dict=$root/etc/zram-mem/dict$i"; do
        case " $offered " in *" ${run%% *} "*) ;; *) continue ;; esac
        case "$run" in *dict=*) [ -s "$root/etc/zram-mem/dict$i" ] || continue ;; esac
        # shellcheck disable=SC2086 # $run is the algorithm and its parameters, as words
        line=$("$here/guest/zram-mem" "$(basename "${pages[$i]}")" "${pages[$i]}" $run) || true
        echo "$line"
        host_lines+="${line/zram-mem: /zram-mem: host }"$'\n'
      done
    done
  fi
fi

case "$accel" in
  kvm) accel_opts=(-accel kvm -cpu host) ;;
  *) accel_opts=(-accel tcg,thread=multi -cpu max) ;;
esac
disk_opts=()
for i in "${!pages[@]}"; do
  disk_opts+=(-drive "file=${pages[$i]},if=none,id=pages$i,format=raw,readonly=on" -device "virtio-blk-pci,drive=pages$i,serial=zmpages$i")
done
echo "zram-mem: booting $(cat "$kdir/version") ($accel, ${mem} MiB, $smp CPUs): $labels"
start=$(date +%s)
: >"$log"
qemu-system-x86_64 "${accel_opts[@]}" -m "$mem" -smp "$smp" -nographic -no-reboot \
  -kernel "$kdir/vmlinuz" -initrd "$initramfs" \
  -append "console=ttyS0 panic=-1 oops=panic quiet loglevel=4 zm.pages=$labels" \
  "${disk_opts[@]}" -nic none -serial mon:stdio -monitor none </dev/null >"$log" 2>&1 &
qemu_pid=$!
tail -n +1 -f --pid="$qemu_pid" "$log" | grep --line-buffered -E 'zram-mem|Kernel panic|BUG|Oops|rror' &
tail_pid=$!
waited=0
while kill -0 "$qemu_pid" 2>/dev/null; do
  if [ "$waited" -ge "$timeout_s" ]; then
    echo "zram-mem: TIMEOUT after ${timeout_s}s: stopping qemu (pid $qemu_pid)"
    kill "$qemu_pid" 2>/dev/null || true
    break
  fi
  sleep 1; waited=$((waited + 1))
done
wait "$qemu_pid" 2>/dev/null || true
qemu_pid=
wait "$tail_pid" 2>/dev/null || true
cp "$log" "$cache/zram-mem-last.log"
echo "zram-mem: boot to result $(( $(date +%s) - start ))s on the host clock (log: $cache/zram-mem-last.log)"

# The table: MiB of mm_stat, and each mem_used_total against lzo-rle's on the same pages (the
# guest's if its zram offers lzo-rle, which Debian's 6.12 does not; otherwise the host's, from
# --host: compare the two kernels' lz4 rows to see whether that is fair).
{ printf '%s' "$host_lines"; grep -a '^zram-mem: .* verify ' "$log" | sed 's/^zram-mem: /zram-mem: guest /' | tr -d '\r'; } | awk -v guest="$(cat "$kdir/version")" -v host="$(uname -r)" '
  {
    where = $2; label = $3; i = 4; alg = ""
    while ($i != "pages") { alg = alg (alg == "" ? "" : " ") $i; i++ }
    sub(/dict=[^ ]*/, "dict", alg)
    for (; i < NF; i += 2) v[$i] = $(i + 1)
    key = label
    if (alg == "lzo-rle") base[key] = v["mem_used_total"]
    row[++n] = sprintf("| %s | %s %s | %s | %d | %d | %d | %.1f | %.1f |", label, where, (where == "guest" ? guest : host), alg, v["orig_data_size"] / 4096, v["same_pages"], v["huge_pages"], v["compr_data_size"] / 1048576, v["mem_used_total"] / 1048576)
    used[n] = v["mem_used_total"]; keys[n] = key; ok[n] = v["verify"]
  }
  END {
    print ""
    print "| pages | kernel | zram algorithm | pages stored | same_pages | huge_pages | compr_data_size MiB | mem_used_total MiB | vs lzo-rle | read back |"
    print "|---|---|---|---:|---:|---:|---:|---:|---:|---|"
    for (j = 1; j <= n; j++) printf "%s %s | %s |\n", row[j], (base[keys[j]] ? sprintf("%.3fx", used[j] / base[keys[j]]) : "-"), ok[j]
  }'
if grep -aq 'zram-mem: DONE' "$log"; then exit 0; fi
echo "zram-mem: FAILED; last lines of the console:"
tail -n 30 "$log"
exit 1
