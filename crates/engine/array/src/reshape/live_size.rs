//! `grow --socket CTL --size max|SIZE`: how much of each member a served
//! array uses, changed while clients read and write ([`LiveSize`]). The
//! superblocks and the bitmap change as the offline `grow --size` changes
//! them (`size`); nothing moves.
//!
//! - **The checks** (nothing written when one refuses): a served RAID 1,
//!   4, 5, 6 or 10, writable, whole (no member missing, failed, being
//!   recovered or listing bad blocks), in sync (not awaiting a resync),
//!   with no reshape running and no md partial parity log or write
//!   journal; the size asked for within what every member holds now (each
//!   member's size is read again from its file or device first: the
//!   devices grow under the running array), different from today's, and
//!   smaller only with `force`. A write-intent bitmap must hold the bits
//!   of the larger array in its chunk as it is: md's resize would double
//!   the chunk, which the running array's counters cannot follow, so that
//!   case is refused naming the offline command.
//! - **The switch.** The array's route is set (`Array::start_live_route`
//!   waits for every fast-path queue's own requests in flight; from then on
//!   each request runs through the route, on the simple path), then its
//!   gate closes (it waits for the routed requests running; new ones wait
//!   there). The gate is not closed while the route is set: a routed
//!   request runs on its worker's thread, and one held at the gate then
//!   would keep that queue's earlier requests unreaped, which the route's
//!   start waits for. A larger size: the new region is
//!   recorded as awaiting a resync from the old end (md's `resync_offset`,
//!   kept by `Members` from then on, so every later superblock update
//!   writes it until the resync passes it), and the bitmap's bits of the
//!   new region are set durably on every member. Then every superblock is
//!   written with the new `size` and `data_size` (events + 1; the bitmap's
//!   header first with the new size) — [`LiveSize`] is the array's
//!   reshape record until the swap, so any update carries them — the
//!   failpoint `size-superblocks` is passed and the gate opens (the
//!   requests waiting there run through the old shape, which the new one
//!   extends or cuts: the swap waits for them, as it holds the route).
//!   Then the served array takes the new shape (`Array::swap_shape`:
//!   queues made again, new NBD connections told the new size).
//! - **The new region's resync** runs on its own thread, as a dirty
//!   array's background resync does (`recovery::scrub_with` in repair
//!   mode, one region at a time held against client writes, the bitmap's
//!   marked chunks only, `resync_offset` checkpointed every second, the
//!   array recorded clean at the end), paced at `serve --reshape-speed`'s
//!   MAX. While it has not passed a stripe, writes there compute the
//!   parity from every data block (reconstruct-write: the stale parity
//!   the grown devices held is never trusted, `parity_trusted`), and a
//!   RAID 1/10 reads the first copy: so what a client wrote in the new
//!   region reads back even when a member fails before the resync passed
//!   it. Its progress goes where a dirty array's background resync
//!   reports its own (`LiveSizeOptions::progress`: the server's `status`
//!   shows it as `array.resync`, the monitor and the metrics as a resync).
//!   A member failing stops nothing: the resync goes on over what it
//!   can read (a stripe with a block lost is left as it is). A kill or a
//!   stop leaves `resync_offset` at the last checkpoint: the next `serve`
//!   (or md) resumes there.
//! - **A smaller size** (`force` only): the same switch without a resync;
//!   from the swap on, requests past the new end fail.

use super::live::LiveGrowStatus;
use super::live_copy::LiveReshape;
use super::size::SizeTarget;
use crate::array::{Array, LiveRoute};
use crate::error::{Error, Result};
use crate::intent::{bitmap_at, read_member_bitmap};
use crate::members::{Companion, ReshapeRecord};
use crate::recovery::online::ResyncState;
use crate::recovery::{scrub_with, Mode, Pace};
use nvraid_io::queue::OpKind;
use nvraid_layout::{Geometry, Level};
use nvraid_member::Member;
use nvraid_metadata::{bitmap, Superblock};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

/// How to resize a served array.
#[derive(Clone, Debug)]
pub struct LiveSizeOptions {
    pub target: SizeTarget,
    /// Shrink (cut the array's end off).
    pub force: bool,
    /// The new region's resync, bytes per second at most.
    pub max_bytes_per_sec: Option<u64>,
    /// Where the new region's resync reports its progress as a dirty
    /// array's background resync reports its own (the server's resync
    /// state, which `status`, the monitor and the metrics read).
    pub progress: Option<Arc<Mutex<ResyncState>>>,
}

/// What the switch did (the answer to the control socket).
#[derive(Clone, Debug, Serialize)]
pub struct SizeChanged {
    pub size_bytes_before: u64,
    pub size_bytes: u64,
    pub member_bytes_before: u64,
    pub member_bytes: u64,
    /// Where the new region's resync starts (array bytes); `None` for a
    /// shrink.
    pub resync_from_bytes: Option<u64>,
    pub events: u64,
}

