//! Recovery while `nvraid serve` runs: members added, removed and replaced
//! through the control socket, hot spares that take over by themselves when
//! a member fails, and the rebuild beside the clients (md's way: paced
//! between MIN and MAX MB/s, each step holding its region against client
//! writes).
//!
//! One recovery thread does the work; control commands only change the
//! array (a member joins or leaves, durably recorded) and wake it. Every
//! 200 ms, or when woken, it:
//! 1. puts a spare into a role with no working member (md's spare taking
//!    over), while spares remain;
//! 2. rebuilds every member being recovered, from its checkpoint, until
//!    done or the server stops (the checkpoint is recorded: the next run
//!    resumes there).

use nvraid_array::recovery::{self, Added, RebuildPace};
use nvraid_array::Array;
use nvraid_member::{Member, OpenOptions};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the recovery thread is doing and has done, for `status`.
#[derive(Debug, Default)]
pub struct RecoveryState {
    /// Hot spares not yet used (paths), in the order they take over.
    pub spares: Vec<String>,
    /// The rebuild running or last run.
    pub rebuild: Option<RebuildStatus>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RebuildStatus {
    pub role: u32,
    pub member: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub copied_bytes: u64,
    pub rate_bytes_per_second: u64,
    pub eta_seconds: f64,
    pub finished: bool,
    pub error: Option<String>,
}

/// A check or repair run through the control socket.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ScrubStatus {
    pub mode: &'static str,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished: bool,
    pub result: Option<recovery::Scrubbed>,
    pub error: Option<String>,
}

/// The recovery service of one server.
pub struct Online {
    array: Arc<Array>,
    state: Mutex<RecoveryState>,
    scrub: Mutex<(Option<ScrubStatus>, Option<std::thread::JoinHandle<()>>)>,
    wake: Condvar,
    stop: AtomicBool,
    pace: (Option<u64>, Option<u64>),
    direct: bool,
}

