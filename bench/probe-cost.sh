#!/usr/bin/env bash
# Added cost per context switch of the throttle probe, as a ratio to no probe,
# with 0, 1 and 100 watched cgroups. `perf bench sched pipe` pinned to one CPU;
# configurations interleaved round by round, medians compared (these machines
# are noisy: absolute figures mean little, ratios within one run do).
#   bench/probe-cost.sh [ROUNDS] [LOOPS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
LOOPS=${2:-200000}
HOLD=${HOLD:-target/release/tw-probe-hold}
[[ -x $HOLD ]] || cargo build --release -p throttlewatch-integration --bin tw-probe-hold --quiet
command -v perf >/dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 1; }

pipe_us() { # usecs/op of one run
  taskset -c 0 perf bench sched pipe -l "$LOOPS" 2>/dev/null | awk '/usecs\/op/ {print $1}'
}

declare -A samples
configs=(none w0 w1 w100 ${EXTRA_CONFIGS:-})
for ((r = 1; r <= ROUNDS; r++)); do
  for c in "${configs[@]}"; do
    if [[ $c == none ]]; then
      v=$(pipe_us)
    else
      n=${c#w}; extra=()
      [[ $n == *raw ]] && { n=${n%raw}; extra=(--raw-tp); }
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
printf "%-8s %12s %10s %12s\n" config "usecs/op" ratio "added ns/op"
for c in "${configs[@]}"; do
  m=$(median "${samples[$c]}")
  awk -v c="$c" -v m="$m" -v b="$base" 'BEGIN {printf "%-8s %12.3f %10.3f %12.0f\n", c, m, m/b, (m-b)*1000}'
done
echo "($ROUNDS interleaved rounds of perf bench sched pipe -l $LOOPS on CPU 0; one op = two context switches)"
