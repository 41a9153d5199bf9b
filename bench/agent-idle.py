#!/usr/bin/env python3
"""The agent's idle cost (issue 48): CPU and RSS of real agents watching N
idle containers, A/B in one run.

    bench/agent-idle.py [N ...]                 (default: 200 1000; run as root)

Each N: N cgroups (cpu: a 50 ms / 100 ms quota, as a pod with a CPU limit;
memory: one of their own), each with one sleeping process, registered over
each agent's socket as the hook registers a container (one agent per
binary, all watching the same containers at the same time, each with its own
socket, state, logs and metrics port, scraped every 10 s as Prometheus
would). After a settle of SETTLE s (default 15: the first snapshot and a
scrape pass), each agent's utime + stime over SECONDS s (default 60, from
/proc/PID/stat) and its RSS at the end (VmRSS).

Binaries: AGENTS="name=path ..." (default: new=target/release/throttlewatch;
build it with `cargo build --release -p throttlewatch`). A/B:
AGENTS="before=/tmp/tw-before/throttlewatch after=target/release/throttlewatch".
STRACE=1 also counts each agent's syscalls over 10 s (`strace -c -f`) after
the measurement; it prints the table to stderr.
"""
import os, shutil, signal, subprocess, sys, tempfile, time, urllib.request

sys.dont_write_bytecode = True
from tw_bench import HZ, Agent as BaseAgent, call, rss_kib, ticks  # noqa: E402

ROOT = "/sys/fs/cgroup"
SECONDS = float(os.environ.get("SECONDS_", os.environ.get("SECONDS", "60")))
SETTLE = float(os.environ.get("SETTLE", "15"))


def agents():
    spec = os.environ.get("AGENTS", "new=target/release/throttlewatch")
    out = []
    for item in spec.split():
        name, _, path = item.partition("=")
        if not path or not os.access(path, os.X_OK):
            sys.exit(f"AGENTS: {item!r}: expected NAME=PATH of an executable")
        out.append((name, os.path.abspath(path)))
    return out


class Containers:
    """N cgroups with a sleeper each, under a parent of our own."""

    def __init__(self, n, tag):
        self.parent = f"tw-bench-idle-{tag}"
        self.n = n
        self.procs = []
        for c in ("cpu", "memory"):
            os.makedirs(f"{ROOT}/{c}/{self.parent}", exist_ok=True)
        for i in range(n):
            rel = f"{self.parent}/c{i}"
            for c in ("cpu", "memory"):
                os.makedirs(f"{ROOT}/{c}/{rel}", exist_ok=True)
            open(f"{ROOT}/cpu/{rel}/cpu.cfs_quota_us", "w").write("50000")
            p = subprocess.Popen(["sleep", "100000"])
            for c in ("cpu", "memory"):
                open(f"{ROOT}/{c}/{rel}/cgroup.procs", "w").write(str(p.pid))
            self.procs.append((rel, p))

    def close(self):
        for _, p in self.procs:
            p.kill()
            p.wait()
        for c in ("cpu", "memory"):
            for rel, _ in self.procs:
                for _ in range(50):
                    try:
                        os.rmdir(f"{ROOT}/{c}/{rel}")
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)
            try:
                os.rmdir(f"{ROOT}/{c}/{self.parent}")
            except OSError:
                pass


class Agent(BaseAgent):
    """A private agent (tw_bench.Agent) that registers the cgroups itself."""

    def register(self, cs):
        for i, (rel, p) in enumerate(cs.procs):
            r = call(self.sock, {
                "op": "register", "container_id": f"idle{i}", "container_name": "",
                "pid": p.pid, "cgroup_path": "/" + rel, "annotations": {},
                "bundle": "", "created_ns": None, "threshold_ns": None, "qos": None})
            if not r.get("ok"):
                sys.exit(f"{self.name}: register idle{i}: {r}")

    def scrape(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
                return len(r.read())
        except OSError:
            return 0


def strace(agent, seconds=10):
    out = os.path.join(agent.dir, "strace.txt")
    s = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(agent.p.pid)],
                         stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    s.send_signal(signal.SIGINT)
    s.wait()
    print(f"--- {agent.name}: syscalls over {seconds} s ---", file=sys.stderr)
    print(open(out).read(), file=sys.stderr)


def run(n, bins):
    tag = f"{os.getpid()}-{n}"
    scratch = tempfile.mkdtemp(prefix=f"tw-bench-idle-{tag}-")
    cs = Containers(n, tag)
    ags = []
    try:
        for k, (name, path) in enumerate(bins):
            ags.append(Agent(name, path, scratch, 19570 + k))
        for a in ags:
            a.register(cs)
        end = time.time() + SETTLE
        while time.time() < end:
            for a in ags:
                a.scrape()
            time.sleep(min(10, max(0, end - time.time())))
        t0 = {a.name: ticks(a.p.pid) for a in ags}
        w0 = time.time()
        scrape_bytes = {}
        while time.time() - w0 < SECONDS:
            for a in ags:
                scrape_bytes[a.name] = a.scrape()
            time.sleep(min(10, max(0, SECONDS - (time.time() - w0))))
        wall = time.time() - w0
        rows = []
        for a in ags:
            cpu = (ticks(a.p.pid) - t0[a.name]) / HZ
            rows.append((a.name, n, cpu / wall * 100, cpu / wall / n * 1e6, rss_kib(a.p.pid) / 1024,
                         scrape_bytes.get(a.name, 0)))
        if os.environ.get("STRACE") == "1":
            for a in ags:
                strace(a)
        return rows
    finally:
        for a in ags:
            a.stop()
        cs.close()
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    if os.geteuid() != 0:
        sys.exit("run as root")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    bins = agents()
    ns = [int(a) for a in sys.argv[1:]] or [200, 1000]
    print(f"load before: {open('/proc/loadavg').read().split()[:3]}; {SECONDS:.0f} s each")
    print(f"{'agent':<10} {'watched':>7} {'% core':>7} {'us/ctr/s':>9} {'RSS MiB':>8} {'scrape B':>9}")
    for n in ns:
        for r in run(n, bins):
            print(f"{r[0]:<10} {r[1]:>7} {r[2]:>7.2f} {r[3]:>9.1f} {r[4]:>8.1f} {r[5]:>9}")
            sys.stdout.flush()
    print(f"load after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
