/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Per-thread CPU of watched cgroups (ABI: throttle.h, TW_EV_THREAD_CPU).
 * When a thread of a watched cgroup exits, what the scheduler counted for
 * it: its CPU time (se.sum_exec_runtime) and its waits on run-queues
 * (sched_info.run_delay, which includes the time it was frozen by the
 * quota): the two figures of /proc/<tid>/schedstat, which vanish with the
 * thread. User space reads that file for the threads still alive. One event
 * per exiting watched thread, nothing on any switch; tp_btf only. */
#ifndef __THROTTLEWATCH_THREADS_BPF_H
#define __THROTTLEWATCH_THREADS_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, TW_MAX_WATCHED);
	__type(key, __u64);
	__type(value, struct tw_bandwidth);
} exit_bandwidth SEC(".maps");

/* The watched group's counters into exit_bandwidth (tw_bandwidth). */
static __always_inline void keep_bandwidth(struct task_struct *p, __u64 cg)
{
	struct task_group *tg = p->se.cfs_rq->tg;
	struct tw_bandwidth b = {};
	int i;

	for (i = 0; i < TW_MAX_LEVELS && tg; i++) {
		if (tg_cgroup_id(tg) == cg)
			break;
		tg = tg->parent;
	}
	if (!tg || i == TW_MAX_LEVELS)
		return;
	b.throttled_time = tg->cfs_bandwidth.throttled_time;
	b.nr_periods = tg->cfs_bandwidth.nr_periods;
	b.nr_throttled = tg->cfs_bandwidth.nr_throttled;
	if (bpf_core_field_exists(tg->cfs_bandwidth.nr_burst)) {
		b.nr_burst = tg->cfs_bandwidth.nr_burst;
		b.burst_time = tg->cfs_bandwidth.burst_time;
	}
	bpf_map_update_elem(&exit_bandwidth, &cg, &b, BPF_ANY);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(tw_exit_btf, struct task_struct *p)
{
	struct tw_thread_cpu_event ev = {};
	__u64 cg;

	if (!runq_enabled || !nr_watched)
		return 0;
	cg = task_group_watched(p);
	if (!cg)
		return 0;
	keep_bandwidth(p, cg);
	ev.hdr.kind = TW_EV_THREAD_CPU;
	ev.hdr.tid = p->pid;
	ev.hdr.tgid = p->tgid;
	ev.hdr.cpu = bpf_get_smp_processor_id();
	ev.hdr.cgroup_id = cg;
	bpf_probe_read_kernel_str(ev.hdr.comm, sizeof(ev.hdr.comm), p->comm);
	/* CONFIG_SCHED_INFO kernels only (as /proc/<tid>/schedstat) */
	if (bpf_core_field_exists(p->sched_info))
		ev.run_delay_ns = p->sched_info.run_delay;
	ev.running_ns = p->se.sum_exec_runtime;
	emit(&ev);
	return 0;
}

#endif
