/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The watch map, defined once for every object that filters by it:
 * cgroup id (cpu-controller kernfs id) -> flags. User space fills the one in
 * throttle.bpf.c and hands its fd to the other objects (reuse_fd). */
#ifndef __THROTTLEWATCH_WATCHED_H
#define __THROTTLEWATCH_WATCHED_H

#define TW_MAX_WATCHED 16384

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TW_MAX_WATCHED);
	__type(key, __u64);
	__type(value, __u32);
} watched SEC(".maps");

#endif
