//! The simple path's RAID 4/5/6 reads and writes: the same columns as the
//! fast path ([`super::fast`]), done one after another with synchronous
//! member I/O.

use super::plan::*;
use crate::array::Array;
use crate::error::{Error, Result};
use crate::slot::{is_member_failure, Slot};
use nvraid_parity::Kernel;

/// The simple path's RAID 4/5/6 reads and writes: the same columns as the
/// fast path, done one after another with synchronous member I/O.
impl Array {
    fn shape(&self) -> ParityShape {
        self.parity_family().shape
    }

    /// The parity family's state. Only the parity family's code calls
    /// this, and only on a RAID 4/5/6 (the personality chose it).
    pub(crate) fn parity_family(&self) -> &crate::personality::Parity {
        let Some(parity) = self.personality().parity() else {
            panic!("invariant: parity-family code runs on RAID 4/5/6 only");
        };
        parity
    }

    /// Whether stripe `stripe`'s parity may be trusted for a
    /// read-modify-write: the array is in sync there (not waiting for a
    /// resync after a crash, which must recompute it).
    pub(crate) fn parity_trusted(&self, shape: &ParityShape, stripe: u64) -> bool {
        if self.md_journal.as_ref().is_some_and(|j| j.replaying()) {
            return false;
        }
        self.resync_from()
            .is_none_or(|from| (stripe + 1) * shape.stripe_data_bytes() <= from)
    }

    /// Whether the blocks `lost` (beyond `role`, the one being rebuilt)
    /// include one whose member is present and working but lists the range
    /// as bad blocks.
    fn lost_to_bad_blocks(&self, shape: &ParityShape, lost: &TooManyLost, role: usize) -> bool {
        shape
            .lost_members(lost.stripe, lost.lost)
            .iter()
            .any(|&m| m as usize != role && self.is_usable(m as usize))
    }

    /// Whether a member other than `role` lists bad blocks in
    /// `[at, at + len)` of its data area.
    pub(crate) fn bad_blocks_beside(&self, role: usize, at: u64, len: u64) -> bool {
        (0..self.roles()).any(|m| {
            m != role
                && self
                    .slot(m)
                    .is_some_and(|s| !s.read_limit.no_bad_block_in(at, len))
        })
    }

    /// The error for a stripe that lost more blocks than its parity covers.
    pub(crate) fn too_many_lost(&self, shape: &ParityShape, lost: TooManyLost) -> Error {
        let members: Vec<String> = shape
            .lost_members(lost.stripe, lost.lost)
            .iter()
            .map(|&m| match self.slot(m as usize) {
                Some(slot) => slot.member.spec().to_string(),
                None => format!("role {m} (missing)"),
            })
            .collect();
        Error::NotStartable(format!(
            "stripe {} has lost {} blocks ({}), more than its {} parity block(s) can rebuild",
            lost.stripe,
            members.len(),
            members.join(", "),
            shape.parity
        ))
    }

    /// Read `buf` at `offset` of a parity array: data chunks straight from
    /// their members; chunks that cannot be read, rebuilt from the rest of
    /// their stripe (holding it, so no write changes it meanwhile).
    pub(crate) fn read_parity(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let shape = self.shape();
        let mut cols = Vec::new();
        shape.columns(offset, buf.len() as u64, &mut cols);
        for col in &mut cols {
            loop {
                let at = col.stripe * shape.chunk + u64::from(col.lo);
                let width = col.width() as u64;
                shape
                    .plan_read(col, |m| self.readable(m as usize, at, width))
                    .map_err(|lost| self.too_many_lost(&shape, lost))?;
                let held = col.mode == Mode::ReadRebuild;
                if held {
                    self.parity_family()
                        .locks
                        .lock_range(col.stripe, col.stripe);
                }
                let done = self.read_column(&shape, col, buf, offset);
                if held {
                    self.parity_family()
                        .locks
                        .unlock_range(col.stripe, col.stripe);
                }
                // Ok(false): a member failed meanwhile; plan again.
                if done? {
                    break;
                }
            }
        }
        Ok(())
    }

