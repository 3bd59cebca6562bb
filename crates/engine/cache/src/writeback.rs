//! The write-back thread: the only writer of cached blocks to the array.
//!
//! It writes back, in address order, on four occasions: a FLUSH (or a FUA
//! write) is waiting; dirty data passed the background threshold; dirty
//! data has waited a whole `expire` period; in journal mode, the ring is
//! half full or a committer waits for room (a checkpoint: write everything
//! back, flush the array, move the journal's tail). At close it writes
//! everything back and empties the journal.

use std::io;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvraid_io::queue::{OpKind, Queue};

use crate::journal::format::BLOCK_BYTES;
use crate::{CacheMode, FlushWaiter, Shared};

/// Write-back I/Os in flight at once, and the largest.
const DEPTH: u32 = 64;
const IO_BYTES: u32 = 1 << 20;
/// Bytes copied out of the cache (under its lock) per round.
const ROUND_BYTES: usize = 8 << 20;
/// Dirty pages looked at (under the cache's lock) per round.
const SCAN_MAX: usize = 16384;

pub(crate) fn start(shared: Arc<Shared>) -> io::Result<JoinHandle<()>> {
    let (opened_tx, opened) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("nvraid-writeback".into())
        .spawn(move || match shared.inner.open_queue(DEPTH, IO_BYTES) {
            Ok(queue) => {
                let _ = opened_tx.send(Ok(()));
                WriteBack::new(shared, queue).run();
            }
            Err(e) => drop(opened_tx.send(Err(e))),
        })?;
    opened
        .recv()
        .unwrap_or_else(|_| Err(io::Error::other("the write-back thread died")))?;
    Ok(thread)
}

/// What the thread does next.
enum Job {
    Flush(Vec<FlushWaiter>),
    Checkpoint,
    /// The older half of what the journal holds (see
    /// [`crate::journal::JournalLog::held_share`]).
    Slice,
    Background,
    Aged,
    /// The journal failed: put what it acknowledged on the array.
    Rescue,
    Close,
}

struct WriteBack {
    shared: Arc<Shared>,
    queue: Box<dyn Queue>,
    /// Pages dirty since this sequence number or earlier have waited a
    /// whole period.
    aged_seq: u64,
    period_start: Instant,
    /// Where the current sweep of the dirty set has got to.
    cursor: u64,
    rescued: bool,
    /// No background write-back before this (after an error).
    quiet_until: Option<Instant>,
}

impl WriteBack {
    fn new(shared: Arc<Shared>, queue: Box<dyn Queue>) -> WriteBack {
        WriteBack {
            shared,
            queue,
            aged_seq: 0,
            period_start: Instant::now(),
            cursor: 0,
            rescued: false,
            quiet_until: None,
        }
    }

    fn run(mut self) {
        loop {
            let job = self.next_job();
            match job {
                Job::Flush(waiters) => self.flush(waiters),
                Job::Checkpoint => {
                    let _ = self.checkpoint();
                }
                Job::Slice => {
                    let _ = self.slice();
                }
                Job::Background => {
                    let upto = self.shared.lock().pages.seq;
                    let _ = self.write_back(upto);
                }
                Job::Aged => {
                    let upto = self.aged_seq;
                    self.aged_seq = self.shared.lock().pages.seq;
                    self.period_start = Instant::now();
                    let _ = match self.shared.mode {
                        CacheMode::Journal => self.checkpoint(),
                        CacheMode::WriteBack => self.write_back(upto),
                    };
                }
                Job::Rescue => {
                    self.rescued = true;
                    if let Some(journal) = &self.shared.journal {
                        journal.rescue();
                    }
                    (self.shared.log)(&format!(
                        "nvraid: {}; the array takes no more writes; writing the writes it acknowledged to the array",
                        self.shared.failure().unwrap_or_default()
                    ));
                    let written = self.write_back(u64::MAX).and_then(|()| self.flush_inner());
                    if written.is_ok() {
                        (self.shared.log)("nvraid: every acknowledged write is on the array");
                    }
                }
                Job::Close => {
                    let _ = match self.shared.journal {
                        Some(_) if self.shared.failure().is_none() => self.checkpoint(),
                        _ => self.write_back(u64::MAX).and_then(|()| self.flush_inner()),
                    };
                    return;
                }
            }
        }
    }

