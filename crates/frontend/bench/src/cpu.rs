//! CPU time of the calling thread.

/// User and system CPU time consumed by the calling thread so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCpu {
    /// Time in user mode.
    pub user_ns: u64,
    /// Time in the kernel on the thread's behalf.
    pub sys_ns: u64,
}

impl ThreadCpu {
    /// Reads the calling thread's counters (getrusage(RUSAGE_THREAD)). On
    /// failure (not expected on Linux) both are 0.
    pub fn now() -> ThreadCpu {
        // SAFETY: an all-zero `rusage` is a valid value of a plain C struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is a valid, writable rusage for the call's duration.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        if rc != 0 {
            return ThreadCpu::default();
        }
        ThreadCpu {
            user_ns: timeval_ns(usage.ru_utime),
            sys_ns: timeval_ns(usage.ru_stime),
        }
    }

    /// Time spent between `earlier` and `self`.
    pub fn since(self, earlier: ThreadCpu) -> ThreadCpu {
        ThreadCpu {
            user_ns: self.user_ns.saturating_sub(earlier.user_ns),
            sys_ns: self.sys_ns.saturating_sub(earlier.sys_ns),
        }
    }
}

fn timeval_ns(time: libc::timeval) -> u64 {
    let secs = u64::try_from(time.tv_sec).unwrap_or(0);
    let micros = u64::try_from(time.tv_usec).unwrap_or(0);
    secs * 1_000_000_000 + micros * 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_thread_accumulates_user_time() {
        let start = ThreadCpu::now();
        let mut x = 0u64;
        let begin = std::time::Instant::now();
        while begin.elapsed() < std::time::Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let used = ThreadCpu::now().since(start);
        // Loose: a loaded machine may give the thread far less than 60 ms.
        assert!(used.user_ns + used.sys_ns > 0, "{used:?}");
    }
}
