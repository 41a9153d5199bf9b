//! Walking a JSON spec document: objects created where absent, errors that
//! name the field and what it is.

use serde_json::{json, Map, Value};

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
) -> Result<&'a mut Map<String, Value>, String> {
    let obj = parent
        .as_object_mut()
        .ok_or_else(|| format!("\"{field}\" has a non-object parent"))?;
    let v = obj.entry(key).or_insert_with(|| json!({}));
    if v.is_null() {
        *v = json!({});
    }
    let k = kind(v);
    v.as_object_mut()
        .ok_or_else(|| format!("\"{field}\" is {k}; expected an object"))
}

/// The object at a path of keys (`["linux", "resources", "cpu"]`), created
/// level by level when absent.
pub fn object_path<'a>(
    spec: &'a mut Value,
    keys: &[&str],
) -> Result<&'a mut Map<String, Value>, String> {
    let mut cur = spec;
    for (i, k) in keys.iter().enumerate() {
        let field = keys[..=i].join(".");
        object_at(cur, k, &field)?;
        cur = cur
            .get_mut(*k)
            .ok_or_else(|| format!("\"{field}\" vanished"))?;
    }
    cur.as_object_mut()
        .ok_or_else(|| format!("\"{}\" is not an object", keys.join(".")))
}
