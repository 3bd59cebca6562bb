//! A RAID 4/5/6 or RAID 10 near gaining members while it is served (`nvraid grow
//! --socket`), or a RAID 4/5/6 restriped in place (`live_shape`: the
//! members kept, the chunk or layout changed): the offline grow's record
//! and steps (`grow`, `step`), run on the served array's members while
//! clients read and write.
//!
//! - **The record.** Every superblock update of the running array records
//!   the reshape ([`ReshapeRecord`]: `RESHAPE_ACTIVE | NEW_OFFSET`, the new
//!   member count, `reshape_position`, `new_offset`; the finished shape once
//!   it is done), and writes the added members' superblocks too, first, so
//!   that a dirty mark, a member failing or the clean close never writes a
//!   superblock without it.
//! - **The route.** From the start every fast-path request goes through
//!   [`LiveGrow::io`] (`Array::start_live_route`, which first waits for
//!   the requests the queues had in flight): bytes below the position `P`
//!   in the new shape (read and written here, a write as a reconstruct-
//!   write of each new stripe under a stripe lock, parity computed whole),
//!   bytes at or past it through the array's own (old-shape) simple path.
//!   Both let writes in through `Array::admit_write` (the dirty mark and the
//!   write-intent bits: for the new shape, the bits of the new rows).
//! - **A step** moves `[P, P')` as offline. It first closes the window
//!   `[P, P')` to client requests (those in it drain, new ones wait) and
//!   waits for every request that started before it (an old-shape read
//!   routed when `P` was lower may still be reading rows this step
//!   overwrites: the step waits for it), then moves the rows, flushes the
//!   members, records `P'` in every superblock, and only then moves `P`
//!   in memory and opens the window.
//! - **The end.** The finished shape is recorded; then the served array
//!   takes it (`Array::swap_shape`, `LiveGrow::adopt_end`): the added
//!   members become its own roles, the fast path serves the new shape at
//!   the new size, and another reshape may start.
//!
//! A reshape running backwards (a shrink, or a restripe that moved the
//! data offset up, which `serve` goes on with) has the shapes the other
//! way round: `live_backwards`.
//!
//! A member failing (an old one, or one the grow added: `live_degraded`)
//! is recorded faulty and the grow goes on degraded (steps and the route
//! read around it, write parity covering it) while the parity covers the
//! members failed. Any other failure (one member more than the parity
//! covers, a superblock update no member takes) stops the grow at the
//! position last recorded: the record stays, client requests go on
//! through the two shapes, and `nvraid grow --continue` finishes it after
//! `serve` stops.

use super::grow::{
    check_new_member, finish_record, free_dev_numbers, new_member_superblock, room_for,
};
use crate::array::{Array, LiveRoute};
use crate::error::{Error, Result};
use crate::members::{Companion, ReshapeRecord, Update};
use crate::slot::write_superblock;
use nvraid_io::queue::OpKind;
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Geometry, Level, Reshape};
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{features, Role, Superblock};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How to grow a served array.
#[derive(Clone, Debug)]
pub struct LiveGrowOptions {
    /// The member count after the grow.
    pub raid_devices: u32,
    /// The members to add.
    pub add: Vec<String>,
    pub direct: bool,
    pub force: bool,
    /// The most array bytes one step moves.
    pub step_bytes: u64,
    /// The most bytes per second the reshape moves (`None`: as fast as it
    /// goes).
    pub max_bytes_per_sec: Option<u64>,
    /// While clients are doing I/O, the grow moves no more than this many
    /// bytes per second (the rebuild's floor, md's `speed_limit_min`; it
    /// still never goes above the maximum). `Some(0)`: it waits while
    /// clients are busy; `None`: clients do not slow it down.
    pub min_bytes_per_sec: Option<u64>,
}

/// Where a served grow stands (`nvraid status`).
#[derive(Clone, Debug, Serialize)]
pub struct LiveGrowStatus {
    /// `grow` (rows move to the new shape), `restripe` (the same, the
    /// member count kept: a chunk or layout change), `shrink` (fewer
    /// members, the rows moved from the end down: the position falls) or
    /// `mirror` (a RAID 1's added members rebuilt from the others while
    /// it is served).
    pub kind: &'static str,
    /// `running`, `finished` or `failed`.
    pub state: &'static str,
    pub raid_disks_before: u32,
    pub raid_disks: u32,
    pub position_bytes: u64,
    pub end_bytes: u64,
    pub bytes_per_sec: u64,
    pub eta_seconds: Option<u64>,
    /// Why it stopped, when it failed.
    pub error: Option<String>,
    /// The array's size once it is assembled again.
    pub new_size_bytes: u64,
}

/// Client requests in flight and the step's window (see [`Gate`]).
#[derive(Debug, Default)]
pub(super) struct GateState {
    /// Where the new shape ends and the old begins (array bytes).
    position: u64,
    /// `[start, end)` closed to client requests while a step moves it.
    window: Option<(u64, u64)>,
    /// The epoch requests start in now; moves at each step's start.
    epoch: u64,
    /// Requests in flight per epoch they started in.
    in_flight: BTreeMap<u64, u64>,
}

/// Where client requests are routed, and the steps' exclusion: a
/// request enters with the position it is routed by and the epoch it
/// started in; a step closes its window and waits for every request of
/// an earlier epoch (reads included) before it writes a byte.
#[derive(Debug, Default)]
pub(super) struct Gate {
    state: Mutex<GateState>,
    opened: Condvar,
}

impl Gate {
    /// A gate with the new shape ending at `position`.
    fn at(position: u64) -> Gate {
        Gate {
            state: Mutex::new(GateState {
                position,
                ..GateState::default()
            }),
            opened: Condvar::new(),
        }
    }

    pub(super) fn position(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .position
    }

