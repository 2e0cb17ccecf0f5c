#!/usr/bin/env bash
# The VM end-to-end test: a guest kernel (Debian bookworm-backports 6.12) swaps to compcache
# under memory pressure, through ublk, through the kernel NBD driver and through FUSE and a loop
# device, and must lose nothing.
#
#   vm/run-test.sh            full run: 640 MiB guest, scan 512 MiB x 2 passes in a 128 MiB
#                             memory cgroup, ublk + global + nbd + nbd-client + fuse + backing
#                             + cache + crash + ublk-kill + nbd-kill + global-kill
#   vm/run-test.sh --quick    CI variant: 384 MiB guest, scan 256 MiB x 1 pass in a 128 MiB
#                             memory cgroup, the same steps, 8 SIGKILLs in each kill step
#   options: --frontends ublk,global,nbd,nbd-client,fuse,backing,cache,crash,ublk-kill,nbd-kill,global-kill   (fuse:
#                             `compcache swapon --frontend fuse`, a file on a FUSE mount
#                             attached to a loop device with direct I/O; cache: cache mode,
#                             `compcache ublk --origin` over a second virtual disk (a 256 MiB
#                             sparse file in vm/cache, removed afterwards) with an 8 MiB
#                             budget, ext4 made on it, a tree of files written, read back
#                             after the page cache is dropped, fsck'd, and then checked on
#                             the disk itself after the server stopped; global: ublk swap with
#                             the scan over all the guest's RAM but 16 MiB, in no cgroup: the
#                             whole guest out of memory; fuse-global: the same through
#                             `--frontend fuse`, not in the default list: it hangs, see
#                             docs/swap.md; nbd-client: `compcache serve`
#                             attached by Debian's standard nbd-client, fetched into vm/cache
#                             by vm/fetch-nbd-client.sh; backing: ublk swap with a 16 MiB
#                             resident limit and a virtual disk (the scan's size, at least
#                             128 MiB; a sparse file in vm/cache removed afterwards) as its
#                             backing device; ublk-kill, nbd-kill: `compcache swapon`'s
#                             server killed with SIGKILL --kills times (default 20) while the
#                             scan swaps, its supervisor starting successors that take the
#                             device over, then `compcache restart` once (an upgrade: a copy
#                             of the binary renamed over the installed one); ublk-orphan: that device's server and supervisor
#                             both killed, its I/O must wait and then fail once `compcache
#                             swapoff` deletes it; global-kill: ublk-kill with the scan
#                             over all the guest's RAM but 16 MiB, in no cgroup, as global;
#                             ublk-orphan is not in the default list)
#            --kills N        SIGKILLs in the ublk-kill step (20; --quick 8)
#            --nbd-kills N    in nbd-kill and global-kill (5; --quick 8)
#            --mem MIB   --scan MIB   --passes N   --smp N
#            --memcg MIB      the scan's memory cgroup limit (default 128; 0: none, the whole
#                             guest under memory pressure; see docs/swap.md)
#            --reserve SIZE   compcache swapon --reserve
#            --accel tcg|kvm  (default tcg: this project's machines' /dev/kvm runs no stock
#                              kernels; use kvm where it works)
#            --static         put a static (musl) compcache in the guest instead of the
#                             glibc release build and its libraries
#            --no-build       use the compcache binary already built
#
# One command from a fresh clone (as root, for apt): installs what is missing
# (scripts/deps/apt-vm.txt), builds compcache (release), fetches the kernel (and, for the
# nbd-client step, Debian's nbd-client) into vm/cache/, builds the initramfs, boots qemu, and
# exits 0 only if the guest reports "ALL PASS". The serial console is saved in vm/cache/last-run.log.
# Times inside the guest are emulated under TCG: they are printed as information only.
# vm/zram-mem.sh (not part of this test) boots the same kernel to measure kernel zram's memory
# (lzo-rle, lz4, zstd, zstd with a dictionary) for page dumps: see its header and docs/store.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
cache="$here/cache"
export PATH="$HOME/.cargo/bin:$PATH"

mem=640 scan=512 passes=2 frontends=ublk,global,nbd,nbd-client,fuse,backing,cache,crash,ublk-kill,nbd-kill,global-kill smp=2 accel=tcg build=1 static=0 timeout_s=1200 reserve=auto memcg=128 kills=20 nbd_kills=5
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) mem=384 scan=256 passes=1 memcg=128 timeout_s=1200 kills=8 nbd_kills=8 ;;
    --frontends) frontends="$2"; shift ;;
    --mem) mem="$2"; shift ;;
    --scan) scan="$2"; shift ;;
    --passes) passes="$2"; shift ;;
    --reserve) reserve="$2"; shift ;;
    --memcg) memcg="$2"; shift ;;
    --kills) kills="$2"; shift ;;
    --nbd-kills) nbd_kills="$2"; shift ;;
    --smp) smp="$2"; shift ;;
    --accel) accel="$2"; shift ;;
    --no-build) build=0 ;;
    --static) static=1 ;;
    --timeout) timeout_s="$2"; shift ;;
    -h|--help) sed -n '2,54p' "$0"; exit 0 ;;
    *) echo "run-test: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$cache"
