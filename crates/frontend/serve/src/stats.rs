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

/// What a [`TotalsProbe`] reads: the running server (`Shared`), through
/// this trait so that the counters need not know the server.
pub(crate) trait TotalsSource: Send + Sync {
    fn export_totals(&self) -> ExportTotals;
}

/// A running server's request counters, read from another thread (the
/// metrics endpoint): given in [`crate::ServeOptions::totals`], attached
/// when the server starts, empty before and after.
#[derive(Clone, Default)]
pub struct TotalsProbe(Arc<Mutex<Option<Weak<dyn TotalsSource>>>>);

/// What a [`TotalsProbe`] reads: NBD's requests (every connection, past
/// and present), the ublk device's and NVMe/TCP's, and their latencies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportTotals {
    pub nbd: CountersSnapshot,
    pub ublk: Option<CountersSnapshot>,
    /// `--nvme-tcp`'s commands.
    pub nvme: Option<CountersSnapshot>,
    /// Request latencies: from a request's submission to the array (its
    /// payload received) until the array answered it.
    pub latency: Latencies,
}

impl std::fmt::Debug for TotalsProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TotalsProbe")
    }
}

impl TotalsProbe {
    pub(crate) fn attach(&self, source: Weak<dyn TotalsSource>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(source);
    }

    /// The counters now; `None` while no server runs.
    pub fn read(&self) -> Option<ExportTotals> {
        let source = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
        Some(source.upgrade()?.export_totals())
    }
}

impl CountersSnapshot {
    /// `self` less `other`'s counts (a part of the totals taken out).
    pub(crate) fn minus(&self, other: &CountersSnapshot) -> CountersSnapshot {
        CountersSnapshot {
            reads: self.reads - other.reads,
            writes: self.writes - other.writes,
            flushes: self.flushes - other.flushes,
            trims: self.trims - other.trims,
            zeroes: self.zeroes - other.zeroes,
            other: self.other - other.other,
            read_bytes: self.read_bytes - other.read_bytes,
            written_bytes: self.written_bytes - other.written_bytes,
            errors: self.errors - other.errors,
        }
    }
}

/// Upper bounds (seconds) of the request latency histogram's buckets, a
/// 1-2.5-5 series from 10 µs to 10 s; a last bucket takes the rest.
pub const LATENCY_BOUNDS_S: [f64; 19] = [
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
    250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0,
];
const LATENCY_BOUNDS_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];
const BUCKETS: usize = LATENCY_BOUNDS_S.len() + 1;

/// Which frontend a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    Nbd = 0,
    Ublk = 1,
    Nvme = 2,
}

impl Export {
    pub const ALL: [Export; 3] = [Export::Nbd, Export::Ublk, Export::Nvme];

    /// Its `export` label.
    pub fn name(self) -> &'static str {
        match self {
            Export::Nbd => "nbd",
            Export::Ublk => "ublk",
            Export::Nvme => "nvme",
        }
    }
}

/// What a request did, as the latency histograms split it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyOp {
    Read = 0,
    Write = 1,
    /// Flush, trim, write zeroes.
    Other = 2,
}

impl LatencyOp {
    pub const ALL: [LatencyOp; 3] = [LatencyOp::Read, LatencyOp::Write, LatencyOp::Other];

    pub(crate) fn of(command: nvraid_nbd::Command) -> LatencyOp {
        match command {
            nvraid_nbd::Command::Read => LatencyOp::Read,
            nvraid_nbd::Command::Write => LatencyOp::Write,
            _ => LatencyOp::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LatencyOp::Read => "read",
            LatencyOp::Write => "write",
            LatencyOp::Other => "other",
        }
    }
}

/// One histogram's counts, written by one thread only.
#[derive(Debug)]
struct LatencyCells {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for LatencyCells {
    fn default() -> LatencyCells {
        LatencyCells {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// A worker's request latency histograms, per export and operation. Only
/// its worker writes them (a plain load and store, no locked add); any
/// thread may read them.
#[derive(Debug, Default)]
pub(crate) struct LatencyShard {
    cells: [[LatencyCells; 3]; 3],
}

fn bump(cell: &AtomicU64, by: u64) {
    cell.store(
        cell.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl LatencyShard {
    /// One request of `op` through `export` took `nanos`.
    pub(crate) fn record(&self, export: Export, op: LatencyOp, nanos: u64) {
        let cells = &self.cells[export as usize][op as usize];
        let bucket = LATENCY_BOUNDS_NS.partition_point(|&bound| bound < nanos);
        bump(&cells.counts[bucket], 1);
        bump(&cells.sum_ns, nanos);
    }

    fn add_to(&self, export: Export, op: LatencyOp, into: &mut Histogram) {
        let cells = &self.cells[export as usize][op as usize];
        for (total, cell) in into.counts.iter_mut().zip(&cells.counts) {
            *total += cell.load(Ordering::Relaxed);
        }
        into.sum_ns += cells.sum_ns.load(Ordering::Relaxed);
    }
}

/// A latency histogram at one moment: counts per bucket of
/// [`LATENCY_BOUNDS_S`] (not cumulative), the last one past 10 s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    pub counts: [u64; BUCKETS],
    pub sum_ns: u64,
}

impl Histogram {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `(upper bound in seconds, requests in that bucket)` per bucket,
    /// not cumulative (the exposition adds them up); the last bound is
    /// `f64::MAX`, which the exposition writes as +Inf.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .map(|(i, n)| (LATENCY_BOUNDS_S.get(i).copied().unwrap_or(f64::MAX), *n))
            .collect()
    }
}

/// Every worker's histograms summed, per export and operation (indexed
/// by [`Export`] and [`LatencyOp`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latencies(pub [[Histogram; 3]; 3]);

impl Latencies {
    pub(crate) fn sum<'a>(shards: impl Iterator<Item = &'a LatencyShard>) -> Latencies {
        let mut all = Latencies::default();
        for shard in shards {
            for export in Export::ALL {
                for op in LatencyOp::ALL {
                    shard.add_to(export, op, &mut all.0[export as usize][op as usize]);
                }
            }
        }
        all
    }

    pub fn get(&self, export: Export, op: LatencyOp) -> &Histogram {
        &self.0[export as usize][op as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_goes_into_the_first_bucket_whose_bound_it_does_not_pass() {
        let shard = LatencyShard::default();
        for nanos in [
            0,
            10_000,
            10_001,
            999_999,
            1_000_000,
            10_000_000_000,
            11_000_000_000,
        ] {
            shard.record(Export::Ublk, LatencyOp::Write, nanos);
        }
        shard.record(Export::Nbd, LatencyOp::Read, 42);
        let all = Latencies::sum([&shard, &shard].into_iter());
        let write = all.get(Export::Ublk, LatencyOp::Write);
        let mut expected = [0u64; BUCKETS];
        expected[0] = 4; // 0 and 10 µs, twice
        expected[1] = 2; // 10.001 µs
        expected[6] = 4; // 999.999 µs and 1 ms (le 1 ms)
        expected[18] = 2; // 10 s
        expected[19] = 2; // 11 s: past every bound
        assert_eq!(write.counts, expected);
        assert_eq!(write.count(), 14);
        assert_eq!(write.sum_ns, 2 * 21_002_020_000);
        assert_eq!(all.get(Export::Nbd, LatencyOp::Read).count(), 2);
        assert_eq!(all.get(Export::Nbd, LatencyOp::Write).count(), 0);
        assert_eq!(write.buckets().last(), Some(&(f64::MAX, 2)));
    }
}
