//! One step of a reshape, and reading through a reshape: the member I/O.
//!
//! A step moves the array bytes from the recorded position to a new one
//! (forwards): it reads them from the old shape, lays whole stripes of the
//! new shape out in memory (data, then P, and Q for RAID 6; bytes past the
//! old shape's end are zeros, as md fills them), writes each member's rows
//! at the new shape's data offset, and flushes every member. Only then may
//! the caller record the new position. `Reshape::step_is_safe` says which
//! steps leave every byte of the old shape not yet recorded as moved
//! intact, so a crash anywhere inside a step loses nothing.
//!
//! A step may run with members failed (`failed`, by role): it reads
//! around them (a RAID 4/5/6 row rebuilt from the row's other chunks and
//! parity, a RAID 10 chunk from another copy) and writes nothing to them.
//! A member whose I/O fails stops the step with [`MemberFailure`] naming
//! its role; the caller records it failed and redoes the step.
//!
//! A step's member I/O goes in batches ([`nvraid_member::batch`]): its
//! reads of every member in flight together, then its writes of every
//! member together, then every member's flush together; a batch ends only
//! when all of its operations have. When several fail, the failure
//! reported is the first in the batch's order (role order; piece order for
//! the reads through the map), the one the operations done one after
//! another would have met first. The crash points between writes are
//! passed as each write completes, the last after the flushes.
//!
//! A step's buffers are made for it, or, inside a [`KeptBuffers`] scope
//! (a reshape's loop of steps), taken from the ones the thread's earlier
//! steps gave back: making them afresh each step (zeroed, on fresh pages)
//! cost a third of an idle grow's CPU.

use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Reshape};
use nvraid_member::batch::{run_together, Io, Transfer};
use nvraid_member::Member;
use nvraid_parity::{Block, Kernel, Stripe};

thread_local! {
    /// Buffers kept for this thread's next step, while a [`KeptBuffers`]
    /// scope is open (its depth, the buffers).
    static KEPT: std::cell::RefCell<(usize, Vec<AlignedBuf>)> =
        const { std::cell::RefCell::new((0, Vec::new())) };
}

/// The most bytes of buffers a thread keeps between its steps (the
/// default 16 MiB step of a wide RAID 6 needs about four times that).
const KEEP_BYTES: usize = 128 << 20;

/// While one lives, the steps run on this thread give their buffers back
/// for the next step (up to [`KEEP_BYTES`]); when the last one ends, the
/// kept buffers are freed. Outside one, each step makes its own.
pub(crate) struct KeptBuffers(std::marker::PhantomData<*const ()>);

impl KeptBuffers {
    pub(crate) fn on_this_thread() -> KeptBuffers {
        KEPT.with(|k| k.borrow_mut().0 += 1);
        KeptBuffers(std::marker::PhantomData)
    }
}

impl Drop for KeptBuffers {
    fn drop(&mut self) {
        let freed = KEPT.with(|k| {
            let mut k = k.borrow_mut();
            k.0 -= 1;
            match k.0 {
                0 => std::mem::take(&mut k.1),
                _ => Vec::new(),
            }
        });
        drop(freed);
    }
}

/// A step's buffer: the first `len` bytes of one this thread kept or made
/// for it.
pub(crate) struct StepBuf {
    buf: AlignedBuf,
    len: usize,
}

impl std::ops::Deref for StepBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for StepBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

/// A buffer of `len` bytes for a step that writes every byte of it before
/// reading it: the smallest one this thread kept that holds `len` (its
/// start holding an earlier step's bytes), or a new one (zeroed). A
/// grow's steps widen as it goes (each must leave the bytes not yet moved
/// intact), so a buffer kept from one step is often too small for the
/// next; the larger ones replace them.
fn step_buf(len: usize) -> StepBuf {
    let kept = KEPT.with(|k| {
        let mut k = k.borrow_mut();
        let at = (0..k.1.len())
            .filter(|&i| k.1[i].len() >= len)
            .min_by_key(|&i| k.1[i].len())?;
        Some(k.1.swap_remove(at))
    });
    StepBuf {
        buf: kept.unwrap_or_else(|| AlignedBuf::zeroed(len)),
        len,
    }
}

