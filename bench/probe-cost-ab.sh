#!/usr/bin/env bash
# A/B of bench/probe-cost.sh: two tw-probe-hold builds interleaved round by round.
#   OLD=/path/old/tw-probe-hold NEW=/path/new/tw-probe-hold bench/probe-cost-ab.sh [ROUNDS] [LOOPS]
# (build the old one with `git worktree add /tmp/old REV && cargo build --release -p throttlewatch-integration --bin tw-probe-hold` there)
set -euo pipefail
ROUNDS=${1:-7}; LOOPS=${2:-200000}
pipe_us() { taskset -c 0 perf bench sched pipe -l "$LOOPS" 2>/dev/null | awk '/usecs\/op/ {print $1}'; }
declare -A samples
configs=(none old:thr1 new:thr1 old:w0 new:w0 old:w1 new:w1 old:w100 new:w100)
for ((r = 1; r <= ROUNDS; r++)); do
  for c in "${configs[@]}"; do
    if [[ $c == none ]]; then v=$(pipe_us); else
      which=${c%%:*}; cfg=${c#*:}; hold=$OLD; [[ $which == new ]] && hold=$NEW
      n=${cfg#w}; extra=()
      [[ $cfg == thr* ]] && { n=${cfg#thr}; extra+=(--no-runq); }
      coproc H { exec "$hold" "$n" "${extra[@]}"; }
      read -r ready _ <&"${H[0]}"; [[ $ready == ready ]] || { echo "holder failed" >&2; exit 1; }
      v=$(pipe_us); exec {H[1]}>&-; wait "$H_PID" || true
    fi
    samples[$c]+="$v "
  done
done
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
base=$(median "${samples[none]}")
printf "%-10s %12s %10s %14s\n" config "usecs/op" ratio "added ns/switch"
for c in "${configs[@]}"; do
  m=$(median "${samples[$c]}")
  awk -v c="$c" -v m="$m" -v b="$base" 'BEGIN {printf "%-10s %12.3f %10.3f %14.0f\n", c, m, m/b, (m-b)*500}'
done
echo "($ROUNDS interleaved rounds, perf bench sched pipe -l $LOOPS on CPU 0)"
