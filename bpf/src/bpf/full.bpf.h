/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Inserts refused by the maps that can fill (enum tw_map_full, throttle.h),
 * counted per map in a per-CPU array that user space sums over the CPUs and
 * reports in each container's `end` record. Only on the failure path: a
 * working map never touches it. */
#ifndef __THROTTLEWATCH_FULL_BPF_H
#define __THROTTLEWATCH_FULL_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TW_FULL_NR);
	__type(key, __u32);
	__type(value, __u64);
} map_full SEC(".maps");

static __always_inline void tw_count_full(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&map_full, &which);

	if (n)
		__sync_fetch_and_add(n, 1);
}

#endif
