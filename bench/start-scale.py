#!/usr/bin/env python3
"""Container start at scale (issue 48, "Start at scale"): COUNT containers
through throttlewatch-runtime with a running agent (`tw`: watched, left
running, so the number watched grows 0 -> COUNT) and COUNT through plain
runc (`runc`: also left running, so both kinds start on a machine as
loaded), their arrivals alternating (pair k: tw then runc, or runc then tw
every other pair), open-loop at kubelet's pace, each handled in its own
thread as kubelet's pod workers run in parallel. `create` and `start` are
timed apart, per container; the added latency (tw - runc) p50 and p99 is
reported per bucket of the number already watched at its arrival, with
whether it grows.

    bench/start-scale.py [--count N] [--qps Q[,Q...]] [--burst B] [--repeat R]
                         [--samples DIR]                       (run as root)

The pace: kubelet's defaults are --kube-api-qps 50 and --kube-api-burst 100
(kubernetes/kubernetes pkg/kubelet/apis/config/v1beta1/defaults.go,
SetDefaults_KubeletConfiguration: KubeAPIQPS 50, KubeAPIBurst 100), applied
by client-go's token bucket (flowcontrol.NewTokenBucketRateLimiter). The
arrivals here come from such a bucket: QPS tokens a second (default 50, for
both kinds together: the node sees 50 starts a second), BURST of them at
most at once (default 1: a steady pace, so that every bucket of the watched
count sees the same load; --burst 100 is kubelet's bucket, full at the
start: the first 100 arrive at once). Each Q of --qps is a run of its own
(a fresh agent and fresh containers); --repeat R runs each pace R times and
pools the samples. When the machine cannot keep a pace (the starts queue),
the pace line says so: give a slower Q as well (e.g. --qps 50,20).

Each container has its own bundle on tmpfs (as containerd's) over one shared
read-only busybox rootfs, a 50 ms / 100 ms CPU quota and a 10 ms burst
annotation (QoS work for the wrapper), `sleep`s, and its own cgroup under
/tw-bench-scale-PID. runc's state (--root) is on tmpfs, one per kind.

Binaries: the wrapper, the hook and the agent from $TW_BIN_DIR when set,
else built: scripts/build-front-ends.sh (hook and wrapper static, as
packaging/ ships them) and `cargo build --release -p throttlewatch`.
TW_BENCH_TIMING=1: the agent times its registers and the wrapper's helper
its work after runc's create (THROTTLEWATCH_TIMING: a line appended per
container, a few µs more for tw); their phases are reported against the
number watched. --samples DIR keeps
one CSV per run (every container's arrival, watched count, create and start
microseconds); `python3 bench/start_stats.py DIR/*.csv` pools runs from
several invocations into one table. Containers, cgroups, the agent and the scratch directories
are removed at the end, on an error, SIGINT and SIGTERM.
"""
import argparse, glob, json, os, shutil, signal, subprocess, sys, tempfile, threading, time
from concurrent.futures import ThreadPoolExecutor

sys.dont_write_bytecode = True
from tw_bench import HZ, Agent, ticks  # noqa: E402
import start_stats  # noqa: E402

KUBE_API_QPS, KUBE_API_BURST = 50, 100  # kubelet's defaults (see above)
CGROUP = "/sys/fs/cgroup"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bounded(kind, lo, hi, what):
    """An argparse type: a KIND (int or float) in [LO, HI], said as WHAT."""
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            v = None
        if v is None or not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {what} from {lo} to {hi}")
        return v
    return parse


def qps_list(text):
    one = bounded(float, 0.1, 1000, "arrivals per second")
    try:
        return [one(q) for q in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}, or a comma-separated list of them (e.g. 50,20)")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/start-scale.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=bounded(int, 8, 1000, "a number of containers per kind"),
                   default=200, help="containers of each kind per run (default 200)")
    p.add_argument("--qps", type=qps_list, default=[float(KUBE_API_QPS)],
                   help=f"arrivals per second, both kinds together; a list runs each (default {KUBE_API_QPS})")
    p.add_argument("--burst", type=bounded(int, 1, 2000, "a number of arrivals"), default=1,
                   help=f"the token bucket's size (default 1: steady; kubelet's is {KUBE_API_BURST})")
    p.add_argument("--repeat", type=bounded(int, 1, 20, "a number of runs"), default=1,
                   help="runs per pace, their samples pooled (default 1)")
    p.add_argument("--layout", choices=("pod", "flat"), default="pod",
                   help="pod: each container in a pod cgroup with its quota, as kubelet's (default); "
                        "flat: all of them side by side under one parent without a quota")
    p.add_argument("--samples", metavar="DIR", help="keep one CSV per run in DIR")
    return p.parse_args(argv)


