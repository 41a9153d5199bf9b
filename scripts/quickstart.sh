#!/usr/bin/env bash
# One command on a fresh machine: set up, build, and watch a workload that
# visibly throttles: 4 busy threads under a 1-CPU quota (4x oversubscribed),
# then the report on its log.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p target/demo
./target/release/throttlewatch run --cpus 1 --log target/demo/demo.jsonl \
  -- ./target/release/tw-burn --threads 4 --ms 3000 "$@"
# What a person reads next: the summary, the heatmaps, and what to change.
echo
echo "+ throttlewatch report target/demo/demo.jsonl --html target/demo/report.html"
./target/release/throttlewatch report target/demo/demo.jsonl --html target/demo/report.html
echo "heatmaps and tables: target/demo/report.html (one file, opens offline); --json for data"
