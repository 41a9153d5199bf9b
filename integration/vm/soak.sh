#!/usr/bin/env bash
# Soak of the probe on the VM lane's 6.1 guest (dequeue-model throttling,
# fentry): repeated attach -> throttled workload -> detach cycles, with agent
# restarts under load, in as many boots as asked. run.sh watches the guest
# console and stops a boot at the first soft lockup, RCU stall, hung task,
# oops or BUG with the stacks printed.
#
#   integration/vm/soak.sh [--cycles N] [--boots B] [--agent-every K]
#                          [--probes full|no-fentry|no-hrtimer|no-runq|none]
#                          [--ms MS] [--timeout SECS] [--churn]
#
#   --cycles N       attach/throttle/detach cycles per boot (default 20)
#   --boots B        boots, one after the other (default 1)
#   --agent-every K  every K-th cycle is an agent cycle instead: the agent
#                    watches a quota'd burner and is restarted twice under it
#                    (SIGTERM, SIGKILL); 0: none (default 5)
#   --probes P       full: every program the product loads (default);
#                    no-fentry / no-hrtimer / no-runq: leave that group out
#                    (THROTTLEWATCH_PROBE_SKIP); none: the same workloads and
#                    cgroups with no probe loaded at all
#   --ms MS          workload length per cycle in guest milliseconds (default 1200)
#   --timeout SECS   per boot (default: 60 + 25 s per cycle)
#   --churn          instead of the cycles above: `throttlewatch watch` for MS
#                    (default 1200) on a group throttled 100 times a second,
#                    next to an unwatched one, one load/unload per cycle
#
# Prints one line per boot and a total: "soak: N troubles in B boots, C cycles".
# Exit 0 when every cycle passed and no boot saw kernel trouble.
# Inside the guest it runs itself with --guest (see the end of this file).
set -euo pipefail

