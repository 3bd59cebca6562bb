//! The members of an assembled array and their state: which member holds
//! each role, which failed and why, how far a recovering one is in sync,
//! the events counter and the superblock updates that move it, the clean
//! and dirty marks, the resync barrier. This is the floor the write-intent
//! bitmap (`intent`), the PPL, md's journal and the level families stand
//! on: they take [`Members`] to reach a member, fail it or record state on
//! it, and nothing here knows them. What they keep beside the superblocks
//! (the bitmap's header, the journal member's superblock) is written in
//! every superblock update through the [`Companion`] each registered.

use crate::barrier::{Barrier, Quiet};
use crate::decision::SetAside;
use crate::error::{Error, Result};
use crate::slot::{
    apply_bad_blocks, is_member_failure, write_superblock, CounterShard, MemberCounters, Slot,
};
use nvraid_layout::Geometry;
use nvraid_metadata::{bitmap, features, Role, Superblock, Timestamp, RESYNC_CLEAN};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A barrier region held (see [`Members::hold_region`]); released on drop,
/// also on an error part-way.
pub(crate) struct RegionHold<'a> {
    members: &'a Members,
    _turn: std::sync::MutexGuard<'a, ()>,
}

impl Drop for RegionHold<'_> {
    fn drop(&mut self) {
        self.members.barrier.lower();
    }
}

/// A member given at assembly that takes no part in the array.
#[derive(Clone, Debug)]
pub struct SetAsideMember {
    pub spec: String,
    /// `None` when it could not be read.
    pub superblock: Option<Superblock>,
    pub reason: SetAside,
}

/// What a superblock update writes to every member (see
/// [`Companion::after_superblocks`]).
pub(crate) struct Update<'a> {
    pub(crate) events: u64,
    pub(crate) resync_offset: u64,
    pub(crate) utime: Timestamp,
    pub(crate) roles_raw: &'a [u16],
}

/// Metadata kept beside the superblocks that every superblock update
/// writes too, in md's order: md's bitmap header before the superblocks
/// (a bitmap older than its superblock is not trusted), md's journal
/// member's superblock after them.
pub(crate) trait Companion: Send + Sync + std::fmt::Debug {
    /// Before the members' superblocks record `events`: write what must
    /// be durable first; the members whose write or flush failed.
    fn before_superblocks(&self, _members: &Members, _events: u64) -> Vec<(usize, std::io::Error)> {
        Vec::new()
    }

    /// After the members' superblocks were written (before they are
    /// flushed): write the companion's own device, durably. An error fails
    /// the update (md fails the array's writes with its journal).
    fn after_superblocks(&self, _update: &Update<'_>) -> Result<()> {
        Ok(())
    }

    /// The role table is about to be written: record the companion's own
    /// entry in it (a journal that failed is recorded faulty).
    fn role_table(&self, _table: &mut [u16]) {}

    /// `after_superblocks` failed on a device the companion went on
    /// without (a member a served grow added, now recorded faulty in its
    /// role-table entry): write the update again. Asked once per failure.
    fn write_again(&self) -> bool {
        false
    }
}

/// A reshape running on the array while it is served (`reshape::live`):
/// every superblock update records it, so that no update of the running
/// array (dirty mark, a member failing, a clean close) writes a member's
/// superblock without the reshape's record, and the members the reshape
/// added (which hold no role of this array's old shape) are written too.
pub(crate) trait ReshapeRecord: Companion {
    /// Put the reshape's record, as it stands now, into the superblock of
    /// the member in `role` (one of the array's own roles).
    fn apply(&self, role: usize, sb: &mut Superblock);

    /// The role the member in `role` holds in the table the record writes:
    /// its own, but where a level change renumbers the roles (RAID 0 <->
    /// RAID 10 near=2, `reshape::live_level`).
    fn role_written(&self, role: usize) -> usize {
        role
    }
}

/// The members of an array and their state. All methods take `&self`;
/// it is `Sync`.
#[derive(Debug)]
pub struct Members {
    /// Every shape the array has had while it runs, the current one at
    /// `shape_at`: a served reshape's end installs the new one
    /// ([`Members::adopt_shape`]). Entries are never replaced or dropped,
    /// so `&Geometry` borrows stay valid without locks.
    shapes: Vec<OnceLock<Geometry>>,
    /// Index of the current shape in `shapes`.
    shape_at: AtomicUsize,
    /// Every member the array has held, in the order they joined: the
    /// assembled ones at their role's index, members added while it runs
    /// after them. Entries are never replaced or dropped while the array
    /// lives (a queue may still hold a retired member's file descriptor),
    /// so `&Slot` borrows stay valid without locks.
    arena: Vec<OnceLock<Slot>>,
    /// Arena entries taken.
    arena_used: AtomicUsize,
    /// Per role, the arena index of its member (`NO_SLOT`: missing). This
    /// and the other per-role tables have room for [`ONLINE_JOINS`] roles
    /// more than the array was assembled with (a served grow adds roles);
    /// the roles in use are the current shape's.
    current: Vec<AtomicUsize>,
    /// Moves whenever a role gets another member: queues that cache the
    /// members (file tables, data offsets) refresh when it changes.
    generation: AtomicU64,
    sector_bytes: u32,
    writable: bool,
    /// The array was dirty when assembled (unclean shutdown) and has not
    /// been resynced since: it stays dirty on close, and its reads take the
    /// first readable copy, never a balanced choice (its copies may differ,
    /// and md reads the first in-sync copy until resync has passed, so one
    /// block never gives two answers).
    unsynced: AtomicBool,
    /// Where the last resync stopped, in array bytes (md's resync_offset,
    /// which counts member rows for RAID 4/5/6); moves as a resync
    /// checkpoints.
    resync_at: AtomicU64,
    /// Some member has a read limit (recovery, bad blocks).
    read_limited: AtomicBool,
    /// This process has recorded the array dirty on the members.
    dirty: AtomicBool,
    /// The events counter on the members; its lock serialises superblock
    /// updates.
    events: Mutex<u64>,
    /// Members given at assembly but left out, with the reason.
    set_aside: Vec<SetAsideMember>,
    /// Per role, how many bytes of the member's data area are in sync:
    /// `u64::MAX` for all of it, less for a member being recovered (it moves
    /// up as a rebuild goes, and is written to the member's superblock as
    /// md's `recovery_offset`).
    in_sync: Vec<AtomicU64>,
    /// Per role: its recovery copies only the chunks the write-intent
    /// bitmap marks (md's re-add, RECOVERY_BITMAP).
    by_bitmap: Vec<AtomicBool>,
    /// The role table as this process last wrote it (the reference
    /// superblock's at assembly, plus members added since); roles with no
    /// usable member are marked faulty when it is written.
    table: Mutex<Vec<u16>>,
    /// Roles whose member failed while the array ran (an I/O error): no
    /// longer read, written or flushed, and recorded faulty in the others'
    /// superblocks.
    faulty: Vec<AtomicBool>,
    /// Per role: why its member was marked faulty while the array ran.
    faulty_reason: Vec<Mutex<Option<String>>>,
    /// Roles whose member left the running array by a level change (see
    /// [`Members::leave_role`]): out of use as a faulty one, but no
    /// failure: the array is not degraded by it.
    left: Vec<AtomicBool>,
    /// Per-role I/O counts of the fast path.
    counters: Vec<MemberCounters>,
    /// The open fast-path queues' counts (see [`CounterShard`]); folded
    /// into `counters` when their queue closes.
    shards: Mutex<Vec<Arc<CounterShard>>>,
    /// Client writes against a resync or rebuild running beside them.
    barrier: Barrier,
    /// Whose turn it is to hold a barrier region.
    barrier_turn: Mutex<()>,
    /// Written with every superblock update (see [`Companion`]).
    companions: Vec<Arc<dyn Companion>>,
    /// A reshape running on the array (one at a time; cleared when its
    /// end is adopted, [`Members::adopt_shape`]).
    reshape: Mutex<Option<Arc<dyn ReshapeRecord>>>,
    /// The array keeps md's write-intent bitmap (a re-added member may
    /// recover by it).
    has_bitmap: bool,
    /// The most bytes the array serves (`u64::MAX`: its geometry's size):
    /// a shrink going on while served (`reshape::resume`) serves the new,
    /// smaller size from its start.
    size_cap: AtomicU64,
    /// A write that fails on a member the array cannot lose is recorded
    /// as bad blocks (the parity family; see `Personality`).
    records_lost_writes: bool,
}

