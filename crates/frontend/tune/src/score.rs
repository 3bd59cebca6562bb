//! Scoring and the recommendation (docs/tune.md's rule): each chunk's
//! value on each metric, its score against the best of every metric, and
//! the chunk recommended, with its reason.

use nvraid_bench::report::BenchReport;
use nvraid_bench::units::{format_size, MB_BYTES};
use nvraid_bench::JobResult;

/// One chunk's measurements: the best run of each step over the rounds.
#[derive(Clone, Debug)]
pub struct ChunkRun {
    /// The chunk.
    pub chunk_bytes: u64,
    /// Its steps, as nvraid-bench reports them.
    pub report: BenchReport,
}

/// The chunk a tie goes towards: nvraid's default.
pub const TIE_CHUNK_BYTES: u64 = nvraid_array::CHUNK_BYTES_DEFAULT;

/// `64K`, `1M`.
pub fn chunk_text(bytes: u64) -> String {
    format_size(bytes)
}

/// What one metric counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// I/Os per second (random steps).
    Iops,
    /// 10^6 bytes per second (sequential steps).
    MbS,
}

impl Unit {
    /// `IOPS`, `MB/s`.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Iops => "IOPS",
            Unit::MbS => "MB/s",
        }
    }
}

/// One column of the comparison: a step's label and direction.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    /// `RND4K Q32T1 read`.
    pub key: String,
    /// What its values count.
    pub unit: Unit,
}

/// The metric a step's result gives, and its value: IOPS for random
/// steps, MB/s for sequential ones.
pub fn metric_of(label: &str, result: &JobResult) -> (Metric, f64) {
    let spec = &result.spec;
    let direction = match spec.rw.read_pct(spec.rwmixread_pct) {
        100 => "read",
        0 => "write",
        _ => "mixed",
    };
    let key = format!("{label} {direction}");
    if spec.rw.is_random() {
        (
            Metric {
                key,
                unit: Unit::Iops,
            },
            result.total_iops(),
        )
    } else {
        (
            Metric {
                key,
                unit: Unit::MbS,
            },
            result.total_bw_bytes() / MB_BYTES,
        )
    }
}

/// The metrics (from the first chunk's steps, in run order; a key met
/// twice gets ` #2`) and each chunk's value of each.
pub fn metrics(runs: &[ChunkRun]) -> (Vec<Metric>, Vec<Vec<f64>>) {
    let mut keys: Vec<Metric> = Vec::new();
    let mut values = Vec::with_capacity(runs.len());
    for (index, run) in runs.iter().enumerate() {
        let mut row = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for (label, result) in run.report.results() {
            let (mut metric, value) = metric_of(label, result);
            let repeats = seen.iter().filter(|k| **k == metric.key).count();
            seen.push(metric.key.clone());
            if repeats > 0 {
                metric.key = format!("{} #{}", metric.key, repeats + 1);
            }
            if index == 0 {
                keys.push(metric);
            }
            row.push(value);
        }
        values.push(row);
    }
    (keys, values)
}

/// Each chunk's score: the geometric mean over metrics of its value
/// divided by the best value of that metric (1.0: best on every metric).
/// A metric no chunk moved (best 0) counts 1 for all.
pub fn scores(values: &[Vec<f64>]) -> Vec<f64> {
    let metrics = values.first().map_or(0, Vec::len);
    let best: Vec<f64> = (0..metrics)
        .map(|m| values.iter().map(|row| row[m]).fold(0.0, f64::max))
        .collect();
    values
        .iter()
        .map(|row| {
            if metrics == 0 {
                return 1.0;
            }
            let log_sum: f64 = row
                .iter()
                .zip(&best)
                .map(|(&v, &b)| if b > 0.0 { (v / b).ln() } else { 0.0 })
                .sum();
            (log_sum / metrics as f64).exp()
        })
        .collect()
}

/// The recommendation.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    /// The chunk recommended.
    pub chunk_bytes: u64,
    /// One sentence: where the chunk is best, how far from the best
    /// elsewhere, and the tie when there is one.
    pub reason: String,
    /// Empty when the best score beats every other by the noise threshold
    /// or more; otherwise every chunk within noise of the best, the
    /// recommended one included, ascending.
    pub within_noise: Vec<u64>,
}

/// How much `a` is above `b`, in percent.
fn above_pct(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        (a / b - 1.0) * 100.0
    } else if a > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// `3.2%` under 10, `12%` from 10.
fn pct_text(pct: f64) -> String {
    if pct < 10.0 {
        format!("{pct:.1}%")
    } else {
        format!("{pct:.0}%")
    }
}

