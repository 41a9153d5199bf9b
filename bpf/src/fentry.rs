//! The optional fentry/fexit view of throttle episodes (see fentry.bpf.c).

use std::mem::MaybeUninit;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapMut, OpenObject};

use crate::episodes::{episode_key, read_episode, EpisodeTotals};

mod skel {
    #![allow(
        clippy::all,
        unused_imports,
        dead_code,
        non_camel_case_types,
        unsafe_op_in_unsafe_fn
    )]
    include!(concat!(env!("OUT_DIR"), "/fentry.skel.rs"));
}

pub struct FentryProbe {
    skel: skel::FentrySkel<'static>,
    _links: Vec<Link>,
}

impl FentryProbe {
    /// Load against the main probe's watch map. Fails where the kernel
    /// refuses fentry (EPERM on some VMs, missing BTF for static functions).
    pub fn load(watched: &MapMut<'_>) -> Result<FentryProbe, libbpf_rs::Error> {
        let obj: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = skel::FentrySkelBuilder::default().open(obj)?;
        open.maps.watched.reuse_fd(watched.as_fd())?;
        let skel = open.load()?;
        let links = vec![
            skel.progs.tw_fexit_throttle.attach()?,
            skel.progs.tw_fentry_unthrottle.attach()?,
        ];
        Ok(FentryProbe {
            skel,
            _links: links,
        })
    }

    pub fn totals(&self, cgroup_id: u64, ncpus: u32) -> EpisodeTotals {
        let mut t = EpisodeTotals::default();
        for cpu in 0..ncpus {
            if let Ok(Some(v)) = self
                .skel
                .maps
                .fentry_episodes
                .lookup(&episode_key(cgroup_id, cpu), MapFlags::ANY)
            {
                if let Some(e) = read_episode(&v) {
                    t.total_ns += e.total_ns;
                    t.count += e.count;
                    t.open += u32::from(e.open_ns != 0);
                }
            }
        }
        t
    }

    pub fn forget(&self, cgroup_id: u64, ncpus: u32) {
        for cpu in 0..ncpus {
            let _ = self
                .skel
                .maps
                .fentry_episodes
                .delete(&episode_key(cgroup_id, cpu));
        }
    }
}