/// `current` entry of a role with no member.
const NO_SLOT: usize = usize::MAX;
/// Members that may join an array while it runs (online add, replace, a
/// spare taking over), beyond those assembled; then it must be restarted.
pub const ONLINE_JOINS: usize = 64;
/// Shapes a running array may take, the assembled one included (each
/// served reshape's end is one; see [`Members::adopt_shape`]).
pub const SHAPES_PER_RUN: usize = 64;

/// What stopped one pass of a superblock update.
enum Failed {
    /// A member's write or flush (it may be failed and the update retried).
    Member(usize, std::io::Error),
    /// A companion's own device: the update fails.
    Companion(Error),
}

impl Members {
    pub(crate) fn new(
        geometry: Geometry,
        slots: Vec<Option<Slot>>,
        writable: bool,
        records_lost_writes: bool,
    ) -> Members {
        assert_eq!(
            slots.len(),
            geometry.members() as usize,
            "invariant: an array is assembled with one slot per role"
        );
        let present = || slots.iter().flatten();
        let sector_bytes = present()
            .map(|s| s.member.logical_block_bytes())
            .max()
            .unwrap_or(512)
            .max(512);
        let assembled_dirty = present().any(|s| !s.superblock.is_clean());
        let events = present().map(|s| s.superblock.events).max().unwrap_or(0);
        // md counts it in the bitmap's space (member sectors for RAID
        // 4/5/6): kept here as the array byte of that stripe.
        let resync_from = present()
            .map(|s| s.superblock.resync_offset)
            .min()
            .filter(|&sectors| sectors != RESYNC_CLEAN)
            .map_or(u64::MAX, |sectors| {
                geometry.array_offset_of_sync(sectors.saturating_mul(512))
            });
        let read_limited = present().any(|s| !s.read_limit.is_none());
        let table = present()
            .next()
            .map(|s| s.superblock.roles_raw.clone())
            .unwrap_or_default();
        let assembled_roles = slots.len();
        // Room for roles a served grow adds (see `current`).
        let roles = assembled_roles + ONLINE_JOINS;
        let in_sync = slots
            .iter()
            .map(|s| {
                let bytes = s.as_ref().and_then(|s| s.read_limit.in_sync_bytes);
                AtomicU64::new(bytes.unwrap_or(u64::MAX))
            })
            .chain((assembled_roles..roles).map(|_| AtomicU64::new(u64::MAX)))
            .collect();
        let by_bitmap = slots
            .iter()
            .map(|s| {
                let bits = s.as_ref().map_or(0, |s| s.superblock.feature_map);
                AtomicBool::new(bits & features::RECOVERY_BITMAP != 0)
            })
            .chain((assembled_roles..roles).map(|_| AtomicBool::new(false)))
            .collect();
        let current = slots
            .iter()
            .enumerate()
            .map(|(role, s)| AtomicUsize::new(if s.is_some() { role } else { NO_SLOT }))
            .chain((assembled_roles..roles).map(|_| AtomicUsize::new(NO_SLOT)))
            .collect();
        Members {
            companions: Vec::new(),
            reshape: Mutex::new(None),
            has_bitmap: false,
            size_cap: AtomicU64::new(u64::MAX),
            records_lost_writes,
            arena: Self::arena_of(slots),
            arena_used: AtomicUsize::new(assembled_roles),
            current,
            generation: AtomicU64::new(0),
            table: Mutex::new(table),
            sector_bytes,
            writable,
            unsynced: AtomicBool::new(assembled_dirty && geometry.level().is_redundant()),
            resync_at: AtomicU64::new(resync_from),
            read_limited: AtomicBool::new(read_limited),
            dirty: AtomicBool::new(false),
            events: Mutex::new(events),
            set_aside: Vec::new(),
            faulty_reason: (0..roles).map(|_| Mutex::new(None)).collect(),
            faulty: (0..roles).map(|_| AtomicBool::new(false)).collect(),
            left: (0..roles).map(|_| AtomicBool::new(false)).collect(),
            in_sync,
            by_bitmap,
            counters: (0..roles).map(|_| MemberCounters::default()).collect(),
            shards: Mutex::new(Vec::new()),
            barrier: Barrier::new(),
            barrier_turn: Mutex::new(()),
            shapes: std::iter::once(OnceLock::from(geometry))
                .chain((1..SHAPES_PER_RUN).map(|_| OnceLock::new()))
                .collect(),
            shape_at: AtomicUsize::new(0),
        }
    }

    /// The arena of slots: the assembled ones at their roles' indices,
    /// then room for [`ONLINE_JOINS`] more.
    fn arena_of(slots: Vec<Option<Slot>>) -> Vec<OnceLock<Slot>> {
        slots
            .into_iter()
            .map(|s| {
                let cell = OnceLock::new();
                if let Some(s) = s {
                    let _ = cell.set(s);
                }
                cell
            })
            .chain((0..ONLINE_JOINS).map(|_| OnceLock::new()))
            .collect()
    }

    /// Per-role I/O counts (index = role), as they stand now: a snapshot
    /// summing those of closed queues and the simple path with every open
    /// queue's.
    pub fn member_counters(&self) -> Vec<MemberCounters> {
        let shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        (0..self.roles())
            .map(|role| {
                let base = &self.counters[role];
                let (mut ops, mut bytes, mut errors) = (
                    base.ops.load(Ordering::Relaxed),
                    base.bytes.load(Ordering::Relaxed),
                    base.errors.load(Ordering::Relaxed),
                );
                // Wrapping: a role renumbered carries a base that may be
                // below its shards' counts (`renumber_counters`).
                for shard in shards.iter() {
                    let (o, b, e) = shard.get(role);
                    (ops, bytes, errors) = (
                        ops.wrapping_add(o),
                        bytes.wrapping_add(b),
                        errors.wrapping_add(e),
                    );
                }
                MemberCounters {
                    ops: ops.into(),
                    bytes: bytes.into(),
                    errors: errors.into(),
                }
            })
            .collect()
    }