    /// One read column; false when a member failed (it is marked faulty:
    /// the caller plans the column again).
    fn read_column(
        &self,
        shape: &ParityShape,
        col: &Column,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<bool> {
        let mut scratch = vec![0u8; shape.scratch_len(col)];
        let mut reads = Vec::new();
        shape.reads(col, offset, 0, &mut reads);
        for io in &reads {
            let len = io.len as usize;
            let into = match io.at {
                Place::Request(at) => &mut buf[at..at + len],
                Place::Scratch(at) => &mut scratch[at..at + len],
            };
            if !self.member_io(io, |slot, at| slot.member.read_at(into, at))? {
                return Ok(false);
            }
        }
        shape.finish_read(Kernel::best(), col, buf, offset, &mut scratch);
        Ok(true)
    }

    /// Write `buf` at `offset` of a parity array (the caller has entered the
    /// barrier and set the write-intent bits). Returns the roles written.
    pub(crate) fn write_parity(&self, buf: &[u8], offset: u64) -> Result<Vec<bool>> {
        let shape = self.shape();
        let mut cols = Vec::new();
        shape.columns(offset, buf.len() as u64, &mut cols);
        let (first, last) = shape.stripes(offset, buf.len() as u64);
        let mut touched = vec![false; self.roles()];
        self.parity_family().locks.lock_range(first, last);
        let written = cols
            .iter_mut()
            .try_for_each(|col| self.write_column(&shape, col, buf, offset, &mut touched));
        self.parity_family().locks.unlock_range(first, last);
        written.map(|()| touched)
    }

    fn write_column(
        &self,
        shape: &ParityShape,
        col: &mut Column,
        buf: &[u8],
        offset: u64,
        touched: &mut [bool],
    ) -> Result<()> {
        let at = col.stripe * shape.chunk + u64::from(col.lo);
        let width = col.width() as u64;
        'plan: loop {
            let trusted = self.parity_trusted(shape, col.stripe);
            shape
                .plan_write(col, |m| self.readable(m as usize, at, width), trusted)
                .map_err(|lost| self.too_many_lost(shape, lost))?;
            let mut scratch = nvraid_io::AlignedBuf::zeroed(shape.scratch_len(col).max(1));
            let mut ios = Vec::new();
            shape.reads(col, offset, 0, &mut ios);
            for io in &ios {
                let Place::Scratch(at) = io.at else {
                    unreachable!("a write reads into scratch")
                };
                let into = &mut scratch[at..at + io.len as usize];
                if !self.member_io(io, |slot, at| slot.member.read_at(into, at))? {
                    continue 'plan;
                }
            }
            let ticket = self.log_column(shape, col, buf, offset, &mut scratch)?;
            let journaled = self.journal_column(shape, col, buf, offset, &mut scratch, ticket)?;
            if ticket.is_none() && journaled.is_none() {
                shape.compute(Kernel::best(), col, buf, offset, &mut scratch, None);
            }
            let journal_done = || {
                if let (Some(journal), Some(ticket)) = (&self.md_journal, journaled) {
                    journal.done(ticket);
                }
            };
            ios.clear();
            shape.writes(col, offset, 0, |m| self.is_usable(m as usize), &mut ios);
            let written = self.write_blocks(&ios, buf, &scratch, touched);
            if let (Some(ppl), Some(ticket)) = (&self.ppl, ticket) {
                ppl.done(ticket);
            }
            journal_done();
            return written;
        }
    }