def binaries():
    """(wrapper, agent, runc, the directory to remove afterwards or None)."""
    built = None
    d = os.environ.get("TW_BIN_DIR")
    if not d:
        built = d = tempfile.mkdtemp(prefix="tw-scale-bin.")
        subprocess.run([f"{REPO}/scripts/build-front-ends.sh", d], cwd=REPO, check=True)
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "throttlewatch", "--bins"],
                       cwd=REPO, check=True)
        os.symlink(f"{REPO}/target/release/throttlewatch", f"{d}/throttlewatch")
    d = os.path.abspath(d)
    runc = shutil.which("runc") or "/usr/sbin/runc"
    for b in (f"{d}/throttlewatch-runtime", f"{d}/throttlewatch-hook", f"{d}/throttlewatch", runc,
              "/bin/busybox"):
        if not os.access(b, os.X_OK):
            sys.exit(f"missing {b} (TW_BIN_DIR={d}: expected throttlewatch-runtime, throttlewatch-hook "
                     "and throttlewatch there; apt-get install runc busybox-static)")
    return f"{d}/throttlewatch-runtime", f"{d}/throttlewatch", runc, built


class Node:
    """One run's containers: scratch directories (logs and the rootfs on
    disk, bundles, runc roots, socket and state on tmpfs), the agent, the
    cgroup parent; `close` removes all of it, whatever was made."""

    def __init__(self, runc, tag, layout):
        self.runc, self.layout = runc, layout
        self.parent = f"tw-bench-scale-{tag}"
        self.disk = tempfile.mkdtemp(prefix=f"tw-scale-{tag}.")
        self.run = tempfile.mkdtemp(prefix=f"tw-scale-run-{tag}.", dir="/dev/shm")
        self.roots = {k: f"{self.run}/root-{k}" for k in ("tw", "runc")}
        self.agent = None
        try:
            self.spec = self.template(runc)
        except BaseException:
            self.close()
            raise

    def template(self, runc):
        """The shared rootfs and the spec every bundle starts from."""
        self.rootfs = f"{self.disk}/rootfs"
        for d in ("bin", "proc", "dev", "sys"):
            os.makedirs(f"{self.rootfs}/{d}")
        shutil.copy("/bin/busybox", f"{self.rootfs}/bin/busybox")
        for applet in ("sh", "sleep"):
            os.symlink("busybox", f"{self.rootfs}/bin/{applet}")
        subprocess.run([runc, "spec", "--bundle", self.disk], check=True)
        spec = json.load(open(f"{self.disk}/config.json"))
        spec["root"] = {"path": self.rootfs, "readonly": True}
        spec["process"]["terminal"] = False
        spec["process"]["args"] = ["sleep", "100000"]
        spec["annotations"] = {"throttlewatch.io/cpu-burst": "10ms"}
        spec["linux"]["resources"]["cpu"] = {"quota": 50000, "period": 100000}
        return spec

    def pod(self, cid):
        """CID's pod cgroup, as kubelet makes it for a pod whose containers
        all have CPU limits: their sum (here the one container's 50 ms /
        100 ms) as its own quota (pkg/kubelet/cm/helpers_linux.go,
        ResourceConfigForPod); the wrapper shares the container's burst
        with it (lifecycle/src/pod_burst.rs). Returns its path."""
        rel = f"{self.parent}/pod-{cid}"
        if os.path.exists(f"{CGROUP}/cpu/cpu.cfs_quota_us"):  # v1 (this machine's hybrid layout)
            os.makedirs(f"{CGROUP}/cpu/{rel}")
            open(f"{CGROUP}/cpu/{rel}/cpu.cfs_quota_us", "w").write("50000")
        else:  # v2 (not run here: this machine has no v2 cpu controller)
            for d in (CGROUP, f"{CGROUP}/{self.parent}"):
                os.makedirs(d, exist_ok=True)
                open(f"{d}/cgroup.subtree_control", "w").write("+cpu")
            os.makedirs(f"{CGROUP}/{rel}")
            open(f"{CGROUP}/{rel}/cpu.max", "w").write("50000 100000")
        return f"/{rel}"

    def bundle(self, cid):
        """A fresh bundle for container CID (written before it is timed),
        in a pod cgroup of its own (`--layout pod`) or beside the others."""
        b = f"{self.run}/b/{cid}"
        os.makedirs(b)
        above = self.pod(cid) if self.layout == "pod" else f"/{self.parent}"
        self.spec["linux"]["cgroupsPath"] = f"{above}/{cid}"
        json.dump(self.spec, open(f"{b}/config.json", "w"))
        return b

    def timing_env(self):
        on = os.environ.get("TW_BENCH_TIMING") == "1"
        return {"THROTTLEWATCH_TIMING": f"{self.disk}/timing"} if on else {}

    def start_agent(self, path):
        self.agent = Agent("agent", path, self.disk, run_dir=self.run, env=self.timing_env())
        return self.agent

    def timing(self):
        try:
            return open(f"{self.disk}/timing").read().splitlines()
        except OSError:
            return []

    def close(self):
        if self.agent:
            self.agent.stop()
        with ThreadPoolExecutor(4) as pool:
            for root in self.roots.values():
                ids = subprocess.run([self.runc, "--root", root, "list", "-q"], capture_output=True,
                                     text=True).stdout.split()
                for cid in ids:
                    pool.submit(subprocess.run, [self.runc, "--root", root, "delete", "-f", cid],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # runc removes each container's cgroup; what a killed create left, then ours.
        tops = (f"{CGROUP}/*/{self.parent}", f"{CGROUP}/{self.parent}")  # v1 hierarchies, v2
        for d in [d for k in (2, 1, 0) for top in tops for d in glob.glob(top + "/*" * k + "/")]:
            try:
                os.rmdir(d)
            except OSError:
                pass
        left = glob.glob(f"{CGROUP}/*/{self.parent}") + glob.glob(f"{CGROUP}/{self.parent}")
        if left:
            print(f"warning: cgroups left behind: {' '.join(left)}", file=sys.stderr)
        shutil.rmtree(self.disk, ignore_errors=True)
        shutil.rmtree(self.run, ignore_errors=True)


class Sample:
    """One container: its kind, arrival (due and actual, s from the first),
    the number watched and in flight at its arrival, create and start µs."""
    __slots__ = ("kind", "i", "due", "at", "watched", "inflight", "create_us", "start_us", "done", "error")

    def __init__(self, kind, i, due):
        self.kind, self.i, self.due = kind, i, due
        self.at = self.watched = self.inflight = self.create_us = self.start_us = self.done = None
        self.error = None


class Arrivals:
    """One run: 2 x COUNT arrivals from a token bucket (QPS, BURST), each
    handled by a thread of its own: create, then start."""

    def __init__(self, node, wrapper, agent, count, qps, burst):
        self.node, self.count, self.qps, self.burst = node, count, qps, burst
        self.cmd = {"tw": [wrapper, "--throttlewatch-config", agent.cfg, "--root", node.roots["tw"]],
                    "runc": [node.runc, "--root", node.roots["runc"]]}
        # TW_BENCH_TIMING=1: the wrapper and its helper time their phases too.
        self.env = {"tw": dict(os.environ, **node.timing_env()), "runc": None}
        self.lock = threading.Lock()
        self.watched = self.inflight = 0
        self.stop = threading.Event()
        self.samples, self.threads = [], []

    def schedule(self):
        """(kind, index, due offset in s): alternating, the pair's order flipped every other pair."""
        out = []
        for k in range(self.count):
            pair = ("tw", "runc") if k % 2 == 0 else ("runc", "tw")
            for kind in pair:
                j = len(out)
                out.append((kind, k, max(0.0, (j - self.burst + 1) / self.qps)))
        return out

    def runtime(self, kind, args, cid):
        err = f"{self.node.run}/b/{cid}/err-{args[0]}"
        with open(err, "w") as f:  # a file, not a pipe: the container inherits it
            # Its own session: a Ctrl-C reaches this script, which lets the
            # runtimes finish and then removes what they made, not them.
            rc = subprocess.run(self.cmd[kind] + args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=f, timeout=120, start_new_session=True,
                                env=self.env[kind]).returncode
        if rc != 0:
            raise RuntimeError(f"{kind} {args[0]} {cid}: exit {rc}: {open(err).read().strip()[:300]}")

    def worker(self, s, bundle):
        cid = f"{s.kind}-{s.i}"
        try:
            t0 = time.monotonic_ns()
            self.runtime(s.kind, ["create", "--bundle", bundle, "--pid-file", f"{bundle}/init.pid", cid], cid)
            t1 = time.monotonic_ns()
            if self.stop.is_set():
                return
            self.runtime(s.kind, ["start", cid], cid)
            t2 = time.monotonic_ns()
            s.create_us, s.start_us, s.done = (t1 - t0) // 1000, (t2 - t1) // 1000, t2
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            s.error = str(e)
        finally:
            with self.lock:
                self.inflight -= 1
                if s.kind == "tw" and s.error is None and s.done:
                    self.watched += 1

    def go(self):
        plan = self.schedule()
        bundles = [self.node.bundle(f"{kind}-{i}") for kind, i, _ in plan]
        t0 = time.monotonic() + 0.2
        self.t0_ns = int(t0 * 1e9)
        for (kind, i, off), bundle in zip(plan, bundles):
            if self.stop.is_set():
                break
            while (d := t0 + off - time.monotonic()) > 0:
                time.sleep(d)
            s = Sample(kind, i, off)
            s.at = time.monotonic() - t0
            with self.lock:
                s.watched, s.inflight = self.watched, self.inflight
                self.inflight += 1
            self.samples.append(s)
            t = threading.Thread(target=self.worker, args=(s, bundle))
            t.start()
            self.threads.append(t)
        self.join()

    def join(self):
        for t in self.threads:
            t.join()


def warm_up(node, arr):
    """One container of each kind created, started and deleted (page cache,
    the agent's first register); waits until the agent watches none."""
    for kind in ("tw", "runc"):
        cid = f"warm-{kind}"
        b = node.bundle(cid)
        arr.runtime(kind, ["create", "--bundle", b, "--pid-file", f"{b}/init.pid", cid], cid)
        arr.runtime(kind, ["start", cid], cid)
        arr.runtime(kind, ["delete", "-f", cid], cid)
    t = time.monotonic()
    while node.agent.watched() and time.monotonic() - t < 5:
        time.sleep(0.05)
    time.sleep(1)


def one_run(bins, args, qps, rep):
    """A fresh node at pace QPS; returns (samples, facts about the run)."""
    wrapper, agent_bin, runc, _ = bins
    node = arr = None
    try:
        node = Node(runc, f"{os.getpid()}-{rep}", args.layout)
        agent = node.start_agent(agent_bin)
        arr = Arrivals(node, wrapper, agent, args.count, qps, args.burst)
        warm_up(node, arr)
        cpu0, load0 = ticks(agent.p.pid), os.getloadavg()[0]
        arr.go()
        cpu = (ticks(agent.p.pid) - cpu0) / HZ
        facts = {"qps": qps, "burst": args.burst, "t0_ns": arr.t0_ns, "agent_cpu_s": cpu,
                 "load": (load0, os.getloadavg()[0]), "watched_end": len(agent.watched()),
                 "timing": node.timing()}
        return arr.samples, facts
    finally:
        if arr:
            arr.stop.set()
            arr.join()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the clean-up is not cut short
        if node:
            node.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def keep_samples(d, samples, qps, rep):
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/qps{qps:g}-run{rep}.csv", "w") as f:
        f.write("kind,index,due_s,arrival_s,watched,in_flight,create_us,start_us,error\n")
        for s in samples:
            f.write(f"{s.kind},{s.i},{s.due:.4f},{s.at:.4f},{s.watched},{s.inflight},"
                    f"{s.create_us or ''},{s.start_us or ''},{(s.error or '').replace(',', ';')[:200]}\n")


def main():
    args = parse_args(sys.argv[1:])
    if os.geteuid() != 0:
        sys.exit("bench/start-scale.py: run as root (runc, cgroups, the agent's probes)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bins = binaries()
    failed = 0
    try:
        head = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %cI"], capture_output=True,
                              text=True).stdout.strip()
        print(f"bench/start-scale.py --count {args.count} --qps {','.join(f'{q:g}' for q in args.qps)} "
              f"--burst {args.burst} --repeat {args.repeat} --layout {args.layout}; commit {head}; {os.cpu_count()} CPUs; "
              f"binaries {os.path.dirname(bins[0])}; runc {bins[2]}")
        for qps in args.qps:
            runs = []
            for rep in range(args.repeat):
                samples, facts = one_run(bins, args, qps, rep)
                if args.samples:
                    keep_samples(args.samples, samples, qps, rep)
                runs.append((samples, facts))
            failed += start_stats.report(runs, args.count)
    except KeyboardInterrupt:
        sys.exit("bench/start-scale.py: interrupted; containers, cgroups and the agent removed")
    finally:
        if bins[3]:
            shutil.rmtree(bins[3], ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
