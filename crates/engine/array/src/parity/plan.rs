//! RAID 4/5/6 stripe work shared by both data paths: which stripes a
//! request touches, how each part of a stripe is written (md's
//! reconstruct-write or read-modify-write, or a rebuild of the stripe when a
//! member is missing), and the parity arithmetic over the blocks read.
//!
//! A request is cut into **columns**: one stripe, one byte range `[lo, hi)`
//! inside its chunks, and the set of data blocks the request covers over
//! all of that range. Cutting at every boundary of the request inside the
//! stripe makes each block either wholly written or untouched in a column,
//! so every column has a clean choice (an 8 KiB write across two chunks is
//! two 4 KiB columns, not two whole chunks):
//!
//! | mode | reads | then |
//! |---|---|---|
//! | `Full` (every data block written) | none | P, Q from the new data |
//! | `Rcw` (reconstruct-write) | the data blocks not written | P, Q from old + new data |
//! | `Rmw` (read-modify-write) | the written blocks, P, Q | P ^= old ^ new, Q ^= gⁱ·(old ^ new) |
//! | `Rebuild` (a block is lost) | every block still readable | lost blocks recovered, then P, Q from all data |
//!
//! Rcw and Rmw are chosen by reads (md's rule: fewer reads wins; a tie goes
//! to Rcw, which also repairs parity). Rmw trusts the parity on the
//! members, so it is used only where the array is in sync. Reads of a lost
//! block (`ReadRebuild`) read the rest of the column and recover it.
//!
//! Two writes to one stripe never interleave their parity updates: each
//! request holds its stripes in [`StripeLocks`] (sharded, so no single lock
//! carries the whole array) from before its first read until its last
//! write completes. Degraded reads hold them too (they read parity).
//! Resync, repair and rebuild do not: they hold the array's barrier region,
//! which keeps client writes out.

use nvraid_layout::parity::StripeMap;
use nvraid_layout::Geometry;
use nvraid_parity::{gen_p, gen_pq, gf, mul_const, xor_into, Block, Kernel, Stripe};

/// Data blocks per stripe nvraid writes at most: a column's block sets are
/// 64-bit masks (data blocks, then P and Q).
pub const DATA_BLOCKS_MAX: u32 = 62;

/// How one column is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Full,
    Rcw,
    Rmw,
    Rebuild,
    /// A read whose requested blocks include one that cannot be read.
    ReadRebuild,
    /// A read whose requested blocks can all be read directly.
    ReadDirect,
}

/// One stripe, one byte range of its chunks, the data blocks the request
/// covers there, and how it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Column {
    pub stripe: u64,
    /// Byte range inside each chunk of the stripe.
    pub lo: u32,
    pub hi: u32,
    /// Data blocks the request covers (bit `d`).
    pub written: u64,
    pub mode: Mode,
    /// Blocks that cannot be read (data `d`; P = bit D; Q = bit D+1).
    pub lost: u64,
}

impl Column {
    pub fn width(&self) -> usize {
        (self.hi - self.lo) as usize
    }
}

/// Why a column cannot be planned: more blocks lost than the parity covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TooManyLost {
    pub stripe: u64,
    pub lost: u64,
}

/// The stripe geometry of a parity array, with what the hot path needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ParityShape {
    pub map: StripeMap,
    pub chunk: u64,
    /// Data blocks per stripe.
    pub data: u32,
    /// Parity blocks per stripe (1 or 2).
    pub parity: u32,
    /// The widest column (a PPL array keeps each column's partial parity
    /// small enough to share a log write).
    pub max_width: u32,
}

/// One member I/O of a column: the block, its member, and where its bytes
/// live (the request's buffer or the column's scratch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockIo {
    pub member: u32,
    /// Offset in the member's data area.
    pub member_offset: u64,
    pub len: u32,
    pub at: Place,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Byte offset in the request's buffer.
    Request(usize),
    /// Byte offset in the column's scratch.
    Scratch(usize),
}

impl ParityShape {
    pub fn of(geometry: &Geometry) -> Option<ParityShape> {
        let map = geometry.level().stripe_map(geometry.members())?;
        Some(ParityShape {
            map,
            chunk: geometry.chunk_bytes()?,
            data: map.data_per_stripe(),
            parity: map.parity(),
            max_width: u32::MAX,
        })
    }

