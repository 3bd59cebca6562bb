//! Measuring the candidates: for each round, for each chunk, a throwaway
//! array is created on the members, filled with random data over the
//! region the steps use, measured step by step through nvraid-bench on
//! the fast path, and closed. Each value kept is the best of the rounds.
//!
//! Nothing here prints: what tune is doing goes to an [`Observer`] (the
//! binary's live line on stderr).

use crate::candidates::round_order;
use crate::score::{chunk_text, metrics, recommend, ChunkRun, Metric, Recommendation};
use crate::{Error, Plan};
use nvraid_array::{create, Array, BitmapChoice, BitmapDaemon, CreateOptions};
use nvraid_bench::report::{BenchReport, StepReport};
use nvraid_bench::{array_target, prefill, subject_line, Progress, RunContext};
use nvraid_io::queue::Target;
use nvraid_member::{Member, MemberError, OpenOptions};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The name the throwaway arrays' superblocks carry.
pub const THROWAWAY_NAME: &str = "tune";

/// Where a run is: the round and the chunk being measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// The round, from 1.
    pub round: u32,
    /// Of how many.
    pub rounds: u32,
    /// The chunk measured.
    pub chunk_bytes: u64,
    /// Its place in this round's order, from 1.
    pub nth: usize,
    /// How many chunks a round measures.
    pub count: usize,
}

impl fmt::Display for Position {
    /// `round 2/5, chunk 64K (3/9)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "round {}/{}, chunk {} ({}/{})",
            self.round,
            self.rounds,
            chunk_text(self.chunk_bytes),
            self.nth,
            self.count
        )
    }
}

/// What tune is doing at a [`Position`].
#[derive(Clone, Copy, Debug)]
pub enum Stage<'a> {
    /// Creating the throwaway array.
    Creating,
    /// Writing random data over its first `bytes`.
    Filling {
        /// How much.
        bytes: u64,
    },
    /// A step is running (only to an observer that
    /// [follows steps](Observer::follows_steps)).
    Measuring(&'a Progress<'a>),
}

/// Told what a run is doing, as it does it. Every method does nothing by
/// default; `()` is the observer that wants nothing.
pub trait Observer {
    /// Whether [`Stage::Measuring`] is wanted: the bench then reports from
    /// the measuring thread while its workers run.
    fn follows_steps(&self) -> bool {
        false
    }
    /// Tune is at `stage` of `at`.
    fn stage(&mut self, _at: &Position, _stage: Stage<'_>) {}
    /// A step ended; `measured` is its ramp and runtime.
    fn step_done(&mut self, _measured: Duration) {}
    /// A chunk's array was measured and closed.
    fn chunk_done(&mut self) {}
}

impl Observer for () {}

/// What a run found: every chunk's measurements, the metrics and each
/// chunk's value of each (`values[chunk][metric]`), and the
/// recommendation.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// One per chunk tried, ascending.
    pub runs: Vec<ChunkRun>,
    /// The metrics, in run order.
    pub metrics: Vec<Metric>,
    /// `values[c][m]`: chunk `c`'s value of metric `m`.
    pub values: Vec<Vec<f64>>,
    /// The chunk recommended and why.
    pub recommendation: Recommendation,
}

/// How many bytes to fill before measuring a chunk's array: the region
/// plus one stripe of the largest chunk before the first array (so that
/// every later layout's region is covered too); after that nothing when
/// the members keep their bytes from one array to the next, the region
/// again when they are new each time (`mem:`).
pub fn fill_bytes(first: bool, fresh_each_time: bool, region: u64, largest_stripe: u64) -> u64 {
    match (first, fresh_each_time) {
        (true, _) => region + largest_stripe,
        (false, true) => region,
        (false, false) => 0,
    }
}

/// Keeps the better run of each step (the higher bandwidth, as bench's
/// best-of does) and counts the runs.
pub fn keep_best(best: &mut Option<Vec<StepReport>>, round: Vec<StepReport>) {
    let Some(kept) = best else {
        *best = Some(round);
        return;
    };
    for (kept, new) in kept.iter_mut().zip(round) {
        let better = match (&kept.result, &new.result) {
            (Some(old), Some(new)) => new.total_bw_bytes() > old.total_bw_bytes(),
            (None, Some(_)) => true,
            _ => false,
        };
        let runs = kept.runs + new.runs;
        if better {
            *kept = new;
        }
        kept.runs = runs;
    }
}

