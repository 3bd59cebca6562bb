//! Recovery while the array is served: members added, removed and
//! replaced on request, hot spares that take over by themselves when a
//! member fails, the rebuild beside the clients (md's way: paced between
//! MIN and MAX bytes per second, each step holding its region against
//! client writes), a check or repair in the background, and the
//! background resync of an array that came up dirty.
//!
//! One recovery thread ([`Online::start`]) does the rebuilds; requests
//! only change the array (a member joins or leaves, durably recorded) and
//! wake it. Every 200 ms, or when woken, it:
//! 1. puts a spare into a role with no working member (md's spare taking
//!    over), while spares remain;
//! 2. rebuilds every member being recovered, from its checkpoint, until
//!    done or the server stops (the checkpoint is recorded: the next run
//!    resumes there).
//!
//! What these threads have to tell goes to the caller's `log`, a line at a
//! time; their progress is read with [`Online::status`] and
//! [`ResyncState`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvraid_member::{Member, MemberError, OpenOptions};

use super::{add_member_to, re_add_to, rebuild_online, scrub_with, Added, Mode, Pace};
use super::{Progress, RebuildPace, Scrubbed};
use crate::{Array, SetAside};

/// Where the recovery threads' messages go, one line at a time.
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// What the recovery thread is doing and has done.
#[derive(Debug, Default)]
struct RecoveryState {
    /// Hot spares not yet used (paths), in the order they take over.
    spares: Vec<String>,
    /// The rebuild running or last run.
    rebuild: Option<RebuildStatus>,
}

/// The rebuild running or last run.
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

/// A check or repair run on request ([`Online::scrub`]).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ScrubStatus {
    pub mode: &'static str,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished: bool,
    pub result: Option<Scrubbed>,
    pub error: Option<String>,
}

/// [`Online::status`]: the spares left, the rebuild, and a check or repair.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OnlineStatus {
    pub spares: Vec<String>,
    pub rebuild: Option<RebuildStatus>,
    pub scrub: Option<ScrubStatus>,
}

/// What [`Online::add`] did with a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Joined {
    /// It was this array's, and is back in its role (by the bitmap).
    ReAdded { role: u32 },
    /// It took a missing role and is being rebuilt.
    Recovering { role: u32 },
    /// No role was missing: a hot spare.
    Spare,
}

/// What [`Online::remove`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removed {
    /// A hot spare not yet used, dropped from the list.
    Spare,
    /// The member of `role` left the array; its events count after.
    Role { role: usize, events: u64 },
}

/// The recovery service of one served array.
pub struct Online {
    array: Arc<Array>,
    state: Mutex<RecoveryState>,
    #[allow(clippy::type_complexity)]
    scrub: Mutex<(Option<ScrubStatus>, Option<JoinHandle<()>>)>,
    wake: Condvar,
    stop: AtomicBool,
    pace: (Option<u64>, Option<u64>),
    direct: bool,
    log: Log,
}

