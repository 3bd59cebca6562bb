//! nvraid-cache: write caching between the NBD server and an array.
//!
//! [`CachedTarget`] wraps any [`Target`] and is one itself, so the server
//! runs on it unchanged. Three modes (`nvraid serve --cache`):
//! - `none`: no wrapper at all; every acknowledged write is on the members;
//! - `writeback`: writes are acknowledged once in RAM and written back by a
//!   background thread; FLUSH and FUA wait until the data is on the array
//!   and the array flushed; an acknowledged write not yet flushed is lost
//!   if the process dies;
//! - `journal`: writes are acknowledged once durable in a journal on a
//!   separate member ([`journal`]), and written back later as in
//!   `writeback`; after a crash the journal is replayed onto the array
//!   before it is served again, so no acknowledged write is lost.
//!
//! The cache works in 4 KiB blocks and says so ([`Target::sector_bytes`]),
//! so the server never hands it a partial block. Dirty data is bounded;
//! writers wait for room. `pages` explains when a cached block may be
//! dropped; `writeback` is the thread that writes blocks back.

pub mod journal;
mod pages;
mod queue;
mod writeback;

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use nvraid_io::queue::{Completion, Queue, Target};

use journal::format::BLOCK_BYTES;
use journal::JournalLog;
use pages::Pages;

/// How writes are acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// In RAM: fast, lost on a crash unless flushed.
    WriteBack,
    /// Durable in the journal.
    Journal,
}

/// Limits of a cache.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// The most dirty data held; writers wait above it.
    pub dirty_max_bytes: u64,
    /// Dirty data above which the write-back thread starts writing.
    pub background_bytes: u64,
    /// Dirty data older than this is written back even below
    /// `background_bytes` (checked once per period).
    pub expire: Duration,
}

impl Default for CacheOptions {
    /// `writeback`'s limits: 1 GiB dirty at most, written back from 256 MiB.
    fn default() -> Self {
        CacheOptions {
            dirty_max_bytes: 1 << 30,
            background_bytes: 256 << 20,
            expire: Duration::from_secs(5),
        }
    }
}

impl CacheOptions {
    /// The default limits of `mode`, each a quarter written back in the
    /// background: 1 GiB in `writeback`, 64 MiB in `journal`.
    ///
    /// In `journal` mode what RAM holds is durable in the journal already,
    /// and all of it holds journal space until it is written back. Holding
    /// more dirty data buys no safety, only a longer replay, and it costs
    /// throughput: the pages, the dirty index and the journal's table of
    /// what it holds grow with it, and every write probes them at random.
    /// On a RAID 5 with md's journal, sustained 4 KiB random writes ran at
    /// 0.90 of `writeback` with 1 GiB and 0.94 with 64 MiB in the bench
    /// (0.96 in alternating runs; 32 MiB no better:
    /// docs/performance-history.md#2026-11-26-fourth-session-journal-holds-64-mib-in-ram-by-default).
    /// `writeback` keeps 1 GiB: there RAM is what absorbs a burst, and
    /// 64 MiB was no faster.
    pub fn for_mode(mode: CacheMode) -> CacheOptions {
        match mode {
            CacheMode::WriteBack => CacheOptions::default(),
            CacheMode::Journal => CacheOptions {
                dirty_max_bytes: 64 << 20,
                background_bytes: 16 << 20,
                ..CacheOptions::default()
            },
        }
    }

    /// Limits of `dirty_max_bytes`, written back from a quarter of it.
    pub fn with_dirty_max(self, dirty_max_bytes: u64) -> CacheOptions {
        CacheOptions {
            dirty_max_bytes,
            background_bytes: dirty_max_bytes / 4,
            ..self
        }
    }
}

/// What the cache holds and has done, for `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub dirty_bytes: u64,
    pub cached_bytes: u64,
    /// Ring bytes in use, and the ring's size (journal mode).
    pub journal_used_bytes: u64,
    pub journal_ring_bytes: u64,
    /// Why the cache refuses writes, when it does.
    pub failure: Option<String>,
}

/// A flush (or FUA write) waiting for the write-back thread.
pub(crate) struct FlushWaiter {
    /// Every page dirty since this sequence number or earlier must be on
    /// the array first.
    pub upto: u64,
    pub slot: u32,
    /// The waiting queue's completions: a channel bounded by the queue's
    /// depth (each slot waits here at most once at a time, so a send never
    /// blocks).
    pub done: std::sync::mpsc::SyncSender<Completion>,
    /// Bytes to report on success (a FUA write's length).
    pub len: u32,
}

/// The cache's state behind its one lock.
pub(crate) struct State {
    pub pages: Pages,
    pub flushes: Vec<FlushWaiter>,
    /// Journals with slices ([`JournalLog::held_share`]): each append's
    /// ticket, and the sequence number its pages got in `pages`, oldest
    /// first (appends take both in order, under this lock).
    pub tickets: std::collections::VecDeque<(u64, u64)>,
    /// The cache is closing: write everything back and stop.
    pub stop: bool,
    /// A writer woke the write-back thread for background work, which has
    /// not looked since (writers wake it once).
    pub background_asked: bool,
    /// The last write-back error (errno), until a write-back succeeds.
    pub writeback_errno: Option<i32>,
}

