"""A data-loading pipeline as training jobs run it: a multiprocessing pool of
CPU-heavy workers feeding one consumer (the main process), which prints its
step times. Shapes: steady (the workers never rest) or bursty (a batch of
tasks every interval, idle between).

pipeline.py WORKERS SECONDS steady|bursty [TASK_MS [INTERVAL_MS]]
"""
import multiprocessing as mp
import sys
import time


def work(ms):
    # CPU time, not wall time: the same work however the CPU is shared.
    end = time.thread_time() + ms / 1000.0
    x = 0
    while time.thread_time() < end:
        for i in range(1000):
            x += i * i
    return x


def main():
    workers, seconds, shape = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    task_ms = float(sys.argv[4]) if len(sys.argv) > 4 else 20.0
    interval_ms = float(sys.argv[5]) if len(sys.argv) > 5 else 400.0
    steps = []
    deadline = time.monotonic() + seconds
    with mp.Pool(workers) as pool:
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            # One batch: a task per worker, consumed as it comes.
            for _ in pool.imap_unordered(work, [task_ms] * workers):
                pass
            steps.append(time.monotonic() - t0)
            if shape == "bursty":
                rest = interval_ms / 1000.0 - (time.monotonic() - t0)
                if rest > 0:
                    time.sleep(rest)
    steps.sort()
    p99 = steps[min(len(steps) - 1, int(len(steps) * 0.99))]
    print(f"steps {len(steps)} p50_ms {steps[len(steps) // 2] * 1000:.1f} p99_ms {p99 * 1000:.1f}")


if __name__ == "__main__":
    main()
