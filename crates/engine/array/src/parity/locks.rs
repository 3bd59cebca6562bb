//! The stripe locks of RAID 4/5/6: two writes to one stripe never
//! interleave their parity updates, because each request holds its stripes
//! here from before its first read until its last write completes
//! (degraded reads hold them too: they read parity). Resync, repair and
//! rebuild hold the array's barrier region instead.

use std::sync::{Condvar, Mutex};

/// Stripes held by requests in flight, in shards (a stripe's shard is its
/// number modulo [`SHARDS`], so neighbouring stripes never share one).
#[derive(Debug)]
pub(crate) struct StripeLocks {
    shards: Vec<Shard>,
}

#[derive(Debug, Default)]
struct Shard {
    held: Mutex<Held>,
    freed: Condvar,
}

/// A shard's held stripes, and how many threads wait in
/// [`StripeLocks::lock_range`] for one of them (`freed` is signalled only
/// when some do: a signal is a system call, and the data path, which never
/// waits there, unlocks a stripe per write).
#[derive(Debug, Default)]
struct Held {
    stripes: Vec<u64>,
    waiters: u32,
}

const SHARDS: u64 = 256;

impl StripeLocks {
    pub fn new() -> StripeLocks {
        StripeLocks {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    fn shard(&self, stripe: u64) -> &Shard {
        &self.shards[(stripe % SHARDS) as usize]
    }

    fn try_lock(&self, stripe: u64) -> bool {
        let mut held = self
            .shard(stripe)
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if held.stripes.contains(&stripe) {
            return false;
        }
        held.stripes.push(stripe);
        true
    }

    fn unlock(&self, stripe: u64) {
        let shard = self.shard(stripe);
        let mut held = shard.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = held.stripes.iter().position(|&s| s == stripe) {
            held.stripes.swap_remove(at);
        }
        let waiters = held.waiters;
        drop(held);
        if waiters > 0 {
            shard.freed.notify_all();
        }
    }

    /// Hold stripes `first..=last`, or none of them (false) when another
    /// request holds one.
    pub fn try_lock_range(&self, first: u64, last: u64) -> bool {
        for stripe in first..=last {
            if !self.try_lock(stripe) {
                (first..stripe).for_each(|s| self.unlock(s));
                return false;
            }
        }
        true
    }

    /// Hold stripes `first..=last`, waiting for each in ascending order
    /// (every waiter takes them in that order, so two never deadlock).
    pub fn lock_range(&self, first: u64, last: u64) {
        for stripe in first..=last {
            let shard = self.shard(stripe);
            let mut held = shard.held.lock().unwrap_or_else(|p| p.into_inner());
            while held.stripes.contains(&stripe) {
                held.waiters += 1;
                held = shard.freed.wait(held).unwrap_or_else(|p| p.into_inner());
                held.waiters -= 1;
            }
            held.stripes.push(stripe);
        }
    }

    pub fn unlock_range(&self, first: u64, last: u64) {
        (first..=last).for_each(|s| self.unlock(s));
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// A thread waiting in `lock_range` for a stripe the data path holds
    /// gets it when the data path lets go (the unlock signals only while
    /// somebody waits), and not before; stripes in other shards and the
    /// data path's `try_lock_range` are not held up meanwhile.
    #[test]
    fn a_waiter_gets_the_stripe_when_it_is_unlocked() {
        let locks = std::sync::Arc::new(StripeLocks::new());
        assert!(locks.try_lock_range(5, 6));
        let got = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiter = {
            let (locks, got) = (locks.clone(), got.clone());
            std::thread::spawn(move || {
                locks.lock_range(4, 6);
                got.store(true, std::sync::atomic::Ordering::SeqCst);
                locks.unlock_range(4, 6);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !got.load(std::sync::atomic::Ordering::SeqCst),
            "got a held stripe"
        );
        // Unrelated stripes are free meanwhile.
        assert!(locks.try_lock_range(7, 7));
        locks.unlock_range(7, 7);
        locks.unlock_range(5, 6);
        waiter.join().unwrap();
        assert!(got.load(std::sync::atomic::Ordering::SeqCst));
        assert!(locks.try_lock_range(4, 6), "released by the waiter");
    }
}
