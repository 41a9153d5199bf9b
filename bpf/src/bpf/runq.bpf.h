/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Run-queue latency of watched cgroups (ABI: runq.h). tp_btf only (task
 * local storage); its sched_switch part runs inside throttle.bpf.c's one
 * sched_switch program (a second program would cost every switch on the
 * node another invocation), which passes whether `prev` was frozen and
 * whether `next` thawed.
 *
 * Run-queue wait = sched_waking / sched_wakeup_new, or a switch-out while
 * runnable and not throttled (preemption, yield) -> the next switch-in.
 * A wait that ends in a thaw (the thread was frozen by CFS bandwidth
 * control) is a freeze, not queueing, and is only counted as `excluded`.
 * On the dequeue model a waiting thread is frozen with its run-queue
 * without a switch: the part of its wait that the run-queue's episodes
 * covered is reported as a queued freeze and left out.
 *
 * Cost: while no cgroup is watched every entry point returns after one
 * load. Otherwise a wakeup first checks the task's group against the last
 * group seen on this CPU (per-CPU array, no task storage for unwatched
 * tasks while their group repeats); whether a task is watched is cached in
 * its task storage (valid while `watch_gen` is unchanged; user space bumps
 * it on watch and unwatch, cgroup_attach_task bumps it when tasks move), so
 * a wakeup costs one task-storage lookup and a switch-in one more only
 * while some watched thread waits (`nr_waiting`). Histograms are per-CPU
 * entries that user space creates; the kernel only looks them up.
 */
#ifndef __THROTTLEWATCH_RUNQ_BPF_H
#define __THROTTLEWATCH_RUNQ_BPF_H

#define TW_GEN_VALID (1ULL << 63)

/* Set before load: false keeps the runq / cold-start paths out of the
 * verified program entirely (raw_tp fallback, or a kernel that refuses them). */
const volatile bool runq_enabled = false;

/* Written by user space (atomics on the mmapped .bss). */
__u64 nr_watched = 0;
__u64 watch_gen = 0;
__u64 runq_epoch = 0;
/* watched threads with a pending run-queue wait (kernel's count) */
__u64 nr_waiting = 0;

/* Per-task state of the run-queue and cold-start features. */
struct tw_task {
	__u64 gen;	/* watch_gen | TW_GEN_VALID when `cg` was computed */
	__u64 cg;	/* watched cgroup of the task, 0: not watched */
	__u64 wait_ns;	/* start of a pending run-queue wait, 0: none */
	__u64 wait_cg;	/* the cgroup the wait is charged to */
	__u64 cs_cg;	/* cold start this thread counts for, 0: none */
	__u64 cs_state;	/* what it is doing for the cold start: enum tw_cs_thread */
	/* dequeue model: the throttle episodes of (wait_cg, wait_cpu) when
	 * the wait began (cumulative total and count, the open one's start) */
	__u64 ep_total0;
	__u64 ep_count0;
	__u64 ep_open0;
	__u64 seg_ns;		/* when that snapshot was taken */
	__u64 frozen_acc;	/* throttled part of the wait on earlier CPUs */
	__u32 wait_cpu;
	__u32 pad;
	/* cold start, dequeue model: the cold start's queued_ns when this
	 * thread began to wait (see cs_move() in coldstart.bpf.h) */
	__u64 cs_queued0;
	/* wake-up chains (wakeups.bpf.h): the pending wakeup (sched_waking
	 * until the switch-in; 0: none) and who did it */
	__u64 wake_ns;
	__u64 waker_cg;
	__u32 waker_tid;
	__u32 waker_tgid;
	__u32 waker_kind;
	/* the edge of the last wakeup that switched in (the hop this thread
	 * works on until its next wakeup), and whether a freeze was charged
	 * to it yet */
	__u32 hop_kind;		/* 0: none */
	__u32 hop_tid;
	__u32 hop_tgid;
	__u32 hop_frozen;
	__u32 pad2;
	char waker_comm[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tw_task);
} tw_tasks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct tw_runq);
} runq_hist SEC(".maps");

/* The task's storage, if it has one, with an up-to-date watched cgroup.
 * Only looked up here: the callers run in sched_switch and sched_wakeup
 * with the run-queue lock held, where creating task storage is not safe
 * before Linux 6.4 (a kmalloc that can wake kswapd; see frozen_by_tid in
 * freeze.bpf.h). Watched tasks get their storage in process context
 * instead: task_storage_create() below, at fork, exec and cgroup attach,
 * and from the task iterator user space runs when it adds a watched group. */
