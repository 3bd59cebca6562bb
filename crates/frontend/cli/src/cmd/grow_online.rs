//! `grow` on the control socket of a running `nvraid serve`: the served
//! RAID 4/5/6 or RAID 10 near gains members while clients read and write
//! (`nvraid_array::reshape::LiveGrow`), a served RAID 1 mirrors
//! (`LiveMirror`: the new members rebuilt), a served RAID 4/5/6 is
//! restriped, or a RAID 10 near's chunk changed (`--chunk`/`--layout`:
//! `LiveGrow::start_shape`), a served RAID 4/5/6 or RAID 10 near shrunk
//! by members (`-n` fewer, `--array-size`: `LiveGrow::start_shrink`, the
//! rows moved backwards), a served array changes its level where md
//! moves no byte (`LiveLevel`), and `status` shows it. Two level changes
//! are a takeover and a reshape: a served RAID 1 of two taken over as a
//! RAID 5 and grown in one request (every check of both made first), and
//! a served RAID 5 shrunk to two, then taken over as RAID 1 by a thread
//! of the server when the shrink ends (`then_level` in `status` meanwhile;
//! a stopped or failed shrink makes no takeover).
//! One reshape at a time; once one ends the served array takes its shape
//! (`Array::swap_shape`) and another may start in the same run. The
//! thread that moves the rows is stopped (after its step) before the
//! array is closed.

use nvraid_array::recovery::online::{Online, ResyncState};
use nvraid_array::reshape::{
    start_live, LiveGrow, LiveGrowOptions, LiveLevel, LiveQ, LiveReshape, LiveShapeOptions,
    LiveShrinkOptions, LiveSize, LiveSizeOptions, SizeTarget,
};
use nvraid_array::Array;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The served array's grow, once one was asked for.
pub struct Reshaping {
    array: Arc<Array>,
    online: Arc<Online>,
    direct: bool,
    /// `serve --reshape-speed`'s (MIN, MAX), bytes per second.
    pace: (Option<u64>, Option<u64>),
    /// The server's resync state: a `--size` change's resync of the new
    /// region reports there (`status`'s `array.resync`).
    resync: Arc<Mutex<ResyncState>>,
    live: Arc<Mutex<Option<Running>>>,
    /// A level change's levels and counts, shown beside its status (until
    /// another reshape starts).
    level_switched: Arc<Mutex<Option<Value>>>,
    /// A takeover the server makes once the running reshape ends (`grow
    /// --level 1 --array-size` of a RAID 5 of more than two: the shrink to
    /// two, then the RAID 1): its state for `status`, and the thread that
    /// waits for the shrink's end to make it.
    then: Arc<Then>,
    then_thread: Mutex<Option<JoinHandle<()>>>,
}

/// The takeover chained after a served shrink (see `Reshaping::then`).
#[derive(Default)]
struct Then {
    /// `{"md_level": 1, "state": "pending" | "failed", "error": ..}` while
    /// one waits or after it failed; `None` once made (or never asked).
    state: Mutex<Option<Value>>,
    /// The server is stopping: the shrink's end makes no takeover.
    stopping: std::sync::atomic::AtomicBool,
}

/// A request's `add`: the paths of the members it adds.
fn add_paths(request: &Value) -> Result<Vec<String>, String> {
    request["add"]
        .as_array()
        .ok_or("\"add\" lists the paths of the new members")?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| "\"add\" lists paths".to_string())
        })
        .collect()
}

/// A request's `force` (false when not given).
fn forced(request: &Value) -> bool {
    request["force"].as_bool().unwrap_or(false)
}

/// A request's `step_bytes`: the most array bytes between two recorded
/// positions (16 MiB when not given, as the command's `--step`).
fn step_bytes(request: &Value) -> u64 {
    request["step_bytes"].as_u64().unwrap_or(16 << 20)
}