    /// Close `[p, to)` to new requests and wait until every request that
    /// started before now has finished.
    pub(super) fn close_window(&self, p: u64, to: u64) {
        let mut gate = self.state.lock().unwrap_or_else(|p| p.into_inner());
        gate.window = Some((p, to));
        gate.epoch += 1;
        let now = gate.epoch;
        while gate.in_flight.range(..now).any(|(_, &n)| n > 0) {
            gate = self.opened.wait(gate).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Open the window again, the position moved to `to` when given.
    pub(super) fn open_window(&self, to: Option<u64>) {
        let mut gate = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(to) = to {
            gate.position = to;
        }
        gate.window = None;
        drop(gate);
        self.opened.notify_all();
    }

    /// Enter for `[offset, offset + len)` (waiting while a step's window
    /// covers part of it): the epoch and the position to route by.
    pub(super) fn enter(&self, offset: u64, len: u64) -> (u64, u64) {
        let mut gate = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while gate
            .window
            .is_some_and(|(start, end)| offset < end && start < offset + len)
        {
            gate = self.opened.wait(gate).unwrap_or_else(|p| p.into_inner());
        }
        let epoch = gate.epoch;
        *gate.in_flight.entry(epoch).or_default() += 1;
        (epoch, gate.position)
    }

    pub(super) fn leave(&self, epoch: u64) {
        let mut gate = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let n = gate.in_flight.get_mut(&epoch).expect("entered");
        *n -= 1;
        if *n == 0 {
            gate.in_flight.remove(&epoch);
            drop(gate);
            self.opened.notify_all();
        }
    }
}

#[derive(Debug)]
pub(super) struct Progress {
    pub(super) state: &'static str,
    pub(super) error: Option<String>,
    pub(super) started: Instant,
    pub(super) start_position: u64,
}

impl Progress {
    /// How a grow's steps ended (`Ok(false)`: stopped with the server,
    /// `stopped` saying what that left), recorded for `status`.
    pub(super) fn ended(&mut self, outcome: Result<bool>, stopped: &str) {
        match outcome {
            Ok(true) => self.state = "finished",
            Ok(false) => {
                self.state = "failed";
                self.error = Some(stopped.into());
            }
            Err(e) => {
                eprintln!("nvraid: event=reshape-failed reason=\"{e}\"");
                self.state = "failed";
                self.error = Some(e.to_string());
            }
        }
    }
}

/// A grow running on a served array (see the module's text).
#[derive(Debug)]
pub struct LiveGrow {
    /// The reshape as recorded at its start (position 0).
    pub(super) reshape: Reshape,
    pub(super) old_members: u32,
    /// The added members, by role from `old_members` on, with their
    /// superblocks before the record (each update puts it in).
    added: Vec<(Arc<Member>, Mutex<Superblock>)>,
    /// Sectors the data offset moves down.
    moved_sectors: u64,
    /// Each member's bad-block log's new place (`bblog_offset`), by role.
    bblog_offsets: Vec<u32>,
    /// Which added members failed (see `live_degraded`).
    pub(super) added_failed: super::live_degraded::AddedFailures,
    /// The role table's entries the added members hold: (device, entry).
    table_entries: Vec<(usize, u16)>,
    /// The recorded position in sectors, and whether the finished shape is
    /// recorded.
    pub(super) record: Mutex<(u64, bool)>,
    pub(super) gate: Gate,
    /// New-shape stripe locks (stripe number modulo their count; a RAID
    /// 10's chunk number).
    pub(super) stripes: Vec<Mutex<()>>,
    progress: Mutex<Progress>,
    pub(super) step_bytes: u64,
    pub(super) pacing: Pacing,
    /// A RAID 0 grown as md's RAID 4 with its parity missing
    /// (`live_raid0`).
    pub(super) raid0: Option<super::live_raid0::Raid0Grow>,
    /// A shrink's leaving roles' devices (`live_backwards`): spares in
    /// the role table once they left the running array.
    pub(super) leaving_devs: Vec<usize>,
    /// Whether the leaving roles have left the running array.
    pub(super) left: AtomicBool,
    /// Those of `leaving_devs` that failed before they left (device,
    /// member): faulty in the role table, not spares (md's record of
    /// them).
    pub(super) failed_leaving: Mutex<Vec<(usize, String)>>,
}

/// Client requests (reads, writes, flushes) routed through a grow so far,
/// and those not finished yet (waiting for a step's window included):
/// what its pacing samples to tell whether clients are busy.
#[derive(Debug, Default)]
pub(super) struct Clients {
    ops: AtomicU64,
    in_flight: AtomicU64,
}

impl Clients {
    /// A client request starts: counted until the guard is dropped.
    pub(super) fn request(&self) -> ClientRequest<'_> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        ClientRequest(&self.in_flight)
    }
}

/// What [`GrowPace`] reads of a served reshape, the same for every kind
/// (`LiveGrow`, `LiveMirror`, `LiveQ`): its clients' requests, whether it
/// is asked to stop, and its (minimum, maximum) rates.
#[derive(Debug)]
pub(super) struct Pacing {
    /// The clients' requests, as the pacing samples them.
    clients: Clients,
    stop: AtomicBool,
    min_bytes_per_sec: Option<u64>,
    max_bytes_per_sec: Option<u64>,
}

impl Pacing {
    pub(super) fn new(min_bytes_per_sec: Option<u64>, max_bytes_per_sec: Option<u64>) -> Pacing {
        Pacing {
            clients: Clients::default(),
            stop: AtomicBool::new(false),
            min_bytes_per_sec,
            max_bytes_per_sec,
        }
    }

    /// A client request starts (see [`Clients::request`]).
    pub(super) fn request(&self) -> ClientRequest<'_> {
        self.clients.request()
    }