/// `a`, `a and b`, `a, b and c`.
fn list_text(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The tie-break among chunks within noise of the best: the one nearest
/// to nvraid's default chunk in powers of two, the larger when two are as
/// near.
pub fn tie_break(tied: &[u64]) -> u64 {
    let distance = |c: u64| (c.ilog2() as i64 - TIE_CHUNK_BYTES.ilog2() as i64).unsigned_abs();
    *tied
        .iter()
        .min_by_key(|&&c| (distance(c), std::cmp::Reverse(c)))
        .expect("the best chunk is always tied with itself")
}

/// The rule (docs/tune.md): score every chunk ([`scores`]); the chunks
/// whose score the best beats by less than `noise_pct` percent are within
/// noise. With one chunk there, it is the recommendation; with several,
/// [`tie_break`] picks one and the reason says so. `chunks[i]` measured
/// `values[i]`, one value per metric named in `keys`.
pub fn recommend(
    chunks: &[u64],
    keys: &[String],
    values: &[Vec<f64>],
    noise_pct: f64,
) -> Recommendation {
    let scores = scores(values);
    let best_score = scores.iter().copied().fold(f64::MIN, f64::max);
    let tied: Vec<u64> = chunks
        .iter()
        .zip(&scores)
        .filter(|&(_, &s)| s >= best_score || above_pct(best_score, s) < noise_pct)
        .map(|(&c, _)| c)
        .collect();
    let chosen = tie_break(&tied);
    let at = chunks.iter().position(|&c| c == chosen).expect("chosen");
    let name = chunk_text(chosen);
    if chunks.len() == 1 {
        return Recommendation {
            chunk_bytes: chosen,
            reason: format!("{name}: the only chunk size tried"),
            within_noise: Vec::new(),
        };
    }
    let facts = standing(keys, values, at);
    if tied.len() > 1 {
        return within_noise(chunks, &scores, tied, chosen, &facts, noise_pct);
    }
    let runner_up = chunks
        .iter()
        .zip(&scores)
        .filter(|&(&c, _)| c != chosen)
        .max_by(|a, b| a.1.total_cmp(b.1))
        .expect("two chunks or more");
    Recommendation {
        chunk_bytes: chosen,
        reason: format!(
            "{name}: {facts}; its score is {} above the next best, {}",
            pct_text(above_pct(best_score, *runner_up.1)),
            chunk_text(*runner_up.0)
        ),
        within_noise: Vec::new(),
    }
}

/// Where the chunk at row `at` is best, and how far behind the best it is
/// elsewhere, in words (the facts a recommendation gives).
fn standing(keys: &[String], values: &[Vec<f64>], at: usize) -> String {
    let best_of = |m: usize| values.iter().map(|row| row[m]).fold(0.0, f64::max);
    let mut best_on = Vec::new();
    let mut behind: Option<(f64, &str)> = None;
    for (m, key) in keys.iter().enumerate() {
        let (value, best) = (values[at][m], best_of(m));
        if value >= best {
            best_on.push(key.clone());
        } else {
            let gap = (1.0 - value / best) * 100.0;
            if behind.is_none_or(|(g, _)| gap > g) {
                behind = Some((gap, key));
            }
        }
    }
    match (best_on.len(), behind) {
        (0, Some((gap, key))) => format!(
            "within {} of the best on every metric (furthest behind on {key})",
            pct_text(gap)
        ),
        (0, None) => "best on every metric".to_string(),
        (n, behind) => {
            let list = match n {
                1..=3 => list_text(&best_on),
                _ => format!("{}, {} and {} more", best_on[0], best_on[1], n - 2),
            };
            match behind {
                None => format!("best on {list}"),
                Some((gap, key)) => format!(
                    "best on {list}, within {} of the best elsewhere (furthest behind on {key})",
                    pct_text(gap)
                ),
            }
        }
    }
}

/// The recommendation when several chunks scored within noise of the best:
/// the tie goes to nvraid's default, or the nearest to it.
fn within_noise(
    chunks: &[u64],
    scores: &[f64],
    tied: Vec<u64>,
    chosen: u64,
    facts: &str,
    noise_pct: f64,
) -> Recommendation {
    let name = chunk_text(chosen);
    let best_score = scores.iter().copied().fold(f64::MIN, f64::max);
    let score_of = |c: u64| scores[chunks.iter().position(|&x| x == c).expect("tried")];
    let lowest = tied.iter().map(|&c| score_of(c)).fold(f64::MAX, f64::min);
    let top = *tied
        .iter()
        .max_by(|&&a, &&b| score_of(a).total_cmp(&score_of(b)))
        .expect("tied");
    let which = if chosen == TIE_CHUNK_BYTES {
        "nvraid's default".to_string()
    } else {
        format!(
            "the nearest to nvraid's default ({})",
            chunk_text(TIE_CHUNK_BYTES)
        )
    };
    let names: Vec<String> = tied.iter().map(|&c| chunk_text(c)).collect();
    Recommendation {
        chunk_bytes: chosen,
        reason: format!(
            "{} are within noise ({} apart, under the {}% threshold; {} scored highest), \
             so {name}, {which}, is chosen: the measurements give no reason to move \
             away from the default; {name} is {facts}",
            list_text(&names),
            pct_text(above_pct(best_score, lowest)),
            noise_pct,
            chunk_text(top)
        ),
        within_noise: tied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::tests::{result, run, step};
    use nvraid_bench::RwMode;

    const K: u64 = 1024;

    #[test]
    fn metrics_are_iops_for_random_steps_and_mb_s_for_sequential_ones() {
        let steps = |scale: u64| {
            vec![
                step(
                    "SEQ1M Q8T1",
                    Some(result(RwMode::Read, 1 << 20, 1000 * scale)),
                ),
                step(
                    "RND4K Q32T1",
                    Some(result(RwMode::Randwrite, 4096, 5000 * scale)),
                ),
                step("RND4K Q1T1", None),
                step(
                    "RND4K Q32T1",
                    Some(result(RwMode::Randwrite, 4096, 7000 * scale)),
                ),
            ]
        };
        let (keys, values) = metrics(&[run(16 * K, steps(1)), run(64 * K, steps(2))]);
        let named: Vec<(&str, Unit)> = keys.iter().map(|k| (k.key.as_str(), k.unit)).collect();
        assert_eq!(
            named,
            [
                ("SEQ1M Q8T1 read", Unit::MbS),
                ("RND4K Q32T1 write", Unit::Iops),
                ("RND4K Q32T1 write #2", Unit::Iops),
            ]
        );
        // 1000 MiB in a second is 1048.576 MB/s.
        assert_eq!(
            values,
            [
                vec![1048.576, 5000.0, 7000.0],
                vec![2097.152, 10000.0, 14000.0]
            ]
        );
        assert_eq!(Unit::MbS.as_str(), "MB/s");
        assert_eq!(Unit::Iops.as_str(), "IOPS");
    }

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("m{i}")).collect()
    }

    #[test]
    fn a_clear_winner_is_named_with_its_margin() {
        let chunks = [16 * K, 64 * K, 256 * K];
        let values = vec![vec![100.0, 1000.0], vec![200.0, 1000.0], vec![100.0, 900.0]];
        let r = recommend(&chunks, &keys(2), &values, 10.0);
        assert_eq!(r.chunk_bytes, 64 * K);
        assert!(r.within_noise.is_empty());
        // 64K scores 1; 16K sqrt(0.5) = 0.7071: 41% behind.
        assert_eq!(
            r.reason,
            "64K: best on m0 and m1; its score is 41% above the next best, 16K"
        );
    }

    #[test]
    fn a_winner_behind_on_one_metric_says_how_far() {
        let chunks = [8 * K, 1024 * K];
        let values = vec![vec![100.0, 95.0, 10.0], vec![50.0, 100.0, 10.0]];
        let r = recommend(&chunks, &keys(3), &values, 5.0);
        assert_eq!(r.chunk_bytes, 8 * K);
        assert_eq!(
            r.reason,
            "8K: best on m0 and m2, within 5.0% of the best elsewhere (furthest behind on \
             m1); its score is 24% above the next best, 1M"
        );
    }

    #[test]
    fn a_tie_is_said_and_goes_towards_the_default() {
        let chunks = [16 * K, 256 * K, 512 * K];
        let values = vec![vec![50.0], vec![97.0], vec![100.0]];
        let r = recommend(&chunks, &keys(1), &values, 10.0);
        assert_eq!(r.within_noise, vec![256 * K, 512 * K]);
        assert_eq!(r.chunk_bytes, 256 * K);
        assert_eq!(
            r.reason,
            "256K and 512K are within noise (3.1% apart, under the 10% threshold; 512K \
             scored highest), so 256K, the nearest to nvraid's default (64K), is chosen: \
             the measurements give no reason to move away from the default; 256K is \
             within 3.0% of the best on every metric (furthest behind on m0)"
        );
        // With no noise allowance the best wins.
        assert_eq!(
            recommend(&chunks, &keys(1), &values, 0.0).chunk_bytes,
            512 * K
        );
    }

    #[test]
    fn one_chunk_is_its_own_recommendation() {
        let r = recommend(&[128 * K], &keys(1), &[vec![3.0]], 10.0);
        assert_eq!(
            r,
            Recommendation {
                chunk_bytes: 128 * K,
                reason: "128K: the only chunk size tried".into(),
                within_noise: Vec::new(),
            }
        );
    }

    #[test]
    fn scores_are_geometric_means_of_ratios_to_the_best() {
        let s = scores(&[vec![50.0, 100.0], vec![100.0, 25.0]]);
        assert!((s[0] - 0.5f64.sqrt()).abs() < 1e-12, "{s:?}");
        assert!((s[1] - 0.25f64.sqrt()).abs() < 1e-12, "{s:?}");
        // A metric nobody moved counts 1 for all.
        assert_eq!(scores(&[vec![0.0, 10.0], vec![0.0, 10.0]]), [1.0, 1.0]);
        assert_eq!(scores(&[vec![], vec![]]), [1.0, 1.0]);
    }

    #[test]
    fn ties_break_towards_64k_then_larger() {
        assert_eq!(tie_break(&[4 * K, 1024 * K]), 1024 * K);
        assert_eq!(tie_break(&[4 * K, 512 * K]), 512 * K);
        assert_eq!(tie_break(&[8 * K, 1024 * K]), 8 * K);
        assert_eq!(tie_break(&[32 * K, 128 * K]), 128 * K);
        assert_eq!(tie_break(&[256 * K, 512 * K, 1024 * K]), 256 * K);
        assert_eq!(tie_break(&[16 * K, 64 * K, 4096 * K]), 64 * K);
    }
}
