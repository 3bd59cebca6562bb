//! A worker's queue on a [`crate::CachedTarget`].
//!
//! Slots and buffers are the inner queue's. A write is copied into the
//! cache (and, in journal mode, into the batch of the next commit); reads
//! the cache covers are answered from it, reads it partly covers go to the
//! array and get the cached blocks laid over them when they come back.
//! FLUSH, and FUA writes in write-back mode, wait for the write-back
//! thread; in journal mode an acknowledged write is already durable, so
//! they complete at once.

use std::collections::VecDeque;
use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use nvraid_io::queue::{Completion, OpKind, Queue};

use crate::journal::format::BLOCK_BYTES;
use crate::journal::Commit;
use crate::pages::Coverage;
use crate::{CacheMode, FlushWaiter, Shared};

/// What a slot waits for.
#[derive(Clone, Copy, Debug)]
enum Pending {
    Idle,
    /// An array read; with the epoch it registered when cached blocks
    /// must be laid over it.
    Inner {
        read: Option<(u64, u64)>,
    },
    /// A journal commit.
    Commit {
        ticket: u64,
        len: u32,
    },
    /// The write-back thread (a flush).
    Flush,
}

/// Where a write went.
enum Taken {
    /// Into the journal's next commit: wait for this ticket.
    Journaled(u64),
    /// Into the cache, with this sequence number.
    Cached(u64),
}

/// How long a queue with requests both at the array and at the journal or
/// the write-back thread waits on one before looking at the other.
const POLL: Duration = Duration::from_micros(100);

pub(crate) struct CachedQueue {
    shared: Arc<Shared>,
    inner: Box<dyn Queue>,
    pending: Vec<Pending>,
    ready: VecDeque<Completion>,
    commits: usize,
    inner_in_flight: u32,
    flushes_in_flight: u32,
    done_tx: SyncSender<Completion>,
    done_rx: Receiver<Completion>,
}

impl CachedQueue {
    pub fn new(shared: Arc<Shared>, inner: Box<dyn Queue>) -> CachedQueue {
        let depth = inner.depth() as usize;
        // Bounded by the depth: a slot has at most one flush waiting.
        let (done_tx, done_rx) = mpsc::sync_channel(depth.max(1));
        CachedQueue {
            shared,
            inner,
            pending: vec![Pending::Idle; depth],
            ready: VecDeque::with_capacity(depth),
            commits: 0,
            inner_in_flight: 0,
            flushes_in_flight: 0,
            done_tx,
            done_rx,
        }
    }

    fn complete_now(&mut self, slot: u32, result: Result<u32, i32>) {
        self.pending[slot as usize] = Pending::Idle;
        self.ready.push_back(Completion { slot, result });
    }

    fn submit_inner(
        &mut self,
        slot: u32,
        op: OpKind,
        offset: u64,
        len: u32,
        fua: bool,
        read: Option<(u64, u64)>,
    ) -> io::Result<()> {
        self.inner.submit(slot, op, offset, len, fua)?;
        self.inner_in_flight += 1;
        self.pending[slot as usize] = Pending::Inner { read };
        Ok(())
    }

    fn read(&mut self, slot: u32, offset: u64, len: u32) -> io::Result<()> {
        let first = offset / BLOCK_BYTES as u64;
        let count = u64::from(len) / BLOCK_BYTES as u64;
        let mut state = self.shared.lock();
        match state.pages.coverage(first, count) {
            Coverage::None => {
                drop(state);
                self.submit_inner(slot, OpKind::Read, offset, len, false, None)
            }
            Coverage::All => {
                let buffer = &mut self.inner.buffer_mut(slot)[..len as usize];
                state.pages.overlay(first, buffer);
                drop(state);
                self.complete_now(slot, Ok(len));
                Ok(())
            }
            Coverage::Some => {
                let epoch = state.pages.start_read();
                drop(state);
                let submitted =
                    self.submit_inner(slot, OpKind::Read, offset, len, false, Some((epoch, first)));
                if submitted.is_err() {
                    self.shared.lock().pages.end_read(epoch);
                }
                submitted
            }
        }
    }

