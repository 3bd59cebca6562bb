//! The barrier between client writes and a resync or rebuild running
//! beside them (see [`Barrier`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// The barrier between client writes and a resync (md's barrier, in
/// regions): a resync copies one region of the array at a time (or a few
/// neighbouring ones), and while it does, no client write to them is in
/// flight or starts. Writers count themselves in per-bucket counters (a
/// region's bucket is its number modulo [`BARRIER_BUCKETS`]); the resync
/// raises its regions, waits for their buckets' counts to drain, copies,
/// and lowers them. A writer that finds a raised region's bucket among its
/// own waits (so a busy bucket cannot
/// starve the resync). The protocol is Dekker's: each side publishes, then
/// reads the other's (sequentially consistent atomics).
#[derive(Debug)]
pub(crate) struct Barrier {
    counts: Vec<Bucket>,
    /// The raised regions: 0 when none, else `(first + 1) << 8 | span`,
    /// the regions `first .. first + span` (`span` at most
    /// [`BARRIER_BUCKETS`]: more would hold every bucket anyway).
    raised: AtomicU64,
    lock: Mutex<()>,
    lowered: std::sync::Condvar,
}

/// Bytes per barrier region: the resync's unit.
pub const BARRIER_REGION_BYTES: u64 = 4 << 20;

/// Counters the regions hash into.
pub const BARRIER_BUCKETS: u64 = 64;

impl Barrier {
    pub(crate) fn new() -> Barrier {
        Barrier {
            counts: (0..BARRIER_BUCKETS).map(|_| Bucket::default()).collect(),
            raised: AtomicU64::new(0),
            lock: Mutex::new(()),
            lowered: std::sync::Condvar::new(),
        }
    }

    /// The buckets `[offset, offset + len)` touches (one or a few).
    fn buckets(offset: u64, len: u64) -> impl Iterator<Item = usize> {
        let first = offset / BARRIER_REGION_BYTES;
        let last = (offset + len.max(1) - 1) / BARRIER_REGION_BYTES;
        (first..=last.min(first + BARRIER_BUCKETS - 1)).map(|r| (r % BARRIER_BUCKETS) as usize)
    }

    /// A client write to `[offset, offset + len)` begins, unless a resync
    /// holds one of its buckets: then it is not counted and the raised
    /// region is returned.
    pub(crate) fn try_enter(&self, offset: u64, len: u64) -> Result<(), u64> {
        for b in Self::buckets(offset, len) {
            self.counts[b].0.fetch_add(1, Ordering::SeqCst);
        }
        let raised = self.raised.load(Ordering::SeqCst);
        let blocked = raised != 0 && Self::buckets(offset, len).any(|b| Self::holds(raised, b));
        if blocked {
            self.leave(offset, len);
            return Err(raised);
        }
        Ok(())
    }

    /// A client write to `[offset, offset + len)` begins; waits while a
    /// resync holds one of its buckets.
    pub(crate) fn enter(&self, offset: u64, len: u64) {
        while let Err(raised) = self.try_enter(offset, len) {
            let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            while self.raised.load(Ordering::SeqCst) == raised {
                guard = self.lowered.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// A client write that [`Barrier::enter`]ed has completed.
    pub(crate) fn leave(&self, offset: u64, len: u64) {
        for b in Self::buckets(offset, len) {
            let before = self.counts[b].0.fetch_sub(1, Ordering::SeqCst);
            assert!(before > 0, "barrier count underflow");
        }
    }

    /// Whether the `raised` value holds bucket `bucket`.
    fn holds(raised: u64, bucket: usize) -> bool {
        let (first, span) = ((raised >> 8) - 1, raised & 0xff);
        (bucket as u64 + BARRIER_BUCKETS - first % BARRIER_BUCKETS) % BARRIER_BUCKETS < span
    }

    /// Hold regions `first..=last` (their numbers): returns once no client
    /// write to their buckets is in flight; new ones wait until
    /// [`Barrier::lower`]. A stripe of a RAID 4/5/6 can cross the edge of
    /// a region, and whatever copies it must hold both.
    pub(crate) fn raise(&self, first: u64, last: u64) {
        debug_assert!(first <= last);
        let span = (last - first + 1).min(BARRIER_BUCKETS);
        self.raised.store((first + 1) << 8 | span, Ordering::SeqCst);
        for region in first..first + span {
            let bucket = (region % BARRIER_BUCKETS) as usize;
            while self.counts[bucket].0.load(Ordering::SeqCst) != 0 {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }

    pub(crate) fn lower(&self) {
        {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.raised.store(0, Ordering::SeqCst);
        }
        self.lowered.notify_all();
    }
}

/// One bucket's count of client writes in flight, alone on its cache line:
/// writers on different workers touch different buckets, and a shared
/// line would make each count a cross-core transfer.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Bucket(AtomicU32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_regions_hold_exactly_their_buckets() {
        let barrier = Barrier::new();
        barrier.raise(3, 5);
        let region = |r: u64| r * BARRIER_REGION_BYTES;
        for r in [3, 4, 5, 3 + BARRIER_BUCKETS] {
            assert!(barrier.try_enter(region(r), 4096).is_err(), "region {r}");
        }
        for r in [2, 6] {
            assert!(barrier.try_enter(region(r), 4096).is_ok(), "region {r}");
            barrier.leave(region(r), 4096);
        }
        // A write reaching into a held region from a free one waits.
        assert!(barrier.try_enter(region(6) - 4096, 8192).is_err());
        barrier.lower();
        assert!(barrier.try_enter(region(4), 4096).is_ok());
        barrier.leave(region(4), 4096);
        // Regions wrapping around the buckets, and more regions than buckets.
        barrier.raise(BARRIER_BUCKETS - 1, BARRIER_BUCKETS);
        assert!(barrier.try_enter(region(0), 4096).is_err());
        assert!(barrier.try_enter(region(1), 4096).is_ok());
        barrier.leave(region(1), 4096);
        barrier.lower();
        barrier.raise(0, 2 * BARRIER_BUCKETS);
        assert!((0..BARRIER_BUCKETS).all(|r| barrier.try_enter(region(r), 1).is_err()));
        barrier.lower();
    }
}