    /// Issue one column's writes, every one of them even when some fail
    /// (so that what a failed write leaves behind is known: the blocks the
    /// others wrote). A member that fails is marked faulty; when the array
    /// cannot lose it, the column's range is recorded bad (see
    /// [`Array::write_failed`]) and the request fails.
    fn write_blocks(
        &self,
        ios: &[BlockIo],
        buf: &[u8],
        scratch: &[u8],
        touched: &mut [bool],
    ) -> Result<()> {
        let mut failed = Vec::new();
        let mut written = Vec::new();
        for (k, io) in ios.iter().enumerate() {
            if k > 0 {
                crate::failpoint::hit("stripe-write");
            }
            let len = io.len as usize;
            let from = match io.at {
                Place::Request(at) => &buf[at..at + len],
                Place::Scratch(at) => &scratch[at..at + len],
            };
            let role = io.member as usize;
            let slot = self.slot(role).expect("planned on a present member");
            match slot
                .member
                .write_at(from, slot.data_offset_bytes() + io.member_offset)
            {
                Ok(()) => {
                    touched[role] = true;
                    written.push(role);
                }
                Err(e) if is_member_failure(&e) => failed.push((*io, e)),
                Err(e) => return Err(Error::io(slot.member.spec(), e)),
            }
        }
        for (io, e) in &failed {
            let (role, len) = (io.member as usize, u64::from(io.len));
            self.write_failed(role, io.member_offset, len, e, &written)?;
        }
        Ok(())
    }

    /// What belongs in `role`'s member bytes `[at, end)` (its data area),
    /// rebuilt a region at a time (a rebuild with no clients to make way
    /// for): every other member's same bytes are read at once, one large
    /// read per member, all in flight together, and each stripe's block is recovered
    /// from them in place. The stripes are held meanwhile. `sources` holds
    /// buffers for the other members' bytes, kept by the caller from one
    /// region to the next.
    pub(crate) fn rebuild_range(
        &self,
        role: usize,
        at: u64,
        end: u64,
        out: &mut [u8],
        sources: &mut Vec<nvraid_io::AlignedBuf>,
    ) -> Result<()> {
        let shape = self.shape();
        let (first, last) = (at / shape.chunk, (end - 1) / shape.chunk);
        let members = (shape.data + shape.parity) as usize;
        let len = (end - at) as usize;
        self.parity_family().locks.lock_range(first, last);
        let rebuilt = (|| {
            if sources.len() < members || sources.iter().any(|b| b.len() < len) {
                *sources = (0..members)
                    .map(|_| nvraid_io::AlignedBuf::zeroed(len))
                    .collect();
            }
            let mut bufs = self.read_others(role, at, end, sources)?;
            let mut spare = vec![0u8; shape.chunk as usize];
            for stripe in first..=last {
                self.recover_stripe_part(
                    &shape,
                    role,
                    (at, end),
                    stripe,
                    &mut bufs,
                    out,
                    &mut spare,
                )?;
            }
            Ok(())
        })();
        self.parity_family().locks.unlock_range(first, last);
        rebuilt
    }

