//! Rebuild: a new member in a missing role, filled from the other copies
//! (see the state table in the module above).

use super::common::REGION_BYTES;
use super::{keep_to_rate, Checkpoints};
use crate::array::Array;
use crate::barrier::Quiet;
use crate::create::random_uuid;
use crate::error::{Error, Result};
use crate::slot::{write_superblock, Slot};
use nvraid_io::AlignedBuf;
use nvraid_member::{Member, MemberKind};
use nvraid_metadata::{features, Role, Superblock, Timestamp};
use std::time::{Duration, Instant};

/// How often a rebuild or a resync records its progress in the superblocks.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// What [`add_member`] did with the new member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Added {
    /// It took this role and must now be rebuilt.
    Recovering { role: u32 },
    /// No role was missing: it is a spare.
    Spare,
}

/// Put `new` into the array: into the first role with no usable member
/// (to be rebuilt), or as a spare when none is missing. Every present
/// member's superblock records it (events + 1). `array` must be writable.
/// Returns the array with the new member in place.
pub fn add_member(array: Array, new: Member) -> Result<(Array, Added)> {
    let added = join(&array, new, None)?;
    Ok((array, added))
}

/// [`add_member`] on an array in use (a running server): the queues take
/// the new member at their next request; the caller then rebuilds it with
/// [`rebuild_online`].
pub fn add_member_to(array: &Array, new: Member) -> Result<Added> {
    join(array, new, None)
}

/// md's re-add: `old`, a member that left this array (failed or removed)
/// and still carries its superblock, goes back into its own role, and its
/// recovery copies only the chunks the write-intent bitmap marks (written
/// while it was away). Refused, with the reason, unless the array has a
/// bitmap, the member's role is missing, and the bitmap covers every write
/// since it left (its events are no older than the bitmap's
/// events_cleared: bits cleared since then would hide writes it missed).
/// Returns the array and the role taken.
pub fn re_add(array: Array, old: Member) -> Result<(Array, u32)> {
    let role = re_add_to(&array, old)?;
    Ok((array, role))
}

/// [`re_add`] on an array in use (see [`add_member_to`]).
pub fn re_add_to(array: &Array, old: Member) -> Result<u32> {
    let spec = old.spec().to_string();
    let refuse = |why: String| Error::NotReAddable {
        spec: spec.clone(),
        why,
    };
    let sb = crate::slot::read_superblock(&old)?;
    if sb.set_uuid != array.superblock().set_uuid {
        return Err(refuse("it is not a member of this array".into()));
    }
    let Some(bitmap) = array.bitmap_info() else {
        return Err(refuse(
            "the array has no write-intent bitmap to say what it missed".into(),
        ));
    };
    let Role::Active(role) = sb.role() else {
        return Err(refuse(format!(
            "its own superblock gives it no active role ({:?})",
            sb.role()
        )));
    };
    let role = usize::from(role);
    if role >= array.roles() || array.is_usable(role) {
        return Err(refuse(format!("its role {role} is held by another member")));
    }
    if sb.events < bitmap.events_cleared {
        return Err(refuse(format!(
            "it left at events {}, before bits were last cleared (events {}): the bitmap no longer covers what it missed",
            sb.events, bitmap.events_cleared
        )));
    }
    match join(array, old, Some((role, sb)))? {
        Added::Recovering { role } => Ok(role),
        Added::Spare => unreachable!("a re-add always takes a role"),
    }
}

