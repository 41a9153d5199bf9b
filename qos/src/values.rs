//! Parsers for the values of each key. Each returns a [`ValueError`] naming
//! what is accepted; the caller adds the key and the value.

use serde::Serialize;
use throttlewatch_core::cpulist::MAX_ID;
use throttlewatch_core::units::parse_duration;
use throttlewatch_core::CpuList;

use crate::keys::{Key, MAX_CPU_COUNT, MAX_DURATION};
use crate::targets::{BurstSpec, CpusetTarget};

pub const EXCLUSIVE_SUFFIX: &str = ",exclusive";

/// Why a value is not one its key accepts; the text says what is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not of the key's form.
    #[error("{}", .0.accepted())]
    NotAccepted(Key),
    #[error("duration is above the maximum of 10s; {}", .0.accepted())]
    AboveMaxDuration(Key),
    /// A burst percentage above `cap` (the policy's when below 100).
    #[error(
        "expected a percentage of the quota from 0% to {cap}%{why}, a whole number such as 50%",
        why = if *cap < 100 { " (policy maximum)" } else { "" }
    )]
    PercentOutOfRange { cap: u32 },
    #[error("NUMA node {0} is above the kernel's limit of {max}", max = MAX_ID)]
    NumaAboveLimit(u32),
    #[error("the CPU list is empty; {accepted}", accepted = Key::Cpuset.accepted())]
    EmptyCpuList,
    /// One item of a GPU list.
    #[error("{0:?} is neither a GPU index nor a UUID; {accepted}", accepted = Key::Gpus.accepted())]
    NotAGpu(String),
}

pub fn parse_bool(key: Key, s: &str) -> Result<bool, ValueError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ValueError::NotAccepted(key)),
    }
}

/// A duration from 0 to [`MAX_DURATION`], in microseconds.
pub fn parse_bounded_duration(key: Key, s: &str) -> Result<u64, ValueError> {
    let d = parse_duration(key.name(), s).map_err(|_| ValueError::NotAccepted(key))?;
    if d > MAX_DURATION {
        return Err(ValueError::AboveMaxDuration(key));
    }
    Ok(d.as_micros() as u64)
}

/// "20ms", "20000" (microseconds) or "50%" (of the quota, at most `cap_percent`).
pub fn parse_burst(s: &str, cap_percent: u32) -> Result<BurstSpec, ValueError> {
    let t = s.trim();
    let Some(num) = t.strip_suffix('%') else {
        return parse_bounded_duration(Key::CpuBurst, t).map(BurstSpec::Micros);
    };
    match num.trim().parse::<u64>() {
        Ok(p) if p <= cap_percent as u64 => Ok(BurstSpec::Percent(p as u32)),
        _ => Err(ValueError::PercentOutOfRange { cap: cap_percent }),
    }
}

/// A cpuset target and whether the `,exclusive` suffix was present.
pub fn parse_cpuset(s: &str) -> Result<(CpusetTarget, bool), ValueError> {
    let t = s.trim();
    let (t, exclusive) = match t.strip_suffix(EXCLUSIVE_SUFFIX) {
        Some(rest) => (rest.trim(), true),
        None => (t, false),
    };
    let target = match t {
        "gpu-local" => CpusetTarget::GpuLocal,
        "auto" => CpusetTarget::Auto,
        _ => match t.strip_prefix("numa:") {
            Some(n) => CpusetTarget::Numa(parse_node(n)?),
            None => CpusetTarget::List(parse_cpu_list(t)?),
        },
    };
    Ok((target, exclusive))
}

/// The N of `numa:N`.
fn parse_node(s: &str) -> Result<u32, ValueError> {
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|_| ValueError::NotAccepted(Key::Cpuset))?;
    if n > MAX_ID {
        return Err(ValueError::NumaAboveLimit(n));
    }
    Ok(n)
}

/// An explicit, non-empty CPU list.
fn parse_cpu_list(s: &str) -> Result<CpuList, ValueError> {
    let list =
        CpuList::parse(Key::Cpuset.name(), s).map_err(|_| ValueError::NotAccepted(Key::Cpuset))?;
    if list.is_empty() {
        return Err(ValueError::EmptyCpuList);
    }
    Ok(list)
}

/// `cpuset-cpus`: 1 ..= 4096 here; the plan checks it against the machine.
pub fn parse_count(s: &str) -> Result<u32, ValueError> {
    match s.trim().parse::<u64>() {
        Ok(n) if n != 0 && n <= MAX_CPU_COUNT as u64 => Ok(n as u32),
        _ => Err(ValueError::NotAccepted(Key::CpusetCpus)),
    }
}

/// The GPUs a container sees, as NVIDIA_VISIBLE_DEVICES writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuDevices {
    All,
    None,
    /// Indices ("0"), MIG notation ("0:1", the GPU before the colon), or UUIDs ("GPU-…", "MIG-…").
    List(Vec<String>),
}

