/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The watch map, defined once for every object that filters by it:
 * cgroup id (cpu-controller kernfs id) -> flags. User space fills the one in
 * throttle.bpf.c and hands its fd to the other objects (reuse_fd). */
#ifndef __THROTTLEWATCH_WATCHED_H
#define __THROTTLEWATCH_WATCHED_H

#include <bpf/bpf_core_read.h>

#define TW_MAX_WATCHED 16384

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TW_MAX_WATCHED);
	__type(key, __u64);
	__type(value, __u32);
} watched SEC(".maps");

static __always_inline __u64 tg_cgroup_id(struct task_group *tg)
{
	return BPF_CORE_READ(tg, css.cgroup, kn, id);
}

/* The watched cgroup a task belongs to: its own cpu cgroup or the nearest
 * watched ancestor (one lookup per level, however many are watched). 0 when
 * none is watched. `own`: the task's own cpu cgroup. */
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

#endif