    fn parity_bits(&self) -> u64 {
        ((1u64 << self.parity) - 1) << self.data
    }

    fn data_bits(&self) -> u64 {
        (1u64 << self.data) - 1
    }

    /// Bytes of array data per stripe.
    pub fn stripe_data_bytes(&self) -> u64 {
        self.chunk * u64::from(self.data)
    }

    /// The first and last stripe `[offset, offset + len)` touches.
    pub fn stripes(&self, offset: u64, len: u64) -> (u64, u64) {
        let width = self.stripe_data_bytes();
        (offset / width, (offset + len.max(1) - 1) / width)
    }

    /// The member of block `b` of `stripe` (data index, or D for P, D+1
    /// for Q).
    pub fn member_of(&self, stripe: u64, b: u32) -> u32 {
        if b < self.data {
            self.map.data_member(stripe, b)
        } else {
            let (p, q) = self.map.parity_members(stripe);
            if b == self.data {
                p
            } else {
                q.expect("a RAID 6 stripe")
            }
        }
    }

    /// Array byte offset of data block `d` of `stripe` at `lo` in its chunk.
    fn logical(&self, stripe: u64, d: u32, lo: u32) -> u64 {
        (stripe * u64::from(self.data) + u64::from(d)) * self.chunk + u64::from(lo)
    }

    /// Cut `[offset, offset + len)` into columns (appended to `out`, mode
    /// not yet chosen: `Full`/`ReadDirect` placeholders).
    pub fn columns(&self, offset: u64, len: u64, out: &mut Vec<Column>) {
        let width = self.stripe_data_bytes();
        let end = offset + len;
        let chunk = self.chunk;
        let (first, last) = self.stripes(offset, len);
        for stripe in first..=last {
            let base = stripe * width;
            let a = offset.max(base) - base;
            let b = end.min(base + width) - base;
            let (d0, d1) = (a / chunk, (b - 1) / chunk);
            let (x, y) = (a % chunk, (b - 1) % chunk + 1);
            // Block d's range in its chunk.
            let range = |d: u64| -> (u64, u64) {
                let lo = if d == d0 { x } else { 0 };
                let hi = if d == d1 { y } else { chunk };
                (lo, hi)
            };
            let mut cuts = [0, x, y, chunk];
            cuts.sort_unstable();
            for pair in cuts.windows(2) {
                let (u, v) = (pair[0], pair[1]);
                if u >= v {
                    continue;
                }
                let mut written = 0u64;
                for d in d0..=d1 {
                    let (lo, hi) = range(d);
                    if lo <= u && v <= hi {
                        written |= 1 << d;
                    }
                }
                if written != 0 {
                    let mut lo = u;
                    while lo < v {
                        let hi = v.min(lo + u64::from(self.max_width));
                        out.push(Column {
                            stripe,
                            lo: lo as u32,
                            hi: hi as u32,
                            written,
                            mode: Mode::Full,
                            lost: 0,
                        });
                        lo = hi;
                    }
                }
            }
        }
    }

    /// Choose how a write column is done. `readable(member)`: the member may
    /// be read over the column; `trusted`: the stripe's parity agrees with
    /// its data (the array is in sync there), so Rmw may use it.
    pub fn plan_write(
        &self,
        col: &mut Column,
        readable: impl Fn(u32) -> bool,
        trusted: bool,
    ) -> Result<(), TooManyLost> {
        col.lost = self.lost(col.stripe, readable);
        if col.lost.count_ones() > self.parity {
            return Err(TooManyLost {
                stripe: col.stripe,
                lost: col.lost,
            });
        }
        let w = col.written.count_ones();
        let unwritten = self.data_bits() & !col.written;
        col.mode = if col.written == self.data_bits() {
            Mode::Full
        } else if col.lost & unwritten != 0 {
            Mode::Rebuild
        } else if col.lost == 0 && trusted && w + self.parity < self.data - w {
            Mode::Rmw
        } else {
            Mode::Rcw
        };
        Ok(())
    }

    /// Choose how a read column is done.
    pub fn plan_read(
        &self,
        col: &mut Column,
        readable: impl Fn(u32) -> bool,
    ) -> Result<(), TooManyLost> {
        col.lost = self.lost(col.stripe, readable);
        if col.lost & col.written == 0 {
            col.mode = Mode::ReadDirect;
            return Ok(());
        }
        if col.lost.count_ones() > self.parity {
            return Err(TooManyLost {
                stripe: col.stripe,
                lost: col.lost,
            });
        }
        col.mode = Mode::ReadRebuild;
        Ok(())
    }

