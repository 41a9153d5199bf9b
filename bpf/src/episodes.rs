//! Throttle episodes as the `episodes` map keys and holds them.

use crate::skel::types::{tw_episode, tw_episode_key};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpisodeTotals {
    pub total_ns: u64,
    pub count: u64,
    /// Episodes still open (throttled right now).
    pub open: u32,
}

pub(crate) fn read_episode(v: &[u8]) -> Option<tw_episode> {
    if v.len() < std::mem::size_of::<tw_episode>() {
        return None;
    }
    // SAFETY: length checked; tw_episode is plain old data.
    Some(unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) })
}

pub(crate) fn episode_key(cgroup_id: u64, cpu: u32) -> Vec<u8> {
    let k = tw_episode_key {
        cgroup_id,
        cpu,
        pad: 0,
    };
    let p = (&k as *const tw_episode_key).cast::<u8>();
    // SAFETY: reading the bytes of a POD value.
    unsafe { std::slice::from_raw_parts(p, std::mem::size_of::<tw_episode_key>()) }.to_vec()
}
