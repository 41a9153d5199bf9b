#!/bin/sh
# Issue #18, without any program of ours: flip the sched_switch tracepoint on
# and off through tracefs (tracepoint_probe_register/unregister, the same
# static-call text patching of __schedule that unloading our probe does)
# while both vCPUs context-switch hard. Run in the guest:
#   VM_ACCEL=tcg integration/vm/run.sh --timeout 600 -- integration/vm/tracepoint-toggle.sh 3000
# VM_ACCEL=tcg is multi-threaded TCG; the lane's default (single-threaded) is
# the control. Prints a line per 250 flips; run.sh stops at the first lockup.
set -eu
n=${1:-2000}
t=/sys/kernel/tracing
[ -d $t/events ] || mount -t tracefs nodev $t
echo 0 > $t/tracing_on   # record nothing: only the call-site patching matters
for c in 0 1; do
    # a pipe with 1-byte reads: a context switch per byte, on each vCPU
    taskset -c $c sh -c 'while :; do dd if=/dev/zero bs=1 count=20000 2>/dev/null | dd bs=1 of=/dev/null 2>/dev/null; done' &
done
i=0
while [ $i -lt $n ]; do
    echo 1 > $t/events/sched/sched_switch/enable
    echo 0 > $t/events/sched/sched_switch/enable
    i=$((i + 1))
    [ $((i % 250)) -eq 0 ] && echo "toggle: $i flips"
done
kill $(jobs -p) 2>/dev/null || true
echo "toggle: $n flips, no kernel trouble"
