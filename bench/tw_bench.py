"""What the Python benchmarks share: a private agent (its own socket, state,
logs and metrics port), its socket protocol, and its CPU and RSS read off
/proc. Imported by bench/agent-idle.py and bench/start-scale.py (python3
stdlib only)."""
import json, os, signal, socket, subprocess, sys, time

HZ = os.sysconf("SC_CLK_TCK")


def ticks(pid):
    """utime + stime of PID, in clock ticks (HZ per second)."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def call(sock, req, timeout=10):
    """One request on the agent's socket (a JSON line), its answer."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock)
    s.sendall(json.dumps(req).encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        b = s.recv(65536)
        if not b:
            break
        buf += b
    s.close()
    return json.loads(buf or b"{}")


class Agent:
    """`PATH agent` with a private configuration in SCRATCH/NAME (logs
    there; socket and state in RUN_DIR, default SCRATCH/NAME/run), metrics
    on 127.0.0.1:PORT or none; ENV added to its environment. Waits until it
    answers `status`; `stop` ends it with SIGTERM."""

    def __init__(self, name, path, scratch, port=None, run_dir=None, env=None):
        self.name = name
        self.dir = os.path.join(scratch, name)
        os.makedirs(self.dir)
        run_dir = run_dir or os.path.join(self.dir, "run")
        self.sock = os.path.join(run_dir, "agent.sock")
        self.port = port
        self.cfg = os.path.join(self.dir, "throttlewatch.toml")
        metrics = f"127.0.0.1:{port}" if port else ""
        open(self.cfg, "w").write(
            f'log_dir = "{self.dir}/logs"\nsocket = "{self.sock}"\n'
            f'state_dir = "{run_dir}"\nmetrics_addr = "{metrics}"\n'
            f"start_agent = false\nmax_containers = 2048\n"
        )
        self.err = open(os.path.join(self.dir, "stderr"), "w")
        self.p = subprocess.Popen([path, "agent", "--config", self.cfg],
                                  stdout=subprocess.DEVNULL, stderr=self.err,
                                  env={**os.environ, **(env or {})})
        t = time.time()
        while True:
            try:
                if call(self.sock, {"op": "status"}, 1).get("ok"):
                    break
            except OSError:
                pass
            if time.time() - t > 30 or self.p.poll() is not None:
                self.stop()
                sys.exit(f"{name}: the agent did not come up ({self.dir}/stderr)")
            time.sleep(0.1)

    def watched(self):
        """The containers the agent watches (its `status`)."""
        return call(self.sock, {"op": "status"}).get("watched") or []

    def stop(self):
        if self.p.poll() is not None:
            return
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