    fn lost(&self, stripe: u64, readable: impl Fn(u32) -> bool) -> u64 {
        (0..self.data + self.parity)
            .filter(|&b| !readable(self.member_of(stripe, b)))
            .fold(0, |m, b| m | 1 << b)
    }

    /// The blocks that have room in the column's scratch.
    fn scratch_blocks(&self, col: &Column) -> u64 {
        let parity = self.parity_bits();
        match col.mode {
            Mode::Full => parity,
            Mode::Rcw => (self.data_bits() & !col.written) | parity,
            Mode::Rmw => col.written | parity,
            Mode::Rebuild | Mode::ReadRebuild => self.data_bits() | parity,
            Mode::ReadDirect => 0,
        }
    }

    /// Bytes of scratch the column needs.
    pub fn scratch_len(&self, col: &Column) -> usize {
        self.scratch_blocks(col).count_ones() as usize * col.width()
    }

    /// Where block `b`'s bytes are in the column's scratch.
    fn scratch_at(&self, col: &Column, b: u32) -> usize {
        let below = self.scratch_blocks(col) & ((1u64 << b) - 1);
        below.count_ones() as usize * col.width()
    }

    fn io(&self, col: &Column, b: u32, at: Place) -> BlockIo {
        BlockIo {
            member: self.member_of(col.stripe, b),
            member_offset: col.stripe * self.chunk + u64::from(col.lo),
            len: col.hi - col.lo,
            at,
        }
    }

    fn request_at(&self, col: &Column, d: u32, request_offset: u64) -> usize {
        (self.logical(col.stripe, d, col.lo) - request_offset) as usize
    }

    /// The blocks to read to recover `lost`: every other one, except that
    /// one lost block never needs Q (a data block comes back from P and the
    /// other data, P from the data), and a lost Q needs neither P.
    fn needed_for(&self, lost: u64) -> u64 {
        let mut blocks = (self.data_bits() | self.parity_bits()) & !lost;
        if lost.count_ones() == 1 && self.parity == 2 {
            let (p, q) = (1u64 << self.data, 1u64 << (self.data + 1));
            blocks &= !q;
            if lost == q {
                blocks &= !p;
            }
        }
        blocks
    }

    /// The member reads the column needs before its parity can be computed
    /// (`scratch_base`: where its scratch starts; the request starts at
    /// array byte `request_offset`).
    pub fn reads(
        &self,
        col: &Column,
        request_offset: u64,
        scratch_base: usize,
        out: &mut Vec<BlockIo>,
    ) {
        let blocks = match col.mode {
            Mode::Full => 0,
            Mode::Rcw => self.data_bits() & !col.written,
            Mode::Rmw => col.written | self.parity_bits(),
            Mode::Rebuild | Mode::ReadRebuild => self.needed_for(col.lost),
            Mode::ReadDirect => col.written,
        };
        for b in bits(blocks) {
            let at = if col.mode == Mode::ReadDirect {
                Place::Request(self.request_at(col, b, request_offset))
            } else {
                Place::Scratch(scratch_base + self.scratch_at(col, b))
            };
            out.push(self.io(col, b, at));
        }
    }

    /// The member writes of a write column once its parity is computed.
    /// Blocks on members that cannot be written (`writable`) are left out.
    pub fn writes(
        &self,
        col: &Column,
        request_offset: u64,
        scratch_base: usize,
        writable: impl Fn(u32) -> bool,
        out: &mut Vec<BlockIo>,
    ) {
        for b in bits(col.written | self.parity_bits()) {
            let at = if b < self.data {
                Place::Request(self.request_at(col, b, request_offset))
            } else {
                Place::Scratch(scratch_base + self.scratch_at(col, b))
            };
            let io = self.io(col, b, at);
            if writable(io.member) {
                out.push(io);
            }
        }
    }

