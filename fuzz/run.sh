#!/usr/bin/env bash
# Builds and runs compcache's fuzz targets with AFL++ (cargo-afl, stable Rust).
#
#   fuzz/run.sh --brief [TARGET...]     each target for FUZZ_BRIEF_SECONDS (default 20) from the
#                                       committed corpus; fails if any input crashes or hangs
#                                       (what CI runs: scripts/test, stage "fuzz (brief)")
#   fuzz/run.sh --execs N [TARGET...]   each target, one after the other, until N executions;
#                                       the fuzzer's state stays in fuzz/out/TARGET (resumed
#                                       on the next run); prints the figures at the end;
#                                       FUZZ_MAX_SECONDS=S stops each target after S seconds;
#                                       FUZZ_MAX_LEN=N generates inputs of at most N bytes
#                                       (afl-fuzz -G: a queue that grew inputs of tens of KB
#                                       slows ublk_request and store_ops to a few per second)
#   fuzz/run.sh --stats [TARGET...]     the figures of fuzz/out/TARGET (fuzzer_stats)
#   fuzz/run.sh --minimize [TARGET...]  afl-cmin of corpus + seeds + fuzz/out/TARGET's queues
#                                       into fuzz/corpus/TARGET (commit the result)
#   fuzz/run.sh --build                 only build the instrumented targets
#
# Without TARGET: every target. One afl-fuzz process at a time (the machine is shared).
# Needs cargo-afl and its AFL++ runtime: scripts/install-deps installs them.
set -euo pipefail
cd "$(dirname "$0")"
FUZZ_DIR=$PWD

ALL_TARGETS=(nbd_handshake nbd_transmission control zramconf ublk_request store_ops store_recover cache_ops)
declare -A DICT=([nbd_handshake]=nbd [nbd_transmission]=nbd [control]=control [zramconf]=zramconf)

