//! Recovery: the work that brings copies back into agreement, md's way.
//!
//! - [`add_member`] + [`rebuild`]: a new member takes a missing role and is
//!   filled from the other copies, its `recovery_offset` checkpointed so a
//!   rebuild cut short resumes;
//! - [`scrub`]: `check` compares every copy (RAID 1/10), or each stripe's
//!   parity with its data (RAID 4/5/6), and counts the sectors that differ
//!   (md's mismatch count); `repair` rewrites them from the first copy, or
//!   the parity from the data; on an array assembled dirty, `repair` is the
//!   resync, with md's `resync_offset` checkpointed and the array recorded
//!   clean at the end.
//! - [`rebuild_online`] and the scrub beside clients: the same work while
//!   the array is served (a region at a time, held against client writes).
//!
//! [`online`] runs these while the array is served (the rebuild and spares
//! thread, a check or repair on request, the background resync); the rest
//! runs offline (the array is not served; the claim on its members keeps
//! other writers out).
//!
//! A parity stripe that cannot be rebuilt (its other blocks list bad
//! blocks: a write failed on a member the array could not lose) is
//! recorded bad on the new member too, and scrub leaves such stripes alone.
//! The states of a role and of the array, and what moves them:
//!
//! | from | event | to | on disk |
//! |---|---|---|---|
//! | role missing / faulty | [`add_member`] with a missing role | recovering at 0 | new member: superblock with RECOVERY_OFFSET, `recovery_offset` 0; every member: the role table gives the new `dev_number` the role, events + 1 |
//! | (no role missing) | [`add_member`] | spare | new member: superblock with the spare role; every member: the table lists it as a spare, events + 1 |
//! | role missing, a spare given | [`promote_spares`] | recovering at 0 | as [`add_member`], the spare's own superblock rewritten for the role |
//! | recovering at N | [`rebuild`] copies a region | recovering at N + region | new member's `recovery_offset` (every second) |
//! | recovering | [`rebuild`] reaches the end | active | RECOVERY_OFFSET cleared, events + 1 on every member |
//! | recovering | the process dies | recovering at the last checkpoint | nothing more: assembly reads the member only below its checkpoint; [`rebuild`] (or the kernel) resumes from it |
//! | recovering | a read fails on the source | recovering | the source is marked faulty, the next copy is read |
//! | recovering | a write to the new member fails | recovering (stopped) | the error names the member; the array stays degraded |
//! | array dirty at R | [`scrub`] in repair mode passes a region | dirty at R + region | `resync_offset` on every member (every second, events + 1) |
//! | array dirty | [`scrub`] in repair mode reaches the end | clean | `resync_offset` = MAX, events + 1 |
//! | array dirty at R | the process dies | dirty at the last checkpoint | nothing more: the next repair (or the kernel) resumes at it |

pub(crate) mod common;
pub mod online;
pub(crate) mod rebuild;
mod scrub;

pub use common::{Mode, Scrubbed};
pub use rebuild::{
    add_member, add_member_to, promote_spares, re_add, re_add_to, rebuild, rebuild_online, Added,
    Progress, RebuildPace, Rebuilt,
};
pub use scrub::{scrub, scrub_with, Pace};

use std::time::{Duration, Instant};

/// How long a step paced at a rate of 0 waits (a pacing window: the
/// callers look at the clients again after it).
pub(crate) const ZERO_RATE_PAUSE: Duration = Duration::from_millis(100);

/// Sleep until `bytes` done since `started` are no longer ahead of `rate`
/// bytes per second (`None`: no limit, no sleep). A rate of 0 (md's
/// `MIN` of 0 while clients are busy, `--rebuild-speed 0:MAX` or a bare
/// `MAX`) sleeps [`ZERO_RATE_PAUSE`] after each step: no byte is ever
/// due at 0 bytes per second.
pub(crate) fn keep_to_rate(rate: Option<u64>, bytes: u64, started: Instant) {
    let Some(rate) = rate else { return };
    if rate == 0 {
        std::thread::sleep(ZERO_RATE_PAUSE);
        return;
    }
    let due = Duration::from_secs_f64(bytes as f64 / rate as f64);
    if let Some(wait) = due.checked_sub(started.elapsed()) {
        std::thread::sleep(wait);
    }
}

/// When a rebuild or resync records how far it got: every
/// [`rebuild::CHECKPOINT_EVERY`].
pub(crate) struct Checkpoints {
    last: Instant,
}

impl Checkpoints {
    pub(crate) fn start() -> Checkpoints {
        Checkpoints {
            last: Instant::now(),
        }
    }

    /// Whether one is due now (the next is then a period away).
    pub(crate) fn due(&mut self) -> bool {
        if self.last.elapsed() < rebuild::CHECKPOINT_EVERY {
            return false;
        }
        self.last = Instant::now();
        true
    }
}

#[cfg(test)]
mod pacing_tests {
    use super::{keep_to_rate, ZERO_RATE_PAUSE};
    use std::time::Instant;

    /// `serve --rebuild-speed MAX` (MIN 0) beside busy clients paces the
    /// rebuild at 0 bytes per second: that must wait a window, not panic
    /// on an infinite sleep (it killed the recovery thread).
    #[test]
    fn a_rebuild_paced_at_a_minimum_of_zero_waits_instead_of_panicking() {
        let started = Instant::now();
        keep_to_rate(Some(0), 4 << 20, started);
        assert!(started.elapsed() >= ZERO_RATE_PAUSE);
        keep_to_rate(Some(0), 0, Instant::now());
    }
}
