//! Durations as Prometheus writes them (`30s`, `5m`, `6h`, `7d`, `2w`,
//! `1d12h`), and the window cut into chunks of at most a day.

use std::time::Duration;

/// `7d`, `1d12h`, `90m`: units s, m, h, d, w; whole numbers; more than 0.
pub fn parse(field: &str, v: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{field} {v:?}: expected a duration such as 30m, 6h, 7d or 1d12h (units s, m, h, d, w)"
        )
    };
    let mut total = 0u64;
    let mut num = String::new();
    for c in v.trim().chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 7 * 86_400,
            _ => return Err(bad()),
        };
        let n: u64 = num.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|x| total.checked_add(x))
            .ok_or_else(bad)?;
        num.clear();
    }
    if !num.is_empty() || total == 0 || total > 400 * 86_400 {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

/// A duration in Prometheus' own notation, whole seconds.
pub fn promql(d: Duration) -> String {
    format!("{}s", d.as_secs().max(1))
}

/// The window `[end - window, end]` as chunks of at most `chunk`, newest
/// first: (chunk's end, its length). Increases over adjacent chunks add up
/// to the window's; each query then reads at most a chunk's samples.
pub fn chunks(end: f64, window: Duration, chunk: Duration) -> Vec<(f64, Duration)> {
    let mut out = Vec::new();
    let mut left = window.as_secs();
    let mut at = end;
    while left > 0 {
        let n = left.min(chunk.as_secs().max(1));
        out.push((at, Duration::from_secs(n)));
        at -= n as f64;
        left -= n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_chunks() {
        assert_eq!(parse("--window", "7d").unwrap().as_secs(), 7 * 86_400);
        assert_eq!(parse("--window", "1d12h").unwrap().as_secs(), 36 * 3600);
        assert_eq!(parse("--window", "90s").unwrap().as_secs(), 90);
        for bad in ["", "7", "7x", "0s", "d", "-1d", "1.5h", "1000d"] {
            let e = parse("--window", bad).unwrap_err();
            assert!(
                e.contains("--window") && e.contains("expected"),
                "{bad}: {e}"
            );
        }
        let c = chunks(
            1000.0,
            Duration::from_secs(2 * 86_400 + 60),
            Duration::from_secs(86_400),
        );
        assert_eq!(c.len(), 3);
        assert_eq!(c[0], (1000.0, Duration::from_secs(86_400)));
        assert_eq!(c[2].1, Duration::from_secs(60));
        assert_eq!(c[2].0, 1000.0 - 2.0 * 86_400.0);
    }
}
