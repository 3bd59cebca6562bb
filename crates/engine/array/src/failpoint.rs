//! Crash points for tests: `NVRAID_FAILPOINT=NAME:N` makes the process
//! abort (as SIGKILL or a power cut would end it, with no cleanup) the N-th
//! time it passes the point called NAME. Unset, a point costs one load of
//! a cached value. The points:
//!
//! | name | where |
//! |---|---|
//! | `stripe-write` | a RAID 4/5/6 member write has been issued (psync: done) and the next is not |
//! | `add-journal-superblock` | `add_journal` has written and flushed one more superblock (the journal's first, then each member's) |
//! | `reshape-write` | one more member write of a reshape step has completed (the step's other writes may be in flight: they go together), then once more after every member was flushed |
//! | `reshape-backup` | a grow (or a shrink) in place has written and flushed one more piece of a critical-section step's backup on a new member (a leaving one) (header cleared, rows, header) |
//! | `reshape-backup-file` | a grow in place with `--backup-file` has written and flushed one more piece of the file (the section's bytes, the records; the record forgotten past the section) |
//! | `reshape-superblock` | a grow has written and flushed one more superblock (the reshape's record: new members first; each checkpoint; the finished shape); a served level change is about to write the next member's superblock (members before it written), and once more after all |
//! | `level-after-shrink` | a served shrink to two asked with `--level 1` has ended (recorded on every member) and the server is about to take the RAID 5 of two over as RAID 1 |
//! | `size-superblocks` | a served size change (`grow --socket --size`) has written every superblock with the new size, before the served shape is swapped |
//!
//! Error points make an operation fail instead, as a member's I/O error
//! would: `NVRAID_FAILERR=NAME:N` makes the N-th pass of the point called
//! NAME return an I/O error (EIO) to its caller, which must undo what it
//! began. The points:
//!
//! | name | where |
//! |---|---|
//! | `reshape-launch` | a served reshape has recorded itself on every member and is about to route client requests through it |
//! | `reshape-thread` | a served reshape routes client requests through it and is about to start its thread (as if the thread could not be made) |
//!
//! Pause points hold a thread still instead, so that a test can act in
//! the window: `NVRAID_PAUSE=NAME:OFFSET:MS` sleeps MS milliseconds the
//! first time the thread passes NAME for a member range holding byte
//! OFFSET, after saying so on stderr (`nvraid: pause point NAME reached at
//! OFFSET`). The points:
//!
//! | name | where |
//! |---|---|
//! | `rebuild-write` | a rebuild beside clients has read and computed a step of the new member's bytes, and is about to write them |
//! | `reshape-section` | a grow in place is about to keep a critical-section step's rows in its backup area (OFFSET: the array position the step starts at) |

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

static ERR_ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
static ERR_PASSED: AtomicU64 = AtomicU64::new(0);

/// Pass the error point called `name`: `Err` (EIO) the time
/// `NVRAID_FAILERR` names.
pub(crate) fn error(name: &str) -> std::io::Result<()> {
    let armed = ERR_ARMED.get_or_init(|| {
        let spec = std::env::var("NVRAID_FAILERR").ok()?;
        let (point, count) = spec.split_once(':')?;
        Some((point.to_string(), count.parse().ok()?))
    });
    if let Some((point, count)) = armed {
        if point == name && ERR_PASSED.fetch_add(1, Ordering::SeqCst) + 1 == *count {
            eprintln!("nvraid: error point {name} reached: failing with EIO");
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
    }
    Ok(())
}

static PAUSE: OnceLock<Option<(String, u64, u64)>> = OnceLock::new();
static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Pass the pause point called `name` for member bytes `[at, at + len)`.
pub(crate) fn pause(name: &str, at: u64, len: u64) {
    let armed = PAUSE.get_or_init(|| {
        let spec = std::env::var("NVRAID_PAUSE").ok()?;
        let mut parts = spec.split(':');
        let point = parts.next()?.to_string();
        let offset = parts.next()?.parse().ok()?;
        let ms = parts.next()?.parse().ok()?;
        Some((point, offset, ms))
    });
    if let Some((point, offset, ms)) = armed {
        if point == name && (at..at + len).contains(offset) && !PAUSED.swap(true, Ordering::SeqCst)
        {
            eprintln!("nvraid: pause point {name} reached at {offset}");
            std::thread::sleep(std::time::Duration::from_millis(*ms));
        }
    }
}
