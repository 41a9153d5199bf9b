"""bench/start-scale.py's figures: the pace each run kept, the added
create and start latency (tw - runc) p50 and p99 per bucket of the number
watched at arrival, whether it grows (last bucket / first, and a slope of
the paired differences per 100 watched), and the agent's register phases
against the number watched (TW_BENCH_TIMING=1). python3 stdlib only."""
import math, statistics

BUCKETS = 4


def q(xs, p):
    """Nearest-rank quantile P of XS (p99 of 50 samples is their maximum)."""
    s = sorted(xs)
    return s[max(0, math.ceil(p * len(s)) - 1)] if s else float("nan")


def ms(us):
    return f"{us / 1000:.2f}"


def signed(us):
    return f"{us / 1000:+.2f}"


def ols(xs, ys):
    """Least-squares slope of YS on XS and its standard error."""
    n = len(xs)
    if n < 3:
        return float("nan"), float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return float("nan"), float("nan")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    ssr = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return b, math.sqrt(ssr / (n - 2) / sxx)


def theil_sen(xs, ys):
    """The median of the slopes between every two points (robust to the tails)."""
    pts = sorted(zip(xs, ys))
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts)
              for x2, y2 in pts[i + 1:] if x2 != x1]
    return statistics.median(slopes) if slopes else float("nan")


