//! A latency histogram with bounded relative error and fixed memory.
//!
//! The layout is log-linear, as in HdrHistogram: values below 256 ns get a
//! bucket each (exact); above that, every power-of-two range `[2^k, 2^(k+1))`
//! is split into 128 equal buckets. A bucket is therefore never wider than
//! 1/128 of its lower bound, and a value reported as its bucket's midpoint is
//! within 1/256 (0.4%) of every value that fell in it. 7,424 buckets cover all
//! of `u64` nanoseconds in 58 KiB; recording is a few shifts and an add, with
//! no allocation, so each worker keeps its own and they are merged at the end.
//!
//! Worked example: 1,000 ns has its top bit at 2^9, so the shift is 9 - 7 = 2
//! and the bucket holds `[1000 & !3, +4)` = `[1000, 1004)`.

/// Sub-buckets per power of two, as a power of two (128).
const SUB_BITS: u32 = 7;
const SUB_COUNT: u64 = 1 << SUB_BITS;
/// Values below this have a bucket each.
const EXACT_LIMIT: u64 = 2 * SUB_COUNT;
/// Number of buckets: the exact ones, then 128 for each shift 1..=56.
const BUCKET_COUNT: usize = (EXACT_LIMIT + (63 - SUB_BITS as u64) * SUB_COUNT) as usize;

const _: () = assert!(BUCKET_COUNT == 7424);

/// Counts of completion latencies in nanoseconds, with exact count, min,
/// max, sum and sum of squares beside the buckets.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    counts: Box<[u64]>,
    count: u64,
    min_ns: u64,
    max_ns: u64,
    sum_ns: u128,
    sum_sq_ns: f64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

/// Bucket index of `value_ns`.
fn bucket_index(value_ns: u64) -> usize {
    if value_ns < EXACT_LIMIT {
        return value_ns as usize;
    }
    let top_bit = 63 - value_ns.leading_zeros();
    let shift = top_bit - SUB_BITS;
    let mantissa = value_ns >> shift;
    debug_assert!((SUB_COUNT..2 * SUB_COUNT).contains(&mantissa));
    (EXACT_LIMIT + u64::from(shift - 1) * SUB_COUNT + (mantissa - SUB_COUNT)) as usize
}

/// The smallest value and the width of bucket `index`.
fn bucket_range(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < EXACT_LIMIT {
        return (index, 1);
    }
    let shift = (index - EXACT_LIMIT) / SUB_COUNT + 1;
    let mantissa = (index - EXACT_LIMIT) % SUB_COUNT + SUB_COUNT;
    (mantissa << shift, 1 << shift)
}

impl LatencyHistogram {
    /// An empty histogram (allocates its buckets once).
    pub fn new() -> LatencyHistogram {
        LatencyHistogram {
            counts: vec![0; BUCKET_COUNT].into_boxed_slice(),
            count: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            sum_ns: 0,
            sum_sq_ns: 0.0,
        }
    }

    /// Records one latency. Never allocates.
    #[inline]
    pub fn record(&mut self, value_ns: u64) {
        self.counts[bucket_index(value_ns)] += 1;
        self.count += 1;
        self.min_ns = self.min_ns.min(value_ns);
        self.max_ns = self.max_ns.max(value_ns);
        self.sum_ns += u128::from(value_ns);
        let value = value_ns as f64;
        self.sum_sq_ns += value * value;
    }