    /// md's write journal: a computed write column's pages as md logs them,
    /// appended to `payloads` and `pages`: each written data block's 4 KiB
    /// pages under their array sectors, then P (and Q) of each page under
    /// the stripe's member sector. `false` (nothing appended) when the
    /// column is not whole pages (a journaled array's sector is 4 KiB, so
    /// its columns always are).
    #[allow(clippy::too_many_arguments)]
    pub fn journal_pages(
        &self,
        col: &Column,
        request: &[u8],
        request_offset: u64,
        scratch: &[u8],
        seed: u32,
        payloads: &mut Vec<nvraid_metadata::r5log::Payload>,
        pages: &mut Vec<u8>,
    ) -> bool {
        use nvraid_metadata::r5log::{md_crc, Payload, PAGE_BYTES};
        let width = col.width();
        if !width.is_multiple_of(PAGE_BYTES) || !(col.lo as usize).is_multiple_of(PAGE_BYTES) {
            return false;
        }
        for d in bits(col.written & self.data_bits()) {
            let at = self.request_at(col, d, request_offset);
            self.data_payloads(col, d, &request[at..at + width], seed, payloads, pages);
        }
        let member_offset = col.stripe * self.chunk + u64::from(col.lo);
        for i in 0..width / PAGE_BYTES {
            let mut checksums = Vec::with_capacity(self.parity as usize);
            for b in bits(self.parity_bits()) {
                let at = self.scratch_at(col, b) + i * PAGE_BYTES;
                let page = &scratch[at..at + PAGE_BYTES];
                checksums.push(md_crc(seed, page));
                pages.extend_from_slice(page);
            }
            payloads.push(Payload::Parity {
                flags: 0,
                location: (member_offset + (i * PAGE_BYTES) as u64) / 512,
                checksums,
            });
        }
        true
    }

    /// A degraded write column's data blocks that are lost and not
    /// written (Rebuild mode), as they were before the write: data pages
    /// under their array sectors, rebuilt into the scratch by `compute`.
    /// A write cache's journal logs them for a row whose parity it cannot
    /// log ([`crate::parity::journal::MdJournal::enqueue`]), so that a replay does
    /// not have to rebuild them from parity a crash may have torn.
    pub fn rebuilt_pages(
        &self,
        col: &Column,
        scratch: &[u8],
        seed: u32,
        payloads: &mut Vec<nvraid_metadata::r5log::Payload>,
        pages: &mut Vec<u8>,
    ) {
        use nvraid_metadata::r5log::PAGE_BYTES;
        let width = col.width();
        if col.mode != Mode::Rebuild
            || !width.is_multiple_of(PAGE_BYTES)
            || !(col.lo as usize).is_multiple_of(PAGE_BYTES)
        {
            return;
        }
        for d in bits(col.lost & self.data_bits() & !col.written) {
            let at = self.scratch_at(col, d);
            self.data_payloads(col, d, &scratch[at..at + width], seed, payloads, pages);
        }
    }

    /// Data block `d` of `col` (its bytes `block`) as md's data payloads,
    /// a page each under its array sector.
    fn data_payloads(
        &self,
        col: &Column,
        d: u32,
        block: &[u8],
        seed: u32,
        payloads: &mut Vec<nvraid_metadata::r5log::Payload>,
        pages: &mut Vec<u8>,
    ) {
        use nvraid_metadata::r5log::{md_crc, Payload, PAGE_BYTES};
        let logical = self.logical(col.stripe, d, col.lo);
        for (i, page) in block.chunks(PAGE_BYTES).enumerate() {
            payloads.push(Payload::Data {
                flags: 0,
                location: (logical + (i * PAGE_BYTES) as u64) / 512,
                checksum: md_crc(seed, page),
            });
            pages.extend_from_slice(page);
        }
    }