/// Waits until every member can be claimed again. The array just closed
/// may still hold a claim for a moment (the kernel lets go of an
/// io_uring's registered files after the ring is gone); a claim held by
/// another process fails at once.
pub fn wait_claimable(specs: &[String]) -> Result<(), Error> {
    let ours = format!("pid {}", std::process::id());
    for spec in specs {
        // Only files and devices are claimed (an NBD export's server keeps
        // its own writers apart).
        if spec.starts_with("mem:") || spec.starts_with("null:") || spec.contains("://") {
            continue;
        }
        let member = Member::open(
            spec,
            OpenOptions {
                write: false,
                ..Default::default()
            },
        )?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match member.check_claimable() {
                Err(MemberError::Busy { holder, .. })
                    if (holder == ours || holder.starts_with(&format!("{ours} ")))
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10))
                }
                other => break other?,
            }
        }
    }
    Ok(())
}

impl Plan {
    /// Measures every chunk in every round, then scores them and
    /// recommends one. On an error the array being measured is closed
    /// and the error names the round, chunk and step.
    pub fn measure(&self, observer: &mut dyn Observer) -> Result<Outcome, Error> {
        let members = &self.request.members;
        let rounds = self.request.rounds;
        let count = self.chunks.len();
        // Reads must read data, not never-written space (which zram,
        // sparse files and thin devices answer without touching storage).
        // Members that keep their bytes from one array to the next are
        // filled once: every array maps the region onto the same member
        // ranges (give or take a stripe, hence the margin). mem: members
        // are new each time.
        let fresh_each_time = members.iter().any(|m| m.starts_with("mem:"));
        let largest_stripe = self.chunks.last().copied().unwrap_or(0) * members.len() as u64;
        let mut first = true;
        let mut best: Vec<Option<Vec<StepReport>>> = vec![None; count];
        for round in 0..rounds {
            for (nth, index) in round_order(round, count).into_iter().enumerate() {
                let at = Position {
                    round: round + 1,
                    rounds,
                    chunk_bytes: self.chunks[index],
                    nth: nth + 1,
                    count,
                };
                let fill = fill_bytes(first, fresh_each_time, self.region, largest_stripe);
                first = false;
                let steps = self.run_chunk(&at, fill, observer)?;
                keep_best(&mut best[index], steps);
                observer.chunk_done();
            }
        }
        let runs: Vec<ChunkRun> = self
            .chunks
            .iter()
            .zip(best)
            .map(|(&chunk, steps)| ChunkRun {
                chunk_bytes: chunk,
                report: BenchReport {
                    preset: self.workload.preset.clone(),
                    layout: self.workload.layout,
                    steps: steps.unwrap_or_default(),
                    context: RunContext::here(subject_line(&self.level_name, members, Some(chunk))),
                },
            })
            .collect();
        let (metrics, values) = metrics(&runs);
        let names: Vec<String> = metrics.iter().map(|k| k.key.clone()).collect();
        let recommendation = recommend(&self.chunks, &names, &values, self.request.noise_pct);
        Ok(Outcome {
            runs,
            metrics,
            values,
            recommendation,
        })
    }

    /// Creates the real array with `chunk_bytes` (same level and members,
    /// `create`'s default bitmap), named `name`, once the last throwaway
    /// array has let go of the members.
    pub fn create_array(&self, chunk_bytes: u64, name: &str) -> Result<Array, Error> {
        wait_claimable(&self.request.members)?;
        Ok(create(
            &self.request.members,
            &self.create_options(chunk_bytes, name),
        )?)
    }

    fn create_options(&self, chunk_bytes: u64, name: &str) -> CreateOptions {
        CreateOptions {
            level: self.level,
            chunk_bytes,
            name: name.into(),
            size_bytes: None,
            force: true,
            direct: self.request.direct,
            bitmap: BitmapChoice::Auto,
        }
    }

    /// Creates the array for `at`'s chunk, writes random data over its
    /// first `fill` bytes, runs every step, closes the array (also when a
    /// step failed).
    fn run_chunk(
        &self,
        at: &Position,
        fill: u64,
        observer: &mut dyn Observer,
    ) -> Result<Vec<StepReport>, Error> {
        observer.stage(at, Stage::Creating);
        let array = Arc::new(self.create_array(at.chunk_bytes, THROWAWAY_NAME)?);
        let fill = fill.min(array.size_bytes());
        observer.stage(at, Stage::Filling { bytes: fill });
        let measured = prefill(&array, fill).map_err(Error::from).and_then(|()| {
            let target = array_target(array.clone(), self.request.engine);
            let daemon = BitmapDaemon::start(&array);
            let steps = self.run_steps(at, &target, observer);
            drop(daemon);
            steps
        });
        let closed = match Arc::try_unwrap(array) {
            Ok(array) => array.close().map_err(Error::from),
            Err(_) => Err(Error::StillInUse {
                chunk_bytes: at.chunk_bytes,
            }),
        };
        let steps = measured?;
        closed?;
        Ok(steps)
    }

