/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Cold start of watched cgroups (ABI: runq.h): the entrypoint's exec (the
 * first exec in a cgroup user space armed) and the moment the entrypoint,
 * with every thread and process it started, had the armed amount of CPU,
 * each one TW_EV_COLDSTART; in between, the time is split by what those
 * threads did (tw_coldstart). tp_btf only; shares the per-task storage of
 * runq.bpf.h and runs its sched_switch and sched_wakeup parts inside
 * throttle.bpf.c's programs, only while a cold start is pending
 * (`nr_coldstart`) and only for the threads it follows (`cs_cg`).
 *
 * The CPU is counted as the integral of the number of its threads running
 * (exact at any moment, not only at switch-outs: two threads that run side
 * by side reach 10 ms in 5 ms), and the wall time from the exec as one
 * state at a time, by precedence: a thread ran; else one was frozen by the
 * quota; else one waited on a run-queue; else all were blocked. The four
 * sum to the time to the target. Threads move under the entry's spin lock
 * (taken by tp_btf programs only: Linux >= 5.11 allows it there).
 *
 * Dequeue model (before 6.18): a thread waiting on a run-queue that is
 * throttled is frozen with it without being switched out, so it stays
 * "queued" here. At its switch-in the run-queue part (runq.bpf.h) tells how
 * much of its wait that run-queue's throttle episodes covered (what its
 * TW_EV_FREEZE_QUEUED record reports); that much of the queued time the
 * cold start was charged during the wait moves to frozen. The move is
 * bounded by the queued time charged since this thread began to wait, less
 * what other threads moved meanwhile (two threads queued behind one throttle
 * move it once). */
#ifndef __THROTTLEWATCH_COLDSTART_BPF_H
#define __THROTTLEWATCH_COLDSTART_BPF_H

/* The map's value: the ABI struct behind the lock that guards it. The lock
 * stays out of struct tw_coldstart, whose dummy instance in .bss gives the
 * skeleton its type: a .bss holding a spin lock would bar every raw_tp
 * program ("tracing progs cannot use bpf_spin_lock"). */
struct tw_coldstart_locked {
	struct bpf_spin_lock lock;
	__u32 pad;
	struct tw_coldstart cs;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct tw_coldstart_locked);
} coldstarts SEC(".maps");

/* cold starts armed and not yet complete (user space's count) */
__u64 nr_coldstart = 0;

static __always_inline void emit_stage(struct task_struct *t, __u64 cg, __u32 stage, __u64 start, __u64 at)
{
	struct tw_coldstart_event ev = {};

	ev.hdr.kind = TW_EV_COLDSTART;
	ev.hdr.tid = t->pid;
	ev.hdr.tgid = t->tgid;
	ev.hdr.cpu = bpf_get_smp_processor_id();
	ev.hdr.cgroup_id = cg;
	bpf_probe_read_kernel_str(ev.hdr.comm, sizeof(ev.hdr.comm), t->comm);
	ev.stage = stage;
	ev.at_ns = at;
	ev.ref_ns = start;
	emit(&ev);
}

/* One thread moves from `from` to `to` at `now`. The time since the last
 * move goes to the state the whole cold start was in, and its CPU to the
 * target. Returns when the target was reached (0: not in this step); the
 * split then stops there. `covered`: the throttled part of the run-queue
 * wait this move ends (dequeue model); *q0: the thread's queued_ns snapshot
 * (in: from its wait's start; out: taken now when it starts waiting). No
 * helper calls while the lock is held. */
static __always_inline __u64 cs_move(struct tw_coldstart_locked *l, __u32 from, __u32 to, __u64 now,
				     __u64 covered, __u64 *q0)
{
	struct tw_coldstart *cs = &l->cs;
	__u64 d, need, n, m, at = 0;

	bpf_spin_lock(&l->lock);
	if (cs->cpu_done_ns || !cs->last_ns)
		goto out;
	if (now > cs->last_ns) {
		d = now - cs->last_ns;
		n = cs->nr_running;
		if (n) {
			need = cs->target_ns > cs->oncpu_ns ? cs->target_ns - cs->oncpu_ns : 0;
			if (d * n >= need) {
				d = (need + n - 1) / n;
				at = cs->last_ns + d;
				cs->cpu_done_ns = at;
			}
			cs->oncpu_ns += d * n;
			cs->running_ns += d;
		} else if (cs->nr_frozen) {
			cs->frozen_ns += d;
		} else if (cs->nr_queued) {
			cs->queued_ns += d;
		} else {
			cs->blocked_ns += d;
		}
		cs->last_ns += d;
	}
	if (covered && from == TW_CS_QUEUED && cs->queued_ns > *q0) {
		m = cs->queued_ns - *q0;
		if (m > covered)
			m = covered;
		cs->queued_ns -= m;
		cs->frozen_ns += m;
	}
	if (to == TW_CS_QUEUED)
		*q0 = cs->queued_ns;
	if (at)
		goto out;
	if (from == TW_CS_RUNNING && cs->nr_running)
		cs->nr_running--;
	else if (from == TW_CS_FROZEN && cs->nr_frozen)
		cs->nr_frozen--;
	else if (from == TW_CS_QUEUED && cs->nr_queued)
		cs->nr_queued--;
	if (to == TW_CS_RUNNING)
		cs->nr_running++;
	else if (to == TW_CS_FROZEN)
		cs->nr_frozen++;
	else if (to == TW_CS_QUEUED)
		cs->nr_queued++;
out:
	bpf_spin_unlock(&l->lock);
	return at;
}

