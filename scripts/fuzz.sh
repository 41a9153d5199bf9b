#!/usr/bin/env bash
# Run every cargo-fuzz target for a set time and report executions and
# findings. Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, all targets)
# Inputs that crash land in fuzz/artifacts/<target>/; once fixed, copy each
# into fuzz/regressions/<target>/ so the stable suite replays it
# (fuzz/cases/tests/replay.rs). New corpus entries go to fuzz/corpus-work/
# (not committed); fuzz/corpus/<target>/ holds the seeds.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || mapfile -t targets < <(cargo +nightly fuzz list)
printf '%-16s %10s %12s %s\n' target seconds execs crashes
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "corpus-work/$t" "artifacts/$t"
    before=$(find "artifacts/$t" -type f | wc -l)
    log=$(mktemp)
    # -rss_limit_mb bounds a target that allocates without end (a finding too).
    if ! cargo +nightly fuzz run "$t" "corpus-work/$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 >"$log" 2>&1; then
        status=1
    fi
    execs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1 | grep -o '[0-9]*' || true)
    [[ -n "$execs" ]] || execs=$(grep -o '#[0-9]*' "$log" | tail -1 | tr -d '#' || echo 0)
    after=$(find "artifacts/$t" -type f | wc -l)
    printf '%-16s %10s %12s %s\n' "$t" "$secs" "$execs" "$((after - before))"
    if [[ $after -gt $before ]]; then
        grep -m1 -A3 'panicked\|ERROR: libFuzzer' "$log" | sed 's/^/    /' || true
    fi
    rm -f "$log"
done
exit $status