static __always_inline struct tw_task *task_fresh(struct task_struct *t, struct tw_task *ts)
{
	__u64 gen = watch_gen | TW_GEN_VALID, own;

	if (ts && ts->gen != gen) {
		ts->cg = watched_group(t, &own);
		ts->gen = gen;
	}
	return ts;
}

static __always_inline struct tw_task *task_cached(struct task_struct *t)
{
	return task_fresh(t, bpf_task_storage_get(&tw_tasks, t, 0, 0));
}

/* The storage of a switch's two tasks, each looked up at most once by the
 * run-queue and cold-start parts of the sched_switch program, and only by
 * the first part that needs it. */
struct tw_switch_tasks {
	struct tw_task *prev;
	struct tw_task *next;
	bool prev_known;
	bool next_known;
};

static __always_inline struct tw_task *storage_once(struct task_struct *t, struct tw_task **ts, bool *known)
{
	if (!*known) {
		*ts = bpf_task_storage_get(&tw_tasks, t, 0, 0);
		*known = true;
	}
	return *ts;
}

static __always_inline struct tw_task *switch_prev(struct tw_switch_tasks *s, struct task_struct *prev)
{
	return storage_once(prev, &s->prev, &s->prev_known);
}

static __always_inline struct tw_task *switch_next(struct tw_switch_tasks *s, struct task_struct *next)
{
	return storage_once(next, &s->next, &s->next_known);
}

/* The last task group looked up on this CPU and its watched cgroup: wakeups
 * of unwatched tasks cost an array lookup while their group repeats. */
struct tg_cache {
	__u64 tg;
	__u64 gen;
	__u64 cg;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tg_cache);
} tg_last SEC(".maps");

static __always_inline __u64 task_group_watched(struct task_struct *t)
{
	__u64 gen = watch_gen | TW_GEN_VALID, own, cg, tg;
	struct tg_cache *c;
	__u32 zero = 0;

	/* tp_btf only: plain loads, no probe-read helper calls on this path. */
	tg = (__u64)t->se.cfs_rq->tg;
	c = bpf_map_lookup_elem(&tg_last, &zero);
	if (c && c->tg == tg && c->gen == gen)
		return c->cg;
	cg = watched_group(t, &own);
	if (c) {
		c->tg = tg;
		c->gen = gen;
		c->cg = cg;
	}
	return cg;
}

/* Process context only (no scheduler lock held): storage for a task of a
 * watched group, so that the scheduler-side programs find it. */
static __always_inline void task_storage_create(struct task_struct *t)
{
	if (task_group_watched(t))
		bpf_task_storage_get(&tw_tasks, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
}

static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0;

	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r < TW_RUNQ_SLOTS ? r : TW_RUNQ_SLOTS - 1;
}

/* Dequeue model: the episodes of the run-queue a waiting task is on, so the
 * switch-in can tell how much of the wait was a freeze. */
static __always_inline void snapshot_wait(struct tw_task *ts, __u32 cpu, __u64 now)
{
	struct tw_episode_key key = { .cgroup_id = ts->wait_cg, .cpu = cpu };
	struct tw_episode *ep = bpf_map_lookup_elem(&episodes, &key);

	ts->wait_cpu = cpu;
	ts->seg_ns = now;
	ts->ep_total0 = ep ? ep->total_ns : 0;
	ts->ep_count0 = ep ? ep->count : 0;
	ts->ep_open0 = ep ? ep->open_ns : 0;
}

/* Dequeue model: the throttled part of the wait since the last snapshot:
 * episodes of that run-queue that ended since, less the part before the
 * snapshot of one that was open then. */
static __always_inline __u64 wait_covered(struct tw_task *ts, __u64 now, struct tw_episode **epp)
{
	struct tw_episode_key key = { .cgroup_id = ts->wait_cg, .cpu = ts->wait_cpu };
	struct tw_episode *ep;
	__u64 frozen, before = 0;

	ep = bpf_map_lookup_elem(&episodes, &key);
	*epp = ep;
	if (!ep || ep->count == ts->ep_count0 || ep->total_ns <= ts->ep_total0)
		return 0;
	frozen = ep->total_ns - ts->ep_total0;
	if (ts->ep_open0 && ts->ep_open0 < ts->seg_ns)
		before = ts->seg_ns - ts->ep_open0;
	if (frozen <= before)
		return 0;
	frozen -= before;
	if (now > ts->seg_ns && frozen > now - ts->seg_ns)
		frozen = now - ts->seg_ns;
	return frozen;
}

