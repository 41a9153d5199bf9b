//! How big the maps of the throttle object are made at load (from the CPU
//! count and the watch limit), and the kernel memory that takes: computed
//! from the object's own map definitions with the kernel's accounting
//! (`htab_map_mem_usage`, `array_map_mem_usage`, `ringbuf_map_mem_usage`,
//! the `memlock` a map's fdinfo shows), so the figure for 128 or 256 CPUs is
//! the same computation as the one checked against this machine.

use std::mem::MaybeUninit;

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{AsRawLibbpf, OpenObject};

use crate::options::{ProbeError, ProbeOptions};
use crate::skel::{OpenThrottleSkel, ThrottleSkelBuilder};

/// The smallest ring buffer the kernel takes (a page).
pub const MIN_RINGBUF_BYTES: u32 = 4096;
/// The fewest (cgroup, CPU) episode entries, whatever the sizes.
pub const MIN_EPISODES: u32 = 64;

/// Entries of the `episodes` map: one per (watched cgroup, CPU) — the map's
/// entries are removed when a cgroup is unwatched. `max_episodes` wins when
/// set; with neither set, the object's own size.
pub fn episodes_entries(opts: &ProbeOptions, ncpus: u32) -> Option<u32> {
    if opts.max_episodes > 0 {
        return Some(opts.max_episodes);
    }
    (opts.max_watched > 0).then(|| {
        opts.max_watched
            .saturating_mul(ncpus.max(1))
            .max(MIN_EPISODES)
    })
}

/// Size the maps of an opened (not yet loaded) object for `ncpus` CPUs.
pub(crate) fn size_maps(
    open: &mut OpenThrottleSkel<'_>,
    opts: &ProbeOptions,
    ncpus: u32,
) -> Result<(), ProbeError> {
    let m = &mut open.maps;
    if opts.max_watched > 0 {
        for map in [&mut m.watched, &mut m.runq_hist, &mut m.coldstarts] {
            map.set_max_entries(opts.max_watched)
                .map_err(ProbeError::Load)?;
        }
    }
    if let Some(n) = episodes_entries(opts, ncpus) {
        m.episodes.set_max_entries(n).map_err(ProbeError::Load)?;
    }
    if opts.ringbuf_bytes > 0 {
        let bytes = opts
            .ringbuf_bytes
            .next_power_of_two()
            .max(MIN_RINGBUF_BYTES);
        m.events.set_max_entries(bytes).map_err(ProbeError::Load)?;
    }
    Ok(())
}

/// One map's definition and the kernel memory it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapMemory {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub bytes: u64,
}

/// The maps of the throttle object as `opts` sizes them on a machine with
/// `ncpus` possible CPUs, and what each takes in kernel memory. Opens the
/// object only (no load: no privileges needed).
pub fn object_memory(opts: &ProbeOptions, ncpus: u32) -> Result<Vec<MapMemory>, ProbeError> {
    let mut obj = Box::new(MaybeUninit::<OpenObject>::uninit());
    let mut open = ThrottleSkelBuilder::default()
        .open(&mut obj)
        .map_err(ProbeError::Load)?;
    size_maps(&mut open, opts, ncpus)?;
    let mut out = Vec::new();
    for m in open.open_object().maps() {
        let raw = m.as_libbpf_object().as_ptr();
        // SAFETY: `raw` is a map of the open object, alive for this loop.
        let (ty, key, value) = unsafe {
            (
                libbpf_sys::bpf_map__type(raw),
                libbpf_sys::bpf_map__key_size(raw),
                libbpf_sys::bpf_map__value_size(raw),
            )
        };
        let entries = m.max_entries();
        out.push(MapMemory {
            name: m.name().to_string_lossy().into_owned(),
            map_type: ty,
            key_size: key,
            value_size: value,
            max_entries: entries,
            bytes: map_bytes(ty, key, value, entries, ncpus),
        });
    }
    Ok(out)
}

/// sizeof(struct htab_elem) on 64-bit kernels (hash node, LRU node, hash, key alignment).
const HTAB_ELEM: u64 = 48;
/// sizeof(struct bucket): an hlist_nulls_head and a raw spin lock.
const HTAB_BUCKET: u64 = 16;
/// HASHTAB_MAP_LOCK_COUNT: per-CPU `int` map locks.
const HTAB_LOCKS: u64 = 8;
const PAGE: u64 = 4096;
/// The fixed structs (bpf_htab, bpf_array, bpf_ringbuf) rounded up: small
/// next to the elements, kept so the sum tracks fdinfo's `memlock`.
const MAP_HEADER: u64 = 1024;