/// A served array's size change: its record and route until the swap,
/// then the new region's resync.
#[derive(Debug)]
pub struct LiveSize {
    /// `size` and `data_size` (sectors) as every superblock records them
    /// from the switch on; `data_size` per role.
    size_sectors: u64,
    data_size_sectors: Vec<u64>,
    changed: SizeChanged,
    raid_disks: u32,
    /// The route's gate: held (read) by each routed request while it runs,
    /// and (write) while the superblocks change.
    gate: RwLock<()>,
    stop: AtomicBool,
    /// `running`, `finished` or `failed`, why it failed, and the resync's
    /// progress (array bytes reached, the rate).
    state: Mutex<SizeState>,
    /// `LiveSizeOptions::progress`.
    progress: Option<Arc<Mutex<ResyncState>>>,
}

#[derive(Debug)]
struct SizeState {
    state: &'static str,
    error: Option<String>,
    position: u64,
    bytes_per_sec: u64,
}

impl LiveSize {
    /// Change how much of each member the served `array` uses (see the
    /// module's text); returns once the served array has the new size,
    /// with the thread resyncing the new region (`None` for a shrink).
    pub fn start(
        array: &Arc<Array>,
        options: &LiveSizeOptions,
    ) -> Result<(Arc<LiveSize>, Option<JoinHandle<()>>)> {
        let old = array.geometry().clone();
        let spec0 = (0..array.roles())
            .find_map(|r| array.slot(r))
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        let refuse = |what: String| Error::Unsupported {
            spec: spec0.clone(),
            what,
        };
        super::live::refuse_second(array, &spec0, "size change")?;
        if !array.is_writable() {
            return Err(Error::ReadOnly);
        }
        if old.level() == Level::Raid0 {
            return Err(refuse(
                "changing a raid0's size with --size (md's raid0 cannot be resized; add members with --raid-devices instead)".into(),
            ));
        }
        if array.ppl.is_some() || array.md_journal.is_some() {
            return Err(refuse(
                "changing the size of an array with md's partial parity log or write journal (md refuses to resize those)".into(),
            ));
        }
        let unusable: Vec<usize> = (0..array.roles())
            .filter(|&r| !array.is_usable(r))
            .collect();
        if !unusable.is_empty() {
            return Err(Error::NotStartable(format!(
                "the array is degraded (role(s) {unusable:?} missing or failed): its new region could not be resynced; rebuild it first (md resizes only a whole array here, as `nvraid grow --size` does)"
            )));
        }
        super::live::check_settled(array)?;
        let slots: Vec<_> = (0..old.members() as usize)
            .map(|r| array.slot(r).expect("a whole array"))
            .collect();
        // What each member holds past its data offset, its size read again.
        let mut held = Vec::with_capacity(slots.len());
        for slot in &slots {
            let bytes = slot
                .member
                .refresh_size()
                .map_err(|e| Error::io(slot.member.spec(), e))?;
            held.push((bytes / 512).saturating_sub(slot.superblock.data_offset_sectors) * 512);
        }
        let (smallest, smallest_at) = held
            .iter()
            .enumerate()
            .map(|(i, &b)| (b, i))
            .min()
            .expect("an array has members");
        let new = super::size::new_geometry(
            &old,
            smallest,
            slots[smallest_at].member.spec(),
            options.target,
            options.force,
        )?;
        let (before, after) = (old.member_used_bytes(), new.member_used_bytes());
        let grown = after > before;
        if grown {
            check_bitmap(array, &old, &new, &slots)?;
        }
        let resync_from = grown.then(|| old.array_bytes());
        let live = Arc::new(LiveSize {
            size_sectors: after / 512,
            data_size_sectors: slots
                .iter()
                .zip(&held)
                .map(|(s, &h)| {
                    if grown {
                        s.superblock.data_size_sectors.max(h / 512)
                    } else {
                        s.superblock.data_size_sectors
                    }
                })
                .collect(),
            changed: SizeChanged {
                size_bytes_before: old.array_bytes(),
                size_bytes: new.array_bytes(),
                member_bytes_before: before,
                member_bytes: after,
                resync_from_bytes: resync_from,
                events: 0,
            },
            raid_disks: old.members(),
            gate: RwLock::new(()),
            stop: AtomicBool::new(false),
            state: Mutex::new(SizeState {
                state: "running",
                error: None,
                position: resync_from.unwrap_or(new.array_bytes()),
                bytes_per_sec: 0,
            }),
            progress: options.progress.clone(),
        });
        drop(slots);
        // Every fast-path request goes through the route from here on
        // (the queues' own requests drained). The gate is open meanwhile:
        // a routed request runs on its worker's thread, so one held there
        // would keep that queue's own earlier requests from being reaped,
        // which `start_live_route` waits for.
        if !array.start_live_route(live.clone()) {
            return Err(refuse(
                "a size change while another reshape runs on this served array".into(),
            ));
        }
        // Then the gate closes: it waits for the routed requests running
        // (the simple path's, which need no worker to finish) and holds
        // new ones while the superblocks change.
        let closed = live.gate.write().unwrap_or_else(|p| p.into_inner());
        let written = live.record(array, &old, &new);
        if written.is_ok() {
            crate::failpoint::hit("size-superblocks");
        }
        // It opens before the swap: a request waiting at it holds the
        // route's hold, which the swap takes (it waits for the routed
        // requests in flight). Meanwhile requests run through the old
        // shape, which the new one extends or cuts; a superblock update
        // records the new size (the record is set).
        drop(closed);
        let swapped = match written {
            Ok(()) => live.adopt(array, &new, true),
            Err(e) => {
                // The served array takes back its old shape (the next
                // superblock update records it).
                if let Some(intent) = array.intent() {
                    let _ = intent.adopt(&old);
                }
                let _ = live.adopt(array, &old, false);
                Err(e)
            }
        };
        if let Err(e) = swapped {
            live.fail(&e);
            return Err(e);
        }
        live.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .position = resync_from.unwrap_or(new.array_bytes());
        if !grown {
            live.state.lock().unwrap_or_else(|p| p.into_inner()).state = "finished";
            return Ok((live, None));
        }
        if let (Some(progress), Some(from)) = (&live.progress, resync_from) {
            // A resync of its own from here on: none done yet.
            *progress.lock().unwrap_or_else(|p| p.into_inner()) = ResyncState {
                total_bytes: new.array_bytes().saturating_sub(from),
                ..ResyncState::default()
            };
        }
        let thread = {
            let (array, live, rate) = (array.clone(), live.clone(), options.max_bytes_per_sec);
            std::thread::Builder::new()
                .name("nvraid-size-resync".into())
                .spawn(move || live.resync(&array, rate))
                .map_err(|e| Error::io("(the resync thread)", e))?
        };
        Ok((live, Some(thread)))
    }