    /// The roles were renumbered (a served RAID 0 <-> 10): `renumber[old]`
    /// is the role the old role's member holds now (`None`: it left).
    /// Each member's counts go with it to its new role, and a role no
    /// member moved to starts from 0. Called while no request runs (the
    /// shape swap's hold): the queues' shards keep counting by role
    /// index, so each role's base is set to what makes its sum right (a
    /// wrapping difference where a shard already holds more).
    pub(crate) fn renumber_counters(&self, renumber: &[Option<usize>]) {
        let shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        let sum = |role: usize| {
            let base = &self.counters[role];
            let mut total = (
                base.ops.load(Ordering::Relaxed),
                base.bytes.load(Ordering::Relaxed),
                base.errors.load(Ordering::Relaxed),
            );
            for shard in shards.iter() {
                let (o, b, e) = shard.get(role);
                total = (
                    total.0.wrapping_add(o),
                    total.1.wrapping_add(b),
                    total.2.wrapping_add(e),
                );
            }
            total
        };
        let totals: Vec<(u64, u64, u64)> = (0..self.counters.len()).map(sum).collect();
        let mut wanted = vec![(0u64, 0u64, 0u64); self.counters.len()];
        for (old, new) in renumber.iter().enumerate() {
            if let Some(new) = *new {
                if new < wanted.len() && old < totals.len() {
                    wanted[new] = totals[old];
                }
            }
        }
        for (role, base) in self.counters.iter().enumerate() {
            // What the shards hold of `role` now stays theirs.
            let in_shards = (
                totals[role]
                    .0
                    .wrapping_sub(base.ops.load(Ordering::Relaxed)),
                totals[role]
                    .1
                    .wrapping_sub(base.bytes.load(Ordering::Relaxed)),
                totals[role]
                    .2
                    .wrapping_sub(base.errors.load(Ordering::Relaxed)),
            );
            base.ops
                .store(wanted[role].0.wrapping_sub(in_shards.0), Ordering::Relaxed);
            base.bytes
                .store(wanted[role].1.wrapping_sub(in_shards.1), Ordering::Relaxed);
            base.errors
                .store(wanted[role].2.wrapping_sub(in_shards.2), Ordering::Relaxed);
        }
    }

    /// A counter shard for a new fast-path queue, counted from now on.
    pub(crate) fn counter_shard(&self) -> Arc<CounterShard> {
        let shard = Arc::new(CounterShard::new(self.counters.len()));
        self.shards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(shard.clone());
        shard
    }

    /// A queue closed: its counts join the array's own, and its shard goes.
    pub(crate) fn retire_shard(&self, shard: &Arc<CounterShard>) {
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        let Some(at) = shards.iter().position(|s| Arc::ptr_eq(s, shard)) else {
            return;
        };
        shards.swap_remove(at);
        for (role, base) in self.counters.iter().enumerate() {
            let (ops, bytes, errors) = shard.get(role);
            base.add(ops, bytes, errors);
        }
    }

    pub(crate) fn set_aside_members(&mut self, set_aside: Vec<SetAsideMember>) {
        self.set_aside = set_aside;
    }

    /// Members given at assembly but left out (stale, faulty, spare...).
    pub fn set_aside(&self) -> &[SetAsideMember] {
        &self.set_aside
    }

    /// The members set aside at assembly that are not in a role now (one
    /// re-added or rebuilt into its role since is no longer set aside):
    /// what a report of the array shows.
    pub fn set_aside_now(&self) -> impl Iterator<Item = &SetAsideMember> {
        self.set_aside.iter().filter(move |m| {
            let Some(sb) = m.superblock.as_ref() else {
                return true;
            };
            !self
                .slots()
                .iter()
                .flatten()
                .any(|s| s.superblock.device_uuid == sb.device_uuid)
        })
    }

    /// Write `companion` with every superblock update from now on (at
    /// assembly, before the array runs).
    pub(crate) fn add_companion(&mut self, companion: Arc<dyn Companion>) {
        self.companions.push(companion);
    }

    /// The array keeps md's write-intent bitmap from now on (at assembly).
    /// From now on every superblock update records `record`'s reshape
    /// (see [`ReshapeRecord`]); false when one was set already.
    pub(crate) fn set_reshape_record(&self, record: Arc<dyn ReshapeRecord>) -> bool {
        let mut held = self.reshape.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_some() {
            return false;
        }
        *held = Some(record);
        true
    }

    /// Drop `record` (a served reshape that failed to start); `false` if
    /// the array holds another or none.
    pub(crate) fn clear_reshape_record(&self, record: &Arc<dyn ReshapeRecord>) -> bool {
        let mut held = self.reshape.lock().unwrap_or_else(|p| p.into_inner());
        if !held.as_ref().is_some_and(|h| Arc::ptr_eq(h, record)) {
            return false;
        }
        *held = None;
        true
    }

    /// Whether a reshape runs on the array (recorded, its end not adopted
    /// yet).
    pub(crate) fn is_reshaping(&self) -> bool {
        self.reshape_record().is_some()
    }

    /// The running reshape's record, if any.
    fn reshape_record(&self) -> Option<Arc<dyn ReshapeRecord>> {
        self.reshape
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The companions, the running reshape's record last.
    fn all_companions(&self) -> Vec<Arc<dyn Companion>> {
        let mut all = self.companions.clone();
        if let Some(record) = self.reshape_record() {
            all.push(record as Arc<dyn Companion>);
        }
        all
    }

    pub(crate) fn set_has_bitmap(&mut self) {
        self.has_bitmap = true;
    }

    /// Offsets and lengths must be multiples of `bytes` from now on (md's
    /// journal logs whole 4 KiB pages), at assembly.
    pub(crate) fn raise_sector_bytes(&mut self, bytes: u32) {
        self.sector_bytes = self.sector_bytes.max(bytes);
    }

    /// The resync barrier client writes pass (see `Array::admit_write`).
    pub(crate) fn barrier(&self) -> &Barrier {
        &self.barrier
    }

    /// Hold region `region` (array bytes `region * BARRIER_REGION_BYTES`
    /// onwards) against client writes until the returned guard drops: no
    /// client write to it is in flight or starts meanwhile. One holder at a
    /// time (a resync and a rebuild running together take turns).
    pub(crate) fn hold_region(&self, region: u64) -> RegionHold<'_> {
        self.hold_regions(region, region, None).0
    }

    /// Hold every region that array bytes `[offset, offset + len)` touch,
    /// as [`Members::hold_region`] holds one. Given `since` (from
    /// [`Members::quiet_bytes`] before reading ahead of the hold), also
    /// whether no client write (nor another holder) reached those regions
    /// in between, so that what was read stands.
    pub(crate) fn hold_bytes_after(
        &self,
        offset: u64,
        len: u64,
        since: Option<&Quiet>,
    ) -> (RegionHold<'_>, bool) {
        let (first, last) = Self::regions_of(offset, len);
        self.hold_regions(first, last, since)
    }