/// Put `new` into the array: into the first missing role (or `back`'s role,
/// recovering by bitmap, keeping its device slot and UUID when they are
/// free), or as a spare when no role is missing.
fn join(array: &Array, new: Member, back: Option<(usize, Superblock)>) -> Result<Added> {
    check_joinable(array, &new)?;
    let role = match &back {
        Some((role, _)) => Some(*role),
        None => (0..array.roles()).find(|&r| !array.is_usable(r)),
    };
    check_room(array, &new, role)?;
    let table = array.role_table_now();
    let dev_number = free_device_slot(array, &new, &table, back.as_ref())?;
    let mut sb = joining_superblock(array, &new, dev_number, back.as_ref())?;
    let added = match role {
        Some(r) => {
            sb.feature_map |= features::RECOVERY_OFFSET;
            if back.is_some() {
                sb.feature_map |= features::RECOVERY_BITMAP;
            }
            sb.recovery_offset = 0;
            Added::Recovering { role: r as u32 }
        }
        None => Added::Spare,
    };
    // The new member's superblock first (so a crash between the two leaves
    // it a member of nobody's table, which assembly sets aside), then the
    // table of every present member.
    sb.roles_raw = table;
    sb.roles_raw[dev_number as usize] = match role {
        Some(r) => r as u16,
        None => Role::Spare.to_raw(),
    };
    sb.events = array.events();
    write_superblock(&new, &sb)?;
    crate::badlog::write_empty(&new, &sb)?;
    array.bitmap_copy_to(&new)?;
    new.flush().map_err(|e| Error::io(new.spec(), e))?;
    let entry = sb.roles_raw[dev_number as usize];
    let slot = match role {
        Some(_) => Some(Slot::new(new, sb)?),
        None => None,
    };
    array.install(role, slot, dev_number, entry)?;
    Ok(added)
}

/// Whether `new` may join `array` at all: a writable, redundant array; a
/// member that can hold data; not a member the array already has.
fn check_joinable(array: &Array, new: &Member) -> Result<()> {
    let spec = new.spec().to_string();
    if !array.is_writable() {
        return Err(Error::ReadOnly);
    }
    if !array.geometry().level().is_redundant() {
        return Err(Error::Unsupported {
            spec,
            what: "adding a member to a raid0 (it has no copy to rebuild from)".into(),
        });
    }
    if !matches!(
        new.kind(),
        MemberKind::File
            | MemberKind::BlockDevice
            | MemberKind::Mem
            | MemberKind::Nbd
            | MemberKind::NvmeTcp
    ) {
        return Err(Error::Unsupported {
            spec,
            what: "a null member as a new member".into(),
        });
    }
    for slot in array.slots().iter().flatten() {
        if new.identity().is_some() && new.identity() == slot.member.identity() {
            return Err(Error::Duplicate {
                spec,
                other: slot.member.spec().into(),
                what: "file or device",
            });
        }
    }
    Ok(())
}

/// Whether `new` holds the metadata area and the data `role` needs (a
/// spare: what the largest role needs).
fn check_room(array: &Array, new: &Member, role: Option<usize>) -> Result<()> {
    let needed = match role {
        Some(r) => array.geometry().member_used_bytes_of(r as u32),
        None => array.geometry().member_used_bytes(),
    };
    let data_offset = array.superblock().data_offset_sectors * 512;
    if new.size_bytes() < data_offset + needed {
        return Err(Error::TooSmall {
            spec: new.spec().to_string(),
            size_bytes: new.size_bytes(),
            min_bytes: data_offset + needed,
            reason: format!(
                "{} of metadata area plus {needed} bytes of data, as the other members hold",
                nvraid_member::format_size(data_offset)
            ),
        });
    }
    Ok(())
}

/// A device slot of the role table no member uses: a member coming back
/// keeps its own when it is free; otherwise the lowest unused entry.
fn free_device_slot(
    array: &Array,
    new: &Member,
    table: &[u16],
    back: Option<&(usize, Superblock)>,
) -> Result<u32> {
    // Device slots in use: the present members', and those of members set
    // aside (a spare given with the array keeps its slot).
    let used: Vec<u32> = array
        .slots()
        .iter()
        .flatten()
        .map(|s| s.superblock.dev_number)
        .chain(
            array
                .set_aside()
                .iter()
                .filter_map(|m| m.superblock.as_ref().map(|sb| sb.dev_number)),
        )
        .collect();
    let own = back.map(|(_, sb)| sb.dev_number).filter(|d| {
        (*d as usize) < table.len()
            && !used.contains(d)
            && matches!(
                Role::from_raw(table[*d as usize]),
                Role::Spare | Role::Faulty
            )
    });
    own.or_else(|| {
        (0..table.len() as u32)
            .find(|d| table[*d as usize] == Role::Spare.to_raw() && !used.contains(d))
    })
    .ok_or_else(|| Error::Unsupported {
        spec: new.spec().to_string(),
        what: "a new member: the role table has no free device slot".into(),
    })
}

