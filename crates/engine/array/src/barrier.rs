//! The barrier between client writes and a resync or rebuild running
//! beside them (see [`Barrier`]).

use std::sync::atomic::{AtomicU64, Ordering};
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
///
/// Each bucket also counts, in the high half of its word, the writes that
/// ever tried to enter it and the holds raised over it (a generation).
/// A rebuild reading ahead of its hold uses it: it notes the buckets'
/// words while no write is in flight there ([`Barrier::quiet`]), reads,
/// and when it then raises the hold, the words it replaces say whether
/// any write (or another holder) came in between ([`Barrier::raise`]);
/// if none did, what it read is what it would read under the hold.
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

/// A bucket word's low half: the writes in flight.
const IN_FLIGHT: u64 = (1 << 32) - 1;
/// One step of a bucket word's high half, the generation: a write trying
/// to enter, or a hold raised.
const GENERATION: u64 = 1 << 32;

/// The words of some regions' buckets at a moment when no client write
/// was in flight in them (see [`Barrier::quiet`]).
#[derive(Debug)]
pub(crate) struct Quiet {
    first: u64,
    words: Vec<u64>,
}

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
            self.counts[b].0.fetch_add(GENERATION + 1, Ordering::SeqCst);
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
            assert!(before & IN_FLIGHT > 0, "barrier count underflow");
        }
    }

    /// Whether the `raised` value holds bucket `bucket`.
    fn holds(raised: u64, bucket: usize) -> bool {
        let (first, span) = ((raised >> 8) - 1, raised & 0xff);
        (bucket as u64 + BARRIER_BUCKETS - first % BARRIER_BUCKETS) % BARRIER_BUCKETS < span
    }

    /// The buckets of regions `first..=last`, in order (at most every
    /// bucket once).
    fn region_buckets(first: u64, last: u64) -> impl Iterator<Item = usize> {
        let span = (last - first + 1).min(BARRIER_BUCKETS);
        (first..first + span).map(|region| (region % BARRIER_BUCKETS) as usize)
    }

    /// The words of regions `first..=last`'s buckets now, if no client
    /// write is in flight in any of them (else `None`): what a read of
    /// those regions started after this sees stays so until a write enters
    /// one of them, which [`Barrier::raise`] given this tells.
    pub(crate) fn quiet(&self, first: u64, last: u64) -> Option<Quiet> {
        debug_assert!(first <= last);
        let words: Vec<u64> = Self::region_buckets(first, last)
            .map(|b| self.counts[b].0.load(Ordering::SeqCst))
            .collect();
        words
            .iter()
            .all(|w| w & IN_FLIGHT == 0)
            .then_some(Quiet { first, words })
    }

    /// Hold regions `first..=last` (their numbers): returns once no client
    /// write to their buckets is in flight; new ones wait until
    /// [`Barrier::lower`]. A stripe of a RAID 4/5/6 can cross the edge of
    /// a region, and whatever copies it must hold both.
    ///
    /// Given `since` (taken by [`Barrier::quiet`] for the same regions),
    /// returns whether the regions stayed quiet from then until the hold
    /// took effect: no client write tried to enter their buckets and no
    /// other hold was raised over them meanwhile. A write that entered
    /// before `since` had left by then (`quiet` saw none in flight); one
    /// that came after counted itself in the word this replaces, or saw
    /// the hold and waits.
    pub(crate) fn raise(&self, first: u64, last: u64, since: Option<&Quiet>) -> bool {
        debug_assert!(first <= last);
        let span = (last - first + 1).min(BARRIER_BUCKETS);
        self.raised.store((first + 1) << 8 | span, Ordering::SeqCst);
        let mut quiet = since.is_some_and(|q| q.first == first && q.words.len() as u64 == span);
        for (i, bucket) in Self::region_buckets(first, last).enumerate() {
            let before = self.counts[bucket]
                .0
                .fetch_add(GENERATION, Ordering::SeqCst);
            if quiet {
                quiet = since.is_some_and(|q| q.words[i] == before);
            }
            while self.counts[bucket].0.load(Ordering::SeqCst) & IN_FLIGHT != 0 {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        quiet
    }

    pub(crate) fn lower(&self) {
        {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.raised.store(0, Ordering::SeqCst);
        }
        self.lowered.notify_all();
    }
}

/// One bucket's word, alone on its cache line: client writes in flight in
/// the low half ([`IN_FLIGHT`]), the generation in the high half
/// ([`GENERATION`]). Writers on different workers touch different
/// buckets, and a shared line would make each count a cross-core transfer.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Bucket(AtomicU64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_regions_hold_exactly_their_buckets() {
        let barrier = Barrier::new();
        barrier.raise(3, 5, None);
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
        barrier.raise(BARRIER_BUCKETS - 1, BARRIER_BUCKETS, None);
        assert!(barrier.try_enter(region(0), 4096).is_err());
        assert!(barrier.try_enter(region(1), 4096).is_ok());
        barrier.leave(region(1), 4096);
        barrier.lower();
        barrier.raise(0, 2 * BARRIER_BUCKETS, None);
        assert!((0..BARRIER_BUCKETS).all(|r| barrier.try_enter(region(r), 1).is_err()));
        barrier.lower();
    }

    /// A hold raised after a read ahead tells whether any write could
    /// have changed what was read: one that entered the regions' buckets
    /// since (even if it left again), one in flight when the read began
    /// (then there is nothing to compare with), another hold over them.
    #[test]
    fn a_hold_tells_whether_its_regions_stayed_quiet_since_a_read_ahead() {
        let barrier = Barrier::new();
        let region = |r: u64| r * BARRIER_REGION_BYTES;
        // Nothing happened: quiet, also with writes elsewhere meanwhile.
        let quiet = barrier.quiet(3, 4).unwrap();
        barrier.try_enter(region(10), 4096).unwrap();
        barrier.leave(region(10), 4096);
        assert!(barrier.raise(3, 4, Some(&quiet)));
        barrier.lower();
        // A write to region 4 that came and went.
        let quiet = barrier.quiet(3, 4).unwrap();
        barrier.try_enter(region(4) + 8192, 4096).unwrap();
        barrier.leave(region(4) + 8192, 4096);
        assert!(!barrier.raise(3, 4, Some(&quiet)));
        barrier.lower();
        // A write in flight: no quiet moment to read from.
        barrier.try_enter(region(3), 4096).unwrap();
        assert!(barrier.quiet(3, 4).is_none());
        barrier.leave(region(3), 4096);
        // Another holder over region 3 between the read and the hold.
        let quiet = barrier.quiet(3, 4).unwrap();
        barrier.raise(3, 3, None);
        barrier.lower();
        assert!(!barrier.raise(3, 4, Some(&quiet)));
        barrier.lower();
        // The hold must cover the regions the read ahead noted.
        let quiet = barrier.quiet(3, 4).unwrap();
        assert!(!barrier.raise(3, 5, Some(&quiet)));
        barrier.lower();
        assert!(!barrier.raise(3, 4, None));
        barrier.lower();
        // A region sharing a bucket (64 regions on) counts as the same.
        let quiet = barrier.quiet(3, 4).unwrap();
        barrier
            .try_enter(region(3 + BARRIER_BUCKETS), 4096)
            .unwrap();
        barrier.leave(region(3 + BARRIER_BUCKETS), 4096);
        assert!(!barrier.raise(3, 4, Some(&quiet)));
        barrier.lower();
        // The counts are intact: a write enters and leaves as before.
        assert!(barrier.try_enter(region(3), 4096).is_ok());
        barrier.leave(region(3), 4096);
        assert!(barrier.quiet(0, BARRIER_BUCKETS - 1).is_some());
    }

    /// A write racing the hold either is seen by it or waits for it: it
    /// never lands unseen between a read ahead and the hold.
    #[test]
    fn a_write_racing_a_hold_is_seen_by_it_or_waits_for_it() {
        let barrier = std::sync::Arc::new(Barrier::new());
        for _ in 0..200 {
            let quiet = barrier.quiet(0, 0).unwrap();
            let entered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let writer = {
                let (barrier, entered) = (barrier.clone(), entered.clone());
                std::thread::spawn(move || {
                    if barrier.try_enter(4096, 4096).is_ok() {
                        entered.store(true, Ordering::SeqCst);
                        barrier.leave(4096, 4096);
                    }
                })
            };
            let stayed_quiet = barrier.raise(0, 0, Some(&quiet));
            // Held now: a write that entered has left (the raise waited);
            // if one entered, the hold must not call the region quiet.
            let wrote = entered.load(Ordering::SeqCst);
            assert!(!(wrote && stayed_quiet), "a write slipped in unseen");
            barrier.lower();
            writer.join().unwrap();
        }
    }
}
