//! An assembled array: its members ([`Members`], the floor below) and what
//! it keeps beside them, chosen at assembly: the level family's
//! personality, md's write-intent bitmap, the PPL or md's journal. Here
//! they meet: a client write is let in ([`Array::admit_write`]: the dirty
//! mark, the resync barrier, the bitmap's bits, md's order, for both data
//! paths), and the array closes. The simple path's reads and writes are
//! in `ops` (each a `match` handing the work to the family); the fast path
//! is in `fanout`.
//!
//! Every method of [`Members`] is one of the array's too (`Array`
//! dereferences to its members).

use crate::error::{Error, Result};
use crate::intent::{BitmapInfo, WriteIntent};
use crate::members::Members;
use crate::parity::journal::MdJournal;
use crate::parity::ppl::Ppl;
use crate::personality::Personality;
use crate::slot::Slot;
use nvraid_layout::Geometry;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

/// An assembled array. All methods take `&self`; the array is `Sync`.
#[derive(Debug)]
pub struct Array {
    members: Members,
    /// md's write-intent bitmap, when the array has one (see `intent`).
    intent: Option<Arc<WriteIntent>>,
    /// What the level's family does (RAID 0/1/10: copies; RAID 4/5/6:
    /// parity), one per shape the array has had, the current one at
    /// `personality_at` (see [`Array::personality`]); entries are never
    /// dropped while the array lives.
    personalities: Vec<OnceLock<Personality>>,
    personality_at: AtomicUsize,
    /// RAID 5 with md's partial parity log (see `ppl`).
    pub(crate) ppl: Option<Ppl>,
    /// RAID 4/5/6 with md's write journal: its member (see `journal`).
    pub(crate) md_journal: Option<Arc<MdJournal>>,
    /// A reshape started while the array is served: once set, every
    /// fast-path request goes through it (see [`LiveRoute`]).
    live: Mutex<Option<Arc<dyn LiveRoute>>>,
    /// Whether `live` holds a route: what the hot path looks at first.
    live_set: AtomicBool,
    /// Held (read) by each request a route takes, and (write) by a shape
    /// swap (see [`Array::swap_shape`]), which so holds new routed
    /// requests and waits for those in flight.
    route_hold: RwLock<()>,
    /// Moves when the array's shape is swapped: fast-path queues re-read
    /// geometry, parity shape and size when it changes.
    shape_epoch: AtomicU64,
    /// Each open fast-path queue's count of requests in flight on its own
    /// member operations (see [`Array::start_live_route`]).
    queues: Mutex<Vec<Weak<AtomicU64>>>,
}

/// Client I/O of an array that reshapes while it is served: the requests
/// of every fast-path queue, split between the old shape and the new
/// (`reshape::live`). A request is done, member I/O and all, when
/// [`LiveRoute::io`] returns.
pub(crate) trait LiveRoute: Send + Sync + std::fmt::Debug {
    /// Do `op` on `[offset, offset + buf.len())` (`buf` the slot's
    /// buffer, only read for writes); an errno when it failed.
    fn io(
        &self,
        array: &Array,
        op: nvraid_io::queue::OpKind,
        offset: u64,
        buf: &mut [u8],
        fua: bool,
    ) -> std::result::Result<(), i32>;
}

/// The route of a shape swap with no reshape running: every request
/// through the array's simple path, which the swap holds. The served
/// takeovers and size changes (`LiveLevel`, `LiveSize`) send their
/// requests the same way once their gate lets them by.
#[derive(Debug)]
pub(crate) struct SimpleRoute;

impl LiveRoute for SimpleRoute {
    fn io(
        &self,
        array: &Array,
        op: nvraid_io::queue::OpKind,
        offset: u64,
        buf: &mut [u8],
        fua: bool,
    ) -> std::result::Result<(), i32> {
        use nvraid_io::queue::OpKind;
        let errno = |e: Error| match e {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        };
        match op {
            OpKind::Read => array.read_at(buf, offset).map_err(errno),
            OpKind::Write => array.write_at(buf, offset, fua).map_err(errno),
            OpKind::Flush => array.flush().map_err(errno),
            OpKind::Discard => array.discard(offset, buf.len() as u64).map_err(errno),
        }
    }
}

