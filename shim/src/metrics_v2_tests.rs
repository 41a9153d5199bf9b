//! Unit tests of metrics_v2.rs: the v2 answer decoded from fixture trees.
use super::*;
use crate::metrics::CgroupDirs;
use containerd_shim::protos::protobuf::{Message, UnknownValueRef};

/// A container's cgroup as a 6.x kernel shows it (figures from a
/// Debian 13 guest's pod container, some changed to be told apart).
const MEMORY_STAT: &str = "anon 3518464\nfile 16707584\nkernel 1212416\n\
kernel_stack 65536\npagetables 143360\nsec_pagetables 0\npercpu 1440\nsock 4096\n\
vmalloc 8192\nshmem 12288\nzswap 0\nzswapped 0\nfile_mapped 6299648\nfile_dirty 8192\n\
file_writeback 4096\nswapcached 0\nanon_thp 2097152\nfile_thp 0\nshmem_thp 0\n\
inactive_anon 3510272\nactive_anon 20480\ninactive_file 12845056\nactive_file 3850240\n\
unevictable 16384\nslab_reclaimable 713400\nslab_unreclaimable 210544\nslab 923944\n\
workingset_refault_anon 11\nworkingset_refault_file 22\nworkingset_activate_anon 33\n\
workingset_activate_file 44\nworkingset_restore_anon 0\nworkingset_restore_file 0\n\
workingset_nodereclaim 55\npgdemote_kswapd 0\npgdemote_direct 0\npgdemote_khugepaged 0\n\
pgscan 66\npgsteal 77\npgscan_kswapd 0\npgscan_direct 66\npgscan_khugepaged 0\n\
pgsteal_kswapd 0\npgsteal_direct 77\npgsteal_khugepaged 0\npgfault 5331\npgmajfault 31\n\
pgrefill 88\npgactivate 917\npgdeactivate 99\npglazyfree 5\npglazyfreed 4\nzswpin 0\n\
zswpout 0\nzswpwb 0\nthp_fault_alloc 3\nthp_collapse_alloc 2\nthp_swpout 0\n\
thp_swpout_fallback 0\n";

fn fixture(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tw-metrics-v2-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for (f, v) in [
        (
            "cgroup.controllers",
            "cpuset cpu io memory hugetlb pids rdma misc\n",
        ),
        (
            "cpu.stat",
            "usage_usec 812345\nuser_usec 700000\nsystem_usec 112345\n\
             core_sched.force_idle_usec 0\nnr_periods 120\nnr_throttled 37\n\
             throttled_usec 1523456\nnr_bursts 2\nburst_usec 4000\n",
        ),
        (
            "cpu.pressure",
            "some avg10=1.50 avg60=0.75 avg300=0.20 total=1523000\n\
             full avg10=0.50 avg60=0.25 avg300=0.10 total=900000\n",
        ),
        ("memory.current", "21553152\n"),
        ("memory.max", "134217728\n"),
        ("memory.peak", "25165824\n"),
        ("memory.swap.current", "0\n"),
        ("memory.swap.max", "max\n"),
        ("memory.swap.peak", "0\n"),
        ("memory.stat", MEMORY_STAT),
        (
            "memory.events",
            "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n",
        ),
        (
            "memory.pressure",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n\
             full avg10=0.00 avg60=0.00 avg300=0.00 total=40\n",
        ),
        (
            "io.stat",
            "254:0 rbytes=1208320 wbytes=8192 rios=67 wios=2 dbytes=0 dios=0\n\
             7:3 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n",
        ),
        ("pids.current", "3\n"),
        ("pids.max", "max\n"),
        ("hugetlb.2MB.current", "0\n"),
        ("hugetlb.2MB.max", "max\n"),
        ("hugetlb.2MB.events", "max 4\n"),
        ("hugetlb.1GB.current", "1073741824\n"),
        ("hugetlb.1GB.max", "2147483648\n"),
        ("hugetlb.1GB.events", "max 0\n"),
        ("rdma.current", "mlx5_0 hca_handle=2 hca_object=2000\n"),
        ("rdma.max", "mlx5_0 hca_handle=max hca_object=4000\n"),
    ] {
        std::fs::write(d.join(f), v).unwrap();
    }
    d
}