/* A followed thread changes state; it stops being followed once its cold
 * start is complete or gone. */
static __always_inline void cs_thread_to(struct task_struct *t, struct tw_task *ts, __u32 to, __u64 now,
					 __u64 covered)
{
	struct tw_coldstart_locked *l;
	__u64 cg = ts->cs_cg, at, q0 = ts->cs_queued0;
	__u32 from = (__u32)ts->cs_state;

	l = bpf_map_lookup_elem(&coldstarts, &cg);
	if (!l || l->cs.cpu_done_ns) {
		ts->cs_cg = 0;
		return;
	}
	if (from == to)
		return;
	ts->cs_state = to;
	at = cs_move(l, from, to, now, covered, &q0);
	ts->cs_queued0 = q0;
	if (at) {
		ts->cs_cg = 0;
		emit_stage(t, cg, TW_CS_CPU, l->cs.exec_ns, at);
	}
}

/* Cold start bookkeeping at a switch (only while one is pending).
 * `covered`: the throttled part of the run-queue wait `next` ends; *s: the
 * storage runq_switch() already looked up (the rest is looked up here). */
static __always_inline void coldstart_switch(struct task_struct *prev, struct task_struct *next,
					     bool frozen, __u64 covered, __u64 now,
					     struct tw_switch_tasks *s)
{
	struct tw_task *ts;
	__u32 to;

	ts = switch_prev(s, prev);
	if (ts && ts->cs_cg) {
		if (frozen)
			to = TW_CS_FROZEN;
		else if (tw_task_state_direct(prev) == 0)
			to = TW_CS_QUEUED;
		else
			to = TW_CS_BLOCKED;
		cs_thread_to(prev, ts, to, now, 0);
	}
	ts = switch_next(s, next);
	if (ts && ts->cs_cg)
		cs_thread_to(next, ts, TW_CS_RUNNING, now, covered);
}

/* Cold start bookkeeping at a wakeup: the thread waits for a CPU, or for
 * the unthrottle when its hierarchy is throttled (task model). `ts`: what
 * on_wakeup() returned, the storage of `p` when its group is watched. */
static __always_inline void coldstart_wakeup(struct task_struct *p, struct tw_task *ts)
{
	if (!nr_coldstart)
		return;
	if (ts && ts->cs_cg)
		cs_thread_to(p, ts, tw_woken_into_freeze(p) ? TW_CS_FROZEN : TW_CS_QUEUED,
			     bpf_ktime_get_ns(), 0);
}

/* The first exec in an armed cgroup is its entrypoint: on a CPU now. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(tw_exec_btf, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	struct tw_coldstart_locked *l;
	struct tw_coldstart *cs;
	struct tw_task *ts;
	__u64 cg, own, now;

	if (!runq_enabled)
		return 0;
	if (nr_watched)
		task_storage_create(p);
	if (!nr_coldstart)
		return 0;
	cg = watched_group(p, &own);
	if (!cg)
		return 0;
	l = bpf_map_lookup_elem(&coldstarts, &cg);
	if (!l)
		return 0;
	cs = &l->cs;
	if (cs->exec_ns)
		return 0;
	now = bpf_ktime_get_ns();
	if (!__sync_bool_compare_and_swap(&cs->exec_ns, 0, now))
		return 0;
	cs->tgid = p->tgid;
	ts = bpf_task_storage_get(&tw_tasks, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (ts) {
		ts->cs_cg = cg;
		ts->cs_state = TW_CS_RUNNING;
		bpf_spin_lock(&l->lock);
		cs->last_ns = now;
		cs->nr_running = 1;
		bpf_spin_unlock(&l->lock);
	}
	emit_stage(p, cg, TW_CS_EXEC, BPF_CORE_READ(p, group_leader, start_time), now);
	return 0;
}

/* Threads and processes the entrypoint starts count towards its CPU
 * target (they start blocked: sched_wakeup_new follows). */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(tw_fork_btf, struct task_struct *parent, struct task_struct *child)
{
	struct tw_task *ts, *cts;

	if (!runq_enabled)
		return 0;
	if (nr_watched)
		task_storage_create(child);
	if (!nr_coldstart)
		return 0;
	ts = bpf_task_storage_get(&tw_tasks, parent, 0, 0);
	if (!ts || !ts->cs_cg)
		return 0;
	cts = bpf_task_storage_get(&tw_tasks, child, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (cts) {
		cts->cs_cg = ts->cs_cg;
		cts->cs_state = TW_CS_BLOCKED;
	}
	return 0;
}

#endif
