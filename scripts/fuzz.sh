#!/usr/bin/env bash
# Coverage-guided fuzzing with AFL++ (through afl.rs, on stable Rust).
#
#   scripts/fuzz.sh TARGET [SECONDS]     TARGET: elf | swap | exits | snapshot (default 600 s)
#   scripts/fuzz.sh --replay TARGET      re-run the saved crashes of TARGET
#
# Needs `cargo install cargo-afl` once (it builds AFL++ on first use).
# Builds the targets in fuzz/ (not a workspace member: the normal build and
# CI never compile them), seeds fuzz/out/TARGET/in from fuzz/seeds/TARGET
# (the ELF seed is the exit target's own small guest kernel, stripped), and
# runs afl-fuzz for SECONDS. Findings land in fuzz/out/TARGET/default/
# (crashes/, queue/); the last lines printed are afl-fuzz's statistics.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

replay=0
if [[ "${1:-}" == "--replay" ]]; then
    replay=1
    shift
fi
target="${1:?usage: scripts/fuzz.sh [--replay] elf|swap|exits|snapshot [SECONDS]}"
seconds="${2:-600}"
case "$target" in
elf | swap | exits | snapshot) ;;
*)
    echo "unknown target '$target' (elf, swap, exits, snapshot)" >&2
    exit 2
    ;;
esac

cargo afl build --release --bin "$target" >&2
bin="target/release/$target"
out="out/$target"

if ((replay)); then
    status=0
    for crash in "$out"/default/crashes/id:*; do
        [[ -e "$crash" ]] || continue
        echo "== $crash"
        # Outside afl-fuzz, one input per process (afl.rs loops otherwise).
        AFL_FUZZER_LOOPCOUNT=1 "$bin" <"$crash" || status=1
    done
    exit $status
fi

rm -rf "$out/in"
mkdir -p "$out/in"
if [[ "$target" == elf ]]; then
    strip -o "$out/in/exits.elf" "$(ls -t target/release/build/hv-*/out/hostile-exits.elf | head -1)"
else
    cp seeds/"$target"/* "$out/in/"
fi

# This machine's core_pattern and CPU governor are not ours to change.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
# Resume the previous campaign's queue when there is one.
if [[ -d "$out/default/queue" ]]; then
    export AFL_AUTORESUME=1
fi
cargo afl fuzz -i "$out/in" -o "$out" -V "$seconds" -t 5000 "$bin" >"$out.log" 2>&1 || true
stats="$out/default/fuzzer_stats"
if [[ ! -f "$stats" ]]; then
    tail -30 "$out.log" >&2
    exit 1
fi
grep -E '^(run_time|execs_done|execs_per_sec|corpus_count|bitmap_cvg|saved_crashes|saved_hangs|edges_found|total_edges) ' "$stats"
