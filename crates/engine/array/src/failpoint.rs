//! Crash points for tests: `NVRAID_FAILPOINT=NAME:N` makes the process
//! abort (as SIGKILL or a power cut would end it, with no cleanup) the N-th
//! time it passes the point called NAME. Unset, a point costs one load of
//! a cached value. The points:
//!
//! | name | where |
//! |---|---|
//! | `stripe-write` | a RAID 4/5/6 member write has been issued (psync: done) and the next is not |
//! | `add-journal-superblock` | `add_journal` has written and flushed one more superblock (the journal's first, then each member's) |
//! | `reshape-write` | a grow's step has written one more member's rows (then once more after every member was flushed) |
//! | `reshape-superblock` | a grow has written and flushed one more superblock (the reshape's record: new members first; each checkpoint; the finished shape) |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
static PASSED: AtomicU64 = AtomicU64::new(0);

/// Pass the point called `name`.
pub(crate) fn hit(name: &str) {
    let armed = ARMED.get_or_init(|| {
        let spec = std::env::var("NVRAID_FAILPOINT").ok()?;
        let (point, count) = spec.split_once(':')?;
        Some((point.to_string(), count.parse().ok()?))
    });
    if let Some((point, count)) = armed {
        if point == name && PASSED.fetch_add(1, Ordering::SeqCst) + 1 == *count {
            eprintln!("nvraid: failpoint {name} reached: aborting");
            std::process::abort();
        }
    }
}