    /// Ask the reshape to stop after the step under way.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

pub(super) const STRIPE_LOCKS: u64 = 256;

/// A grow as `launch` takes it, however it began: checked and recorded
/// just now (`start`), or read from the members' record (`resume`).
pub(super) struct Parts {
    /// The reshape at the position it starts from.
    pub(super) reshape: Reshape,
    pub(super) old_members: u32,
    /// The added members by role from `old_members` on, each with its
    /// superblock without the record (each update puts it in).
    pub(super) added: Vec<(Member, Superblock)>,
    /// Sectors the data offset moves down.
    pub(super) moved_sectors: u64,
    /// Each member's bad-block log's place (`bblog_offset`) in the record,
    /// by role of the new shape.
    pub(super) bblog_offsets: Vec<u32>,
    /// The role table's entries the added members hold: (device, entry).
    pub(super) table_entries: Vec<(usize, u16)>,
}

/// Whether the members record the reshape already (see `launch`).
pub(super) enum Begin {
    Fresh,
    Recorded,
}

/// The served array can grow (or go on growing): served writable, RAID
/// 4/5/6, whole, nothing recovering or awaiting a resync, neither a
/// partial parity log nor a write journal.
pub(super) fn check_growable(array: &Array) -> Result<()> {
    let spec0 = array
        .slot(0)
        .map_or("(missing)", |s| s.member.spec())
        .to_string();
    let refuse = |what: String| Error::Unsupported {
        spec: spec0.clone(),
        what,
    };
    if !array.is_writable() {
        return Err(Error::ReadOnly);
    }
    let old = array.geometry().clone();
    if !matches!(
        old.level(),
        Level::Raid5 { .. } | Level::Raid6 { .. } | Level::Raid10 { .. }
    ) {
        return Err(refuse(format!(
            "growing a served {} (nvraid grows RAID 4/5/6 and RAID 10 near while served, and adds mirrors to a RAID 1; stop serve and use `nvraid grow` for the others)",
            old.level()
        )));
    }
    if array.is_degraded() || (0..array.roles()).any(|r| !array.is_usable(r)) {
        return Err(Error::NotStartable(
            "the array is degraded; nvraid grows only a whole array: rebuild it first".into(),
        ));
    }
    check_settled(array)?;
    if array.ppl.is_some() || array.md_journal.is_some() {
        return Err(refuse(
            "growing an array with md's partial parity log or write journal (md refuses to reshape those too)".into(),
        ));
    }
    Ok(())
}

/// Write a member a served reshape added: its superblock `written` (its
/// record and role table already put in) with `events`, and the update's
/// resync offset and time once it is known (dirty before), flushed.
pub(super) fn write_added_superblock(
    member: &Member,
    written: &mut Superblock,
    events: u64,
    update: Option<&Update<'_>>,
) -> std::io::Result<()> {
    written.events = events;
    match update {
        Some(u) => {
            written.resync_offset = u.resync_offset;
            written.utime = u.utime;
        }
        None => written.resync_offset = 0,
    }
    write_superblock(member, written).map_err(|e| match e {
        Error::Io { source, .. } => source,
        other => std::io::Error::other(other.to_string()),
    })?;
    member.flush()
}

/// md's record of a served reshape from `position` in `direction`: every
/// member of the old shape with its data at `data_offset`, every member of
/// the new one at `new_offset` (a served array's members start their data
/// at one offset, which each start checks).
pub(super) fn uniform_reshape(
    old: &Geometry,
    new: &Geometry,
    position: u64,
    direction: Direction,
    data_offset: u64,
    new_offset: u64,
) -> Result<Reshape> {
    Reshape::new(
        old.clone(),
        new.clone(),
        position,
        direction,
        vec![data_offset; old.members() as usize],
        vec![new_offset; new.members() as usize],
    )
    .map_err(|e| Error::NotStartable(e.to_string()))
}

/// Refused while another reshape runs on the served `array` (a served
/// reshape ends, and its shape is swapped in, before the next may start):
/// "a second `what`", named on `spec0` (the first member).
pub(super) fn refuse_second(array: &Array, spec0: &str, what: &str) -> Result<()> {
    if array.is_reshaping_live() {
        return Err(Error::Unsupported {
            spec: spec0.into(),
            what: format!(
                "a second {what} while a reshape runs on this served array (`nvraid status` shows it): wait for its end"
            ),
        });
    }
    Ok(())
}

/// A member a served reshape adds, made ready before any superblock
/// names it: its bad-block log written empty, the array's write-intent
/// bitmap as it stands copied to it (the union the clients' writes set
/// from here on is on the old members; md's assembly and `--continue`
/// take the union), and flushed.
pub(super) fn ready_added(array: &Array, member: &Member, sb: &Superblock) -> Result<()> {
    crate::badlog::write_empty(member, sb)?;
    array.bitmap_copy_to(member)?;
    member.flush().map_err(|e| Error::io(member.spec(), e))
}

/// No member of the served array is being recovered or has bad blocks,
/// and no resync is awaited: every reshape of a served array waits for
/// those to end (and may start once they have, in the same run).
pub(super) fn check_settled(array: &Array) -> Result<()> {
    if array.recovering_or_bad() {
        return Err(Error::NotStartable(
            "a member is being recovered or has bad blocks; finish the rebuild first".into(),
        ));
    }
    if array.first_copy_reads() {
        return Err(Error::NotStartable(
            "the array awaits a resync (it came up dirty); let it finish first".into(),
        ));
    }
    Ok(())
}

/// Copy each bad-block log in the way of a served reshape's move of the
/// data offset (`log_moves` by role, from `room_for`: its sector, length
/// and new sector), flushed; the superblocks' new `bblog_offset`s.
pub(super) fn move_bblogs(
    array: &Array,
    sbs: &[Superblock],
    log_moves: &[Option<(u64, u64, u64)>],
) -> Result<Vec<u32>> {
    let mut bblog_offsets: Vec<u32> = sbs.iter().map(|sb| sb.bblog_offset).collect();
    for (role, moved) in log_moves.iter().enumerate() {
        let Some((start, len, to)) = *moved else {
            continue;
        };
        let member = &array.slot(role).expect("whole").member;
        let mut log = AlignedBuf::zeroed((len * 512).next_multiple_of(4096) as usize);
        let log = &mut log[..(len * 512) as usize];
        member
            .read_at(log, start * 512)
            .map_err(|e| Error::io(member.spec(), e))?;
        member
            .write_at(log, to * 512)
            .map_err(|e| Error::io(member.spec(), e))?;
        member.flush().map_err(|e| Error::io(member.spec(), e))?;
        bblog_offsets[role] = (to - sbs[role].super_offset_sectors) as u32;
    }
    Ok(bblog_offsets)
}

/// A served grow's member count must be the old one plus one per `--add`.
pub(super) fn check_count(options: &LiveGrowOptions, old_count: u32) -> Result<()> {
    let want = old_count as usize + options.add.len();
    if options.add.is_empty() || options.raid_devices as usize != want {
        return Err(Error::BadOption {
            option: "--raid-devices".into(),
            why: format!(
                "{} with {} member(s) added to {old_count}: give one --add per new member, {want} in all",
                options.raid_devices,
                options.add.len(),
            ),
        });
    }
    Ok(())
}

/// The members a served grow adds, opened for writing and checked (large
/// enough, blank unless `force`, not members already, each given once).
/// Nothing is written.
pub(super) fn open_added(
    array: &Array,
    options: &LiveGrowOptions,
    reference: &Superblock,
    old: &Geometry,
) -> Result<Vec<Member>> {
    let open = OpenOptions {
        write: true,
        create_bytes: None,
        direct: options.direct,
        ..Default::default()
    };
    let mut adding: Vec<Member> = Vec::with_capacity(options.add.len());
    for spec in &options.add {
        let member_already =
            (0..array.roles()).any(|r| array.slot(r).is_some_and(|s| s.member.spec() == spec));
        if member_already || adding.iter().any(|m| m.spec() == spec) {
            return Err(Error::BadOption {
                option: "--add".into(),
                why: format!("{spec} is a member of the array already"),
            });
        }
        let member = Member::open(spec, open)?;
        check_new_member(&member, reference, old, options.force)?;
        adding.push(member);
    }
    Ok(adding)
}

impl LiveGrow {
    /// Check that the served `array` can grow as asked, record the reshape
    /// on every member (the added ones first) and route client requests
    /// through it; the steps run on a thread of their own, which is
    /// returned. Refused, with nothing written: an array not served
    /// writable, not RAID 4/5/6 or RAID 10 near, degraded, being recovered or resynced,
    /// with a partial parity log or a write journal, one already reshaping,
    /// new members too small or carrying a signature, no room to move the
    /// data offset.
    pub fn start(
        array: &Arc<Array>,
        options: &LiveGrowOptions,
    ) -> Result<(Arc<LiveGrow>, std::thread::JoinHandle<()>)> {
        let spec0 = array
            .slot(0)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        let refuse = |what: String| Error::Unsupported {
            spec: spec0.clone(),
            what,
        };
        refuse_second(array, &spec0, "grow")?;
        check_growable(array)?;
        let old = array.geometry().clone();
        let old_count = old.members();
        check_count(options, old_count)?;
        let reference = array.superblock().clone();
        let sbs: Vec<Superblock> = (0..array.roles())
            .map(|r| array.slot(r).expect("whole").superblock.clone())
            .collect();
        let bitmap_bytes = super::live_copy::bitmap_bytes(array, &old, options.raid_devices)?;
        let (moved_sectors, log_moves) = room_for(&sbs, &reference, &old, bitmap_bytes)?;
        let adding = open_added(array, options, &reference, &old)?;
        let new = Geometry::new(
            old.level(),
            options.raid_devices,
            old.chunk_bytes().expect("the levels grown have chunks"),
            crate::assemble::member_data_bytes(&reference),
        )?;
        let data_offset = reference.data_offset_sectors * 512;
        let new_offset = data_offset - moved_sectors * 512;
        let reshape = uniform_reshape(&old, &new, 0, Direction::Forwards, data_offset, new_offset)?;
        if (0..array.roles()).any(|r| {
            array
                .slot(r)
                .is_some_and(|s| s.data_offset_bytes() != data_offset)
        }) {
            return Err(refuse(
                "members with different data offsets (nvraid grows a served array whose members start their data at one offset)".into(),
            ));
        }
        // The bad-block logs in the way of the move, copied first (the
        // record names their new places).
        let bblog_offsets = move_bblogs(array, &sbs, &log_moves)?;
        // A RAID 10's new region marked in the bitmap, before the added
        // members get its copy (see `live_copy::mark_new_region`).
        super::live_copy::mark_new_region(array, &old, &new)?;
        let free = free_dev_numbers(&reference, adding.len())?;
        let mut added = Vec::with_capacity(adding.len());
        let mut table_entries = Vec::with_capacity(adding.len());
        for (k, (member, dev)) in adding.into_iter().zip(free).enumerate() {
            let mut sb = new_member_superblock(&member, &reference, dev)?;
            sb.bblog_offset = reference.bblog_offset;
            table_entries.push((
                dev as usize,
                Role::Active((old_count as usize + k) as u16).to_raw(),
            ));
            ready_added(array, &member, &sb)?;
            added.push((member, Mutex::new(sb)));
        }
        let bblog_offsets = bblog_offsets
            .into_iter()
            .chain(
                added
                    .iter()
                    .map(|(_, sb)| sb.lock().expect("fresh").bblog_offset),
            )
            .collect();
        let parts = Parts {
            reshape,
            old_members: old_count,
            added: added
                .into_iter()
                .map(|(m, sb)| (m, sb.into_inner().expect("fresh")))
                .collect(),
            moved_sectors,
            bblog_offsets,
            table_entries,
        };
        let pace = (
            options.step_bytes,
            options.min_bytes_per_sec,
            options.max_bytes_per_sec,
        );
        LiveGrow::launch(array, parts, pace, Begin::Fresh)
    }