if [[ "${1:-}" == --guest ]]; then
    # ---------------------------------------------------------- in the guest
    shift
    cycles=$1 agent_every=$2 probes=$3 ms=$4 mode=${5:-run} bindir=${6:-target/debug}
    tw=$bindir/throttlewatch
    burn=$bindir/tw-burn
    cg=/sys/fs/cgroup
    case "$probes" in
        full|none) ;;
        no-fentry) export THROTTLEWATCH_PROBE_SKIP=fentry ;;
        no-hrtimer) export THROTTLEWATCH_PROBE_SKIP=hrtimer ;;
        no-runq) export THROTTLEWATCH_PROBE_SKIP=runq ;;
        *) echo "soak: unknown --probes '$probes'" >&2; exit 2 ;;
    esac
    # The agent's socket protocol: one JSON line each way.
    agent_call() {
        python3 - "$1" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
print(s.makefile().readline().strip())
PY
    }
    agent_up() {
        local n
        for n in $(seq 1 300); do
            agent_call "$ad/agent.sock" '{"op":"status"}' >/dev/null 2>&1 && return 0
            sleep 0.2
        done
        return 1
    }
    # One agent cycle: an agent watches a quota'd burner and is restarted
    # twice while it runs (SIGTERM, then SIGKILL); the burner must finish
    # and the log end with its totals.
    agent_cycle() {
        local i=$1 a w b r k
        ad=/tmp/soak-agent-$i
        w=$cg/soak-a-$i
        mkdir -p "$ad" "$w"
        printf 'log_dir = "%s/logs"\nsocket = "%s/agent.sock"\nstate_dir = "%s/state"\nmetrics_addr = "127.0.0.1:19479"\nsnapshot_interval_s = 1\n' \
            "$ad" "$ad" "$ad" >"$ad/tw.toml"
        echo "25000 100000" >"$w/cpu.max"
        "$tw" --config "$ad/tw.toml" agent >/dev/null 2>"$ad/agent.err" & a=$!
        agent_up || { agent_res="agent did not come up"; kill -KILL $a; return 1; }
        ( echo $BASHPID >"$w/cgroup.procs"; exec "$burn" --threads 2 --ms $((ms + 2000)) >/dev/null ) & b=$!
        r=$(agent_call "$ad/agent.sock" "{\"op\":\"register\",\"container_id\":\"soak-$i\",\"container_name\":\"soak\",\"pid\":$b,\"cgroup_path\":\"/soak-a-$i\",\"annotations\":{},\"bundle\":\"\",\"created_ns\":null,\"threshold_ns\":null,\"qos\":null}")
        [[ "$r" == *'"ok":true'* ]] || { agent_res="register: $r"; kill -KILL $a $b; return 1; }
        for k in TERM KILL; do
            sleep 0.5
            kill -$k $a; wait $a 2>/dev/null
            "$tw" --config "$ad/tw.toml" agent >/dev/null 2>>"$ad/agent.err" & a=$!
            agent_up || { agent_res="agent did not come back after SIG$k"; kill -KILL $a $b; return 1; }
        done
        # the burner must finish (a hang here is the symptom once seen in the VM)
        for k in $(seq 1 600); do kill -0 $b 2>/dev/null || break; sleep 0.1; done
        if kill -0 $b 2>/dev/null; then
            agent_res="burner still running 60 s after its end: $(tr '\n' ' ' <"$w/cpu.stat")"
            kill -KILL $a $b; return 1
        fi
        wait $b
        r=$(agent_call "$ad/agent.sock" "{\"op\":\"unregister\",\"container_id\":\"soak-$i\",\"reason\":\"poststop\",\"exit_code\":0}")
        kill -TERM $a; wait $a 2>/dev/null
        rmdir "$w"
        [[ "$r" == *'"ok":true'* ]] || { agent_res="unregister: $r"; return 1; }
        agent_res="$(grep -c '"type":"resume"' "$ad"/logs/* 2>/dev/null | tail -1) resumes, $(grep -o '"kernel_throttled_ns":[0-9]*' "$ad"/logs/* | tail -1)"
        return 0
    }
    if [[ "$mode" == churn ]]; then
        # Attach/detach churn under a high throttle rate: a watched and an
        # unwatched group, 2 ms of quota per 10 ms period, one burner
        # thread on each CPU, while the probe is loaded, watches for a
        # moment and is unloaded again, cycle after cycle.
        for g in churn-w churn-u; do
            mkdir -p "$cg/$g"
            echo "2000 10000" >"$cg/$g/cpu.max"
            ( echo $BASHPID >"$cg/$g/cgroup.procs"; exec "$burn" --threads 2 --ms 100000000 --pin spread >/dev/null ) &
        done
        fail=0
        for i in $(seq 1 "$cycles"); do
            t0=$(cut -d' ' -f1 /proc/uptime)
            if [[ "$probes" == none ]]; then
                sleep 1; rc=0
            else
                "$tw" watch --cgroup /churn-w --duration "${ms}ms" --quiet --log /tmp/churn.jsonl >/dev/null 2>/tmp/churn.err
                rc=$?
                [[ $rc -eq 0 ]] || { cat /tmp/churn.err; fail=1; }
            fi
            echo "soak: cycle $i churn rc=$rc $(grep -o '"probe_throttled_ns":[0-9]*' /tmp/churn.jsonl 2>/dev/null | tail -1) $(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}')s"
        done
        kill $(jobs -p) 2>/dev/null; wait
        exit $fail
    fi
    nb=$cg/soak-neighbour
    mkdir -p "$nb"
    echo "15000 100000" >"$nb/cpu.max"
    fail=0
    for i in $(seq 1 "$cycles"); do
        t0=$(cut -d' ' -f1 /proc/uptime)
        if [[ "$agent_every" -gt 0 && $((i % agent_every)) -eq 0 && "$probes" != none ]]; then
            agent_cycle "$i" || fail=1
            echo "soak: cycle $i agent-restarts $agent_res $(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}')s"
            continue
        fi
        pin=spread; cpus=0.5; threads=2
        if [[ $((i % 2)) -eq 0 ]]; then pin=packed; cpus=0.3; threads=3; fi
        # an unwatched, throttled neighbour the whole time (as in the fidelity
        # scenario the original lockup hit)
        ( echo $BASHPID >"$nb/cgroup.procs"; exec "$burn" --threads 2 --ms $((ms + 3000)) >/dev/null ) &
        npid=$!
        log=/tmp/soak-$i.jsonl
        if [[ "$probes" == none ]]; then
            w=$cg/soak-w-$i
            mkdir "$w"
            echo "$(awk -v c="$cpus" 'BEGIN{printf "%d", c*100000}') 100000" >"$w/cpu.max"
            ( echo $BASHPID >"$w/cgroup.procs"; exec "$burn" --threads "$threads" --ms "$ms" --pin "$pin" >/dev/null )
            rc=$?
            res="rc=$rc throttled_usec=$(awk '/^throttled_usec/{print $2}' "$w/cpu.stat")"
            rmdir "$w"
        else
            "$tw" run --cpus "$cpus" --quiet --log "$log" -- "$burn" --threads "$threads" --ms "$ms" --pin "$pin" \
                >/dev/null 2>/tmp/soak-run.err
            rc=$?
            res="rc=$rc $(grep '"type":"end"' "$log" 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    e = json.loads(l)
    p, k = e.get("probe_throttled_ns", 0), e.get("kernel_throttled_ns", 0)
    print("probe %.1f ms kernel %.1f ms error %.2f %%" % (p / 1e6, k / 1e6, abs(p - k) * 100 / k if k else -1))
