//! The control socket's recovery commands while `nvraid serve` runs:
//! `add`, `remove`, `replace`, `check`, `repair` and the `recovery` part of
//! `status`, read from and answered in JSON. The work is the array's
//! (`nvraid_array::recovery::online`).

use nvraid_array::recovery::online::{Joined, Online, Removed};
use nvraid_array::recovery::Mode;
use serde_json::{json, Value};
use std::sync::Arc;

/// `status`: the spares left, the rebuild, and a check or repair.
pub fn status(online: &Online) -> Value {
    serde_json::to_value(online.status()).unwrap_or_default()
}

/// Control commands: `add`, `remove`, `replace`, `check`, `repair` (and
/// `fail`, which the caller handles). Each answers once the array's
/// superblocks record the change; a rebuild then runs in the background.
pub fn command(online: &Arc<Online>, request: &Value) -> Option<Value> {
    let result = match request["command"].as_str()? {
        "add" => add(online, request),
        "remove" => remove(online, request),
        "replace" => replace(online, request),
        "check" => online
            .scrub(Mode::Check)
            .map(|name| json!({"started": name})),
        "repair" => online
            .scrub(Mode::Repair)
            .map(|name| json!({"started": name})),
        _ => return None,
    };
    online.wake();
    Some(result.unwrap_or_else(|e| json!({"error": e})))
}

fn add(online: &Online, request: &Value) -> Result<Value, String> {
    let spec = field(request, "member")?;
    let force = request["force"].as_bool().unwrap_or(false);
    Ok(match online.add(spec, force)? {
        Joined::ReAdded { role } => json!({"role": role, "re_added": true}),
        Joined::Recovering { role } => json!({"role": role}),
        Joined::Spare => json!({"spare": true}),
    })
}

fn remove(online: &Online, request: &Value) -> Result<Value, String> {
    let spec = field(request, "member")?;
    Ok(match online.remove(spec)? {
        Removed::Spare => json!({"spare_removed": true}),
        Removed::Role { role, events } => json!({"role": role, "events": events}),
    })
}

fn replace(online: &Online, request: &Value) -> Result<Value, String> {
    let old = field(request, "old")?;
    let new = field(request, "new")?;
    let force = request["force"].as_bool().unwrap_or(false);
    let role = online.replace(old, new, force)?;
    Ok(json!({"role": role}))
}

fn field<'a>(request: &'a Value, name: &str) -> Result<&'a str, String> {
    request[name]
        .as_str()
        .ok_or_else(|| format!("needs \"{name}\""))
}
