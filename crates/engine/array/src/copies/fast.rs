//! The copies family's fast path (RAID 0/1/10): a request split at chunk
//! boundaries into parts, one per piece and copy written (or the copy
//! chosen for a read), merged into member operations; a read that lost
//! its member reissued on another copy.

use crate::array::Array;
use crate::copies::simple::least_loaded_copy;
use crate::fanout::{FanoutQueue, Part, Shape, SubOp, KIND_READ};
use std::io;
use std::sync::Arc;

/// The read policy's measure for one copy: this queue's operations in flight
/// on `member`, or `None` when the member is missing from the queue or may not
/// be read at `[at, at + len)` of its data area (failed, recovering there,
/// bad blocks).
fn read_load(
    array: &Array,
    data_offsets: &[Option<u64>],
    inflight: &[u32],
    member: usize,
    at: u64,
    len: u64,
) -> Option<u32> {
    data_offsets[member]?;
    array.readable(member, at, len).then(|| inflight[member])
}

impl FanoutQueue {
    /// Choose the copy to read: among readable copies, fewest of this
    /// worker's operations in flight on its member, ties broken by rotation
    /// (or the first readable copy while the array reads first copies).
    pub(crate) fn choose_copy(
        &mut self,
        geometry: &nvraid_layout::Geometry,
        logical_offset: u64,
        len: u64,
    ) -> Option<u32> {
        let Shape::Array(array) = &self.shape else {
            return Some(0);
        };
        if geometry.copies() == 1 && !array.read_limited() {
            return Some(0);
        }
        let first = array.first_copy_reads();
        if !first {
            self.rotor = self.rotor.wrapping_add(1);
        }
        let (data_offsets, inflight) = (&self.data_offsets, &self.inflight);
        let load = |member, at| read_load(array, data_offsets, inflight, member, at, len);
        least_loaded_copy(geometry, logical_offset, self.rotor, first, load)
    }

    /// Read each segment of the failed read `sub` from another readable
    /// copy (each segment is one piece, or part of one, so each is
    /// contiguous on any copy). False when a segment has no copy left.
    pub(crate) fn reissue_read(
        &mut self,
        geometry: &nvraid_layout::Geometry,
        array: &Array,
        sub: SubOp,
    ) -> io::Result<bool> {
        let mut member_offset = sub.member_offset;
        let mut moves = Vec::with_capacity(sub.seg_count as usize);
        for k in 0..sub.seg_count {
            let seg = sub.seg_first + k;
            let (_, len) = self.segs[seg as usize];
            let Some((logical, _)) = geometry.logical_of(sub.member, member_offset) else {
                return Ok(false);
            };
            let load = |member, at| {
                read_load(
                    array,
                    &self.data_offsets,
                    &self.inflight,
                    member,
                    at,
                    u64::from(len),
                )
            };
            let Some(copy) =
                least_loaded_copy(geometry, logical, 0, array.first_copy_reads(), load)
            else {
                return Ok(false);
            };
            moves.push((geometry.locate(logical, copy), seg, len));
            member_offset += u64::from(len);
        }
        for (at, seg, len) in moves {
            self.push_sub(SubOp {
                slot: sub.slot,
                member: at.member,
                kind: KIND_READ,
                dsync: false,
                member_offset: at.member_offset,
                seg_first: seg,
                seg_count: 1,
                len,
                done: 0,
                stripe: false,
                scratch: false,
            })?;
        }
        Ok(true)
    }

