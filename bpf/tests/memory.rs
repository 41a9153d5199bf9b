//! Kernel memory of the loaded object: the computation from the map
//! definitions (`memory::object_memory`) agrees with what the kernel
//! accounts for each map (`memlock` in the map's fdinfo), and the figures
//! docs/security.md gives for 2, 128 and 256 CPUs are that computation's.

use std::collections::BTreeMap;

use throttlewatch_bpf::memory::{object_memory, MapMemory};
use throttlewatch_bpf::{ProbeOptions, ThrottleProbe};

/// (map_type, key_size, value_size, max_entries) → memlock of every BPF map
/// this process holds.
fn maps_of_this_process() -> Vec<((u32, u32, u32, u32), u64)> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        if link.to_string_lossy() != "anon_inode:bpf-map" {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let field = |k: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
                .unwrap_or(0)
        };
        out.push((
            (
                field("map_type:") as u32,
                field("key_size:") as u32,
                field("value_size:") as u32,
                field("max_entries:") as u32,
            ),
            field("memlock:"),
        ));
    }
    out
}

fn total(maps: &[MapMemory]) -> u64 {
    maps.iter().map(|m| m.bytes).sum()
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// The default agent's options (`max_containers = 1024`, 4 MiB ring buffer).
fn agent_options() -> ProbeOptions {
    ProbeOptions {
        max_watched: 1024,
        ringbuf_bytes: 4 << 20,
        no_fentry: true,
        ..Default::default()
    }
}

#[test]
fn computed_map_memory_matches_the_kernels_and_the_docs() {
    let opts = agent_options();
    let ncpus = libbpf_rs::num_possible_cpus().unwrap() as u32;
    let computed = object_memory(&opts, ncpus).unwrap();
    let before = maps_of_this_process().len();
    let probe = ThrottleProbe::load(&opts).expect("load");
    let loaded = maps_of_this_process();
    assert!(loaded.len() > before, "no maps loaded");
    // Each map of the object, found by its definition, within 2 % + 8 KiB
    // of the kernel's own figure (the fixed structs are estimated).
    let mut kernel = BTreeMap::new();
    for (def, memlock) in &loaded {
        *kernel.entry(*def).or_insert(0u64) += memlock;
    }
    let mut sum_kernel = 0;
    let mut found = 0;
    // fdinfo's memlock is the map's own accounting (map_mem_usage) since
    // Linux 6.4; before, a rough page-rounded footprint: there the maps are
    // matched by definition only.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release
        .trim()
        .split(['.', '-'])
        .map(|x| x.parse::<u32>().unwrap_or(0));
    let exact_memlock = (v.next().unwrap(), v.next().unwrap()) >= (6, 4);
    for m in &computed {
        let def = (m.map_type, m.key_size, m.value_size, m.max_entries);
        let Some(&k) = kernel.get(&def) else {
            continue; // reported by the assertion below
        };
        sum_kernel += k;
        found += 1;
        if !exact_memlock {
            continue;
        }
        let slack = k / 50 + 8192;
        assert!(
            m.bytes.abs_diff(k) <= slack,
            "{}: computed {} B, kernel {k} B ({def:?})",
            m.name,
            m.bytes
        );
    }
    // Every map but the optional fentry object's is found as defined.
    assert!(
        found + 1 >= computed.len(),
        "{found} of {} maps found",
        computed.len()
    );
    eprintln!(
        "{ncpus} CPUs: computed {} / kernel {} over {} maps",
        mb(total(&computed)),
        mb(sum_kernel),
        computed.len()
    );
    drop(probe);

    // The table in docs/security.md is this computation.
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md"))
        .unwrap();
    let rows: Vec<String> = [2u32, 128, 256]
        .iter()
        .map(|&cpus| {
            let maps = object_memory(&opts, cpus).unwrap();
            let get = |n: &str| {
                maps.iter()
                    .find(|m| m.name == n)
                    .map(|m| m.bytes)
                    .unwrap_or(0)
            };
            format!(
                "| {cpus} | {} | {} | {} | {} |",
                mb(get("episodes")),
                mb(get("runq_hist")),
                mb(total(&maps) - get("episodes") - get("runq_hist")),
                mb(total(&maps)),
            )
        })
        .collect();
    eprintln!("{}", rows.join("\n"));
    for row in rows {
        assert!(docs.contains(&row), "docs/security.md lacks the row {row}");
    }
}

/// The same at the object's own sizes (what agents before max_containers
/// loaded): per-CPU growth comes from runq_hist alone there.
#[test]
fn episodes_no_longer_fixed_at_65536() {
    let own = object_memory(&ProbeOptions::default(), 2).unwrap();
    let ep = own.iter().find(|m| m.name == "episodes").unwrap();
    assert_eq!(ep.max_entries, 65_536);
    let sized = object_memory(&agent_options(), 2).unwrap();
    let ep = sized.iter().find(|m| m.name == "episodes").unwrap();
    assert_eq!(ep.max_entries, 2048);
}
