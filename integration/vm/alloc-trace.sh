#!/usr/bin/env bash
# Where do the probe's BPF programs allocate? Run in the VM lane's guest:
#
#   integration/vm/run.sh -- integration/vm/alloc-trace.sh [BINDIR] [SECS]
#
# Traces every kmalloc from bpf_map_kzalloc() (task local storage elements
# and storages on Linux < 6.4) with its stack while `throttlewatch run`
# (from BINDIR, default target/debug) watches a throttled workload that
# forks continuously, and counts those made with the run-queue lock held
# (__schedule: sched_switch; try_to_wake_up / wake_up_new_task: sched_wakeup).
# An allocation there can wake kswapd and deadlock the CPU (docs/vm-lane.md);
# the count must be 0. Exit 1 when it is not.
set -uo pipefail
bin=${1:-target/debug}; secs=${2:-15}
T=/sys/kernel/tracing
lo=$(awk '$3=="bpf_map_kzalloc"{print $1; exit}' /proc/kallsyms)
[[ -n "$lo" ]] || { echo "alloc-trace: no bpf_map_kzalloc in kallsyms" >&2; exit 2; }
echo 0 >$T/tracing_on; echo >$T/trace
echo 2048 >$T/buffer_size_kb
ev=$T/events/kmem/kmalloc
echo "call_site >= 0x$lo && call_site < 0x$(printf '%x' $((0x$lo + 0x300)))" >$ev/filter
echo stacktrace >$ev/trigger
echo 1 >$ev/enable
echo 1 >$T/tracing_on
storm="$bin/tw-burn --threads 2 --ms 100000000 --pin spread >/dev/null & while :; do /bin/true; done"
timeout -s INT "$secs" "$bin/throttlewatch" run --cpus 0.5 --quiet --log /tmp/alloc-trace.jsonl -- bash -c "$storm" >/dev/null 2>&1
echo 0 >$T/tracing_on
echo '!stacktrace' >$ev/trigger; echo 0 >$ev/enable; echo 0 >$ev/filter
# the stack trigger fires for every kmalloc; the one right after a printed
# (filtered) event is that event's stack
awk '/ kmalloc: call_site=bpf_map_kzalloc/{k=1; next}
     /<stack trace>/{ if (rec!="") {print rec; rec=""}; if (k) {rec="S"; k=0}; next }
     /^ => / { if (rec!="") rec=rec" "$2 }
     END{ if (rec!="") print rec }' $T/trace >/tmp/alloc-trace.stacks
locked=$(grep bpf_task_storage_get /tmp/alloc-trace.stacks | grep -cE '__schedule|try_to_wake_up|wake_up_new_task')
echo "alloc-trace: $(grep -c . /tmp/alloc-trace.stacks) bpf_map_kzalloc calls in ${secs}s," \
    "$(grep -c bpf_task_storage_get /tmp/alloc-trace.stacks) creating task storage," \
    "$locked of them with the run-queue lock held"
grep bpf_task_storage_get /tmp/alloc-trace.stacks \
    | grep -oE '__schedule|try_to_wake_up|wake_up_new_task|kernel_clone|bprm_execve|cgroup_attach_task|bpf_iter_run_prog' \
    | sort | uniq -c | sed 's/^/  /'
if [[ "$locked" -gt 0 ]]; then
    echo "alloc-trace: one of them:"
    grep bpf_task_storage_get /tmp/alloc-trace.stacks | grep -m1 -E '__schedule|wake_up' | tr ' ' '\n' | sed -n '2,20p' | sed 's/^/  /'
    exit 1
fi