pub fn parse_gpus(s: &str) -> Result<GpuDevices, ValueError> {
    let t = s.trim();
    match t.to_ascii_lowercase().as_str() {
        "all" => return Ok(GpuDevices::All),
        "" | "none" | "void" => return Ok(GpuDevices::None),
        _ => {}
    }
    let mut out = Vec::new();
    for item in t.split(',').map(str::trim) {
        if !valid_gpu_item(item) {
            return Err(ValueError::NotAGpu(item.to_string()));
        }
        out.push(item.to_string());
    }
    Ok(GpuDevices::List(out))
}

fn valid_gpu_item(item: &str) -> bool {
    let index = |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit());
    if let Some((g, m)) = item.split_once(':') {
        return index(g) && index(m);
    }
    if index(item) {
        return true;
    }
    let upper = item.to_ascii_uppercase();
    let body = upper
        .strip_prefix("GPU-")
        .or_else(|| upper.strip_prefix("MIG-"));
    matches!(body, Some(b) if !b.is_empty() && b.bytes().all(|c| c.is_ascii_hexdigit() || c == b'-' || c == b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts() {
        assert_eq!(parse_burst("20ms", 100), Ok(BurstSpec::Micros(20_000)));
        assert_eq!(parse_burst("500", 100), Ok(BurstSpec::Micros(500)));
        assert_eq!(parse_burst(" 50% ", 100), Ok(BurstSpec::Percent(50)));
        assert_eq!(parse_burst("0%", 100), Ok(BurstSpec::Percent(0)));
        assert_eq!(parse_burst("10s", 100), Ok(BurstSpec::Micros(10_000_000)));
        for bad in [
            "abc",
            "-5ms",
            "-5%",
            "101%",
            "12.5%",
            "%",
            "11s",
            "1h",
            "99999999999999999999%",
            "1e9ms",
        ] {
            assert!(parse_burst(bad, 100).is_err(), "{bad}");
        }
        let e = parse_burst("60%", 50).unwrap_err();
        assert_eq!(e, ValueError::PercentOutOfRange { cap: 50 });
        assert!(e.to_string().contains("0% to 50% (policy maximum)"), "{e}");
        let e = parse_burst("11s", 100).unwrap_err();
        assert_eq!(e, ValueError::AboveMaxDuration(Key::CpuBurst));
        assert!(e.to_string().contains("10s"), "{e}");
    }

    #[test]
    fn cpusets() {
        let (t, x) = parse_cpuset("0-3,8").unwrap();
        assert_eq!((t.to_string(), x), ("0-3,8".into(), false));
        let (t, x) = parse_cpuset("0-3,8,exclusive").unwrap();
        assert_eq!((t.to_string(), x), ("0-3,8".into(), true));
        assert_eq!(
            parse_cpuset("numa:1").unwrap(),
            (CpusetTarget::Numa(1), false)
        );
        assert_eq!(
            parse_cpuset("gpu-local,exclusive").unwrap(),
            (CpusetTarget::GpuLocal, true)
        );
        assert_eq!(parse_cpuset("auto").unwrap(), (CpusetTarget::Auto, false));
        for bad in [
            "",
            ",exclusive",
            "numa:",
            "numa:-1",
            "numa:x",
            "numa:5000",
            "3-1",
            "0-99999",
            "gpu",
            "all",
        ] {
            assert!(parse_cpuset(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counts_bools_durations() {
        assert_eq!(parse_count("4"), Ok(4));
        for bad in ["0", "-1", "4097", "1.5", "x", "99999999999999999999"] {
            assert!(parse_count(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_bool(Key::Watch, "TRUE"), Ok(true));
        assert!(parse_bool(Key::Watch, "yes").is_err());
        assert_eq!(parse_bounded_duration(Key::Threshold, "1ms"), Ok(1000));
        assert!(parse_bounded_duration(Key::Threshold, "-1ms").is_err());
        assert!(parse_bounded_duration(Key::Threshold, "1m").is_err());
    }

    #[test]
    fn gpu_lists() {
        assert_eq!(parse_gpus("all"), Ok(GpuDevices::All));
        assert_eq!(parse_gpus("void"), Ok(GpuDevices::None));
        assert_eq!(parse_gpus(""), Ok(GpuDevices::None));
        assert_eq!(
            parse_gpus("0, 3,GPU-8f6e1b2a-0000-1111-2222-333344445555,1:2"),
            Ok(GpuDevices::List(vec![
                "0".into(),
                "3".into(),
                "GPU-8f6e1b2a-0000-1111-2222-333344445555".into(),
                "1:2".into()
            ]))
        );
        for bad in ["0,,1", "gpu0", "GPU-", "-1", "0;1", "GPU-xyz", "12345"] {
            assert!(parse_gpus(bad).is_err(), "{bad}");
        }
    }
}
