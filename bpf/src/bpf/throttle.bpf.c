// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* throttlewatch: CFS bandwidth throttle freezes per thread and throttle
 * episodes per (cgroup, CPU), for the cgroups in the `watched` map only.
 *
 * Hot path (every context switch on the node): one field read of `prev`
 * and two global counters. Everything else runs only for a thread that is
 * being frozen or thawed, or while a watched group has an open episode.
 * The run-queue latency and cold-start part (runq.bpf.h) adds the state
 * of `prev` and three more counters while cgroups are watched.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "throttle.h"
#include "core_fixes.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by user space before load. */
const volatile __u32 ringbuf_wakeup_bytes = 0; /* 0: never wake the reader */
const volatile __u32 nr_cpus = 1; /* possible CPUs, for the timer-time scan */

#include "watched.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

/* Episode state and totals per (watched cgroup, CPU): the totals survive a
 * full ring buffer, so probe_throttled_ns never depends on delivery. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tw_episode_key);
	__type(value, struct tw_episode);
} episodes SEC(".maps");

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

/* Threads currently frozen, episodes currently open: while both are zero a
 * switch-in costs two loads. Maintained with atomics on the slow path. */
__u64 nr_frozen = 0;
__u64 nr_open = 0;
/* Throttled groups whose timers are followed (entries in bandwidth_timers). */
__u64 nr_tracked = 0;
/* Events the ring buffer could not take. */
__u64 lost_events = 0;
/* Dequeue model only: the callbacks of every task group's bandwidth timers
 * (sched_cfs_period_timer() and sched_cfs_slack_timer(), which
 * init_cfs_bandwidth() sets for every group, the root included), read from
 * the first switched-out task's group. A timer run with one of them is a
 * group's bandwidth timer, so a watched group is followed from its first
 * timer run, before any of its threads was switched out throttled (a
 * run-queue can be throttled at enqueue, e.g. when a thread is pinned onto
 * a CPU whose runtime is spent). 0 until learnt. */
__u64 period_timer_fn = 0;
__u64 slack_timer_fn = 0;

static __always_inline __u64 tg_cgroup_id(struct task_group *tg)
{
	return BPF_CORE_READ(tg, css.cgroup, kn, id);
}

/* The watched cgroup a task belongs to: its own cpu cgroup or the nearest
 * watched ancestor. 0 when none is watched. */
static __always_inline __u64 watched_group(struct task_struct *t, __u64 *own)
{
	struct task_group *tg = BPF_CORE_READ(t, se.cfs_rq, tg);
	__u64 id;
	int i;

	*own = 0;
	for (i = 0; i < TW_MAX_LEVELS && tg; i++) {
		id = tg_cgroup_id(tg);
		if (i == 0)
			*own = id;
		if (bpf_map_lookup_elem(&watched, &id))
			return id;
		tg = BPF_CORE_READ(tg, parent);
	}
	return 0;
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

static __always_inline void emit(struct tw_event *src)
{
	struct tw_event *e;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&lost_events, 1);
		return;
	}
	__builtin_memcpy(e, src, sizeof(*e));
	bpf_ringbuf_submit(e, ringbuf_wakeup_bytes &&
			   bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= ringbuf_wakeup_bytes ?
			   BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

static __always_inline void open_episode(__u64 cg, __u32 cpu, __u64 now, __u64 tg)
{
	struct tw_episode_key key = { .cgroup_id = cg, .cpu = cpu };
	struct tw_episode *ep, zero = {};

	ep = bpf_map_lookup_elem(&episodes, &key);
	if (!ep) {
		bpf_map_update_elem(&episodes, &key, &zero, BPF_NOEXIST);
		ep = bpf_map_lookup_elem(&episodes, &key);
		if (!ep)
			return;
	}
	/* The timer walk on one CPU and a switch-out on another can race to
	 * open the same episode: one wins. */
	if (ep->open_ns || !__sync_bool_compare_and_swap(&ep->open_ns, 0, now))
		return;
	ep->tg = tg;
	ep->seen_ns = 0;
	if (tg) {
		struct timer_runs fresh = { .cg = cg }, *runs;
		if (!bpf_map_update_elem(&bandwidth_timers, &tg, &fresh, BPF_NOEXIST))
			__sync_fetch_and_add(&nr_tracked, 1);
		runs = bpf_map_lookup_elem(&bandwidth_timers, &tg);
		if (runs)
			runs->cg = cg;
	}
	__sync_fetch_and_add(&nr_open, 1);
}

/* When was the group unthrottled? The kernel stops its clock in
 * unthrottle_cfs_rq(), called from the bandwidth period timer (or the
 * slack timer) of the throttled group; a thread of the group switches in
 * only after that, later still when other tasks hold the CPU. The
 * hrtimer_expire_entry program below records when those timers ran
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

/* The episode opened at `open` ended at `now`: count it, report it. */
static __always_inline void end_episode(struct tw_episode *ep, __u64 cg, __u32 cpu, __u64 open, __u64 now)
{
	struct tw_event ev = {};

	/* `open` is the value the caller read: a closer on another CPU may
	 * have ended this episode since (then open_ns no longer matches). */
	if (!open || !__sync_bool_compare_and_swap(&ep->open_ns, open, 0))
		return;
	ep->last_open_ns = open;
	ep->last_end_ns = now;
	__sync_fetch_and_add(&ep->total_ns, now - open);
	__sync_fetch_and_add(&ep->count, 1);
	__sync_fetch_and_sub(&nr_open, 1);

	ev.kind = TW_EV_EPISODE;
	ev.cpu_out = cpu;
	ev.cpu_in = bpf_get_smp_processor_id();
	ev.start_ns = open;
	ev.end_ns = now;
	ev.cgroup_id = cg;
	emit(&ev);
}

/* Close the episode of (cg, cpu) if one is open and began no later than
 * `not_after` (a thread frozen in an earlier episode must not end a later one). */
static __always_inline void close_episode(__u64 cg, __u32 cpu, __u64 not_after, __u64 now)
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
	end_episode(ep, cg, cpu, open, unthrottled_at(ep->tg, open, ep->seen_ns, now));
}

