/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* (watched cgroup, CPU) throttle episodes: what the kernel sums into
 * cpu.stat throttled_time. An episode opens when the group's run-queue on a
 * CPU is throttled and ends when that run-queue is unthrottled, which the
 * group's bandwidth timer runs tell (timers.bpf.h). The totals stay in the
 * `episodes` map, so they survive a full ring buffer. */
#ifndef __THROTTLEWATCH_EPISODES_BPF_H
#define __THROTTLEWATCH_EPISODES_BPF_H

#include "full.bpf.h"

/* Sized at load: max_containers x CPUs (user space, load.rs). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tw_episode_key);
	__type(value, struct tw_episode);
} episodes SEC(".maps");

/* When the bandwidth timers of a throttled group last ran (the moment the
 * kernel unthrottles and stops its clock), keyed by task_group address. */
#define TW_TIMER_RUNS 4
struct timer_runs {
	/* the last few period timer runs, a ring indexed by `next` */
	__u64 period_ns[TW_TIMER_RUNS];
	__u64 slack_ns;
	/* the watched cgroup whose episodes this (throttled) group ends */
	__u64 cg;
	__u32 next;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct timer_runs);
} bandwidth_timers SEC(".maps");

/* Episodes currently open: while zero (and no thread is frozen) a
 * switch-in costs two loads. Maintained with atomics on the slow path. */
__u64 nr_open = 0;
/* Throttled groups whose timers are followed (entries in bandwidth_timers). */
__u64 nr_tracked = 0;

/* Follow the bandwidth timers of `tg` for the watched cgroup `cg`. */
static __always_inline struct timer_runs *track_timers(__u64 tg, __u64 cg)
{
	struct timer_runs fresh = { .cg = cg }, *runs;
	bool created;

	runs = tw_lookup_or_init(&bandwidth_timers, &tg, &fresh, &created);
	if (!runs)
		tw_count_full(TW_FULL_BANDWIDTH_TIMERS);
	if (created)
		__sync_fetch_and_add(&nr_tracked, 1);
	return runs;
}

static __always_inline void open_episode(__u64 cg, __u32 cpu, __u64 now, __u64 tg)
{
	struct tw_episode_key key = { .cgroup_id = cg, .cpu = cpu };
	struct tw_episode *ep, zero = {};
	struct timer_runs *runs;

	ep = tw_lookup_or_init(&episodes, &key, &zero, NULL);
	if (!ep) {
		tw_count_full(TW_FULL_EPISODES);
		return;
	}
	/* The timer walk on one CPU and a switch-out on another can race to
	 * open the same episode: one wins. */
	if (ep->open_ns || !__sync_bool_compare_and_swap(&ep->open_ns, 0, now))
		return;
	ep->tg = tg;
	ep->seen_ns = 0;
	if (tg) {
		runs = track_timers(tg, cg);
		if (runs)
			runs->cg = cg;
	}
	__sync_fetch_and_add(&nr_open, 1);
}

/* When was the group unthrottled? The kernel stops its clock in
 * unthrottle_cfs_rq(), called from the bandwidth period timer (or the
 * slack timer) of the throttled group; a thread of the group switches in
 * only after that, later still when other tasks hold the CPU. The
 * hrtimer_expire programs (timers.bpf.h) record when those timers ran
 * (CLOCK_MONOTONIC, like bpf_ktime_get_ns()). Without a record, the last
 * period boundary (the timer was forwarded when it ran: expires - period)
 * stands in; without either, the switch-in does. */
static __always_inline __u64 unthrottled_at(__u64 tgp, __u64 open, __u64 seen, __u64 now)
{
	struct task_group *tg = (void *)tgp;
	struct timer_runs *runs;
	__s64 period, expires;
	__u64 best = 0, t;
	int i;

	if (!tg)
		return now;
	/* The FIRST timer run after the episode opened is the unthrottle: a
	 * thread that waited for a CPU past later boundaries must not stretch
	 * the episode over them. */
	runs = bpf_map_lookup_elem(&bandwidth_timers, &tgp);
	if (runs) {
		for (i = 0; i < TW_TIMER_RUNS; i++) {
			t = runs->period_ns[i];
			if (t > open && t > seen && t <= now && (!best || t < best))
				best = t;
		}
		t = runs->slack_ns;
		if (t > open && t > seen && t <= now && (!best || t < best))
			best = t;
		if (best)
			return best;
	}
	period = BPF_CORE_READ(tg, cfs_bandwidth.period);
	expires = BPF_CORE_READ(tg, cfs_bandwidth.period_timer.node.expires);
	t = (__u64)(expires - period);
	if (period > 0 && expires > period && t > open && t > seen && t <= now)
		return t;
	return now;
}

/* The episode opened at `open` ended at `now`: count it. `open` is the
 * value the caller read: a closer on another CPU may have ended this
 * episode since (then open_ns no longer matches). */
static __always_inline void end_episode(struct tw_episode *ep, __u64 open, __u64 now)
{
	if (!open || !__sync_bool_compare_and_swap(&ep->open_ns, open, 0))
		return;
	ep->last_open_ns = open;
	ep->last_end_ns = now;
	__sync_fetch_and_add(&ep->total_ns, now - open);
	__sync_fetch_and_add(&ep->count, 1);
	__sync_fetch_and_sub(&nr_open, 1);
}

/* Close the episode of (cg, cpu) if one is open and began no later than
 * `not_after` (a thread frozen in an earlier episode must not end a later one).
 * `exact`: `now` is itself the unthrottle, give or take the wake-up (see
 * on_thaw()); else the timer run that unthrottled the group bounds it. */
static __always_inline void close_episode_at(__u64 cg, __u32 cpu, __u64 not_after, __u64 now,
					     bool exact)
{
	struct tw_episode_key key = { .cgroup_id = cg, .cpu = cpu };
	struct tw_episode *ep;
	__u64 open;

	ep = bpf_map_lookup_elem(&episodes, &key);
	if (!ep)
		return;
	open = ep->open_ns;
	if (!open || open > not_after || now < open)
		return;
	end_episode(ep, open, exact ? now : unthrottled_at(ep->tg, open, ep->seen_ns, now));
}

static __always_inline void close_episode(__u64 cg, __u32 cpu, __u64 not_after, __u64 now)
{
	close_episode_at(cg, cpu, not_after, now, false);
}

#endif
