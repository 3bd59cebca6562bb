//! What a [`MemTarget`](crate::MemTarget) does wrong, decided per operation.
//!
//! Operations are numbered from 0 in submission order over all queues of a
//! target (flushes and discards included). For each one the first matching
//! rule below wins:
//!
//! | rule | effect |
//! |---|---|
//! | [`Faults::vanish_after`] `n` | op `n` and later fail with ENODEV; new queues fail to open |
//! | [`Faults::fail_from_op`] `(n, errno)` | op `n` and later fail with `errno` |
//! | [`Faults::bad_ranges`] | a read (or write/discard) touching a range fails with its errno |
//! | [`Faults::torn_write`] | a write touching the range lands its first K bytes, then fails with EIO |
//! | [`Faults::short_from_op`] `n` | op `n` and later move half their length and report it |
//!
//! [`Faults::latency`] delays every completion; [`Faults::fail_open`] makes
//! every `open_queue` fail.

use std::time::Duration;

use nvraid_io::queue::OpKind;

/// Reads and/or writes touching `[start, end)` fail with `errno`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadRange {
    pub start: u64,
    pub end: u64,
    /// Reads touching the range fail.
    pub reads: bool,
    /// Writes and discards touching the range fail.
    pub writes: bool,
    pub errno: i32,
}

impl BadRange {
    /// Reads, writes and discards touching `[start, end)` fail with EIO.
    pub fn eio(start: u64, end: u64) -> BadRange {
        BadRange {
            start,
            end,
            reads: true,
            writes: true,
            errno: libc::EIO,
        }
    }

    /// Only reads touching `[start, end)` fail with EIO (a latent sector
    /// error: the medium can still be rewritten).
    pub fn reads(start: u64, end: u64) -> BadRange {
        BadRange {
            writes: false,
            ..BadRange::eio(start, end)
        }
    }

    /// Only writes and discards touching `[start, end)` fail with EIO.
    pub fn writes(start: u64, end: u64) -> BadRange {
        BadRange {
            reads: false,
            ..BadRange::eio(start, end)
        }
    }

    /// The same range failing with another errno.
    pub fn errno(self, errno: i32) -> BadRange {
        BadRange { errno, ..self }
    }

    fn hits(&self, op: OpKind, offset: u64, len: u32) -> bool {
        let applies = match op {
            OpKind::Read => self.reads,
            OpKind::Write | OpKind::Discard => self.writes,
            OpKind::Flush => false,
        };
        applies && overlaps(offset, len, self.start, self.end)
    }
}

/// A write touching `[start, end)` lands only its first `keep_bytes` bytes
/// (counted from the write's own offset), then completes with EIO: power cut
/// in the middle of the write. The bytes that landed reach the durable image
/// too (they are on the medium), so [`MemTarget::crash`](crate::MemTarget::crash)
/// keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TornWrite {
    pub start: u64,
    pub end: u64,
    pub keep_bytes: u32,
}

/// Faults applied to each operation of a target. `Faults::default()` is a
/// healthy target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Ranges whose reads and/or writes fail.
    pub bad_ranges: Vec<BadRange>,
    /// `(n, errno)`: every operation from number `n` on fails with `errno`.
    pub fail_from_op: Option<(u64, i32)>,
    /// Every operation from number `n` on moves half its length and reports
    /// that short count (a caller bug detector: queues must not do this).
    pub short_from_op: Option<u64>,
    /// Added to every operation's completion time.
    pub latency: Duration,
    /// The device disappears after `n` operations: later ones fail with
    /// ENODEV and `open_queue` fails.
    pub vanish_after: Option<u64>,
    /// Writes touching this range are torn.
    pub torn_write: Option<TornWrite>,
    /// `open_queue` fails.
    pub fail_open: bool,
}

/// What happens to one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Carried out in full.
    Complete,
    /// Moves this many bytes and reports them.
    Short(u32),
    /// Moves this many bytes (a write), then reports EIO.
    Torn(u32),
    /// Moves nothing, reports the errno.
    Fail(i32),
}

impl Faults {
    /// Whether a device with this plan is gone after `submitted` operations.
    pub(crate) fn vanished(&self, submitted: u64) -> bool {
        self.vanish_after.is_some_and(|n| submitted >= n)
    }

