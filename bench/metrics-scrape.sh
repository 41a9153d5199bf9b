#!/bin/bash
# The series budget and the scrape's cost at a node's scale (issue 45): 220
# watched containers (110 pods x 2; 20 frozen by a 2 % quota, 200 asleep)
# registered with the real agent, scraped every second by two real Prometheus
# 2.42 at once, one storing classic histograms, one native. Prints the scrape's
# size and time in OpenMetrics text and in protobuf (medians of 9, interleaved
# in one run), and each server's prometheus_tsdb_head_series and RSS after
# SECONDS of scraping (default 180). Run as root; docs/metrics.md has a run.
#
#   bench/metrics-scrape.sh [SECONDS] [basic|full]
#
# full: the agent at metrics_detail = "full", every series (what every agent
# served before the budget): the before figures.
set -euo pipefail
cd "$(dirname "$0")/.."
export TW_BENCH_SCRAPE_S=${1:-180} TW_BENCH_DETAIL=${2:-basic}
cargo build --workspace --bins --quiet
exec cargo test -q -p throttlewatch-integration --test metrics_budget -- --nocapture 2>&1 \
  | grep -E "^(scrape|classic|native|fleet|test result)"
