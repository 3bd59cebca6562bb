//! Request counters, per connection and per server, and live rates.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use serde::Serialize;

/// Counters one connection (or the whole server) keeps.
#[derive(Debug, Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub zeroes: AtomicU64,
    pub other: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub errors: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CountersSnapshot {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub zeroes: u64,
    pub other: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub errors: u64,
}

fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

impl Counters {
    pub fn snapshot(&self) -> CountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersSnapshot {
            reads: get(&self.reads),
            writes: get(&self.writes),
            flushes: get(&self.flushes),
            trims: get(&self.trims),
            zeroes: get(&self.zeroes),
            other: get(&self.other),
            read_bytes: get(&self.read_bytes),
            written_bytes: get(&self.written_bytes),
            errors: get(&self.errors),
        }
    }

    pub(crate) fn add_snapshot(&self, s: &CountersSnapshot) {
        add(&self.reads, s.reads);
        add(&self.writes, s.writes);
        add(&self.flushes, s.flushes);
        add(&self.trims, s.trims);
        add(&self.zeroes, s.zeroes);
        add(&self.other, s.other);
        add(&self.read_bytes, s.read_bytes);
        add(&self.written_bytes, s.written_bytes);
        add(&self.errors, s.errors);
    }

    /// Count one finished request.
    pub(crate) fn record(&self, command: nvraid_nbd::Command, length_bytes: u32, ok: bool) {
        use nvraid_nbd::Command as C;
        let length = u64::from(length_bytes);
        match command {
            C::Read if ok => {
                add(&self.reads, 1);
                add(&self.read_bytes, length);
            }
            C::Write if ok => {
                add(&self.writes, 1);
                add(&self.written_bytes, length);
            }
            C::Read | C::Write => {}
            C::Flush => add(&self.flushes, 1),
            C::Trim => add(&self.trims, 1),
            C::WriteZeroes => add(&self.zeroes, 1),
            _ => add(&self.other, 1),
        }
        if !ok {
            add(&self.errors, 1);
        }
    }
}

impl CountersSnapshot {
    pub fn operations(&self) -> u64 {
        self.reads + self.writes + self.flushes + self.trims + self.zeroes + self.other
    }

    pub fn plus(&self, other: &CountersSnapshot) -> CountersSnapshot {
        CountersSnapshot {
            reads: self.reads + other.reads,
            writes: self.writes + other.writes,
            flushes: self.flushes + other.flushes,
            trims: self.trims + other.trims,
            zeroes: self.zeroes + other.zeroes,
            other: self.other + other.other,
            read_bytes: self.read_bytes + other.read_bytes,
            written_bytes: self.written_bytes + other.written_bytes,
            errors: self.errors + other.errors,
        }
    }
}

/// Rates over the last sampling interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rates {
    pub iops: f64,
    pub read_bytes_per_second: f64,
    pub write_bytes_per_second: f64,
}

/// Turns successive totals into rates.
#[derive(Debug)]
pub(crate) struct RateMeter {
    last: Mutex<(Instant, CountersSnapshot, Rates)>,
}

impl RateMeter {
    pub(crate) fn new() -> RateMeter {
        RateMeter {
            last: Mutex::new((
                Instant::now(),
                CountersSnapshot::default(),
                Rates::default(),
            )),
        }
    }

    /// Feed the current totals; rates are refreshed when at least
    /// `min_interval` passed since the last refresh.
    pub(crate) fn sample(&self, total: CountersSnapshot, min_interval_s: f64) -> Rates {
        let mut last = self.last.lock().expect("rate lock");
        let elapsed_s = last.0.elapsed().as_secs_f64();
        if elapsed_s >= min_interval_s {
            let before = last.1;
            let per_s = |now: u64, then: u64| now.saturating_sub(then) as f64 / elapsed_s;
            let rates = Rates {
                iops: per_s(total.operations(), before.operations()),
                read_bytes_per_second: per_s(total.read_bytes, before.read_bytes),
                write_bytes_per_second: per_s(total.written_bytes, before.written_bytes),
            };
            *last = (Instant::now(), total, rates);
        }
        last.2
    }
}

/// A running server's request counters, read from another thread (the
/// metrics endpoint): given in [`crate::ServeOptions::totals`], attached
/// when the server starts, empty before and after.
#[derive(Clone, Default)]
pub struct TotalsProbe(Arc<Mutex<Option<Weak<crate::shared::Shared>>>>);

/// What a [`TotalsProbe`] reads: NBD's requests (every connection, past
/// and present) and the ublk device's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportTotals {
    pub nbd: CountersSnapshot,
    pub ublk: Option<CountersSnapshot>,
}

impl std::fmt::Debug for TotalsProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TotalsProbe")
    }
}

impl TotalsProbe {
    pub(crate) fn attach(&self, shared: &Arc<crate::shared::Shared>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(shared));
    }

    /// The counters now; `None` while no server runs.
    pub fn read(&self) -> Option<ExportTotals> {
        let shared = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
        let shared = shared.upgrade()?;
        let ublk = shared.ublk_counters.as_ref().map(|c| c.snapshot());
        let all = shared.totals();
        let nbd = match ublk {
            Some(u) => CountersSnapshot {
                reads: all.reads - u.reads,
                writes: all.writes - u.writes,
                flushes: all.flushes - u.flushes,
                trims: all.trims - u.trims,
                zeroes: all.zeroes - u.zeroes,
                other: all.other - u.other,
                read_bytes: all.read_bytes - u.read_bytes,
                written_bytes: all.written_bytes - u.written_bytes,
                errors: all.errors - u.errors,
            },
            None => all,
        };
        Some(ExportTotals { nbd, ublk })
    }
}