    /// After a write column's reads: compute its parity into the scratch.
    /// `request` holds the request's bytes (it starts at array byte
    /// `request_offset`); `scratch` is the column's (`scratch_len` bytes).
    ///
    /// With `pp` (`width` bytes; not for a full-stripe column), also the
    /// column's partial parity for md's log: the XOR of the data blocks it
    /// leaves alone, as they are before the write.
    pub fn compute(
        &self,
        kernel: Kernel,
        col: &Column,
        request: &[u8],
        request_offset: u64,
        scratch: &mut [u8],
        pp: Option<&mut [u8]>,
    ) {
        let width = col.width();
        let new = |d: u32| self.request_at(col, d, request_offset);
        if let Some(pp) = pp {
            self.partial_parity(kernel, col, scratch, pp);
        }
        match col.mode {
            Mode::ReadDirect | Mode::ReadRebuild => unreachable!("a read column"),
            Mode::Full | Mode::Rcw => {
                let (data_scratch, parity) = scratch.split_at_mut(self.scratch_at(col, self.data));
                let mut data: [&[u8]; DATA_BLOCKS_MAX as usize] = [&[]; DATA_BLOCKS_MAX as usize];
                for d in 0..self.data {
                    let block: &[u8] = if col.written & (1 << d) != 0 {
                        &request[new(d)..new(d) + width]
                    } else {
                        let at = self.scratch_at(col, d);
                        &data_scratch[at..at + width]
                    };
                    data[self.q_order(col.stripe, d)] = block;
                }
                self.generate(kernel, &data[..self.data as usize], parity, width);
            }
            Mode::Rmw => {
                let (data_scratch, parity) = scratch.split_at_mut(self.scratch_at(col, self.data));
                let (p, q) = parity.split_at_mut(width);
                for d in bits(col.written) {
                    let at = self.scratch_at(col, d);
                    let delta = &mut data_scratch[at..at + width];
                    // old ^ new: what this block changes in every parity.
                    xor_into(kernel, delta, &request[new(d)..new(d) + width]);
                    xor_into(kernel, p, delta);
                    if self.parity == 2 {
                        let c = gf::pow2(self.map.q_slot(col.stripe, d));
                        mul_const(kernel, q, delta, c, true);
                    }
                }
            }
            Mode::Rebuild => {
                self.recover(kernel, col, scratch);
                // The stripe is whole again: lay the new data over it and
                // compute its parity from scratch.
                for d in bits(col.written) {
                    let at = self.scratch_at(col, d);
                    scratch[at..at + width].copy_from_slice(&request[new(d)..new(d) + width]);
                }
                let (data_scratch, parity) = scratch.split_at_mut(self.scratch_at(col, self.data));
                let mut data: [&[u8]; DATA_BLOCKS_MAX as usize] = [&[]; DATA_BLOCKS_MAX as usize];
                for d in 0..self.data {
                    let at = self.scratch_at(col, d);
                    data[self.q_order(col.stripe, d)] = &data_scratch[at..at + width];
                }
                self.generate(kernel, &data[..self.data as usize], parity, width);
            }
        }
    }

    /// The XOR of the data blocks `col` does not write, before the write
    /// (its scratch after the reads; a rebuild column's lost blocks are
    /// recovered in place first).
    fn partial_parity(&self, kernel: Kernel, col: &Column, scratch: &mut [u8], pp: &mut [u8]) {
        let width = col.width();
        pp.fill(0);
        match col.mode {
            Mode::Full => {}
            Mode::Rcw => {
                for d in bits(self.data_bits() & !col.written) {
                    let at = self.scratch_at(col, d);
                    xor_into(kernel, pp, &scratch[at..at + width]);
                }
            }
            Mode::Rmw => {
                // P before the write, less the blocks being written.
                let at = self.scratch_at(col, self.data);
                pp.copy_from_slice(&scratch[at..at + width]);
                for d in bits(col.written) {
                    let at = self.scratch_at(col, d);
                    xor_into(kernel, pp, &scratch[at..at + width]);
                }
            }
            Mode::Rebuild => {
                self.recover(kernel, col, scratch);
                for d in bits(self.data_bits() & !col.written) {
                    let at = self.scratch_at(col, d);
                    xor_into(kernel, pp, &scratch[at..at + width]);
                }
            }
            Mode::ReadDirect | Mode::ReadRebuild => unreachable!("a write column"),
        }
    }

    /// After a degraded read column's reads: recover its lost blocks and
    /// put every block the request wants into `request`.
    pub fn finish_read(
        &self,
        kernel: Kernel,
        col: &Column,
        request: &mut [u8],
        request_offset: u64,
        scratch: &mut [u8],
    ) {
        if col.mode != Mode::ReadRebuild {
            return;
        }
        let width = col.width();
        self.recover(kernel, col, scratch);
        for d in bits(col.written) {
            let at = self.scratch_at(col, d);
            let to = self.request_at(col, d, request_offset);
            request[to..to + width].copy_from_slice(&scratch[at..at + width]);
        }
    }

