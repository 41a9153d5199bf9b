#!/bin/bash
# CreateContainer and StartContainer on CRI-O 1.37 (../shared/bin) with the
# NRI plugin, with the OCI hook files, and with neither, interleaved in one
# run on two private CRI-Os (integration/tests/crio_start_bench.rs says how).
# Medians and p99, by crictl's clock and by CRI-O's own log.
#
#   bench/crio-start.sh [CONTAINERS]     (default 20 per kind; root; needs
#                                         conmon, runc, skopeo: scripts/setup.sh --test)
#
# The agent, hook and plugin are release builds (target/release; a debug
# agent makes the register several times slower); TW_TEST_BIN_DIR=DIR takes them
# from DIR instead and builds nothing.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -eu
cd "$(dirname "$0")/.."
export TW_BENCH_CONTAINERS="${1:-20}"
if [ -z "${TW_TEST_BIN_DIR:-}" ]; then
  cargo build --release -q -p throttlewatch -p throttlewatch-hook -p throttlewatch-nri --bins
  export TW_TEST_BIN_DIR="$PWD/target/release"
fi
cargo test -q -p throttlewatch-integration --test crio_start_bench -- \
  --ignored --nocapture --test-threads=1 2>&1 | grep -v '^$'
