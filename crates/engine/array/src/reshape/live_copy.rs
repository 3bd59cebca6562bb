//! Served arrays of copies growing (`nvraid grow --socket`), beside
//! [`LiveGrow`]'s RAID 4/5/6: a RAID 10 near gaining members (the route's
//! new-shape reads and writes of [`LiveGrow`] for copies; its steps are
//! `step`'s `move_copy_rows` as offline, the window widened to the rows
//! they rewrite whole), a RAID 1 gaining mirrors ([`LiveMirror`]), and
//! [`start_live`], which picks the one the served array's level takes.
//!
//! A RAID 1 has no rows to move: md's grow raises the member count and
//! rebuilds the new mirrors from the others. Served, nvraid does the same
//! without stopping clients:
//!
//! - **The record.** Every superblock update of the running array records
//!   the new member count on the old members and gives the added members
//!   their roles in the role table; the added members' own superblocks are
//!   written with it, first, as recovering (`RECOVERY_OFFSET`, md's
//!   `recovery_offset` the copy's position). A crash leaves md's state after
//!   `--grow --raid-devices` with the new mirror part-way through its
//!   recovery: it assembles, and the rebuild goes on from there.
//! - **The route.** Reads are the array's own (the old members hold every
//!   byte). A write goes to the array, then, for its bytes below the copy's
//!   position, to every added member too; bytes at or past the position
//!   reach them with the copy.
//! - **A step** copies `[P, P')` onto the added members as a rebuild does:
//!   it closes the window `[P, P')` to client writes, waits for every
//!   request that started before it (a write routed when `P` was lower
//!   wrote only the old members above it), reads the array, writes and
//!   flushes the added members, records `P'` as their recovery offset and
//!   only then moves `P` and opens the window.
//! - **The end.** The added members are recorded in sync; the served
//!   array takes the new member count (`Array::swap_shape`): the added
//!   mirrors are its own roles, read and written by the fast path.
//!
//! An added member that fails is recorded faulty (its role then missing,
//! `nvraid add` fills it after a restart); the others go on. When every
//! added member has failed, the copy stops.