/// The event line of a level change the server made.
fn log_level_changed(switched: &nvraid_array::reshape::LevelSwitched) {
    eprintln!(
        "nvraid: event=level-changed level={}->{} raid_disks={}->{} events={}",
        switched.level_before,
        switched.level,
        switched.raid_disks_before,
        switched.raid_disks,
        switched.events
    );
}

/// A grow started: its handle and the thread moving its rows (taken when
/// joined).
type Running = (Arc<dyn LiveReshape>, Option<JoinHandle<()>>);

impl Reshaping {
    pub fn new(
        array: Arc<Array>,
        online: Arc<Online>,
        direct: bool,
        pace: (Option<u64>, Option<u64>),
        resync: Arc<Mutex<ResyncState>>,
    ) -> Reshaping {
        Reshaping {
            array,
            online,
            direct,
            pace,
            resync,
            live: Arc::new(Mutex::new(None)),
            level_switched: Arc::new(Mutex::new(None)),
            then: Arc::new(Then::default()),
            then_thread: Mutex::new(None),
        }
    }

    /// `{"command": "grow", "raid_devices": N, "add": [..], "force": b,
    /// "step_bytes": n}`: answered once every superblock records the
    /// reshape (the rows then move in the background); `None` for other
    /// commands.
    pub fn command(&self, request: &Value) -> Option<Value> {
        if request["command"].as_str()? != "grow" {
            return None;
        }
        if let Some(Value::Object(then)) =
            &*self.then.state.lock().unwrap_or_else(|p| p.into_inner())
        {
            if then.get("state").and_then(Value::as_str) == Some("pending") {
                return Some(
                    json!({"error": "the running shrink to two members is followed by the takeover as RAID 1 (`grow --level 1`): wait for both to end (`nvraid status`)"}),
                );
            }
        }
        if request["level"].as_i64() == Some(5) && !request["add"].is_null() {
            return Some(
                self.raid5_grown(request)
                    .unwrap_or_else(|e| json!({"error": e})),
            );
        }
        if request["level"].as_i64() == Some(1) && !request["array_size"].is_null() {
            return Some(
                self.raid1_of_shrunk(request)
                    .unwrap_or_else(|e| json!({"error": e})),
            );
        }
        if !request["size"].is_null() {
            return Some(self.size(request).unwrap_or_else(|e| json!({"error": e})));
        }
        if request["level"].as_i64() == Some(10) && !request["add"].is_null() {
            return Some(
                self.raid10_of_raid0(request)
                    .unwrap_or_else(|e| json!({"error": e})),
            );
        }
        if !request["level"].is_null() && !request["add"].is_null() {
            return Some(self.add_q(request).unwrap_or_else(|e| json!({"error": e})));
        }
        if !request["level"].is_null() {
            return Some(self.level(request).unwrap_or_else(|e| json!({"error": e})));
        }
        Some(self.grow(request).unwrap_or_else(|e| json!({"error": e})))
    }

    /// `{"command": "grow", "level": N}`: the served array taken over as
    /// md level N where md moves no byte; answered once every kept
    /// member records it (what changed: `LevelSwitched`).
    fn level(&self, request: &Value) -> Result<Value, String> {
        let to = request["level"]
            .as_i64()
            .ok_or("\"level\" is md's level number")? as i32;
        let mut live = self.settled("change the level")?;
        let changed = LiveLevel::start(&self.array, to).map_err(|e| e.to_string())?;
        let switched = changed.switched();
        eprintln!(
            "nvraid: event=level-changed level={}->{} raid_disks={}->{} events={}",
            switched.level_before,
            switched.level,
            switched.raid_disks_before,
            switched.raid_disks,
            switched.events
        );
        let changed: Arc<dyn LiveReshape> = changed;
        *live = Some((changed, None));
        // A takeover chained after a shrink that failed is made now.
        *self.then.state.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let answer = serde_json::to_value(&switched).map_err(|e| e.to_string())?;
        *self
            .level_switched
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(answer.clone());
        Ok(answer)
    }

