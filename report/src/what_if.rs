//! `--what-if`: the log replayed under settings of the reader's choice
//! (the same model as the advice, recommend.rs, under this run's
//! competition for the CPUs).

use serde::Serialize;

use crate::model::Container;
use crate::recommend::model;
use crate::replay::{replay, Bucket};

/// `--what-if quota=30ms,burst=10ms`: settings to replay the log under.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WhatIf {
    pub quota: Option<Quota>,
    pub burst_ns: Option<u64>,
}

/// A quota as a duration per period, or in CPUs (resolved with the log's period).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quota {
    Ns(u64),
    Cpus(f64),
}

/// The prediction for one container.
#[derive(Debug, Clone, Serialize)]
pub struct WhatIfResult {
    pub quota_ns: Option<u64>,
    pub period_ns: u64,
    pub burst_ns: Option<u64>,
    pub observed_throttled_ns: Option<u64>,
    /// Null when the log cannot be replayed (no quota, or no throttling seen).
    pub predicted_throttled_ns: Option<u64>,
}

const WHAT_IF_ACCEPTED: &str =
    "comma-separated quota=DURATION, cpus=NUMBER, burst=DURATION (e.g. quota=30ms,burst=10ms)";

/// A `--what-if` that does not parse: the whole value, the part at fault
/// and what is accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WhatIfError {
    #[error("--what-if {whole:?}: {part:?} is not KEY=VALUE; expected {WHAT_IF_ACCEPTED}")]
    NotKeyValue { whole: String, part: String },
    #[error("--what-if {whole:?}: give quota or cpus once, not both")]
    QuotaTwice { whole: String },
    #[error("--what-if {whole:?}: unknown key {key:?}; expected {WHAT_IF_ACCEPTED}")]
    UnknownKey { whole: String, key: String },
    #[error("--what-if {whole:?}: nothing to change; expected {WHAT_IF_ACCEPTED}")]
    Nothing { whole: String },
    /// A value's own error (`throttlewatch_core::units`): names the key,
    /// the value and what is accepted.
    #[error("--what-if: {0}")]
    Value(String),
}

impl WhatIf {
    pub fn parse(s: &str) -> Result<WhatIf, WhatIfError> {
        use throttlewatch_core::units::{parse_cpus, parse_duration};
        let whole = || s.to_string();
        let mut w = WhatIf::default();
        for kv in s.split(',').filter(|x| !x.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| WhatIfError::NotKeyValue {
                whole: whole(),
                part: kv.to_string(),
            })?;
            let dur = |f: &str| {
                parse_duration(f, v)
                    .map(|d| d.as_nanos() as u64)
                    .map_err(|e| WhatIfError::Value(e.to_string()))
            };
            match k.trim() {
                "quota" | "cpus" if w.quota.is_some() => {
                    return Err(WhatIfError::QuotaTwice { whole: whole() })
                }
                "quota" => w.quota = Some(Quota::Ns(dur("quota")?)),
                "burst" => w.burst_ns = Some(dur("burst")?),
                "cpus" => {
                    w.quota = Some(Quota::Cpus(
                        parse_cpus("cpus", v).map_err(|e| WhatIfError::Value(e.to_string()))?,
                    ))
                }
                other => {
                    return Err(WhatIfError::UnknownKey {
                        whole: whole(),
                        key: other.to_string(),
                    })
                }
            }
        }
        if w.quota.is_none() && w.burst_ns.is_none() {
            return Err(WhatIfError::Nothing { whole: whole() });
        }
        Ok(w)
    }

    pub fn predict(&self, c: &Container) -> WhatIfResult {
        let period_ns = c.period_ns();
        let quota_ns = self.quota.map(|q| match q {
            Quota::Ns(n) => n,
            Quota::Cpus(c) => (c * period_ns as f64).round() as u64,
        });
        let m = model(c);
        let predicted = m.as_ref().map(|m| {
            let bw = Bucket {
                quota_ns: quota_ns.unwrap_or(m.bw.quota_ns),
                burst_ns: self.burst_ns.unwrap_or(m.bw.burst_ns),
                ..m.bw
            };
            replay(&m.demand, bw, m.cpus) as u64
        });
        WhatIfResult {
            quota_ns: quota_ns.or(m.as_ref().map(|m| m.bw.quota_ns)),
            period_ns,
            burst_ns: self.burst_ns.or(m.as_ref().map(|m| m.bw.burst_ns)),
            observed_throttled_ns: c.kernel_throttled_ns(),
            predicted_throttled_ns: predicted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_what_if_names_the_part_and_what_is_accepted() {
        let err = |s: &str| WhatIf::parse(s).unwrap_err();
        assert_eq!(
            err("quota30ms"),
            WhatIfError::NotKeyValue {
                whole: "quota30ms".into(),
                part: "quota30ms".into()
            }
        );
        assert_eq!(
            err("cpus=1,quota=10ms"),
            WhatIfError::QuotaTwice {
                whole: "cpus=1,quota=10ms".into()
            }
        );
        let unknown = err("limit=2").to_string();
        assert!(
            unknown.starts_with(
                "--what-if \"limit=2\": unknown key \"limit\"; expected comma-separated quota=DURATION"
            ),
            "{unknown}"
        );
        assert_eq!(
            err(",").to_string().split(';').next(),
            Some("--what-if \",\": nothing to change")
        );
        let value = err("burst=fast").to_string();
        assert!(
            value.starts_with("--what-if: ") && value.contains("fast"),
            "{value}"
        );
        assert!(WhatIf::parse("cpus=1.5,burst=10ms").is_ok());
    }
}