    /// The core `start` and `resume` share: the grow made of `parts`, at
    /// the position its reshape is at, recorded in every superblock
    /// update from now on, client requests routed through it, the steps
    /// on their own thread. `Begin::Fresh`: nothing records the reshape
    /// yet (the array is marked dirty, the added members written first,
    /// then the others); `Begin::Recorded`: every member records it
    /// already, so the record is in place before any superblock is
    /// written (an update without it would forget the rows moved).
    pub(super) fn launch(
        array: &Arc<Array>,
        parts: Parts,
        pace: (u64, Option<u64>, Option<u64>),
        begin: Begin,
    ) -> Result<(Arc<LiveGrow>, std::thread::JoinHandle<()>)> {
        LiveGrow::launch_as(array, parts, pace, begin, None)
    }

    /// [`LiveGrow::launch`], of a RAID 0 grown as md's RAID 4 when
    /// `raid0` is given (`live_raid0`).
    pub(super) fn launch_as(
        array: &Arc<Array>,
        parts: Parts,
        (step_bytes, min_bytes_per_sec, max_bytes_per_sec): (u64, Option<u64>, Option<u64>),
        begin: Begin,
        raid0: Option<super::live_raid0::Raid0Grow>,
    ) -> Result<(Arc<LiveGrow>, std::thread::JoinHandle<()>)> {
        let spec0 = array
            .slot(0)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        let position = parts.reshape.position();
        let added_count = parts.added.len();
        let leaving_devs = super::live_backwards::leaving_devs(array, &parts.reshape);
        let live = Arc::new(LiveGrow {
            reshape: parts.reshape,
            old_members: parts.old_members,
            added: parts
                .added
                .into_iter()
                .map(|(m, sb)| (Arc::new(m), Mutex::new(sb)))
                .collect(),
            moved_sectors: parts.moved_sectors,
            bblog_offsets: parts.bblog_offsets,
            added_failed: super::live_degraded::AddedFailures::new(added_count),
            table_entries: parts.table_entries,
            record: Mutex::new((position / 512, false)),
            gate: Gate::at(position),
            stripes: (0..STRIPE_LOCKS).map(|_| Mutex::new(())).collect(),
            progress: Mutex::new(Progress {
                state: "running",
                error: None,
                started: Instant::now(),
                start_position: position,
            }),
            step_bytes: step_bytes.max(1),
            pacing: Pacing::new(min_bytes_per_sec, max_bytes_per_sec),
            raid0,
            leaving_devs,
            left: AtomicBool::new(false),
            failed_leaving: Mutex::new(Vec::new()),
        });
        let second = || Error::Unsupported {
            spec: spec0.clone(),
            what: "a second grow while one runs on this served array".into(),
        };
        let fresh = matches!(begin, Begin::Fresh);
        match begin {
            Begin::Fresh => {
                // Clients' writes from here on mark the array dirty through the
                // record (a crash then resyncs what they touched).
                array.mark_dirty()?;
                // The added members first (as the offline grow writes them), one
                // event ahead of the others until those are written.
                live.write_added(array.events() + 1, None, &array.role_table_now())
                    .map_err(|(_, e)| Error::io("(a member the grow adds)", e))?;
                if !array.set_reshape_record(live.clone()) {
                    return Err(second());
                }
            }
            Begin::Recorded => {
                if !array.set_reshape_record(live.clone()) {
                    return Err(second());
                }
            }
        }
        let on_failure = match fresh {
            true => OnFailure::Forget {
                added: live.added.iter().map(|(m, _)| &**m).collect(),
            },
            false => OnFailure::Keep,
        };
        let thread = super::live::route_and_run(
            array,
            &live,
            "nvraid-reshape",
            "no reshape thread",
            LiveGrow::run,
            on_failure,
        )?;
        Ok((live, thread))
    }

    /// Stop after the step under way (the position it records stays).
    pub fn stop(&self) {
        self.pacing.stop();
    }

    /// Where it stands.
    pub fn status(&self) -> LiveGrowStatus {
        let position = self.gate.position();
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let end = self.reshape.new_shape().array_bytes();
        let secs = progress.started.elapsed().as_secs_f64();
        let backwards = self.reshape.direction() == Direction::Backwards;
        let moved = if backwards {
            progress.start_position.saturating_sub(position)
        } else {
            position.saturating_sub(progress.start_position)
        };
        let left = if backwards {
            position
        } else {
            end - position.min(end)
        };
        let rate = if secs > 0.0 {
            (moved as f64 / secs) as u64
        } else {
            0
        };
        LiveGrowStatus {
            // The member count kept: a chunk or layout change (`live_shape`;
            // a RAID 0's counted in its RAID 4's roles, `live_raid0`).
            kind: if self.reshape.old().members() == self.reshape.new_shape().members() {
                "restripe"
            } else if self.reshape.old().members() > self.reshape.new_shape().members() {
                "shrink"
            } else {
                "grow"
            },
            state: progress.state,
            raid_disks_before: self.old_members,
            // A RAID 0's grow ends one member short of its RAID 4.
            raid_disks: self.reshape.new_shape().members() - u32::from(self.raid0.is_some()),
            position_bytes: position,
            end_bytes: end,
            bytes_per_sec: rate,
            eta_seconds: (rate > 0 && progress.state == "running").then(|| left / rate),
            error: progress.error.clone(),
            new_size_bytes: end,
        }
    }