    /// `{"command": "grow", "level": 10, "add": [NEW...], "raid_devices":
    /// 2N (optional), "force": b}`: the served RAID 0 of N taken over as
    /// md's RAID 10 near=2 of 2N (`LiveLevel`: role k becoming 2k, the
    /// second copies missing), then each NEW put into a missing role (the
    /// lowest first) and rebuilt by the recovery thread while clients go
    /// on. Every NEW is checked before anything is written. Answered once
    /// the takeover is recorded and the new members joined (`added`: each
    /// with its role); a member that could not join then is named
    /// (`add_error`), the array serving as a degraded RAID 10.
    fn raid10_of_raid0(&self, request: &Value) -> Result<Value, String> {
        let add = add_paths(request)?;
        let force = forced(request);
        let geometry = self.array.geometry().clone();
        let n = geometry.members();
        if !add.is_empty() || !request["raid_devices"].is_null() {
            if geometry.level() != nvraid_layout::Level::Raid0 {
                return Err(format!(
                    "--level 10 with -n/--add on a served {}: md doubles the members this way of a RAID 0 only",
                    geometry.level()
                ));
            }
            if let Some(raid_devices) = request["raid_devices"].as_u64() {
                if raid_devices != 2 * u64::from(n) {
                    return Err(format!(
                        "--raid-devices {raid_devices}: a RAID 0 of {n} becomes a RAID 10 near=2 of {} (md doubles the members)",
                        2 * n
                    ));
                }
            }
            if add.len() > n as usize {
                return Err(format!(
                    "{} members added: a RAID 0 of {n} taken over as a RAID 10 near=2 of {} has {n} second copies to fill (one --add each, or fewer and `nvraid add --socket` later)",
                    add.len(),
                    2 * n
                ));
            }
        }
        for (i, spec) in add.iter().enumerate() {
            if add[..i].contains(spec) {
                return Err(format!("{spec}: given twice with --add"));
            }
            self.online
                .check_joining(spec, force, geometry.member_used_bytes())?;
        }
        let mut live = self.settled("change the level")?;
        let changed = LiveLevel::start(&self.array, 10).map_err(|e| e.to_string())?;
        let switched = changed.switched();
        eprintln!(
            "nvraid: event=level-changed level={}->{} raid_disks={}->{} events={}",
            switched.level_before,
            switched.level,
            switched.raid_disks_before,
            switched.raid_disks,
            switched.events
        );
        let changed: Arc<dyn LiveReshape> = changed;
        *live = Some((changed, None));
        let mut answer = serde_json::to_value(&switched).map_err(|e| e.to_string())?;
        *self
            .level_switched
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(answer.clone());
        drop(live);
        // The second copies: each new member into the lowest missing role,
        // rebuilt in the background.
        let mut added = Vec::new();
        for spec in &add {
            match self.online.add(spec, force) {
                Ok(nvraid_array::recovery::online::Joined::Recovering { role }) => {
                    eprintln!("nvraid: {spec} takes role {role} of the RAID 10; rebuilding");
                    added.push(json!({"member": spec, "role": role}));
                }
                Ok(other) => {
                    answer["add_error"] = json!(format!(
                        "{spec}: joined as {other:?}, not into a missing role"
                    ));
                    break;
                }
                Err(e) => {
                    answer["add_error"] = json!(e);
                    break;
                }
            }
        }
        self.online.wake();
        answer["added"] = json!(added);
        Ok(answer)
    }

