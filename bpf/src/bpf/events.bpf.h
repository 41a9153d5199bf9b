/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The node-wide event ring buffer every feature reports into. */
#ifndef __THROTTLEWATCH_EVENTS_BPF_H
#define __THROTTLEWATCH_EVENTS_BPF_H

/* Set by user space before load. 0: never wake the reader (it polls on a
 * timer: waking it per event makes it preempt the watched threads, which
 * then produce more events). */
const volatile __u32 ringbuf_wakeup_bytes = 0;

/* The layout of the records below (throttle.h), for user space to check
 * against the one it decodes before it loads anything. */
const volatile __u32 tw_abi_version = TW_ABI_VERSION;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

/* Events the ring buffer could not take. Totals never depend on delivery:
 * they are kept in maps. */
__u64 lost_events = 0;

/* Copy one record (a struct of throttle.h, built on the stack) into the
 * ring buffer: `size` is its struct's, a constant once inlined. */
static __always_inline void emit_record(const void *src, __u32 size)
{
	void *e;

	e = bpf_ringbuf_reserve(&events, size, 0);
	if (!e) {
		__sync_fetch_and_add(&lost_events, 1);
		return;
	}
	__builtin_memcpy(e, src, size);
	bpf_ringbuf_submit(e, ringbuf_wakeup_bytes &&
			   bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= ringbuf_wakeup_bytes ?
			   BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

#define emit(ev) emit_record((ev), sizeof(*(ev)))

#endif