    /// The superblocks and the bitmap changed for the new size (requests
    /// held at the gate meanwhile).
    fn record(self: &Arc<Self>, array: &Array, old: &Geometry, new: &Geometry) -> Result<()> {
        if !array.set_reshape_record(self.clone()) {
            return Err(Error::NotStartable(
                "a size change while another reshape runs on this served array".into(),
            ));
        }
        if let Some(from) = self.changed.resync_from_bytes {
            // The new region awaits its resync from the old end: every
            // superblock update records that from now on.
            array.await_resync_from(from);
            if let Some(intent) = array.intent() {
                if !intent.mark_space(array, old.bitmap_space_bytes(), new.bitmap_space_bytes())? {
                    return Err(Error::Unsupported {
                        spec: array.slot(0).map_or("(missing)", |s| s.member.spec()).into(),
                        what: "a served size change whose write-intent bitmap has no room for the new region's bits; stop serve and use `nvraid grow --size`".into(),
                    });
                }
            }
        }
        if let Some(intent) = array.intent() {
            // The header's size is the new one in the update below.
            intent.adopt(new)?;
        }
        array.rewrite_superblocks()
    }

    /// Swap the served array's shape for `shape`: each role's template its
    /// superblock with (`sized`) or without the new size.
    fn adopt(&self, array: &Array, shape: &Geometry, sized: bool) -> Result<()> {
        let table = array.role_table_now();
        let mut slots = Vec::with_capacity(shape.members() as usize);
        for role in 0..shape.members() as usize {
            match array.slot(role).filter(|_| array.is_usable(role)) {
                Some(slot) => {
                    let mut sb = slot.superblock.clone();
                    if sized {
                        self.apply(role, &mut sb);
                    }
                    slots.push(Some(crate::slot::Slot::shared(slot.member.clone(), sb)?));
                }
                None => slots.push(None),
            }
        }
        array.swap_shape(shape.clone(), slots, table)
    }

