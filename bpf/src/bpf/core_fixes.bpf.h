/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Every kernel-version divergence the probes depend on, in one place. */
#ifndef __THROTTLEWATCH_CORE_FIXES_H
#define __THROTTLEWATCH_CORE_FIXES_H

#include <bpf/bpf_core_read.h>

/* Linux 6.18, "sched/fair: Task based throttle" (Aaron Lu, Valentin
 * Schneider): a throttled cfs_rq no longer dequeues its entities; each task
 * is dequeued by task work on return to user mode and marks itself
 * task_struct.throttled. Its presence selects TW_MODEL_TASK. */
struct task_struct___tw618 {
	bool throttled;
} __attribute__((preserve_access_index));

/* cfs_rq.throttled was `int throttled` until 6.x turned it into a one-bit
 * bool field. A full vmlinux.h makes clang 14 crash on
 * BPF_CORE_READ_BITFIELD(cfs_rq, throttled) ("requiring too big
 * alignment"), so this minimal flavour is read with the PROBED variant,
 * which handles both the int and the bitfield layout. */
struct cfs_rq___tw {
	bool throttled: 1;
	int throttle_count;
	u64 throttled_clock;
	s64 runtime_remaining;
} __attribute__((preserve_access_index));

/* Linux 5.14 renamed task_struct.state to __state ("sched: Change
 * task_struct::state"). Only the pre-6.18 model needs it. */
struct task_struct___tw_old {
	long state;
} __attribute__((preserve_access_index));

static __always_inline bool tw_task_based_throttle(void)
{
	return bpf_core_field_exists(struct task_struct___tw618, throttled);
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

/* rq_clock() when the kernel throttled this cfs_rq (sched_clock domain). */
static __always_inline u64 tw_cfs_rq_throttled_clock(struct cfs_rq *rq)
{
	return BPF_CORE_READ((struct cfs_rq___tw *)rq, throttled_clock);
}

/* Quota this CPU may still spend (negative: overdrawn). A bandwidth timer
 * run that unthrottles a run-queue first tops this up above zero
 * (distribute_cfs_runtime(); since 6.2 remote CPUs then unthrottle from an
 * IPI, "sched: Async unthrottling for cfs bandwidth"), so a run-queue still
 * throttled with nothing left after a run was not unthrottled by it. */
static __always_inline s64 tw_cfs_rq_runtime_remaining(struct cfs_rq *rq)
{
	return BPF_CORE_READ((struct cfs_rq___tw *)rq, runtime_remaining);
}

static __always_inline int tw_cfs_rq_throttle_count(struct cfs_rq *rq)
{
	return BPF_CORE_READ((struct cfs_rq___tw *)rq, throttle_count);
}

#endif
