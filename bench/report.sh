#!/usr/bin/env bash
# `throttlewatch report` throughput and memory on a large synthetic log.
#   bench/report.sh [SIZE_MB] [RUNS]     (default 1024 MB, 3 runs; the median is reported)
# The log is a real log's shape: a start record, `throttle` records from 64
# threads on 2 CPUs every period, a `cpu_stat` record every
# second, and an `end`. Written once to target/bench/report-SIZE.jsonl and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${1:-1024}
RUNS=${2:-3}
BIN=${BIN:-target/release/throttlewatch}
[[ -x $BIN ]] || cargo build --release -p throttlewatch --bin throttlewatch --quiet
mkdir -p target/bench
LOG=target/bench/report-${SIZE_MB}.jsonl

if [[ ! -s $LOG ]]; then
  python3 - "$LOG" "$SIZE_MB" <<'EOF'
import sys
path, size = sys.argv[1], int(sys.argv[2]) * 1024 * 1024
t0 = 1_790_000_000_000_000_000
P = 100_000_000
with open(path + ".tmp", "w") as f:
    f.write('{"v":1,"ts":%d,"type":"start","container_id":"bench","container_name":"bench","pid":1,'
            '"cgroup_path":"/bench","cgroup_id":9,"cgroup_mode":"v1","quota_us":50000,"period_us":100000,'
            '"burst_us":0,"cpus":"0-1","mems":"0","kernel_release":"6.18","throttle_model":"task",'
            '"probe":"tp_btf","threshold_ns":0}\n' % t0)
    written, k, lines = 0, 0, []
    while written < size:
        base = t0 + k * P
        for tid in range(64):
            start = base + 50_000_000 + tid * 37_000
            frozen = 50_000_000 - tid * 37_000 + (k * 7919 + tid * 104729) % 3_000_000
            lines.append('{"v":1,"ts":%d,"type":"throttle","tid":%d,"pid":1000,"comm":"worker-%d","cpu":%d,'
                         '"cpu_in":%d,"start_ns":%d,"frozen_ns":%d,"cgroup_id":9,"throttled_cgroup_id":9,'
                         '"throttled_level":1}\n' % (start + frozen, 1000 + tid, tid, tid % 2, tid % 2, start, frozen))
        if k % 10 == 9:
            lines.append('{"v":1,"ts":%d,"type":"cpu_stat","nr_periods":%d,"nr_throttled":%d,"throttled_ns":%d,'
                         '"nr_bursts":0,"burst_ns":0,"local_throttled_ns":null,"probe_throttled_ns":%d}\n'
                         % (base + P, k + 1, k + 1, (k + 1) * 100_000_000, (k + 1) * 100_000_000))
        k += 1
        if len(lines) > 4096:
            s = "".join(lines); f.write(s); written += len(s); lines = []
    f.write("".join(lines))
    f.write('{"v":1,"ts":%d,"type":"end","reason":"exit","duration_ns":%d,"exit_code":0,"top_threads":[],'
            '"threads":64,"freezes":%d,"frozen_ns":0,"probe_throttled_ns":%d,"probe_episodes":%d,'
            '"kernel_throttled_ns":%d,"kernel_source":"cpu.stat","nr_periods":%d,"nr_throttled":%d,'
            '"nr_bursts":0,"burst_ns":0,"lost_events":0,"below_threshold":0}\n'
            % (t0 + k * P, k * P, k * 64, k * 100_000_000, k * 2, k * 100_000_000, k, k))
import os
os.rename(path + ".tmp", path)
EOF
fi

bytes=$(stat -c %s "$LOG")
echo "log: $LOG, $((bytes / 1024 / 1024)) MB, $(wc -l <"$LOG") lines" >&2
# Warm the page cache once, so the runs measure parsing rather than the disk.
cat "$LOG" >/dev/null
results=()
for _ in $(seq "$RUNS"); do
  out=$( { /usr/bin/time -f "%e %M %U" "$BIN" report --json "$LOG" >/dev/null; } 2>&1 | tail -1)
  results+=("$out")
  read -r e m u <<<"$out"
  echo "  run: $e s wall, $u s user CPU, max RSS $m KiB" >&2
done
read -r secs rss user <<<"$(printf '%s\n' "${results[@]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")"
awk -v b="$bytes" -v s="$secs" -v r="$rss" -v u="$user" \
  'BEGIN { printf "report: %.0f MB in %.2f s = %.0f MB/s (%.0f MB per CPU-second), max RSS %.1f MiB (median run)\n", b/1048576, s, b/1048576/s, b/1048576/u, r/1024 }'