    /// Read `[at, end)` of every member but `role`'s that can be read there,
    /// all in flight together (`nvraid_member::batch`), into `sources`: the
    /// slice each member's bytes are in (`None`: not readable, or its member
    /// failed now and is marked faulty).
    fn read_others<'b>(
        &self,
        role: usize,
        at: u64,
        end: u64,
        sources: &'b mut [nvraid_io::AlignedBuf],
    ) -> Result<Vec<Option<&'b mut [u8]>>> {
        use nvraid_member::batch::{run_together, Io, Transfer};
        let len = (end - at) as usize;
        let mut bufs: Vec<Option<&mut [u8]>> = sources
            .iter_mut()
            .enumerate()
            .map(|(m, b)| (m != role && self.readable(m, at, end - at)).then(|| &mut b[..len]))
            .collect();
        let mut roles = Vec::new();
        let reads = bufs
            .iter_mut()
            .enumerate()
            .filter_map(|(m, buf)| buf.as_mut().map(|b| (m, b)))
            .map(|(m, buf)| {
                let Some(slot) = self.slot(m) else {
                    panic!("invariant: a readable member is present (role {m})");
                };
                roles.push(m);
                Transfer {
                    member: &slot.member,
                    offset: slot.data_offset_bytes() + at,
                    io: Io::Read(buf),
                }
            })
            .collect();
        let mut read: Vec<(usize, std::io::Result<()>)> = Vec::with_capacity(roles.len());
        run_together(reads, &mut |i, result| read.push((roles[i], result)));
        read.sort_by_key(|(m, _)| *m);
        for (m, result) in read {
            if !self.on_member(m, at, |_, _| result)? {
                bufs[m] = None;
            }
        }
        Ok(bufs)
    }

    /// Recover what `role` holds in `stripe`'s part of `[at, end)` into
    /// `out` (from `bufs`, the other members' bytes of the whole range; a
    /// second lost block of a RAID 6 goes to `spare`).
    #[allow(clippy::too_many_arguments)]
    fn recover_stripe_part(
        &self,
        shape: &ParityShape,
        role: usize,
        (at, end): (u64, u64),
        stripe: u64,
        bufs: &mut [Option<&mut [u8]>],
        out: &mut [u8],
        spare: &mut [u8],
    ) -> Result<()> {
        let members = (shape.data + shape.parity) as usize;
        let lo = at.max(stripe * shape.chunk);
        let hi = end.min((stripe + 1) * shape.chunk);
        let range = (lo - at) as usize..(hi - at) as usize;
        let target = shape.block_of(stripe, role as u32);
        let col = shape
            .rebuild_column(
                stripe,
                (lo % shape.chunk) as u32,
                (lo % shape.chunk + (hi - lo)) as u32,
                target,
                |m| bufs[m as usize].is_some(),
            )
            .map_err(|lost| self.too_many_lost(shape, lost))?;
        // Each block of the stripe, by block number: a slice of its
        // member's buffer, of `out` (the target), or of the spare (a second
        // lost block, RAID 6).
        let mut slices: Vec<Option<&mut [u8]>> = bufs
            .iter_mut()
            .map(|b| b.as_deref_mut().map(|b| &mut b[range.clone()]))
            .collect();
        let mut target_slice = Some(&mut out[range.clone()]);
        let mut spare_slice = Some(&mut spare[..range.len()]);
        let mut blocks: Vec<Option<&mut [u8]>> = (0..members as u32)
            .map(|b| {
                let m = shape.member_of(stripe, b) as usize;
                if b == target {
                    target_slice.take()
                } else {
                    slices[m].take().or_else(|| spare_slice.take())
                }
            })
            .collect();
        shape.recover_blocks(Kernel::best(), &col, &mut blocks);
        Ok(())
    }

    /// What belongs in `role`'s member at `member_offset` (its data area),
    /// `buf.len()` bytes inside one chunk, rebuilt from the rest of the
    /// stripe (which is held meanwhile). For a member being recovered.
    pub(crate) fn rebuild_block(
        &self,
        role: usize,
        member_offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let shape = self.shape();
        let stripe = member_offset / shape.chunk;
        let lo = (member_offset % shape.chunk) as u32;
        let hi = lo + buf.len() as u32;
        debug_assert!(u64::from(hi) <= shape.chunk, "inside one chunk");
        let target = shape.block_of(stripe, role as u32);
        self.parity_family().locks.lock_range(stripe, stripe);
        let rebuilt = (|| loop {
            let readable = |m: u32| {
                m as usize != role && self.readable(m as usize, member_offset, buf.len() as u64)
            };
            let col = match shape.rebuild_column(stripe, lo, hi, target, readable) {
                Ok(col) => col,
                Err(lost) if self.lost_to_bad_blocks(&shape, &lost, role) => {
                    // The stripe's other blocks no longer agree there (a
                    // write failed on a member the array could not lose):
                    // nothing true can be rebuilt, so the new member's
                    // range is recorded bad as well, as md does.
                    buf.fill(0);
                    self.record_bad(role, member_offset, buf.len() as u64, &[])?;
                    return Ok(());
                }
                Err(lost) => return Err(self.too_many_lost(&shape, lost)),
            };
            let mut scratch = nvraid_io::AlignedBuf::zeroed(shape.scratch_len(&col));
            let mut reads = Vec::new();
            shape.reads(&col, 0, 0, &mut reads);
            let mut failed = false;
            for io in &reads {
                let Place::Scratch(at) = io.at else {
                    unreachable!("a rebuild reads into scratch")
                };
                let into = &mut scratch[at..at + io.len as usize];
                if !self.member_io(io, |slot, at| slot.member.read_at(into, at))? {
                    failed = true;
                    break;
                }
            }
            if !failed {
                buf.copy_from_slice(shape.rebuilt_block(
                    Kernel::best(),
                    &col,
                    &mut scratch,
                    target,
                ));
                return Ok(());
            }
        })();
        self.parity_family().locks.unlock_range(stripe, stripe);
        rebuilt
    }

    /// A PPL array: compute the column's parity and partial parity, log
    /// its entry on the parity member and wait until the log is durable
    /// (None, nothing done: no log, or its parity member is gone).
    fn log_column(
        &self,
        shape: &ParityShape,
        col: &Column,
        buf: &[u8],
        offset: u64,
        scratch: &mut [u8],
    ) -> Result<Option<crate::parity::ppl::Ticket>> {
        let Some(ppl) = &self.ppl else {
            return Ok(None);
        };
        let (p, _) = shape.map.parity_members(col.stripe);
        if !self.is_usable(p as usize) {
            return Ok(None);
        }
        let mut pp = vec![
            0u8;
            if col.mode == Mode::Full {
                0
            } else {
                col.width()
            }
        ];
        let wanted = (col.mode != Mode::Full).then_some(&mut pp[..]);
        shape.compute(Kernel::best(), col, buf, offset, scratch, wanted);
        let ticket = ppl.enqueue(p, &[shape.ppl_entry(col, &pp)], &pp);
        while !ppl.ready(self, ticket) {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        Ok(Some(ticket))
    }

    /// A journaled array: compute the column's parity (unless the PPL did,
    /// `computed`), log its data and parity pages and wait until they are
    /// durable. `None` when the array logs nothing now.
    fn journal_column(
        &self,
        shape: &ParityShape,
        col: &Column,
        buf: &[u8],
        offset: u64,
        scratch: &mut [u8],
        computed: Option<crate::parity::ppl::Ticket>,
    ) -> Result<Option<u64>> {
        let Some(journal) = self.md_journal.as_ref().filter(|j| j.logging()) else {
            return Ok(None);
        };
        if computed.is_none() {
            shape.compute(Kernel::best(), col, buf, offset, scratch, None);
        }
        let (mut payloads, mut pages) = (Vec::new(), Vec::new());
        if !shape.journal_pages(
            col,
            buf,
            offset,
            scratch,
            journal.seed(),
            &mut payloads,
            &mut pages,
        ) {
            return Err(Error::Unaligned {
                offset,
                len: buf.len() as u64,
                sector_bytes: 4096,
            });
        }
        let mut rebuilt = (Vec::new(), Vec::new());
        shape.rebuilt_pages(col, scratch, journal.seed(), &mut rebuilt.0, &mut rebuilt.1);
        let ticket = journal.enqueue(self, payloads, pages, rebuilt);
        while !journal
            .ready(self, ticket)
            .inspect_err(|_| journal.done(ticket))?
        {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        Ok(Some(ticket))
    }

    /// Do `op` on `io`'s member at its byte offset. Ok(false) when the
    /// member failed: it is marked faulty (the array goes on degraded), or
    /// the error is returned when the array cannot lose it.
    fn member_io(
        &self,
        io: &BlockIo,
        op: impl FnOnce(&Slot, u64) -> std::io::Result<()>,
    ) -> Result<bool> {
        self.on_member(io.member as usize, io.member_offset, op)
    }
}
