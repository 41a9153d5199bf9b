//! Serialising CPU lists in the kernel's text form ("0-3,8").

use serde::Serializer;
use throttlewatch_core::CpuList;

pub fn cpulist_str<S: Serializer>(l: &CpuList, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(l)
}

pub fn opt_cpulist_str<S: Serializer>(l: &Option<CpuList>, s: S) -> Result<S::Ok, S::Error> {
    match l {
        Some(l) => s.collect_str(l),
        None => s.serialize_none(),
    }
}

pub fn cpulists_str<S: Serializer>(ls: &[CpuList], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(ls.iter().map(|l| l.to_string()))
}
