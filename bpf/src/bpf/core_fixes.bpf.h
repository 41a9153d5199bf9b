/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Every kernel-version divergence the probes depend on, one accessor each,
 * with the upstream commit it follows (after libbpf-tools' core_fixes.bpf.h).
 * Callers never test the kernel themselves. */
#ifndef __THROTTLEWATCH_CORE_FIXES_H
#define __THROTTLEWATCH_CORE_FIXES_H

#include <bpf/bpf_core_read.h>

/* commit 2cd571245b43 ("sched/fair: Add related data structure for task
 * based throttle") adds task_struct.throttled, and commit e1fad12dcb66
 * ("sched/fair: Switch to task based throttle model"), Linux 6.18, uses it:
 * a throttled cfs_rq no longer dequeues its entities; each task is dequeued
 * by task work on its way back to user mode and marks itself throttled. */
struct task_struct___tw618 {
	bool throttled;
} __attribute__((preserve_access_index));

/* commit e1fad12dcb66 also turned cfs_rq.throttled from an int into a
 * one-bit bool field. A full vmlinux.h makes clang 14 crash on
 * BPF_CORE_READ_BITFIELD(cfs_rq, throttled) ("requiring too big
 * alignment"), so this minimal flavour is read with the PROBED variant,
 * which handles both layouts. */
struct cfs_rq___tw {
	bool throttled: 1;
	int throttle_count;
	u64 throttled_clock;
	s64 runtime_remaining;
} __attribute__((preserve_access_index));

/* commit 2f064a59a11f ("sched: Change task_struct::state"), Linux 5.14,
 * renamed task_struct.state to __state. */
struct task_struct___tw_old {
	long state;
} __attribute__((preserve_access_index));

/* THE throttling-model decision, taken here only (a CO-RE constant after
 * load): true before e1fad12dcb66, where a throttled group's cfs_rq is
 * dequeued whole (the "dequeue model"). dequeue.bpf.h holds what that
 * model needs beyond the task model; user space reads the answer from the
 * `throttle_model` global (see throttle.bpf.c), it does not ask again. */
static __always_inline bool tw_dequeue_model(void)
{
	return !bpf_core_field_exists(struct task_struct___tw618, throttled);
}

static __always_inline long tw_task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return BPF_CORE_READ((struct task_struct___tw_old *)t, state);
}

/* The same, as a plain load for tp_btf programs (trusted task pointer). */
static __always_inline long tw_task_state_direct(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return BPF_CORE_READ((struct task_struct___tw_old *)t, state);
}

static __always_inline bool tw_cfs_rq_throttled(struct cfs_rq *rq)
{
	return BPF_CORE_READ_BITFIELD_PROBED((struct cfs_rq___tw *)rq, throttled);
}

static __always_inline int tw_cfs_rq_throttle_count(struct cfs_rq *rq)
{
	return BPF_CORE_READ((struct cfs_rq___tw *)rq, throttle_count);
}

/* rq_clock() when the kernel throttled this cfs_rq (sched_clock domain). */
static __always_inline u64 tw_cfs_rq_throttled_clock(struct cfs_rq *rq)
{
	return BPF_CORE_READ((struct cfs_rq___tw *)rq, throttled_clock);
}

/* Quota this CPU may still spend (negative: overdrawn). A bandwidth timer
 * run that unthrottles a run-queue first tops this up above zero
 * (distribute_cfs_runtime(); since commit 8ad075c2eb1f ("sched: Async
 * unthrottling for cfs bandwidth"), Linux 6.2, remote CPUs then unthrottle
 * from an IPI), so a run-queue still throttled with nothing left after a run
 * was not unthrottled by it. */
static __always_inline s64 tw_cfs_rq_runtime_remaining(struct cfs_rq *rq)
{
	return BPF_CORE_READ((struct cfs_rq___tw *)rq, runtime_remaining);
}

/* How a thread frozen by CFS bandwidth control leaves the CPU: since
 * e1fad12dcb66 it marks itself task_struct.throttled; before, the running
 * task is switched out still runnable under a throttled ancestor. */
static __always_inline bool tw_switched_out_frozen(struct task_struct *prev, bool direct)
{
	struct task_struct___tw618 *p = (void *)prev;

	if (!tw_dequeue_model())
		return direct ? p->throttled : BPF_CORE_READ(p, throttled);
	return tw_task_state(prev) == 0 &&
	       tw_cfs_rq_throttle_count(BPF_CORE_READ(prev, se.cfs_rq)) > 0;
}

/* A woken task whose hierarchy is throttled: since e1fad12dcb66 it is
 * frozen on its own way to user mode (switched out throttled later), so its
 * wait for the CPU is a freeze, not queueing. Before, its wait starts and
 * the throttled part is told apart at the switch-in (dequeue.bpf.h). */
static __always_inline bool tw_woken_into_freeze(struct task_struct *p)
{
	return !tw_dequeue_model() && tw_cfs_rq_throttle_count(BPF_CORE_READ(p, se.cfs_rq)) > 0;
}

#endif
