#!/usr/bin/env bash
# Added cost per context switch of the probes, as a ratio to no probe.
# `perf bench sched pipe` pinned to one CPU; configurations interleaved round
# by round, medians compared (these machines are noisy: absolute figures mean
# little, ratios within one run do).
#   none      no probe
#   thr1      throttle probe only (--no-runq), 1 watched cgroup
#   w0 w1 w100  combined probes (throttle + run-queue latency + cold start),
#             0, 1 and 100 watched cgroups
#   runqlat   libbpf-tools' runqlat, when RUNQLAT=/path/to/runqlat is set
#             (built here, not part of the repository; see bench/README.md)
#   bench/probe-cost.sh [ROUNDS] [LOOPS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
LOOPS=${2:-200000}
HOLD=${HOLD:-target/release/tw-probe-hold}
RUNQLAT=${RUNQLAT:-}
[[ -x $HOLD ]] || cargo build --release -p throttlewatch-integration --bin tw-probe-hold --quiet
command -v perf >/dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 1; }

pipe_us() { # usecs/op of one run
  taskset -c 0 perf bench sched pipe -l "$LOOPS" 2>/dev/null | awk '/usecs\/op/ {print $1}'
}

declare -A samples
configs=(none thr0 thr1 thr100 w0 w1 w100 ${EXTRA_CONFIGS:-})
if [[ -n $RUNQLAT ]]; then
  if [[ -x $RUNQLAT ]]; then configs+=(runqlat); else echo "RUNQLAT=$RUNQLAT is not executable: runqlat column skipped" >&2; fi
fi
for ((r = 1; r <= ROUNDS; r++)); do
  for c in "${configs[@]}"; do
    if [[ $c == none ]]; then
      v=$(pipe_us)
    elif [[ $c == runqlat ]]; then
      "$RUNQLAT" 3600 1 >/dev/null 2>&1 &
      rq=$!
      sleep 1.5 # loaded and attached
      v=$(pipe_us)
      kill -INT "$rq"; wait "$rq" || true
    else
      n=${c#w}; extra=()
      [[ $c == thr* ]] && { n=${c#thr}; extra+=(--no-runq); }
      [[ $n == *raw ]] && { n=${n%raw}; extra+=(--raw-tp); }
      coproc H { exec "$HOLD" "$n" "${extra[@]}"; }
      read -r ready _ <&"${H[0]}"
      [[ $ready == ready ]] || { echo "holder failed" >&2; exit 1; }
      v=$(pipe_us)
      exec {H[1]}>&-
      wait "$H_PID" || true
    fi
    samples[$c]+="$v "
  done
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
base=$(median "${samples[none]}")
printf "%-8s %12s %10s %12s %14s\n" config "usecs/op" ratio "added ns/op" "added ns/switch"
for c in "${configs[@]}"; do
  m=$(median "${samples[$c]}")
  awk -v c="$c" -v m="$m" -v b="$base" 'BEGIN {printf "%-8s %12.3f %10.3f %12.0f %14.0f\n", c, m, m/b, (m-b)*1000, (m-b)*500}'
done
echo "($ROUNDS interleaved rounds of perf bench sched pipe -l $LOOPS on CPU 0; one op = two context switches)"