' || echo 'no end record')"
            [[ $rc -eq 0 ]] || cat /tmp/soak-run.err
        fi
        kill "$npid" 2>/dev/null || true
        wait "$npid" 2>/dev/null || true
        [[ $rc -eq 0 ]] || fail=1
        echo "soak: cycle $i $pin $res $(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}')s"
    done
    rmdir "$nb" 2>/dev/null || true
    exit $fail
fi

# ---------------------------------------------------------------- on the host
cd "$(dirname "$0")/../.."
cycles=20 boots=1 agent_every=5 probes=full ms=1200 timeout="" mode=run
usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
num() { [[ "$2" =~ ^[0-9]+$ ]] || { echo "soak: $1 '$2': expected a whole number" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cycles) num "$1" "${2:-}"; cycles=$2; shift 2 ;;
        --boots) num "$1" "${2:-}"; boots=$2; shift 2 ;;
        --agent-every) num "$1" "${2:-}"; agent_every=$2; shift 2 ;;
        --ms) num "$1" "${2:-}"; ms=$2; shift 2 ;;
        --timeout) num "$1" "${2:-}"; timeout=$2; shift 2 ;;
        --churn) mode=churn; shift ;;
        --probes)
            case "${2:-}" in full|no-fentry|no-hrtimer|no-runq|none) probes=$2 ;;
                *) echo "soak: --probes '${2:-}': expected full, no-fentry, no-hrtimer, no-runq or none" >&2; exit 2 ;;
            esac; shift 2 ;;
        -h|--help) usage ;;
        *) echo "soak: unknown argument '$1'" >&2; usage ;;
    esac
done
[[ "$cycles" -gt 0 && "$boots" -gt 0 ]] || { echo "soak: --cycles and --boots must be > 0" >&2; exit 2; }
timeout=${timeout:-$((60 + 25 * cycles))}

cargo build -q -p throttlewatch --bins
cargo build -q -p throttlewatch-integration --bins
# a private copy: a rebuild of target/ during a long soak must not change
# the binaries under the guest
bindir=integration/vm/cache/soak-bin.$$
mkdir -p "$bindir"
trap 'rm -rf "$bindir"' EXIT
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
cp "$target/debug/throttlewatch" "$target/debug/tw-burn" "$bindir/"
troubles=0 failed=0 done_cycles=0
t_start=$(date +%s)
for b in $(seq 1 "$boots"); do
    out=$(mktemp)
    set +e
    integration/vm/run.sh --timeout "$timeout" -- \
        integration/vm/soak.sh --guest "$cycles" "$agent_every" "$probes" "$ms" "$mode" "$bindir" >"$out" 2>&1
    rc=$?
    set -e
    n=$(grep -c '^soak: cycle' "$out" || true)
    done_cycles=$((done_cycles + n))
    if grep -q 'LANE FAIL: guest kernel' "$out"; then
        troubles=$((troubles + 1))
        echo "soak: boot $b: KERNEL TROUBLE after $n cycles"
        cat "$out"
    elif [[ $rc -ne 0 ]]; then
        failed=$((failed + 1))
        echo "soak: boot $b: FAILED (rc=$rc) after $n cycles"
        cat "$out"
    else
        echo "soak: boot $b: $n cycles clean ($(grep -m1 -o 'total [0-9.]*s' "$out"))"
        [[ -n "${SOAK_VERBOSE:-}" ]] && grep '^soak: cycle' "$out"
    fi
    rm -f "$out"
done
echo "soak: $troubles troubles, $failed other failures in $boots boots, $done_cycles cycles ($mode, probes $probes), $(( $(date +%s) - t_start ))s"
[[ $troubles -eq 0 && $failed -eq 0 ]]
