//! The runtime's create time for the cold-start timeline.

use serde_json::{json, Value};
use throttlewatch_qos::Key;

use super::json::object_at;
use super::ModifyContext;

/// The create time as the `throttlewatch.io/created-unix-ns` annotation
/// ([`Key::CreatedUnixNs`]). A value already there (an earlier pass over
/// the same bundle) is kept.
pub fn stamp_create_time(spec: &mut Value, _ctx: &ModifyContext) -> Result<Option<String>, String> {
    let key = Key::CreatedUnixNs.annotation();
    let ann = object_at(spec, "annotations", "annotations")?;
    if ann
        .get(&key)
        .and_then(Value::as_str)
        .is_some_and(|v| v.parse::<u64>().is_ok())
    {
        return Ok(None);
    }
    let now = throttlewatch_core::logfmt::now_unix_ns().to_string();
    ann.insert(key.clone(), json!(now));
    Ok(Some(format!("annotations.{key}: {now}")))
}
