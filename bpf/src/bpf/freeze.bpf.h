/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Per-thread freezes: a watched thread switched out frozen by CFS bandwidth
 * control (core_fixes.bpf.h tells how that shows) until it switches back in,
 * reported as one TW_EV_FREEZE. Its freeze also opens its (cgroup, CPU)
 * episode, and its thaw closes it (episodes.bpf.h). */
#ifndef __THROTTLEWATCH_FREEZE_BPF_H
#define __THROTTLEWATCH_FREEZE_BPF_H

struct frozen {
	__u64 start_ns;
	__u64 tg;
	__u64 cgroup_id;
	__u64 throttled_cgroup_id;
	__u32 cpu_out;
	__u32 throttled_level;
};

/* Freeze state per thread, keyed by tid, in a preallocated map: it is
 * created at the freeze, in sched_switch, with the run-queue lock held.
 * Task local storage must not be created there: before Linux 6.4 ("bpf:
 * Use bpf_mem_cache_alloc/free in bpf_local_storage") that allocates with
 * kmalloc(GFP_ATOMIC), which can wake kswapd (a boosted or low watermark),
 * and a wakeup that picks this run-queue spins on the lock its own CPU
 * holds: the CPU stops with interrupts off (see docs/vm-lane.md). A
 * preallocated map's update takes an element from a free list. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct frozen);
} frozen_by_tid SEC(".maps");

/* Threads currently frozen (with nr_open: while both are zero a switch-in
 * costs two loads). */
__u64 nr_frozen = 0;

static __always_inline struct frozen *frozen_get(struct task_struct *t, bool direct, bool create)
{
	struct frozen zero = {}, *f;
	__u32 tid;

	tid = direct ? t->pid : BPF_CORE_READ(t, pid);
	if (!create)
		return bpf_map_lookup_elem(&frozen_by_tid, &tid);
	f = tw_lookup_or_init(&frozen_by_tid, &tid, &zero, NULL);
	if (!f)
		tw_count_full(TW_FULL_FROZEN_BY_TID);
	return f;
}

/* The nearest run-queue on the task's path to the root that is throttled:
 * its cgroup id and depth. */
static __always_inline void throttled_rq(struct task_struct *t, __u64 *id, __u32 *level, __u64 *tgp)
{
	struct sched_entity *se = &t->se;
	struct cfs_rq *rq;
	int i;

	*id = 0;
	*level = 0;
	*tgp = 0;
	for (i = 0; i < TW_MAX_LEVELS && se; i++) {
		rq = BPF_CORE_READ(se, cfs_rq);
		if (!rq)
			return;
		if (tw_cfs_rq_throttled(rq)) {
			struct task_group *tg = BPF_CORE_READ(rq, tg);
			*id = tg_cgroup_id(tg);
			*level = BPF_CORE_READ(tg, css.cgroup, level);
			*tgp = (__u64)tg;
			return;
		}
		se = BPF_CORE_READ(se, parent);
	}
}

/* Slow path: `prev` is being frozen. */
static __always_inline int on_freeze(struct task_struct *prev, bool direct)
{
	struct frozen *f;
	__u64 own, cg, now, tid_cg, tg;
	__u32 cpu, level;

	cg = watched_group(prev, &own);
	if (!cg)
		return 0;
	now = bpf_ktime_get_ns();
	cpu = bpf_get_smp_processor_id();
	dq_learn_at_freeze(prev, now);
	throttled_rq(prev, &tid_cg, &level, &tg);
	open_episode(cg, cpu, now, tg);

	f = frozen_get(prev, direct, true);
	if (!f || f->start_ns)
		return 0;
	f->start_ns = now;
	f->cgroup_id = cg;
	f->cpu_out = cpu;
	f->throttled_cgroup_id = tid_cg;
	f->throttled_level = level;
	f->tg = tg;
	__sync_fetch_and_add(&nr_frozen, 1);
	return 0;
}

/* Slow path: a thread switches in while freezes or episodes are open.
 * Returns how long `next` was frozen when this switch-in is its thaw (at
 * least 1), else 0. */
static __always_inline __u64 on_thaw(struct task_struct *prev, struct task_struct *next, bool direct)
{
	struct tw_freeze_event ev = {};
	struct frozen *f;
	__u64 now = bpf_ktime_get_ns();
	__u32 cpu = bpf_get_smp_processor_id();

	dq_close_at_switch_in(next, cpu, now);
	if (!nr_frozen)
		return 0;
	f = frozen_get(next, direct, false);
	if (!f || !f->start_ns)
		return 0;

	/* The episode of the CPU it was frozen on ends with the first of its
	 * frozen threads to run again, wherever that is: at the timer run
	 * that unthrottled it (unthrottled_at()), or, when it comes back to
	 * that CPU from idle, now. A remote run-queue is unthrottled from an
	 * IPI after the timer run (unthrottle_cfs_rq_async(), Linux >= 6.2),
	 * and the kernel stops its clock there; an idle CPU runs the group at
	 * once, while waking an idle vCPU on a busy host takes milliseconds
	 * (seen in CI: 1-5 ms per period, the probe 1.1-2.8 % short). */
	close_episode_at(f->cgroup_id, f->cpu_out, f->start_ns, now,
			 cpu == f->cpu_out && !BPF_CORE_READ(prev, pid));

	ev.hdr.kind = TW_EV_FREEZE;
	ev.hdr.tid = BPF_CORE_READ(next, pid);
	ev.hdr.tgid = BPF_CORE_READ(next, tgid);
	ev.hdr.cpu = cpu;
	ev.hdr.cgroup_id = f->cgroup_id;
	bpf_probe_read_kernel_str(ev.hdr.comm, sizeof(ev.hdr.comm), next->comm);
	ev.cpu_out = f->cpu_out;
	ev.throttled_level = f->throttled_level;
	ev.start_ns = f->start_ns;
	ev.end_ns = now;
	ev.task_cgroup_id = tg_cgroup_id(BPF_CORE_READ(next, se.cfs_rq, tg));
	ev.throttled_cgroup_id = f->throttled_cgroup_id;
	f->start_ns = 0;
	__sync_fetch_and_sub(&nr_frozen, 1);
	emit(&ev);
	return now > ev.start_ns ? now - ev.start_ns : 1;
}

#endif