if [ "$(id -u)" != 0 ]; then
  # apt (kernel download, tools) and mknod (the initramfs's /dev/console) need root.
  echo "run-test: SKIP: run as root (sudo vm/run-test.sh)"; exit 0
fi

# 1. Tools.
need_apt=()
while read -r p; do
  p="${p%%#*}"; p="$(echo "$p" | tr -d '[:space:]')"; [ -n "$p" ] || continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done <"$repo/scripts/deps/apt-vm.txt"
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "run-test: installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
if [ "$static" = 1 ]; then
  target=x86_64-unknown-linux-musl
  bin="$repo/target/$target/release/compcache"
  if [ "$build" = 1 ]; then
    rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target"
    echo "run-test: building a static compcache ($target)"
    (cd "$repo" && CC_x86_64_unknown_linux_musl=musl-gcc cargo build -q --release --target "$target" -p compcache)
  fi
else
  bin="$repo/target/release/compcache"
  if [ "$build" = 1 ]; then
    echo "run-test: building compcache (release)"
    (cd "$repo" && cargo build -q --release -p compcache)
  fi
fi

# 2. Kernel and initramfs.
"$here/fetch-kernel.sh"
nbd_client_dir=
case ",$frontends," in
  *,nbd-client,*) "$here/fetch-nbd-client.sh"; nbd_client_dir="$cache/nbd-client" ;;
esac
# Per run (a second run at the same time, by another engineer, must not change this one's
# initramfs or console log); the console is copied to last-run.log at the end.
initramfs="$cache/initramfs-$$.cpio.gz"
COMPCACHE_BIN="$bin" INITRAMFS_OUT="$initramfs" NBD_CLIENT_DIR="$nbd_client_dir" "$here/build-initramfs.sh"

# 3. Boot. qemu is the only process started here; it is ended by its PID on timeout.
# CC_VM_TAIL_LOG=1 (a debugging aid): the kill steps copy the servers' log to the console as
# it grows, so that a hung guest's console shows what the supervisor and its servers said.
# Its monitor socket (vm/cache/monitor-PID.sock) takes e.g. `sendkey alt-sysrq-t` to dump the
# guest's tasks when something hangs (run with CC_VM_LOGLEVEL=7 to see the stacks; CC_VM_SYSRQ
# chooses the sysrq keys, default 7wlm: add t for every task).
# CC_VM_APPEND adds words to the guest's command line (e.g. cc.global_scan_mib=328: a harsher
# global-kill, to make a rare stall show sooner).
log="$cache/run-$$.log"
monitor_sock="$cache/monitor-$$.sock"
case "$accel" in
  kvm) accel_opts=(-accel kvm -cpu host) ;;
  *) accel_opts=(-accel tcg,thread=multi -cpu max) ;;
esac
append="console=ttyS0 panic=-1 oops=panic quiet loglevel=${CC_VM_LOGLEVEL:-4} sysrq_always_enabled cc.frontends=$frontends cc.scan_mib=$scan cc.passes=$passes cc.reserve=$reserve cc.kills=$kills cc.nbd_kills=$nbd_kills${memcg:+ cc.memcg_mib=$memcg}${CC_VM_TAIL_LOG:+ cc.tail_log=1}${CC_VM_APPEND:+ $CC_VM_APPEND}"
# The backing step's disk: a sparse file (only what the guest writes takes host space), as
# large as the scan (at least 128 MiB), so that it holds all the scan's pages compressed.
# The cache step's origin: a second sparse file, named by its serial in the guest.
disk_opts=()
disk= origin=
case ",$frontends," in
  *,backing,*)
    disk="$cache/backing-$$.img"
    rm -f "$disk" && truncate -s "$(( scan > 128 ? scan : 128 ))M" "$disk"
    disk_opts=(-drive "file=$disk,if=none,id=backing,format=raw,cache=unsafe" -device virtio-blk-pci,drive=backing,serial=ccbacking)
    ;;
esac
case ",$frontends," in
  *,cache,*)
    origin="$cache/origin-$$.img"
    rm -f "$origin" && truncate -s 256M "$origin"
    disk_opts+=(-drive "file=$origin,if=none,id=origin,format=raw,cache=unsafe" -device virtio-blk-pci,drive=origin,serial=ccorigin)
    ;;
