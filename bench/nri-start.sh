#!/bin/bash
# What the NRI plugin adds to a container's start on containerd 2.3.4: the
# CRI's CreateContainer and StartContainer on two private containerd 2.3.4
# nodes of one run, one with throttlewatch-nri connected (annotated pods, so
# it registers every container with the agent before its entrypoint runs),
# one without, container by container in turn; medians and p99, and the
# plugin's own answer times (THROTTLEWATCH_NRI_TIMINGS=1) against NRI's
# request (2 s) and registration (5 s) timeouts. Run as root:
#
#   bench/nri-start.sh [ROUNDS]     (default 24 containers per side)
#
# The agent, the plugin and the shim are release builds (target/release);
# TW_BENCH_DEBUG=1 takes the debug builds instead (faster to build, slower
# answers). Needs ../shared/bin (containerd 2.3.4) and
# containernetworking-plugins, as integration/tests/nri.rs does.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-24}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "nri-start: ROUNDS ${ROUNDS@Q}: expected a positive number" >&2; exit 2; }
T=${CARGO_TARGET_DIR:-target}
cargo build --quiet --workspace --bins
if [[ ${TW_BENCH_DEBUG:-0} != 1 ]]; then
  cargo build --quiet --release -p throttlewatch -p throttlewatch-nri -p containerd-shim-throttlewatch-v2 \
    -p throttlewatch-hook -p throttlewatch-runtime --bins
  # Absolute: the tests run in integration/.
  case $T in /*) ;; *) T=$PWD/$T ;; esac
  export TW_TEST_BIN_DIR=$T/release
fi
TW_NRI_BENCH_ROUNDS=$ROUNDS cargo test --quiet -p throttlewatch-integration --test nri \
  start_container_latency_bench -- --ignored --nocapture --test-threads=1 2>&1 |
  grep -E '^(containerd 2.3.4 CRI|  )|test result|panicked|FAILED'
