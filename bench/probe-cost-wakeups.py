#!/usr/bin/env python3
"""What the wake-up chains add (issue 36), two tw-probe-hold builds A/B:
kernel time per invocation of the sched_switch, sched_wakeup and (new only)
sched_waking programs from the kernel's own BPF statistics
(kernel.bpf_stats_enabled: run_time_ns / run_cnt), and the throughput of
`perf bench sched pipe` as a ratio to no probe in the same rounds.

  OLD=/path/old/tw-probe-hold NEW=/path/new/tw-probe-hold bench/probe-cost-wakeups.py [ROUNDS] [LOOPS]

Configurations, interleaved round by round (old/new order alternating),
`perf bench sched pipe -l LOOPS` pinned to CPU 0 in a cpu cgroup of its own:
  w1   one other cgroup watched: perf's tasks are unwatched wakees (the
       case that must cost next to nothing: at most +15 ns per wake-up);
  wat  perf's own cgroup watched (--watch): every switch and wake-up of
       its two tasks runs the watched paths, the edge updated on each.
  none (throughput only) no probe.
Each pipe op is two wake-ups and two switches. Prints the median ns per
invocation and, per op, the ratio to no probe; the figures include the
statistics' own cost (two clock reads per run). Root only.
"""
import collections
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpfstats import STATS, cpu_root, progs  # noqa: E402
from bpfstats import pipe as pipe_in  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 9
LOOPS = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
HOLD = {"old": os.environ["OLD"], "new": os.environ["NEW"]}
PROGS = ("tw_switch_btf", "tw_wakeup_btf", "tw_waking_btf")  # old: wakeup; new: waking (it took the wakeup part over)


def pipe(cg):
    return pipe_in(cg, LOOPS)


def one(which, mode, cg, res, ops):
    before = {n: {p["id"] for p in progs(n)} for n in PROGS}
    args = [HOLD[which]] + (["0", "--watch", cg] if mode == "wat" else ["1"])
    h = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        if not h.stdout.readline().startswith("ready"):
            sys.exit(f"{args}: the holder failed")
        ops[(mode, which)].append(pipe(cg))
        for n in PROGS:
            new = [p for p in progs(n) if p["id"] not in before[n]]
            if not new:
                continue  # the old build has no sched_waking program
            p = min(new, key=lambda p: abs(p.get("run_cnt", 0) - 2 * LOOPS))
            res[(mode, n, which)].append(p["run_time_ns"] / max(p["run_cnt"], 1))
    finally:
        h.stdin.close()
        h.wait()


def main():
    cg = f"{cpu_root()}/tw-bench-wakeups-{os.getpid()}"
    os.mkdir(cg)
    was = open(STATS).read().strip()
    res = collections.defaultdict(list)
    ops = collections.defaultdict(list)
    try:
        open(STATS, "w").write("1")
        for r in range(ROUNDS):
            ops[("none", "-")].append(pipe(cg))
            pairs = [("old", "new"), ("new", "old")][r % 2]
            for mode in ("w1", "wat"):
                for which in pairs:
                    one(which, mode, cg, res, ops)
    finally:
        open(STATS, "w").write(was)
        os.rmdir(cg)
    med = lambda v: statistics.median(v) if v else 0.0
    print(f"{'config':<4} {'program':<14} {'old ns':>8} {'new ns':>8} {'new-old':>8}")
    for mode in ("w1", "wat"):
        for n in PROGS:
            o, w = med(res[(mode, n, "old")]), med(res[(mode, n, "new")])
            print(f"{mode:<4} {n:<14} {o:8.1f} {w:8.1f} {w - o:+8.1f}")
    base = med(ops[("none", "-")])
    print(f"\n{'config':<4} {'old us/op':>10} {'new us/op':>10} {'old/none':>9} {'new/none':>9} {'new/old':>8}")
    for mode in ("w1", "wat"):
        o, w = med(ops[(mode, "old")]), med(ops[(mode, "new")])
        print(f"{mode:<4} {o:10.3f} {w:10.3f} {o / base:9.3f} {w / base:9.3f} {w / o:8.3f}")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"(no probe {base:.3f} us/op; {ROUNDS} interleaved rounds, perf bench sched pipe -l {LOOPS} on CPU 0; load {load})")


main()