    /// Waits for something to do. The journal is asked before the cache's
    /// lock is taken (only an append holds both, the journal's inside the
    /// cache's).
    fn next_job(&mut self) -> Job {
        loop {
            let (journal_due, journal_failed, journal_used) = match &self.shared.journal {
                Some(journal) => {
                    let (used, ring) = journal.usage();
                    (
                        journal.wants_room() || used > ring / 2,
                        journal.failure().is_some(),
                        used > 0,
                    )
                }
                None => (false, false, false),
            };
            let slices = self.shared.journal.as_ref().is_some_and(|j| j.slices());
            let slice_due = slices
                && self.shared.journal.as_ref().is_some_and(|j| {
                    let (held, share) = j.held_share();
                    held > share / 2
                });
            // A journal that failed: what it acknowledged goes to the array
            // first (a flush or a stop waiting meanwhile then finds it there).
            if journal_failed && !self.rescued {
                return Job::Rescue;
            }
            let mut state = self.shared.lock();
            state.background_asked = false;
            if state.stop {
                return Job::Close;
            }
            if !state.flushes.is_empty() {
                return Job::Flush(std::mem::take(&mut state.flushes));
            }
            let quiet = self.quiet_until.is_some_and(|t| Instant::now() < t);
            if (journal_due || slice_due) && !journal_failed && !quiet {
                return if slices && (slice_due || state.tickets.len() > 1) {
                    Job::Slice
                } else {
                    Job::Checkpoint
                };
            }
            let dirty = state.pages.dirty_bytes();
            if dirty > self.shared.options.background_bytes && !quiet {
                return Job::Background;
            }
            let expire = self.shared.options.expire;
            let waited = self.period_start.elapsed();
            if waited >= expire && !quiet {
                if dirty > 0 || (journal_used && !journal_failed) {
                    return Job::Aged;
                }
                self.aged_seq = state.pages.seq;
                self.period_start = Instant::now();
                continue;
            }
            // In journal mode a committer's call for room may come between
            // the look at the journal and this wait: wait briefly.
            let mut timeout = expire.saturating_sub(waited).max(Duration::from_millis(1));
            if self.shared.journal.is_some() {
                timeout = timeout.min(Duration::from_millis(20));
            }
            drop(
                self.shared
                    .work
                    .wait_timeout(state, timeout)
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
    }

    /// Completes flush waiters once every page they wait for is on the
    /// array and the array flushed.
    fn flush(&mut self, waiters: Vec<FlushWaiter>) {
        let upto = waiters.iter().map(|w| w.upto).max().unwrap_or(0);
        let result = self.write_back(upto).and_then(|()| self.flush_inner());
        for waiter in waiters {
            let _ = waiter.done.send(nvraid_io::queue::Completion {
                slot: waiter.slot,
                result: result.map(|()| waiter.len),
            });
        }
    }

    /// Journal mode: write everything the journal holds back, flush the
    /// array, and free the ring up to the head noted first.
    fn checkpoint(&mut self) -> Result<(), i32> {
        let shared = self.shared.clone();
        let journal = shared.journal_mode_log();
        let (head, head_seq) = journal.head();
        let upto = self.shared.lock().pages.seq;
        self.write_back(upto)?;
        self.flush_inner()?;
        journal
            .set_tail(head, head_seq)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        // (Empty unless the journal releases in slices.)
        let mut state = self.shared.lock();
        let released = state.tickets.partition_point(|&(t, _)| t <= head);
        state.tickets.drain(..released);
        Ok(())
    }

    /// Journal with slices: write back the pages of the older half of the
    /// appends the journal holds, flush the array, and release them; the
    /// newer half stays in the journal (and in the cache) for the next
    /// slice, so writers go on while this one runs.
    fn slice(&mut self) -> Result<(), i32> {
        let shared = self.shared.clone();
        let journal = shared.journal_mode_log();
        let picked = {
            let state = self.shared.lock();
            let n = state.tickets.len();
            state.tickets.get(n.saturating_sub(1) / 2).copied()
        };
        let Some((ticket, upto)) = picked else {
            return self.checkpoint();
        };
        self.write_back(upto)?;
        self.flush_inner()?;
        journal
            .set_tail(ticket, 0)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let mut state = self.shared.lock();
        let released = state.tickets.partition_point(|&(t, _)| t <= ticket);
        state.tickets.drain(..released);
        Ok(())
    }

    fn flush_inner(&mut self) -> Result<(), i32> {
        let submitted = self.queue.submit(0, OpKind::Flush, 0, 0, false);
        let result = match submitted {
            Ok(()) => {
                let mut result = Err(libc::EIO);
                let reaped = self.queue.reap(1, &mut |c| result = c.result.map(drop));
                reaped.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
                result
            }
            Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        self.note(result)
    }

    /// Records the outcome of a write-back step: an error is logged once,
    /// kept for `close`, and quiets background work for a second.
    fn note(&mut self, result: Result<(), i32>) -> Result<(), i32> {
        let mut state = self.shared.lock();
        match result {
            Ok(()) => {
                state.writeback_errno = None;
                self.quiet_until = None;
            }
            Err(errno) => {
                if state.writeback_errno != Some(errno) {
                    (self.shared.log)(&format!(
                        "nvraid: writing cached data to the array failed: {}; it stays cached and is retried",
                        io::Error::from_raw_os_error(errno)
                    ));
                }
                state.writeback_errno = Some(errno);
                self.quiet_until = Some(Instant::now() + Duration::from_secs(1));
            }
        }
        result
    }

    /// Writes back every page dirty since `upto` or earlier.
    ///
    /// The dirty set is swept in address order, a window at a time (the
    /// cache's lock is held for one window's scan and copies, never for a
    /// scan of the whole set); sweeps repeat until one finds nothing, as
    /// pages written again during a sweep may need another.
    fn write_back(&mut self, upto: u64) -> Result<(), i32> {
        let mut found = false;
        loop {
            let (runs, swept) = self.take_round(upto);
            found |= !runs.is_empty();
            if swept {
                self.cursor = 0;
                if !std::mem::take(&mut found) && runs.is_empty() {
                    return Ok(());
                }
            }
            if runs.is_empty() {
                continue;
            }
            let mut results = vec![Err(libc::EIO); runs.len()];
            let mut in_flight = 0;
            for (slot, run) in runs.iter().enumerate() {
                let offset = run.first * BLOCK_BYTES as u64;
                let len = (run.pages.len() * BLOCK_BYTES) as u32;
                match self
                    .queue
                    .submit(slot as u32, OpKind::Write, offset, len, false)
                {
                    Ok(()) => in_flight += 1,
                    Err(e) => results[slot] = Err(e.raw_os_error().unwrap_or(libc::EIO)),
                }
            }
            while in_flight > 0 {
                let reaped = self.queue.reap(1, &mut |c| {
                    assert!(
                        (c.slot as usize) < results.len() && in_flight > 0,
                        "invariant: a write-back completion (slot {}) matches a run submitted",
                        c.slot
                    );
                    results[c.slot as usize] = c.result.map(drop);
                    in_flight -= 1;
                });
                if reaped.is_err() {
                    break;
                }
            }
            let mut error = None;
            {
                let mut state = self.shared.lock();
                for (run, result) in runs.iter().zip(&results) {
                    for (i, &seq) in run.pages.iter().enumerate() {
                        let index = run.first + i as u64;
                        match result {
                            Ok(()) => state.pages.written_back(index, seq),
                            Err(errno) => {
                                state.pages.write_failed(index);
                                error.get_or_insert(*errno);
                            }
                        }
                    }
                }
                state.pages.end_round();
            }
            self.shared.room.notify_all();
            self.note(error.map_or(Ok(()), Err))?;
        }
    }

    /// Picks the next round's runs (contiguous dirty pages, copied into
    /// the slots' buffers and marked busy) from the dirty pages at or after
    /// the cursor, looking at no more than `SCAN_MAX` of them. Returns the
    /// runs and whether the sweep reached the end of the dirty set.
    fn take_round(&mut self, upto: u64) -> (Vec<Run>, bool) {
        let pages_per_io = IO_BYTES as usize / BLOCK_BYTES;
        let mut runs: Vec<Run> = Vec::new();
        let mut copied = 0usize;
        let mut state = self.shared.lock();
        let pages = &mut state.pages;
        let mut scanned = 0usize;
        let mut swept = true;
        // The dirty set is walked in place (a round of single-page runs
        // stops after DEPTH of them; collecting SCAN_MAX keys first cost
        // more than the round).
        let (dirty, map) = (&pages.dirty, &mut pages.map);
        for &index in dirty.range(self.cursor..).take(SCAN_MAX) {
            scanned += 1;
            if copied == ROUND_BYTES {
                swept = false;
                break;
            }
            self.cursor = index + 1;
            let Some(page) = map.get_mut(&index) else {
                panic!("invariant: a page in the dirty set is cached (page {index})");
            };
            if !page.is_dirty() || page.busy || page.dirty_from > upto {
                continue;
            }
            let extends = runs.last().is_some_and(|run| {
                run.first + run.pages.len() as u64 == index && run.pages.len() < pages_per_io
            });
            if !extends {
                if runs.len() == DEPTH as usize {
                    self.cursor = index;
                    swept = false;
                    break;
                }
                runs.push(Run {
                    first: index,
                    pages: Vec::new(),
                });
            }
            let slot = runs.len() - 1;
            let Some(run) = runs.last_mut() else {
                unreachable!("a run was pushed above");
            };
            page.busy = true;
            let at = run.pages.len() * BLOCK_BYTES;
            self.queue.buffer_mut(slot as u32)[at..at + BLOCK_BYTES].copy_from_slice(&page.data);
            run.pages.push(page.seq);
            copied += BLOCK_BYTES;
        }
        if scanned == SCAN_MAX {
            swept = false;
        }
        (runs, swept)
    }
}

/// Contiguous pages written back by one I/O: the first page's index and
/// each page's sequence number as copied.
struct Run {
    first: u64,
    pages: Vec<u64>,
}
