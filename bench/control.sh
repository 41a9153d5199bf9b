#!/bin/bash
# The dynamic CPU controller (issue 15, docs/control.md) against static limits
# and a Koordinator-style baseline (x1.2 / x0.8 on a 1-second cpu.stat poll,
# ceiling 300 %), interleaved round by round; medians of p50/p99 request
# latency, throttled time and CPU used. Scenario 2 adds a CPU-hungry
# neighbour (4 spinning threads, no quota, own cgroup) in the middle third of
# every run with the node guard on, and shows the server's limit before,
# during and after it, how fast it was handed back, and the neighbour's CPU.
#
#   [GUARD=node|neighbour] bench/control.sh [ROUNDS] [SECS]   (default 3 rounds of 10 s per mode)
#
# GUARD=node (default): the guard reads /proc/pressure/cpu; GUARD=neighbour:
# the neighbour's own cgroup2 cpu.pressure (a shared machine's node PSI
# carries other jobs' load).
#
# Run as root. On a shared 2-core machine the figures move from run to run:
# compare the modes within one run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-10}
cargo build -q -p throttlewatch -p throttlewatch-integration --bins
# integration's bin() finds the workspace binaries one level above the
# executable's folder (tests run from target/debug/deps).
mkdir -p target/debug/bench
cp target/debug/tw-control-bench target/debug/bench/
echo "== scenario 1: bursty request server alone (node guard off) =="
target/debug/bench/tw-control-bench --rounds "$ROUNDS" --secs "$SECS"
echo
echo "== scenario 2: a CPU-hungry neighbour in the middle third of each run; node guard on (PSI some >= 60 % of 0.5 s and idle <= 10 %, read from ${GUARD:-node}) =="
target/debug/bench/tw-control-bench --rounds "$ROUNDS" --secs "$SECS" --neighbour --guard "${GUARD:-node}"