/// The superblock `new` joins with: the array's, with its own device slot
/// and UUID (a member coming back keeps its UUID), its own size, and no
/// bad blocks or recovery state yet.
fn joining_superblock(
    array: &Array,
    new: &Member,
    dev_number: u32,
    back: Option<&(usize, Superblock)>,
) -> Result<Superblock> {
    let mut sb = array.superblock().clone();
    let data_offset = sb.data_offset_sectors * 512;
    sb.dev_number = dev_number;
    sb.device_uuid = match back {
        Some((_, own)) => own.device_uuid,
        None => random_uuid()?,
    };
    sb.data_size_sectors = (new.size_bytes() - data_offset) / 512;
    // The bad-block log keeps its place (the member's layout is the
    // others'), empty: nothing on the new member is bad yet.
    sb.feature_map &= !(features::BAD_BLOCKS
        | features::RECOVERY_OFFSET
        | features::RECOVERY_BITMAP
        | features::REPLACEMENT);
    // The write-intent bitmap (when the array has one) stays: every member
    // carries it, the new one too (written by the caller).
    sb.cnt_corrected_read = 0;
    sb.utime = Timestamp::now();
    Ok(sb)
}

/// Put the hot spares given with a degraded array into its missing roles
/// (each then to be rebuilt): md's spare taking over. Returns the array and
/// the spares used, with their roles. Spares are opened for writing here
/// (assembly only read their superblocks).
pub fn promote_spares(mut array: Array, direct: bool) -> Result<(Array, Vec<(String, u32)>)> {
    let spares: Vec<String> = array
        .set_aside()
        .iter()
        .filter(|m| m.reason == crate::SetAside::Spare)
        .map(|m| m.spec.clone())
        .collect();
    let mut promoted = Vec::new();
    for spec in spares {
        if !array.is_degraded() {
            break;
        }
        let member = Member::open(
            &spec,
            nvraid_member::OpenOptions {
                write: true,
                create_bytes: None,
                direct,
                ..Default::default()
            },
        )?;
        let (next, added) = add_member(array, member)?;
        array = next;
        if let Added::Recovering { role } = added {
            promoted.push((spec, role));
        }
    }
    Ok((array, promoted))
}

/// How a rebuild went.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Rebuilt {
    pub role: u32,
    /// Where this run started (a resumed rebuild starts at its checkpoint).
    pub from_bytes: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// Progress of a rebuild, for a progress line.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub role: u32,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub elapsed: Duration,
}