/// Give a step's buffers back for the next step, inside a [`KeptBuffers`]
/// scope; past [`KEEP_BYTES`], the smallest kept are freed first.
fn give_back(bufs: impl IntoIterator<Item = StepBuf>) {
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        if k.0 == 0 {
            return;
        }
        k.1.extend(bufs.into_iter().map(|b| b.buf));
        k.1.sort_by_key(|b| std::cmp::Reverse(b.len()));
        let mut held = 0;
        k.1.retain(|b| {
            held += b.len();
            held <= KEEP_BYTES
        });
    });
}

/// A step stopped by one member's I/O error.
#[derive(Debug)]
pub(crate) struct MemberFailure {
    /// The member's role (in the larger of the two shapes).
    pub(crate) role: u32,
    pub(crate) error: Error,
}

/// The result of a step's member I/O.
pub(crate) type StepResult<T> = std::result::Result<T, MemberFailure>;

fn failure(role: u32, member: &Member, e: std::io::Error) -> MemberFailure {
    MemberFailure {
        role,
        error: Error::io(member.spec(), e),
    }
}

/// The roles whose blocks a step must not read, by shape: a failed member
/// in both; in the old shape also a member that holds none of it (md's
/// RAID 4 of a RAID 0 grow: the new member in the old parity's role).
/// A step writes to no member failed in the new shape.
#[derive(Clone, Copy)]
pub(crate) struct Unreadable<'a> {
    pub(crate) old: &'a [bool],
    pub(crate) new: &'a [bool],
}

/// Whether role `role` is failed (`failed` may be shorter: not failed).
fn is_failed(failed: &[bool], role: u32) -> bool {
    failed.get(role as usize).copied().unwrap_or(false)
}

