"""What bench/probe-cost-coldstart.py, bench/probe-cost-wakeups.py and
bench/probe-scale.py share: the cpu controller's root, the loaded BPF
programs of a name with their kernel statistics (bpftool;
kernel.bpf_stats_enabled must be on), and one pinned pipe benchmark run in a
cpu cgroup."""
import json
import subprocess

STATS = "/proc/sys/kernel/bpf_stats_enabled"


def cpu_root():
    v2 = None
    for line in open("/proc/mounts"):
        _, path, fstype, opts = line.split()[:4]
        if fstype == "cgroup" and "cpu" in opts.split(","):
            return path
        if fstype == "cgroup2":
            v2 = path
    return v2


def progs(name):
    out = subprocess.run(["bpftool", "prog", "show", "name", name, "-j"],
                         capture_output=True, text=True).stdout
    if not out.strip():
        return []
    d = json.loads(out)
    return [p for p in (d if isinstance(d, list) else [d]) if "id" in p]


def pipe(cg, loops):
    """usecs per op of `perf bench sched pipe -l LOOPS` on CPU 0 in cgroup `cg`."""
    out = subprocess.run(["sh", "-c", f"echo $$ > {cg}/cgroup.procs; "
                          f"exec taskset -c 0 perf bench sched pipe -l {loops}"],
                         capture_output=True, check=True, text=True).stdout
    return next(float(l.split()[0]) for l in out.splitlines() if "usecs/op" in l)