    /// A column that rebuilds block `target` of `stripe` over `[lo, hi)`
    /// (a member being recovered) from the other blocks still readable.
    pub fn rebuild_column(
        &self,
        stripe: u64,
        lo: u32,
        hi: u32,
        target: u32,
        readable: impl Fn(u32) -> bool,
    ) -> Result<Column, TooManyLost> {
        let lost = self.lost(stripe, readable) | 1 << target;
        if lost.count_ones() > self.parity {
            return Err(TooManyLost { stripe, lost });
        }
        Ok(Column {
            stripe,
            lo,
            hi,
            written: 0,
            mode: Mode::ReadRebuild,
            lost,
        })
    }

    /// After a [`ParityShape::rebuild_column`]'s reads: recover its lost
    /// blocks and return block `target`'s bytes.
    pub fn rebuilt_block<'s>(
        &self,
        kernel: Kernel,
        col: &Column,
        scratch: &'s mut [u8],
        target: u32,
    ) -> &'s [u8] {
        self.recover(kernel, col, scratch);
        let at = self.scratch_at(col, target);
        &scratch[at..at + col.width()]
    }

    /// The array byte offset of what `member` holds at byte `at` of the
    /// members' data areas; `None` where it holds parity there.
    pub fn array_offset_of(&self, at: u64, member: u32) -> Option<u64> {
        let (stripe, lo) = (at / self.chunk, (at % self.chunk) as u32);
        let b = self.block_of(stripe, member);
        (b < self.data).then(|| self.logical(stripe, b, lo))
    }

    /// Which block of `stripe` member `member` holds.
    pub fn block_of(&self, stripe: u64, member: u32) -> u32 {
        (0..self.data + self.parity)
            .find(|&b| self.member_of(stripe, b) == member)
            .expect("every member holds one block of each stripe")
    }

    /// Recover the column's lost blocks in place, given every block of
    /// its stripe by block number (data, P, Q).
    pub fn recover_blocks(&self, kernel: Kernel, col: &Column, blocks: &mut [Option<&mut [u8]>]) {
        let mut taken: Vec<&mut [u8]> = blocks
            .iter_mut()
            .map(|b| b.take().expect("every block given"))
            .collect();
        let q = (self.parity == 2).then(|| taken.pop().expect("Q"));
        let p = taken.pop().expect("P");
        let mut ordered: Vec<Option<&mut [u8]>> = (0..self.data).map(|_| None).collect();
        for (d, block) in taken.into_iter().enumerate() {
            ordered[self.q_order(col.stripe, d as u32)] = Some(block);
        }
        self.recover_ordered(kernel, col, ordered, p, q);
    }

    /// Recover the column's lost blocks in its scratch (every block has
    /// room there in the rebuild modes).
    fn recover(&self, kernel: Kernel, col: &Column, scratch: &mut [u8]) {
        let width = col.width();
        let mut blocks: Vec<&mut [u8]> = scratch.chunks_exact_mut(width).collect();
        let q = (self.parity == 2).then(|| blocks.pop().expect("Q"));
        let p = blocks.pop().expect("P");
        let mut ordered: Vec<Option<&mut [u8]>> = (0..self.data).map(|_| None).collect();
        for (d, block) in blocks.into_iter().enumerate() {
            ordered[self.q_order(col.stripe, d as u32)] = Some(block);
        }
        self.recover_ordered(kernel, col, ordered, p, q);
    }

    /// Recover `col.lost` given the data blocks in md's Q order, P and Q.
    fn recover_ordered(
        &self,
        kernel: Kernel,
        col: &Column,
        ordered: Vec<Option<&mut [u8]>>,
        p: &mut [u8],
        q: Option<&mut [u8]>,
    ) {
        let mut lost = Vec::new();
        for b in bits(col.lost) {
            lost.push(match b {
                b if b < self.data => Block::Data(self.q_order(col.stripe, b)),
                b if b == self.data => Block::P,
                _ => Block::Q,
            });
        }
        let mut stripe = Stripe {
            data: ordered
                .into_iter()
                .map(|b| b.expect("every slot"))
                .collect(),
            p,
            q,
        };
        stripe
            .recover(kernel, &lost)
            .expect("planned with no more lost blocks than the parity covers");
    }

    /// Data block `d`'s index in the generator's order (md's Q order on
    /// RAID 6; any order does for P alone).
    pub fn q_order(&self, stripe: u64, d: u32) -> usize {
        if self.parity == 2 {
            self.map.q_slot(stripe, d)
        } else {
            d as usize
        }
    }

    /// P (and Q) of `data` (in [`ParityShape::q_order`]) into `parity`
    /// (`width` bytes each, P first).
    pub fn generate(&self, kernel: Kernel, data: &[&[u8]], parity: &mut [u8], width: usize) {
        let (p, q) = parity.split_at_mut(width);
        if self.parity == 2 {
            gen_pq(kernel, data, p, &mut q[..width]);
        } else {
            gen_p(kernel, data, p);
        }
    }

    /// The members of the blocks in `lost` (for messages).
    pub fn lost_members(&self, stripe: u64, lost: u64) -> Vec<u32> {
        bits(lost).map(|b| self.member_of(stripe, b)).collect()
    }
}

