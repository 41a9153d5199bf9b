// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* Optional second view of throttle episodes, straight from the kernel's own
 * throttle/unthrottle functions. fentry/fexit need a kernel that allows them
 * (production kernels do; the build VMs here refuse them with EPERM), so
 * user space loads this object separately, after the main probe, and goes
 * on without it when it does not load. Only groups that hold their own
 * quota are seen here (the cfs_rq being throttled is theirs). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "throttle.h"
#include "maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#include "watched.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tw_episode_key);
	__type(value, struct tw_episode);
} fentry_episodes SEC(".maps");

static __always_inline int key_of(struct cfs_rq *rq, struct tw_episode_key *key)
{
	__u64 cg = BPF_CORE_READ(rq, tg, css.cgroup, kn, id);

	if (!bpf_map_lookup_elem(&watched, &cg))
		return -1;
	key->cgroup_id = cg;
	key->cpu = BPF_CORE_READ(rq, rq, cpu);
	key->pad = 0;
	return 0;
}

/* throttle_cfs_rq() returns whether it throttled since commit 2a4b03ffc69f
 * ("sched/fair: Prevent unlimited runtime on throttled group"), Linux 5.8;
 * the kernel's clock starts inside it. */
SEC("fexit/throttle_cfs_rq")
int BPF_PROG(tw_fexit_throttle, struct cfs_rq *cfs_rq, bool throttled)
{
	struct tw_episode_key key;
	struct tw_episode *ep, zero = {};

	if (!throttled || key_of(cfs_rq, &key))
		return 0;
	ep = tw_lookup_or_init(&fentry_episodes, &key, &zero, NULL);
	if (!ep)
		return 0;
	if (!ep->open_ns)
		ep->open_ns = bpf_ktime_get_ns();
	return 0;
}

/* The kernel adds the episode to throttled_time inside unthrottle_cfs_rq(). */
SEC("fentry/unthrottle_cfs_rq")
int BPF_PROG(tw_fentry_unthrottle, struct cfs_rq *cfs_rq)
{
	struct tw_episode_key key;
	struct tw_episode *ep;
	__u64 now;

	if (key_of(cfs_rq, &key))
		return 0;
	ep = bpf_map_lookup_elem(&fentry_episodes, &key);
	if (!ep || !ep->open_ns)
		return 0;
	now = bpf_ktime_get_ns();
	if (now > ep->open_ns) {
		ep->total_ns += now - ep->open_ns;
		ep->count++;
	}
	ep->open_ns = 0;
	return 0;
}
