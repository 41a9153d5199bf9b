/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Wake-up chains of watched threads (ABI: runq.h, struct tw_wake_edge):
 * who woke whom, how long the woken thread then waited to run, and how much
 * of the work that wakeup started was frozen by the quota. tp_btf only.
 *
 * sched_waking runs in the waker's context (try_to_wake_up, before the
 * wakeup may be queued to the wakee's CPU and done there from an IPI, where
 * sched_wakeup would see the interrupted task instead): its program (in
 * throttle.bpf.c, which also starts the run-queue wait there) notes the
 * waker in the wakee's task storage. The wakee's next switch-in (the sched_switch
 * program) adds the wakeup to the edge (wakee cgroup, wakee, waker, kind) in
 * `wake_edges`, and makes that edge the wakee's hop: its freezes (thaws,
 * queued freezes on the dequeue model) until its next wakeup are the hop's.
 *
 * Cost: nothing for an unwatched wakee (the run-queue part's check, which
 * moved from sched_wakeup to sched_waking with it: one program per wake-up
 * as before); a watched one a few stores and the waker's group. The switch-in part runs only while
 * a watched thread has a wakeup pending (`nr_wake_pending`) or is thawed.
 * Only the wakee writes its edges (its tid is in the key: one CPU at a
 * time), so no atomics; user space reads them once per snapshot interval.
 */
#ifndef __THROTTLEWATCH_WAKEUPS_BPF_H
#define __THROTTLEWATCH_WAKEUPS_BPF_H

/* include/linux/preempt.h */
#define TW_NMI_MASK		0x00f00000
#define TW_HARDIRQ_MASK		0x000f0000
#define TW_SOFTIRQ_OFFSET	0x00000100

/* Set before load from the kernel's BTF (bpf/src/wakeups.rs): where x86's
 * per-CPU preempt count `__preempt_count` lies from the per-CPU run-queue
 * `runqueues` (both in .data..percpu, so the distance is the same on every
 * CPU). A kfunc-free way to it: without CONFIG_KALLSYMS_ALL a __ksym
 * per-CPU variable does not resolve. Unknown (another architecture):
 * only the idle task counts as an interrupt waker. */
const volatile bool tw_pc_known = false;
const volatile __s64 tw_pc_from_rq = 0;

/* watched threads with a wakeup noted and not yet switched in */
__u64 nr_wake_pending = 0;

/* The value a new edge starts from (never written). */
struct tw_wake_edge tw_wake_edge_zero = {};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct tw_wake_key);
	__type(value, struct tw_wake_edge);
} wake_edges SEC(".maps");

/* Hard interrupt, NMI, or serving a softirq (not: softirqs disabled), on
 * the CPU `cur` (the running task) runs on. */
static __always_inline bool tw_in_interrupt(struct task_struct *cur)
{
	unsigned long rq;
	int pc = 0;

	if (!tw_pc_known)
		return false;
	rq = (unsigned long)BPF_CORE_READ(cur, se.cfs_rq, rq);
	if (!rq || bpf_probe_read_kernel(&pc, sizeof(pc), (void *)(rq + tw_pc_from_rq)))
		return false;
	return (pc & (TW_NMI_MASK | TW_HARDIRQ_MASK | TW_SOFTIRQ_OFFSET)) != 0;
}

/* A task still queued (never dequeued: it had not yet slept when woken) is
 * not woken from a sleep. Since Linux 6.12 a sleeping task may stay queued
 * with its dequeue delayed: that one did sleep. */
static __always_inline bool tw_never_slept(struct task_struct *p)
{
	if (!p->on_rq)
		return false;
	if (bpf_core_field_exists(p->se.sched_delayed))
		return !BPF_CORE_READ_BITFIELD_PROBED(&p->se, sched_delayed);
	return true;
}