    /// The steps, then the end; a failure recorded in the status.
    fn run(self: Arc<Self>, array: Weak<Array>) {
        // The steps reuse their buffers (freed when the grow's thread
        // leaves its steps), as the offline grow's do.
        let kept = super::step::KeptBuffers::on_this_thread();
        let steps = self.steps(&array);
        drop(kept);
        let outcome = steps.and_then(|finished| match array.upgrade() {
            Some(array) if finished => self.adopt_end(&array).map(|()| true),
            _ => Ok(finished),
        });
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ended(
                outcome,
                "stopped (the server is stopping); `nvraid grow --continue` finishes it",
            );
    }

    fn steps(&self, array: &Weak<Array>) -> Result<bool> {
        if self.reshape.direction() == Direction::Backwards {
            return self.steps_backwards(array);
        }
        let end = self.reshape.new_shape().array_bytes();
        let unit = self.reshape.position_unit();
        let step_bytes = self.step_bytes.max(unit);
        let kernel = nvraid_parity::Kernel::best();
        let mut pace = GrowPace::open(&self.pacing);
        loop {
            let p = self.gate.position();
            if p >= end {
                break;
            }
            if !pace.may_step(&self.pacing) {
                return Ok(false);
            }
            let Some(array) = array.upgrade() else {
                return Ok(false);
            };
            let reshape = self
                .reshape
                .at(p)
                .map_err(|e| Error::NotStartable(e.to_string()))?;
            let mut to = (p + step_bytes).min(end);
            if to < end {
                to = to / unit * unit;
            }
            loop {
                let kernel_ok = to == end || reshape.at(to).is_ok_and(|r| r.md_can_continue());
                if to > p && reshape.step_is_safe(to) && kernel_ok {
                    break;
                }
                if to <= p + unit {
                    return Err(Error::NotStartable(format!(
                        "no step from {p} is safe (the data offset moved too little)"
                    )));
                }
                to = if to == end {
                    (end - 1) / unit * unit
                } else {
                    to - unit
                };
            }
            // The window covers what the step reads and writes whole (see
            // `step_window`), not just `[p, to)`.
            let (window_start, window_end) = self.step_window(p, to);
            self.gate.close_window(window_start, window_end);
            // A member that failed has stale old rows (the array writes
            // around it): the step reads around it, as the offline grow
            // does, and writes nothing to it; one failing here is recorded
            // faulty and the step done again without it.
            if let Err(e) = self.move_degraded(&array, &reshape, to, kernel) {
                self.gate.open_window(None);
                return Err(e);
            }
            {
                let mut record = self.record.lock().unwrap_or_else(|p| p.into_inner());
                *record = (if to < end { to / 512 } else { record.0 }, to >= end);
            }
            if let Err(e) = array.rewrite_superblocks() {
                self.gate.open_window(None);
                return Err(e);
            }
            crate::failpoint::hit("reshape-superblock");
            self.gate.open_window(Some(to));
            pace.moved(&self.pacing, to - p);
        }
        Ok(true)
    }

    /// The finished shape is recorded on every member: the served array
    /// takes it (`Array::swap_shape`): the fast path serves the new shape,
    /// the size is the new one, the added members are the array's own
    /// roles, and another reshape may start. Each role's superblock
    /// template is the one the finished record wrote; a member that failed
    /// during the grow is missing from the new shape. The new shape is the
    /// one the next assembly makes of those superblocks, or the array
    /// keeps serving through the grow's route (refused, by name).
    fn adopt_end(&self, array: &Array) -> Result<()> {
        let mut new = self.reshape.new_shape().clone();
        let failed = self.failed_roles(array);
        let table = array.role_table_now();
        let old = self.old_members as usize;
        // The roles of the array from now on: a shrink's leaving roles
        // have left it, and a RAID 0 grown as md's RAID 4 ends as a RAID 0
        // of its data roles (the parity role, last, never held a member).
        let roles = new.members() as usize - usize::from(self.raid0.is_some());
        let mut slots = Vec::with_capacity(roles);
        let mut reference = None;
        for (role, &failed) in failed.iter().enumerate().take(roles) {
            if failed {
                slots.push(None);
                continue;
            }
            let (member, mut sb) = if role < old {
                let slot = array.slot(role).expect("a usable role has its member");
                (slot.member.clone(), slot.superblock.clone())
            } else {
                let (member, sb) = &self.added[role - old];
                (
                    member.clone(),
                    sb.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                )
            };
            self.record_into(role, &mut sb);
            reference.get_or_insert_with(|| sb.clone());
            slots.push(Some(crate::slot::Slot::shared(member, sb)?));
        }
        let reference = reference.expect("a grown array has a member");
        let assembled = crate::assemble::geometry_of(&reference, &reference.name())?;
        if self.raid0.is_some() && assembled.level() == Level::Raid0 {
            // One zone: the RAID 4's data chunks lie where the RAID 0's do.
            if assembled.members() as usize == roles
                && assembled.chunk_bytes() == new.chunk_bytes()
                && assembled.array_bytes() == new.array_bytes()
            {
                new = assembled.clone();
            }
        }
        if assembled != new {
            return Err(Error::NotStartable(format!(
                "the finished shape as assembled ({assembled:?}) is not the one grown ({new:?}); the array serves it through the grow's route until `serve` restarts"
            )));
        }
        array.swap_shape(new, slots, table)
    }

    /// The new shape's members by role: the array's, then the added.
    pub(super) fn members_of<'a>(&'a self, array: &'a Array) -> Vec<&'a Member> {
        (0..self.old_members as usize)
            .map(|r| &*array.slot(r).expect("a whole array").member)
            .chain(self.added.iter().map(|(m, _)| &**m))
            .chain(self.raid0.as_ref().map(|r| &r.stand_in))
            .collect()
    }

    fn rw(&self, array: &Array, write: bool, offset: u64, buf: &mut [u8], fua: bool) -> Result<()> {
        let len = buf.len() as u64;
        let _busy = self.pacing.request();
        let (epoch, position) = self.gate.enter(offset, len);
        let split = position.clamp(offset, offset + len);
        let cut = (split - offset) as usize;
        let (below, above) = buf.split_at_mut(cut);
        // Forwards the new shape is below the position, backwards (a
        // shrink, `live_backwards`) at and past it.
        let ((new_at, new_part), (old_at, old_part)) =
            if self.reshape.direction() == Direction::Backwards {
                ((split, above), (offset, below))
            } else {
                ((offset, below), (split, above))
            };
        let done = (|| {
            if !new_part.is_empty() {
                let copies = self.reshape.new_shape().level().parity_chunks() == 0;
                match (write, copies) {
                    (true, false) => self.new_write(array, new_at, new_part, fua)?,
                    (false, false) => self.new_read(array, new_at, new_part)?,
                    (true, true) => self.copy_write(array, new_at, new_part, fua)?,
                    (false, true) => self.copy_read(array, new_at, new_part)?,
                }
            }
            if !old_part.is_empty() {
                if write {
                    array.write_at(old_part, old_at, fua)?;
                } else {
                    array.read_at(old_part, old_at)?;
                }
            }
            Ok(())
        })();
        self.gate.leave(epoch);
        done
    }