mode=""
execs=0
case "${1:-}" in
  --brief | --stats | --minimize | --build) mode=${1#--}; shift ;;
  --execs)
    mode=execs
    execs=${2:?--execs needs a number}
    shift 2
    ;;
  *)
    sed -n '2,20p' "$FUZZ_DIR/run.sh" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || { echo "run.sh: unknown target $t (targets: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo afl --version >/dev/null 2>&1; then
  echo "run.sh: cargo-afl is missing: run scripts/install-deps fuzz (as root)" >&2
  exit 1
fi

# No terminal, no CPU-governor or core-dump set-up needed, no core pinning (other work runs on
# this machine), and no waiting for a long calibration.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1
export AFL_QUIET=1
# A single input taking longer than this is a hang (the slowest target needs a few ms).
TIMEOUT_MS=${FUZZ_TIMEOUT_MS:-3000}

# Built for an explicit target so that cargo-afl's instrumentation flags (RUSTFLAGS) apply to
# the fuzzed code only, not to build scripts and proc macros (bindgen, serde_derive): a fresh
# build is several times faster.
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')

build() {
  if [ -n "${FUZZ_NO_BUILD:-}" ]; then return; fi # FUZZ_NO_BUILD=1: use the targets as built
  echo "run.sh: building the instrumented targets (cargo afl build --release)"
  cargo afl build --release --quiet --bins --target "$TRIPLE"
}

binary() { echo "$FUZZ_DIR/target/$TRIPLE/release/$1"; }

# afl-fuzz's fork server starts the target in a session of its own (setsid), so in an autogroup
# of its own, which the kernel weighs as a whole against other sessions' autogroups: `nice` on
# run.sh then orders the target only inside that group, and a campaign under `nice -n 19` would
# take its core from other work at full weight. This gives the target's autogroup run.sh's nice
# value, every 5 s (a restarted fork server is a new session), until killed.
follow_nice() {
  local n p
  n=$(nice)
  [ "$n" -gt 0 ] || return 0
  while sleep 5; do
    for p in $(pgrep -u "$(id -u)" -x -f "$1"); do
      echo "$n" >"/proc/$p/autogroup" 2>/dev/null || true
    done
  done
}
follower=""
stop_follower() { # (and the sleep it is in)
  [ -n "$follower" ] || return 0
  pkill -P "$follower" 2>/dev/null || true
  kill "$follower" 2>/dev/null || true
  follower=""
}
trap stop_follower EXIT

input_dir() {
  if [ -d "corpus/$1" ] && [ -n "$(ls -A "corpus/$1")" ]; then echo "corpus/$1"; else echo "seeds/$1"; fi
}

dict_args() {
  local d=${DICT[$1]:-}
  [ -n "$d" ] && echo "-x dict/$d.dict"
  true
}

stat_of() { sed -n "s/^$2 *: *//p" "$1/fuzzer_stats"; }

print_stats() {
  local t=$1 dir=$2
  if [ ! -f "$dir/fuzzer_stats" ]; then
    echo "$t: no figures ($dir/fuzzer_stats missing)"
    return
  fi
  printf '%s: execs_done %s, run_time %ss, execs_per_sec %s, corpus_count %s, edges_found %s of %s (bitmap_cvg %s), stability %s, saved_crashes %s, saved_hangs %s\n' \
    "$t" "$(stat_of "$dir" execs_done)" "$(stat_of "$dir" run_time)" "$(stat_of "$dir" execs_per_sec)" \
    "$(stat_of "$dir" corpus_count)" "$(stat_of "$dir" edges_found)" "$(stat_of "$dir" total_edges)" \
    "$(stat_of "$dir" bitmap_cvg)" "$(stat_of "$dir" stability)" "$(stat_of "$dir" saved_crashes)" "$(stat_of "$dir" saved_hangs)"
}

# Crashes fail; a saved hang fails only if it still does not finish in 20 s on its own (a
# loaded machine can make a slow input look hung).
check_findings() {
  local t=$1 dir=$2 bad=0 f
  for f in "$dir"/crashes/id:*; do
    [ -e "$f" ] || continue
    echo "run.sh: $t CRASHES on $f (reproduce: $(binary "$t") < '$f')" >&2
    bad=1
  done
  for f in "$dir"/hangs/id:*; do
    [ -e "$f" ] || continue
    if ! timeout 20 "$(binary "$t")" <"$f" >/dev/null 2>&1; then
      echo "run.sh: $t HANGS (or fails) on $f (reproduce: $(binary "$t") < '$f')" >&2
      bad=1
    else
      echo "run.sh: $t: $f timed out under the fuzzer but finishes alone: not counted"
    fi
  done
  return $bad
}

case $mode in
  build) build ;;
  brief)
    build
    secs=${FUZZ_BRIEF_SECONDS:-20}
    failed=()
    for t in "${targets[@]}"; do
      out=$(mktemp -d /tmp/compcache-fuzz-brief.XXXXXX)
      echo "run.sh: $t for ${secs}s from $(input_dir "$t")"
      # shellcheck disable=SC2046
      if ! cargo afl fuzz -i "$(input_dir "$t")" -o "$out" -t "$TIMEOUT_MS" -m none -V "$secs" $(dict_args "$t") \
        -- "$(binary "$t")" >"$out/afl.log" 2>&1; then
        tail -30 "$out/afl.log" >&2
        echo "run.sh: afl-fuzz failed on $t (a seed that crashes or hangs fails the start)" >&2
        failed+=("$t")
        rm -rf "$out"
        continue
      fi
      print_stats "$t" "$out/default"
      if ! check_findings "$t" "$out/default"; then
        failed+=("$t")
        mkdir -p "out/findings/$t"
        cp "$out"/default/crashes/id:* "$out"/default/hangs/id:* "out/findings/$t/" 2>/dev/null || true
        echo "run.sh: $t: the inputs are kept in fuzz/out/findings/$t/" >&2
      fi
      rm -rf "$out"
    done
    if [ ${#failed[@]} -gt 0 ]; then
      echo "run.sh: fuzz targets with findings: ${failed[*]}" >&2
      exit 1
    fi
    echo "run.sh: ${#targets[@]} targets, no crash and no hang"
    ;;
  execs)
    build
    for t in "${targets[@]}"; do
      out=out/$t
      mkdir -p "$out"
      done_so_far=0
      [ -f "$out/default/fuzzer_stats" ] && done_so_far=$(stat_of "$out/default" execs_done)
      if [ "$done_so_far" -ge "$execs" ]; then
        print_stats "$t" "$out/default"
        continue
      fi
      input=$(input_dir "$t")
      # Resume an earlier run of this target where it stopped.
      [ -d "$out/default/queue" ] && input=-
      echo "run.sh: $t until $execs executions (done: $done_so_far), state in fuzz/$out"
      follow_nice "$(binary "$t")" &
      follower=$!
      # shellcheck disable=SC2046
      AFL_AUTORESUME=1 cargo afl fuzz -i "$input" -o "$out" -t "$TIMEOUT_MS" -m none -E "$execs" $(dict_args "$t") \
        ${FUZZ_MAX_SECONDS:+-V "$FUZZ_MAX_SECONDS"} ${FUZZ_MAX_LEN:+-G "$FUZZ_MAX_LEN"} \
        -- "$(binary "$t")" >>"$out/afl.log" 2>&1 || { tail -30 "$out/afl.log" >&2; exit 1; }
      stop_follower
      print_stats "$t" "$out/default"
      check_findings "$t" "$out/default" || true
    done
    ;;
  stats)
    for t in "${targets[@]}"; do print_stats "$t" "out/$t/default"; done
    ;;
  minimize)
    for t in "${targets[@]}"; do
      all=$(mktemp -d /tmp/compcache-fuzz-cmin.XXXXXX)
      cp seeds/"$t"/* "$all"/
      [ -d "corpus/$t" ] && cp corpus/"$t"/* "$all"/ 2>/dev/null || true
      # Every instance's queue: the main one and any secondaries (afl-fuzz -S) of the campaign.
      for q in out/"$t"/*/queue; do
        [ -d "$q" ] || continue
        for f in "$q"/id:*; do
          cp "$f" "$all/q-$(sha1sum <"$f" | cut -c1-16)"
        done
      done
      min=$(mktemp -d /tmp/compcache-fuzz-min.XXXXXX)
      rmdir "$min"
      # The shell afl-cmin: the Python one that `cargo afl cmin` runs finds no coverage in
      # these persistent-mode targets (AFL++ 4.40c).
      afl_bin=$(dirname "$(ls "$HOME"/.local/share/afl.rs/rustc-"$(rustc -V | awk '{print $2 "-" substr($3, 2, 7)}')"/afl.rs-*/afl/bin/afl-fuzz | tail -1)")
      AFL_PATH=$afl_bin PATH=$afl_bin:$PATH "$afl_bin/afl-cmin.bash" -i "$all" -o "$min" -t "$TIMEOUT_MS" -m none -- "$(binary "$t")" >/dev/null 2>&1
      rm -rf "corpus/$t"
      mkdir -p "corpus/$t"
      cp "$min"/* "corpus/$t"/
      echo "run.sh: $t: $(ls "$all" | wc -l) inputs minimised to $(ls "corpus/$t" | wc -l) ($(du -sh "corpus/$t" | cut -f1)) in fuzz/corpus/$t"
      rm -rf "$all" "$min"
    done
    ;;
esac