/* sched_waking of a watched task: note the waker. */
static __always_inline void wake_note(struct task_struct *p, struct tw_task *ts)
{
	struct task_struct *w = bpf_get_current_task_btf();
	__u32 kind = TW_WAKER_IRQ, tid = 0, tgid = 0;
	__u64 wcg = 0;

	if (tw_never_slept(p))
		return;
	if (w->pid && !tw_in_interrupt(w)) {
		tid = w->pid;
		tgid = w->tgid;
		wcg = task_group_watched(w);
		kind = wcg == ts->cg ? TW_WAKER_SAME : wcg ? TW_WAKER_OTHER : TW_WAKER_HOST;
	}
	if (!ts->wake_ns)
		__sync_fetch_and_add(&nr_wake_pending, 1);
	ts->wake_ns = bpf_ktime_get_ns();
	ts->waker_kind = kind;
	ts->waker_tgid = tgid;
	ts->waker_cg = wcg;
	/* The name once per waker (a pipeline's hop has the same one each time). */
	if (tid && (tid != ts->waker_tid || !ts->waker_comm[0]))
		bpf_get_current_comm(ts->waker_comm, sizeof(ts->waker_comm));
	else if (!tid)
		ts->waker_comm[0] = 0;
	ts->waker_tid = tid;
}

static __always_inline void wake_dropped(__u64 cg)
{
	struct tw_runq *h = bpf_map_lookup_elem(&runq_hist, &cg);

	if (h)
		h->wake_dropped++;
}

/* The edge of `k`; a new one (create) gets the names and the waker's group. */
static __always_inline struct tw_wake_edge *edge_get(struct tw_wake_key *k, struct task_struct *next,
						     struct tw_task *ts, bool create)
{
	struct tw_wake_edge *e = bpf_map_lookup_elem(&wake_edges, k);

	if (e || !create)
		return e;
	bpf_map_update_elem(&wake_edges, k, &tw_wake_edge_zero, BPF_NOEXIST);
	e = bpf_map_lookup_elem(&wake_edges, k);
	if (!e) {
		wake_dropped(k->cgroup_id);
		return 0;
	}
	e->waker_cgroup_id = ts->waker_cg;
	e->wakee_tgid = next->tgid;
	__builtin_memcpy(e->waker_comm, ts->waker_comm, sizeof(e->waker_comm));
	bpf_probe_read_kernel_str(e->wakee_comm, sizeof(e->wakee_comm), next->comm);
	return e;
}

/* `next` switches in: its pending wakeup (if any) is added to its edge and
 * becomes its hop; `frozen` (the freeze this switch-in ends, or the part
 * of its wait its run-queue was throttled) is charged to the hop. */
static __always_inline void wake_switch_in(struct task_struct *next, __u64 frozen, __u64 now,
					   struct tw_switch_tasks *s)
{
	struct tw_wake_key k = {};
	struct tw_wake_edge *e;
	struct tw_task *ts;
	__u64 lat;

	ts = task_fresh(next, switch_next(s, next));
	if (!ts || !ts->cg)
		return;
	k.cgroup_id = ts->cg;
	k.wakee_tid = next->pid;
	if (ts->wake_ns) {
		lat = now > ts->wake_ns ? now - ts->wake_ns : 0;
		ts->wake_ns = 0;
		__sync_fetch_and_sub(&nr_wake_pending, 1);
		ts->hop_kind = ts->waker_kind;
		ts->hop_tid = ts->waker_tid;
		ts->hop_tgid = ts->waker_tgid;
		ts->hop_frozen = 0;
		k.waker_tid = ts->hop_tid;
		k.waker_tgid = ts->hop_tgid;
		k.kind = ts->hop_kind;
		e = edge_get(&k, next, ts, true);
		if (e) {
			e->count++;
			e->wait_ns += lat;
			e->slots[log2_slot(lat)]++;
			if (lat > e->max_ns)
				e->max_ns = lat;
			if (e->epoch != runq_epoch) {
				e->epoch = runq_epoch;
				e->epoch_max_ns = 0;
			}
			if (lat > e->epoch_max_ns)
				e->epoch_max_ns = lat;
		}
	}
	if (!frozen || !ts->hop_kind)
		return;
	k.waker_tid = ts->hop_tid;
	k.waker_tgid = ts->hop_tgid;
	k.kind = ts->hop_kind;
	e = edge_get(&k, next, ts, false);
	if (!e)
		return;
	e->freezes++;
	e->frozen_ns += frozen;
	if (!ts->hop_frozen) {
		ts->hop_frozen = 1;
		e->frozen_hops++;
	}
}

#endif
