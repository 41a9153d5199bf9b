#!/usr/bin/env python3
"""A periodic four-stage pipeline whose hand-offs are real wake-ups.

    chain.py MODE ROUNDS PERIOD_MS WORK_MS [SWITCH_S]

MODE is `processes` (four processes) or `threads` (four threads of one
process). Every PERIOD_MS the source (`tw-src`, woken by its timer) works
WORK_MS and writes a byte into a pipe; `tw-pipe` reads it, works, sends a
byte over a unix socket pair; `tw-sock` receives it, works, posts a POSIX
semaphore (a futex); `tw-futex` takes it and works. A reader that is
asleep when its byte comes is woken once: each stage counts the rounds it
had to wait (its byte was not there yet when it looked; with PERIOD_MS
well above 4 x WORK_MS that is every round, on a slow machine fewer), so
the edges tw-src -> tw-pipe, tw-pipe -> tw-sock and tw-sock -> tw-futex
have that many wake-ups each. At the end one JSON line on stdout: the
stages' tids (`tids`), the rounds each stage waited (`waited`; the
source's: the rounds it slept, each one timer wake-up), and when
(CLOCK_REALTIME ns) each stage's first round began (`first_wake_ns`: its
first byte, or the source's first timer), so that a reader can tell the
stages' start-up from their rounds.
"""

import ctypes
import json
import multiprocessing as mp
import os
import select
import socket
import sys
import threading
import time

LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_NAME = 15


def name(n):
    LIBC.prctl(PR_SET_NAME, n.encode(), 0, 0, 0)


def work(ms):
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def src(rounds, period_ms, work_ms, pipe_w, out):
    name("tw-src")
    out.put(("tw-src", threading.get_native_id()))
    t0 = time.monotonic()
    slept = 0
    for i in range(rounds):
        wait = t0 + (i + 1) * period_ms / 1000.0 - time.monotonic()
        if wait > 0:
            time.sleep(wait)
            slept += 1
        if i == 0:
            out.put(("tw-src:first", time.time_ns()))
        work(work_ms)
        os.write(pipe_w, b"x")
    out.put(("tw-src:waited", slept))


def ready(fd):
    return bool(select.select([fd], [], [], 0)[0])


def pipe_stage(rounds, work_ms, pipe_r, sock, out):
    name("tw-pipe")
    out.put(("tw-pipe", threading.get_native_id()))
    waited = 0
    for i in range(rounds):
        waited += not ready(pipe_r)
        assert os.read(pipe_r, 1) == b"x"
        if i == 0:
            out.put(("tw-pipe:first", time.time_ns()))
        work(work_ms)
        sock.send(b"y")
    out.put(("tw-pipe:waited", waited))


def sock_stage(rounds, work_ms, sock, sem, out):
    name("tw-sock")
    out.put(("tw-sock", threading.get_native_id()))
    waited = 0
    for i in range(rounds):
        waited += not ready(sock.fileno())
        assert sock.recv(1) == b"y"
        if i == 0:
            out.put(("tw-sock:first", time.time_ns()))
        work(work_ms)
        sem.release()
    out.put(("tw-sock:waited", waited))


def futex_stage(rounds, work_ms, sem, out):
    name("tw-futex")
    out.put(("tw-futex", threading.get_native_id()))
    waited = 0
    for i in range(rounds):
        if not sem.acquire(False):
            waited += 1
            sem.acquire()
        if i == 0:
            out.put(("tw-futex:first", time.time_ns()))
        work(work_ms)
    out.put(("tw-futex:waited", waited))


def main():
    mode, rounds, period_ms, work_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    switch_s = float(sys.argv[5]) if len(sys.argv) > 5 else None
    if mode not in ("processes", "threads"):
        sys.exit(f"chain.py: MODE {mode!r}: processes or threads")
    ctx = mp.get_context("fork")
    pipe_r, pipe_w = os.pipe()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if mode == "processes":
        out = ctx.Queue()
        sem = ctx.Semaphore(0)
        spawn = lambda f, *args: ctx.Process(target=f, args=args)
    else:
        import queue

        # The GIL: a thread that wants it waits at most the switch interval
        # (5 ms), a timed wait the timer ends, then forces a hand-off. A
        # 5 ms stage then adds a timer edge into every other stage, a
        # shortcut past the pipeline's own hand-offs (the blocking reads,
        # which release the GIL). SWITCH_S (seconds) sets a longer one.
        if switch_s:
            sys.setswitchinterval(switch_s)

        out = queue.Queue()
        sem = threading.Semaphore(0)
        spawn = lambda f, *args: threading.Thread(target=f, args=args)
    stages = [
        spawn(futex_stage, rounds, work_ms, sem, out),
        spawn(sock_stage, rounds, work_ms, b, sem, out),
        spawn(pipe_stage, rounds, work_ms, pipe_r, a, out),
        spawn(src, rounds, period_ms, work_ms, pipe_w, out),
    ]
    t0 = time.monotonic()
    for s in stages:
        s.start()
    got = dict(out.get() for _ in range(3 * len(stages)))
    for s in stages:
        s.join()
    tids = {k: v for k, v in got.items() if ":" not in k}
    waited = {k.split(":")[0]: v for k, v in got.items() if k.endswith(":waited")}
    first = {k.split(":")[0]: v for k, v in got.items() if k.endswith(":first")}
    print(json.dumps({"mode": mode, "rounds": rounds, "tids": tids, "waited": waited,
                      "first_wake_ns": first, "wall_s": time.monotonic() - t0}), flush=True)


if __name__ == "__main__":
    main()