    /// Split a request into parts, one per piece and copy written (or the
    /// copy chosen for a read). False when a piece has no copy present.
    pub(crate) fn split(
        &mut self,
        geometry: &nvraid_layout::Geometry,
        write: bool,
        offset: u64,
        len: u32,
    ) -> bool {
        let mut buf_offset = 0u32;
        for piece in geometry.pieces(offset, u64::from(len)) {
            let copies = if write {
                0..geometry.copies()
            } else {
                let Some(copy) = self.choose_copy(geometry, piece.logical_offset, piece.len) else {
                    if !self.split_around_limits(geometry, piece, buf_offset) {
                        return false;
                    }
                    buf_offset += piece.len as u32;
                    continue;
                };
                copy..copy + 1
            };
            for copy in copies {
                let at = geometry.locate(piece.logical_offset, copy);
                // A read's copy is already known readable (`choose_copy`
                // looked, or with one copy there is no other: a member
                // holding the only copy is never marked faulty). Only
                // writes skip the members that failed.
                let failed = write
                    && match &self.shape {
                        Shape::Array(array) => array.is_faulty(at.member as usize),
                        Shape::Raw(_) => false,
                    };
                if self.data_offsets[at.member as usize].is_some() && !failed {
                    let part = Part {
                        member: at.member,
                        member_offset: at.member_offset,
                        buf_offset,
                        len: piece.len as u32,
                    };
                    self.parts.push(part);
                }
            }
            buf_offset += piece.len as u32;
        }
        true
    }

    /// Read a piece that no single copy may serve whole (bad blocks, a
    /// member being recovered) from several copies, split as
    /// [`Array::cover`] does. The rare path: it may allocate. False when some
    /// sector has no readable copy, or the request would need more member
    /// operations than a slot holds.
    pub(crate) fn split_around_limits(
        &mut self,
        geometry: &nvraid_layout::Geometry,
        piece: nvraid_layout::Piece,
        buf_offset: u32,
    ) -> bool {
        let Shape::Array(array) = &self.shape else {
            return false;
        };
        let array = Arc::clone(array);
        let (data_offsets, inflight) = (&self.data_offsets, &self.inflight);
        let mut found = Vec::new();
        let mut choose = |part: nvraid_layout::Piece| {
            let load = |member, at| read_load(&array, data_offsets, inflight, member, at, part.len);
            least_loaded_copy(
                geometry,
                part.logical_offset,
                0,
                array.first_copy_reads(),
                load,
            )
        };
        let sector = u64::from(array.sector_bytes());
        let covered = array.cover(
            piece,
            sector,
            &mut |part, copy| found.push((part, copy)),
            &mut choose,
        );
        if !covered || self.parts.len() + found.len() > self.segs_per_slot as usize {
            return false;
        }
        for (part, copy) in found {
            let at = geometry.locate(part.logical_offset, copy);
            self.parts.push(Part {
                member: at.member,
                member_offset: at.member_offset,
                buf_offset: buf_offset + (part.logical_offset - piece.logical_offset) as u32,
                len: part.len as u32,
            });
        }
        true
    }

    /// Turn the request's parts into member operations: parts that are
    /// adjacent on the same member become one vectored operation (a 1 MiB
    /// read of a 4-member RAID 0 with 64 KiB chunks is 4 operations, not 16).
    pub(crate) fn merge_and_push(&mut self, slot: u32, kind: u8, dsync: bool) -> io::Result<()> {
        self.parts
            .sort_unstable_by_key(|p| (p.member, p.member_offset));
        let seg_base = slot * self.segs_per_slot;
        let mut next_seg = seg_base;
        let mut i = 0;
        while i < self.parts.len() {
            let first = self.parts[i];
            let mut sub = SubOp {
                slot,
                member: first.member,
                kind,
                dsync,
                member_offset: first.member_offset,
                seg_first: next_seg,
                seg_count: 0,
                len: 0,
                done: 0,
                stripe: false,
                scratch: false,
            };
            while i < self.parts.len() {
                let part = self.parts[i];
                let adjacent = part.member == sub.member
                    && part.member_offset == sub.member_offset + u64::from(sub.len);
                if !adjacent || sub.seg_count as usize >= libc::UIO_MAXIOV as usize {
                    break;
                }
                self.segs[next_seg as usize] = (part.buf_offset, part.len);
                next_seg += 1;
                sub.seg_count += 1;
                sub.len += part.len;
                i += 1;
            }
            debug_assert!(next_seg <= seg_base + self.segs_per_slot);
            self.push_sub(sub)?;
        }
        Ok(())
    }
}