/// Rebuild every member being recovered, from its checkpoint to the end,
/// copying from the other copies; `progress` is called after each region.
/// When it returns Ok, every member is in sync and recorded so.
/// `max_rate` caps the copy rate in bytes per second (md's speed_limit_max).
pub fn rebuild(
    array: &Array,
    max_rate: Option<u64>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<Rebuilt>> {
    let mut done = Vec::new();
    for role in 0..array.roles() {
        if let (true, Some(from)) = (array.is_usable(role), array.in_sync_bytes(role)) {
            done.push(rebuild_role(array, role, from, max_rate, progress)?);
        }
    }
    Ok(done)
}

fn rebuild_role(
    array: &Array,
    role: usize,
    from: u64,
    max_rate: Option<u64>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Rebuilt> {
    if array.recovers_by_bitmap(role) {
        return rebuild_by_bitmap(array, role, from, max_rate, progress);
    }
    let total = array.geometry().member_used_bytes_of(role as u32);
    let target = array.slot(role).expect("present");
    let target_error = |source| Error::RebuildTarget {
        spec: target.member.spec().into(),
        source,
    };
    let started = Instant::now();
    // Reading the next region overlaps writing this one: a reader thread
    // fills buffers from a small pool, this thread writes them in order.
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Result<(u64, u64, AlignedBuf)>>(2);
    // A pool of three buffers, each in one place at a time: bounded at 3.
    let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel::<AlignedBuf>(3);
    for _ in 0..3 {
        empty_tx
            .send(AlignedBuf::zeroed(REGION_BYTES as usize))
            .expect("receiver alive");
    }
    std::thread::scope(move |scope| {
        scope.spawn(move || read_ahead(array, role, (from, total), empty_rx, full_tx));
        let mut checkpoints = Checkpoints::start();
        for region in full_rx {
            let (at, end, buf) = region?;
            target
                .member
                .write_at(&buf[..(end - at) as usize], target.data_offset_bytes() + at)
                .map_err(target_error)?;
            keep_to_rate(max_rate, end - from, started);
            if end < total && checkpoints.due() {
                recovered_below(array, role, end, total, || {
                    target.member.flush().map_err(target_error)
                })?;
            }
            progress(Progress {
                role: role as u32,
                done_bytes: end,
                total_bytes: total,
                elapsed: started.elapsed(),
            });
            // The reader may have stopped after an error: ignore a closed pool.
            let _ = empty_tx.send(buf);
        }
        Ok::<(), Error>(())
    })?;
    recovered_below(array, role, total, total, || {
        target.member.flush().map_err(target_error)
    })?;
    Ok(Rebuilt {
        role: role as u32,
        from_bytes: from,
        bytes: total - from,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Record that `role`'s new member holds the array's data below `at` (of
/// `total`): the member flushed first, then its `recovery_offset`
/// checkpointed, or at the end the member recorded active.
fn recovered_below(
    array: &Array,
    role: usize,
    at: u64,
    total: u64,
    flush: impl FnOnce() -> Result<()>,
) -> Result<()> {
    flush()?;
    if at >= total {
        array.finish_recovery(role)
    } else {
        array.checkpoint_recovery(role, Some(at))
    }
}

/// A rebuild's reader: fills the buffers of the pool (`empty`) with what
/// `role` holds at `[from, total)` of its data area, region after region,
/// and hands them on in order (`full`); stops after the first error, which
/// it hands on too.
fn read_ahead(
    array: &Array,
    role: usize,
    (from, total): (u64, u64),
    empty: std::sync::mpsc::Receiver<AlignedBuf>,
    full: std::sync::mpsc::SyncSender<Result<(u64, u64, AlignedBuf)>>,
) {
    let mut at = from;
    // RAID 4/5/6: the other members' bytes of a region, reused.
    let mut sources = Vec::new();
    while at < total {
        let Ok(mut buf) = empty.recv() else { return };
        let end = (at + REGION_BYTES).min(total);
        let read = array
            .personality()
            .rebuild(array, role, (at, end), &mut buf, &mut sources);
        let failed = read.is_err();
        if full.send(read.map(|()| (at, end, buf))).is_err() || failed {
            return;
        }
        at = end;
    }
}

/// How a rebuild beside client I/O is paced, md's way: never faster than
/// `max_rate`; while clients are doing I/O, no faster than `min_rate`
/// either (the floor md keeps so that a busy array still recovers). Rates
/// in bytes per second; `None` is unlimited. `stop` ends the rebuild at
/// its next step, with its checkpoint recorded (it resumes there).
#[derive(Debug, Default)]
pub struct RebuildPace<'a> {
    pub min_rate: Option<u64>,
    pub max_rate: Option<u64>,
    pub stop: Option<&'a std::sync::atomic::AtomicBool>,
}

/// Rebuild every member being recovered while the array serves clients:
/// step by step, each step holding its region against client writes (a
/// client write then lands on the new member after the copy, never under
/// it), paced by `pace`. Returns what each role's run did; a role stopped
/// early is still being recovered (`Array::in_sync_bytes`).
pub fn rebuild_online(
    array: &Array,
    pace: &RebuildPace,
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<Rebuilt>> {
    let mut done = Vec::new();
    for role in 0..array.roles() {
        if pace
            .stop
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::Acquire))
        {
            break;
        }
        if let (true, Some(from)) = (array.is_usable(role), array.in_sync_bytes(role)) {
            done.push(rebuild_stepwise(array, role, from, pace, true, progress)?);
        }
    }
    Ok(done)
}

/// The recovery of a re-added member (offline): only the pieces the
/// bitmap marks are copied.
fn rebuild_by_bitmap(
    array: &Array,
    role: usize,
    from: u64,
    max_rate: Option<u64>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Rebuilt> {
    let pace = RebuildPace {
        max_rate,
        ..RebuildPace::default()
    };
    rebuild_stepwise(array, role, from, &pace, false, progress)
}

/// Client I/O operations the server's queues have done so far.
fn client_ops(array: &Array) -> u64 {
    array
        .member_counters()
        .iter()
        .map(|c| c.ops.load(std::sync::atomic::Ordering::Relaxed))
        .sum()
}

/// Copy `role`'s member from `from` to the end, a step (at most a barrier
/// region, a chunk, a bitmap chunk) at a time. A member re-added with
/// RECOVERY_BITMAP gets only the steps whose array bytes the bitmap marks
/// (what was written while it was away); the rest already holds the
/// array's data. With `online`, each step holds its region against client
/// writes. Checkpoints every second; `bytes` counts what was copied.
///
/// The reads run on a reader thread that lives as long as the rebuild
/// (its io_uring and the kernel's workers behind it are made once), a few
/// pieces ahead of this thread's writes. Beside idle clients they run on
/// into the next step before its hold; the hold tells whether a client
/// write reached that step's regions since, and if one did, those pieces
/// are read again under it.
fn rebuild_stepwise(
    array: &Array,
    role: usize,
    from: u64,
    pace: &RebuildPace,
    online: bool,
    progress: &mut dyn FnMut(Progress),
) -> Result<Rebuilt> {
    let step = step_bytes(array, only_marked_of(array, role));
    std::thread::scope(|scope| {
        let reader = Reader::start(scope, array, role, step);
        let copied = copy_steps(array, role, from, pace, online, step, &reader, progress);
        reader.stop();
        copied
    })
}

fn only_marked_of(array: &Array, role: usize) -> bool {
    array.recovers_by_bitmap(role)
}

#[allow(clippy::too_many_arguments)]
fn copy_steps(
    array: &Array,
    role: usize,
    from: u64,
    pace: &RebuildPace,
    online: bool,
    step: u64,
    reader: &Reader,
    progress: &mut dyn FnMut(Progress),
) -> Result<Rebuilt> {
    let geometry = array.geometry();
    let only_marked = only_marked_of(array, role);
    let total = geometry.member_used_bytes_of(role as u32);
    let Some(target) = array.slot(role) else {
        panic!("invariant: a role being rebuilt has its new member in place");
    };
    // A target that fails stops the rebuild; beside clients it is also
    // marked faulty (md's rule), so that a spare can take over rather than
    // the same member being tried again.
    let target_error = |source: std::io::Error| {
        if online {
            if let Err(e) = array.fail_member(role, &source) {
                eprintln!("nvraid: {}: {e}", target.member.spec());
            }
        }
        Error::RebuildTarget {
            spec: target.member.spec().into(),
            source,
        }
    };
    // While no client is busy and no maximum rate applies, a rebuild
    // whose family sets no step limit (parity; a RAID 1) copies several
    // steps under one hold (a client write that comes meanwhile waits for
    // a longer step, once: the next window sees it busy). A RAID 10's step
    // is a chunk and a bitmap's a bitmap chunk, for what they map: they
    // stay so.
    let idle_step = match array.personality().rebuild_step_limit(geometry) {
        None if !only_marked => step * IDLE_STEPS,
        _ => step,
    };
    let started = Instant::now();
    let mut checkpoints = Checkpoints::start();
    let mut window = PaceWindow::open(array, pace, online);
    let mut copied = 0u64;
    let mut at = from;
    // Beside idle clients, the next step's first pieces are read while
    // this step's last ones are written, before the next step's hold: the
    // step they belong to (member offset, length) and the barrier's word
    // for its regions from before the reads, which its hold compares.
    let mut ahead: Option<(u64, u64, Quiet)> = None;
    while at < total {
        if pace
            .stop
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::Acquire))
        {
            break;
        }
        let this_step = if window.busy || pace.max_rate.is_some() {
            step
        } else {
            idle_step
        };
        // A step from member offset `a`: up to the next multiple of the step.
        let step_from = |a: u64| (this_step - a % this_step).min(total - a);
        let len = step_from(at);
        // The array bytes this step's member bytes belong to (RAID 4/5/6:
        // the data of their stripe, for any block of it).
        let (logical, logical_len) = array.personality().array_bytes_of(geometry, role, at, len);
        if !only_marked || array.resync_wanted(logical, logical_len) {
            // Every region the step's array bytes touch: a RAID 4/5/6
            // stripe can cross a region's edge, and a client write to its
            // far side must not land on the new member between this
            // step's reads and its write.
            let since = ahead.take().filter(|&(a, l, _)| (a, l) == (at, len));
            let (hold, read_ahead_stands) = match online {
                true => {
                    let quiet = since.as_ref().map(|(_, _, q)| q);
                    let (hold, stands) = array.hold_bytes_after(logical, logical_len, quiet);
                    (Some(hold), stands)
                }
                false => (None, false),
            };
            // The next step, read ahead: only beside idle clients (busy
            // ones would often write there first, and the reads taken
            // from them would be wasted) and with no maximum rate.
            let next_at = at + len;
            let next = (online && !only_marked && !window.busy && pace.max_rate.is_none())
                .then_some(next_at)
                .filter(|&n| n < total)
                .and_then(|n| {
                    let n_len = step_from(n);
                    let (n_logical, n_logical_len) =
                        array.personality().array_bytes_of(geometry, role, n, n_len);
                    let quiet = array.quiet_bytes(n_logical, n_logical_len)?;
                    Some(((n, n_logical, n_len), quiet))
                });
            reader.copy_step(
                (at, logical, len),
                read_ahead_stands,
                next.as_ref().map(|(step, _)| *step),
                &|piece, piece_at| {
                    crate::failpoint::pause("rebuild-write", piece_at, piece.len() as u64);
                    target
                        .member
                        .write_at(piece, target.data_offset_bytes() + piece_at)
                        .map_err(target_error)
                },
            )?;
            ahead = next.map(|((n, _, n_len), quiet)| (n, n_len, quiet));
            drop(hold);
            copied += len;
            window.copied(array, pace, len);
        }
        at += len;
        if at < total && checkpoints.due() {
            recovered_below(array, role, at, total, || {
                target.member.flush().map_err(target_error)
            })?;
        }
        progress(Progress {
            role: role as u32,
            done_bytes: at,
            total_bytes: total,
            elapsed: started.elapsed(),
        });
    }
    let flush = || target.member.flush().map_err(target_error);
    if at > from || at >= total {
        recovered_below(array, role, at, total, flush)?;
    } else {
        flush()?;
    }
    Ok(Rebuilt {
        role: role as u32,
        from_bytes: from,
        bytes: copied,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The most bytes of a step read (or written) at once: a step longer than
/// this is copied piece by piece, the reads of the next pieces overlapping
/// the write of the last.
const PIECE_BYTES: u64 = 1 << 20;

/// Steps taken at once by a parity or RAID 1 rebuild while clients are
/// idle and no maximum rate is set. Before the next step was read ahead
/// of its hold, each hold's first read and last write overlapped nothing,
/// and longer holds kept the members busier (on zram, 4 MiB steps reached
/// about 0.7 of a rebuild with no holds). With the read ahead, one step
/// per hold measured the same as four within the machine's spread (see
/// docs/performance-history.md); four stay, for fewer hold changes.
const IDLE_STEPS: u64 = 4;

/// Pieces in flight between the reader and the writer of a step.
const PIECES_AHEAD: usize = 3;

/// A piece for the reader: `len` bytes of the member at `at` (array bytes
/// from `logical`), to be rebuilt into the buffer.
struct PieceRead {
    at: u64,
    logical: u64,
    len: usize,
    buf: AlignedBuf,
}

/// A step-by-step rebuild's reader thread: rebuilds the pieces it is sent,
/// in order, from the other members, and hands each back with its
/// buffer (also when the read failed). The parity family's buffers for
/// the other members' bytes stay with it from one piece to the next.
struct Reader {
    requests: std::sync::mpsc::Sender<PieceRead>,
    answers: std::sync::mpsc::Receiver<(PieceRead, Result<()>)>,
    /// The buffers not with the reader.
    pool: std::cell::RefCell<Vec<AlignedBuf>>,
    piece: u64,
    /// The pieces of the next step sent ahead of its hold.
    ahead: std::cell::Cell<Option<Ahead>>,
}

/// The first pieces of a step, sent to the reader before the step's hold.
#[derive(Clone, Copy)]
struct Ahead {
    /// The step's member offset.
    at: u64,
    /// Its bytes sent.
    sent: u64,
    /// Its pieces not yet back.
    out: usize,
}

impl Reader {
    fn start<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        array: &'scope Array,
        role: usize,
        step: u64,
    ) -> Reader {
        let piece = step.min(PIECE_BYTES);
        // A step of one piece still reads the next step's while it writes.
        let count = if step > PIECE_BYTES { PIECES_AHEAD } else { 2 };
        let (requests, work) = std::sync::mpsc::channel::<PieceRead>();
        let (done, answers) = std::sync::mpsc::channel();
        scope.spawn(move || {
            let mut sources = Vec::new();
            for mut job in work {
                let read = array.personality().rebuild_piece(
                    array,
                    role,
                    (job.at, job.logical),
                    &mut job.buf[..job.len],
                    &mut sources,
                );
                if done.send((job, read)).is_err() {
                    return;
                }
            }
        });
        Reader {
            requests,
            answers,
            pool: std::cell::RefCell::new(
                (0..count)
                    .map(|_| AlignedBuf::zeroed(piece as usize))
                    .collect(),
            ),
            piece,
            ahead: std::cell::Cell::new(None),
        }
    }

    /// Copy one step: `len` bytes of the member at `at` (array bytes from
    /// `logical`), rebuilt by the reader a few pieces ahead and handed to
    /// `write` with their member offset, in order. Returns once every
    /// piece of the step is back (after an error too).
    ///
    /// Pieces of this step the last call sent ahead are used if
    /// `ahead_stands` (its hold saw no write reach them since), else read
    /// again. Given `next` (member offset, array offset, length of the
    /// next step), the first pieces of that step are sent as soon as this
    /// step's are all sent, and stay with the reader for the next call.
    fn copy_step(
        &self,
        (at, logical, len): (u64, u64, u64),
        ahead_stands: bool,
        next: Option<(u64, u64, u64)>,
        write: &dyn Fn(&[u8], u64) -> Result<()>,
    ) -> Result<()> {
        let end = at + len;
        let mut sent = at;
        let mut out = 0usize;
        let mut outcome = Ok(());
        let mut pool = self.pool.borrow_mut();
        match self.ahead.take() {
            Some(ahead) if ahead_stands && ahead.at == at => {
                (sent, out) = (at + ahead.sent, ahead.out);
            }
            Some(ahead) => {
                // A client write may have reached them before the hold.
                for _ in 0..ahead.out {
                    pool.push(self.answer().0.buf);
                }
            }
            None => {}
        }
        let mut ahead = next.map(|(n, _, _)| Ahead {
            at: n,
            sent: 0,
            out: 0,
        });
        loop {
            // Keep the reader a few pieces ahead (none after an error).
            while outcome.is_ok() && sent < end {
                let Some(buf) = pool.pop() else { break };
                let n = self.piece.min(end - sent);
                self.send(sent, logical + (sent - at), n, buf);
                sent += n;
                out += 1;
            }
            // Then the next step's first pieces, as buffers come back.
            if let (Some((n_at, n_logical, n_len)), Some(a)) = (next, ahead.as_mut()) {
                while outcome.is_ok() && sent == end && a.sent < n_len {
                    let Some(buf) = pool.pop() else { break };
                    let n = self.piece.min(n_len - a.sent);
                    self.send(n_at + a.sent, n_logical + a.sent, n, buf);
                    a.sent += n;
                    a.out += 1;
                }
            }
            if out == 0 {
                self.ahead.set(ahead.filter(|a| a.out > 0));
                return outcome;
            }
            let (job, read) = self.answer();
            out -= 1;
            if outcome.is_ok() {
                outcome = read.and_then(|()| write(&job.buf[..job.len], job.at));
            }
            pool.push(job.buf);
        }
    }

    /// Send the reader `len` bytes of the member at `at` (array bytes from
    /// `logical`) to rebuild into `buf`.
    fn send(&self, at: u64, logical: u64, len: u64, buf: AlignedBuf) {
        let job = PieceRead {
            at,
            logical,
            len: len as usize,
            buf,
        };
        self.requests
            .send(job)
            .expect("the reader lives as long as the rebuild");
    }

    /// The reader's next piece back, in the order sent.
    fn answer(&self) -> (PieceRead, Result<()>) {
        self.answers
            .recv()
            .expect("the reader answers every piece it was sent")
    }

    /// No more pieces: the reader thread ends.
    fn stop(self) {
        drop(self.requests);
    }
}

/// A step of a rebuild that goes a step at a time: at most a rebuild
/// region, a barrier region, what the family allows (the copies: a chunk),
/// and (copying only what the bitmap marks) a bitmap chunk.
fn step_bytes(array: &Array, only_marked: bool) -> u64 {
    [
        Some(REGION_BYTES),
        Some(crate::barrier::BARRIER_REGION_BYTES),
        array.personality().rebuild_step_limit(array.geometry()),
        array.bitmap_chunk_bytes().filter(|_| only_marked),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(REGION_BYTES)
}

/// The pacing of a rebuild beside clients, md's way: within a window of
/// [`PaceWindow::LENGTH`], no faster than the maximum rate, and while
/// clients were busy in the previous window, no faster than the minimum.
struct PaceWindow {
    start: Instant,
    /// Bytes copied since the window opened.
    bytes: u64,
    /// Client operations counted when the window opened.
    ops_seen: u64,
    /// Whether clients were busy in the previous window.
    busy: bool,
}

impl PaceWindow {
    const LENGTH: Duration = Duration::from_millis(100);

    fn open(array: &Array, pace: &RebuildPace, online: bool) -> PaceWindow {
        let mut window = PaceWindow {
            start: Instant::now(),
            bytes: 0,
            ops_seen: client_ops(array),
            busy: false,
        };
        if online && pace.min_rate.is_some() {
            // Look before the first step: a full-speed first window would
            // take the clients' share before their activity shows.
            std::thread::sleep(Duration::from_millis(20));
            let ops = client_ops(array);
            window.busy = ops != window.ops_seen;
            window.ops_seen = ops;
        }
        window
    }

    /// `len` more bytes were copied: sleep while ahead of the rate that
    /// applies, and open the next window when this one is over.
    fn copied(&mut self, array: &Array, pace: &RebuildPace, len: u64) {
        self.bytes += len;
        let rate = if self.busy {
            pace.min_rate.or(pace.max_rate)
        } else {
            pace.max_rate
        };
        keep_to_rate(rate, self.bytes, self.start);
        if self.start.elapsed() >= Self::LENGTH {
            let ops = client_ops(array);
            self.busy = ops != self.ops_seen;
            self.ops_seen = ops;
            (self.start, self.bytes) = (Instant::now(), 0);
        }
    }
}