/// The set bits of `mask`, lowest first.
pub(crate) fn bits(mask: u64) -> impl Iterator<Item = u32> {
    let mut rest = mask;
    std::iter::from_fn(move || {
        (rest != 0).then(|| {
            let b = rest.trailing_zeros();
            rest &= rest - 1;
            b
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvraid_layout::parity::ParityLayout;
    use nvraid_layout::Level;
    use proptest::prelude::*;

    fn shape(level: Level, members: u32, chunk: u64) -> ParityShape {
        let g = Geometry::new(level, members, chunk, 64 * chunk).unwrap();
        ParityShape::of(&g).unwrap()
    }

    fn raid6(members: u32) -> ParityShape {
        shape(
            Level::Raid6 {
                layout: ParityLayout::LeftSymmetric,
            },
            members,
            4096,
        )
    }

    fn raid5(members: u32) -> ParityShape {
        shape(
            Level::Raid5 {
                layout: ParityLayout::LeftSymmetric,
            },
            members,
            4096,
        )
    }

    #[test]
    fn a_write_across_two_chunks_is_two_narrow_columns() {
        let s = raid5(5);
        let mut cols = Vec::new();
        // 8 KiB from the middle of data block 1 into block 2.
        s.columns(4096 + 2048, 4096, &mut cols);
        assert_eq!(cols.len(), 2);
        assert_eq!((cols[0].lo, cols[0].hi, cols[0].written), (0, 2048, 0b100));
        assert_eq!(
            (cols[1].lo, cols[1].hi, cols[1].written),
            (2048, 4096, 0b10)
        );
    }

    #[test]
    fn reads_decide_between_rmw_and_rcw() {
        let s = raid5(8); // 7 data blocks
        let mut col = Column {
            stripe: 0,
            lo: 0,
            hi: 4096,
            written: 0b1,
            mode: Mode::Full,
            lost: 0,
        };
        s.plan_write(&mut col, |_| true, true).unwrap();
        assert_eq!(col.mode, Mode::Rmw, "2 reads beat 6");
        s.plan_write(&mut col, |_| true, false).unwrap();
        assert_eq!(col.mode, Mode::Rcw, "parity not trusted: reconstruct");
        col.written = 0b111_1110;
        s.plan_write(&mut col, |_| true, true).unwrap();
        assert_eq!(col.mode, Mode::Rcw, "1 read beats 7");
        col.written = 0b111_1111;
        s.plan_write(&mut col, |_| true, true).unwrap();
        assert_eq!(col.mode, Mode::Full);
        // The member of unwritten block 1 is gone: rebuild the stripe.
        col.written = 0b1;
        let gone = s.member_of(0, 1);
        s.plan_write(&mut col, |m| m != gone, true).unwrap();
        assert_eq!(col.mode, Mode::Rebuild);
        // Two members gone on RAID 5: refused.
        let also = s.member_of(0, 2);
        assert!(s
            .plan_write(&mut col, |m| m != gone && m != also, true)
            .is_err());
    }

    /// Run a column's plan against an in-memory stripe: the oracle for the
    /// modes. Returns the stripe after the write.
    fn apply(
        s: &ParityShape,
        stripe: &mut [Vec<u8>],
        col: &Column,
        request: &mut [u8],
        offset: u64,
        writable: impl Fn(u32) -> bool,
    ) {
        // Bytes not read must never be used: start from garbage.
        let mut scratch = vec![0xeeu8; s.scratch_len(col)];
        let mut reads = Vec::new();
        s.reads(col, offset, 0, &mut reads);
        for io in &reads {
            let block = &stripe[io.member as usize];
            let src = &block[(io.member_offset % s.chunk) as usize..][..io.len as usize];
            match io.at {
                Place::Scratch(at) => scratch[at..at + io.len as usize].copy_from_slice(src),
                Place::Request(at) => request[at..at + io.len as usize].copy_from_slice(src),
            }
        }
        if matches!(col.mode, Mode::ReadDirect | Mode::ReadRebuild) {
            s.finish_read(Kernel::best(), col, request, offset, &mut scratch);
            return;
        }
        s.compute(Kernel::best(), col, request, offset, &mut scratch, None);
        let mut writes = Vec::new();
        s.writes(col, offset, 0, writable, &mut writes);
        for io in writes {
            let src = match io.at {
                Place::Scratch(at) => &scratch[at..at + io.len as usize],
                Place::Request(at) => &request[at..at + io.len as usize],
            };
            let at = (io.member_offset % s.chunk) as usize;
            stripe[io.member as usize][at..at + io.len as usize].copy_from_slice(src);
        }
    }

    /// P and Q of the stripe, computed whole.
    fn consistent(s: &ParityShape, stripe: &[Vec<u8>]) -> bool {
        let width = s.chunk as usize;
        let mut data: Vec<&[u8]> = vec![&[]; s.data as usize];
        for d in 0..s.data {
            data[s.q_order(0, d)] = &stripe[s.member_of(0, d) as usize];
        }
        let mut parity = vec![0u8; 2 * width];
        s.generate(Kernel::Scalar, &data, &mut parity, width);
        let p_ok = parity[..width] == stripe[s.member_of(0, s.data) as usize][..];
        let q_ok =
            s.parity == 1 || parity[width..] == stripe[s.member_of(0, s.data + 1) as usize][..];
        p_ok && q_ok
    }

    proptest! {
        /// Every mode leaves the stripe consistent with the new data, and a
        /// degraded read gives back every byte.
        #[test]
        fn every_mode_keeps_parity_and_data(
            raid6_level in any::<bool>(),
            members in 4u32..9,
            start in 0u64..16384,
            len_sectors in 1u64..32,
            seed in any::<u64>(),
            trusted in any::<bool>(),
            gone in proptest::option::of(0u32..9),
        ) {
            let s = if raid6_level { raid6(members) } else { raid5(members) };
            let width = s.stripe_data_bytes();
            let offset = (start * 512) % width;
            let len = (len_sectors * 512).min(width - offset);
            let mut rng = seed;
            let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as u8 };
            // A consistent stripe of random data.
            let mut stripe: Vec<Vec<u8>> = (0..members).map(|_| (0..s.chunk).map(|_| next()).collect()).collect();
            let mut all = Column { stripe: 0, lo: 0, hi: s.chunk as u32, written: s.data_bits(), mode: Mode::Full, lost: 0 };
            let mut fill: Vec<u8> = (0..width).map(|_| next()).collect();
            s.plan_write(&mut all, |_| true, true).unwrap();
            apply(&s, &mut stripe, &all, &mut fill, 0, |_| true);
            prop_assert!(consistent(&s, &stripe));
            let gone = gone.filter(|g| *g < members);
            let readable = |m: u32| Some(m) != gone;
            // Write the request.
            let mut new: Vec<u8> = (0..len).map(|_| next()).collect();
            let mut cols = Vec::new();
            s.columns(offset, len, &mut cols);
            for col in &mut cols {
                s.plan_write(col, readable, trusted).unwrap();
                apply(&s, &mut stripe, col, &mut new, offset, readable);
            }
            // The expected data: the old fill with the request laid over it.
            fill[offset as usize..(offset + len) as usize].copy_from_slice(&new);
            if gone.is_none() {
                prop_assert!(consistent(&s, &stripe));
            }
            // Read all of it back, the gone member's blocks through parity.
            let mut back = vec![0u8; width as usize];
            let mut cols = Vec::new();
            s.columns(0, width, &mut cols);
            for col in &mut cols {
                s.plan_read(col, readable).unwrap();
                apply(&s, &mut stripe, col, &mut back, 0, readable);
            }
            prop_assert!(back == fill, "read back differs from what was written");
        }
    }
}