static __always_inline void start_wait(struct tw_task *ts, __u64 cg, __u32 cpu, __u64 now)
{
	if (ts->wait_ns)
		return;
	ts->wait_ns = now;
	ts->wait_cg = cg;
	if (tw_dequeue_model()) {
		ts->frozen_acc = 0;
		snapshot_wait(ts, cpu, now);
	}
	__sync_fetch_and_add(&nr_waiting, 1);
}

/* Dequeue model: a waiting watched task moves to another CPU (load
 * balancing, or an affinity change such as a thread pinning itself): keep
 * what was throttled on the old run-queue, follow the new one. */
SEC("tp_btf/sched_migrate_task")
int BPF_PROG(tw_migrate_btf, struct task_struct *p, int dest_cpu)
{
	struct tw_episode *ep;
	struct tw_task *ts;
	__u64 now;

	if (!runq_enabled || !nr_waiting || !tw_dequeue_model())
		return 0;
	ts = bpf_task_storage_get(&tw_tasks, p, 0, 0);
	if (!ts || !ts->wait_ns || ts->wait_cpu == (__u32)dest_cpu)
		return 0;
	now = bpf_ktime_get_ns();
	ts->frozen_acc += wait_covered(ts, now, &ep);
	snapshot_wait(ts, (__u32)dest_cpu, now);
	return 0;
}

/* Wakeups: a watched task starts waiting, unless its hierarchy is throttled
 * right now (then it waits for the unthrottle: a freeze, not queueing).
 * The sched_waking / sched_wakeup_new programs are in throttle.bpf.c (with
 * the cold start's and the wake-up chains').
 * Returns the task's storage when its group is watched (0: not watched, or
 * no storage), for the cold-start part to reuse. */
static __always_inline struct tw_task *on_wakeup(struct task_struct *p)
{
	struct tw_task *ts;

	if (!runq_enabled || !nr_watched || !task_group_watched(p))
		return 0;
	ts = task_cached(p);
	if (!ts || !ts->cg || ts->wait_ns)
		return ts;
	if (tw_woken_into_freeze(p))
		return ts;
	start_wait(ts, ts->cg, p->thread_info.cpu, bpf_ktime_get_ns());
	return ts;
}

/* Tasks that change cgroup must have their cached watched cgroup
 * recomputed; a task moved into a watched group gets its storage (the
 * tracepoint runs in the writer's process context). */
SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(tw_cgroup_attach_btf, struct cgroup *dst, const char *path, struct task_struct *task, bool threadgroup)
{
	if (runq_enabled && nr_watched) {
		__sync_fetch_and_add(&watch_gen, 1);
		task_storage_create(task);
	}
	return 0;
}

/* Run by user space (a read of the iterator) right after it adds a group
 * to the watch map: gives the tasks already in watched groups their
 * storage, in the reader's process context. */
SEC("iter/task")
int tw_iter_watched(struct bpf_iter__task *ctx)
{
	struct task_struct *t = ctx->task;

	if (runq_enabled && nr_watched && t)
		task_storage_create(t);
	return 0;
}

/* `prev` is switched out runnable and not throttled: preempted (or yielded). */
static __always_inline void on_preempt(struct task_struct *prev, struct task_struct *next, __u64 now,
				       struct tw_switch_tasks *s)
{
	struct tw_task *ts, *nts;
	struct tw_runq *h;
	__u64 cg, ncg = 0;

	ts = task_fresh(prev, switch_prev(s, prev));
	if (!ts || !ts->cg)
		return;
	cg = ts->cg;
	start_wait(ts, cg, bpf_get_smp_processor_id(), now);
	h = bpf_map_lookup_elem(&runq_hist, &cg);
	if (!h)
		return;
	if (next->pid) {
		/* watched tasks have storage (unwatched ones: none, "host") */
		nts = task_fresh(next, switch_next(s, next));
		if (nts)
			ncg = nts->cg;
	}
	if (ncg == cg)
		h->preempt_same++;
	else if (ncg)
		h->preempt_other++;
	else
		h->preempt_host++;
}