impl std::ops::Deref for Array {
    type Target = Members;

    fn deref(&self) -> &Members {
        &self.members
    }
}

/// What [`Array::admit_write`] did with a client write.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Nothing to hold (see [`Array::guards_writes`]): write.
    Unguarded,
    /// Counted against the barrier and the bitmap: write, then
    /// [`Array::end_write`].
    Held,
    /// Counted, but the write-intent bits could not be made durable: the
    /// write fails, and [`Array::end_write`] still releases it.
    HeldIntentFailed(Error),
    /// A resync holds the region: nothing counted; try again.
    Busy,
}

impl Array {
    pub(crate) fn new(geometry: Geometry, slots: Vec<Option<Slot>>, writable: bool) -> Array {
        let personality = Personality::of(&geometry);
        let records_lost_writes = personality.records_lost_writes();
        Array {
            members: Members::new(geometry, slots, writable, records_lost_writes),
            intent: None,
            personalities: std::iter::once(OnceLock::from(personality))
                .chain((1..crate::members::SHAPES_PER_RUN).map(|_| OnceLock::new()))
                .collect(),
            personality_at: AtomicUsize::new(0),
            ppl: None,
            md_journal: None,
            live: Mutex::new(None),
            live_set: AtomicBool::new(false),
            route_hold: RwLock::new(()),
            shape_epoch: AtomicU64::new(0),
            queues: Mutex::new(Vec::new()),
        }
    }

    /// The level family's personality of the current shape.
    #[inline]
    pub(crate) fn personality(&self) -> &Personality {
        self.personalities[self.personality_at.load(Ordering::Acquire)]
            .get()
            .expect("invariant: the current personality is installed before it is published")
    }

    /// The personality, at assembly (before any swap).
    pub(crate) fn personality_mut(&mut self) -> &mut Personality {
        let at = *self.personality_at.get_mut();
        self.personalities[at]
            .get_mut()
            .expect("invariant: the current personality is installed")
    }

    /// The reshape that takes the fast path's requests, while one runs.
    #[inline]
    pub(crate) fn live_route(&self) -> Option<Arc<dyn LiveRoute>> {
        if !self.live_set.load(Ordering::SeqCst) {
            return None;
        }
        self.live.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Hold a routed request against a shape swap: the route to take it,
    /// with the guard to keep while it runs, or `None` when no route is
    /// set any more (the swap ended it: the queue serves the new shape).
    pub(crate) fn enter_route(
        &self,
    ) -> Option<(std::sync::RwLockReadGuard<'_, ()>, Arc<dyn LiveRoute>)> {
        let guard = self.route_hold.read().unwrap_or_else(|p| p.into_inner());
        let route = self.live_route()?;
        Some((guard, route))
    }

    /// Whether a reshape runs on the served array (its route set; a
    /// reshape whose end was adopted, [`Array::swap_shape`], no longer).
    pub fn is_reshaping_live(&self) -> bool {
        self.live_set.load(Ordering::SeqCst)
    }

    /// Moves each time the shape is swapped (see [`Array::swap_shape`]).
    #[inline]
    pub fn shape_epoch(&self) -> u64 {
        self.shape_epoch.load(Ordering::SeqCst)
    }

    /// A fast-path queue opens: its count of requests in flight on its
    /// own member operations.
    pub(crate) fn register_queue(&self, count: &Arc<AtomicU64>) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.retain(|q| q.strong_count() > 0);
        queues.push(Arc::downgrade(count));
    }

    /// Send every fast-path request to `route` from now on, and return
    /// once no queue has a request of its own in flight (each queue
    /// publishes its count before it looks at the route, SeqCst, so a
    /// request either sees the route or is waited for here). `false`
    /// when a route was set already.
    pub(crate) fn start_live_route(&self, route: Arc<dyn LiveRoute>) -> bool {
        {
            let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            if live.is_some() {
                return false;
            }
            *live = Some(route);
            self.live_set.store(true, Ordering::SeqCst);
        }
        self.wait_queues_idle();
        true
    }

