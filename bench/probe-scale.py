#!/usr/bin/env python3
"""The per-switch cost against the number of watched cgroups (issue 48):
1, 50, 200 and 1,000 watched, both ways, inside a watched cgroup and outside
any watched one.

  bench/probe-scale.py [ROUNDS] [LOOPS]        (root; defaults 5, 100000)

The node-wide probe set (`tw-probe-hold`, the combined probes) with its watch
map holding N real cpu cgroups (`--watch-under`: empty sibling cgroups
created here, watched the way the agent watches a container):
  in N   perf's own cgroup watched plus N-1 others: every switch and wake-up
         of its two tasks runs the watched paths;
  out N  N others watched, perf's cgroup not: the unwatched paths.
  none   no probe (for scale only).
Measures, per configuration, in the same run: `perf bench sched pipe -l
LOOPS` pinned to CPU 0 (usecs per op; one op = two switches), and the kernel's
own statistics of each loaded tw_* program that ran at least once per op
(the switch and wake-up programs) over that run (run_time_ns /
run_cnt, kernel.bpf_stats_enabled=1 for the whole run, so the pipe figures
include the statistics' cost, the same in every configuration). The
configurations are interleaved round by round (each round's order rotated
by one and reversed every other round, so no configuration keeps a place);
medians. Prints each configuration's ratio to the 1-watched one of its kind
two ways: the ratio of the medians, and the median over the rounds of the
ratio within a round (paired: the two runs lie seconds apart, so the slow
drift of a shared VM cancels). The spread, max/min over N, is taken from the
paired ratios (the issue's bound: any two within 1.03). Removes every cgroup
it made.
"""
import collections
import os
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpfstats import STATS, cpu_root  # noqa: E402
from bpfstats import pipe as pipe_in  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
LOOPS = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLD = os.environ.get("HOLD", f"{ROOT}/target/release/tw-probe-hold")
NS = (1, 50, 200, 1000)
BOUND = 1.03


def tw_progs():
    import json
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True,
                         text=True, check=True).stdout
    return {p["id"]: p for p in json.loads(out or "[]")
            if p.get("name", "").startswith("tw_")}


def pipe(cg):
    return pipe_in(cg, LOOPS)


def holder(kind, n, base):
    """Start tw-probe-hold for a configuration; returns it and its program ids."""
    before = set(tw_progs())
    args = [HOLD, str(n - 1 if kind == "in" else n), "--watch-under", f"{base}/w"]
    if kind == "in":
        args += ["--watch", f"{base}/in"]
    h = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = h.stdout.readline().split()
    if not ready or ready[0] != "ready" or int(ready[2]) != n:
        h.kill()
        sys.exit(f"{' '.join(args)}: the holder failed or watches the wrong count: {ready}")
    mine = [i for i in tw_progs() if i not in before]
    return h, mine


def one(kind, n, base, ops, ns):
    if kind == "none":
        ops[("none", 0)].append(pipe(f"{base}/out"))
        return
    h, mine = holder(kind, n, base)
    try:
        start = tw_progs()
        ops[(kind, n)].append(pipe(f"{base}/{kind}"))
        end = tw_progs()
        for i in mine:
            a, b = start.get(i, {}), end.get(i, {})
            runs = b.get("run_cnt", 0) - a.get("run_cnt", 0)
            if runs >= LOOPS:  # the per-op programs: switch and wake-up
                t = b.get("run_time_ns", 0) - a.get("run_time_ns", 0)
                ns[(kind, n, b["name"])].append(t / runs)
    finally:
        h.stdin.close()
        h.wait()


def make_cgroups(base):
    os.mkdir(base)
    for d in ("in", "out", "w"):
        os.mkdir(f"{base}/{d}")
    for i in range(max(NS)):
        os.mkdir(f"{base}/w/c{i:04d}")


def remove_cgroups(base):
    if not os.path.isdir(base):
        return
    w = f"{base}/w"
    for d in sorted(os.listdir(w)) if os.path.isdir(w) else []:
        if os.path.isdir(f"{w}/{d}"):
            os.rmdir(f"{w}/{d}")
    for d in ("w", "in", "out"):
        if os.path.isdir(f"{base}/{d}"):
            os.rmdir(f"{base}/{d}")
    os.rmdir(base)


