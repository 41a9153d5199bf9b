/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Map helpers shared by every object (after libbpf-tools' maps.bpf.h). */
#ifndef __THROTTLEWATCH_MAPS_BPF_H
#define __THROTTLEWATCH_MAPS_BPF_H

#include <bpf/bpf_helpers.h>

/* The value of `key`, inserted as `init` when missing. NULL when the map is
 * full. `created` (may be NULL) says whether this call inserted it; of two
 * CPUs racing to insert, exactly one is told so. */
static __always_inline void *tw_lookup_or_init(void *map, const void *key, const void *init,
					       bool *created)
{
	void *v = bpf_map_lookup_elem(map, key);
	long err;

	if (created)
		*created = false;
	if (v)
		return v;
	err = bpf_map_update_elem(map, key, init, BPF_NOEXIST);
	if (!err && created)
		*created = true;
	return bpf_map_lookup_elem(map, key);
}

#endif