    /// Stop sending fast-path requests to `route` (a served reshape whose
    /// launch failed after its route was set, no step run): once the routed
    /// requests in flight are done, requests take the fast path again, in
    /// the same shape. `false` when `route` is not the one set.
    pub(crate) fn end_live_route(&self, route: &Arc<dyn LiveRoute>) -> bool {
        let _hold = self.route_hold.write().unwrap_or_else(|p| p.into_inner());
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if !live.as_ref().is_some_and(|set| Arc::ptr_eq(set, route)) {
            return false;
        }
        *live = None;
        self.live_set.store(false, Ordering::SeqCst);
        true
    }

    /// Swap the running array's shape for `new` (a served reshape's end,
    /// or a size change): `slots` and `table` as
    /// [`Members::adopt_shape`] takes them. Fast-path requests are held
    /// first: they all go through a route already (a served reshape's;
    /// else one through the simple path is set, which waits for every
    /// queue's own requests), and the route's hold is taken, which waits
    /// for the routed requests in flight and holds new ones. Then the
    /// bitmap, the members and the level family's personality take the new
    /// shape, the shape epoch moves (each queue makes itself again for the
    /// new shape at its next request) and the route is cleared: requests
    /// go to the fast path in the new shape at full speed. Last, every
    /// superblock is written again from the new templates (events + 1),
    /// the bitmap's header with the new size. Nothing may resync, rebuild
    /// or scrub meanwhile (a reshape refuses to start beside those).
    pub(crate) fn swap_shape(
        &self,
        new: Geometry,
        slots: Vec<Option<Slot>>,
        table: Vec<u16>,
    ) -> Result<()> {
        self.swap_shape_renumbered(new, slots, table, &[])
    }

    /// [`Array::swap_shape`] of a change that renumbers the roles
    /// (`renumber[old]` the new role of the old role's member, `None` for
    /// one that left): each member's I/O counters follow it to its new
    /// role while the requests are held.
    pub(crate) fn swap_shape_renumbered(
        &self,
        new: Geometry,
        slots: Vec<Option<Slot>>,
        table: Vec<u16>,
        renumber: &[Option<usize>],
    ) -> Result<()> {
        if !self.is_reshaping_live() {
            // Only the first route set wins; a reshape starting meanwhile
            // is refused by its own start.
            let _ = self.start_live_route(Arc::new(SimpleRoute));
        }
        {
            let _hold = self.route_hold.write().unwrap_or_else(|p| p.into_inner());
            if let Some(intent) = self.intent() {
                intent.adopt(&new)?;
            }
            let personality = Personality::of(&new);
            self.members.adopt_shape(new, slots, table)?;
            if !renumber.is_empty() {
                self.members.renumber_counters(renumber);
            }
            let at = self.personality_at.load(Ordering::Acquire) + 1;
            assert!(
                self.personalities[at].set(personality).is_ok(),
                "invariant: each shape's personality is installed once"
            );
            self.personality_at.store(at, Ordering::Release);
            // The epoch moves before the route goes: a queue that finds no
            // route finds the new epoch.
            self.shape_epoch.fetch_add(1, Ordering::SeqCst);
            *self.live.lock().unwrap_or_else(|p| p.into_inner()) = None;
            self.live_set.store(false, Ordering::SeqCst);
        }
        self.rewrite_superblocks()
    }