impl Online {
    /// `pace`: md's MIN and MAX rebuild rates, bytes per second. The
    /// array's spares (set aside at assembly) are its first hot spares.
    pub fn new(
        array: Arc<Array>,
        pace: (Option<u64>, Option<u64>),
        direct: bool,
        log: Log,
    ) -> Arc<Online> {
        let spares = array
            .set_aside()
            .iter()
            .filter(|m| m.reason == SetAside::Spare)
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
            log,
        })
    }

    fn lock(&self) -> MutexGuard<'_, RecoveryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the recovery thread (nothing runs on a read-only array; on
    /// one without copies it waits: a served RAID 0 taken over as RAID 10
    /// gains copies to rebuild).
    pub fn start(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        if !self.array.is_writable() {
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

    /// Stops the threads at their next step (a rebuild records its
    /// checkpoint, a repair its resync point) and waits for a check or
    /// repair to end.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_all();
        let thread = self.scrub_lock().1.take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    /// Whether [`Online::stop`] was called (the server is stopping).
    pub fn is_stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Wakes the recovery thread (a request changed the array).
    pub fn wake(&self) {
        self.wake.notify_all();
    }

    #[allow(clippy::type_complexity)]
    fn scrub_lock(&self) -> MutexGuard<'_, (Option<ScrubStatus>, Option<JoinHandle<()>>)> {
        self.scrub.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `check` or `repair` in the background; [`Online::status`] shows its
    /// progress and, at the end, what it found. Its name once started.
    pub fn scrub(self: &Arc<Self>, mode: Mode) -> Result<&'static str, String> {
        self.refuse_while_reshaping()?;
        if !self.array.geometry().level().is_redundant() {
            return Err("check or repair of a raid0 (it keeps no copies to compare)".into());
        }
        if mode == Mode::Repair && !self.array.is_writable() {
            return Err("the array is served read-only".into());
        }
        if mode == Mode::Repair && self.array.resync_from().is_some() {
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
        let name = if mode == Mode::Check {
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
                    let pace = Pace {
                        max_rate: None,
                        stop: Some(&me.stop),
                    };
                    let outcome = scrub_with(&me.array, mode, &pace, &mut |p| {
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
                            (me.log)(&format!(
                                "nvraid: {name} while serving: {} mismatched sectors in {} regions",
                                found.mismatch_sectors,
                                found.regions.len()
                            ));
                            s.result = Some(found);
                        }
                        Err(e) => {
                            (me.log)(&format!("nvraid: {name} while serving failed: {e}"));
                            s.error = Some(e.to_string());
                        }
                    }
                })
                .map_err(|e| e.to_string())?,
        );
        Ok(name)
    }

    /// While a grow runs on the served array, members neither join nor
    /// leave and nothing is checked (md refuses them during a reshape
    /// too): refused, naming the grow.
    fn refuse_while_reshaping(&self) -> Result<(), String> {
        if self.array.is_reshaping_live() {
            return Err(
                "a grow runs on this array (status shows it): add, remove, replace, check and repair wait until it is finished and the server restarted".into(),
            );
        }
        Ok(())
    }

    /// Whether a rebuild, check or repair runs now (a grow is refused
    /// meanwhile).
    pub fn is_busy(&self) -> bool {
        let status = self.status();
        status.rebuild.as_ref().is_some_and(|r| !r.finished)
            || status.scrub.as_ref().is_some_and(|s| !s.finished)
    }

    fn run(&self) {
        while !self.stop.load(Ordering::Acquire) {
            // A grow running on the array owns its members' layout: a
            // rebuild in the old shape would write over moved rows.
            if !self.array.is_reshaping_live() && self.array.geometry().level().is_redundant() {
                self.take_spares();
                self.rebuild();
            }
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
                .and_then(|m| add_member_to(array, m).map_err(|e| e.to_string()));
            match taken {
                Ok(Added::Recovering { role }) => (self.log)(&format!(
                    "nvraid: hot spare {spec} takes over role {role}; rebuilding"
                )),
                Ok(Added::Spare) => {
                    self.lock().spares.insert(0, spec);
                    return;
                }
                Err(e) => (self.log)(&format!("nvraid: hot spare {spec} cannot take over: {e}")),
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
        let outcome = rebuild_online(array, &pace, &mut |p| self.rebuild_progress(&p));
        let mut state = self.lock();
        let entry = state.rebuild.get_or_insert_with(RebuildStatus::default);
        match outcome {
            Ok(done) => {
                for r in &done {
                    entry.copied_bytes = r.bytes;
                    if array.in_sync_bytes(r.role as usize).is_none() {
                        entry.finished = true;
                        entry.eta_seconds = 0.0;
                        (self.log)(&format!(
                            "nvraid: role {} rebuilt while serving: {} bytes in {:.1} s",
                            r.role,
                            r.bytes,
                            started.elapsed().as_secs_f64()
                        ));
                    } else {
                        (self.log)(&format!(
                            "nvraid: rebuild of role {} stopped at byte {}; it resumes there",
                            r.role, entry.done_bytes
                        ));
                    }
                }
            }
            Err(e) => {
                (self.log)(&format!(
                    "nvraid: rebuild failed: {e}; the array stays degraded"
                ));
                entry.error = Some(e.to_string());
                drop(state);
                // Do not spin on a failing target: wait for a request.
                let state = self.lock();
                let _ = self
                    .wake
                    .wait_timeout(state, Duration::from_secs(5))
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// A rebuild's progress, into the status (a new role or member starts a
    /// new entry, and says so in the log).
    fn rebuild_progress(&self, p: &Progress) {
        let array = &self.array;
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
            (self.log)(&format!("nvraid: rebuilding role {} while serving", p.role));
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
    }

    /// The spares left, the rebuild, and a check or repair.
    pub fn status(&self) -> OnlineStatus {
        let scrub = self.scrub_lock().0.clone();
        let state = self.lock();
        OnlineStatus {
            spares: state.spares.clone(),
            rebuild: state.rebuild.clone(),
            scrub,
        }
    }

    /// Adds the member `spec`: this array's own comes back by its bitmap
    /// (unless `force`), another must be blank (unless `force`) and takes
    /// a missing role, or becomes a hot spare. Answers once the array's
    /// superblocks record it; a rebuild then runs in the background.
    pub fn add(&self, spec: &str, force: bool) -> Result<Joined, String> {
        self.refuse_while_reshaping()?;
        if let Ok(role) = role_of(&self.array, spec) {
            return Err(if self.array.is_faulty(role) {
                format!("{spec}: faulty in role {role} of this array; remove it first, then add it again")
            } else {
                format!("{spec}: already a working member of this array (role {role})")
            });
        }
        let member = open_member(spec, self.direct)?;
        if !force {
            if let Ok(sb) = crate::read_superblock(&member) {
                if sb.set_uuid == self.array.superblock().set_uuid {
                    let role = re_add_to(&self.array, member)
                        .map_err(|e| format!("{e} (add it with force for a full rebuild)"))?;
                    return Ok(Joined::ReAdded { role });
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
        match add_member_to(&self.array, member).map_err(|e| e.to_string())? {
            Added::Recovering { role } => Ok(Joined::Recovering { role }),
            Added::Spare => {
                self.lock().spares.push(spec.to_string());
                Ok(Joined::Spare)
            }
        }
    }

    /// Whether `spec` could join the array now as a new member rebuilt in
    /// a role holding `member_bytes` of data (what [`Online::add`] refuses,
    /// asked before a change that adds it, so that a bad member changes
    /// nothing): it opens for writing, is not a member already, is blank
    /// (unless `force`; a member that was this array's too) and is large
    /// enough.
    pub fn check_joining(&self, spec: &str, force: bool, member_bytes: u64) -> Result<(), String> {
        if let Ok(role) = role_of(&self.array, spec) {
            return Err(format!(
                "{spec}: already a member of this array (role {role})"
            ));
        }
        let member = open_member(spec, self.direct)?;
        if self
            .array
            .slots()
            .iter()
            .flatten()
            .any(|s| member.identity().is_some() && s.member.identity() == member.identity())
        {
            return Err(format!("{spec}: already a member of this array"));
        }
        if !force {
            if let Ok(sb) = crate::read_superblock(&member) {
                if sb.set_uuid == self.array.superblock().set_uuid {
                    return Err(format!(
                        "{spec}: carries this array's superblock (it left it); use --force to add it as a new member"
                    ));
                }
            }
            check_blank(&member)?;
        }
        let needed = self.array.superblock().data_offset_sectors * 512 + member_bytes;
        if member.size_bytes() < needed {
            return Err(format!(
                "{spec}: {} bytes is too small: a member of this array needs {needed} bytes",
                member.size_bytes()
            ));
        }
        Ok(())
    }

    /// Removes `spec`: a hot spare from the list, or a member from its role.
    pub fn remove(&self, spec: &str) -> Result<Removed, String> {
        self.refuse_while_reshaping()?;
        {
            let mut state = self.lock();
            if let Some(i) = state.spares.iter().position(|s| s == spec) {
                state.spares.remove(i);
                return Ok(Removed::Spare);
            }
        }
        let role = role_of(&self.array, spec)?;
        self.array.remove_member(role).map_err(|e| e.to_string())?;
        Ok(Removed::Role {
            role,
            events: self.array.events(),
        })
    }

    /// Replaces the member `old` with `new` (blank unless `force`, and
    /// large enough): `old` is failed and removed, `new` takes its role and
    /// is rebuilt in the background. The role `new` took.
    pub fn replace(&self, old: &str, new: &str, force: bool) -> Result<u32, String> {
        self.refuse_while_reshaping()?;
        let role = role_of(&self.array, old)?;
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
            .fail_member(role, &administrator())
            .map_err(|e| e.to_string())?;
        self.array.remove_member(role).map_err(|e| e.to_string())?;
        match add_member_to(&self.array, member).map_err(|e| e.to_string())? {
            Added::Recovering { role } => Ok(role),
            Added::Spare => Err(format!("{new}: no role was free after failing {old}")),
        }
    }
}

/// Why a member was failed on an administrator's request.
pub fn administrator() -> std::io::Error {
    std::io::Error::other("failed on request")
}

/// The role of the present member named `spec` (same path, or the same
/// file or device).
pub fn role_of(array: &Array, spec: &str) -> Result<usize, String> {
    let wanted = std::fs::metadata(spec).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    });
    array
        .slots()
        .iter()
        .position(|slot| {
            slot.as_ref().is_some_and(|s| {
                s.member.spec() == spec || (wanted.is_some() && s.member.identity() == wanted)
            })
        })
        .ok_or_else(|| format!("{spec}: not a working member of this array"))
}

fn open_member(spec: &str, direct: bool) -> Result<Member, String> {
    open_for_writing(spec, direct).map_err(|e| e.to_string())
}

/// Opens `spec` for writing as a member joining an array (never created).
pub fn open_for_writing(spec: &str, direct: bool) -> Result<Member, MemberError> {
    Member::open(
        spec,
        OpenOptions {
            write: true,
            create_bytes: None,
            direct,
            ..Default::default()
        },
    )
}

/// Refuses a member that carries a filesystem or another md superblock.
fn check_blank(member: &Member) -> Result<(), String> {
    if member.is_persistent() {
        if let Some(what) =
            crate::detect_signature(member).map_err(|e| format!("{}: {e}", member.spec()))?
        {
            return Err(format!(
                "{}: already carries {what} (use --force to overwrite it)",
                member.spec()
            ));
        }
    }
    Ok(())
}

/// What the background resync has done.
#[derive(Debug, Default)]
pub struct ResyncState {
    /// The position reached (bytes from where it started).
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Bytes actually read and compared: with a write-intent bitmap only
    /// the regions it marks (known once finished).
    pub resynced_bytes: u64,
    pub seconds: f64,
    pub finished: bool,
    pub error: Option<String>,
}

/// The background resync of an array that came up dirty (md's rule: it is
/// resynced beside the clients, one region at a time held against their
/// writes): repair from the recorded resync point, checkpointing it, then
/// record the array clean. At most `max_rate` bytes per second; stops at
/// the next region once `stop` is set (it resumes there next time).
/// Progress goes to `state`, a line to `log` at the start and the end.
pub fn background_resync(
    array: &Array,
    max_rate: Option<u64>,
    stop: &AtomicBool,
    state: &Mutex<ResyncState>,
    log: &dyn Fn(&str),
) {
    let from = array.resync_from().unwrap_or(0);
    if array.md_journal().is_some() {
        // md's rule: a journaled array is never recorded dirty by a crash
        // (its log repairs that); it awaits the resync `create` asked for
        // over members that held other bytes, or one that writes past a
        // failed journal asked for.
        log(&format!(
            "nvraid: the array's parity is not yet computed over all of it (it was created over \
             members that held other bytes, or written while its journal had failed); \
             resyncing from byte {from} while serving"
        ));
    } else {
        log(&format!(
            "nvraid: the array was not shut down cleanly; resyncing from byte {from} while serving"
        ));
    }
    let pace = Pace {
        max_rate,
        stop: Some(stop),
    };
    let outcome = scrub_with(array, Mode::Repair, &pace, &mut |p| {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.done_bytes = p.done_bytes;
        s.total_bytes = p.total_bytes;
        s.seconds = p.elapsed.as_secs_f64();
    });
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    match outcome {
        Ok(found) if found.resynced => {
            s.finished = true;
            s.done_bytes = s.total_bytes;
            s.resynced_bytes = found.bytes;
            log(&format!(
                "nvraid: resync done: {} bytes in {:.1} s, {} sectors rewritten; the array is in sync",
                found.bytes, found.seconds, found.repaired_sectors
            ));
        }
        Ok(_) => log(&format!(
            "nvraid: resync stopped at byte {}; it resumes there next time",
            s.done_bytes
        )),
        Err(e) => {
            log(&format!(
                "nvraid: resync failed: {e}; the array stays dirty"
            ));
            s.error = Some(e.to_string());
        }
    }
}