/// Run `ops` (each with the role of its member) together, calling `ok(i)`
/// as the `i`-th completes; the failure of the first in `ops`' order that
/// failed, once all have finished.
fn together(ops: Vec<(u32, Transfer<'_>)>, ok: &mut dyn FnMut(usize)) -> StepResult<()> {
    let roles: Vec<(u32, &Member)> = ops.iter().map(|(role, t)| (*role, t.member)).collect();
    let mut first: Option<(usize, std::io::Error)> = None;
    run_together(
        ops.into_iter().map(|(_, t)| t).collect(),
        &mut |i, result| match result {
            Ok(()) => ok(i),
            Err(e) => {
                if first.as_ref().is_none_or(|(j, _)| i < *j) {
                    first = Some((i, e));
                }
            }
        },
    );
    match first {
        None => Ok(()),
        Some((i, e)) => {
            let (role, member) = roles[i];
            Err(failure(role, member, e))
        }
    }
}

/// Read `buf.len()` array bytes at `offset` through `reshape`'s map from
/// `members` (by role; copy 0 of each piece), every piece's read in flight
/// together.
pub(crate) fn read_through(
    reshape: &Reshape,
    members: &[&Member],
    buf: &mut [u8],
    offset: u64,
) -> Result<()> {
    let mut ops = Vec::new();
    let mut rest = buf;
    for piece in reshape.pieces(offset, rest.len() as u64) {
        let place = reshape.locate(&piece, 0);
        let (this, after) = rest.split_at_mut(piece.len as usize);
        rest = after;
        ops.push((
            place.member,
            Transfer {
                member: members[place.member as usize],
                offset: place.member_offset,
                io: Io::Read(this),
            },
        ));
    }
    together(ops, &mut |_| {}).map_err(|f| f.error)
}

/// [`read_through`] around the members failed (by role; `failed.old` in
/// the old shape, `failed.new` in the new): each piece from the first of
/// its copies on a member not failed (RAID 10; levels of one copy need
/// every member they read).
pub(crate) fn read_around(
    reshape: &Reshape,
    members: &[&Member],
    failed: Unreadable,
    buf: &mut [u8],
    offset: u64,
) -> StepResult<()> {
    let mut ops = Vec::new();
    let mut rest = buf;
    for piece in reshape.pieces(offset, rest.len() as u64) {
        let failed = match piece.shape {
            nvraid_layout::Shape::Old => failed.old,
            nvraid_layout::Shape::New => failed.new,
        };
        let copies = reshape.geometry(piece.shape).copies().max(1);
        let place = (0..copies)
            .map(|copy| reshape.locate(&piece, copy))
            .find(|place| !is_failed(failed, place.member))
            .unwrap_or_else(|| reshape.locate(&piece, 0));
        let (this, after) = rest.split_at_mut(piece.len as usize);
        rest = after;
        ops.push((
            place.member,
            Transfer {
                member: members[place.member as usize],
                offset: place.member_offset,
                io: Io::Read(this),
            },
        ));
    }
    together(ops, &mut |_| {})
}

/// Read `buf.len()` array bytes at `offset`, all in the old shape (at or
/// past a forwards reshape's position), with one read per old member: the
/// member rows that hold them, read whole, then each chunk copied out of
/// its member's rows (parity chunks in those rows are read and skipped).
/// A step's reads are a few large sequential ones, not one per chunk, all
/// in flight together. A failed member's rows are not read: its chunks of each row are
/// rebuilt from the row's other chunks and parity.
fn read_old_rows(
    reshape: &Reshape,
    members: &[&Member],
    failed: &[bool],
    kernel: Kernel,
    buf: &mut [u8],
    offset: u64,
) -> StepResult<()> {
    let old = reshape.old();
    let end = offset + buf.len() as u64;
    assert!(
        reshape.direction() == Direction::Forwards && offset >= reshape.position(),
        "invariant: the bytes read are all in the old shape"
    );
    assert!(end <= old.array_bytes(), "invariant: within the old shape");
    let chunk = old.chunk_bytes().expect("the levels reshaped have chunks");
    // Member rows are in array order: the first byte's row starts them,
    // the last byte's row ends them.
    let first_row = old.locate(offset, 0).member_offset / chunk * chunk;
    let last_row = old.locate(end - 1, 0).member_offset / chunk * chunk;
    let span = (last_row + chunk - first_row) as usize;
    // Every byte copied out below is read, or rebuilt from the bytes read.
    let mut rows: Vec<StepBuf> = (0..old.members()).map(|_| step_buf(span)).collect();
    let reads = rows
        .iter_mut()
        .zip(0..old.members())
        .filter(|(_, role)| !is_failed(failed, *role))
        .map(|(r, role)| {
            let at = reshape
                .data_offset(nvraid_layout::Shape::Old, role)
                .expect("an old shape's member")
                + first_row;
            let member = members[role as usize];
            (
                role,
                Transfer {
                    member,
                    offset: at,
                    io: Io::Read(r),
                },
            )
        })
        .collect();
    together(reads, &mut |_| {})?;
    if (0..old.members()).any(|role| is_failed(failed, role)) {
        rebuild_rows(reshape, failed, kernel, &mut rows, first_row / chunk);
    }
    let mut at = offset;
    while at < end {
        let len = (chunk - at % chunk).min(end - at);
        let place = old.locate(at, 0);
        let from = (place.member_offset - first_row) as usize;
        let to = (at - offset) as usize;
        buf[to..to + len as usize]
            .copy_from_slice(&rows[place.member as usize][from..from + len as usize]);
        at += len;
    }
    give_back(rows);
    Ok(())
}

/// Rebuild the failed members' chunks in the old shape's member rows
/// `rows` (by role, each `rows[0].len()` bytes from stripe `first`) from
/// each stripe's other chunks. The caller checked that the old shape has
/// every byte without them (at most as many failed as a stripe has
/// parity chunks).
fn rebuild_rows(
    reshape: &Reshape,
    failed: &[bool],
    kernel: Kernel,
    rows: &mut [StepBuf],
    first: u64,
) {
    let old = reshape.old();
    let map = old
        .level()
        .stripe_map(old.members())
        .expect("invariant: rows are rebuilt for parity levels only");
    let c = old.chunk_bytes().expect("parity levels have chunks") as usize;
    let count = rows[0].len() / c;
    for k in 0..count {
        let stripe = first + k as u64;
        let blocks = map.stripe(stripe);
        let raid6 = blocks.q.is_some();
        // Q's sum takes the data in md's member order.
        let slot = |d: usize| {
            if raid6 {
                map.q_slot(stripe, d as u32)
            } else {
                d
            }
        };
        let mut lost = Vec::new();
        for (d, &m) in blocks.data.iter().enumerate() {
            if is_failed(failed, m) {
                lost.push(Block::Data(slot(d)));
            }
        }
        if lost.is_empty() {
            continue; // only parity lost: the data is all there
        }
        if is_failed(failed, blocks.p) {
            lost.push(Block::P);
        }
        if blocks.q.is_some_and(|q| is_failed(failed, q)) {
            lost.push(Block::Q);
        }
        let mut chunks: Vec<Option<&mut [u8]>> = rows
            .iter_mut()
            .map(|r| Some(&mut r[k * c..(k + 1) * c]))
            .collect();
        let mut data: Vec<Option<&mut [u8]>> = (0..blocks.data.len()).map(|_| None).collect();
        for (d, &m) in blocks.data.iter().enumerate() {
            data[slot(d)] = chunks[m as usize].take();
        }
        let mut stripe_blocks = Stripe {
            data: data.into_iter().map(|d| d.expect("every slot")).collect(),
            p: chunks[blocks.p as usize].take().expect("P's member"),
            q: blocks
                .q
                .map(|q| chunks[q as usize].take().expect("Q's member")),
        };
        stripe_blocks
            .recover(kernel, &lost)
            .expect("invariant: no more members failed than the parity covers");
    }
}

/// Move the array bytes from `reshape`'s position to `to` (a forwards
/// reshape of a parity level or RAID 10 near; the caller checked
/// `step_is_safe(to)`): read them from the old shape, write whole new
/// stripes (rows), flush every member. `hit` is
/// called as each member write completes and after the flushes (the
/// caller's crash points). Members failed in `failed` (by role) are read around
/// and not written.
pub(crate) fn move_rows(
    reshape: &Reshape,
    members: &[&Member],
    unreadable: Unreadable,
    to: u64,
    kernel: Kernel,
    hit: &dyn Fn(),
) -> StepResult<()> {
    assert_eq!(
        reshape.direction(),
        Direction::Forwards,
        "invariant: steps move forwards"
    );
    let new = reshape.new_shape();
    if new.level().parity_chunks() == 0 {
        return move_copy_rows(reshape, members, unreadable, to, hit);
    }
    let map = new
        .level()
        .stripe_map(new.members())
        .expect("invariant: a parity reshape");
    let chunk = new.chunk_bytes().expect("parity levels have chunks");
    let data_per = u64::from(map.data_per_stripe());
    let unit = chunk * data_per;
    let from = reshape.position();
    assert!(
        from.is_multiple_of(unit),
        "invariant: steps start on a stripe"
    );
    let first = from / unit;
    let rows = to.div_ceil(unit) - first;
    let old_end = reshape.old().array_bytes();
    // The stripes' data, in array order; zeros past the old shape's end.
    let mut data = step_buf((rows * unit) as usize);
    let readable = old_end.min(from + rows * unit).saturating_sub(from);
    data[readable as usize..].fill(0);
    if readable > 0 {
        read_old_rows(
            reshape,
            members,
            unreadable.old,
            kernel,
            &mut data[..readable as usize],
            from,
        )?;
    }
    write_stripes(reshape, members, first, &data, unreadable.new, kernel, hit)?;
    give_back([data]);
    Ok(())
}

/// Lay `data` (whole stripes of the new shape's data, in array order, from
/// stripe `first` on) out as the new shape's stripes with their parity,
/// write each member's rows at the new data offset (none to a member
/// `failed` by role), flush every member written. `hit` as in
/// [`move_rows`].
pub(crate) fn write_stripes(
    reshape: &Reshape,
    members: &[&Member],
    first: u64,
    data: &[u8],
    failed: &[bool],
    kernel: Kernel,
    hit: &dyn Fn(),
) -> StepResult<()> {
    let new = reshape.new_shape();
    let map = new
        .level()
        .stripe_map(new.members())
        .expect("invariant: a parity reshape");
    let chunk = new.chunk_bytes().expect("parity levels have chunks");
    let unit = chunk * u64::from(map.data_per_stripe());
    assert!(
        (data.len() as u64).is_multiple_of(unit),
        "invariant: whole stripes"
    );
    let rows = data.len() as u64 / unit;
    let c = chunk as usize;
    // Every row of every member is written below: each stripe's data
    // chunks, P, and Q for RAID 6 are all of its members.
    let mut out: Vec<StepBuf> = (0..new.members())
        .map(|_| step_buf(rows as usize * c))
        .collect();
    let mut p = vec![0u8; c];
    let mut q = vec![0u8; c];
    for row in 0..rows {
        let stripe = first + row;
        let blocks = map.stripe(stripe);
        let base = (row * unit) as usize;
        let chunk_of = |d: usize| &data[base + d * c..base + (d + 1) * c];
        for (d, &member) in blocks.data.iter().enumerate() {
            out[member as usize][row as usize * c..(row as usize + 1) * c]
                .copy_from_slice(chunk_of(d));
        }
        match blocks.q {
            None => {
                let all: Vec<&[u8]> = (0..blocks.data.len()).map(chunk_of).collect();
                nvraid_parity::gen_p(kernel, &all, &mut p);
            }
            Some(q_member) => {
                // md's Q sums the data in its own order of the members.
                let mut ordered: Vec<&[u8]> = vec![&[]; blocks.data.len()];
                for d in 0..blocks.data.len() {
                    ordered[map.q_slot(stripe, d as u32)] = chunk_of(d);
                }
                nvraid_parity::gen_pq(kernel, &ordered, &mut p, &mut q);
                out[q_member as usize][row as usize * c..(row as usize + 1) * c]
                    .copy_from_slice(&q);
            }
        }
        out[blocks.p as usize][row as usize * c..(row as usize + 1) * c].copy_from_slice(&p);
    }
    let writes = out
        .iter()
        .zip(0u32..)
        .filter(|(_, role)| !is_failed(failed, *role))
        .map(|(rows_out, role)| {
            let at = reshape
                .data_offset(nvraid_layout::Shape::New, role)
                .expect("a new shape's member")
                + first * chunk;
            let member = members[role as usize];
            (
                role,
                Transfer {
                    member,
                    offset: at,
                    io: Io::Write(rows_out),
                },
            )
        })
        .collect();
    together(writes, &mut |_| hit())?;
    give_back(out);
    flush_all(members, failed)?;
    hit();
    Ok(())
}

/// Flush every member not failed, all together.
fn flush_all(members: &[&Member], failed: &[bool]) -> StepResult<()> {
    let flushes = members
        .iter()
        .zip(0u32..)
        .filter(|(_, role)| !is_failed(failed, *role))
        .map(|(member, role)| {
            (
                role,
                Transfer {
                    member,
                    offset: 0,
                    io: Io::Flush,
                },
            )
        })
        .collect();
    together(flushes, &mut |_| {})
}

/// [`move_rows`] for a RAID 10 near layout: the new shape's rows that
/// hold the chunks from the position to `to` (whole rows: a row may also
/// hold chunks just below the position, already in the new shape, and
/// just past `to`, still in the old), each member's chunk slots filled
/// from the array's bytes (md's near layout: chunk `c`'s copy `k` is slot
/// `c * near + k`, on member `slot % members`, row `slot / members`),
/// zeros past the old shape's end.
fn move_copy_rows(
    reshape: &Reshape,
    members: &[&Member],
    unreadable: Unreadable,
    to: u64,
    hit: &dyn Fn(),
) -> StepResult<()> {
    let new = reshape.new_shape();
    let chunk = new.chunk_bytes().expect("RAID 10 has chunks");
    let n = u64::from(new.members());
    let near = u64::from(new.copies());
    let from = reshape.position();
    let first_row = (from / chunk) * near / n;
    let end_row = (to.div_ceil(chunk) * near).div_ceil(n);
    let first_chunk = first_row * n / near;
    let end_chunk = (end_row * n).div_ceil(near);
    let start = first_chunk * chunk;
    let mut data = AlignedBuf::zeroed(((end_chunk - first_chunk) * chunk) as usize);
    let readable = reshape
        .old()
        .array_bytes()
        .min(end_chunk * chunk)
        .saturating_sub(start);
    if readable > 0 {
        read_around(
            reshape,
            members,
            unreadable,
            &mut data[..readable as usize],
            start,
        )?;
    }
    write_copy_rows(
        reshape,
        members,
        first_row..end_row,
        &data,
        unreadable.new,
        hit,
    )
}

/// Write the new shape's RAID 10 near rows `rows` at its data offset,
/// each member's chunk slots filled from `data` (the array's chunks from
/// the first one those rows hold), none to a member `failed` by role,
/// then flush every member written. `hit` as in [`move_rows`].
pub(crate) fn write_copy_rows(
    reshape: &Reshape,
    members: &[&Member],
    rows: std::ops::Range<u64>,
    data: &[u8],
    failed: &[bool],
    hit: &dyn Fn(),
) -> StepResult<()> {
    let new = reshape.new_shape();
    let chunk = new.chunk_bytes().expect("RAID 10 has chunks");
    let n = u64::from(new.members());
    let near = u64::from(new.copies());
    let (first_row, end_row) = (rows.start, rows.end);
    let first_chunk = first_row * n / near;
    let c = chunk as usize;
    let written: Vec<(u32, AlignedBuf)> = (0..n as u32)
        .filter(|&role| !is_failed(failed, role))
        .map(|role| {
            let mut rows_out = AlignedBuf::zeroed(((end_row - first_row) * chunk) as usize);
            for row in first_row..end_row {
                let slot_chunk = (row * n + u64::from(role)) / near;
                let at = ((slot_chunk - first_chunk) * chunk) as usize;
                let out = ((row - first_row) * chunk) as usize;
                rows_out[out..out + c].copy_from_slice(&data[at..at + c]);
            }
            (role, rows_out)
        })
        .collect();
    let writes = written
        .iter()
        .map(|(role, rows_out)| {
            let at = reshape
                .data_offset(nvraid_layout::Shape::New, *role)
                .expect("a new shape's member")
                + first_row * chunk;
            let member = members[*role as usize];
            (
                *role,
                Transfer {
                    member,
                    offset: at,
                    io: Io::Write(rows_out),
                },
            )
        })
        .collect();
    together(writes, &mut |_| hit())?;
    flush_all(members, failed)?;
    hit();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvraid_layout::parity::ParityLayout;
    use nvraid_layout::{Geometry, Level};
    use nvraid_member::batch::one_by_one;
    use nvraid_member::OpenOptions;
    use std::cell::Cell;

    const CHUNK: u64 = 64 << 10;
    const MEMBER_DATA: u64 = 1 << 20;
    /// The old shape's data offset; the new shape's is 0.
    const OLD_AT: u64 = 2 << 20;
    const MEMBER_FILE: u64 = 4 << 20;

    fn raid5(members: u32) -> Geometry {
        let level = Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        };
        Geometry::new(level, members, CHUNK, MEMBER_DATA).unwrap()
    }

    /// A RAID 5 growing from 4 to 5 members, at `position`.
    fn grow_at(position: u64) -> Reshape {
        Reshape::new(
            raid5(4),
            raid5(5),
            position,
            Direction::Forwards,
            vec![OLD_AT; 4],
            vec![0; 5],
        )
        .unwrap()
    }

    /// Five member files: the first four hold `data` in the old shape
    /// (laid out with its parity by the step's own writer, through a
    /// "reshape" from the old shape to itself), the fifth is blank.
    fn members(dir: &std::path::Path, data: &[u8]) -> Vec<std::path::PathBuf> {
        let paths: Vec<_> = (0..5).map(|i| dir.join(format!("m{i}"))).collect();
        for p in &paths {
            std::fs::File::create(p)
                .unwrap()
                .set_len(MEMBER_FILE)
                .unwrap();
        }
        let opened = open(&paths, &[]);
        let refs: Vec<&Member> = opened.iter().take(4).collect();
        let same = Reshape::new(
            raid5(4),
            raid5(4),
            0,
            Direction::Forwards,
            vec![OLD_AT; 4],
            vec![OLD_AT; 4],
        )
        .unwrap();
        write_stripes(&same, &refs, 0, data, &[], Kernel::best(), &|| {}).unwrap();
        paths
    }

    /// The members at `paths`, those in `read_only` (by role) opened
    /// without write access (the kernel refuses their writes).
    fn open(paths: &[std::path::PathBuf], read_only: &[usize]) -> Vec<Member> {
        paths
            .iter()
            .enumerate()
            .map(|(role, p)| {
                let options = OpenOptions {
                    write: !read_only.contains(&role),
                    ..OpenOptions::default()
                };
                Member::open(p.to_str().unwrap(), options).unwrap()
            })
            .collect()
    }

    fn random(len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len];
        nvraid_io::random::fill(&mut data).unwrap();
        data
    }

    const NONE: Unreadable = Unreadable { old: &[], new: &[] };

    #[test]
    fn a_step_reads_writes_and_flushes_every_member_together() {
        let dir = tempfile::tempdir().unwrap();
        let data = random(raid5(4).array_bytes() as usize);
        let paths = members(dir.path(), &data);
        let opened = open(&paths, &[]);
        let refs: Vec<&Member> = opened.iter().collect();
        // Four new stripes of four data chunks each.
        let to = 4 * 4 * CHUNK;
        let hits = Cell::new(0);
        let before = nvraid_io::batch::ring_operations();
        move_rows(&grow_at(0), &refs, NONE, to, Kernel::best(), &|| {
            hits.set(hits.get() + 1)
        })
        .unwrap();
        // One read of each old member's rows, one write and one flush of
        // each new member, all on the ring.
        assert_eq!(nvraid_io::batch::ring_operations() - before, 4 + 5 + 5);
        // The crash point: at each member write, then after the flushes.
        assert_eq!(hits.get(), 5 + 1);
        let mut back = vec![0u8; data.len()];
        read_through(&grow_at(to), &refs, &mut back, 0).unwrap();
        assert_eq!(back, data);
        // The same step one operation at a time leaves the same bytes.
        let serial_dir = tempfile::tempdir().unwrap();
        let serial_paths = members(serial_dir.path(), &data);
        let serial = open(&serial_paths, &[]);
        let serial_refs: Vec<&Member> = serial.iter().collect();
        one_by_one(|| move_rows(&grow_at(0), &serial_refs, NONE, to, Kernel::best(), &|| {}))
            .unwrap();
        for (a, b) in paths.iter().zip(&serial_paths) {
            assert!(std::fs::read(a).unwrap() == std::fs::read(b).unwrap());
        }
    }

    /// A whole grow in equal steps, the buffers kept between them (each
    /// step's taken holding the last one's bytes), writes every member as
    /// the same grow with fresh buffers does: the step crossing the old
    /// shape's end still lays zeros past it, and the buffers come back.
    #[test]
    fn steps_reusing_their_buffers_write_what_fresh_buffers_write() {
        let data = random(raid5(4).array_bytes() as usize);
        let end = raid5(5).array_bytes();
        // Five new stripes a step: the third crosses the old end part-way,
        // the fourth is all past it.
        let step = 5 * 4 * CHUNK;
        let grow = |kept: bool| {
            let dir = tempfile::tempdir().unwrap();
            let paths = members(dir.path(), &data);
            let opened = open(&paths, &[]);
            let refs: Vec<&Member> = opened.iter().collect();
            let scope = kept.then(KeptBuffers::on_this_thread);
            let mut at = 0;
            while at < end {
                let to = (at + step).min(end);
                move_rows(&grow_at(at), &refs, NONE, to, Kernel::best(), &|| {}).unwrap();
                let held = KEPT.with(|k| k.borrow().1.len());
                assert_eq!(held > 0, kept, "buffers kept after the step to {to}");
                at = to;
            }
            drop(scope);
            assert!(KEPT.with(|k| k.borrow().1.is_empty()), "freed at the end");
            // The new shape alone (a "reshape" from it to itself).
            let new = Reshape::new(
                raid5(5),
                raid5(5),
                end,
                Direction::Forwards,
                vec![0; 5],
                vec![0; 5],
            )
            .unwrap();
            let mut back = vec![0u8; end as usize];
            read_through(&new, &refs, &mut back, 0).unwrap();
            assert!(back[..data.len()] == data[..], "kept {kept}: the data");
            assert!(
                back[data.len()..].iter().all(|&b| b == 0),
                "kept {kept}: zeros past the old end"
            );
            paths
                .iter()
                .map(|p| std::fs::read(p).unwrap())
                .collect::<Vec<_>>()
        };
        assert!(grow(true) == grow(false), "the members differ");
    }

    /// The step's failure (role, error kind) with members `read_only`
    /// refusing writes and `short` cut short (their reads meet the end).
    fn failed_step(
        read_only: &[usize],
        short: &[usize],
        serial: bool,
    ) -> (u32, std::io::ErrorKind) {
        let dir = tempfile::tempdir().unwrap();
        let data = random(raid5(4).array_bytes() as usize);
        let paths = members(dir.path(), &data);
        let opened = open(&paths, read_only);
        for &role in short {
            // Past the start of the old shape's rows.
            std::fs::OpenOptions::new()
                .write(true)
                .open(&paths[role])
                .unwrap()
                .set_len(OLD_AT + CHUNK)
                .unwrap();
        }
        let refs: Vec<&Member> = opened.iter().collect();
        let step = || move_rows(&grow_at(0), &refs, NONE, 16 * CHUNK, Kernel::best(), &|| {});
        let failed = if serial { one_by_one(step) } else { step() }.unwrap_err();
        let Error::Io { source, .. } = &failed.error else {
            panic!("not an I/O error: {:?}", failed.error);
        };
        (failed.role, source.kind())
    }

    #[test]
    fn a_member_failing_mid_batch_stops_the_step_as_one_by_one_did() {
        for (read_only, short) in [
            (&[2][..], &[][..]),
            (&[1, 4], &[]),
            (&[], &[3]),
            (&[0], &[1, 2]),
        ] {
            let together = failed_step(read_only, short, false);
            let serial = failed_step(read_only, short, true);
            assert_eq!(together, serial, "read-only {read_only:?}, short {short:?}");
            let first = short.first().or(read_only.first()).copied().unwrap();
            assert_eq!(together.0, first as u32);
        }
    }

    /// The step's failure with role 2 an NBD member (nbdkit serving its
    /// file behind the error filter, every write failing).
    fn remote_failed_step(serial: bool) -> (u32, std::io::ErrorKind) {
        let dir = tempfile::tempdir().unwrap();
        let data = random(raid5(4).array_bytes() as usize);
        let paths = members(dir.path(), &data);
        let server = nvraid_testing::nbdkit::Nbdkit::start(
            &dir.path().join("m2.sock"),
            [
                "--filter=error".to_string(),
                "file".to_string(),
                format!("file={}", paths[2].display()),
                "error-pwrite=EIO".to_string(),
                "error-pwrite-rate=100%".to_string(),
            ],
        );
        let mut opened = open(&paths, &[]);
        let options = OpenOptions {
            write: true,
            ..OpenOptions::default()
        };
        opened[2] = Member::open(&server.uri(), options).unwrap();
        let before = std::fs::read(&paths[2]).unwrap();
        let refs: Vec<&Member> = opened.iter().collect();
        let step = || move_rows(&grow_at(0), &refs, NONE, 16 * CHUNK, Kernel::best(), &|| {});
        let failed = if serial { one_by_one(step) } else { step() }.unwrap_err();
        // Its reads worked (the rows came back through it); no write landed.
        assert!(std::fs::read(&paths[2]).unwrap() == before);
        let Error::Io { source, .. } = &failed.error else {
            panic!("not an I/O error: {:?}", failed.error);
        };
        (failed.role, source.kind())
    }

    #[test]
    fn a_remote_member_failing_its_writes_in_the_batch_fails_the_step_as_before() {
        let together = remote_failed_step(false);
        assert_eq!(together, remote_failed_step(true));
        assert_eq!(together.0, 2);
    }
}
