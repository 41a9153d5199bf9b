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
};

enum tw_coldstart_stage {
	/* sched_process_exec of the first task of the cgroup after it was armed */
	TW_CS_EXEC = 1,
	/* the first switch-in of one of its threads after the exec */
	TW_CS_FIRST_RUN = 2,
	/* the moment its threads had target_ns of CPU since the exec */
	TW_CS_CPU = 3,
};

/* Cold start of one watched cgroup, armed by user space (hash, by cgroup id). */
struct tw_coldstart {
	__u64 target_ns;	/* on-CPU time that completes the cold start */
	__u64 exec_ns;
	__u64 first_run_ns;
	__u64 cpu_done_ns;
	__u64 oncpu_ns;
	__u32 tgid;
	__u32 state;		/* 0 armed, 1 exec seen */
};

#endif