static __always_inline struct frozen *frozen_get(struct task_struct *t, bool direct, bool create)
{
	struct frozen zero = {}, *f;
	__u32 tid;

	tid = direct ? t->pid : BPF_CORE_READ(t, pid);
	f = bpf_map_lookup_elem(&frozen_by_tid, &tid);
	if (!f && create) {
		bpf_map_update_elem(&frozen_by_tid, &tid, &zero, BPF_NOEXIST);
		f = bpf_map_lookup_elem(&frozen_by_tid, &tid);
	}
	return f;
}

/* bpf_ktime_get_ns() - rq_clock(), refreshed on every freeze: the kernel
 * stamps throttles with rq_clock() (sched_clock), the probe with
 * CLOCK_MONOTONIC. At a switch the rq clock was just updated by
 * __schedule(), so the difference is exact to a few microseconds. */
__s64 clock_offset = 0;

/* Dequeue model, the first switches after load: an offset for run-queues
 * that the timer walk finds throttled before any freeze was seen (any
 * switch will do: __schedule() has just updated the rq clock), and the
 * bandwidth timers' callbacks. */
static __always_inline void learn_at_switch(struct task_struct *prev)
{
	struct cfs_rq *cfs = BPF_CORE_READ(prev, se.cfs_rq);
	struct task_group *tg;
	struct rq *rq;
	__u64 clk, p, sl;

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
	if (!tw_task_based_throttle()) /* only the dequeue model's walk uses it */
		clock_offset = (__s64)now - (__s64)BPF_CORE_READ(prev, se.cfs_rq, rq, clock);
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
 * Returns 1 when `next` was frozen (this switch-in is its thaw). */
static __always_inline int on_thaw(struct task_struct *next, bool direct)
{
	struct tw_event ev = {};
	struct frozen *f;
	__u64 now = bpf_ktime_get_ns();
	__u32 cpu = bpf_get_smp_processor_id();
	__u64 own;

	if (!tw_task_based_throttle() && nr_open) {
		/* Dequeue model: the throttled group has nothing runnable on
		 * this CPU until it is unthrottled, so any of its threads
		 * switching in here ends the episode. */
		__u64 cg = watched_group(next, &own);
		if (cg)
			close_episode(cg, cpu, now, now);
	}
	if (!nr_frozen)
		return 0;
	f = frozen_get(next, direct, false);
	if (!f || !f->start_ns)
		return 0;

	/* Task model: the episode of the CPU it was frozen on ends with the
	 * first of its frozen threads to run again, wherever that is. */
	close_episode(f->cgroup_id, f->cpu_out, f->start_ns, now);

	ev.kind = TW_EV_FREEZE;
	ev.tid = BPF_CORE_READ(next, pid);
	ev.tgid = BPF_CORE_READ(next, tgid);
	ev.cpu_out = f->cpu_out;
	ev.cpu_in = cpu;
	ev.throttled_level = f->throttled_level;
	ev.start_ns = f->start_ns;
	ev.end_ns = now;
	ev.cgroup_id = f->cgroup_id;
	ev.task_cgroup_id = tg_cgroup_id(BPF_CORE_READ(next, se.cfs_rq, tg));
	ev.throttled_cgroup_id = f->throttled_cgroup_id;
	bpf_probe_read_kernel_str(ev.comm, sizeof(ev.comm), next->comm);
	f->start_ns = 0;
	__sync_fetch_and_sub(&nr_frozen, 1);
	emit(&ev);
	return 1;
}

#include "runq.bpf.h"

static __always_inline int handle_switch(struct task_struct *prev, struct task_struct *next, bool direct)
{
	bool frozen, thawed = false;

	if (tw_task_based_throttle()) {
		struct task_struct___tw618 *p = (void *)prev;
		frozen = direct ? p->throttled : BPF_CORE_READ(p, throttled);
	} else {
		/* Switched out while runnable, under a throttled ancestor. */
		frozen = tw_task_state(prev) == 0 &&
			 tw_cfs_rq_throttle_count(BPF_CORE_READ(prev, se.cfs_rq)) > 0;
	}
	if (frozen)
		on_freeze(prev, direct);
	else if (!tw_task_based_throttle() && (!clock_offset || !period_timer_fn))
		learn_at_switch(prev);
	if (nr_frozen || nr_open)
		thawed = on_thaw(next, direct);
	if (direct)
		runq_switch(prev, next, frozen, thawed);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(tw_switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return handle_switch(prev, next, true);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(tw_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return handle_switch(prev, next, false);
}

/* Makes the skeleton emit the ABI type for user space. */
struct tw_event _tw_event_abi = {};

/* Records when the CFS bandwidth timers of groups with open episodes run.
 * Fires for every hrtimer expiry on the node (a few thousand a second, not
 * per context switch) and returns at once while no episode is open. */
#define TW_MAX_SCAN_CPUS 512

/* Start of a timer run, one CPU: an open episode whose run-queue is no
 * longer throttled ended at the first run after it opened (no thread of the
 * group had to come back to that CPU); one still throttled was not ended
 * before this run. Dequeue model only: a throttled run-queue without an
 * episode (throttled at enqueue or pick time, no thread switched out) opens
 * one at the kernel's own throttle stamp. */
static __always_inline void at_run_start(struct tw_episode *ep, struct cfs_rq *rq, __u64 cg, __u32 cpu,
					 __u64 open, __u64 now, __u64 tgp)
{
	bool throttled = tw_cfs_rq_throttled(rq);
	__s64 start;

	if (open) {
		if (!throttled)
			close_episode(cg, cpu, open, now);
		else
			ep->seen_ns = now;
		return;
	}
	if (!throttled || tw_task_based_throttle() || !clock_offset)
		return;
	start = (__s64)tw_cfs_rq_throttled_clock(rq) + clock_offset;
	if (start > 0 && (__u64)start < now)
		open_episode(cg, cpu, (__u64)start, tgp);
}

/* At the end of a timer run, for each open episode of the group:
 *  - its run-queue is still throttled with no runtime handed to it: this
 *    run did not end it (a slack-timer run, or a period run with too little
 *    quota for every CPU); marking it keeps a later close from ending the
 *    episode at this run's stamp;
 *  - dequeue model: its run-queue was unthrottled by this run. The kernel
 *    stopped its clock at rq_clock() inside unthrottle_cfs_rq(), which
 *    updated the rq clock first; that clock only moves forward after, so
 *    it bounds the unthrottle from above as the callback's end does. The
 *    earlier of the two is used: under emulation the callback can stall
 *    for milliseconds after the unthrottle (seen: 4.7 ms with the host
 *    busy), and the rq clock of a CPU that stayed idle is exact. */
static __always_inline void at_run_end(struct tw_episode *ep, struct cfs_rq *rq, __u64 cg, __u32 cpu,
				       __u64 open, __u64 now)
{
	__u64 end, lower;
	__s64 clk;

	if (tw_cfs_rq_throttled(rq)) {
		if (tw_cfs_rq_runtime_remaining(rq) <= 0)
			ep->seen_ns = now;
		return;
	}
	if (tw_task_based_throttle() || !clock_offset)
		return;
	/* The unthrottle came after the episode opened and after this run
	 * began (seen_ns, stamped at its start). */
	lower = ep->seen_ns > open ? ep->seen_ns : open;
	end = now;
	clk = (__s64)BPF_CORE_READ(rq, rq, clock) + clock_offset;
	if (clk > 0 && (__u64)clk > lower && (__u64)clk < end)
		end = (__u64)clk;
	if (end > open)
		end_episode(ep, cg, cpu, open, end);
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

	if (!rqs)
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
			at_run_end(ep, rq, cg, i, open, now);
	}
}

/* A bandwidth timer of a watched group not followed yet: follow it. */
static __always_inline struct timer_runs *follow_timer(__u64 tg)
{
	struct timer_runs fresh = {};

	fresh.cg = tg_cgroup_id((struct task_group *)tg);
	if (!bpf_map_lookup_elem(&watched, &fresh.cg))
		return NULL;
	if (!bpf_map_update_elem(&bandwidth_timers, &tg, &fresh, BPF_NOEXIST))
		__sync_fetch_and_add(&nr_tracked, 1);
	return bpf_map_lookup_elem(&bandwidth_timers, &tg);
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
		/* The callback says which timer this is: any other hrtimer
		 * costs one load and two compares. */
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

/* Make the skeleton emit the run-queue / cold-start ABI types too. */
struct tw_runq _tw_runq_abi = {};
struct tw_coldstart _tw_coldstart_abi = {};
