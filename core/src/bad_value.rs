//! A configuration value out of range, named by its field.

/// A configuration value out of range: the field, its value and what is
/// accepted ("log_keep = 500: expected 0 to 100 parts").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value}: expected {accepted}")]
pub struct BadValue {
    pub field: String,
    pub value: String,
    pub accepted: String,
}

impl BadValue {
    pub fn new(field: &str, value: impl ToString, accepted: &str) -> BadValue {
        BadValue {
            field: field.into(),
            value: value.to_string(),
            accepted: accepted.into(),
        }
    }
}