    /// The moment a read ahead of array bytes `[offset, offset + len)`
    /// starts from, if no client write is in flight in their regions (see
    /// [`Members::hold_bytes_after`]).
    pub(crate) fn quiet_bytes(&self, offset: u64, len: u64) -> Option<Quiet> {
        let (first, last) = Self::regions_of(offset, len);
        self.barrier.quiet(first, last)
    }

    /// The barrier regions array bytes `[offset, offset + len)` touch.
    fn regions_of(offset: u64, len: u64) -> (u64, u64) {
        let region = crate::barrier::BARRIER_REGION_BYTES;
        (offset / region, (offset + len.max(1) - 1) / region)
    }

    fn hold_regions(&self, first: u64, last: u64, since: Option<&Quiet>) -> (RegionHold<'_>, bool) {
        let turn = self.barrier_turn.lock().unwrap_or_else(|p| p.into_inner());
        let quiet = self.barrier.raise(first, last, since);
        let hold = RegionHold {
            members: self,
            _turn: turn,
        };
        (hold, quiet)
    }

    /// Whether some member may not be read everywhere (see [`ReadLimit`]).
    pub fn read_limited(&self) -> bool {
        self.read_limited.load(Ordering::Acquire)
    }

    /// Whether a working member is being recovered (in sync only part
    /// way) or has bad blocks, as the roles stand now. Unlike
    /// [`Members::read_limited`], the readers' quick mark, which once set
    /// stays set for the run, this is false again once a rebuild has
    /// ended: what a served reshape waits for.
    pub fn recovering_or_bad(&self) -> bool {
        (0..self.in_sync.len()).any(|role| match self.slot(role) {
            Some(slot) if !self.is_faulty(role) => {
                self.in_sync[role].load(Ordering::Acquire) != u64::MAX
                    || !slot.read_limit.bad_ranges().is_empty()
            }
            _ => false,
        })
    }

    /// Whether reads must take the first readable copy (see the field).
    pub fn first_copy_reads(&self) -> bool {
        self.unsynced.load(Ordering::Relaxed)
    }

    /// An array whose copies may differ (assembled dirty, not resynced
    /// since): where its resync starts, in array bytes.
    pub fn resync_from(&self) -> Option<u64> {
        self.unsynced.load(Ordering::Acquire).then_some(
            self.resync_at
                .load(Ordering::Acquire)
                .min(self.size_bytes()),
        )
    }

    /// A served array grown by `grow --size`: from array byte `from` on it
    /// awaits a resync (md's `resync_offset` at the old end), recorded by
    /// every superblock update until the resync passes it; meanwhile parity
    /// there is not trusted and a RAID 1/10 reads its first copy.
    pub(crate) fn await_resync_from(&self, from: u64) {
        self.resync_at.store(from, Ordering::Release);
        self.unsynced.store(true, Ordering::Release);
    }

    /// Record how far a resync got (`Some(bytes)`, md's resync_offset) or
    /// that it finished (`None`: the array is clean unless this process
    /// wrote to it, and reads balance again). Events + 1 on every member.
    pub(crate) fn resync_checkpoint(&self, done: Option<u64>) -> Result<()> {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        match done {
            Some(bytes) => {
                self.resync_at.store(bytes, Ordering::Release);
                self.update_superblocks(&mut events, self.resync_offset_now())
            }
            None => {
                self.unsynced.store(false, Ordering::Release);
                self.update_superblocks(&mut events, self.resync_offset_now())
            }
        }
    }

    /// Write every superblock again as things stand now, events + 1, its
    /// companions' included (md's journal records its new tail so:
    /// `r5l_write_super` updates them all the same way).
    pub(crate) fn rewrite_superblocks(&self) -> Result<()> {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        self.update_superblocks(&mut events, self.resync_offset_now())
    }

    /// The `resync_offset` the superblocks should record now (md's rule):
    /// 0 while this process has written (a crash now could tear a write
    /// anywhere, so all of it would need a resync); the resync checkpoint
    /// while the array awaits the rest of a resync; clean otherwise.
    fn resync_offset_now(&self) -> u64 {
        if self.dirty.load(Ordering::Acquire) {
            0
        } else if self.unsynced.load(Ordering::Acquire) {
            self.resync_position()
        } else {
            RESYNC_CLEAN
        }
    }

    /// Where the resync got to, as md's `resync_offset` counts it
    /// (sectors of the bitmap's space: member rows for RAID 4/5/6).
    fn resync_position(&self) -> u64 {
        let at = self
            .resync_at
            .load(Ordering::Acquire)
            .min(self.size_bytes());
        self.geometry().sync_position_of(at) / 512
    }

    /// Whether `role`'s member may be read at `[offset, offset + len)` of
    /// its data area (present, and not limited there).
    pub fn readable(&self, role: usize, offset: u64, len: u64) -> bool {
        match self.slot(role) {
            None => false,
            Some(_) if self.is_faulty(role) => false,
            Some(_) if !self.read_limited.load(Ordering::Acquire) => true,
            Some(slot) => {
                offset + len <= self.in_sync[role].load(Ordering::Acquire)
                    && slot.read_limit.no_bad_block_in(offset, len)
            }
        }
    }

    /// A member being recovered: how many bytes of its data area are in
    /// sync (`None` when all of it is).
    pub fn in_sync_bytes(&self, role: usize) -> Option<u64> {
        let bytes = self.in_sync[role].load(Ordering::Acquire);
        (bytes != u64::MAX).then_some(bytes)
    }

    /// Whether `role`'s recovery copies only the chunks the bitmap marks
    /// (a re-added member), rather than everything.
    pub fn recovers_by_bitmap(&self, role: usize) -> bool {
        self.by_bitmap[role].load(Ordering::Acquire) && self.has_bitmap
    }

    /// Record that `role`'s member is in sync below `bytes` (`None`: all of
    /// it), in memory and in that member's superblock (md's checkpoint of a
    /// recovery; the events counter does not move).
    pub(crate) fn checkpoint_recovery(&self, role: usize, bytes: Option<u64>) -> Result<()> {
        let _events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.in_sync[role].load(Ordering::Acquire);
        let after = bytes.unwrap_or(u64::MAX);
        // Paired with the reads it unlocks: a recovery only moves forward.
        assert!(
            after >= before,
            "recovery offset moved back ({before} -> {after})"
        );
        self.in_sync[role].store(after, Ordering::Release);
        self.write_own_superblock(role, *_events)
    }

    /// Write `role`'s superblock alone as it stands now (its recovery point
    /// and bad blocks), at `events` (unchanged: md's checkpoints do not
    /// move the counter), durably. The caller holds the events lock.
    fn write_own_superblock(&self, role: usize, events: u64) -> Result<()> {
        let slot = self
            .slot(role)
            .expect("a member whose superblock is written is present");
        let mut sb = slot.superblock.clone();
        sb.events = events;
        sb.roles_raw = self.role_table();
        self.apply_recovery(role, &mut sb);
        apply_bad_blocks(slot, &mut sb);
        sb.resync_offset = self.resync_offset_now();
        write_superblock(&slot.member, &sb)?;
        slot.member
            .flush()
            .map_err(|e| Error::io(slot.member.spec(), e))
    }