    /// Return once no fast-path queue has a request of its own in flight.
    fn wait_queues_idle(&self) {
        loop {
            let busy = {
                let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
                queues
                    .iter()
                    .filter_map(Weak::upgrade)
                    .any(|q| q.load(Ordering::SeqCst) != 0)
            };
            if !busy {
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The members, for what is built at assembly (set-aside members,
    /// companions).
    pub(crate) fn members_mut(&mut self) -> &mut Members {
        &mut self.members
    }

    pub(crate) fn intent(&self) -> Option<&WriteIntent> {
        self.intent.as_deref()
    }

    /// Give the array md's write-intent bitmap when its members have one
    /// (see [`WriteIntent::load`]); a writable array maintains it from now
    /// on, and every superblock update writes its header first.
    pub(crate) fn load_bitmap(&mut self) -> Result<()> {
        let Some(intent) = WriteIntent::load(&self.members)? else {
            return Ok(());
        };
        let intent = Arc::new(intent);
        self.members.add_companion(intent.clone());
        self.members.set_has_bitmap();
        self.intent = Some(intent.clone());
        if self.is_writable() {
            intent.publish(&self.members)?;
        }
        Ok(())
    }

    /// Give the array its md write journal. Its log is kept in whole 4 KiB
    /// pages, so the array takes writes in 4 KiB sectors from then on; its
    /// member's superblock takes every superblock update.
    pub(crate) fn attach_md_journal(&mut self, journal: MdJournal) {
        let journal = Arc::new(journal);
        self.members
            .raise_sector_bytes(nvraid_metadata::r5log::PAGE_BYTES as u32);
        self.members.add_companion(journal.clone());
        self.md_journal = Some(journal);
    }

    /// The write journal failed: record it so on every member (see
    /// [`MdJournal::record_failure`]).
    pub fn record_journal_failure(&self) -> Result<()> {
        match &self.md_journal {
            Some(journal) => journal.record_failure(&self.members),
            None => Ok(()),
        }
    }

    /// The array's write journal, when it has one.
    pub fn md_journal(&self) -> Option<&MdJournal> {
        self.md_journal.as_deref()
    }

    /// RAID 4/5/6: the stripe geometry (`None` for RAID 0/1/10).
    pub(crate) fn parity_shape(&self) -> Option<crate::parity::ParityShape> {
        self.personality().shape()
    }

    /// Whether client writes are let in through [`Array::admit_write`]: a
    /// redundant level (dirty mark, resync barrier), or any with a
    /// write-intent bitmap. A RAID 0 without one has no resync, rebuild or
    /// scrub to hold a region against its writes, and nothing to mark.
    pub(crate) fn guards_writes(&self) -> bool {
        self.has_redundancy() || self.intent.is_some()
    }

    /// Let a client write of `[offset, offset + len)` in, md's order, for
    /// both data paths: the array marked dirty on its members before its
    /// first write; the write counted against the resync barrier; the
    /// write-intent bits of its chunks durable before any data moves.
    /// While a resync holds its region, `block` waits for it; otherwise
    /// [`Admission::Busy`] says to try again (a queue that must reap its
    /// own writes meanwhile, which the resync waits for).
    pub(crate) fn admit_write(&self, offset: u64, len: u64, block: bool) -> Result<Admission> {
        if !self.guards_writes() {
            return Ok(Admission::Unguarded);
        }
        self.mark_dirty()?;
        if block {
            self.barrier().enter(offset, len);
        } else if self.barrier().try_enter(offset, len).is_err() {
            return Ok(Admission::Busy);
        }
        Ok(match self.intent_start(offset, len) {
            Ok(()) => Admission::Held,
            Err(e) => Admission::HeldIntentFailed(e),
        })
    }

    /// Run `write` (the simple path's member I/O for a client write of
    /// `[offset, offset + len)`) admitted ([`Array::admit_write`]), and
    /// release what the admission held after it.
    pub(crate) fn while_admitted<T>(
        &self,
        offset: u64,
        len: u64,
        write: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        match self.admit_write(offset, len, true)? {
            Admission::Unguarded => write(),
            Admission::Held => {
                let written = write();
                self.end_write(offset, len);
                written
            }
            Admission::HeldIntentFailed(e) => {
                self.end_write(offset, len);
                Err(e)
            }
            Admission::Busy => unreachable!("invariant: a blocking admission waits, never busy"),
        }
    }

    /// A write let in by [`Array::admit_write`] (and held) has completed.
    pub(crate) fn end_write(&self, offset: u64, len: u64) {
        self.intent_end(offset, len);
        self.barrier().leave(offset, len);
    }

    /// md's rule: before the first write to a redundant array, record on
    /// every member that it is dirty (see [`Members::mark_dirty`]). A
    /// journaled array logs every write with its parity before it reaches
    /// the members, so a crash needs a replay, not a resync: its
    /// superblocks stay clean.
    pub fn mark_dirty(&self) -> Result<()> {
        if self.md_journal.as_ref().is_some_and(|j| !j.unlogged()) {
            return Ok(());
        }
        self.members.mark_dirty(self.intent.is_none())
    }

    /// Orderly close: flush, close the journal, then mark a dirty array
    /// clean (see [`Members::close`]).
    pub fn close(self) -> Result<()> {
        if self.is_writable() {
            self.flush()?;
            if let Some(journal) = &self.md_journal {
                journal.close(&self.members)?;
            }
            self.record_journal_failure()?;
            // Every write is on every copy: the bitmap may go clean (md
            // clears it when the array stops).
            self.bitmap_pass(true, true)?;
        }
        self.members.close()
    }

    /// A client write to array bytes `[offset, offset + len)` is about to
    /// be issued: its bitmap bits made durable (see [`WriteIntent::start`]).
    pub(crate) fn intent_start(&self, offset: u64, len: u64) -> Result<()> {
        match self.intent() {
            Some(intent) => intent.start(&self.members, offset, len),
            None => Ok(()),
        }
    }

    /// The write counted by [`Array::intent_start`] has completed.
    pub(crate) fn intent_end(&self, offset: u64, len: u64) {
        if let Some(intent) = self.intent() {
            intent.end(offset, len);
        }
    }

    /// One clearing pass of the bitmap (see [`WriteIntent::pass`]).
    pub(crate) fn bitmap_pass(&self, now: bool, all: bool) -> Result<()> {
        match self.intent() {
            Some(intent) => intent.pass(&self.members, now, all),
            None => Ok(()),
        }
    }

    /// Run one clearing pass now (the one [`BitmapDaemon`] runs every
    /// `daemon_sleep` seconds): bits of chunks idle since the previous pass
    /// go, when the array is whole and in sync.
    pub fn clear_idle_bits(&self) -> Result<()> {
        self.bitmap_pass(true, false)
    }

    /// Write the bitmap (header and bits as they stand) to `member`, which
    /// is joining the array (not flushed).
    pub(crate) fn bitmap_copy_to(&self, member: &nvraid_member::Member) -> Result<()> {
        match self.intent() {
            Some(intent) => intent.copy_to(member),
            None => Ok(()),
        }
    }

    /// Whether a resync must visit array bytes `[offset, offset + len)`:
    /// always without a bitmap; with one, only where a bit is set.
    pub fn resync_wanted(&self, offset: u64, len: u64) -> bool {
        self.intent().is_none_or(|i| i.any_set(offset, len))
    }

    /// The bitmap's chunk, state and dirty count, when the array has one.
    pub fn bitmap_info(&self) -> Option<BitmapInfo> {
        self.intent().map(WriteIntent::info)
    }

    /// The bitmap's chunk in bytes, when the array has one: in the
    /// bitmap's space, a member's data area for RAID 4/5/6 (what a
    /// rebuild, walking a member, steps by), the array's otherwise.
    pub fn bitmap_chunk_bytes(&self) -> Option<u64> {
        self.intent().map(WriteIntent::chunk_bytes)
    }

    /// The array bytes a walk through the array (a resync) steps by to
    /// cover whole bitmap bits, when the array has a bitmap.
    pub fn bitmap_step_bytes(&self) -> Option<u64> {
        self.intent().map(WriteIntent::array_step_bytes)
    }
}

/// A thread that runs the bitmap's clearing passes of a shared array until
/// dropped.
pub struct BitmapDaemon {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BitmapDaemon {
    /// Start clearing passes for `array` (nothing runs for an array with no
    /// bitmap). Passes that fail are reported once on stderr; the bits then
    /// stay set, which costs only resync time.
    pub fn start(array: &Arc<Array>) -> BitmapDaemon {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = (array.intent().is_some() && array.is_writable()).then(|| {
            let weak = Arc::downgrade(array);
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("nvraid-bitmap".into())
                .spawn(move || {
                    let mut reported = false;
                    while !stop.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(100));
                        let Some(array) = weak.upgrade() else { return };
                        if let Err(e) = array.bitmap_pass(false, false) {
                            if !reported {
                                eprintln!("nvraid: clearing write-intent bits failed: {e}");
                                reported = true;
                            }
                        }
                    }
                })
                .expect("spawn the bitmap thread")
        });
        BitmapDaemon { stop, thread }
    }
}

impl Drop for BitmapDaemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
