/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The bandwidth timers of throttled groups: their runs end episodes.
 * hrtimer_expire_entry/_exit fire for every hrtimer expiry on the node (a
 * few thousand a second, not per context switch); they return at once while
 * nothing is followed, and, once the timers' callbacks are known
 * (dequeue.bpf.h), any other hrtimer costs one load and two compares. */
#ifndef __THROTTLEWATCH_TIMERS_BPF_H
#define __THROTTLEWATCH_TIMERS_BPF_H

/* Set by user space before load: possible CPUs, for the run-queue walk. */
const volatile __u32 nr_cpus = 1;
#define TW_MAX_SCAN_CPUS 512

/* Start of a timer run, one CPU: an open episode whose run-queue is no
 * longer throttled ended at the first run after it opened (no thread of the
 * group had to come back to that CPU); one still throttled was not ended
 * before this run. */
static __always_inline void at_run_start(struct tw_episode *ep, struct cfs_rq *rq, __u64 cg, __u32 cpu,
					 __u64 open, __u64 now, __u64 tgp)
{
	bool throttled = tw_cfs_rq_throttled(rq);

	if (open) {
		if (!throttled)
			close_episode(cg, cpu, open, now);
		else
			ep->seen_ns = now;
		return;
	}
	if (throttled)
		dq_open_at_throttle_stamp(rq, cg, cpu, now, tgp);
}

/* At the end of a timer run, for each open episode of the group: its
 * run-queue still throttled with no runtime handed to it was not ended by
 * this run (a slack-timer run, or a period run with too little quota for
 * every CPU); marking it keeps a later close from ending the episode at this
 * run's stamp. */
static __always_inline void at_run_end(struct tw_episode *ep, struct cfs_rq *rq, __u64 open, __u64 now)
{
	if (tw_cfs_rq_throttled(rq)) {
		if (tw_cfs_rq_runtime_remaining(rq) <= 0)
			ep->seen_ns = now;
		return;
	}
	if (tw_dequeue_model()) {
		dq_end_at_rq_clock(ep, rq, open, now);
		return;
	}
	/* The task model: no longer throttled, ended at the stamp a thaw would
	 * take (an earlier run that unthrottled it, when its threads have not
	 * run since: remote CPUs unthrottle after the run, from an IPI; else
	 * this one). An episode opened at the throttle stamp has no frozen
	 * thread of ours to end it. */
	end_episode(ep, open, unthrottled_at(ep->tg, open, ep->seen_ns, now));
}

/* Has the group a throttled run-queue (throttle_cfs_rq() puts it on the
 * group's list, the unthrottle takes it off)? A followed group that is not
 * throttled costs one read per timer run, not a walk of every CPU. */
static __always_inline bool group_throttled(__u64 tgp)
{
	struct task_group *tg = (void *)tgp;
	__u64 head = tgp + bpf_core_field_offset(struct task_group, cfs_bandwidth) +
		     bpf_core_field_offset(struct cfs_bandwidth, throttled_cfs_rq);
	__u64 next = (__u64)BPF_CORE_READ(tg, cfs_bandwidth.throttled_cfs_rq.next);

	return next && next != head;
}

/* Walk the throttled group's per-CPU run-queues at the start or the end of
 * one of its timer runs (the end only looks at open episodes). */
static __always_inline void walk_run_queues(__u64 tgp, __u64 cg, __u64 now, bool at_exit)
{
	struct task_group *tg = (void *)tgp;
	struct cfs_rq **rqs = BPF_CORE_READ(tg, cfs_rq);
	struct tw_episode_key key = { .cgroup_id = cg };
	struct tw_episode *ep;
	struct cfs_rq *rq;
	__u64 open;
	__u32 i;

	if (!rqs || (!at_exit && !nr_open && !group_throttled(tgp)))
		return;
	for (i = 0; i < TW_MAX_SCAN_CPUS; i++) {
		if (i >= nr_cpus)
			break;
		key.cpu = i;
		ep = bpf_map_lookup_elem(&episodes, &key);
		open = ep ? ep->open_ns : 0;
		if (at_exit && !open)
			continue;
		rq = NULL;
		bpf_probe_read_kernel(&rq, sizeof(rq), &rqs[i]);
		if (!rq)
			continue;
		if (!at_exit)
			at_run_start(ep, rq, cg, i, open, now, tgp);
		else if (ep)
			at_run_end(ep, rq, open, now);
	}
}

