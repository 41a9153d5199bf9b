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
NONE_RUNS = 5
BOUND = 1.03


def tw_progs():
    import json
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True,
                         text=True, check=True).stdout
    return {p["id"]: p for p in json.loads(out or "[]")
            if p.get("name", "").startswith("tw_")}


def pipe(cg):
    return pipe_in(cg, LOOPS)


class Holder:
    """One tw-probe-hold --serve for the whole run: the probes are loaded
    once, as the agent loads them, and each configuration only changes the
    watch map (the difference added or removed, as containers come and go),
    so every configuration runs the same programs at the same addresses and
    N is the one thing that changes."""

    def __init__(self, base):
        before = set(tw_progs())
        self.args = [HOLD, "0", "--watch-under", f"{base}/w", "--serve"]
        self.p = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.p.stdout.readline().split()
        if not ready or ready[0] != "ready":
            self.p.kill()
            sys.exit(f"{' '.join(self.args)}: the holder failed: {ready}")
        self.mine = [i for i in tw_progs() if i not in before]

    def set(self, kind, n, base):
        self.p.stdin.write(f"{n} {base}/in\n" if kind == "in" else f"{n}\n")
        self.p.stdin.flush()
        got = self.p.stdout.readline().split()
        if got != ["watching", str(n)]:
            self.p.kill()
            sys.exit(f"{' '.join(self.args)}: asked for {kind} {n}, got {got}")

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def one(h, kind, n, base, runs):
    """One pipe run in configuration (kind, n): its measures, also kept in
    `runs`: "pipe" (usecs per op) and each per-op program's ns per run."""
    h.set(kind, n, base)
    start = tw_progs()
    got = {"pipe": pipe(f"{base}/{kind}")}
    end = tw_progs()
    for i in h.mine:
        a, b = start.get(i, {}), end.get(i, {})
        cnt = b.get("run_cnt", 0) - a.get("run_cnt", 0)
        if cnt >= LOOPS:  # the per-op programs: switch and wake-up
            got[b["name"]] = (b.get("run_time_ns", 0) - a.get("run_time_ns", 0)) / cnt
    runs[(kind, n)].append(got)
    return got


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


def report(runs, pair, none):
    med = lambda v: statistics.median(v) if v else float("nan")
    iqr = lambda v: (statistics.quantiles(v, n=4)[2] - statistics.quantiles(v, n=4)[0]) / med(v) if len(v) > 1 else 0.0
    names = sorted(set.intersection(*(set(g) for k in runs for g in runs[k])) - {"pipe"})

    def col(kind, n, m):
        return [g[m] for g in runs[(kind, n)] if m in g]

    def paired(kind, n, m):
        """Median over the pairs of the N run against its neighbouring
        1-watched run; for N = 1 itself, 1."""
        if n == 1:
            return 1.0
        r = [g[n][m] / g[1][m] for g in pair[(kind, n)] if m in g[n] and m in g[1] and g[1][m]]
        return med(r)

    base = med(none)
    print(f"per switch (perf bench sched pipe, usecs/op / 2); no probe {base / 2:.3f} us (before the load, for scale)")
    print("(x/x1: ratio of the medians; paired: median over the pairs of the ratio to the neighbouring 1-watched run)")
    print("(IQR: interquartile range of the runs over their median, the run's own noise)")
    print(f"{'N':>5} {'in us':>8} {'in/in1':>7} {'paired':>7} {'out us':>8} {'out/out1':>8} {'paired':>7} {'in/none':>8} {'out/none':>8} {'IQR in':>7} {'IQR out':>7}")
    ratios = collections.defaultdict(list)
    for n in NS:
        i, o = med(col("in", n, "pipe")), med(col("out", n, "pipe"))
        ri, ro = i / med(col("in", 1, "pipe")), o / med(col("out", 1, "pipe"))
        pi, po = paired("in", n, "pipe"), paired("out", n, "pipe")
        ratios["pipe in"].append(pi)
        ratios["pipe out"].append(po)
        qi, qo = iqr(col("in", n, "pipe")), iqr(col("out", n, "pipe"))
        print(f"{n:>5} {i / 2:8.3f} {ri:7.3f} {pi:7.3f} {o / 2:8.3f} {ro:8.3f} {po:7.3f} {i / base:8.3f} {o / base:8.3f} {qi:7.3f} {qo:7.3f}")
    print("\nbpf_stats: ns per run (run_time_ns / run_cnt over the pipe run), median; paired ratio to N=1")
    print(f"{'N':>5} " + " ".join(f"{k + ' ' + p:>22}" for k in ("in", "out") for p in names))
    for n in NS:
        cells = []
        for k in ("in", "out"):
            for p in names:
                r = paired(k, n, p)
                ratios[f"{k} {p}"].append(r)
                cells.append(f"{med(col(k, n, p)):7.1f} ns x{r:6.3f}")
        print(f"{n:>5} " + " ".join(f"{c:>22}" for c in cells))
    print(f"\nspread (max/min of the paired ratios over N = {', '.join(map(str, NS))}; bound {BOUND}):")
    for k, v in ratios.items():
        s = max(v) / min(v)
        print(f"  {k:<28} {s:6.3f} {'within' if s <= BOUND else 'OVER'}")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"({ROUNDS} rounds of {len(pair)} pairs, perf bench sched pipe -l {LOOPS} on CPU 0; load {load})")


def main():
    if not os.access(HOLD, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-p", "throttlewatch-integration",
                        "--bin", "tw-probe-hold", "--quiet"], cwd=ROOT, check=True)
    base = f"{cpu_root()}/tw-bench-scale-{os.getpid()}"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    was = open(STATS).read().strip()
    runs, pair, none = collections.defaultdict(list), collections.defaultdict(list), []
    h = None
    try:
        make_cgroups(base)
        open(STATS, "w").write("1")
        # No probe, for scale only: a few runs before the load (the
        # interleaved rounds all run with the probes loaded).
        for _ in range(NONE_RUNS):
            none.append(pipe(f"{base}/out"))
        h = Holder(base)
        for r in range(ROUNDS):
            # Each N > 1 run next to a 1-watched run of its kind (the pair
            # a fraction of a second apart, the reference first or second
            # in turn), the pairs' order rotated round by round.
            pairs = [(k, n) for k in ("in", "out") for n in NS[1:]]
            pairs = pairs[r % len(pairs):] + pairs[:r % len(pairs)]
            for j, (kind, n) in enumerate(pairs):
                order = [(kind, 1), (kind, n)] if (r + j) % 2 == 0 else [(kind, n), (kind, 1)]
                got = {}
                for k, m in order:
                    got[m] = one(h, k, m, base, runs)
                pair[(kind, n)].append(got)
            if (r + 1) % 10 == 0 or r + 1 == ROUNDS:
                print(f"round {r + 1}/{ROUNDS} done", file=sys.stderr)
    finally:
        if h:
            h.close()
        open(STATS, "w").write(was)
        remove_cgroups(base)
    report(runs, pair, none)


main()