    /// Read new-shape bytes (all below the position). A chunk on a
    /// failed member (or one whose read fails: it is failed then) is
    /// rebuilt from its stripe's other chunks and parity.
    fn new_read(&self, array: &Array, offset: u64, buf: &mut [u8]) -> Result<()> {
        let new = self.reshape.new_shape();
        let base = self.new_offset();
        let members = self.members_of(array);
        let chunk = new.chunk_bytes().expect("chunks");
        let map = new
            .level()
            .stripe_map(new.members())
            .expect("a parity level");
        let unit = chunk * u64::from(map.data_per_stripe());
        let mut at = 0usize;
        let mut stripe_data: Option<(u64, AlignedBuf)> = None;
        let mut failed = self.failed_roles(array);
        for piece in new.pieces(offset, buf.len() as u64) {
            let place = new.locate(piece.logical_offset, 0);
            let out = &mut buf[at..at + piece.len as usize];
            at += piece.len as usize;
            let role = place.member as usize;
            if !failed[role] {
                let member = members[role];
                match member.read_at(out, base + place.member_offset) {
                    Ok(()) => continue,
                    Err(e) => {
                        self.member_failed(array, role, e)?;
                        failed = self.failed_roles(array);
                    }
                }
            }
            // Degraded: the whole stripe's data, under its lock (a write
            // beside it changes data and parity together).
            let stripe = piece.logical_offset / unit;
            if stripe_data.as_ref().is_none_or(|(s, _)| *s != stripe) {
                let mut data = AlignedBuf::zeroed(unit as usize);
                let _lock = self.stripes[(stripe % STRIPE_LOCKS) as usize]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                self.read_stripe(array, stripe, &mut data, &[])?;
                stripe_data = Some((stripe, data));
            }
            let (_, data) = stripe_data.as_ref().expect("read above");
            let from = (piece.logical_offset - stripe * unit) as usize;
            out.copy_from_slice(&data[from..from + piece.len as usize]);
        }
        Ok(())
    }

    pub(super) fn new_offset(&self) -> u64 {
        self.reshape
            .data_offset(nvraid_layout::Shape::New, 0)
            .expect("role 0")
    }

    /// Write new-shape bytes (all below the position): each new stripe it
    /// touches read, changed and written whole with its parity, under the
    /// stripe's lock; admitted as a write of the same member rows. Failed
    /// members are left out (their chunks read through the parity, the
    /// parity written covering them); a member whose I/O fails is failed
    /// (recorded faulty) and the write goes on without it.
    fn new_write(&self, array: &Array, offset: u64, buf: &[u8], fua: bool) -> Result<()> {
        let new = self.reshape.new_shape();
        let old = self.reshape.old();
        let map = new
            .level()
            .stripe_map(new.members())
            .expect("a parity level");
        let chunk = new.chunk_bytes().expect("chunks");
        let data_per = u64::from(map.data_per_stripe());
        let unit = chunk * data_per;
        let old_chunk = old.chunk_bytes().expect("chunks");
        let old_unit = old_chunk * u64::from(old.members() - old.level().parity_chunks());
        let end = offset + buf.len() as u64;
        let (first, last) = (offset / unit, (end - 1) / unit);
        // The old shape's array bytes in the same member rows: what the
        // write-intent bitmap (member rows) and the dirty mark take; whole
        // old stripes, whose chunk may differ (a restripe).
        let admit_at = first * chunk / old_chunk * old_unit;
        let admit_len = ((last + 1) * chunk).div_ceil(old_chunk) * old_unit;
        let admit_len = admit_len.min(old.array_bytes()) - admit_at;
        let base = self.new_offset();
        let kernel = nvraid_parity::Kernel::best();
        array.while_admitted(admit_at, admit_len.max(1), || {
            let members = self.members_of(array);
            let c = chunk as usize;
            let mut data = AlignedBuf::zeroed(unit as usize);
            let mut p = AlignedBuf::zeroed(c);
            let mut q = AlignedBuf::zeroed(c);
            for stripe in first..=last {
                let _lock = self.stripes[(stripe % STRIPE_LOCKS) as usize]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let blocks = map.stripe(stripe);
                let row = base + stripe * chunk;
                let s_start = stripe * unit;
                let (w_start, w_end) = (offset.max(s_start), end.min(s_start + unit));
                // The chunks the write covers whole need no read.
                let whole: Vec<bool> = (0..blocks.data.len() as u64)
                    .map(|d| {
                        let (c_start, c_end) = (s_start + d * chunk, s_start + (d + 1) * chunk);
                        w_start <= c_start && c_end <= w_end
                    })
                    .collect();
                self.read_stripe(array, stripe, &mut data, &whole)?;
                data[(w_start - s_start) as usize..(w_end - s_start) as usize]
                    .copy_from_slice(&buf[(w_start - offset) as usize..(w_end - offset) as usize]);
                let chunk_of = |d: usize| &data[d * c..(d + 1) * c];
                match blocks.q {
                    None => {
                        let all: Vec<&[u8]> = (0..blocks.data.len()).map(chunk_of).collect();
                        nvraid_parity::gen_p(kernel, &all, &mut p);
                    }
                    Some(_) => {
                        let mut ordered: Vec<&[u8]> = vec![&[]; blocks.data.len()];
                        for d in 0..blocks.data.len() {
                            ordered[map.q_slot(stripe, d as u32)] = chunk_of(d);
                        }
                        nvraid_parity::gen_pq(kernel, &ordered, &mut p, &mut q);
                    }
                }
                let mut writes: Vec<(u32, &[u8])> = Vec::with_capacity(blocks.data.len() + 2);
                for (d, &m) in blocks.data.iter().enumerate() {
                    let (c_start, c_end) =
                        (s_start + d as u64 * chunk, s_start + (d as u64 + 1) * chunk);
                    if c_end <= w_start || w_end <= c_start {
                        continue; // unchanged
                    }
                    writes.push((m, chunk_of(d)));
                }
                writes.push((blocks.p, &p));
                if let Some(qm) = blocks.q {
                    writes.push((qm, &q));
                }
                let failed = self.failed_roles(array);
                for (m, bytes) in writes {
                    let role = m as usize;
                    if failed[role] {
                        continue; // the parity written covers it
                    }
                    if let Err(e) = members[role].write_at(bytes, row) {
                        self.member_failed(array, role, e)?;
                    }
                }
            }
            if fua {
                for (role, member) in members.iter().enumerate() {
                    if self.failed_roles(array)[role] {
                        continue;
                    }
                    if let Err(e) = member.flush() {
                        self.member_failed(array, role, e)?;
                    }
                }
            }
            Ok(())
        })
    }

