#!/bin/bash
# Issue 48's node at max pods through the CRI and NRI, one command: 110
# single-container pods and 4 of 3 containers through crictl on two private
# containerd 2.3.4 nodes of one run, one with throttlewatch-nri connected and
# the agent (annotated pods), one without the plugin, pod by pod in turn;
# `crictl start` p50/p99 on each side; with every pod running, the agent's
# CPU (/proc/PID/stat over a steady window, % of one core), its RSS and the
# /metrics scrape (bytes, ms); then SIGKILL of the agent, a restart of the
# plugin and a restart of containerd mid-churn (10 pods removed and 10
# started around and after each) and the nothing-lost checks of
# integration/tests/nri_churn.rs. Run as root:
#
#   bench/pods-110.sh [PODS] [CHURN] [WINDOW_S]   (defaults 110 10 30)
#
# The agent, the plugin and the shim are release builds (target/release);
# TW_BENCH_DEBUG=1 takes the debug builds instead. Needs ../shared/bin
# (containerd 2.3.4, crictl) and containernetworking-plugins, as
# integration/tests/nri.rs does. A few minutes on 2 CPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
PODS=${1:-110}
CHURN=${2:-10}
WINDOW=${3:-30}
for v in "$PODS" "$CHURN" "$WINDOW"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "pods-110: ${v@Q}: expected a positive number (PODS CHURN WINDOW_S)" >&2; exit 2; }
done
T=${CARGO_TARGET_DIR:-target}
# Absolute: the tests run in integration/.
case $T in /*) ;; *) T=$PWD/$T ;; esac
cargo build --quiet --workspace --bins
if [[ ${TW_BENCH_DEBUG:-0} != 1 ]]; then
  cargo build --quiet --release -p throttlewatch -p throttlewatch-nri -p containerd-shim-throttlewatch-v2 \
    -p throttlewatch-hook -p throttlewatch-runtime --bins
  export TW_TEST_BIN_DIR=$T/release
fi
LOG=$T/pods-110.log
echo "pods-110: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
if ! TW_PODS_BENCH=$PODS TW_PODS_BENCH_CHURN=$CHURN TW_PODS_BENCH_WINDOW_S=$WINDOW \
  cargo test --quiet -p throttlewatch-integration --test nri_churn \
  pods_110_bench -- --ignored --nocapture --test-threads=1 >"$LOG" 2>&1; then
  grep -E '^pods-110: |panicked' "$LOG" >&2 || true
  echo "pods-110: FAILED; the whole output is in $LOG" >&2
  exit 1
fi
grep -E '^pods-110: |test result' "$LOG"
