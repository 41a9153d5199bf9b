"""What bench/probe-cost-coldstart.py and bench/probe-cost-wakeups.py share:
the cpu controller's root, and the loaded BPF programs of a name with their
kernel statistics (bpftool; kernel.bpf_stats_enabled must be on)."""
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