impl Online {
    /// `pace`: md's MIN and MAX rebuild rates, bytes per second.
    pub fn new(array: Arc<Array>, pace: (Option<u64>, Option<u64>), direct: bool) -> Arc<Online> {
        let spares = array
            .set_aside()
            .iter()
            .filter(|m| m.reason == nvraid_array::SetAside::Spare)
            .map(|m| m.spec.clone())
            .collect();
        Arc::new(Online {
            array,
            state: Mutex::new(RecoveryState {
                spares,
                rebuild: None,
            }),
            scrub: Mutex::new((None, None)),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            pace,
            direct,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecoveryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start the recovery thread (nothing runs on a read-only array).
    pub fn start(self: &Arc<Self>) -> Option<std::thread::JoinHandle<()>> {
        if !self.array.is_writable() || !self.array.geometry().level().is_redundant() {
            return None;
        }
        let me = self.clone();
        Some(
            std::thread::Builder::new()
                .name("nvraid-recovery".into())
                .spawn(move || me.run())
                .expect("spawn the recovery thread"),
        )
    }

    /// Stop the threads at their next step (a rebuild records its
    /// checkpoint, a repair its resync point) and wait for a check or
    /// repair to end.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_all();
        let thread = self.scrub_lock().1.take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    #[allow(clippy::type_complexity)]
    fn scrub_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, (Option<ScrubStatus>, Option<std::thread::JoinHandle<()>>)> {
        self.scrub.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `check` or `repair` in the background; `status` shows its progress
    /// and, at the end, what it found.
    fn scrub(self: &Arc<Self>, mode: recovery::Mode) -> Result<Value, String> {
        if !self.array.geometry().level().is_redundant() {
            return Err("check or repair of a raid0 (it keeps no copies to compare)".into());
        }
        if mode == recovery::Mode::Repair && !self.array.is_writable() {
            return Err("the array is served read-only".into());
        }
        if mode == recovery::Mode::Repair && self.array.resync_from().is_some() {
            return Err(
                "the server is resyncing the array (status shows it); repair after it ends".into(),
            );
        }
        let mut scrub = self.scrub_lock();
        if scrub.0.as_ref().is_some_and(|s| !s.finished) {
            return Err("a check or repair is already running".into());
        }
        if let Some(thread) = scrub.1.take() {
            let _ = thread.join();
        }
        let name = if mode == recovery::Mode::Check {
            "check"
        } else {
            "repair"
        };
        scrub.0 = Some(ScrubStatus {
            mode: name,
            ..ScrubStatus::default()
        });
        let me = self.clone();
        scrub.1 = Some(
            std::thread::Builder::new()
                .name(format!("nvraid-{name}"))
                .spawn(move || {
                    let pace = recovery::Pace {
                        max_rate: None,
                        stop: Some(&me.stop),
                    };
                    let outcome = recovery::scrub_with(&me.array, mode, &pace, &mut |p| {
                        if let Some(s) = me.scrub_lock().0.as_mut() {
                            s.done_bytes = p.done_bytes;
                            s.total_bytes = p.total_bytes;
                        }
                    });
                    let mut scrub = me.scrub_lock();
                    let s = scrub.0.get_or_insert_with(ScrubStatus::default);
                    s.finished = true;
                    match outcome {
                        Ok(found) => {
                            eprintln!(
                                "nvraid: {name} while serving: {} mismatched sectors in {} regions",
                                found.mismatch_sectors,
                                found.regions.len()
                            );
                            s.result = Some(found);
                        }
                        Err(e) => {
                            eprintln!("nvraid: {name} while serving failed: {e}");
                            s.error = Some(e.to_string());
                        }
                    }
                })
                .map_err(|e| e.to_string())?,
        );
        Ok(json!({"started": name}))
    }

    fn run(&self) {
        while !self.stop.load(Ordering::Acquire) {
            self.take_spares();
            self.rebuild();
            let state = self.lock();
            let _ = self
                .wake
                .wait_timeout(state, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// md's hot spare: a role with no working member gets the next spare.
    fn take_spares(&self) {
        let array = &self.array;
        while (0..array.roles()).any(|r| !array.is_usable(r)) {
            let Some(spec) = ({
                let mut state = self.lock();
                (!state.spares.is_empty()).then(|| state.spares.remove(0))
            }) else {
                return;
            };
            let taken = open_member(&spec, self.direct)
                .map_err(|e| e.to_string())
                .and_then(|m| recovery::add_member_to(array, m).map_err(|e| e.to_string()));
            match taken {
                Ok(Added::Recovering { role }) => {
                    eprintln!("nvraid: hot spare {spec} takes over role {role}; rebuilding")
                }
                Ok(Added::Spare) => {
                    self.lock().spares.insert(0, spec);
                    return;
                }
                Err(e) => eprintln!("nvraid: hot spare {spec} cannot take over: {e}"),
            }
        }
    }

    fn rebuild(&self) {
        let array = &self.array;
        let recovering =
            (0..array.roles()).any(|r| array.is_usable(r) && array.in_sync_bytes(r).is_some());
        if !recovering {
            return;
        }
        let pace = RebuildPace {
            min_rate: self.pace.0,
            max_rate: self.pace.1,
            stop: Some(&self.stop),
        };
        let started = Instant::now();
        let outcome = recovery::rebuild_online(array, &pace, &mut |p| {
            let member = array
                .slot(p.role as usize)
                .map(|s| s.member.spec().to_string())
                .unwrap_or_default();
            let seconds = p.elapsed.as_secs_f64().max(1e-3);
            let mut state = self.lock();
            let entry = state.rebuild.get_or_insert_with(RebuildStatus::default);
            if entry.role != p.role || entry.member != member || entry.finished {
                *entry = RebuildStatus {
                    role: p.role,
                    member,
                    ..RebuildStatus::default()
                };
                eprintln!("nvraid: rebuilding role {} while serving", p.role);
            }
            entry.done_bytes = p.done_bytes;
            entry.total_bytes = p.total_bytes;
            let rate = p.done_bytes as f64 / seconds;
            entry.rate_bytes_per_second = rate as u64;
            entry.eta_seconds = if rate > 0.0 {
                (p.total_bytes - p.done_bytes) as f64 / rate
            } else {
                0.0
            };
        });
        let mut state = self.lock();
        let entry = state.rebuild.get_or_insert_with(RebuildStatus::default);
        match outcome {
            Ok(done) => {
                for r in &done {
                    entry.copied_bytes = r.bytes;
                    if array.in_sync_bytes(r.role as usize).is_none() {
                        entry.finished = true;
                        entry.eta_seconds = 0.0;
                        eprintln!(
                            "nvraid: role {} rebuilt while serving: {} bytes in {:.1} s",
                            r.role,
                            r.bytes,
                            started.elapsed().as_secs_f64()
                        );
                    } else {
                        eprintln!(
                            "nvraid: rebuild of role {} stopped at byte {}; it resumes there",
                            r.role, entry.done_bytes
                        );
                    }
                }
            }
            Err(e) => {
                eprintln!("nvraid: rebuild failed: {e}; the array stays degraded");
                entry.error = Some(e.to_string());
                drop(state);
                // Do not spin on a failing target: wait for a command.
                let state = self.lock();
                let _ = self
                    .wake
                    .wait_timeout(state, Duration::from_secs(5))
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// `status`: the spares left, the rebuild, and a check or repair.
    pub fn status(&self) -> Value {
        let scrub = self.scrub_lock().0.clone();
        let state = self.lock();
        json!({"spares": state.spares, "rebuild": state.rebuild, "scrub": scrub})
    }

    /// Control commands: `add`, `remove`, `replace`, `check`, `repair` (and
    /// `fail`, which the caller handles). Each answers once the array's superblocks record the
    /// change; a rebuild then runs in the background.
    pub fn command(self: &Arc<Self>, request: &Value) -> Option<Value> {
        let result = match request["command"].as_str()? {
            "add" => self.add(request),
            "remove" => self.remove(request),
            "replace" => self.replace(request),
            "check" => self.scrub(recovery::Mode::Check),
            "repair" => self.scrub(recovery::Mode::Repair),
            _ => return None,
        };
        self.wake.notify_all();
        Some(result.unwrap_or_else(|e| json!({"error": e})))
    }

    fn add(&self, request: &Value) -> Result<Value, String> {
        let spec = field(request, "member")?;
        let force = request["force"].as_bool().unwrap_or(false);
        if let Ok(role) = super::manage::role_of(&self.array, spec) {
            return Err(if self.array.is_faulty(role) {
                format!("{spec}: faulty in role {role} of this array; remove it first, then add it again")
            } else {
                format!("{spec}: already a working member of this array (role {role})")
            });
        }
        let member = open_member(spec, self.direct)?;
        if !force {
            if let Ok(sb) = nvraid_array::read_superblock(&member) {
                if sb.set_uuid == self.array.superblock().set_uuid {
                    let role = recovery::re_add_to(&self.array, member)
                        .map_err(|e| format!("{e} (add it with force for a full rebuild)"))?;
                    return Ok(json!({"role": role, "re_added": true}));
                }
            }
            check_blank(&member)?;
        }
        if self
            .array
            .slots()
            .iter()
            .flatten()
            .any(|s| member.identity().is_some() && s.member.identity() == member.identity())
        {
            return Err(format!("{spec}: already a member of this array"));
        }
        match recovery::add_member_to(&self.array, member).map_err(|e| e.to_string())? {
            Added::Recovering { role } => Ok(json!({"role": role})),
            Added::Spare => {
                self.lock().spares.push(spec.to_string());
                Ok(json!({"spare": true}))
            }
        }
    }

    fn remove(&self, request: &Value) -> Result<Value, String> {
        let spec = field(request, "member")?;
        {
            let mut state = self.lock();
            if let Some(i) = state.spares.iter().position(|s| s == spec) {
                state.spares.remove(i);
                return Ok(json!({"spare_removed": true}));
            }
        }
        let role = super::manage::role_of(&self.array, spec).map_err(|e| e.to_string())?;
        self.array.remove_member(role).map_err(|e| e.to_string())?;
        Ok(json!({"role": role, "events": self.array.events()}))
    }

    fn replace(&self, request: &Value) -> Result<Value, String> {
        let old = field(request, "old")?;
        let new = field(request, "new")?;
        let force = request["force"].as_bool().unwrap_or(false);
        let role = super::manage::role_of(&self.array, old).map_err(|e| e.to_string())?;
        let member = open_member(new, self.direct)?;
        if !force {
            check_blank(&member)?;
        }
        let needed = self.array.superblock().data_offset_sectors * 512
            + self.array.geometry().member_used_bytes_of(role as u32);
        if member.size_bytes() < needed {
            return Err(format!(
                "{new}: {} bytes is too small: a member of this array needs {needed} bytes",
                member.size_bytes()
            ));
        }
        self.array
            .fail_member(role, &super::manage::administrator())
            .map_err(|e| e.to_string())?;
        self.array.remove_member(role).map_err(|e| e.to_string())?;
        match recovery::add_member_to(&self.array, member).map_err(|e| e.to_string())? {
            Added::Recovering { role } => Ok(json!({"role": role})),
            Added::Spare => Err(format!("{new}: no role was free after failing {old}")),
        }
    }
}

fn field<'a>(request: &'a Value, name: &str) -> Result<&'a str, String> {
    request[name]
        .as_str()
        .ok_or_else(|| format!("needs \"{name}\""))
}

fn open_member(spec: &str, direct: bool) -> Result<Member, String> {
    Member::open(
        spec,
        OpenOptions {
            write: true,
            create_bytes: None,
            direct,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())
}

/// Refuse a member that carries a filesystem or another md superblock.
fn check_blank(member: &Member) -> Result<(), String> {
    if member.is_persistent() {
        if let Some(what) =
            nvraid_array::detect_signature(member).map_err(|e| format!("{}: {e}", member.spec()))?
        {
            return Err(format!(
                "{}: already carries {what} (use --force to overwrite it)",
                member.spec()
            ));
        }
    }
    Ok(())
}