    /// Runs the fitted steps on `target`; a skipped step is reported with
    /// its reason.
    fn run_steps(
        &self,
        at: &Position,
        target: &Arc<dyn Target>,
        observer: &mut dyn Observer,
    ) -> Result<Vec<StepReport>, Error> {
        let mut steps = Vec::with_capacity(self.jobs.len());
        for (label, fitted) in &self.jobs {
            let job = match fitted {
                Ok(job) => job,
                Err(reason) => {
                    steps.push(StepReport {
                        label: label.clone(),
                        result: None,
                        skipped: Some(reason.clone()),
                        runs: 0,
                    });
                    continue;
                }
            };
            let targets = std::slice::from_ref(target);
            let result = if observer.follows_steps() {
                let mut show = |p: &Progress| observer.stage(at, Stage::Measuring(p));
                nvraid_bench::run_job(job, targets, Some(&mut show))
            } else {
                nvraid_bench::run_job(job, targets, None)
            }
            .map_err(|source| Error::Step {
                at: *at,
                job: job.name.clone(),
                source: Box::new(source),
            })?;
            observer.step_done(job.ramp + job.runtime);
            steps.push(StepReport {
                label: label.clone(),
                result: Some(result),
                skipped: None,
                runs: 1,
            });
        }
        Ok(steps)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use nvraid_bench::presets::Layout;
    use nvraid_bench::runner::DirStats;
    use nvraid_bench::{JobResult, JobSpec, RwMode};

    /// A step's result: `ios` I/Os of `bs` bytes in one second.
    pub(crate) fn result(rw: RwMode, bs: u64, ios: u64) -> JobResult {
        let stats = DirStats {
            ios,
            bytes: ios * bs,
            ..Default::default()
        };
        let (read, write) = match rw.read_pct(50) {
            0 => (DirStats::default(), stats),
            _ => (stats, DirStats::default()),
        };
        JobResult {
            spec: JobSpec::new(rw),
            targets: vec!["the array".into()],
            runtime_ns: 1_000_000_000,
            workers: Vec::new(),
            read,
            write,
            cpu: Default::default(),
        }
    }

    pub(crate) fn step(label: &str, result: Option<JobResult>) -> StepReport {
        StepReport {
            label: label.into(),
            runs: u32::from(result.is_some()),
            skipped: result.is_none().then(|| "too small".into()),
            result,
        }
    }

    pub(crate) fn run(chunk_bytes: u64, steps: Vec<StepReport>) -> ChunkRun {
        ChunkRun {
            chunk_bytes,
            report: BenchReport {
                preset: None,
                layout: Layout::Jobs,
                steps,
                context: RunContext::default(),
            },
        }
    }

    #[test]
    fn the_first_array_is_filled_with_a_stripe_to_spare() {
        let (region, stripe) = (16 << 20, 4 << 20);
        assert_eq!(fill_bytes(true, false, region, stripe), 20 << 20);
        assert_eq!(fill_bytes(true, true, region, stripe), 20 << 20);
        assert_eq!(fill_bytes(false, true, region, stripe), 16 << 20);
        assert_eq!(fill_bytes(false, false, region, stripe), 0);
    }

    #[test]
    fn positions_read_as_round_and_chunk() {
        let at = Position {
            round: 2,
            rounds: 5,
            chunk_bytes: 64 << 10,
            nth: 3,
            count: 9,
        };
        assert_eq!(at.to_string(), "round 2/5, chunk 64K (3/9)");
    }

    #[test]
    fn the_best_run_of_each_step_is_kept_and_runs_are_counted() {
        let ios = |s: &StepReport| s.result.as_ref().map(|r| r.read.ios + r.write.ios);
        let mut best = None;
        // Round 1, then round 2: a is better the second time, b the first.
        for (a, b) in [(100, 300), (200, 250)] {
            let round = vec![
                step("a", Some(result(RwMode::Read, 4096, a))),
                step("b", Some(result(RwMode::Write, 4096, b))),
                step("c", None),
            ];
            keep_best(&mut best, round);
        }
        let kept = best.unwrap();
        assert_eq!(
            kept.iter().map(ios).collect::<Vec<_>>(),
            [Some(200), Some(300), None]
        );
        assert_eq!(kept.iter().map(|s| s.runs).collect::<Vec<_>>(), [2, 2, 0]);
    }
}