/* Dequeue model: how much of the wait [w, now] of `next` was its group's
 * run-queue throttled? A thread queued behind the running one is frozen
 * with the whole run-queue without being switched out: this reports that
 * freeze (start_ns: the throttle in the wait when there was just one on one
 * CPU, else the wait's start; end_ns - start_ns: the throttled time). */
static __always_inline __u64 queued_freeze(struct task_struct *next, struct tw_task *ts, __u64 w, __u64 now)
{
	struct tw_freeze_event ev = {};
	struct tw_episode *ep;
	struct task_group *tg = 0;
	__u64 frozen, from;

	frozen = ts->frozen_acc + wait_covered(ts, now, &ep);
	if (!frozen)
		return 0;
	if (frozen > now - w)
		frozen = now - w;
	from = w;
	if (ep && !ts->frozen_acc && !ts->ep_open0 && ep->count == ts->ep_count0 + 1 &&
	    ep->last_open_ns > w)
		from = ep->last_open_ns;
	if (ep)
		tg = (void *)ep->tg;
	ev.hdr.kind = TW_EV_FREEZE_QUEUED;
	ev.hdr.tid = next->pid;
	ev.hdr.tgid = next->tgid;
	ev.hdr.cpu = bpf_get_smp_processor_id();
	ev.hdr.cgroup_id = ts->wait_cg;
	ev.cpu_out = ts->wait_cpu;
	ev.start_ns = from;
	ev.end_ns = from + frozen;
	ev.task_cgroup_id = tg_cgroup_id(BPF_CORE_READ(next, se.cfs_rq, tg));
	if (tg) {
		ev.throttled_cgroup_id = tg_cgroup_id(tg);
		ev.throttled_level = BPF_CORE_READ(tg, css.cgroup, level);
	}
	bpf_probe_read_kernel_str(ev.hdr.comm, sizeof(ev.hdr.comm), next->comm);
	emit(&ev);
	return frozen;
}

/* `next` switches in: end its wait, if any. `thawed`: it was frozen.
 * *covered: the part of the wait its run-queue was throttled (dequeue
 * model; the cold-start split moves it to frozen). */
static __always_inline void on_runq_in(struct task_struct *next, bool thawed, __u64 now,
				       __u64 *covered, struct tw_switch_tasks *s)
{
	struct tw_task *ts;
	struct tw_runq *h;
	__u64 w, lat, cg, frozen = 0;

	ts = switch_next(s, next);
	if (!ts || !ts->wait_ns)
		return;
	w = ts->wait_ns;
	cg = ts->wait_cg;
	ts->wait_ns = 0;
	__sync_fetch_and_sub(&nr_waiting, 1);
	if (!thawed && tw_dequeue_model() && now > w)
		frozen = queued_freeze(next, ts, w, now);
	*covered = frozen;
	h = bpf_map_lookup_elem(&runq_hist, &cg);
	if (!h)
		return;
	/* A wait that ended in a thaw was a freeze; a queued thread's wait
	 * counts without the part its group was throttled. */
	if (thawed || now < w || now - w <= frozen) {
		h->excluded++;
		return;
	}
	lat = now - w - frozen;
	h->slots[log2_slot(lat)]++;
	h->count++;
	h->total_ns += lat;
	if (lat > h->max_ns)
		h->max_ns = lat;
	if (h->epoch != runq_epoch) {
		h->epoch = runq_epoch;
		h->epoch_max_ns = 0;
	}
	if (lat > h->epoch_max_ns)
		h->epoch_max_ns = lat;
}

/* The run-queue part of the sched_switch program. Returns the time it
 * read (0: none), for the cold-start part to reuse, and in *covered the
 * throttled part of the wait `next` ends (0: none); the storage it looked
 * up stays in *s for the cold-start part too. */
static __always_inline __u64 runq_switch(struct task_struct *prev, struct task_struct *next,
					 bool frozen, bool thawed, __u64 *covered,
					 struct tw_switch_tasks *s)
{
	__u64 now = 0;

	if (!nr_watched)
		return 0;
	if (!frozen && tw_task_state_direct(prev) == 0) {
		now = bpf_ktime_get_ns();
		on_preempt(prev, next, now, s);
	}
	if (nr_waiting) {
		if (!now)
			now = bpf_ktime_get_ns();
		on_runq_in(next, thawed, now, covered, s);
	}
	return now;
}

#endif