fn unknown(m: &MemoryStat, number: u32) -> Option<u64> {
    match m.special_fields.unknown_fields().get(number)? {
        UnknownValueRef::Varint(v) => Some(v),
        _ => None,
    }
}

#[test]
fn a_v2_cgroup_tree_reads_like_the_runc_shims_manager_stat() {
    let d = fixture("full");
    let sizes = hugepage_sizes_from(&["hugepages-2048kB".into(), "hugepages-1048576kB".into()]);
    assert_eq!(sizes, ["2MB", "1GB"]);
    let any = crate::metrics::to_any(METRICS_TYPE_URL, &read(&d, &sizes)).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
    let m = Metrics::parse_from_bytes(&any.value).unwrap();

    assert_eq!((m.pids.current, m.pids.limit), (3, u64::MAX));
    let c = &m.cpu;
    assert_eq!(
        (c.usage_usec, c.user_usec, c.system_usec),
        (812345, 700000, 112345)
    );
    assert_eq!(
        (c.nr_periods, c.nr_throttled, c.throttled_usec),
        (120, 37, 1523456)
    );
    assert_eq!((c.nr_bursts, c.burst_usec), (2, 4000));
    assert_eq!((c.psi.some.avg10, c.psi.some.total), (1.5, 1523000));
    assert_eq!((c.psi.full.avg300, c.psi.full.total), (0.1, 900000));

    let ms = &m.memory;
    // What kubelet's working set reads: usage - inactive_file.
    assert_eq!(
        (ms.usage, ms.inactive_file, ms.active_file),
        (21553152, 12845056, 3850240)
    );
    assert_eq!(
        (ms.usage_limit, ms.max_usage, ms.swap_usage, ms.swap_limit),
        (134217728, 25165824, 0, u64::MAX)
    );
    assert_eq!(
        (ms.anon, ms.file, ms.kernel_stack),
        (3518464, 16707584, 65536)
    );
    assert_eq!((ms.slab, ms.sock, ms.shmem), (923944, 4096, 12288));
    assert_eq!(
        (
            ms.file_mapped,
            ms.file_dirty,
            ms.file_writeback,
            ms.anon_thp
        ),
        (6299648, 8192, 4096, 2097152)
    );
    assert_eq!(
        (ms.inactive_anon, ms.active_anon, ms.unevictable),
        (3510272, 20480, 16384)
    );
    assert_eq!(
        (ms.slab_reclaimable, ms.slab_unreclaimable),
        (713400, 210544)
    );
    assert_eq!((ms.pgfault, ms.pgmajfault), (5331, 31));
    // The kernel split these (5.9); the old names read 0, as in Go.
    assert_eq!((ms.workingset_refault, ms.workingset_activate), (0, 0));
    assert_eq!(ms.workingset_nodereclaim, 55);
    assert_eq!(
        (
            ms.pgrefill,
            ms.pgscan,
            ms.pgsteal,
            ms.pgactivate,
            ms.pgdeactivate
        ),
        (88, 66, 77, 917, 99)
    );
    assert_eq!((ms.pglazyfree, ms.pglazyfreed), (5, 4));
    assert_eq!((ms.thp_fault_alloc, ms.thp_collapse_alloc), (3, 2));
    assert_eq!(ms.psi.some.total, 42);
    let split: Vec<_> = SPLIT_WORKINGSET
        .iter()
        .map(|(_, n)| unknown(ms, *n))
        .collect();
    assert_eq!(split, [Some(11), Some(22), Some(33), Some(44)]);

    let e = &m.memory_events;
    assert_eq!(
        (e.low, e.high, e.max, e.oom, e.oom_kill, e.oom_group_kill),
        (0, 0, 12, 2, 1, 0)
    );

    let io = &m.io.usage;
    assert_eq!(io.len(), 2);
    assert_eq!(
        (
            io[0].major,
            io[0].minor,
            io[0].rbytes,
            io[0].wbytes,
            io[0].rios,
            io[0].wios
        ),
        (254, 0, 1208320, 8192, 67, 2)
    );
    assert_eq!((io[1].major, io[1].minor, io[1].rbytes), (7, 3, 4096));
    assert!(m.io.psi.is_none(), "no io.pressure in the tree");

    let h: Vec<_> = m
        .hugetlb
        .iter()
        .map(|h| (h.pagesize.as_str(), h.current, h.max, h.failcnt))
        .collect();
    assert_eq!(
        h,
        [("2MB", 0, u64::MAX, 4), ("1GB", 1073741824, 2147483648, 0)]
    );
    let r = &m.rdma;
    assert_eq!(
        (
            r.current[0].device.as_str(),
            r.current[0].hca_handles,
            r.current[0].hca_objects
        ),
        ("mlx5_0", 2, 2000)
    );
    assert_eq!(
        (r.limit[0].hca_handles, r.limit[0].hca_objects),
        (u32::MAX, 4000)
    );
    assert!(m.network.is_empty());
}

