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

use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Reshape};
use nvraid_member::Member;
use nvraid_parity::{Block, Kernel, Stripe};

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

/// Read `buf.len()` array bytes at `offset` through `reshape`'s map from
/// `members` (by role; copy 0 of each piece).
pub(crate) fn read_through(
    reshape: &Reshape,
    members: &[&Member],
    buf: &mut [u8],
    offset: u64,
) -> Result<()> {
    let mut at = 0usize;
    for piece in reshape.pieces(offset, buf.len() as u64) {
        let place = reshape.locate(&piece, 0);
        let member = members[place.member as usize];
        member
            .read_at(&mut buf[at..at + piece.len as usize], place.member_offset)
            .map_err(|e| Error::io(member.spec(), e))?;
        at += piece.len as usize;
    }
    Ok(())
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
    let mut at = 0usize;
    for piece in reshape.pieces(offset, buf.len() as u64) {
        let failed = match piece.shape {
            nvraid_layout::Shape::Old => failed.old,
            nvraid_layout::Shape::New => failed.new,
        };
        let copies = reshape.geometry(piece.shape).copies().max(1);
        let place = (0..copies)
            .map(|copy| reshape.locate(&piece, copy))
            .find(|place| !is_failed(failed, place.member))
            .unwrap_or_else(|| reshape.locate(&piece, 0));
        let member = members[place.member as usize];
        member
            .read_at(&mut buf[at..at + piece.len as usize], place.member_offset)
            .map_err(|e| failure(place.member, member, e))?;
        at += piece.len as usize;
    }
    Ok(())
}

/// Read `buf.len()` array bytes at `offset`, all in the old shape (at or
/// past a forwards reshape's position), with one read per old member: the
/// member rows that hold them, read whole, then each chunk copied out of
/// its member's rows (parity chunks in those rows are read and skipped).
/// A step's reads are a few large sequential ones, not one per chunk.
/// A failed member's rows are not read: its chunks of each row are
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
    let mut rows: Vec<AlignedBuf> = Vec::with_capacity(old.members() as usize);
    for role in 0..old.members() {
        let member = members[role as usize];
        let at = reshape
            .data_offset(nvraid_layout::Shape::Old, role)
            .expect("an old shape's member")
            + first_row;
        let mut r = AlignedBuf::zeroed(span);
        if !is_failed(failed, role) {
            member
                .read_at(&mut r, at)
                .map_err(|e| failure(role, member, e))?;
        }
        rows.push(r);
    }
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
    rows: &mut [AlignedBuf],
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
/// called after each member write and after the flushes (the caller's
/// crash points). Members failed in `failed` (by role) are read around
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
    let mut data = AlignedBuf::zeroed((rows * unit) as usize);
    let readable = old_end.min(from + rows * unit).saturating_sub(from);
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
    write_stripes(reshape, members, first, &data, unreadable.new, kernel, hit)
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
    let mut out: Vec<AlignedBuf> = (0..new.members())
        .map(|_| AlignedBuf::zeroed(rows as usize * c))
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
    for (role, rows_out) in out.iter().enumerate() {
        if is_failed(failed, role as u32) {
            continue;
        }
        let member = members[role];
        let at = reshape
            .data_offset(nvraid_layout::Shape::New, role as u32)
            .expect("a new shape's member")
            + first * chunk;
        member
            .write_at(rows_out, at)
            .map_err(|e| failure(role as u32, member, e))?;
        hit();
    }
    flush_all(members, failed)?;
    hit();
    Ok(())
}

/// Flush every member not failed.
fn flush_all(members: &[&Member], failed: &[bool]) -> StepResult<()> {
    for (role, member) in members.iter().enumerate() {
        if !is_failed(failed, role as u32) {
            member
                .flush()
                .map_err(|e| failure(role as u32, member, e))?;
        }
    }
    Ok(())
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
    for role in 0..n {
        if is_failed(failed, role as u32) {
            continue;
        }
        let mut rows_out = AlignedBuf::zeroed(((end_row - first_row) * chunk) as usize);
        for row in first_row..end_row {
            let slot_chunk = (row * n + role) / near;
            let at = ((slot_chunk - first_chunk) * chunk) as usize;
            let out = ((row - first_row) * chunk) as usize;
            rows_out[out..out + c].copy_from_slice(&data[at..at + c]);
        }
        let member = members[role as usize];
        let at = reshape
            .data_offset(nvraid_layout::Shape::New, role as u32)
            .expect("a new shape's member")
            + first_row * chunk;
        member
            .write_at(&rows_out, at)
            .map_err(|e| failure(role as u32, member, e))?;
        hit();
    }
    flush_all(members, failed)?;
    hit();
    Ok(())
}
