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

fn add(online: &Arc<Online>, request: &Value) -> Result<Value, String> {
    let spec = field(request, "member")?;
    let force = request["force"].as_bool().unwrap_or(false);
    let joined = match online.add(spec, force) {
        Ok(joined) => joined,
        // udev's add event (`assemble --incremental`) asks while udev
        // itself still holds the new device (it locks a disk while it
        // handles its event, and the event waits for its command): the
        // server takes it once it is free, on a thread of its own.
        Err(e) if request["when_free"] == true && e.contains("in use by") => {
            add_when_free(online, spec.to_string(), force);
            return Ok(json!({"pending": true, "reason": e}));
        }
        Err(e) => return Err(e),
    };
    Ok(joined_json(&joined))
}

fn joined_json(joined: &Joined) -> Value {
    match joined {
        Joined::ReAdded { role } => json!({"role": role, "re_added": true}),
        Joined::Recovering { role } => json!({"role": role}),
        Joined::Spare => json!({"spare": true}),
    }
}

/// Seconds [`add_when_free`] goes on asking.
const WHEN_FREE_TRIES: u32 = 60;

/// Add `spec` once no other process holds it: asked again every second,
/// up to `tries` times, while `stopped` says no (`waiting` is told the
/// first refusal). `None` when stopped first; the last answer otherwise.
/// Shared by udev's add event ([`add_when_free`]) and `serve --re-add`.
pub fn add_retrying_while_busy(
    online: &Online,
    spec: &str,
    force: bool,
    tries: u32,
    stopped: &dyn Fn() -> bool,
    waiting: &dyn Fn(&str),
) -> Option<Result<Joined, String>> {
    let mut tried = 0;
    loop {
        tried += 1;
        match online.add(spec, force) {
            Err(e) if e.contains("in use by") && tried < tries => {
                if tried == 1 {
                    waiting(&e);
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
                if stopped() {
                    return None;
                }
            }
            other => return Some(other),
        }
    }
}

/// The log line of a re-add's outcome (`event=re-added ...` or
/// `event=re-add-refused ...`).
pub fn re_add_line(spec: &str, outcome: &Result<Joined, String>) -> String {
    match outcome {
        Ok(joined) => format!(
            "nvraid: event=re-added member={spec} {}",
            match joined {
                Joined::ReAdded { role } => format!("role={role} recovery=bitmap"),
                Joined::Recovering { role } => format!("role={role} recovery=full"),
                Joined::Spare => "spare=true".to_string(),
            }
        ),
        Err(e) => format!("nvraid: event=re-add-refused member={spec} reason=\"{e}\""),
    }
}

/// Add `spec` once udev lets go of it, on a thread of its own, for up to
/// [`WHEN_FREE_TRIES`] seconds or until the server stops; the outcome
/// logged (the service's journal) as `--re-add` logs its own.
fn add_when_free(online: &Arc<Online>, spec: String, force: bool) {
    let online = Arc::clone(online);
    let member = spec.clone();
    let spawned = std::thread::Builder::new()
        .name("nvraid-add-when-free".into())
        .spawn(move || {
            let stopped = || online.is_stopping();
            // The first refusal is the caller's answer already.
            let outcome =
                add_retrying_while_busy(&online, &spec, force, WHEN_FREE_TRIES, &stopped, &|_| {});
            if let Some(outcome) = outcome {
                eprintln!("{}", re_add_line(&spec, &outcome));
                online.wake();
            }
        });
    if let Err(e) = spawned {
        eprintln!("nvraid: event=re-add-refused member={member} reason=\"no thread: {e}\"");
    }
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