def pace(samples, f):
    """One run's pace: what was offered, what arrived, what was done, the queue."""
    ok = [s for s in samples if s.done]
    n = len(samples)
    span = max(s.at for s in samples) - min(s.at for s in samples)
    done = (max(s.done for s in ok) - f["t0_ns"]) / 1e9 if ok else float("nan")
    lag = max(s.at - s.due for s in samples)
    quarter = max(1, n // 4)
    first = statistics.mean(s.inflight for s in samples[:quarter])
    last = statistics.mean(s.inflight for s in samples[-quarter:])
    arrived = (n - 1) / span if span > 0 else float("inf")
    finished = len(ok) / done if done > 0 else float("nan")
    kept = finished >= 0.9 * min(arrived, f["qps"]) and last <= 2 * first + 4
    tw = sum(1 for s in ok if s.kind == "tw")
    print(f"- pace: offered {f['qps']:g}/s (bucket of {f['burst']}); {n} arrivals in {span:.2f} s "
          f"({arrived:.1f}/s, at most {lag * 1000:.1f} ms behind schedule); all done {done:.2f} s after "
          f"the first ({finished:.1f}/s); in flight at arrival: {first:.1f} (first quarter) -> {last:.1f} "
          f"(last quarter), max {max(s.inflight for s in samples)} -> "
          + ("**sustained**" if kept else f"**not sustained: the starts queue** (it finished {finished:.1f}/s: "
                                          f"give --qps {max(1, math.floor(finished * 0.8))} too)"))
    print(f"- agent: {f['agent_cpu_s']:.2f} s of CPU over the run ({f['agent_cpu_s'] * 1e3 / max(1, tw):.1f} ms "
          f"per tw container); watched at the end {f['watched_end']}; load average {f['load'][0]:.2f} -> "
          f"{f['load'][1]:.2f}")
    return kept


def bucket_of(watched, count):
    return min(BUCKETS - 1, watched * BUCKETS // count)


def table(ok, count):
    """Per bucket of the number watched at arrival: runc's p50/p99 and tw - runc."""
    width = math.ceil(count / BUCKETS)
    print("\n| watched at arrival | n tw / runc | runc create p50 / p99 | added create p50 | added create p99 "
          "| runc start p50 / p99 | added start p50 | added start p99 |")
    print("|---|---|---|---|---|---|---|---|")
    # p99: nearest rank, so of 50 samples the largest, of 100 the second largest.
    added = {}
    for b in range(BUCKETS):
        by = {k: [s for s in ok if s.kind == k and bucket_of(s.watched, count) == b] for k in ("tw", "runc")}
        if not by["tw"] or not by["runc"]:
            continue
        row = [f"{b * width}–{(b + 1) * width - 1}", f"{len(by['tw'])} / {len(by['runc'])}"]
        for phase in ("create_us", "start_us"):
            t = [getattr(s, phase) for s in by["tw"]]
            r = [getattr(s, phase) for s in by["runc"]]
            a50, a99 = q(t, .5) - q(r, .5), q(t, .99) - q(r, .99)
            added[phase, b] = (a50, a99)
            row += [f"{ms(q(r, .5))} / {ms(q(r, .99))} ms", f"{signed(a50)} ms", f"{signed(a99)} ms"]
        print("| " + " | ".join(row) + " |")
    return added


def pairs(runs):
    """(watched at the pair's first arrival, tw - runc create µs, start µs) of every pair."""
    out = []
    for samples, _ in runs:
        by = {(s.kind, s.i): s for s in samples if s.done}
        for (kind, i), t in by.items():
            r = by.get(("runc", i))
            if kind == "tw" and r:
                out.append((min(t.watched, r.watched), t.create_us - r.create_us, t.start_us - r.start_us))
    return out


def growth(runs, added, count):
    """Whether the added latency grows with the number watched."""
    pp = pairs(runs)
    xs = [p[0] for p in pp]
    verdicts = []
    last = max((b for _, b in added), default=0)
    print()
    for j, phase in ((1, "create"), (2, "start")):
        first50, first99 = added.get((f"{phase}_us", 0), (float("nan"),) * 2)
        last50, last99 = added.get((f"{phase}_us", last), (float("nan"),) * 2)
        ys = [p[j] for p in pp]
        b, se = ols(xs, ys)
        ts = theil_sen(xs, ys)
        per100 = lambda v: v * 100 / 1000  # µs per watched -> ms per 100 watched
        grows = b - 1.96 * se > 0 and ts > 0
        bound = f"; at most {per100(b + 1.96 * se):+.3f} ms per 100 at 95 %" if not grows else ""
        verdicts.append(grows)
        print(f"- added {phase}: p50 {signed(first50)} -> {signed(last50)} ms, p99 {signed(first99)} -> "
              f"{signed(last99)} ms (first bucket -> last); paired {phase} difference against the number "
              f"watched ({len(pp)} pairs): least squares {per100(b):+.3f} ± {per100(se):.3f} ms per 100 "
              f"watched (± 1 SE), Theil–Sen {per100(ts):+.3f} -> "
              + ("**grows**" if grows else f"**does not grow** (the slope's 95 % interval holds 0 or the robust slope is ≤ 0{bound})"))
    return any(verdicts)


def timing_rows(lines, what):
    """The THROTTLEWATCH_TIMING lines of WHAT as {phase: µs}, the warm-up's (the first) left out."""
    rows = [dict(kv.split("=") for kv in ln.split()[2:]) for ln in lines if ln.startswith(what + " ")]
    return [{k: int(v[:-2]) for k, v in r.items()} for r in rows[1:]]


def phases(lines, count):
    """The agent's register phases (THROTTLEWATCH_TIMING: `register` until
    its answer, `complete` the log, control and state after it) and the
    wrapper's helper's (`created`: after runc's create): medians per
    bucket of the number of registers before it (= watched: none ends during
    a run), and the robust slope of each."""
    width = math.ceil(count / BUCKETS)
    for what in ("throttlewatch-agent register", "throttlewatch-agent complete", "throttlewatch-runtime created"):
        rows = timing_rows(lines, what)
        if not rows:
            continue
        head = [f"{b * width}–{(b + 1) * width - 1}" for b in range(BUCKETS) if rows[b * width:(b + 1) * width]]
        print(f"\n| `{what}` phase, µs (median) | " + " | ".join(head) + " | Theil–Sen µs per 100 watched |")
        print("|---" * (len(head) + 2) + "|")
        for k in rows[0]:
            cells = [f"{statistics.median(r.get(k, 0) for r in rows[b * width:(b + 1) * width]):.0f}"
                     for b in range(len(head))]
            ts = theil_sen(list(range(len(rows))), [r.get(k, 0) for r in rows])
            print(f"| {k} | " + " | ".join(cells) + f" | {ts * 100:+.1f} |")


def report(runs, count):
    """Print one pace's figures (its runs pooled); returns the failures."""
    samples = [s for r in runs for s in r[0]]
    bad = [s for s in samples if s.error or not s.done]
    print(f"\n### {runs[0][1]['qps']:g} arrivals/s, {count} + {count} containers, {len(runs)} run(s) pooled")
    for smp, f in runs:
        pace(smp, f)
    if bad:
        print(f"- **{len(bad)} containers failed**; first: " + "; ".join((s.error or "stopped") for s in bad[:3]))
    ok = [s for s in samples if s.done]
    added = table(ok, count)
    growth(runs, added, count)
    for _, f in runs:
        phases(f["timing"], count)
    return len(bad)


class _Row:
    """A container read back from a --samples CSV."""

    def __init__(self, f):
        self.kind, self.i, self.watched = f["kind"], int(f["index"]), int(f["watched"])
        ok = f["create_us"] and f["start_us"] and not f["error"]
        self.create_us = int(f["create_us"]) if ok else None
        self.start_us = int(f["start_us"]) if ok else None
        self.done = 1 if ok else None


def pooled(paths):
    """The table and the growth of the runs in PATHS (bench/start-scale.py
    --samples CSVs) pooled: `python3 bench/start_stats.py DIR/*.csv`."""
    import csv
    runs = [([_Row(f) for f in csv.DictReader(open(p))], {}) for p in paths]
    count = max(s.i for smp, _ in runs for s in smp) + 1
    print(f"{len(paths)} runs pooled, {count} + {count} containers each: {' '.join(paths)}")
    ok = [s for smp, _ in runs for s in smp if s.done]
    growth(runs, table(ok, count), count)


if __name__ == "__main__":
    import sys
    if len(sys.argv) < 2:
        sys.exit("usage: python3 bench/start_stats.py CSV... (bench/start-scale.py --samples DIR/*.csv)")
    pooled(sys.argv[1:])
