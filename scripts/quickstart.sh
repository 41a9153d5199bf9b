#!/usr/bin/env bash
# One command on a fresh machine: set up, build, and watch a workload that
# visibly throttles: 4 busy threads under a 1-CPU quota (4x oversubscribed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p target/demo
exec ./target/release/throttlewatch run --cpus 1 --log target/demo/demo.jsonl \
  -- ./target/release/tw-burn --threads 4 --ms 3000 "$@"