    /// Adds every value recorded in `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.count += other.count;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        self.sum_ns += other.sum_ns;
        self.sum_sq_ns += other.sum_sq_ns;
    }

    /// Forgets every value (used when the ramp ends).
    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.count = 0;
        self.min_ns = u64::MAX;
        self.max_ns = 0;
        self.sum_ns = 0;
        self.sum_sq_ns = 0.0;
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Smallest value (exact); 0 when empty.
    pub fn min_ns(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min_ns
        }
    }

    /// Largest value (exact); 0 when empty.
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// Arithmetic mean (exact); 0 when empty.
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sum_ns as f64 / self.count as f64
    }

    /// Population standard deviation; 0 when empty.
    pub fn stddev_ns(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let mean = self.mean_ns();
        let variance = self.sum_sq_ns / self.count as f64 - mean * mean;
        variance.max(0.0).sqrt()
    }

    /// The `pct` percentile (0 < pct <= 100) by the nearest-rank rule: the
    /// smallest recorded value with at least `ceil(pct/100 * count)` values at
    /// or below it, reported as its bucket's midpoint (clamped to the exact
    /// min and max). Within 0.4% of the exact answer. 0 when empty.
    pub fn percentile_ns(&self, pct: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((pct / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let (low, width) = bucket_range(index);
                let mid = low + (width - 1) / 2;
                return mid.clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_tile_the_range() {
        let mut expected_low = 0u64;
        for index in 0..BUCKET_COUNT {
            let (low, width) = bucket_range(index);
            assert_eq!(low, expected_low, "bucket {index}");
            assert_eq!(bucket_index(low), index);
            assert_eq!(bucket_index(low + (width - 1)), index);
            assert!(width == 1 || width * SUB_COUNT <= low);
            expected_low = low.wrapping_add(width);
        }
        assert_eq!(expected_low, 0, "the last bucket ends at u64::MAX");
        assert_eq!(bucket_index(u64::MAX), BUCKET_COUNT - 1);
    }

    #[test]
    fn worked_example_from_the_module_doc() {
        assert_eq!(bucket_range(bucket_index(1000)), (1000, 4));
    }

    #[test]
    fn small_values_are_exact() {
        let mut hist = LatencyHistogram::new();
        for value in 1..=100u64 {
            hist.record(value);
        }
        assert_eq!(hist.count(), 100);
        assert_eq!(hist.percentile_ns(50.0), 50);
        assert_eq!(hist.percentile_ns(99.0), 99);
        assert_eq!(hist.percentile_ns(100.0), 100);
        assert_eq!(hist.min_ns(), 1);
        assert_eq!(hist.max_ns(), 100);
        assert!((hist.mean_ns() - 50.5).abs() < 1e-9);
        assert!((hist.stddev_ns() - 28.866).abs() < 0.01);
    }

    #[test]
    fn clear_forgets_everything() {
        let mut hist = LatencyHistogram::new();
        hist.record(5000);
        hist.clear();
        assert_eq!(hist.count(), 0);
        assert_eq!(hist.percentile_ns(50.0), 0);
        hist.record(7);
        assert_eq!(hist.min_ns(), 7);
        assert_eq!(hist.percentile_ns(99.0), 7);
    }

    fn exact_percentile(sorted: &[u64], pct: f64) -> u64 {
        let rank = ((pct / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
        sorted[rank - 1]
    }

    proptest! {
        #[test]
        fn percentiles_within_one_percent(
            values in proptest::collection::vec(1u64..=u64::MAX / 4, 1..2000),
            split in 0usize..2000,
        ) {
            // Two halves recorded separately and merged, as workers are.
            let split = split.min(values.len());
            let mut left = LatencyHistogram::new();
            let mut right = LatencyHistogram::new();
            values[..split].iter().for_each(|&v| left.record(v));
            values[split..].iter().for_each(|&v| right.record(v));
            left.merge(&right);
            let mut sorted = values.clone();
            sorted.sort_unstable();
            for pct in [1.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0] {
                let exact = exact_percentile(&sorted, pct) as f64;
                let got = left.percentile_ns(pct) as f64;
                prop_assert!((got - exact).abs() / exact <= 0.01,
                    "p{} exact {} got {}", pct, exact, got);
            }
            prop_assert_eq!(left.count(), values.len() as u64);
            prop_assert_eq!(left.max_ns(), sorted[sorted.len() - 1]);
            prop_assert_eq!(left.min_ns(), sorted[0]);
        }

        #[test]
        fn latency_like_values_within_half_a_percent(
            values in proptest::collection::vec(100u64..50_000_000, 1..3000),
        ) {
            let mut hist = LatencyHistogram::new();
            values.iter().for_each(|&v| hist.record(v));
            let mut sorted = values.clone();
            sorted.sort_unstable();
            for pct in [50.0, 95.0, 99.5, 99.95] {
                let exact = exact_percentile(&sorted, pct) as f64;
                let got = hist.percentile_ns(pct) as f64;
                prop_assert!((got - exact).abs() / exact <= 0.004);
            }
        }
    }
}