esac
cleanup() {
  [ -n "${qemu_pid:-}" ] && kill "$qemu_pid" 2>/dev/null || true
  rm -f "$initramfs" "$monitor_sock" ${disk:+"$disk"} ${origin:+"$origin"}
}
# A signal ends the run (a trap that only cleaned up would let the script go on, and boot again).
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
# A hang is a bug to diagnose, not only a failure: when the guest's hung-task detector fires
# (a task blocked for 120 s) or the run times out, raise the guest's console loglevel and dump
# its blocked tasks, the CPUs' stacks and its memory (sysrq 7, w, l, m through the monitor),
# give the console time to print them, then stop qemu. The dump is in the console log and
# printed below.
sysrq_dump() {
  python3 - "$monitor_sock" "${CC_VM_SYSRQ:-7wlm}" <<'PY' || echo "run-test: could not reach qemu's monitor for a sysrq dump"
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
for key in sys.argv[2]:
    s.sendall(f"sendkey alt-sysrq-{key}\n".encode())
    time.sleep(1)
s.close()
PY
}
# One boot with the accelerator options given: qemu's console goes to $log (and the guest's
# progress lines to the terminal as they come); returns when qemu has exited or was stopped
# on a timeout or a hang (then dumped=1).
boot_once() {
  : >"$log" # exists before tail follows it
  qemu-system-x86_64 "$@" -m "$mem" -smp "$smp" -nographic -no-reboot \
    -kernel "$cache/kernel/vmlinuz" -initrd "$initramfs" -append "$append" \
    "${disk_opts[@]}" -nic none -serial mon:stdio -monitor "unix:$monitor_sock,server,nowait" </dev/null >"$log" 2>&1 &
  qemu_pid=$!
  tail -n +1 -f --pid="$qemu_pid" "$log" | grep --line-buffered -E 'compcache|scan |RESULT|Kernel panic|BUG|Oops|rror' &
  local tail_pid=$! waited=0 hung dump_at=0 why
  dumped=0
  while kill -0 "$qemu_pid" 2>/dev/null; do
    # Before the dump: watch for a hang or the timeout. After it: stop qemu 45 s later (the
    # console has printed the dump by then), hung or not.
    if [ "$dumped" = 0 ]; then
      hung=0
      grep -q 'blocked for more than' "$log" && hung=1
      if [ "$waited" -ge "$timeout_s" ] || [ "$hung" = 1 ]; then
        [ "$hung" = 1 ] && why="a guest task is blocked (hung-task detector)" || why="TIMEOUT after ${timeout_s}s"
        echo "run-test: $why: dumping the guest's blocked tasks and stacks (sysrq w, l, m), then stopping qemu"
        sysrq_dump
        dumped=1 dump_at=$waited
      fi
    elif [ "$waited" -ge $((dump_at + 45)) ]; then
      echo "run-test: stopping qemu (pid $qemu_pid)"
      kill "$qemu_pid" 2>/dev/null || true
      break
    fi
    sleep 1; waited=$((waited + 1))
  done
  wait "$qemu_pid" 2>/dev/null || true
  wait "$tail_pid" 2>/dev/null || true
  qemu_pid=
}
# A guest kernel that panics before the test's init has printed its first line has run none of
# compcache: under multi-threaded TCG the 6.12 kernel sometimes dies at boot on an int3 left by
# its own code patching (static keys; seen in a CI run on 2026-11-27: "Oops: int3" in
# sched_clock_cpu during an initcall), an emulator fault. Such a boot is retried, the retries
# with one TCG thread for both vCPUs (slower, but its vCPUs never see each other's code
# half-patched); the panicked console is kept in vm/cache/panicked-boot-N.log. Any failure
# after the init has started is the test's, and is not retried.
start=$(date +%s)
boot_once "${accel_opts[@]}"
for retry in 1 2; do
  [ "$accel" = tcg ] || break
  grep -q 'compcache-vm: kernel' "$log" && break
  grep -q 'Kernel panic' "$log" || break
  echo "run-test: the guest kernel panicked before the test started (an emulator fault, above); booting again with one TCG thread (retry $retry of 2)"
  cp "$log" "$cache/panicked-boot-$retry.log"
  boot_once -accel tcg,thread=single -cpu max
done
trap - EXIT INT TERM
rm -f "$initramfs" "$monitor_sock" ${disk:+"$disk"} ${origin:+"$origin"}
cp "$log" "$cache/last-run.log"
trap 'rm -f "$log"' EXIT
elapsed=$(( $(date +%s) - start ))
echo "run-test: boot to result ${elapsed}s on the host clock (log: $cache/last-run.log)"
if grep -q 'compcache-vm: ALL PASS' "$log"; then
  passed=$(grep -c 'RESULT .* PASS' "$log" || true)
  echo "vm: $passed passed, 0 failed"
  exit 0
fi
failed=$(grep -c 'RESULT .* FAIL' "$log" || true)
passed=$(grep -c 'RESULT .* PASS' "$log" || true)
[ "$failed" = 0 ] && failed=1
if [ "$dumped" = 1 ]; then
  echo "run-test: FAILED (hung); the console from the first hung-task report on:"
  sed -n '/blocked for more than/,$p' "$log" | tail -n 400
else
  echo "run-test: FAILED; last lines of the console:"
  tail -n 40 "$log"
fi
echo "vm: $passed passed, $failed failed"
exit 1