fn round8(x: u32) -> u64 {
    (x as u64).div_ceil(8) * 8
}

/// Kernel memory of one map (Linux 6.x accounting, the fdinfo `memlock`).
pub fn map_bytes(ty: u32, key: u32, value: u32, entries: u32, ncpus: u32) -> u64 {
    let (n, cpus) = (entries as u64, ncpus.max(1) as u64);
    match ty {
        libbpf_sys::BPF_MAP_TYPE_HASH
        | libbpf_sys::BPF_MAP_TYPE_LRU_HASH
        | libbpf_sys::BPF_MAP_TYPE_PERCPU_HASH
        | libbpf_sys::BPF_MAP_TYPE_LRU_PERCPU_HASH => {
            let percpu = matches!(
                ty,
                libbpf_sys::BPF_MAP_TYPE_PERCPU_HASH | libbpf_sys::BPF_MAP_TYPE_LRU_PERCPU_HASH
            );
            let lru = matches!(
                ty,
                libbpf_sys::BPF_MAP_TYPE_LRU_HASH | libbpf_sys::BPF_MAP_TYPE_LRU_PERCPU_HASH
            );
            let elem = HTAB_ELEM + round8(key) + if percpu { 8 } else { round8(value) };
            // Preallocated: every element at creation, plus one spare per
            // CPU for plain hashes (htab_has_extra_elems).
            let elems = n + if percpu || lru { 0 } else { cpus };
            let mut b = MAP_HEADER + n.next_power_of_two() * HTAB_BUCKET + 4 * cpus * HTAB_LOCKS;
            b += elem * elems;
            if percpu {
                b += round8(value) * cpus * elems;
            } else if !lru {
                b += 8 * cpus;
            }
            b
        }
        libbpf_sys::BPF_MAP_TYPE_PERCPU_ARRAY => MAP_HEADER + n * 8 + n * round8(value) * cpus,
        // .bss/.data/.rodata are mmapable: whole pages.
        libbpf_sys::BPF_MAP_TYPE_ARRAY => MAP_HEADER + (n * round8(value)).div_ceil(PAGE) * PAGE,
        libbpf_sys::BPF_MAP_TYPE_RINGBUF => {
            let data_pages = n / PAGE;
            MAP_HEADER + (2 + data_pages) * PAGE + (2 + 2 * data_pages) * 8
        }
        // Task storage: buckets only; each task's entry is allocated when
        // it is first used and charged to that task's memory cgroup.
        _ => MAP_HEADER + cpus.next_power_of_two() * HTAB_BUCKET,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episodes_follow_cpus_and_the_watch_limit() {
        let o = |max_watched, max_episodes| ProbeOptions {
            max_watched,
            max_episodes,
            ..Default::default()
        };
        assert_eq!(episodes_entries(&o(1024, 0), 2), Some(2048));
        assert_eq!(episodes_entries(&o(1024, 0), 256), Some(262_144));
        assert_eq!(episodes_entries(&o(4, 0), 2), Some(MIN_EPISODES));
        assert_eq!(episodes_entries(&o(1024, 3), 256), Some(3));
        assert_eq!(episodes_entries(&o(0, 0), 256), None);
    }

    #[test]
    fn per_cpu_maps_grow_with_the_cpus_and_others_do_not() {
        let h = |ty, cpus| map_bytes(ty, 8, 328, 1024, cpus);
        let percpu = libbpf_sys::BPF_MAP_TYPE_PERCPU_HASH;
        let plain = libbpf_sys::BPF_MAP_TYPE_HASH;
        // 1024 x 328 B per CPU dominates a per-CPU hash.
        assert!(h(percpu, 256) > 1024 * 328 * 256);
        assert!(h(percpu, 256) < 1024 * (328 + 100) * 256);
        assert!(h(plain, 256) < 2 * h(plain, 2));
    }

    /// The object opens without privileges and its sizes follow the options.
    #[test]
    fn object_memory_sizes_episodes_per_cpu() {
        let opts = ProbeOptions {
            max_watched: 1024,
            ..Default::default()
        };
        let at = |cpus| object_memory(&opts, cpus).unwrap();
        let ep = |maps: &[MapMemory]| maps.iter().find(|m| m.name == "episodes").cloned().unwrap();
        assert_eq!(ep(&at(2)).max_entries, 2048);
        assert_eq!(ep(&at(128)).max_entries, 131_072);
        let total = |maps: &[MapMemory]| maps.iter().map(|m| m.bytes).sum::<u64>();
        assert!(total(&at(256)) > total(&at(128)));
        assert!(at(2).iter().any(|m| m.name == "map_full"));
    }
}
