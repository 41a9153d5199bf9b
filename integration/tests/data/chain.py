#!/usr/bin/env python3
"""A periodic four-stage pipeline whose hand-offs are real wake-ups.

    chain.py MODE ROUNDS PERIOD_MS WORK_MS

MODE is `processes` (four processes) or `threads` (four threads of one
process). Every PERIOD_MS the source (`tw-src`, woken by its timer) works
WORK_MS and writes a byte into a pipe; `tw-pipe` reads it, works, sends a
byte over a unix socket pair; `tw-sock` receives it, works, posts a POSIX
semaphore (a futex); `tw-futex` takes it and works. Each reader is asleep
when its byte comes (PERIOD_MS is well above 4 x WORK_MS), so each hop is
exactly one wake-up per round: the edges tw-src -> tw-pipe, tw-pipe ->
tw-sock and tw-sock -> tw-futex have ROUNDS wake-ups each. At the end one
JSON line on stdout: the stages' tids and what they did.
"""

import ctypes
import json
import multiprocessing as mp
import os
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
    for i in range(rounds):
        wait = t0 + (i + 1) * period_ms / 1000.0 - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        work(work_ms)
        os.write(pipe_w, b"x")


def pipe_stage(rounds, work_ms, pipe_r, sock, out):
    name("tw-pipe")
    out.put(("tw-pipe", threading.get_native_id()))
    for _ in range(rounds):
        assert os.read(pipe_r, 1) == b"x"
        work(work_ms)
        sock.send(b"y")


def sock_stage(rounds, work_ms, sock, sem, out):
    name("tw-sock")
    out.put(("tw-sock", threading.get_native_id()))
    for _ in range(rounds):
        assert sock.recv(1) == b"y"
        work(work_ms)
        sem.release()


def futex_stage(rounds, work_ms, sem, out):
    name("tw-futex")
    out.put(("tw-futex", threading.get_native_id()))
    for _ in range(rounds):
        sem.acquire()
        work(work_ms)


def main():
    mode, rounds, period_ms, work_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
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
    tids = dict(out.get() for _ in stages)
    for s in stages:
        s.join()
    print(json.dumps({"mode": mode, "rounds": rounds, "tids": tids, "wall_s": time.monotonic() - t0}), flush=True)


if __name__ == "__main__":
    main()