    /// Waits while the cache is full; `Err` when writes are refused. (The
    /// journal is asked before the cache's lock is taken: only an append
    /// holds both.)
    fn wait_for_room(&self, len: u32) -> Result<(), i32> {
        let max = self.shared.options.dirty_max_bytes;
        loop {
            if self.shared.failure().is_some() {
                return Err(libc::EIO);
            }
            // Room, as far as a look without the lock can tell (what is
            // dirty only shrinks meanwhile, but for other writers').
            let dirty = self
                .shared
                .dirty_pages
                .load(std::sync::atomic::Ordering::Relaxed)
                * BLOCK_BYTES as u64;
            if dirty == 0 || dirty + u64::from(len) <= max {
                return Ok(());
            }
            let state = self.shared.lock();
            let dirty = state.pages.dirty_bytes();
            if dirty == 0 || dirty + u64::from(len) <= max {
                return Ok(());
            }
            // Full, and the array refuses what is cached: waiting would
            // never end.
            if let Some(errno) = state.writeback_errno {
                return Err(errno);
            }
            self.shared.work.notify_all();
            drop(
                self.shared
                    .room
                    .wait_timeout(state, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
    }

    fn write(&mut self, slot: u32, offset: u64, len: u32, fua: bool) -> io::Result<()> {
        if let Err(errno) = self.wait_for_room(len) {
            self.complete_now(slot, Err(errno));
            return Ok(());
        }
        let first = offset / BLOCK_BYTES as u64;
        let blocks = u64::from(len).div_ceil(BLOCK_BYTES as u64);
        let shared = self.shared.clone();
        let data = &self.inner.buffer_mut(slot)[..len as usize];
        let wait_for_write_back = shared
            .journal
            .as_ref()
            .is_some_and(|j| j.write_back_first());
        let slices = shared.journal.as_ref().is_some_and(|j| j.slices());
        let taken = loop {
            let taken = match &shared.journal {
                Some(journal) => journal.prepare(offset, data).and_then(|prepared| {
                    // The journal appends under the cache's lock, so that
                    // both take writes in one order.
                    let mut state = shared.lock();
                    let busy = wait_for_write_back
                        && (first..first + blocks)
                            .any(|i| state.pages.map.get(&i).is_some_and(|p| p.busy));
                    if busy {
                        return Ok(None);
                    }
                    let appended = journal.append(offset, data, prepared);
                    if let Ok(Some(ticket)) = appended {
                        let seq = state.pages.insert(first, data);
                        if slices {
                            state.tickets.push_back((ticket, seq));
                        }
                    }
                    appended
                }),
                None => {
                    let mut state = shared.lock();
                    let seq = state.pages.insert(first, data);
                    // Past the background threshold: wake the write-back
                    // thread (once, until it looks again).
                    if !state.background_asked
                        && state.pages.dirty_bytes() > shared.options.background_bytes
                    {
                        state.background_asked = true;
                        shared.work.notify_all();
                    }
                    Ok(Some(seq))
                }
            };
            match taken {
                // A page of the write is being written back (that write-back
                // is logged first, then this write), or the journal wants its
                // cached pages written back before it takes more.
                Ok(None) => std::thread::sleep(std::time::Duration::from_micros(20)),
                Ok(Some(ticket)) if shared.journal.is_some() => break Ok(Taken::Journaled(ticket)),
                Ok(Some(seq)) => break Ok(Taken::Cached(seq)),
                Err(e) => break Err(e),
            }
        };
        match taken {
            Ok(Taken::Journaled(ticket)) => {
                self.pending[slot as usize] = Pending::Commit { ticket, len };
                self.commits += 1;
            }
            Ok(Taken::Cached(seq)) if fua => self.wait_for_write_back(slot, seq, len),
            Ok(Taken::Cached(_)) => self.complete_now(slot, Ok(len)),
            Err(_) => self.complete_now(slot, Err(libc::EIO)),
        }
        Ok(())
    }

    /// Hands `slot` to the write-back thread: it completes once every page
    /// dirty since `upto` or earlier is on the array and the array flushed.
    fn wait_for_write_back(&mut self, slot: u32, upto: u64, len: u32) {
        let mut state = self.shared.lock();
        state.flushes.push(FlushWaiter {
            upto,
            slot,
            done: self.done_tx.clone(),
            len,
        });
        self.shared.work.notify_all();
        drop(state);
        self.pending[slot as usize] = Pending::Flush;
        self.flushes_in_flight += 1;
    }

    fn flush(&mut self, slot: u32) {
        let journal_holds_them =
            self.shared.mode == CacheMode::Journal && self.shared.failure().is_none();
        if journal_holds_them {
            // Acknowledged writes are in the journal already.
            self.complete_now(slot, Ok(0));
        } else {
            // Write-back mode, or a journal that failed: what was
            // acknowledged must reach the array, and the array be flushed.
            let upto = self.shared.lock().pages.seq;
            self.wait_for_write_back(slot, upto, 0);
        }
    }

    /// The write-back thread answered the flush waiting on `completion`'s
    /// slot.
    fn flush_done(&mut self, completion: &Completion) {
        let slot = completion.slot as usize;
        assert!(
            matches!(self.pending[slot], Pending::Flush),
            "invariant: the write-back thread answers only a slot waiting for it (slot {slot})"
        );
        assert!(
            self.flushes_in_flight > 0,
            "invariant: flushes_in_flight counts the flush answered"
        );
        self.pending[slot] = Pending::Idle;
        self.flushes_in_flight -= 1;
    }

    /// Passes what is finished to `on_complete`; returns how many.
    fn collect(&mut self, on_complete: &mut dyn FnMut(Completion)) -> io::Result<u32> {
        let mut count = 0;
        while let Some(completion) = self.ready.pop_front() {
            on_complete(completion);
            count += 1;
        }
        while let Ok(completion) = self.done_rx.try_recv() {
            self.flush_done(&completion);
            on_complete(completion);
            count += 1;
        }
        if self.commits > 0 {
            let journal = self.shared.journal_mode_log();
            let (committed, failed) = journal.committed();
            for slot in 0..self.pending.len() {
                if let Pending::Commit { ticket, len } = self.pending[slot] {
                    let result = if ticket <= committed {
                        Ok(len)
                    } else if failed {
                        Err(libc::EIO)
                    } else {
                        continue;
                    };
                    assert!(self.commits > 0, "invariant: commits counts this slot");
                    self.pending[slot] = Pending::Idle;
                    self.commits -= 1;
                    on_complete(Completion {
                        slot: slot as u32,
                        result,
                    });
                    count += 1;
                }
            }
        }
        if self.inner_in_flight > 0 {
            count += self.reap_inner(0, on_complete)?;
        }
        Ok(count)
    }

    fn reap_inner(&mut self, min: u32, on_complete: &mut dyn FnMut(Completion)) -> io::Result<u32> {
        let mut done = Vec::new();
        self.inner.reap(min, &mut |c| done.push(c))?;
        let count = done.len() as u32;
        for completion in done {
            let slot = completion.slot as usize;
            assert!(
                self.inner_in_flight > 0 && matches!(self.pending[slot], Pending::Inner { .. }),
                "invariant: a completion of the array's queue (slot {slot}) matches an operation submitted to it"
            );
            self.inner_in_flight -= 1;
            if let Pending::Inner {
                read: Some((epoch, first)),
            } = self.pending[slot]
            {
                let mut state = self.shared.lock();
                if let Ok(len) = completion.result {
                    let buffer = &mut self.inner.buffer_mut(completion.slot)[..len as usize];
                    state.pages.overlay(first, buffer);
                }
                state.pages.end_read(epoch);
            }
            self.pending[slot] = Pending::Idle;
            on_complete(completion);
        }
        Ok(count)
    }

    /// The oldest ticket this queue waits for.
    fn oldest_ticket(&self) -> Option<u64> {
        self.pending
            .iter()
            .filter_map(|p| match p {
                Pending::Commit { ticket, .. } => Some(*ticket),
                _ => None,
            })
            .min()
    }
}

impl Queue for CachedQueue {
    fn depth(&self) -> u32 {
        self.inner.depth()
    }

    fn buffer_mut(&mut self, slot: u32) -> &mut [u8] {
        self.inner.buffer_mut(slot)
    }

    fn leak_buffers(&mut self) {
        self.inner.leak_buffers();
    }

    fn buffer(&self, slot: u32) -> &[u8] {
        self.inner.buffer(slot)
    }

    fn submit(
        &mut self,
        slot: u32,
        op: OpKind,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> io::Result<()> {
        assert!(
            matches!(self.pending[slot as usize], Pending::Idle),
            "invariant: slot {slot} is submitted again only after its operation completed"
        );
        let block = BLOCK_BYTES as u64;
        if !matches!(op, OpKind::Flush)
            && (!offset.is_multiple_of(block) || u64::from(len) % block != 0)
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        match op {
            OpKind::Read => self.read(slot, offset, len),
            OpKind::Write => self.write(slot, offset, len, fua),
            OpKind::Flush => {
                self.flush(slot);
                Ok(())
            }
            // Reads after a discard may return the old data: cached blocks
            // of the range stay valid answers, and are written back later.
            OpKind::Discard => self.submit_inner(slot, op, offset, len, fua, None),
        }
    }

    fn reap(
        &mut self,
        min_complete: u32,
        on_complete: &mut dyn FnMut(Completion),
    ) -> io::Result<u32> {
        let mut count = self.collect(on_complete)?;
        while count < min_complete {
            let others = self.flushes_in_flight > 0 || self.commits > 0;
            if let Some(ticket) = self.oldest_ticket() {
                let journal = self.shared.journal_mode_log();
                let wait = (self.inner_in_flight > 0 || self.flushes_in_flight > 0).then_some(POLL);
                if journal.commit_or_wait(ticket, wait) == Commit::Pending
                    && self.inner_in_flight > 0
                {
                    count += self.reap_inner(0, on_complete)?;
                }
            } else if self.inner_in_flight > 0 && !others {
                count += self.reap_inner(1, on_complete)?;
                continue;
            } else if self.flushes_in_flight > 0 {
                let timeout = if self.inner_in_flight > 0 {
                    POLL
                } else {
                    Duration::from_secs(1)
                };
                if let Ok(completion) = self.done_rx.recv_timeout(timeout) {
                    self.flush_done(&completion);
                    on_complete(completion);
                    count += 1;
                }
            } else if self.ready.is_empty() {
                // Nothing in flight: nothing to wait for.
                break;
            }
            count += self.collect(on_complete)?;
        }
        Ok(count)
    }

    fn completes_inline(&self) -> bool {
        self.inner.completes_inline()
    }
}