#[test]
fn an_empty_v2_cgroup_answers_as_manager_stat_does() {
    // A directory with none of the files (no controller enabled):
    // Stat still answers pids, cpu, memory, io and rdma, all zero.
    let d = std::env::temp_dir().join(format!("tw-metrics-v2-bare-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let m = read(&d, &["2MB".into()]);
    let _ = std::fs::remove_dir_all(&d);
    assert!(m.pids.is_some() && m.cpu.is_some() && m.memory.is_some());
    assert!(m.io.is_some() && m.rdma.is_some());
    assert_eq!(m.cpu.usage_usec, 0);
    assert!(m.cpu.psi.is_none());
    assert!(m.memory_events.is_none(), "memory.events missing");
    assert!(m
        .memory
        .special_fields
        .unknown_fields()
        .iter()
        .next()
        .is_none());
    assert_eq!(m.hugetlb.len(), 1);
    assert_eq!(
        (m.hugetlb[0].max, m.hugetlb[0].pagesize.as_str()),
        (0, "2MB")
    );
}

#[test]
fn the_shim_answers_v2_metrics_for_a_v2_cgroup() {
    let d = fixture("dirs");
    let dirs = CgroupDirs {
        v2: true,
        cpu: Some(d.clone()),
        cpuacct: Some(d.clone()),
        memory: Some(d.clone()),
        pids: Some(d.clone()),
    };
    let any = dirs.metrics_any().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&d);
    assert!(dirs.metrics_any().is_none(), "cgroup gone");
    assert_eq!(any.type_url, METRICS_TYPE_URL);
    let m = Metrics::parse_from_bytes(&any.value).unwrap();
    assert_eq!(m.memory.inactive_file, 12845056);
    assert_eq!(m.cpu.throttled_usec, 1523456);
    assert_eq!(m.memory_events.oom_kill, 1);
    assert_eq!(m.hugetlb.len(), hugepage_sizes().len());
}

#[test]
fn runc_events_on_v2_answer_the_v2_type() {
    let data = serde_json::json!({
        "cpu": {"usage": {"total": 5_000_000, "kernel": 1_000_000, "user": 4_000_000},
                "throttling": {"periods": 10, "throttledPeriods": 7, "throttledTime": 123_000}},
        "memory": {"usage": {"usage": 4096, "limit": 8192},
                   "raw": {"inactive_file": 1024, "pgfault": 9, "workingset_refault_file": 3}},
        "pids": {"current": 2}
    });
    let any = crate::metrics::metrics_any(&data, true).unwrap();
    assert_eq!(any.type_url, METRICS_TYPE_URL);
    let m = Metrics::parse_from_bytes(&any.value).unwrap();
    assert_eq!(
        (m.cpu.usage_usec, m.cpu.system_usec, m.cpu.user_usec),
        (5000, 1000, 4000)
    );
    assert_eq!((m.cpu.nr_throttled, m.cpu.throttled_usec), (7, 123));
    assert_eq!((m.memory.usage, m.memory.usage_limit), (4096, 8192));
    assert_eq!((m.memory.inactive_file, m.memory.pgfault), (1024, 9));
    assert_eq!(unknown(&m.memory, 40), Some(3));
    assert_eq!(m.pids.current, 2);
}
