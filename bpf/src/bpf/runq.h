/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The ABI of the run-queue latency and cold-start features: fixed-width
 * fields, no pointers. Mirrored by bpf/src/runq.rs and bpf/src/probe.rs. */
#ifndef __THROTTLEWATCH_RUNQ_H
#define __THROTTLEWATCH_RUNQ_H

/* Run-queue latency per watched cgroup, one per CPU (BPF_MAP_TYPE_PERCPU_HASH,
 * created by user space at watch time; the kernel only looks it up).
 * slots[i] counts waits in [2^i, 2^(i+1)) ns (slot 0: [0, 2)); the last
 * slot takes everything longer. */
#define TW_RUNQ_SLOTS 32

struct tw_runq {
	__u64 slots[TW_RUNQ_SLOTS];
	__u64 count;
	__u64 total_ns;
	__u64 max_ns;		/* over the whole watch */
	/* the longest wait since user space last bumped runq_epoch */
	__u64 epoch;
	__u64 epoch_max_ns;
	/* a watched thread switched out runnable (not throttled), by whom */
	__u64 preempt_same;	/* a task of the same watched cgroup */
	__u64 preempt_other;	/* a task of another watched cgroup */
	__u64 preempt_host;	/* anything else */
	/* waits that ended in a thaw: freezes, not queueing */
	__u64 excluded;
	/* wake-up edges of this cgroup the full wake_edges map could not take */
	__u64 wake_dropped;
};

/* Wake-up chains (wakeups.bpf.h): one entry per (watched cgroup of the
 * wakee, wakee thread, waker thread, kind of waker), in a preallocated
 * hash (BPF_MAP_TYPE_HASH). Only the wakee's own switch-ins and thaws
 * write an entry (the key holds its tid), so its fields need no atomics. */
enum tw_waker_kind {
	TW_WAKER_SAME = 1,	/* a thread of the wakee's watched cgroup */
	TW_WAKER_OTHER = 2,	/* a thread of another watched cgroup */
	TW_WAKER_HOST = 3,	/* any other thread */
	TW_WAKER_IRQ = 4,	/* hard or soft interrupt (tids 0) */
};

struct tw_wake_key {
	__u64 cgroup_id;	/* the wakee's watched cgroup */
	__u32 wakee_tid;
	__u32 waker_tid;
	__u32 waker_tgid;
	__u32 kind;		/* enum tw_waker_kind */
};

struct tw_wake_edge {
	__u64 count;		/* wakeups that ended in a switch-in */
	__u64 wait_ns;		/* their wake -> switch-in times, summed */
	__u64 max_ns;
	__u64 epoch;		/* runq_epoch when epoch_max_ns was reset */
	__u64 epoch_max_ns;
	/* freezes of the wakee between a wakeup and the next one (the work
	 * that wakeup started): how many, their time, and how many wakeups
	 * saw at least one */
	__u64 freezes;
	__u64 frozen_ns;
	__u64 frozen_hops;
	__u64 waker_cgroup_id;	/* the waker's watched cgroup (0: none) */
	__u32 wakee_tgid;
	__u32 pad;
	char waker_comm[16];	/* at the first wakeup of the edge */
	char wakee_comm[16];
	__u64 slots[TW_RUNQ_SLOTS];	/* wake -> switch-in, log2 ns */
};

enum tw_coldstart_stage {
	/* sched_process_exec of the first task of the cgroup after it was armed */
	TW_CS_EXEC = 1,
	/* 2 was "the first switch-in after the exec": the exec'ing thread is on
	 * a CPU at its exec and runs on into the new image, so the first run is
	 * the exec's moment (user space writes it). Retired, never reused. */
	/* the moment the entrypoint and the threads and processes it started
	 * had target_ns of CPU between them since the exec */
	TW_CS_CPU = 3,
};

/* What a thread of a pending cold start is doing (tw_task.cs_state). */
enum tw_cs_thread {
	TW_CS_BLOCKED = 0,	/* sleeping, waiting for I/O, not started, exited */
	TW_CS_QUEUED = 1,	/* runnable, waiting on a run-queue */
	TW_CS_RUNNING = 2,
	TW_CS_FROZEN = 3,	/* throttled by CFS bandwidth control */
};

/* Cold start of one watched cgroup, armed by user space (hash, by cgroup
 * id; the map's value is this behind an 8-byte spin lock, see
 * coldstart.bpf.h). The kernel updates it under the lock; once cpu_done_ns
 * is set it is final and user space reads it. */
struct tw_coldstart {
	__u32 tgid;
	__u32 pad0;
	__u64 target_ns;	/* on-CPU time that completes the cold start */
	__u64 exec_ns;
	__u64 cpu_done_ns;
	__u64 oncpu_ns;		/* CPU its threads had since the exec */
	/* exec .. cpu_done_ns (or .. last_ns while pending) by what its
	 * threads were doing: one ran; else one was frozen by the quota; else
	 * one waited on a run-queue; else all were blocked */
	__u64 running_ns;
	__u64 frozen_ns;
	__u64 queued_ns;
	__u64 blocked_ns;
	__u64 last_ns;		/* the split is counted up to here */
	__u32 nr_running;	/* its threads in each state */
	__u32 nr_frozen;
	__u32 nr_queued;
	__u32 pad;
};

#endif
