/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The ABI of the throttle feature (freezes and (cgroup, CPU) episodes)
 * between the BPF programs and user space: fixed-width fields, no pointers.
 * Mirrored by bpf/src/event.rs; change both together and bump TW_ABI_VERSION. */
#ifndef __THROTTLEWATCH_THROTTLE_H
#define __THROTTLEWATCH_THROTTLE_H

#define TW_ABI_VERSION 6
#define TW_COMM_LEN 16
/* How far up the cgroup tree a frozen task's group is matched against the
 * watch map, and how far the throttled run-queue is searched. */
#define TW_MAX_LEVELS 8

/* The records of the `events` ring buffer: each starts with a
 * struct tw_event_header whose kind says which struct it is. */
enum tw_event_kind {
	/* One thread was frozen by CFS bandwidth control: switched out
	 * throttled, switched back in (struct tw_freeze_event). */
	TW_EV_FREEZE = 1,
	/* 2 was a per-episode event; the totals live in the `episodes` map,
	 * so it was retired (ABI 4). Never reuse it. */
	/* A cold-start stage of a watched cgroup's entrypoint
	 * (struct tw_coldstart_event). */
	TW_EV_COLDSTART = 3,
	/* Dequeue model (before 6.18) only: a thread that was waiting on the
	 * run-queue (preempted, or woken) when its group was throttled there.
	 * It was never switched out throttled: it is recorded when it switches
	 * back in, frozen for the part of its wait that the episode covers.
	 * A struct tw_freeze_event too. */
	TW_EV_FREEZE_QUEUED = 4,
	/* A thread of a watched cgroup exited (threads.bpf.h): what the
	 * scheduler counted for it (struct tw_thread_cpu_event). */
	TW_EV_THREAD_CPU = 5,
};

/* The maps whose inserts can fail when they are full, as slots of the
 * `map_full` per-CPU array (full.bpf.h). LRU maps evict their oldest entry
 * rather than refuse, so theirs count only inserts that failed all the same. */
enum tw_map_full {
	TW_FULL_EPISODES = 0,		/* episodes: (cgroup, CPU) episodes */
	TW_FULL_FROZEN_BY_TID = 1,	/* frozen_by_tid: per-thread freeze state (LRU) */
	TW_FULL_BANDWIDTH_TIMERS = 2,	/* bandwidth_timers: followed groups (LRU) */
	TW_FULL_NR = 3,
};

/* The kernel's throttling model (core_fixes.bpf.h decides it), as the
 * `throttle_model` global reports it to user space. */
enum tw_model {
	/* Linux >= 6.18: task_struct.throttled, tasks are dequeued one by
	 * one on their way back to user mode. */
	TW_MODEL_TASK = 1,
	/* Older kernels: the whole cfs_rq is dequeued; the running task is
	 * switched out runnable with se.cfs_rq->throttle_count > 0. */
	TW_MODEL_RQ = 2,
};

/* What every record starts with. */
struct tw_event_header {
	__u32 kind;	/* enum tw_event_kind: which struct follows */
	__u32 tid;
	__u32 tgid;
	/* the CPU that recorded it (a freeze: the one the thread switched
	 * back in on) */
	__u32 cpu;
	/* the watched cgroup (cpu controller kernfs id) the thread belongs to */
	__u64 cgroup_id;
	char comm[TW_COMM_LEN];
};

/* TW_EV_FREEZE and TW_EV_FREEZE_QUEUED. */
struct tw_freeze_event {
	struct tw_event_header hdr;
	__u32 cpu_out;	/* the CPU it was frozen on */
	/* depth of the throttled run-queue's cgroup (root = 0) */
	__u32 throttled_level;
	/* CLOCK_MONOTONIC: frozen from (the switch-out; queued: the throttle
	 * in its wait, or the wait's start) to (the switch-in; queued: start
	 * plus the throttled part of the wait) */
	__u64 start_ns;
	__u64 end_ns;
	/* the task's own cpu cgroup (may be a child of the watched one) */
	__u64 task_cgroup_id;
	/* the cgroup whose run-queue was throttled (may be an ancestor) */
	__u64 throttled_cgroup_id;
};

/* TW_EV_COLDSTART: tid/tgid/comm are the entrypoint's. */
struct tw_coldstart_event {
	struct tw_event_header hdr;
	__u32 stage;	/* TW_CS_EXEC or TW_CS_CPU (runq.h) */
	__u32 pad;
	__u64 at_ns;	/* CLOCK_MONOTONIC, when the stage was reached */
	/* TW_CS_EXEC: the process's creation (task start_time);
	 * TW_CS_CPU: the exec */
	__u64 ref_ns;
};

/* TW_EV_THREAD_CPU: its /proc/<tid>/schedstat, which goes with it. */
struct tw_thread_cpu_event {
	struct tw_event_header hdr;
	__u64 running_ns;	/* se.sum_exec_runtime */
	/* sched_info.run_delay (frozen time included); 0 on kernels without
	 * CONFIG_SCHED_INFO */
	__u64 run_delay_ns;
};

/* A watched group's CFS bandwidth counters as the kernel keeps them
 * (tg->cfs_bandwidth, what its cpu.stat prints), taken when one of its
 * tasks exits: the last exit's figures outlive a cgroup that the runtime
 * removes before anyone can read its cpu.stat (`runc run`, Podman). */
struct tw_bandwidth {
	__u64 throttled_time;	/* ns */
	__u64 burst_time;	/* ns */
	__u32 nr_periods;
	__u32 nr_throttled;
	__u32 nr_burst;
	__u32 pad;
};

struct tw_episode_key {
	__u64 cgroup_id;
	__u32 cpu;
	__u32 pad;
};

struct tw_episode {
	__u64 open_ns;	/* 0 when no episode is open */
	/* the throttled task_group (kernel address, only ever read with
	 * bpf_probe_read): its bandwidth timers tell when it was unthrottled */
	__u64 tg;
	__u64 total_ns;
	__u64 count;
	/* the last bandwidth timer run that did not unthrottle the run-queue
	 * (seen throttled at its start, or still throttled with no runtime at
	 * its end): the unthrottle is a later run, or that run's end */
	__u64 seen_ns;
	/* the last episode that ended, for threads that waited through it */
	__u64 last_open_ns;
	__u64 last_end_ns;
};

#endif
