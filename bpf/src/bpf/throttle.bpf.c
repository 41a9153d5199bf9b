// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* throttlewatch: the node-wide object. CFS bandwidth throttle freezes per
 * thread and throttle episodes per (cgroup, CPU), run-queue latency and cold
 * start, for the cgroups in the `watched` map only.
 *
 * One feature per header, each with its maps and programs:
 *   freeze.bpf.h     per-thread freezes             (ABI: throttle.h)
 *   episodes.bpf.h   (cgroup, CPU) episodes          (ABI: throttle.h)
 *   timers.bpf.h     bandwidth timer runs end them  (hrtimer programs)
 *   dequeue.bpf.h    what kernels before 6.18 need beyond that
 *   runq.bpf.h       run-queue latency              (ABI: runq.h)
 *   wakeups.bpf.h    wake-up chains: waker -> wakee  (ABI: runq.h)
 *   coldstart.bpf.h  cold start                     (ABI: runq.h)
 *   threads.bpf.h    per-thread CPU at thread exit  (ABI: throttle.h)
 * They share one object because they share the one sched_switch program
 * below: a program per feature would add an invocation to every context
 * switch on the node.
 *
 * Hot path (every context switch): one field read of `prev` and two global
 * counters. Everything else runs only for a thread that is being frozen or
 * thawed, or while a watched group has an open episode; the run-queue part
 * adds the state of `prev` and three more counters while cgroups are watched.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "throttle.h"
#include "runq.h"
#include "core_fixes.bpf.h"
#include "maps.bpf.h"
#include "watched.bpf.h"
#include "events.bpf.h"
#include "episodes.bpf.h"
#include "dequeue.bpf.h"
#include "timers.bpf.h"
#include "freeze.bpf.h"
#include "runq.bpf.h"
#include "wakeups.bpf.h"
#include "coldstart.bpf.h"
#include "threads.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The run-queue, wake-up chain and cold-start parts of a switch (tp_btf
 * only). `thaw_ns`: how long `next` was frozen, when this is its thaw. */
static __always_inline void runq_and_coldstart(struct task_struct *prev, struct task_struct *next,
					       bool frozen, __u64 thaw_ns)
{
	struct tw_switch_tasks s = {};
	__u64 now, covered = 0;

	if (!runq_enabled)
		return;
	now = runq_switch(prev, next, frozen, thaw_ns != 0, &covered, &s);
	if (nr_wake_pending || thaw_ns || covered) {
		if (!now)
			now = bpf_ktime_get_ns();
		wake_switch_in(next, thaw_ns + covered, now, &s);
	}
	if (nr_coldstart) {
		if (!now)
			now = bpf_ktime_get_ns();
		coldstart_switch(prev, next, frozen, covered, now, &s);
	}
}

static __always_inline int handle_switch(struct task_struct *prev, struct task_struct *next, bool direct)
{
	__u64 thaw_ns = 0;
	bool frozen;

	frozen = tw_switched_out_frozen(prev, direct);
	if (frozen)
		on_freeze(prev, direct);
	else
		dq_learn_at_switch(prev);
	if (nr_frozen || nr_open)
		thaw_ns = on_thaw(prev, next, direct);
	if (direct)
		runq_and_coldstart(prev, next, frozen, thaw_ns);
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

/* Wake-ups: the run-queue wait starts, the waker is noted (wake-up
 * chains), and a cold start's thread waits. At sched_waking, in the
 * waker's context (sched_wakeup may run on the wakee's CPU from an IPI);
 * a task woken while still queued (it had not slept yet) starts a wait
 * as before, and no wake-up edge. */
SEC("tp_btf/sched_waking")
int BPF_PROG(tw_waking_btf, struct task_struct *p)
{
	struct tw_task *ts = on_wakeup(p);

	if (ts && ts->cg)
		wake_note(p, ts);
	coldstart_wakeup(p, ts);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(tw_wakeup_new_btf, struct task_struct *p)
{
	coldstart_wakeup(p, on_wakeup(p));
	return 0;
}

/* The throttling model core_fixes.bpf.h decided, for user space: it runs
 * this once after load (BPF_PROG_TEST_RUN, never attached) and keeps the
 * answer, a tw_model. */
SEC("raw_tp")
int tw_model(void *ctx)
{
	return tw_dequeue_model() ? TW_MODEL_RQ : TW_MODEL_TASK;
}

/* Make the skeleton emit the ABI types for user space. */
struct tw_event_header _tw_event_header_abi = {};
struct tw_freeze_event _tw_freeze_event_abi = {};
struct tw_coldstart_event _tw_coldstart_event_abi = {};
struct tw_thread_cpu_event _tw_thread_cpu_event_abi = {};
struct tw_runq _tw_runq_abi = {};
struct tw_wake_key _tw_wake_key_abi = {};
struct tw_coldstart _tw_coldstart_abi = {};
struct tw_bandwidth _tw_bandwidth_abi = {};
