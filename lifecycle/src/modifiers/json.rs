//! Walking a JSON spec document: objects created where absent, errors that
//! name the field and what it is.

use serde_json::{json, Map, Value};

/// A spec field that is not what a modifier needs: the field, what it is,
/// what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("\"{field}\" is {kind}; expected {expected}")]
    Kind {
        field: String,
        kind: &'static str,
        expected: &'static str,
    },
    #[error("\"{field}\" has a non-object parent")]
    Parent { field: String },
}

impl FieldError {
    pub fn kind(field: &str, v: &Value, expected: &'static str) -> FieldError {
        FieldError::Kind {
            field: field.into(),
            kind: kind(v),
            expected,
        }
    }
}

pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `parent[key]` as an object, created when absent or null; an error
/// naming the field otherwise.
pub fn object_at<'a>(
    parent: &'a mut Value,
    key: &str,
    field: &str,
) -> Result<&'a mut Map<String, Value>, FieldError> {
    let obj = parent.as_object_mut().ok_or_else(|| FieldError::Parent {
        field: field.into(),
    })?;
    let v = obj.entry(key).or_insert_with(|| json!({}));
    if v.is_null() {
        *v = json!({});
    }
    if !v.is_object() {
        return Err(FieldError::kind(field, v, "an object"));
    }
    Ok(v.as_object_mut().expect("checked"))
}

/// The object at a path of keys (`["linux", "resources", "cpu"]`), created
/// level by level when absent.
pub fn object_path<'a>(
    spec: &'a mut Value,
    keys: &[&str],
) -> Result<&'a mut Map<String, Value>, FieldError> {
    let mut cur = spec;
    for (i, k) in keys.iter().enumerate() {
        let field = keys[..=i].join(".");
        object_at(cur, k, &field)?;
        cur = cur.get_mut(*k).expect("object_at made it an object");
    }
    let field = keys.join(".");
    match cur {
        Value::Object(m) => Ok(m),
        other => Err(FieldError::kind(&field, other, "an object")),
    }
}