    /// The new region resynced beside the clients (see the module's text).
    fn resync(&self, array: &Array, max_rate: Option<u64>) {
        let started = Instant::now();
        let from = array.resync_from().unwrap_or(0);
        let pace = Pace {
            max_rate,
            stop: Some(&self.stop),
        };
        let outcome = scrub_with(array, Mode::Repair, &pace, &mut |p| {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.position = from + p.done_bytes;
            let secs = started.elapsed().as_secs_f64();
            if secs > 0.0 {
                s.bytes_per_sec = (p.done_bytes as f64 / secs) as u64;
            }
            if let Some(progress) = &self.progress {
                let mut r = progress.lock().unwrap_or_else(|e| e.into_inner());
                r.done_bytes = p.done_bytes;
                r.total_bytes = p.total_bytes;
                r.seconds = secs;
            }
        });
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut r = self
            .progress
            .as_ref()
            .map(|p| p.lock().unwrap_or_else(|e| e.into_inner()));
        match outcome {
            Ok(found) if found.resynced => {
                s.state = "finished";
                s.position = self.changed.size_bytes;
                if let Some(r) = r.as_mut() {
                    r.finished = true;
                    r.done_bytes = r.total_bytes;
                    r.resynced_bytes = found.bytes;
                    r.seconds = started.elapsed().as_secs_f64();
                }
            }
            // Stopped (the server is shutting down): the checkpoint stays.
            Ok(_) => {}
            Err(e) => {
                s.state = "failed";
                let why = format!(
                    "the new region's resync stopped: {e}; it resumes from its checkpoint when the array is served again"
                );
                if let Some(r) = r.as_mut() {
                    r.error = Some(why.clone());
                }
                s.error = Some(why);
            }
        }
    }

    fn fail(&self, e: &Error) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.state = "failed";
        s.error = Some(e.to_string());
    }

    /// What the switch did.
    pub fn changed(&self, array: &Array) -> SizeChanged {
        let mut changed = self.changed.clone();
        changed.events = array.events();
        changed
    }
}

/// A served array's write-intent bitmap must keep its chunk for the new
/// size (md's resize would double it when the bits do not fit the room it
/// allows, which the running array's counters cannot follow) and have
/// room in its image for the new region's bits.
fn check_bitmap(
    array: &Array,
    old: &Geometry,
    new: &Geometry,
    slots: &[&crate::slot::Slot],
) -> Result<()> {
    let Some(intent) = array.intent() else {
        return Ok(());
    };
    let slot = slots[0];
    let at = bitmap_at(&slot.superblock).expect("the array keeps a bitmap");
    let held = read_member_bitmap(&slot.member, &slot.superblock, at, old, 0)?;
    let resized = super::bitmap::resized(&held, old.bitmap_space_bytes(), new.bitmap_space_bytes());
    let offline = || {
        Error::Unsupported {
        spec: slot.member.spec().into(),
        what: format!(
            "a served size change whose write-intent bitmap md would resize to {}-byte chunks from {} (the running array keeps its bits as they are); stop serve and use `nvraid grow --size`",
            resized.header.chunk_bytes, held.header.chunk_bytes
        ),
    }
    };
    if resized.header.chunk_bytes != held.header.chunk_bytes {
        return Err(offline());
    }
    let bits = bitmap::bits_for(new.bitmap_space_bytes(), held.header.chunk_bytes);
    if bitmap::HEADER_BYTES as u64 + bits.div_ceil(8) > intent.storage_bytes() {
        return Err(offline());
    }
    let found: Vec<(&Member, &Superblock)> =
        slots.iter().map(|s| (&*s.member, &s.superblock)).collect();
    super::bitmap::check_fits(resized.at, resized.storage.len() as u64, &found)
}

impl LiveRoute for LiveSize {
    fn io(
        &self,
        array: &Array,
        op: OpKind,
        offset: u64,
        buf: &mut [u8],
        fua: bool,
    ) -> std::result::Result<(), i32> {
        // The array's own simple path, once the gate lets the request by.
        let _open = self.gate.read().unwrap_or_else(|p| p.into_inner());
        crate::array::SimpleRoute.io(array, op, offset, buf, fua)
    }
}

impl Companion for LiveSize {}

impl ReshapeRecord for LiveSize {
    fn apply(&self, role: usize, sb: &mut Superblock) {
        sb.size_sectors = self.size_sectors;
        if let Some(&data) = self.data_size_sectors.get(role) {
            sb.data_size_sectors = data;
        }
    }
}

impl LiveReshape for LiveSize {
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    fn status(&self) -> LiveGrowStatus {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let left = self.changed.size_bytes.saturating_sub(s.position);
        LiveGrowStatus {
            kind: "size",
            state: s.state,
            raid_disks_before: self.raid_disks,
            raid_disks: self.raid_disks,
            position_bytes: s.position,
            end_bytes: self.changed.size_bytes,
            bytes_per_sec: s.bytes_per_sec,
            eta_seconds: (s.bytes_per_sec > 0).then(|| left / s.bytes_per_sec),
            error: s.error.clone(),
            new_size_bytes: self.changed.size_bytes,
        }
    }
}
