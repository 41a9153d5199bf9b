//! Numbers as the report writes them in sentences.

/// `1.50` as `1.5`, `2.00` as `2`: two decimals at most, no trailing zeros.
pub fn trim_float(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
