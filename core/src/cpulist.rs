//! The kernel's CPU/node list format: "0-3,8,10-11".

use std::collections::BTreeSet;
use std::fmt;

use crate::units::UnitError;

pub const CPULIST_ACCEPTED: &str = "expected a CPU list such as 0-3,8,10-11 (ids 0..=4095)";
pub const MAX_ID: u32 = 4095;

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuList(pub BTreeSet<u32>);

impl CpuList {
    pub fn parse(field: &str, s: &str) -> Result<CpuList, UnitError> {
        let err = || UnitError {
            field: field.into(),
            value: s.into(),
            accepted: CPULIST_ACCEPTED,
        };
        let mut set = BTreeSet::new();
        let t = s.trim();
        if t.is_empty() {
            return Ok(CpuList(set));
        }
        for part in t.split(',') {
            let part = part.trim();
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let a: u32 = a.parse().map_err(|_| err())?;
            let b: u32 = b.parse().map_err(|_| err())?;
            if a > b || b > MAX_ID {
                return Err(err());
            }
            set.extend(a..=b);
        }
        Ok(CpuList(set))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn contains(&self, id: u32) -> bool {
        self.0.contains(&id)
    }

    pub fn is_subset(&self, other: &CpuList) -> bool {
        self.0.is_subset(&other.0)
    }

    pub fn intersect(&self, other: &CpuList) -> CpuList {
        CpuList(self.0.intersection(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuList) -> CpuList {
        CpuList(self.0.difference(&other.0).copied().collect())
    }

    pub fn union(&self, other: &CpuList) -> CpuList {
        CpuList(self.0.union(&other.0).copied().collect())
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<u32> for CpuList {
    fn from_iter<I: IntoIterator<Item = u32>>(ids: I) -> CpuList {
        CpuList(ids.into_iter().collect())
    }
}

impl fmt::Display for CpuList {
    /// The kernel's compact form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end = it.next().unwrap();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let l = CpuList::parse("f", "0-3,8,10-11").unwrap();
        assert_eq!(l.len(), 7);
        assert_eq!(l.to_string(), "0-3,8,10-11");
        assert_eq!(CpuList::parse("f", "3,1,2,2").unwrap().to_string(), "1-3");
        assert_eq!(CpuList::parse("f", "\n").unwrap(), CpuList::default());
    }

    #[test]
    fn rejects() {
        for bad in ["a", "3-1", "1-", "-1", "0-99999", "1,,2", "1;2"] {
            let e = CpuList::parse("--cpuset", bad).unwrap_err();
            assert!(e.to_string().contains("--cpuset"), "{e}");
        }
    }

    #[test]
    fn set_ops() {
        let a = CpuList::parse("a", "0-7").unwrap();
        let b = CpuList::parse("b", "4-11").unwrap();
        assert_eq!(a.intersect(&b).to_string(), "4-7");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert!(CpuList::parse("c", "5,6").unwrap().is_subset(&a));
    }
}