    /// `{"command": "grow", "level": 5, "raid_devices": N, "add": [NEW...],
    /// "force": b, "step_bytes": n}`: the served RAID 1 of two taken over as
    /// md's RAID 5 of two (`LiveLevel`, no byte moves), then that RAID 5
    /// grown to N members (`LiveGrow`) in the same request; every check of
    /// both parts made first (`check_raid5_grown`), nothing written when
    /// one refuses. A RAID 5 of two (a takeover made earlier, its grow
    /// not begun) is only grown. Answered once the grow is recorded:
    /// `level_changed` (what the takeover did, `null` when there was none)
    /// and the grow's `started`, `raid_disks`, `end_bytes`; a grow that
    /// could not start after the takeover is named in `grow_error` (the
    /// array serves as the RAID 5 of two).
    fn raid5_grown(&self, request: &Value) -> Result<Value, String> {
        let options = self.grow_options(request)?;
        let mut live = self.settled("change the level")?;
        let takeover = nvraid_array::reshape::check_raid5_grown(&self.array, &options)
            .map_err(|e| e.to_string())?;
        let mut answer = json!({"level_changed": null});
        if takeover {
            let changed = LiveLevel::start(&self.array, 5).map_err(|e| e.to_string())?;
            let switched = changed.switched();
            log_level_changed(&switched);
            answer["level_changed"] = serde_json::to_value(&switched).map_err(|e| e.to_string())?;
            let changed: Arc<dyn LiveReshape> = changed;
            *live = Some((changed, None));
        }
        match start_live(&self.array, &options) {
            Ok((grow, thread)) => {
                self.forget_level_change();
                let status = grow.status();
                eprintln!(
                    "nvraid: event=reshape-started raid_disks={}->{} end={}",
                    status.raid_disks_before, status.raid_disks, status.end_bytes
                );
                *live = Some((grow, Some(thread)));
                answer["started"] = json!("grow");
                answer["raid_disks"] = json!(status.raid_disks);
                answer["end_bytes"] = json!(status.end_bytes);
                Ok(answer)
            }
            Err(e) if takeover => {
                *self
                    .level_switched
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(answer["level_changed"].clone());
                answer["grow_error"] = json!(e.to_string());
                Ok(answer)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// `{"command": "grow", "level": 1, "array_size": n, "raid_devices": 2
    /// (optional), "force": b, "step_bytes": n}`: a served RAID 5 of more
    /// than two shrunk to two members (`LiveGrow::start_shrink`, with the
    /// offline shrink's checks), and when the shrink ends, the RAID 5 of
    /// two taken over as RAID 1 by the server (`LiveLevel`), as md makes
    /// it in two steps. Answered once the shrink is recorded; `status`
    /// shows the shrink with `then_level` (pending; failed with its
    /// reason), then the level change. Anything but a RAID 5 of more than
    /// two is the takeover alone (as offline: a RAID 5 of two is taken
    /// over at once, the other levels refused by it).
    fn raid1_of_shrunk(&self, request: &Value) -> Result<Value, String> {
        let reference = self.array.superblock().clone();
        if self.array.is_reshaping_live() || reference.level != 5 || reference.raid_disks <= 2 {
            return self.level(&json!({"command": "grow", "level": 1}));
        }
        let raid_devices = match &request["raid_devices"] {
            Value::Null => 2,
            v => v.as_u64().ok_or("\"raid_devices\" is a number")? as u32,
        };
        if raid_devices != 2 {
            return Err(format!(
                "--raid-devices {raid_devices} with --level 1: md takes a RAID 5 over as RAID 1 with two members, so it is shrunk to 2 first"
            ));
        }
        let mut shrink = request.clone();
        shrink["raid_devices"] = json!(2);
        let mut answer = self.shrink(&shrink)?;
        // The shrink is recorded and runs: the takeover waits for its end.
        *self.then.state.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(json!({"md_level": 1, "state": "pending"}));
        let running = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|(grow, thread)| thread.take().map(|t| (grow.clone(), t)));
        let Some((grow, shrink_thread)) = running else {
            return Err("the shrink started without a thread".into());
        };
        let array = Arc::downgrade(&self.array);
        let (live, level_switched, then) = (
            self.live.clone(),
            self.level_switched.clone(),
            self.then.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("nvraid-then-level".into())
            .spawn(move || {
                let _ = shrink_thread.join();
                let fail = |error: String| {
                    eprintln!("nvraid: event=level-change-failed level=5->1 reason=\"{error}\"");
                    *then.state.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(json!({"md_level": 1, "state": "failed", "error": error}));
                };
                let status = grow.status();
                if status.state != "finished" {
                    fail(format!(
                        "the shrink to two did not finish ({}); once a RAID 5 of two, take it over with `nvraid grow --level 1`",
                        status.error.as_deref().unwrap_or(status.state)
                    ));
                    return;
                }
                let mut live = live.lock().unwrap_or_else(|p| p.into_inner());
                if then.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    fail("the server stopped after the shrink to two; take the RAID 5 of two over with `nvraid grow --level 1`".into());
                    return;
                }
                let Some(array) = array.upgrade() else {
                    return;
                };
                match LiveLevel::start_after_shrink(&array, 1) {
                    Ok(changed) => {
                        let switched = changed.switched();
                        log_level_changed(&switched);
                        *level_switched.lock().unwrap_or_else(|p| p.into_inner()) =
                            serde_json::to_value(&switched).ok();
                        let changed: Arc<dyn LiveReshape> = changed;
                        *live = Some((changed, None));
                        *then.state.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    }
                    Err(e) => fail(e.to_string()),
                }
            })
            .map_err(|e| format!("no thread for the takeover after the shrink: {e}"))?;
        *self.then_thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
        answer["then_level"] = json!(1);
        Ok(answer)
    }

    /// A served grow's options from its request (`raid_devices`, `add`,
    /// `force`, `step_bytes`) and the server's pace.
    fn grow_options(&self, request: &Value) -> Result<LiveGrowOptions, String> {
        let raid_devices = request["raid_devices"]
            .as_u64()
            .ok_or("grow needs \"raid_devices\"")? as u32;
        let add = add_paths(request)?;
        Ok(LiveGrowOptions {
            raid_devices,
            add,
            direct: self.direct,
            force: forced(request),
            step_bytes: step_bytes(request),
            min_bytes_per_sec: self.pace.0,
            max_bytes_per_sec: self.pace.1,
        })
    }

    fn grow(&self, request: &Value) -> Result<Value, String> {
        if !request["chunk_bytes"].is_null() || !request["layout"].is_null() {
            return self.restripe(request);
        }
        if request["add"].is_null() {
            return self.shrink(request);
        }
        let options = self.grow_options(request)?;
        let mut live = self.settled("grow")?;
        let (grow, thread) = start_live(&self.array, &options).map_err(|e| e.to_string())?;
        self.forget_level_change();
        let status = grow.status();
        eprintln!(
            "nvraid: event=reshape-started raid_disks={}->{} end={}",
            status.raid_disks_before, status.raid_disks, status.end_bytes
        );
        *live = Some((grow, Some(thread)));
        Ok(
            json!({"started": "grow", "raid_disks": status.raid_disks, "end_bytes": status.end_bytes}),
        )
    }

    /// `{"command": "grow", "raid_devices": N, "array_size": n, "force":
    /// b, "step_bytes": n}` (no `add`): the served RAID 4/5/6 or RAID 10
    /// near shrunk to N members, its size capped to the smaller shape's
    /// first, the rows moved backwards (`LiveGrow::start_shrink`).
    fn shrink(&self, request: &Value) -> Result<Value, String> {
        let raid_devices = request["raid_devices"]
            .as_u64()
            .ok_or("grow needs \"raid_devices\"")? as u32;
        let array_size = match &request["array_size"] {
            Value::Null => None,
            v => Some(v.as_u64().ok_or("\"array_size\" is a number of bytes")?),
        };
        let mut live = self.settled("shrink")?;
        let options = LiveShrinkOptions {
            raid_devices,
            array_size,
            force: forced(request),
            step_bytes: step_bytes(request),
            min_bytes_per_sec: self.pace.0,
            max_bytes_per_sec: self.pace.1,
        };
        let (grow, thread) =
            LiveGrow::start_shrink(&self.array, &options).map_err(|e| e.to_string())?;
        self.forget_level_change();
        let status = grow.status();
        eprintln!(
            "nvraid: event=reshape-started kind=shrink raid_disks={}->{} end={}",
            status.raid_disks_before, status.raid_disks, status.end_bytes
        );
        *live = Some((grow, Some(thread)));
        Ok(
            json!({"started": "shrink", "raid_disks": status.raid_disks, "end_bytes": status.end_bytes}),
        )
    }

    /// `{"command": "grow", "level": 6, "raid_devices": N+1, "add":
    /// [NEW]}`: the served RAID 5 taken over as md's RAID 6 with Q on the
    /// new member, Q rebuilt there while clients go on (`LiveQ`).
    fn add_q(&self, request: &Value) -> Result<Value, String> {
        if request["level"].as_i64() != Some(6) {
            return Err(
                "a level change with members added is made on a served array only to RAID 6 (a RAID 5 gaining Q); stop serve for the others".into(),
            );
        }
        let options = self.grow_options(request)?;
        let mut live = self.settled("change the level")?;
        let (q, thread) = LiveQ::start(&self.array, &options).map_err(|e| e.to_string())?;
        let status = q.status();
        eprintln!(
            "nvraid: event=reshape-started kind=add-q raid_disks={}->{} end={}",
            status.raid_disks_before, status.raid_disks, status.end_bytes
        );
        let q: Arc<dyn LiveReshape> = q;
        *live = Some((q, Some(thread)));
        Ok(
            json!({"started": "add-q", "raid_disks": status.raid_disks, "end_bytes": status.end_bytes}),
        )
    }

    /// `{"command": "grow", "chunk_bytes": n, "layout": "name",
    /// "step_bytes": n}` (either or both of the first two): the served
    /// RAID 4/5/6 (or RAID 10 near) restriped with its members kept
    /// (`LiveGrow::start_shape`).
    fn restripe(&self, request: &Value) -> Result<Value, String> {
        let layout = match &request["layout"] {
            Value::Null => None,
            v => Some(
                v.as_str()
                    .ok_or("\"layout\" is a layout's name")?
                    .to_string(),
            ),
        };
        let chunk_bytes = match &request["chunk_bytes"] {
            Value::Null => None,
            v => Some(v.as_u64().ok_or("\"chunk_bytes\" is a number of bytes")?),
        };
        let mut live = self.settled("restripe")?;
        let options = LiveShapeOptions {
            chunk_bytes,
            layout,
            step_bytes: step_bytes(request),
            min_bytes_per_sec: self.pace.0,
            max_bytes_per_sec: self.pace.1,
        };
        let (grow, thread) =
            LiveGrow::start_shape(&self.array, &options).map_err(|e| e.to_string())?;
        self.forget_level_change();
        let status = grow.status();
        eprintln!(
            "nvraid: event=reshape-started kind=restripe raid_disks={} end={}",
            status.raid_disks, status.end_bytes
        );
        *live = Some((grow, Some(thread)));
        Ok(
            json!({"started": "restripe", "raid_disks": status.raid_disks, "end_bytes": status.end_bytes}),
        )
    }

    /// `{"command": "grow", "size": "max" | BYTES, "force": b}`: how much
    /// of each member the served array uses (`LiveSize`); answered once
    /// the served array has the new size (what changed: `SizeChanged`),
    /// the new region's resync then running in the background (`status`
    /// shows it where a dirty array's resync is shown, `array.resync`).
    fn size(&self, request: &Value) -> Result<Value, String> {
        let target = match &request["size"] {
            Value::String(s) if s == "max" => SizeTarget::Max,
            v => SizeTarget::MemberBytes(
                v.as_u64()
                    .ok_or("\"size\" is \"max\" or a number of bytes of each member")?,
            ),
        };
        let mut live = self.settled("change the size")?;
        let options = LiveSizeOptions {
            target,
            force: forced(request),
            max_bytes_per_sec: self.pace.1,
            progress: Some(self.resync.clone()),
        };
        let (resized, thread) =
            LiveSize::start(&self.array, &options).map_err(|e| e.to_string())?;
        self.forget_level_change();
        let changed = resized.changed(&self.array);
        eprintln!(
            "nvraid: event=size-changed size={}->{} member_bytes={}->{} resync_from={} events={}",
            changed.size_bytes_before,
            changed.size_bytes,
            changed.member_bytes_before,
            changed.member_bytes,
            changed
                .resync_from_bytes
                .map_or("none".to_string(), |b| b.to_string()),
            changed.events
        );
        let resized: Arc<dyn LiveReshape> = resized;
        *live = Some((resized, thread));
        serde_json::to_value(&changed).map_err(|e| e.to_string())
    }

    /// The running reshape's slot, held, once no rebuild, check or
    /// repair runs (else the refusal: `what` waits for it).
    fn settled(&self, what: &str) -> Result<std::sync::MutexGuard<'_, Option<Running>>, String> {
        if self.online.is_busy() {
            return Err(format!(
                "a rebuild, check or repair runs on the array (status shows it); {what} after it ends"
            ));
        }
        Ok(self.live.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A reshape started after a level change: the level change's fields
    /// no longer go with `status`'s reshape.
    fn forget_level_change(&self) {
        *self
            .level_switched
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        *self.then.state.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// A grow the members recorded, resumed at assembly (`serve` of an
    /// array left mid-grow): shown by `status`, stopped with the server,
    /// and a second one refused while it runs.
    pub fn resumed(&self, grow: Arc<LiveGrow>, thread: JoinHandle<()>) {
        let grow: Arc<dyn LiveReshape> = grow;
        *self.live.lock().unwrap_or_else(|p| p.into_inner()) = Some((grow, Some(thread)));
    }

    /// The grow's status for `status` (`None` before one started, and
    /// for a size change: its resync is `status`'s `array.resync`).
    pub fn status(&self) -> Option<Value> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let (grow, _) = live.as_ref()?;
        let status = grow.status();
        if status.kind == "size" {
            return None;
        }
        let shrink = status.kind == "shrink";
        let mut status = serde_json::to_value(status).ok()?;
        if let (true, Value::Object(fields)) = (shrink, &mut status) {
            // The leaving members that failed during it: faulty, not
            // spares.
            fields.insert("left_faulty".into(), json!(grow.left_faulty()));
        }
        let switched = self
            .level_switched
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let (Some(Value::Object(extra)), Value::Object(status)) = (&*switched, &mut status) {
            for key in [
                "md_level_before",
                "level_before",
                "md_level",
                "level",
                "events",
            ] {
                if let Some(v) = extra.get(key) {
                    status.insert(key.to_string(), v.clone());
                }
            }
        }
        if let (Some(then), Value::Object(status)) = (
            &*self.then.state.lock().unwrap_or_else(|p| p.into_inner()),
            &mut status,
        ) {
            status.insert("then_level".into(), then.clone());
        }
        Some(status)
    }

    /// Stop the grow after its step and wait for its thread (the position
    /// it recorded stays on the members: `nvraid serve` goes on from there
    /// the next time, or `nvraid grow --continue` finishes it offline).
    pub fn stop(&self) {
        // A takeover chained after a shrink is not made from here on; its
        // thread ends once the shrink's has.
        self.then
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let thread = {
            let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            live.as_mut().and_then(|(grow, thread)| {
                grow.stop();
                thread.take()
            })
        };
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        let then = self
            .then_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(then) = then {
            let _ = then.join();
        }
    }
}
