//! md's write journal as the cache's journal (md's write-back mode).
//!
//! A cached write is acknowledged once its pages are durable in the log as
//! data-only units, which stay in the log until the cache has written them
//! back (through the array, which logs them again with their parity) and
//! flushed the members. After a crash the assembly replays them, nvraid's
//! or the kernel's.
//!
//! The adapter lives here, with the cache depending on `nvraid-array`
//! (never the reverse): the array knows nothing of caches, and the write
//! [`MdJournal::prepare_cached`] makes ready travels to the append as a
//! typed [`Prepared::Md`], moved, not boxed.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvraid_array::journal::MdJournal;
use nvraid_array::Array;

use super::{Commit, JournalLog, Prepared};

/// md's write journal of `array`, as a [`JournalLog`].
pub struct MdCacheLog {
    array: Arc<Array>,
}

impl MdCacheLog {
    /// `stripes_max`: the most stripes held data-only in the log
    /// (`MdJournal::set_cached_stripes_max`; its default when `None`).
    ///
    /// # Panics
    /// When `array` keeps no md write journal (callers check
    /// `Array::md_journal` first).
    pub fn new(array: Arc<Array>, stripes_max: Option<u32>) -> Self {
        let journal = array.md_journal().expect("an array with md's journal");
        if let Some(max) = stripes_max {
            journal.set_cached_stripes_max(max as usize);
        }
        MdCacheLog { array }
    }

    fn journal(&self) -> &MdJournal {
        self.array.md_journal().expect("checked at new")
    }
}

impl JournalLog for MdCacheLog {
    fn name(&self) -> String {
        format!("md's write journal {}", self.journal().spec())
    }
    fn prepare(&self, offset: u64, data: &[u8]) -> Result<Prepared, String> {
        self.journal()
            .prepare_cached(offset, data)
            .map(Prepared::Md)
    }
    fn append(&self, offset: u64, data: &[u8], prepared: Prepared) -> Result<Option<u64>, String> {
        match prepared {
            Prepared::Md(write) => self.journal().enqueue_prepared(&self.array, write),
            Prepared::Nothing => self.journal().enqueue_cached(&self.array, offset, data),
        }
    }
    fn write_back_first(&self) -> bool {
        true
    }
    fn commit_or_wait(&self, ticket: u64, timeout: Option<Duration>) -> Commit {
        let start = Instant::now();
        loop {
            match self.journal().ready(&self.array, ticket) {
                Ok(true) => return Commit::Durable,
                Err(_) => return Commit::Failed,
                Ok(false) => {}
            }
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            if left.is_some_and(|l| l.is_zero()) {
                return Commit::Pending;
            }
            if self.journal().wants_room() {
                // The ring is full: the write-back must move its tail.
                std::thread::sleep(Duration::from_micros(20));
            } else {
                // A batch is being written (ours, maybe): wait for it.
                let most = Duration::from_millis(1);
                self.journal()
                    .wait_ready(ticket, left.map_or(most, |l| l.min(most)));
            }
        }
    }
    fn slices(&self) -> bool {
        true
    }
    fn held_share(&self) -> (u64, u64) {
        self.journal().held_share(&self.array)
    }
    fn committed(&self) -> (u64, bool) {
        self.journal().committed()
    }
    fn failure(&self) -> Option<String> {
        self.journal()
            .failure()
            .map(|why| format!("md's write journal {}: {why}", self.journal().spec()))
    }
    fn usage(&self) -> (u64, u64) {
        self.journal().usage()
    }
    fn wants_room(&self) -> bool {
        self.journal().wants_room()
    }
    fn head(&self) -> (u64, u64) {
        (self.journal().newest(), 0)
    }
    fn set_tail(&self, tail: u64, _: u64) -> io::Result<()> {
        self.journal().release_through(tail);
        self.journal()
            .checkpoint(&self.array)
            .map_err(|e| io::Error::other(e.to_string()))
    }
    fn mark_failed(&self, why: String) {
        self.journal().mark_failed(why);
        let _ = self.array.record_journal_failure();
    }
    fn rescue(&self) {
        self.journal().allow_unlogged();
    }
}