/* A bandwidth timer of a watched group not followed yet: follow it. */
static __always_inline struct timer_runs *follow_timer(__u64 tg)
{
	__u64 cg = tg_cgroup_id((struct task_group *)tg);

	if (!bpf_map_lookup_elem(&watched, &cg))
		return NULL;
	return track_timers(tg, cg);
}

/* At the start and at the end of a timer run the run-queues are walked; at
 * its end the run is also recorded: the kernel unthrottles at the end of the
 * callback (distribute_cfs_runtime() is its last step), so the exit is the
 * closer stamp where the callback is slow (seen under emulation: ~1 ms). */
static __always_inline int record_timer_run(__u64 timer, __u64 fn, bool at_exit)
{
	__u64 base, tg, t;
	struct timer_runs *runs;
	bool slack = false;

	base = timer - bpf_core_field_offset(struct task_group, cfs_bandwidth);
	if (period_timer_fn) {
		/* The callback says which timer this is. */
		if (fn == period_timer_fn) {
			tg = base - bpf_core_field_offset(struct cfs_bandwidth, period_timer);
		} else if (fn == slack_timer_fn) {
			tg = base - bpf_core_field_offset(struct cfs_bandwidth, slack_timer);
			slack = true;
		} else {
			return 0;
		}
		runs = bpf_map_lookup_elem(&bandwidth_timers, &tg);
		if (!runs && !at_exit)
			runs = follow_timer(tg);
	} else {
		if (!nr_open && !nr_tracked)
			return 0;
		tg = base - bpf_core_field_offset(struct cfs_bandwidth, period_timer);
		runs = bpf_map_lookup_elem(&bandwidth_timers, &tg);
		if (!runs) {
			tg = base - bpf_core_field_offset(struct cfs_bandwidth, slack_timer);
			runs = bpf_map_lookup_elem(&bandwidth_timers, &tg);
			slack = true;
		}
	}
	if (!runs)
		return 0;
	t = bpf_ktime_get_ns();
	if (runs->cg)
		walk_run_queues(tg, runs->cg, t, at_exit);
	if (!at_exit)
		return 0;
	if (slack) {
		runs->slack_ns = t;
	} else {
		runs->period_ns[runs->next & (TW_TIMER_RUNS - 1)] = t;
		runs->next++;
	}
	return 0;
}

SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(tw_hrtimer_btf, struct hrtimer *timer)
{
	return record_timer_run((__u64)timer, period_timer_fn ? (__u64)timer->function : 0, false);
}

SEC("raw_tp/hrtimer_expire_entry")
int BPF_PROG(tw_hrtimer_raw, struct hrtimer *timer)
{
	return record_timer_run((__u64)timer,
				period_timer_fn ? (__u64)BPF_CORE_READ(timer, function) : 0, false);
}

SEC("tp_btf/hrtimer_expire_exit")
int BPF_PROG(tw_hrtimer_exit_btf, struct hrtimer *timer)
{
	return record_timer_run((__u64)timer, period_timer_fn ? (__u64)timer->function : 0, true);
}

SEC("raw_tp/hrtimer_expire_exit")
int BPF_PROG(tw_hrtimer_exit_raw, struct hrtimer *timer)
{
	return record_timer_run((__u64)timer,
				period_timer_fn ? (__u64)BPF_CORE_READ(timer, function) : 0, true);
}

#endif
