#!/usr/bin/env bash
# The whole test suite, as CI runs it (as root): installs what it needs, builds,
# runs unit tests and the root end-to-end tests (real kernel, runc, containerd,
# dockerd — each test starts and stops its own private daemons), then the VM
# lane (pure cgroup v2, Linux 6.1) on the same binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
[[ $(id -u) -eq 0 ]] || { echo "test: run as root (the tests load BPF programs and create cgroups)" >&2; exit 1; }

scripts/setup.sh --test
# One build, run once: incremental state would add ~6 GB of disk for nothing.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# Integration tests run the built binaries (throttlewatch, hooks, shim, tw-burn).
cargo build --workspace --bins --quiet
cargo test --workspace --no-fail-fast -- --test-threads=2

echo "== VM lane: pure cgroup v2, Linux 6.1 ==" >&2
integration/vm/lane.sh

echo "test: all passed in $(( $(date +%s) - start ))s" >&2
