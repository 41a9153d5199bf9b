/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Cold start of watched cgroups (ABI: runq.h): the entrypoint's exec (the
 * first exec in a cgroup user space armed), its first switch-in after the
 * exec, and the moment its threads had the armed amount of CPU, each one
 * TW_EV_COLDSTART. tp_btf only; shares the per-task storage of runq.bpf.h
 * and runs its sched_switch part inside throttle.bpf.c's program, only while
 * a cold start is pending (`nr_coldstart`). */
#ifndef __THROTTLEWATCH_COLDSTART_BPF_H
#define __THROTTLEWATCH_COLDSTART_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct tw_coldstart);
} coldstarts SEC(".maps");

/* cold starts armed and not yet complete (user space's count) */
__u64 nr_coldstart = 0;

static __always_inline void emit_stage(struct task_struct *t, __u64 cg, __u32 stage, __u64 start, __u64 at)
{
	struct tw_event ev = {};

	ev.kind = TW_EV_COLDSTART;
	ev.tid = t->pid;
	ev.tgid = t->tgid;
	ev.cpu_out = stage;
	ev.cpu_in = bpf_get_smp_processor_id();
	ev.start_ns = start;
	ev.end_ns = at;
	ev.cgroup_id = cg;
	bpf_probe_read_kernel_str(ev.comm, sizeof(ev.comm), t->comm);
	emit(&ev);
}

/* Cold start bookkeeping at a switch (only while one is pending). */
static __always_inline void coldstart_switch(struct task_struct *prev, struct task_struct *next, __u64 now)
{
	struct tw_coldstart *cs;
	struct tw_task *ts;
	__u64 cg, before, d, last;

	ts = bpf_task_storage_get(&tw_tasks, prev, 0, 0);
	if (ts && ts->cs_cg && ts->cs_last_in) {
		cg = ts->cs_cg;
		last = ts->cs_last_in;
		ts->cs_last_in = 0;
		cs = bpf_map_lookup_elem(&coldstarts, &cg);
		if (!cs || cs->cpu_done_ns) {
			ts->cs_cg = 0;
		} else if (now > last) {
			d = now - last;
			before = __sync_fetch_and_add(&cs->oncpu_ns, d);
			if (before < cs->target_ns && before + d >= cs->target_ns) {
				__u64 at = last + (cs->target_ns - before);
				if (__sync_bool_compare_and_swap(&cs->cpu_done_ns, 0, at))
					emit_stage(prev, cg, TW_CS_CPU, cs->exec_ns, at);
				ts->cs_cg = 0;
			}
		}
	}
	ts = bpf_task_storage_get(&tw_tasks, next, 0, 0);
	if (ts && ts->cs_cg) {
		ts->cs_last_in = now;
		cg = ts->cs_cg;
		cs = bpf_map_lookup_elem(&coldstarts, &cg);
		if (cs && !cs->first_run_ns && __sync_bool_compare_and_swap(&cs->first_run_ns, 0, now))
			emit_stage(next, cg, TW_CS_FIRST_RUN, cs->exec_ns, now);
	}
}

/* The first exec in an armed cgroup is its entrypoint. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(tw_exec_btf, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
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
	cs = bpf_map_lookup_elem(&coldstarts, &cg);
	if (!cs || cs->exec_ns)
		return 0;
	now = bpf_ktime_get_ns();
	if (!__sync_bool_compare_and_swap(&cs->exec_ns, 0, now))
		return 0;
	cs->tgid = p->tgid;
	cs->state = 1;
	ts = bpf_task_storage_get(&tw_tasks, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (ts) {
		ts->cs_cg = cg;
		ts->cs_last_in = now; /* it is on a CPU right now */
	}
	emit_stage(p, cg, TW_CS_EXEC, BPF_CORE_READ(p, group_leader, start_time), now);
	return 0;
}

/* Threads the entrypoint starts count towards its first N ms of CPU. */
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
	if (!ts || !ts->cs_cg || child->tgid != parent->tgid)
		return 0;
	cts = bpf_task_storage_get(&tw_tasks, child, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (cts) {
		cts->cs_cg = ts->cs_cg;
		cts->cs_last_in = 0;
	}
	return 0;
}

#endif
