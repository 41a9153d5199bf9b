#!/usr/bin/env bash
# One command on a fresh machine: set up, build, and the demo: busy threads
# under a CPU limit well below what this machine gives them right now (so it
# throttles however busy the machine is), live freezes and the summary, then
# the report on its log and the HTML page. Exit 3 (and why, in one line)
# if the kernel throttled nothing after all. Extra arguments go to
# `throttlewatch demo` (--threads, --duration, --share).
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-target}
scripts/setup.sh
mkdir -p "$T/demo"
tw=$T/release/throttlewatch
rc=0
"$tw" demo --log "$T/demo/demo.jsonl" "$@" || rc=$?
if ((rc == 3)); then
  echo "quickstart: the demo was not throttled (the line above says why), so there is nothing to report" >&2
fi
((rc == 0)) || exit "$rc"
# What a person reads next: the summary, the heatmaps, and what to change.
echo
echo "+ throttlewatch report $T/demo/demo.jsonl --html $T/demo/report.html"
"$tw" report "$T/demo/demo.jsonl" --html "$T/demo/report.html"
echo "heatmaps and tables: $T/demo/report.html (one file, opens offline); --json for data"