    /// The record as it stands, put into a superblock of the member in
    /// `role` (either shape's).
    fn record_into(&self, role: usize, sb: &mut Superblock) {
        let (position, finished) = *self.record.lock().unwrap_or_else(|p| p.into_inner());
        let new = self.reshape.new_shape();
        self.raid0_as_raid4(sb);
        sb.raid_disks = new.members();
        sb.bblog_offset = self.bblog_offsets[role];
        sb.feature_map |= features::RESHAPE_ACTIVE | features::NEW_OFFSET;
        let backwards = self.reshape.direction() == Direction::Backwards;
        if backwards {
            sb.feature_map |= features::RESHAPE_BACKWARDS;
        }
        // Counted from the old shape's roles (a RAID 0 grown as md's RAID 4
        // has one more than its members).
        sb.delta_disks =
            (i64::from(new.members()) - i64::from(self.reshape.old().members())) as i32 as u32;
        sb.new_level = sb.level as u32;
        // A restripe's new layout and chunk (`live_shape`); a grow keeps
        // both, the layout word as it is (md's raid4 keeps its own).
        if new.level() != self.reshape.old().level() {
            sb.new_layout = new.level().md_layout();
        } else {
            sb.new_layout = sb.layout;
        }
        sb.new_chunk = new
            .chunk_bytes()
            .map_or(sb.chunk_sectors, |c| (c / 512) as u32);
        sb.reshape_position = position;
        if backwards {
            // The data area reaches past the rows the old shape uses by
            // the move up (as the offline shrink records it): the finished
            // record's, the move taken off, still holds those rows.
            let used = self.reshape.old().member_used_bytes() / 512;
            sb.data_size_sectors = sb.data_size_sectors.max(used + self.moved_sectors);
        }
        sb.new_offset = if backwards {
            self.moved_sectors as i32 as u32
        } else {
            (-(self.moved_sectors as i64)) as i32 as u32
        };
        if finished {
            finish_record(sb);
        }
        self.raid0_record(role, sb, position * 512, finished);
    }
}

/// A client request in flight (see [`Clients::request`]).
pub(super) struct ClientRequest<'a>(&'a AtomicU64);

impl Drop for ClientRequest<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The grow's pacing beside clients, the rebuild's rule: within a window
/// of [`GrowPace::WINDOW`], never faster than the maximum; while clients
/// made requests in the previous window or have one in flight at its end,
/// no faster than the minimum either (a minimum of 0: no step at all
/// until they pause). Clients' requests are counted as the route takes
/// them ([`Clients`]), so the grow's own member I/O never counts as
/// theirs.
pub(super) struct GrowPace {
    start: Instant,
    /// Bytes moved since the window opened.
    bytes: u64,
    /// Client requests counted when the window opened.
    ops_seen: u64,
    /// Whether clients were busy in the previous window.
    busy: bool,
}

impl GrowPace {
    const WINDOW: Duration = Duration::from_millis(100);

    pub(super) fn open(live: &Pacing) -> GrowPace {
        let mut pace = GrowPace::watching(&live.clients);
        if live.min_bytes_per_sec.is_some() {
            // Look before the first step: a full-speed first window would
            // take the clients' share before their activity shows.
            std::thread::sleep(Duration::from_millis(20));
            pace.sample(&live.clients);
        }
        pace
    }

    fn watching(clients: &Clients) -> GrowPace {
        GrowPace {
            start: Instant::now(),
            bytes: 0,
            ops_seen: clients.ops.load(Ordering::Relaxed),
            busy: false,
        }
    }

    /// Close the window: were clients busy in it?
    fn sample(&mut self, clients: &Clients) {
        let ops = clients.ops.load(Ordering::Relaxed);
        // Clients whose requests all wait (for a step's window, on a
        // slow member) start none in the window, and are busy still.
        self.busy = ops != self.ops_seen || clients.in_flight.load(Ordering::Relaxed) > 0;
        self.ops_seen = ops;
        (self.start, self.bytes) = (Instant::now(), 0);
    }

    /// The rate that applies now (`None`: unlimited).
    fn rate(&self, live: &Pacing) -> Option<u64> {
        let (min, max) = (live.min_bytes_per_sec, live.max_bytes_per_sec);
        match (self.busy, min, max) {
            (true, Some(min), Some(max)) => Some(min.min(max)),
            (true, Some(min), None) => Some(min),
            (_, _, max) => max,
        }
    }

    /// Whether the next step may start (`false`: the grow is asked to
    /// stop). With a minimum of 0, waits while clients stay busy.
    pub(super) fn may_step(&mut self, live: &Pacing) -> bool {
        loop {
            if live.stopping() {
                return false;
            }
            if self.rate(live) != Some(0) {
                return true;
            }
            std::thread::sleep(Self::WINDOW);
            self.sample(&live.clients);
        }
    }

    /// A step moved `len` bytes: sleep while ahead of the rate that
    /// applies, and open the next window when this one is over.
    pub(super) fn moved(&mut self, live: &Pacing, len: u64) {
        self.bytes += len;
        if let Some(rate) = self.rate(live).filter(|&r| r > 0) {
            let due = Duration::from_secs_f64(self.bytes as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(self.start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        if self.start.elapsed() >= Self::WINDOW {
            self.sample(&live.clients);
        }
    }
}

/// What a served reshape's launch leaves when it fails (see
/// [`route_and_run`]).
pub(super) enum OnFailure<'m> {
    /// A fresh start: it is forgotten. The route and the record are
    /// dropped, every superblock is written again without the record, and
    /// `added` (the members the start gave a superblock first, an event
    /// ahead of the others) are cleared of it: left behind, their
    /// superblocks would record a reshape that never moved a byte and
    /// compete with the others' at the next assembly (md would go on
    /// with it).
    Forget { added: Vec<&'m Member> },
    /// A recorded reshape taken up again: the members recorded it before
    /// this launch, and keep it (md and the next `serve` go on from it).
    Keep,
}

/// What every served reshape's start does once its record is set on the
/// array: every superblock written with it, the route set (waiting for
/// the requests the fast-path queues had in flight), and `run` started on
/// a thread named `thread` (`failed`: what a refused thread is called).
/// A failure on the way is handled as `on_failure` says.
pub(super) fn route_and_run<T: LiveRoute + ReshapeRecord + 'static>(
    array: &Arc<Array>,
    live: &Arc<T>,
    thread: &str,
    failed: &str,
    run: fn(Arc<T>, Weak<Array>),
    on_failure: OnFailure<'_>,
) -> Result<std::thread::JoinHandle<()>> {
    let launched = (|| {
        array.rewrite_superblocks()?;
        crate::failpoint::hit("reshape-superblock");
        crate::failpoint::error("reshape-launch").map_err(|e| Error::io("(reshape launch)", e))?;
        if !array.start_live_route(live.clone()) {
            unreachable!("invariant: the record was set once, so was the route");
        }
        crate::failpoint::error("reshape-thread")
            .map_err(|e| Error::NotStartable(format!("{failed}: {e}")))?;
        let weak = Arc::downgrade(array);
        let live = live.clone();
        std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || run(live, weak))
            .map_err(|e| Error::NotStartable(format!("{failed}: {e}")))
    })();
    if let (Err(_), OnFailure::Forget { added }) = (&launched, on_failure) {
        forget_launch(array, live, &added);
    }
    launched
}

/// [`OnFailure::Forget`]: no step ran, so the old shape is the served one
/// throughout. A member that cannot take the superblock update is
/// recorded faulty as any update's is; if the update fails, the members
/// keep a record at the reshape's start, which md and `serve` go on from
/// (and the added members keep theirs).
fn forget_launch<T: LiveRoute + ReshapeRecord + 'static>(
    array: &Array,
    live: &Arc<T>,
    added: &[&Member],
) {
    let route: Arc<dyn LiveRoute> = live.clone();
    array.end_live_route(&route);
    let record: Arc<dyn ReshapeRecord> = live.clone();
    if !array.clear_reshape_record(&record) {
        return;
    }
    if let Err(e) = array.rewrite_superblocks() {
        eprintln!("nvraid: the reshape that failed to start is still recorded on the members: {e}");
        return;
    }
    let blank = AlignedBuf::zeroed(4096);
    for member in added {
        let wiped = member
            .write_at(&blank, nvraid_metadata::SUPER_OFFSET_BYTES)
            .and_then(|()| member.flush());
        if let Err(e) = wiped {
            eprintln!(
                "nvraid: {}: its superblock from the reshape that failed to start could not be cleared: {e}",
                member.spec()
            );
        }
    }
}