use super::grow::{free_dev_numbers, new_member_superblock};
use super::live::{write_added_superblock, Gate, GrowPace, Pacing, Progress, STRIPE_LOCKS};
use super::{LiveGrow, LiveGrowOptions, LiveGrowStatus};
use crate::array::{Array, LiveRoute};
use crate::error::{Error, Result};
use crate::intent::{bitmap_at, read_member_bitmap};
use crate::members::{Companion, ReshapeRecord, Update};
use nvraid_io::queue::OpKind;
use nvraid_io::AlignedBuf;
use nvraid_layout::{Geometry, Level};
use nvraid_member::Member;
use nvraid_metadata::{features, Role, Superblock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

/// A reshape running on a served array, as the server sees it.
pub trait LiveReshape: Send + Sync + std::fmt::Debug {
    /// Stop after the step under way (the position it records stays).
    fn stop(&self);
    /// Where it stands (`nvraid status`).
    fn status(&self) -> LiveGrowStatus;
    /// The members a finished shrink released that had failed during it
    /// (none for any other reshape).
    fn left_faulty(&self) -> Vec<String> {
        Vec::new()
    }
}

impl LiveReshape for LiveGrow {
    fn stop(&self) {
        LiveGrow::stop(self)
    }

    fn status(&self) -> LiveGrowStatus {
        LiveGrow::status(self)
    }

    fn left_faulty(&self) -> Vec<String> {
        LiveGrow::left_faulty(self)
    }
}

/// Start growing the served `array` as `options` ask: a RAID 1 gains
/// mirrors ([`LiveMirror`]), a RAID 4/5/6 members ([`LiveGrow`]); the
/// others are refused by [`LiveGrow::start`], naming the level.
pub fn start_live(
    array: &Arc<Array>,
    options: &LiveGrowOptions,
) -> Result<(Arc<dyn LiveReshape>, JoinHandle<()>)> {
    if matches!(array.geometry().level(), Level::Raid1) {
        let (live, thread) = LiveMirror::start(array, options)?;
        return Ok((live, thread));
    }
    if matches!(array.geometry().level(), Level::Raid0) {
        let (live, thread) = LiveGrow::start_raid0(array, options)?;
        return Ok((live, thread));
    }
    let (live, thread) = LiveGrow::start(array, options)?;
    Ok((live, thread))
}

/// The write-intent bitmap's bytes a served grow of `old` to `members`
/// must leave room for below the moved data (`None`: no bitmap). A RAID
/// 10's bits count array bytes: md resizes its bitmap for the larger
/// array (`bitmap::resized`), which must fit where it is; and since the
/// running array keeps setting bits in the bitmap as it is, a resize that
/// doubles the bitmap's chunk is refused (the array's grow offline does
/// it). The bits past the old size stay clear: the grow writes that
/// region itself, and the next assembly records the new size in the
/// header.
pub(super) fn bitmap_bytes(array: &Array, old: &Geometry, members: u32) -> Result<Option<u64>> {
    let Some(intent) = array.intent() else {
        return Ok(None);
    };
    if !matches!(old.level(), Level::Raid10 { .. }) {
        return Ok(Some(intent.storage_bytes()));
    }
    let slot = array.slot(0).expect("a whole array");
    let at = bitmap_at(&slot.superblock).expect("the array keeps a bitmap");
    let held = read_member_bitmap(&slot.member, &slot.superblock, at, old, 0)?;
    let new = Geometry::new(
        old.level(),
        members,
        old.chunk_bytes().expect("RAID 10 has chunks"),
        crate::assemble::member_data_bytes(&slot.superblock),
    )?;
    let grown = super::bitmap::resized(&held, old.bitmap_space_bytes(), new.bitmap_space_bytes());
    if grown.header.chunk_bytes != held.header.chunk_bytes {
        return Err(Error::Unsupported {
            spec: slot.member.spec().into(),
            what: format!(
                "a served RAID 10 grow whose write-intent bitmap md would resize to {}-byte chunks from {} (the running array keeps its bits as they are); stop serve and use `nvraid grow`",
                grown.header.chunk_bytes, held.header.chunk_bytes
            ),
        });
    }
    let found: Vec<(&Member, &Superblock)> = (0..array.roles())
        .filter_map(|r| array.slot(r))
        .map(|s| (&*s.member, &s.superblock))
        .collect();
    super::bitmap::check_fits(grown.at, grown.storage.len() as u64, &found)?;
    Ok(Some(
        (grown.storage.len() as u64).max(intent.storage_bytes()),
    ))
}

/// A RAID 10 growing while served: the bits of its new region (past the
/// old size) set in the write-intent bitmap, durably. md, continuing a
/// grow the server left part-way (killed), resyncs the region past the
/// old size once its reshape is done, but only where the bitmap says so;
/// unmarked, the copies md's steps leave there differ (the kernel's check
/// counted 8704 mismatched sectors on a RAID 10 of 4 x 15 MiB grown to 5).
/// Refused, by name, when the bitmap's image has no room for those bits.
pub(super) fn mark_new_region(array: &Array, old: &Geometry, new: &Geometry) -> Result<()> {
    let Some(intent) = array.intent() else {
        return Ok(());
    };
    if !matches!(old.level(), Level::Raid10 { .. }) {
        return Ok(());
    }
    if intent.mark_space(array, old.bitmap_space_bytes(), new.bitmap_space_bytes())? {
        return Ok(());
    }
    Err(Error::Unsupported {
        spec: array.slot(0).map_or("(missing)", |s| s.member.spec()).into(),
        what: "a served RAID 10 grow whose write-intent bitmap has no room for the new region's bits; stop serve and use `nvraid grow`".into(),
    })
}

/// A served RAID 10 near growing ([`LiveGrow`]'s route below the
/// position): a read from the first copy on a member not failed, a write
/// to every copy, under the chunk's lock.
impl LiveGrow {
    /// Read new-shape bytes of a RAID 10 (all below the position).
    pub(super) fn copy_read(&self, array: &Array, offset: u64, buf: &mut [u8]) -> Result<()> {
        let new = self.reshape.new_shape();
        let base = self.new_offset();
        let members = self.members_of(array);
        let mut at = 0usize;
        for piece in new.pieces(offset, buf.len() as u64) {
            let out = &mut buf[at..at + piece.len as usize];
            at += piece.len as usize;
            'copies: loop {
                let failed = self.failed_roles(array);
                for copy in 0..new.copies() {
                    let place = new.locate(piece.logical_offset, copy);
                    let role = place.member as usize;
                    if failed[role] {
                        continue;
                    }
                    match members[role].read_at(out, base + place.member_offset) {
                        Ok(()) => break 'copies,
                        Err(e) => {
                            self.member_failed(array, role, e)?;
                            continue 'copies;
                        }
                    }
                }
                return Err(Error::NotStartable(format!(
                    "no copy of array byte {} left on a member not failed",
                    piece.logical_offset
                )));
            }
        }
        Ok(())
    }

    /// Write new-shape bytes of a RAID 10 (all below the position) to
    /// every copy not failed, each chunk's piece under its lock; admitted
    /// as the same array bytes (a RAID 10's bitmap counts array bytes,
    /// the same in both shapes).
    pub(super) fn copy_write(
        &self,
        array: &Array,
        offset: u64,
        buf: &[u8],
        fua: bool,
    ) -> Result<()> {
        let new = self.reshape.new_shape();
        let chunk = new.chunk_bytes().expect("RAID 10 has chunks");
        let base = self.new_offset();
        array.while_admitted(offset, buf.len() as u64, || {
            let members = self.members_of(array);
            let mut at = 0usize;
            for piece in new.pieces(offset, buf.len() as u64) {
                let data = &buf[at..at + piece.len as usize];
                at += piece.len as usize;
                let lock = (piece.logical_offset / chunk) % STRIPE_LOCKS;
                let _lock = self.stripes[lock as usize]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                for copy in 0..new.copies() {
                    let place = new.locate(piece.logical_offset, copy);
                    let role = place.member as usize;
                    if self.failed_roles(array)[role] {
                        continue;
                    }
                    if let Err(e) = members[role].write_at(data, base + place.member_offset) {
                        self.member_failed(array, role, e)?;
                    }
                }
            }
            if fua {
                let failed = self.failed_roles(array);
                for (role, member) in members.iter().enumerate() {
                    if failed[role] {
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
}

/// A served RAID 1 gaining mirrors (see the module's text).
#[derive(Debug)]
pub struct LiveMirror {
    old_members: u32,
    new_members: u32,
    /// The added members, by role from `old_members` on, with their
    /// superblocks as first made (each update puts the state in).
    added: Vec<(Arc<Member>, Mutex<Superblock>)>,
    /// Per added member: it failed (no longer written, recorded faulty).
    failed: Vec<AtomicBool>,
    /// Where the added members' data starts on them.
    data_offset: u64,
    /// The role table's entries the added members hold: (device, entry).
    table_entries: Vec<(usize, u16)>,
    /// The array's bytes (what each mirror holds).
    end: u64,
    /// The recorded position in bytes (the added members' recovery
    /// offset), and whether they are recorded in sync.
    record: Mutex<(u64, bool)>,
    gate: Gate,
    progress: Mutex<Progress>,
    step_bytes: u64,
    pacing: Pacing,
}

impl LiveMirror {
    /// Check that the served RAID 1 `array` can take `options.add` as
    /// mirrors, record the new count and the recovering members on every
    /// member (the added ones first) and route client writes to them; the
    /// copy runs on a thread of its own, which is returned. Refused, with
    /// nothing written: an array not served writable, degraded, being
    /// recovered or awaiting a resync, a member count that is not the
    /// old one plus one per `--add`, new members too small, carrying a
    /// signature or members already.
    pub fn start(
        array: &Arc<Array>,
        options: &LiveGrowOptions,
    ) -> Result<(Arc<LiveMirror>, JoinHandle<()>)> {
        let spec0 = array
            .slot(0)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        super::live::refuse_second(array, &spec0, "grow")?;
        if !array.is_writable() {
            return Err(Error::ReadOnly);
        }
        let geometry = array.geometry().clone();
        assert!(matches!(geometry.level(), Level::Raid1), "start_live");
        if array.is_degraded() {
            return Err(Error::NotStartable(
                "the array is degraded; nvraid adds mirrors only to a whole array: rebuild it first"
                    .into(),
            ));
        }
        super::live::check_settled(array)?;
        let old_count = geometry.members();
        super::live::check_count(options, old_count)?;
        let reference = array.superblock().clone();
        let adding = super::live::open_added(array, options, &reference, &geometry)?;
        let free = free_dev_numbers(&reference, adding.len())?;
        let mut added = Vec::with_capacity(adding.len());
        let mut table_entries = Vec::with_capacity(adding.len());
        for (k, (member, dev)) in adding.into_iter().zip(free).enumerate() {
            let sb = new_member_superblock(&member, &reference, dev)?;
            table_entries.push((
                dev as usize,
                Role::Active((old_count as usize + k) as u16).to_raw(),
            ));
            super::live::ready_added(array, &member, &sb)?;
            added.push((Arc::new(member), Mutex::new(sb)));
        }
        let live = Arc::new(LiveMirror {
            old_members: old_count,
            new_members: options.raid_devices,
            failed: added.iter().map(|_| AtomicBool::new(false)).collect(),
            added,
            data_offset: reference.data_offset_sectors * 512,
            table_entries,
            end: geometry.array_bytes(),
            record: Mutex::new((0, false)),
            gate: Gate::default(),
            progress: Mutex::new(Progress {
                state: "running",
                error: None,
                started: Instant::now(),
                start_position: 0,
            }),
            step_bytes: options.step_bytes.max(4096),
            pacing: Pacing::new(options.min_bytes_per_sec, options.max_bytes_per_sec),
        });
        array.mark_dirty()?;
        // The added members first, one event ahead of the others until
        // those are written.
        if let Some((k, e)) = live
            .write_added(array.events() + 1, None, &array.role_table_now())
            .into_iter()
            .next()
        {
            return Err(Error::io(live.added[k].0.spec(), e));
        }
        if !array.set_reshape_record(live.clone()) {
            return Err(Error::Unsupported {
                spec: spec0,
                what: "a second grow while one runs on this served array".into(),
            });
        }
        let thread = super::live::route_and_run(
            array,
            &live,
            "nvraid-mirror",
            "no copy thread",
            LiveMirror::run,
            super::live::OnFailure::Forget {
                added: live.added.iter().map(|(m, _)| &**m).collect(),
            },
        )?;
        Ok((live, thread))
    }

    /// The copy, then the end; a failure recorded in the status.
    fn run(self: Arc<Self>, array: Weak<Array>) {
        let outcome = self
            .steps(&array)
            .and_then(|finished| match array.upgrade() {
                Some(array) if finished => self.adopt_end(&array).map(|()| true),
                _ => Ok(finished),
            });
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ended(outcome, "stopped (the server is stopping); the new mirrors are recorded recovering, and the rebuild goes on when the array is served again");
    }

    fn steps(&self, array: &Weak<Array>) -> Result<bool> {
        let end = self.end;
        let mut pace = GrowPace::open(&self.pacing);
        let mut buf = AlignedBuf::zeroed(self.step_bytes.min(4 << 20) as usize);
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
            let to = (p + self.step_bytes).min(end);
            self.gate.close_window(p, to);
            let copied = self.copy(&array, p, to, &mut buf);
            if let Err(e) = copied {
                self.gate.open_window(None);
                return Err(e);
            }
            *self.record.lock().unwrap_or_else(|p| p.into_inner()) = (to, to >= end);
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

    /// The added mirrors are recorded in sync: the served array takes the
    /// new member count (`Array::swap_shape`), the added mirrors its own
    /// roles (an added one that failed missing), and another reshape may
    /// start. The shape is the one the next assembly makes of the
    /// superblocks as recorded.
    fn adopt_end(&self, array: &Array) -> Result<()> {
        let table = array.role_table_now();
        let old = self.old_members as usize;
        let mut slots = Vec::with_capacity(self.new_members as usize);
        for role in 0..self.new_members as usize {
            let held = if role < old {
                array
                    .slot(role)
                    .filter(|_| array.is_usable(role))
                    .map(|s| (s.member.clone(), s.superblock.clone()))
            } else {
                let k = role - old;
                let (member, sb) = &self.added[k];
                (!self.failed[k].load(Ordering::Acquire)).then(|| {
                    let mut sb = sb.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    sb.feature_map &= !features::RECOVERY_OFFSET;
                    sb.recovery_offset = 0;
                    (member.clone(), sb)
                })
            };
            match held {
                Some((member, mut sb)) => {
                    self.apply(role, &mut sb);
                    slots.push(Some(crate::slot::Slot::shared(member, sb)?));
                }
                None => slots.push(None),
            }
        }
        let reference = slots
            .iter()
            .flatten()
            .next()
            .map(|s| s.superblock.clone())
            .expect("a mirrored array keeps a member");
        let new = crate::assemble::geometry_of(&reference, &reference.name())?;
        array.swap_shape(new, slots, table)
    }

    /// Copy the array's `[p, to)` onto every added member still in use,
    /// durably; an error when none is left.
    fn copy(&self, array: &Array, p: u64, to: u64, buf: &mut [u8]) -> Result<()> {
        let mut at = p;
        while at < to {
            let len = (to - at).min(buf.len() as u64) as usize;
            array.read_at(&mut buf[..len], at)?;
            self.write_added_data(array, at, &buf[..len], false);
            at += len as u64;
        }
        for (k, (member, _)) in self.added.iter().enumerate() {
            if !self.failed[k].load(Ordering::Acquire) {
                if let Err(e) = member.flush() {
                    self.fail_added(array, k, &e);
                }
            }
        }
        if self.failed.iter().all(|f| f.load(Ordering::Acquire)) {
            return Err(Error::NotStartable(
                "every added member failed; the mirrors were not added (the array keeps its old members)".into(),
            ));
        }
        Ok(())
    }

    /// Write array bytes at `offset` to every added member still in use
    /// (a member that fails is recorded faulty, the others go on).
    fn write_added_data(&self, array: &Array, offset: u64, data: &[u8], fua: bool) {
        for (k, (member, _)) in self.added.iter().enumerate() {
            if self.failed[k].load(Ordering::Acquire) {
                continue;
            }
            let mut done = member.write_at(data, self.data_offset + offset);
            if done.is_ok() && fua {
                done = member.flush();
            }
            if let Err(e) = done {
                self.fail_added(array, k, &e);
            }
        }
    }

    /// Added member `k` failed: stop writing it and record it faulty on
    /// every member.
    fn fail_added(&self, array: &Array, k: usize, error: &std::io::Error) {
        if self.failed[k].swap(true, Ordering::AcqRel) {
            return;
        }
        eprintln!(
            "nvraid: {}: {error} while it was added as a mirror; marked faulty",
            self.added[k].0.spec()
        );
        if let Err(e) = array.rewrite_superblocks() {
            eprintln!("nvraid: the superblocks recording it faulty: {e}");
        }
    }

    fn write(&self, array: &Array, offset: u64, buf: &[u8], fua: bool) -> Result<()> {
        let len = buf.len() as u64;
        let (epoch, position) = self.gate.enter(offset, len);
        let done = (|| {
            array.write_at(buf, offset, fua)?;
            let below = position.clamp(offset, offset + len) - offset;
            if below > 0 {
                self.write_added_data(array, offset, &buf[..below as usize], fua);
            }
            Ok(())
        })();
        self.gate.leave(epoch);
        done
    }

    /// The added members' superblocks with `events` (and the update's
    /// resync offset and time once it is known; dirty before), recovering
    /// up to the recorded position until they are recorded in sync.
    fn write_added(
        &self,
        events: u64,
        update: Option<&Update<'_>>,
        table: &[u16],
    ) -> Vec<(usize, std::io::Error)> {
        let mut failed = Vec::new();
        let (position, finished) = *self.record.lock().unwrap_or_else(|p| p.into_inner());
        for (k, (member, sb)) in self.added.iter().enumerate() {
            if self.failed[k].load(Ordering::Acquire) {
                continue;
            }
            let mut written = sb.lock().unwrap_or_else(|p| p.into_inner()).clone();
            written.raid_disks = self.new_members;
            if finished {
                written.feature_map &= !features::RECOVERY_OFFSET;
                written.recovery_offset = 0;
            } else {
                written.feature_map |= features::RECOVERY_OFFSET;
                written.recovery_offset = position / 512;
            }
            written.roles_raw = table.to_vec();
            self.role_table(&mut written.roles_raw);
            if let Err(e) = write_added_superblock(member, &mut written, events, update) {
                failed.push((k, e));
            }
        }
        failed
    }
}

impl LiveReshape for LiveMirror {
    fn stop(&self) {
        self.pacing.stop();
    }

    fn status(&self) -> LiveGrowStatus {
        let position = self.gate.position();
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let secs = progress.started.elapsed().as_secs_f64();
        let moved = position.saturating_sub(progress.start_position);
        let rate = if secs > 0.0 {
            (moved as f64 / secs) as u64
        } else {
            0
        };
        LiveGrowStatus {
            kind: "mirror",
            state: progress.state,
            raid_disks_before: self.old_members,
            raid_disks: self.new_members,
            position_bytes: position,
            end_bytes: self.end,
            bytes_per_sec: rate,
            eta_seconds: (rate > 0 && progress.state == "running")
                .then(|| (self.end - position.min(self.end)) / rate),
            error: progress.error.clone(),
            new_size_bytes: self.end,
        }
    }
}

impl LiveRoute for LiveMirror {
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
        let _busy = self.pacing.request();
        match op {
            OpKind::Read => array.read_at(buf, offset).map_err(errno),
            OpKind::Write => self.write(array, offset, buf, fua).map_err(errno),
            OpKind::Flush => {
                array.flush().map_err(errno)?;
                for (k, (member, _)) in self.added.iter().enumerate() {
                    if self.failed[k].load(Ordering::Acquire) {
                        continue;
                    }
                    if let Err(e) = member.flush() {
                        self.fail_added(array, k, &e);
                    }
                }
                Ok(())
            }
            // A discard may leave the old data (the Target's contract).
            OpKind::Discard => Ok(()),
        }
    }
}

impl Companion for LiveMirror {
    fn after_superblocks(&self, update: &Update<'_>) -> Result<()> {
        for (k, e) in self.write_added(update.events, Some(update), update.roles_raw) {
            // The old members hold every byte: the added one is let go
            // (recorded faulty by the next update) and the update stands.
            self.failed[k].store(true, Ordering::Release);
            eprintln!(
                "nvraid: {}: {e} while its superblock was written; the added mirror is marked faulty",
                self.added[k].0.spec()
            );
        }
        Ok(())
    }

    fn role_table(&self, table: &mut [u16]) {
        for (k, &(dev, entry)) in self.table_entries.iter().enumerate() {
            if let Some(slot) = table.get_mut(dev) {
                *slot = if self.failed[k].load(Ordering::Acquire) {
                    Role::Faulty.to_raw()
                } else {
                    entry
                };
            }
        }
    }
}

impl ReshapeRecord for LiveMirror {
    fn apply(&self, _role: usize, sb: &mut Superblock) {
        sb.raid_disks = self.new_members;
    }
}