pub(crate) struct Shared {
    pub inner: Arc<dyn Target>,
    pub mode: CacheMode,
    pub options: CacheOptions,
    pub state: Mutex<State>,
    /// Wakes the write-back thread.
    pub work: Condvar,
    /// Wakes writers waiting for room.
    pub room: Condvar,
    pub journal: Option<Box<dyn JournalLog>>,
    pub log: Arc<dyn Fn(&str) + Send + Sync>,
    /// `state.pages`'s count of dirty pages, read without the lock.
    pub dirty_pages: Arc<std::sync::atomic::AtomicU64>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The journal, for the work only journal mode does (commits waited
    /// for, checkpoints, slices).
    pub(crate) fn journal_mode_log(&self) -> &dyn JournalLog {
        let Some(journal) = self.journal.as_deref() else {
            panic!("invariant: journal work is done only in journal mode");
        };
        journal
    }

    /// Why writes are refused, if they are.
    pub fn failure(&self) -> Option<String> {
        self.journal.as_ref().and_then(|j| j.failure())
    }
}

/// A [`Target`] with a write cache in front.
pub struct CachedTarget {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl CachedTarget {
    /// A cache in `mode` over `inner`; `journal` is required in journal
    /// mode (replayed and opened by the caller). `log` gets one line per
    /// event worth telling (a failed journal, write-back errors).
    pub fn new(
        inner: Arc<dyn Target>,
        mode: CacheMode,
        journal: Option<Box<dyn JournalLog>>,
        options: CacheOptions,
        log: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> io::Result<CachedTarget> {
        if !inner.size_bytes().is_multiple_of(BLOCK_BYTES as u64) {
            return Err(io::Error::other(format!(
                "the array's size ({} bytes) is not a multiple of 4 KiB, which the cache needs",
                inner.size_bytes()
            )));
        }
        if (mode == CacheMode::Journal) != journal.is_some() {
            return Err(io::Error::other(
                "journal mode needs a journal, and only it",
            ));
        }
        let pages = Pages::default();
        let dirty_pages = pages.dirty_pages.clone();
        let shared = Arc::new(Shared {
            inner,
            mode,
            options,
            dirty_pages,
            state: Mutex::new(State {
                pages,
                flushes: Vec::new(),
                tickets: std::collections::VecDeque::new(),
                stop: false,
                background_asked: false,
                writeback_errno: None,
            }),
            work: Condvar::new(),
            room: Condvar::new(),
            journal,
            log,
        });
        let thread = writeback::start(shared.clone())?;
        Ok(CachedTarget {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// What the cache holds now.
    pub fn stats(&self) -> CacheStats {
        let (used, ring) = self.shared.journal.as_ref().map_or((0, 0), |j| j.usage());
        let failure = self.shared.failure();
        let state = self.shared.lock();
        CacheStats {
            dirty_bytes: state.pages.dirty_bytes(),
            cached_bytes: state.pages.map.len() as u64 * BLOCK_BYTES as u64,
            journal_used_bytes: used,
            journal_ring_bytes: ring,
            failure,
        }
    }

    /// Writes everything back, flushes the array, empties the journal and
    /// stops the write-back thread. Returns the first error.
    pub fn close(&self) -> io::Result<()> {
        {
            let mut state = self.shared.lock();
            state.stop = true;
            self.shared.work.notify_all();
        }
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        let state = self.shared.lock();
        match (state.pages.dirty_bytes(), state.writeback_errno) {
            (0, _) => Ok(()),
            (dirty, errno) => Err(io::Error::other(format!(
                "{dirty} bytes of cached writes could not be written to the array ({})",
                io::Error::from_raw_os_error(errno.unwrap_or(libc::EIO))
            ))),
        }
    }
}

impl Drop for CachedTarget {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Target for CachedTarget {
    fn size_bytes(&self) -> u64 {
        self.shared.inner.size_bytes()
    }

    fn sector_bytes(&self) -> u32 {
        self.shared.inner.sector_bytes().max(BLOCK_BYTES as u32)
    }

    fn writable(&self) -> bool {
        self.shared.inner.writable()
    }

    fn describe(&self) -> String {
        let mode = match self.shared.mode {
            CacheMode::WriteBack => "write-back cache".to_string(),
            CacheMode::Journal => format!(
                "journal on {}",
                self.shared
                    .journal
                    .as_ref()
                    .map_or_else(String::new, |j| j.name())
            ),
        };
        format!("{} ({mode})", self.shared.inner.describe())
    }

    fn open_queue(&self, depth: u32, max_io_bytes: u32) -> io::Result<Box<dyn Queue>> {
        let inner = self.shared.inner.open_queue(depth, max_io_bytes)?;
        Ok(Box::new(queue::CachedQueue::new(
            self.shared.clone(),
            inner,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_has_its_limits_and_a_given_bound_replaces_both() {
        let writeback = CacheOptions::for_mode(CacheMode::WriteBack);
        assert_eq!(
            (writeback.dirty_max_bytes, writeback.background_bytes),
            (1 << 30, 256 << 20)
        );
        let journal = CacheOptions::for_mode(CacheMode::Journal);
        assert_eq!(
            (journal.dirty_max_bytes, journal.background_bytes),
            (64 << 20, 16 << 20)
        );
        for mode in [CacheMode::WriteBack, CacheMode::Journal] {
            let given = CacheOptions::for_mode(mode).with_dirty_max(8 << 20);
            assert_eq!(
                (given.dirty_max_bytes, given.background_bytes),
                (8 << 20, 2 << 20)
            );
            assert_eq!(given.expire, Duration::from_secs(5));
        }
    }
}
