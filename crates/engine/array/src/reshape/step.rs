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

use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Reshape};
use nvraid_member::Member;
use nvraid_parity::Kernel;

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

/// Read `buf.len()` array bytes at `offset`, all in the old shape (at or
/// past a forwards reshape's position), with one read per old member: the
/// member rows that hold them, read whole, then each chunk copied out of
/// its member's rows (parity chunks in those rows are read and skipped).
/// A step's reads are a few large sequential ones, not one per chunk.
fn read_old_rows(
    reshape: &Reshape,
    members: &[&Member],
    buf: &mut [u8],
    offset: u64,
) -> Result<()> {
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
        member
            .read_at(&mut r, at)
            .map_err(|e| Error::io(member.spec(), e))?;
        rows.push(r);
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

/// Move the array bytes from `reshape`'s position to `to` (a forwards
/// reshape of a parity level or RAID 10 near; the caller checked
/// `step_is_safe(to)`): read them from the old shape, write whole new
/// stripes (rows), flush every member. `hit` is
/// called after each member write and after the flushes (the caller's
/// crash points).
pub(crate) fn move_rows(
    reshape: &Reshape,
    members: &[&Member],
    to: u64,
    kernel: Kernel,
    hit: &dyn Fn(),
) -> Result<()> {
    assert_eq!(
        reshape.direction(),
        Direction::Forwards,
        "invariant: steps move forwards"
    );
    let new = reshape.new_shape();
    if new.level().parity_chunks() == 0 {
        return move_copy_rows(reshape, members, to, hit);
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
        read_old_rows(reshape, members, &mut data[..readable as usize], from)?;
    }
    write_stripes(reshape, members, first, &data, kernel, hit)
}

/// Lay `data` (whole stripes of the new shape's data, in array order, from
/// stripe `first` on) out as the new shape's stripes with their parity,
/// write each member's rows at the new data offset, flush every member.
/// `hit` as in [`move_rows`].
pub(crate) fn write_stripes(
    reshape: &Reshape,
    members: &[&Member],
    first: u64,
    data: &[u8],
    kernel: Kernel,
    hit: &dyn Fn(),
) -> Result<()> {
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
        let member = members[role];
        let at = reshape
            .data_offset(nvraid_layout::Shape::New, role as u32)
            .expect("a new shape's member")
            + first * chunk;
        member
            .write_at(rows_out, at)
            .map_err(|e| Error::io(member.spec(), e))?;
        hit();
    }
    for member in members {
        member.flush().map_err(|e| Error::io(member.spec(), e))?;
    }
    hit();
    Ok(())
}

/// [`move_rows`] for a RAID 10 near layout: the new shape's rows that
/// hold the chunks from the position to `to` (whole rows: a row may also
/// hold chunks just below the position, already in the new shape, and
/// just past `to`, still in the old), each member's chunk slots filled
/// from the array's bytes (md's near layout: chunk `c`'s copy `k` is slot
/// `c * near + k`, on member `slot % members`, row `slot / members`),
/// zeros past the old shape's end.
fn move_copy_rows(reshape: &Reshape, members: &[&Member], to: u64, hit: &dyn Fn()) -> Result<()> {
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
        read_through(reshape, members, &mut data[..readable as usize], start)?;
    }
    write_copy_rows(reshape, members, first_row..end_row, &data, hit)
}

/// Write the new shape's RAID 10 near rows `rows` at its data offset,
/// each member's chunk slots filled from `data` (the array's chunks from
/// the first one those rows hold), then flush every member. `hit` as in
/// [`move_rows`].
pub(crate) fn write_copy_rows(
    reshape: &Reshape,
    members: &[&Member],
    rows: std::ops::Range<u64>,
    data: &[u8],
    hit: &dyn Fn(),
) -> Result<()> {
    let new = reshape.new_shape();
    let chunk = new.chunk_bytes().expect("RAID 10 has chunks");
    let n = u64::from(new.members());
    let near = u64::from(new.copies());
    let (first_row, end_row) = (rows.start, rows.end);
    let first_chunk = first_row * n / near;
    let c = chunk as usize;
    for role in 0..n {
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
            .map_err(|e| Error::io(member.spec(), e))?;
        hit();
    }
    for member in members {
        member.flush().map_err(|e| Error::io(member.spec(), e))?;
    }
    hit();
    Ok(())
}