    /// The outcome of operation number `nth`.
    pub(crate) fn outcome(&self, nth: u64, op: OpKind, offset: u64, len: u32) -> Outcome {
        if self.vanished(nth) {
            return Outcome::Fail(libc::ENODEV);
        }
        if let Some((from, errno)) = self.fail_from_op {
            if nth >= from {
                return Outcome::Fail(errno);
            }
        }
        if let Some(bad) = self.bad_ranges.iter().find(|b| b.hits(op, offset, len)) {
            return Outcome::Fail(bad.errno);
        }
        if let Some(torn) = self.torn_write {
            if op == OpKind::Write && overlaps(offset, len, torn.start, torn.end) {
                return Outcome::Torn(torn.keep_bytes.min(len));
            }
        }
        match self.short_from_op {
            Some(from) if nth >= from => Outcome::Short(len / 2),
            _ => Outcome::Complete,
        }
    }
}

/// Whether `[offset, offset + len)` and `[start, end)` share a byte.
fn overlaps(offset: u64, len: u32, start: u64, end: u64) -> bool {
    offset < end && offset + u64::from(len) > start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_by_default() {
        let faults = Faults::default();
        for op in [OpKind::Read, OpKind::Write, OpKind::Flush, OpKind::Discard] {
            assert_eq!(faults.outcome(1 << 40, op, 0, 4096), Outcome::Complete);
        }
        assert!(!faults.vanished(u64::MAX));
    }

    #[test]
    fn ranges_fail_only_what_touches_them() {
        let faults = Faults {
            bad_ranges: vec![
                BadRange::reads(4096, 8192),
                BadRange::writes(65536, 65537).errno(libc::ENOSPC),
            ],
            ..Faults::default()
        };
        let eio = Outcome::Fail(libc::EIO);
        assert_eq!(faults.outcome(0, OpKind::Read, 0, 4096), Outcome::Complete);
        assert_eq!(faults.outcome(0, OpKind::Read, 0, 4097), eio);
        assert_eq!(faults.outcome(0, OpKind::Read, 8191, 1), eio);
        assert_eq!(
            faults.outcome(0, OpKind::Read, 8192, 512),
            Outcome::Complete
        );
        assert_eq!(
            faults.outcome(0, OpKind::Write, 4096, 4096),
            Outcome::Complete
        );
        let enospc = Outcome::Fail(libc::ENOSPC);
        assert_eq!(faults.outcome(0, OpKind::Write, 0, 1 << 20), enospc);
        assert_eq!(faults.outcome(0, OpKind::Discard, 65536, 512), enospc);
        assert_eq!(
            faults.outcome(0, OpKind::Read, 65536, 512),
            Outcome::Complete
        );
        assert_eq!(faults.outcome(0, OpKind::Flush, 0, 0), Outcome::Complete);
    }

    #[test]
    fn counted_faults_start_at_their_operation() {
        let faults = Faults {
            fail_from_op: Some((5, libc::EIO)),
            short_from_op: Some(2),
            ..Faults::default()
        };
        assert_eq!(faults.outcome(1, OpKind::Read, 0, 4096), Outcome::Complete);
        assert_eq!(
            faults.outcome(2, OpKind::Read, 0, 4096),
            Outcome::Short(2048)
        );
        assert_eq!(
            faults.outcome(4, OpKind::Write, 0, 512),
            Outcome::Short(256)
        );
        assert_eq!(
            faults.outcome(5, OpKind::Flush, 0, 0),
            Outcome::Fail(libc::EIO)
        );
        assert_eq!(
            faults.outcome(900, OpKind::Read, 0, 4096),
            Outcome::Fail(libc::EIO)
        );
    }

    #[test]
    fn vanishing_wins_over_everything() {
        let faults = Faults {
            vanish_after: Some(3),
            fail_from_op: Some((0, libc::EIO)),
            ..Faults::default()
        };
        assert_eq!(
            faults.outcome(2, OpKind::Read, 0, 512),
            Outcome::Fail(libc::EIO)
        );
        assert_eq!(
            faults.outcome(3, OpKind::Read, 0, 512),
            Outcome::Fail(libc::ENODEV)
        );
        assert!(!faults.vanished(2) && faults.vanished(3));
    }

    #[test]
    fn torn_writes_keep_a_prefix_of_writes_only() {
        let faults = Faults {
            torn_write: Some(TornWrite {
                start: 8192,
                end: 12288,
                keep_bytes: 1000,
            }),
            ..Faults::default()
        };
        assert_eq!(
            faults.outcome(0, OpKind::Write, 4096, 8192),
            Outcome::Torn(1000)
        );
        assert_eq!(
            faults.outcome(0, OpKind::Write, 8192, 512),
            Outcome::Torn(512)
        );
        assert_eq!(faults.outcome(0, OpKind::Write, 0, 8192), Outcome::Complete);
        assert_eq!(
            faults.outcome(0, OpKind::Read, 8192, 4096),
            Outcome::Complete
        );
        assert_eq!(
            faults.outcome(0, OpKind::Discard, 8192, 4096),
            Outcome::Complete
        );
    }
}
