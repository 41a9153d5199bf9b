#!/usr/bin/env bash
# The VM lane of the test suite: the root tests that matter for a different
# kernel and cgroup layout, run inside a Linux 6.1 guest with pure cgroup v2
# (dequeue-based throttling, fentry available). One boot runs them all;
# docker and containerd stay on the host lane (no image store in the guest),
# and so does `agent` (see integration/vm/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

# Test executables by target name, from cargo's own build plan.
exes=$(cargo test --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
want = {"load", "fidelity", "qos_runc", "runq", "runc", "cli"}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want \
            and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
')
script=$(mktemp)
trap 'rm -f "$script"' EXIT
while read -r name exe; do
  [[ -n "$name" ]] || continue
  # A hung binary fails on its own within minutes instead of holding the
  # lane until its overall timeout.
  echo "timeout -s KILL 420 $exe --test-threads=1 --nocapture" >>"$script"
done <<<"$exes"
[[ -s "$script" ]] || { echo "lane: no test executables found" >&2; exit 1; }
exec integration/vm/run.sh --timeout 900 --script "$script"