def paired(v, v1):
    """The median over the rounds of one configuration's run against the
    1-watched run of the same round."""
    r = [a / b for a, b in zip(v, v1) if b]
    return statistics.median(r) if r else float("nan")


def report(ops, ns):
    med = lambda v: statistics.median(v) if v else float("nan")
    base = med(ops[("none", 0)])
    print(f"per switch (perf bench sched pipe, usecs/op / 2); no probe {base / 2:.3f} us")
    print("(IQR: interquartile range of the rounds over their median, the run's own noise)")
    iqr = lambda v: (statistics.quantiles(v, n=4)[2] - statistics.quantiles(v, n=4)[0]) / med(v) if len(v) > 1 else 0.0
    print("(in/in1, out/out1: ratio of the medians; paired: median of the ratios within a round)")
    print(f"{'N':>5} {'in us':>8} {'in/in1':>7} {'paired':>7} {'out us':>8} {'out/out1':>8} {'paired':>7} {'in/none':>8} {'out/none':>8} {'IQR in':>7} {'IQR out':>7}")
    ratios = collections.defaultdict(list)
    for n in NS:
        i, o = med(ops[("in", n)]), med(ops[("out", n)])
        ri, ro = i / med(ops[("in", 1)]), o / med(ops[("out", 1)])
        pi, po = paired(ops[("in", n)], ops[("in", 1)]), paired(ops[("out", n)], ops[("out", 1)])
        ratios["pipe in"].append(pi)
        ratios["pipe out"].append(po)
        qi, qo = iqr(ops[("in", n)]), iqr(ops[("out", n)])
        print(f"{n:>5} {i / 2:8.3f} {ri:7.3f} {pi:7.3f} {o / 2:8.3f} {ro:8.3f} {po:7.3f} {i / base:8.3f} {o / base:8.3f} {qi:7.3f} {qo:7.3f}")
    names = sorted({k[2] for k in ns if k[0] == "in"} & {k[2] for k in ns if k[0] == "out"})
    print("\nbpf_stats: ns per run (run_time_ns / run_cnt over the pipe run), median; paired ratio to N=1")
    print(f"{'N':>5} " + " ".join(f"{k + ' ' + p:>22}" for k in ("in", "out") for p in names))
    for n in NS:
        cells = []
        for k in ("in", "out"):
            for p in names:
                v = med(ns[(k, n, p)])
                r = paired(ns[(k, n, p)], ns[(k, 1, p)])
                ratios[f"{k} {p}"].append(r)
                cells.append(f"{v:7.1f} ns x{r:6.3f}")
        print(f"{n:>5} " + " ".join(f"{c:>22}" for c in cells))
    print(f"\nspread (max/min of the paired ratios over N = {', '.join(map(str, NS))}; bound {BOUND}):")
    for k, v in ratios.items():
        s = max(v) / min(v)
        print(f"  {k:<28} {s:6.3f} {'within' if s <= BOUND else 'OVER'}")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"({ROUNDS} interleaved rounds, perf bench sched pipe -l {LOOPS} on CPU 0; load {load})")


def main():
    if not os.access(HOLD, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-p", "throttlewatch-integration",
                        "--bin", "tw-probe-hold", "--quiet"], cwd=ROOT, check=True)
    base = f"{cpu_root()}/tw-bench-scale-{os.getpid()}"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    was = open(STATS).read().strip()
    ops, ns = collections.defaultdict(list), collections.defaultdict(list)
    configs = [("none", 0)] + [(k, n) for n in NS for k in ("in", "out")]
    try:
        make_cgroups(base)
        open(STATS, "w").write("1")
        for r in range(ROUNDS):
            turn = configs[r % len(configs):] + configs[:r % len(configs)]
            for kind, n in turn if r % 2 == 0 else turn[::-1]:
                one(kind, n, base, ops, ns)
            print(f"round {r + 1}/{ROUNDS} done", file=sys.stderr)
    finally:
        open(STATS, "w").write(was)
        remove_cgroups(base)
    report(ops, ns)


main()
