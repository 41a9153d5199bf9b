#!/usr/bin/env bash
# The VM lane of the test suite: the root tests that matter for a different
# kernel and cgroup layout, run inside a Linux 6.1 guest with pure cgroup v2
# (dequeue-based throttling, fentry available), then a short soak of the
# probe. One boot runs them all; run.sh fails the lane at the first soft
# lockup, RCU stall, hung task, oops or BUG on the guest console.
# `modern_node` is the node users run now: containerd 2.3.4 with its CRI
# plugin, configured from its `config default` through our installer, pods
# on a bridge CNI network (the bridge and veth modules), handlers runc and
# throttlewatch; `nri` the NRI plugin on that node; `wakeups` the wake-up chains on the dequeue
# model. docker and containerd 1.6 stay on the host lane, and so
# does `agent` (see integration/vm/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

# The binaries the tests start (throttlewatch, the hook, the wrapper,
# tw-burn): built here too, so the lane runs alone on a fresh checkout.
cargo build --workspace --bins --quiet
bindir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug
# Test executables by target name, from cargo's own build plan.
# A test that does not compile fails the lane here, with the compiler's words.
plan=$(cargo test --workspace --no-run --message-format=json 2>/dev/null) || {
  echo "lane: cargo test --workspace --no-run failed:" >&2
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-message" and m["message"].get("level") == "error":
        sys.stderr.write(m["message"].get("rendered") or m["message"]["message"])
' <<<"$plan"
  exit 1
}
exes=$(python3 -c '
import json, sys
want = {"load", "fidelity", "qos_runc", "runq", "runc", "cli", "coldstart", "control", "thread_cpu", "start_path",
        "modern_node", "task_metrics", "kubelet_pods", "nri", "wakeups"}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want \
            and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
        want.discard(m["target"]["name"])
if want:
    sys.exit("lane: no test executable for " + ", ".join(sorted(want)))
' <<<"$plan")
# Tests of these binaries that run on the host lane only: what they check
# is the same code on any kernel and cgroup layout (input checking, help,
# protocol and restart orders), and under TCG each costs seconds to minutes
# of the suite's time (the suite keeps under 2400 s: issue 48). The
# binaries' other tests — what the kernel, pure cgroup v2 and the dequeue
# throttling model change — run here. The NRI plugin's pod-start comparison
# is a benchmark: under TCG a pod start takes seconds and the figure means
# nothing.
declare -A host_only=(
  [nri]="latency restart:: fail_open:: node_wide:: plugin_launched_by_containerd"
  [runc]="malformed_config_json bad_annotations weird_ids garbage_on_the_hook_stdin concurrent_creates a_container_started_while_no_agent_listens"
  [cli]="bad_input topology_on_a_fixture_tree diagnostics_in_a_pipe every_binary_answers_help unprivileged_run"
)
script=$(mktemp)
trap 'rm -f "$script"' EXIT
while read -r name exe; do
  [[ -n "$name" ]] || continue
  # A hung binary fails on its own within minutes instead of holding the
  # lane until its overall timeout.
  skip=""
  for t in ${host_only[$name]:-}; do skip+=" --skip $t"; done
  echo "timeout -s KILL 420 $exe --test-threads=1 --nocapture$skip" >>"$script"
done <<<"$exes"
[[ -s "$script" ]] || { echo "lane: no test executables found" >&2; exit 1; }
# A short soak in the same boot (about 45 s): attach -> throttled workload ->
# detach cycles next to a throttled unwatched neighbour, and one agent cycle
# with two restarts under load (integration/vm/soak.sh; the long version is
# run by hand, see integration/vm/README.md). LANE_SOAK_CYCLES=0 leaves it out.
soak=${LANE_SOAK_CYCLES:-6}
[[ "$soak" =~ ^[0-9]+$ ]] || { echo "lane: LANE_SOAK_CYCLES '$soak': expected a whole number" >&2; exit 2; }
[[ "$soak" -gt 0 ]] && echo "timeout -s KILL 300 integration/vm/soak.sh --guest $soak 6 full 800 run $bindir" >>"$script"
exec integration/vm/run.sh --timeout 1500 --modprobe bridge,veth --script "$script"
