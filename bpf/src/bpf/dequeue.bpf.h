/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* What the dequeue model (kernels before e1fad12dcb66, see core_fixes.bpf.h)
 * needs beyond the task model, and what both need for a group throttled
 * before it was watched. On the dequeue model a throttled group's run-queue
 * is dequeued whole: only the running thread is switched out, and a
 * run-queue can be throttled with no thread switched out at all (at
 * enqueue, e.g. a thread pinned onto a CPU whose runtime is spent). On both,
 * a group can be throttled when it is put in the watch map (a container's
 * runtime bootstrap runs under its quota before the hook): its frozen
 * threads switched out unseen. So episodes are also opened at the kernel's
 * own throttle stamp, which needs the offset between the rq clock and ours,
 * and the bandwidth timers' callbacks to follow a group from its first timer
 * run; on the dequeue model they are ended at the rq clock of the
 * unthrottle. The dq_ hooks that only the dequeue model needs return at once
 * on the task model: the common code calls them without testing the kernel. */
#ifndef __THROTTLEWATCH_DEQUEUE_BPF_H
#define __THROTTLEWATCH_DEQUEUE_BPF_H

/* bpf_ktime_get_ns() - rq_clock(), refreshed on every freeze: the kernel
 * stamps throttles with rq_clock() (sched_clock), the probe with
 * CLOCK_MONOTONIC. At a switch the rq clock was just updated by
 * __schedule(), so the difference is exact to a few microseconds. Between
 * refreshes the two drift apart by the clock's frequency correction (ppm),
 * so user space sets it to 0 whenever it adds a cgroup to the watch map
 * (probe.rs): the next switch learns it again, before the group's next
 * timer run can open an episode from before the watch. */
__s64 clock_offset = 0;

/* The callbacks of every task group's bandwidth timers
 * (sched_cfs_period_timer() and sched_cfs_slack_timer(), which
 * init_cfs_bandwidth() sets for every group, the root included), read from
 * the first switched-out task's group. A timer run with one of them is a
 * group's bandwidth timer, so a watched group is followed from its first
 * timer run, before any of its threads was switched out throttled. 0 until
 * learnt (and on the task model). */
__u64 period_timer_fn = 0;
__u64 slack_timer_fn = 0;

/* A switch that froze nothing, the first ones after load: an offset for
 * run-queues that the timer walk finds throttled before any freeze was seen
 * (any switch will do: __schedule() has just updated the rq clock), and the
 * bandwidth timers' callbacks. */
static __always_inline void dq_learn_at_switch(struct task_struct *prev)
{
	struct cfs_rq *cfs;
	struct task_group *tg;
	struct rq *rq;
	__u64 clk, p, sl;

	if (clock_offset && period_timer_fn)
		return;
	cfs = BPF_CORE_READ(prev, se.cfs_rq);
	if (!cfs)
		return;
	rq = BPF_CORE_READ(cfs, rq);
	clk = rq ? BPF_CORE_READ(rq, clock) : 0;
	if (clk && !clock_offset)
		clock_offset = (__s64)bpf_ktime_get_ns() - (__s64)clk;
	tg = BPF_CORE_READ(cfs, tg);
	if (!tg || period_timer_fn)
		return;
	p = (__u64)BPF_CORE_READ(tg, cfs_bandwidth.period_timer.function);
	sl = (__u64)BPF_CORE_READ(tg, cfs_bandwidth.slack_timer.function);
	if (p && sl && p != sl) {
		slack_timer_fn = sl;
		period_timer_fn = p;
	}
}

/* A freeze: refresh the clock offset (only the timer walk below uses it). */
static __always_inline void dq_learn_at_freeze(struct task_struct *prev, __u64 now)
{
	clock_offset = (__s64)now - (__s64)BPF_CORE_READ(prev, se.cfs_rq, rq, clock);
}

/* A thread switches in while episodes are open: the throttled group has
 * nothing runnable on this CPU until it is unthrottled, so any of its
 * threads switching in here ends the episode. */
static __always_inline void dq_close_at_switch_in(struct task_struct *next, __u32 cpu, __u64 now)
{
	__u64 cg, own;

	if (!tw_dequeue_model() || !nr_open)
		return;
	cg = watched_group(next, &own);
	if (cg)
		close_episode(cg, cpu, now, now);
}

/* The start of a timer run found a throttled run-queue with no episode:
 * open one at the kernel's own throttle stamp. The dequeue model: throttled
 * at enqueue or pick time, no thread switched out. Both: throttled before
 * the group was watched, maybe several periods before when the quota is
 * short for the CPUs (the kernel counts all of it, at the unthrottle). On
 * the task model the kernel's clock runs from the first thread frozen on
 * that run-queue (0 while none is); on the dequeue model from the throttle. */
static __always_inline void dq_open_at_throttle_stamp(struct cfs_rq *rq, __u64 cg, __u32 cpu,
						      __u64 now, __u64 tgp)
{
	__u64 clk = tw_cfs_rq_throttled_clock(rq);
	__s64 start;

	if (!clock_offset || !clk)
		return;
	start = (__s64)clk + clock_offset;
	if (start > 0 && (__u64)start < now)
		open_episode(cg, cpu, (__u64)start, tgp);
}

/* The end of a timer run found the run-queue unthrottled by it. The kernel
 * stopped its clock at rq_clock() inside unthrottle_cfs_rq(), which updated
 * the rq clock first; that clock only moves forward after, so it bounds the
 * unthrottle from above as the callback's end does. The earlier of the two
 * is used: under emulation the callback can stall for milliseconds after
 * the unthrottle (seen: 4.7 ms with the host busy), and the rq clock of a
 * CPU that stayed idle is exact. (On the task model the episode ends at the
 * first unmarked run after it opened, see unthrottled_at().) */
static __always_inline void dq_end_at_rq_clock(struct tw_episode *ep, struct cfs_rq *rq,
					       __u64 open, __u64 now)
{
	__u64 end, lower;
	__s64 clk;

	if (!tw_dequeue_model() || !clock_offset)
		return;
	/* The unthrottle came after the episode opened and after this run
	 * began (seen_ns, stamped at its start). */
	lower = ep->seen_ns > open ? ep->seen_ns : open;
	end = now;
	clk = (__s64)BPF_CORE_READ(rq, rq, clock) + clock_offset;
	if (clk > 0 && (__u64)clk > lower && (__u64)clk < end)
		end = (__u64)clk;
	if (end > open)
		end_episode(ep, open, end);
}

#endif