    /// The role table as it would be written now.
    pub(crate) fn role_table_now(&self) -> Vec<u16> {
        self.role_table()
    }

    /// Put a new member into the array: `slot` into `role` (a member to be
    /// rebuilt), or only a table entry (a spare); record `entry` for device
    /// slot `dev_number` in every present member's superblock (events + 1).
    pub(crate) fn install(
        &self,
        role: Option<usize>,
        slot: Option<Slot>,
        dev_number: u32,
        entry: u16,
    ) -> Result<()> {
        if let (Some(role), Some(slot)) = (role, slot) {
            let index = self.arena_used.fetch_add(1, Ordering::AcqRel);
            let Some(cell) = self.arena.get(index) else {
                self.arena_used.fetch_sub(1, Ordering::AcqRel);
                return Err(Error::Unsupported {
                    spec: slot.member.spec().into(),
                    what: format!(
                        "a member joining after {ONLINE_JOINS} others joined this running array (restart it first)"
                    ),
                });
            };
            let in_sync = slot.read_limit.in_sync_bytes.unwrap_or(u64::MAX);
            let by_bitmap = slot.superblock.feature_map & features::RECOVERY_BITMAP != 0;
            assert!(cell.set(slot).is_ok(), "arena entry {index} taken twice");
            // Order matters to readers on other threads: the new member is
            // limited (in_sync) before it is published, and the role stops
            // being faulty only after the old member is no longer current.
            self.read_limited.store(true, Ordering::Release);
            self.in_sync[role].store(in_sync, Ordering::Release);
            self.by_bitmap[role].store(by_bitmap, Ordering::Release);
            self.current[role].store(index, Ordering::Release);
            self.faulty[role].store(false, Ordering::Release);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        self.table.lock().unwrap_or_else(|p| p.into_inner())[dev_number as usize] = entry;
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let resync_offset = self.resync_offset_now();
        self.update_superblocks(&mut events, resync_offset)
    }

    /// A reshape of the running array ended and its members record the
    /// finished shape: from now on the array is `new`. `slots[role]` is
    /// each role's member with its superblock as the finished record wrote
    /// it (the template every later update starts from; `None`: the role's
    /// member failed during the reshape, missing from now on); `table` the
    /// role table the record wrote. The reshape's record is cleared: later
    /// updates write the new shape as it is. A role given a member is a
    /// working one from now on (not faulty, not left), whichever member
    /// held it before (a level change renumbering the roles moves members
    /// between them); a role given none is missing, or failed as it was.
    /// Roles past `new`'s count (a member that left by a level change)
    /// keep their state, unused.
    /// Nothing is written here. The caller holds every client request
    /// (`Array::swap_shape`).
    pub(crate) fn adopt_shape(
        &self,
        new: Geometry,
        slots: Vec<Option<Slot>>,
        table: Vec<u16>,
    ) -> Result<()> {
        let _events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let refuse = |what: String| Error::Unsupported {
            spec: self.slot(0).map_or("(missing)", |s| s.member.spec()).into(),
            what,
        };
        if slots.len() != new.members() as usize || slots.len() > self.current.len() {
            return Err(refuse(format!(
                "a running array of {} roles taking a shape of {} (at most {} roles while it runs)",
                slots.len(),
                new.members(),
                self.current.len()
            )));
        }
        let at = self.shape_at.load(Ordering::Acquire) + 1;
        let joins = slots.iter().flatten().count();
        if at >= self.shapes.len()
            || self.arena_used.load(Ordering::Acquire) + joins > self.arena.len()
        {
            return Err(refuse(format!(
                "another reshape after {} on this running array (restart `serve` first)",
                at - 1
            )));
        }
        for (role, slot) in slots.into_iter().enumerate() {
            // A role of the new shape is no longer one a level change took
            // out (its roles may be renumbered: RAID 0 <-> RAID 10).
            self.left[role].store(false, Ordering::Release);
            let Some(slot) = slot else {
                self.current[role].store(NO_SLOT, Ordering::Release);
                continue;
            };
            // A role given a member is held by a working one (the callers
            // give none that failed), whichever role it held before.
            self.faulty[role].store(false, Ordering::Release);
            *self.faulty_reason[role]
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
            let index = self.arena_used.fetch_add(1, Ordering::AcqRel);
            let in_sync = slot.read_limit.in_sync_bytes.unwrap_or(u64::MAX);
            let by_bitmap = slot.superblock.feature_map & features::RECOVERY_BITMAP != 0;
            if !slot.read_limit.is_none() {
                self.read_limited.store(true, Ordering::Release);
            }
            assert!(
                self.arena[index].set(slot).is_ok(),
                "arena entry {index} taken twice"
            );
            self.in_sync[role].store(in_sync, Ordering::Release);
            self.by_bitmap[role].store(by_bitmap, Ordering::Release);
            self.current[role].store(index, Ordering::Release);
        }
        *self.table.lock().unwrap_or_else(|p| p.into_inner()) = table;
        *self.reshape.lock().unwrap_or_else(|p| p.into_inner()) = None;
        assert!(self.shapes[at].set(new).is_ok(), "shape {at} taken twice");
        self.shape_at.store(at, Ordering::Release);
        // A served shrink's cap is the new shape's size now.
        self.size_cap.store(u64::MAX, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Take a faulty member out of `role` (md's `--remove`): its device
    /// slot is freed in every other member's role table (events + 1) and the
    /// role is missing until a new member joins. The member stays open
    /// until the array closes (a queue may still hold its file). Refused
    /// for a member that has not failed: fail it first.
    pub fn remove_member(&self, role: usize) -> Result<()> {
        let Some(slot) = self.slot(role) else {
            return Err(Error::NotStartable(format!(
                "role {role} has no member to remove"
            )));
        };
        if !self.is_faulty(role) {
            return Err(Error::Unsupported {
                spec: slot.member.spec().into(),
                what: "removing a working member (fail it first)".into(),
            });
        }
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let dev = slot.superblock.dev_number as usize;
        {
            let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(entry) = table.get_mut(dev) {
                *entry = Role::Spare.to_raw();
            }
        }
        self.current[role].store(NO_SLOT, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        // Out of the array: let go of it (it can be added back, reset or
        // pulled); queues still holding its descriptor see /dev/null.
        slot.member.detach();
        let resync_offset = self.resync_offset_now();
        self.update_superblocks(&mut events, resync_offset)
    }

    /// A member's rebuild reached the end: it is in sync; every member
    /// records that (events + 1).
    pub(crate) fn finish_recovery(&self, role: usize) -> Result<()> {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        self.in_sync[role].store(u64::MAX, Ordering::Release);
        self.by_bitmap[role].store(false, Ordering::Release);
        let resync_offset = self.resync_offset_now();
        self.update_superblocks(&mut events, resync_offset)
    }

    /// Put `role`'s recovery state into `sb`.
    fn apply_recovery(&self, role: usize, sb: &mut Superblock) {
        let recovering = features::RECOVERY_OFFSET | features::RECOVERY_BITMAP;
        match self.in_sync_bytes(role) {
            Some(bytes) => {
                sb.feature_map =
                    (sb.feature_map & !features::RECOVERY_BITMAP) | features::RECOVERY_OFFSET;
                if self.recovers_by_bitmap(role) {
                    sb.feature_map |= features::RECOVERY_BITMAP;
                }
                sb.recovery_offset = bytes / 512;
            }
            None => {
                sb.feature_map &= !recovering;
                sb.recovery_offset = 0;
            }
        }
    }

    /// Mark `role` faulty, keeping `why` for `detail`.
    fn set_faulty(&self, role: usize, why: String) {
        *self.faulty_reason[role]
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.faulty[role].store(true, Ordering::Release);
    }

    /// `role`'s member leaves the running array (a served RAID 6 taken
    /// over as RAID 5 drops its Q member, `reshape::live_level`): from now
    /// on it is neither read, written nor flushed, and no superblock
    /// update writes it. Nothing is written here: the caller's record
    /// says what the role table holds for it.
    pub(crate) fn leave_role(&self, role: usize, why: String) {
        self.left[role].store(true, Ordering::Release);
        self.set_faulty(role, why);
    }

    /// Room in the running array: the roles a shape may have, and the
    /// members that may still join (each member a new shape keeps takes
    /// one too; see [`Members::adopt_shape`]).
    pub(crate) fn room(&self) -> (usize, usize) {
        (
            self.current.len(),
            self.arena.len() - self.arena_used.load(Ordering::Acquire),
        )
    }

    /// Whether `role`'s member left the running array by a level change
    /// (not a failure; see [`Members::leave_role`]).
    pub fn has_left(&self, role: usize) -> bool {
        self.left[role].load(Ordering::Acquire)
    }

    /// Why `role`'s member was marked faulty while the array ran (`None`:
    /// it was not).
    pub fn faulty_reason(&self, role: usize) -> Option<String> {
        if !self.is_faulty(role) {
            return None;
        }
        self.faulty_reason[role]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether `role`'s member failed while the array ran.
    pub fn is_faulty(&self, role: usize) -> bool {
        self.faulty[role].load(Ordering::Acquire)
    }

    /// Whether `role` has a member that is present and has not failed.
    pub fn is_usable(&self, role: usize) -> bool {
        self.current[role].load(Ordering::Acquire) != NO_SLOT && !self.is_faulty(role)
    }

    /// The member in `role` failed with `error`: stop using it and record it
    /// as faulty (events + 1) in the superblock of every other usable
    /// member, durably, before returning (md's rule: before the request that
    /// saw the error completes). Refused, leaving the member in use, when it
    /// holds the last copy of some data (then the caller's request fails,
    /// as md fails it), and on RAID 0, which has no other copy.
    pub fn fail_member(&self, role: usize, error: &std::io::Error) -> Result<()> {
        let spec = self
            .slot(role)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        // A remote member whose new connection reached another device
        // fails for that reason, whatever error its operations then saw.
        let error = &match self.slot(role).and_then(|s| s.member.identity_refused()) {
            Some(why) => std::io::Error::new(error.kind(), why),
            None => std::io::Error::new(error.kind(), error.to_string()),
        };
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_faulty(role) {
            return Ok(());
        }
        let mut usable: Vec<bool> = (0..self.roles()).map(|r| self.is_usable(r)).collect();
        usable[role] = false;
        if !self.has_redundancy() || !self.geometry().has_every_byte(&usable) {
            eprintln!(
                "nvraid: {spec}: {error}; it holds the only copy of some data, so it stays in use and the request fails"
            );
            return Err(Error::LastCopy {
                spec,
                source: std::io::Error::new(error.kind(), error.to_string()),
            });
        }
        self.set_faulty(role, error.to_string());
        let resync_offset = self.resync_offset_now();
        self.update_superblocks(&mut events, resync_offset)?;
        eprintln!(
            "nvraid: {spec}: {error}; marked faulty (events {}), the array runs degraded",
            *events
        );
        Ok(())
    }

    /// A write of `[offset, offset + len)` of `role`'s data area failed
    /// with `error`. The member is marked faulty when the array can lose
    /// it. When it cannot (it holds the last copy of some data) and the
    /// array keeps parity, the stripe rows that write touched may no longer
    /// agree with their parity: the range is recorded bad (see
    /// [`Members::record_bad`]) so that no read rebuilds a block from them;
    /// the request still fails. `companions`: the other members the same
    /// request wrote in the same rows (their blocks there are that failed
    /// request's). When nothing can be recorded, the member fails after
    /// all, as in md. The returned error is the one the request must see
    /// (`Ok`: another copy holds the data).
    pub fn write_failed(
        &self,
        role: usize,
        offset: u64,
        len: u64,
        error: &std::io::Error,
        companions: &[usize],
    ) -> Result<()> {
        let failed = self.fail_member(role, error);
        if !matches!(failed, Err(Error::LastCopy { .. })) || !self.records_lost_writes {
            return failed;
        }
        let spec = self
            .slot(role)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        if let Err(why) = self.record_bad(role, offset, len, companions) {
            eprintln!("nvraid: {spec}: cannot record the failed write as bad blocks ({why}); marked faulty, as md does: the stripes that need it can no longer be read");
            let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
            // Its reason as `fail_member` would give it (a stranger at a
            // remote member's address is named).
            let cause = match self.slot(role).and_then(|s| s.member.identity_refused()) {
                Some(refused) => refused,
                None => error.to_string(),
            };
            self.set_faulty(
                role,
                format!("{cause} (a write failed and could not be recorded as bad blocks: {why})"),
            );
            let resync_offset = self.resync_offset_now();
            self.update_superblocks(&mut events, resync_offset)?;
        }
        failed
    }

    /// Record `[offset, offset + len)` of `role`'s data area as bad: in
    /// memory first (reads stop using it there at once), then durably in
    /// the member's bad-block log and its superblock (md's BAD_BLOCKS).
    /// A member that cannot take that write (its writes are what fails)
    /// keeps the range in memory, and each of `companions` records the
    /// same range instead: a row with a bad block beside the missing one(s)
    /// is not rebuilt from, whichever member lists it, and the companions'
    /// blocks there hold only the failed request's bytes. With no
    /// companions nothing else changed in those rows, and memory suffices.
    pub(crate) fn record_bad(
        &self,
        role: usize,
        offset: u64,
        len: u64,
        companions: &[usize],
    ) -> Result<()> {
        if self.is_reshaping() {
            // The log's place and the data's move while the array
            // reshapes (and ranges would count from which offset?): the
            // member fails instead, as md fails one whose log cannot take
            // the range.
            return Err(Error::NotStartable(
                "bad blocks are not recorded while the array reshapes".into(),
            ));
        }
        let sector = u64::from(self.sector_bytes);
        let range = (
            offset / sector * sector,
            (offset + len).div_ceil(sector) * sector,
        );
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        self.read_limited.store(true, Ordering::Release);
        let add = |role: usize| {
            let slot = self
                .slot(role)
                .expect("a member a write reached is present");
            slot.read_limit.add_bad(&[range]);
            // Paired with the readers: from here on the range is not read.
            assert!(!slot.read_limit.no_bad_block_in(range.0, range.1 - range.0));
            let persisted = crate::badlog::write(
                &slot.member,
                &slot.superblock,
                &slot.read_limit.bad_ranges(),
            )
            .and_then(|()| self.write_own_superblock(role, *events));
            if persisted.is_ok() {
                eprintln!(
                    "nvraid: {}: bytes {}+{} of its data recorded as bad blocks; no read uses them, directly or to rebuild another block",
                    slot.member.spec(),
                    range.0,
                    range.1 - range.0
                );
            }
            persisted
        };
        let Err(own) = add(role) else { return Ok(()) };
        if companions.is_empty() {
            // Nothing else was written in those rows: the rows still agree
            // with what they held, but for the failed request's own blocks,
            // which may read as before or as written. The range stays out
            // of reads while this process runs.
            eprintln!(
                "nvraid: {}: the failed range could not be recorded on it ({own}); no other member was written there, so its rows hold only old bytes or the failed request's",
                self.slot(role).map_or("(missing)", |s| s.member.spec())
            );
            return Ok(());
        }
        companions.iter().try_for_each(|&c| add(c))
    }

    /// The array's shape now (see `shapes`).
    pub fn geometry(&self) -> &Geometry {
        self.shapes[self.shape_at.load(Ordering::Acquire)]
            .get()
            .expect("invariant: the current shape is installed before it is published")
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry()
            .array_bytes()
            .min(self.size_cap.load(Ordering::Acquire))
    }

    /// Serve no more than `bytes` from now on (a served shrink: the size
    /// its record gives the array while it reshapes; the shape swapped at
    /// its end lifts the cap).
    pub(crate) fn cap_size(&self, bytes: u64) {
        self.size_cap.fetch_min(bytes, Ordering::AcqRel);
    }

    /// Serve the whole shape again (a served shrink that failed to start
    /// lifts the cap it set).
    pub(crate) fn lift_size_cap(&self) {
        self.size_cap.store(u64::MAX, Ordering::Release);
    }

    /// Offsets and lengths must be multiples of this (512, or 4096 when a
    /// member has 4 KiB logical blocks).
    pub fn sector_bytes(&self) -> u32 {
        self.sector_bytes
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Roles in order, each with its member now; `None` for a missing one.
    pub fn slots(&self) -> Vec<Option<&Slot>> {
        (0..self.roles()).map(|r| self.slot(r)).collect()
    }

    /// `role`'s member now (`None`: missing).
    pub fn slot(&self, role: usize) -> Option<&Slot> {
        match self.current[role].load(Ordering::Acquire) {
            NO_SLOT => None,
            index => self.arena[index].get(),
        }
    }

    /// The number of roles.
    pub fn roles(&self) -> usize {
        self.geometry().members() as usize
    }

    /// Changes whenever a role gets another member (see the field).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The superblock of the first present member (array-wide fields).
    pub fn superblock(&self) -> &Superblock {
        &self
            .slots()
            .into_iter()
            .flatten()
            .next()
            .expect("an array has a present member")
            .superblock
    }

    /// The events counter recorded on the members now.
    pub fn events(&self) -> u64 {
        *self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a member is missing or has failed (one that left by a level
    /// change is neither).
    pub fn is_degraded(&self) -> bool {
        (0..self.roles()).any(|role| !self.is_usable(role) && !self.has_left(role))
    }

    /// Whether the array is marked dirty on its members right now.
    pub fn is_dirty(&self) -> bool {
        self.unsynced.load(Ordering::Acquire) || self.dirty.load(Ordering::Acquire)
    }

    pub(crate) fn has_redundancy(&self) -> bool {
        self.geometry().level().is_redundant()
    }

    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<()> {
        let sector = u64::from(self.sector_bytes);
        if !offset.is_multiple_of(sector) || !len.is_multiple_of(sector) {
            return Err(Error::Unaligned {
                offset,
                len,
                sector_bytes: self.sector_bytes,
            });
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.size_bytes())
        {
            return Err(Error::OutOfRange {
                offset,
                len,
                size_bytes: self.size_bytes(),
            });
        }
        Ok(())
    }

    /// Make every completed write durable on every member.
    pub fn flush(&self) -> Result<()> {
        self.flush_slots(|_| true)
    }

    /// Do `op` on `role`'s member at `data_offset` bytes into its data
    /// area (`op` gets the slot and the byte offset on the member).
    /// Ok(false) when the member failed: it is marked faulty and the array
    /// goes on degraded (or the error is returned when the array cannot
    /// lose it). An error that is not the member's is returned as it is.
    pub(crate) fn on_member(
        &self,
        role: usize,
        data_offset: u64,
        op: impl FnOnce(&Slot, u64) -> std::io::Result<()>,
    ) -> Result<bool> {
        let Some(slot) = self.slot(role) else {
            panic!("invariant: member I/O is planned on present members only (role {role})");
        };
        match op(slot, slot.data_offset_bytes() + data_offset) {
            Ok(()) => Ok(true),
            Err(e) if is_member_failure(&e) => {
                self.fail_member(role, &e)?;
                Ok(false)
            }
            Err(e) => Err(Error::io(slot.member.spec(), e)),
        }
    }

    pub(crate) fn flush_slots(&self, wanted: impl Fn(usize) -> bool) -> Result<()> {
        for (role, slot) in self.slots().into_iter().enumerate() {
            if !wanted(role) || self.is_faulty(role) {
                continue;
            }
            let Some(slot) = slot else { continue };
            match slot.member.flush() {
                Ok(()) => {}
                Err(e) if is_member_failure(&e) => self.fail_member(role, &e)?,
                Err(e) => return Err(Error::io(slot.member.spec(), e)),
            }
        }
        Ok(())
    }

    /// md's rule: before the first write to a redundant array, record on
    /// every member that it is dirty (resync_offset 0, events + 1), so that
    /// a crash before the next clean close is detected. The events counter
    /// moves even when the array was already dirty, and the roles of
    /// members that are missing are recorded as faulty in the same update:
    /// a member that misses this write must never again be taken as in
    /// sync, by nvraid or by the kernel. RAID 0 has no copies to get out of
    /// step and, as in md, is never marked dirty.
    ///
    /// `stale_bitmaps`: the members may hold an md bitmap nvraid does not
    /// maintain; it is marked stale first (see
    /// [`Members::mark_bitmaps_stale`]).
    pub(crate) fn mark_dirty(&self, stale_bitmaps: bool) -> Result<()> {
        if !self.has_redundancy() || self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        if stale_bitmaps {
            self.mark_bitmaps_stale()?;
        }
        self.update_superblocks(&mut events, 0)?;
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Before nvraid's first write to an array with md's internal bitmap
    /// that nvraid does not maintain (one it could not load), mark each
    /// member's bitmap stale (durably): a stale bitmap makes md resync
    /// everything rather than trust bits that missed these writes.
    fn mark_bitmaps_stale(&self) -> Result<()> {
        for slot in self.slots().into_iter().flatten() {
            let sb = &slot.superblock;
            if sb.feature_map & features::BITMAP_OFFSET == 0 {
                continue;
            }
            let member = &slot.member;
            let at = (sb.super_offset_sectors as i64 + i64::from(sb.bitmap_offset as i32)) * 512;
            let len = (member.logical_block_bytes().max(512) as usize).max(bitmap::HEADER_BYTES);
            let bad = |what: String| Error::Unsupported {
                spec: member.spec().into(),
                what,
            };
            if at <= 0 || at as u64 + len as u64 > member.size_bytes() {
                return Err(bad(format!(
                    "an md bitmap at byte {at}, outside the member"
                )));
            }
            let mut header = nvraid_io::AlignedBuf::zeroed(len);
            member
                .read_at(&mut header, at as u64)
                .map_err(|e| Error::io(member.spec(), e))?;
            bitmap::mark_stale(&mut header, &sb.set_uuid)
                .map_err(|e| bad(format!("writing to an array whose {e}")))?;
            member
                .write_at(&header, at as u64)
                .map_err(|e| Error::io(member.spec(), e))?;
            member.flush().map_err(|e| Error::io(member.spec(), e))?;
        }
        Ok(())
    }

    /// Orderly close, once every write has completed and is flushed (and
    /// the companions are closed): a dirty array is marked clean (unless it
    /// was already dirty when assembled: nvraid has not resynced it; the
    /// update still moves the events counter).
    pub(crate) fn close(&self) -> Result<()> {
        if self.writable && self.dirty.load(Ordering::Acquire) {
            // What is left to resync is what the resync had not reached
            // (md writes its checkpoint when the array goes clean).
            let resync_offset = if self.unsynced.load(Ordering::Acquire) {
                self.resync_position()
            } else {
                RESYNC_CLEAN
            };
            let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
            self.update_superblocks(&mut events, resync_offset)?;
        }
        Ok(())
    }

    /// The role table every present member records from now on: the
    /// reference table with each role that has no present member marked
    /// faulty (md writes 0xfffe for a slot no present member holds).
    fn role_table(&self) -> Vec<u16> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (dev, entry) in table.iter_mut().enumerate() {
            if let Role::Active(role) = Role::from_raw(*entry) {
                // The slot's own member is this device only if its
                // dev_number matches; a set-aside device claiming the role
                // in an older table is not it.
                let holder = (usize::from(role) < self.roles())
                    .then(|| self.slot(usize::from(role)))
                    .flatten();
                let usable = holder.is_some_and(|s| s.superblock.dev_number as usize == dev)
                    && !self.is_faulty(usize::from(role));
                if !usable {
                    *entry = Role::Faulty.to_raw();
                }
            }
        }
        for companion in self.all_companions() {
            companion.role_table(&mut table);
        }
        table
    }

    /// Write every present member's superblock with `resync_offset`, one more
    /// event, the current time and the role table, then flush them.
    /// `events` is the locked counter; it advances once the superblocks are
    /// written.
    fn update_superblocks(&self, events: &mut u64, resync_offset: u64) -> Result<()> {
        if !(0..self.roles()).any(|r| self.is_usable(r)) {
            // Every member failed in turn: nothing is left to record the
            // array's state on (the members keep what they last recorded).
            return Err(Error::NotStartable(
                "every member has failed; no superblock can be updated".into(),
            ));
        }
        // md's rule: a member that cannot take the update has failed. It is
        // marked faulty and the update written again without it, as long as
        // the others still hold every byte; otherwise the update fails.
        loop {
            let failed = match self.write_superblocks(events, resync_offset) {
                Ok(()) => return Ok(()),
                Err(failed) => failed,
            };
            let (role, error) = match failed {
                Failed::Member(role, error) => (role, error),
                // A companion's own device (the journal): md fails the
                // array's writes with it, unless the companion went on
                // without it (its entry now faulty): written again.
                Failed::Companion(error) => {
                    if self.all_companions().iter().any(|c| c.write_again()) {
                        continue;
                    }
                    return Err(error);
                }
            };
            let spec = self
                .slot(role)
                .map_or("(missing)", |s| s.member.spec())
                .to_string();
            let mut usable: Vec<bool> = (0..self.roles()).map(|r| self.is_usable(r)).collect();
            usable[role] = false;
            if !self.has_redundancy() || !self.geometry().has_every_byte(&usable) {
                return Err(Error::io(&spec, error));
            }
            let error = match self.slot(role).and_then(|s| s.member.identity_refused()) {
                Some(why) => std::io::Error::new(error.kind(), why),
                None => error,
            };
            self.set_faulty(role, format!("{error} (while its superblock was updated)"));
            eprintln!(
                "nvraid: {spec}: {error} while its superblock was updated; marked faulty, the array runs degraded"
            );
        }
    }

    /// One pass of [`Members::update_superblocks`]: the first member that
    /// failed, if any (`events` advances only when every write succeeded).
    fn write_superblocks(
        &self,
        events: &mut u64,
        resync_offset: u64,
    ) -> std::result::Result<(), Failed> {
        let next = *events + 1;
        for companion in self.all_companions() {
            if let Some((role, e)) = companion.before_superblocks(self, next).into_iter().next() {
                return Err(Failed::Member(role, e));
            }
        }
        let now = Timestamp::now();
        let table = self.role_table();
        let record = self.reshape_record();
        let mut written = 0;
        for (role, slot) in self.slots().into_iter().enumerate() {
            let Some(slot) = slot else { continue };
            if self.is_faulty(role) {
                // md writes no superblock to a member that failed.
                continue;
            }
            written += 1;
            let mut sb = slot.superblock.clone();
            if let Some(reshape) = &record {
                reshape.apply(role, &mut sb);
            }
            sb.events = next;
            sb.resync_offset = resync_offset;
            sb.utime = now;
            sb.roles_raw = table.clone();
            self.apply_recovery(role, &mut sb);
            apply_bad_blocks(slot, &mut sb);
            // Paired with assembly's placement: the table still gives this
            // member the role it holds (renumbered by a level change).
            let written = record.as_ref().map_or(role, |r| r.role_written(role));
            assert_eq!(
                sb.role(),
                Role::Active(written as u16),
                "role table lost a present member"
            );
            write_superblock(&slot.member, &sb).map_err(|e| match e {
                Error::Io { source, .. } => Failed::Member(role, source),
                other => Failed::Member(role, std::io::Error::other(other.to_string())),
            })?;
        }
        assert!(written > 0, "a superblock update with no member to write");
        let update = Update {
            events: next,
            resync_offset,
            utime: now,
            roles_raw: &table,
        };
        for companion in self.all_companions() {
            companion
                .after_superblocks(&update)
                .map_err(Failed::Companion)?;
        }
        for (role, slot) in self.slots().into_iter().enumerate() {
            let Some(slot) = slot else { continue };
            if self.is_faulty(role) {
                continue;
            }
            slot.member.flush().map_err(|e| Failed::Member(role, e))?;
            slot.superblock_written(next);
        }
        *events = next;
        Ok(())
    }
}
