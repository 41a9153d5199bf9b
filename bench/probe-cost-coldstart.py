#!/usr/bin/env python3
"""Kernel time per invocation of the sched_switch and sched_wakeup programs,
two tw-probe-hold builds A/B, from the kernel's own BPF statistics
(kernel.bpf_stats_enabled: run_time_ns / run_cnt per program), which the
load of a shared machine disturbs far less than `perf bench` throughput.

  OLD=/path/old/tw-probe-hold NEW=/path/new/tw-probe-hold bench/probe-cost-coldstart.py [ROUNDS] [LOOPS]

Two configurations, each old and new, interleaved round by round (order
alternating), `perf bench sched pipe -l LOOPS` pinned to CPU 0 in a cpu
cgroup of its own:
  cs  the cgroup watched and a cold start armed in it that never completes
      (`tw-probe-hold 0 --cold-start DIR`): perf is its entrypoint and both
      pipe tasks are followed, so every switch runs the cold-start part;
  w1  combined probes, one (other) cgroup watched: perf's tasks unwatched.
A debug build of tw-probe-hold carries the same BPF object as a release one
(clang -O2 either way). Prints the median ns per invocation; the figures
include the statistics' own cost (two clock reads per run). Root only.
"""
import collections
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpfstats import STATS, cpu_root, progs  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 11
LOOPS = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
HOLD = {"old": os.environ["OLD"], "new": os.environ["NEW"]}
PROGS = ("tw_switch_btf", "tw_wakeup_btf", "tw_waking_btf")  # the wake-up part moved to sched_waking (issue 36)


def one(which, mode, cg, res):
    # The holder's programs are the ones that appear while it runs (other
    # agents on the machine load programs of the same names).
    before = {n: {p["id"] for p in progs(n)} for n in PROGS}
    args = [HOLD[which]] + (["0", "--cold-start", cg] if mode == "cs" else ["1"])
    h = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        if not h.stdout.readline().startswith("ready"):
            sys.exit(f"{args}: the holder failed")
        subprocess.run(["sh", "-c", f"echo $$ > {cg}/cgroup.procs; "
                        f"exec taskset -c 0 perf bench sched pipe -l {LOOPS}"],
                       capture_output=True, check=True)
        for n in PROGS:
            new = [p for p in progs(n) if p["id"] not in before[n]]
            if not new:
                continue  # a build without this program
            p = min(new, key=lambda p: abs(p.get("run_cnt", 0) - 2 * LOOPS))
            res[(mode, n, which)].append(p["run_time_ns"] / max(p["run_cnt"], 1))
    finally:
        h.stdin.close()
        h.wait()


def main():
    cg = f"{cpu_root()}/tw-bench-coldstart-{os.getpid()}"
    os.mkdir(cg)
    was = open(STATS).read().strip()
    res = collections.defaultdict(list)
    try:
        open(STATS, "w").write("1")
        for r in range(ROUNDS):
            pairs = [("old", "new"), ("new", "old")][r % 2]
            for mode in ("cs", "w1"):
                for which in pairs:
                    one(which, mode, cg, res)
    finally:
        open(STATS, "w").write(was)
        os.rmdir(cg)
    print(f"{'config':<4} {'program':<14} {'old ns':>8} {'new ns':>8} {'new/old':>8}")
    for mode in ("cs", "w1"):
        for n in PROGS:
            o = statistics.median(res[(mode, n, "old")] or [0.0])
            w = statistics.median(res[(mode, n, "new")] or [0.0])
            print(f"{mode:<4} {n:<14} {o:8.1f} {w:8.1f} {(w / o if o else float('nan')):8.3f}")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"({ROUNDS} interleaved rounds, perf bench sched pipe -l {LOOPS} on CPU 0; load {load})")


main()