impl LiveRoute for LiveGrow {
    fn io(
        &self,
        array: &Array,
        op: OpKind,
        offset: u64,
        buf: &mut [u8],
        fua: bool,
    ) -> std::result::Result<(), i32> {
        let errno = |e: Error| match e {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        };
        // A served shrink's smaller size holds from its start: a client
        // that connected before (told the old size) gets an error past it.
        let end = self.reshape.new_shape().array_bytes();
        if matches!(op, OpKind::Read | OpKind::Write)
            && self.reshape.direction() == Direction::Backwards
            && offset.saturating_add(buf.len() as u64) > end
        {
            return Err(if op == OpKind::Read {
                libc::EINVAL
            } else {
                libc::ENOSPC
            });
        }
        match op {
            OpKind::Read => self.rw(array, false, offset, buf, false).map_err(errno),
            OpKind::Write => self.rw(array, true, offset, buf, fua).map_err(errno),
            OpKind::Flush => {
                let _busy = self.pacing.request();
                array.flush().map_err(errno)?;
                for (k, (member, _)) in self.added.iter().enumerate() {
                    if self.added_failed.is_failed(k) {
                        continue;
                    }
                    if let Err(e) = member.flush() {
                        let role = self.old_members as usize + k;
                        self.member_failed(array, role, e).map_err(errno)?;
                    }
                }
                Ok(())
            }
            // A discard may leave the old data (the Target's contract).
            OpKind::Discard => Ok(()),
        }
    }
}

impl Companion for LiveGrow {
    fn after_superblocks(&self, update: &Update<'_>) -> Result<()> {
        self.write_added(update.events, Some(update), update.roles_raw)
            .map_err(|(role, e)| {
                let spec = self.added[role - self.old_members as usize].0.spec();
                self.added_superblock_failed(role, spec, e, update.roles_raw)
            })
    }

    fn role_table(&self, table: &mut [u16]) {
        self.leaving_table(table);
        for (k, &(dev, entry)) in self.table_entries.iter().enumerate() {
            if let Some(slot) = table.get_mut(dev) {
                *slot = if self.added_failed.is_failed(k) {
                    Role::Faulty.to_raw()
                } else {
                    entry
                };
            }
        }
    }

    fn write_again(&self) -> bool {
        self.added_failed.take_write_again()
    }
}

impl LiveGrow {
    /// Write the added members' superblocks with `events` (and the
    /// update's resync offset and time once it is known; dirty before).
    fn write_added(
        &self,
        events: u64,
        update: Option<&Update<'_>>,
        table: &[u16],
    ) -> std::result::Result<(), (usize, std::io::Error)> {
        for (k, (member, sb)) in self.added.iter().enumerate() {
            if self.added_failed.is_failed(k) {
                // md writes no superblock to a member that failed.
                continue;
            }
            let role = self.old_members as usize + k;
            // Each write starts from the member's own superblock as it
            // was before the reshape (the record is put in afresh: the
            // finished shape moves the data offset once).
            let mut written = sb.lock().unwrap_or_else(|p| p.into_inner()).clone();
            self.record_into(role, &mut written);
            written.roles_raw = table.to_vec();
            self.role_table(&mut written.roles_raw);
            write_added_superblock(member, &mut written, events, update).map_err(|e| (role, e))?;
        }
        Ok(())
    }
}

impl ReshapeRecord for LiveGrow {
    fn apply(&self, role: usize, sb: &mut Superblock) {
        self.record_into(role, sb);
    }
}

#[cfg(test)]
mod tests {
    use super::{Clients, Gate, GrowPace};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A read routed by the old position (to the old shape) is still in
    /// flight when the position moves; the next step, which may overwrite
    /// the old rows it reads, must wait for it, even though it lies
    /// outside that step's window.
    #[test]
    fn a_step_waits_for_a_read_routed_before_the_position_moved() {
        let gate = Arc::new(Gate::default());
        gate.close_window(0, 1 << 20);
        gate.open_window(Some(1 << 20));
        // A read routed at position 1 MiB: its bytes at 3 MiB are read in
        // the old shape. A step that moves the position on may then
        // overwrite old rows of bytes it passed; it must wait for the
        // read, although the read lies outside its window.
        let (epoch, position) = gate.enter(3 << 20, 4096);
        assert_eq!(position, 1 << 20);
        let stepped = Arc::new(AtomicBool::new(false));
        let step = {
            let gate = gate.clone();
            let stepped = stepped.clone();
            std::thread::spawn(move || {
                gate.close_window(1 << 20, 2 << 20);
                stepped.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !stepped.load(Ordering::SeqCst),
            "the step went on while a request routed before it was in flight"
        );
        gate.leave(epoch);
        step.join().unwrap();
        assert!(stepped.load(Ordering::SeqCst));
        // Requests that start after the step began are not waited for,
        // and one in its window waits for the window to open.
        let (late, _) = gate.enter(0, 4096);
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.enter((1 << 20) + 4096, 4096))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "a request entered the step's window");
        gate.open_window(Some(2 << 20));
        let (e, position) = waiter.join().unwrap();
        assert_eq!(position, 2 << 20);
        gate.leave(e);
        gate.leave(late);
    }

    /// Clients whose requests all wait (here: one request held, as one
    /// waiting for a step's window is) start no new one in a pacing
    /// window; they are busy all the same, and the grow must stay at its
    /// minimum.
    #[test]
    fn clients_waiting_on_their_requests_keep_the_grow_at_its_minimum() {
        let clients = Clients::default();
        let mut pace = GrowPace::watching(&clients);
        pace.sample(&clients);
        assert!(!pace.busy, "no client yet");
        let request = clients.request();
        pace.sample(&clients);
        assert!(pace.busy, "a request started in the window");
        pace.sample(&clients);
        assert!(
            pace.busy,
            "a request still in flight, none started: the clients are busy"
        );
        drop(request);
        pace.sample(&clients);
        assert!(!pace.busy, "every request finished, none started");
    }
}
