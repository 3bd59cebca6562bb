//! A run of tune, checked before any byte moves: [`Plan::new`] reads the
//! request and refuses it (level, noise, chunk list, workload, members
//! missing, claimed by another writer or holding data without
//! `--destructive`, arrays too small, jobs that cannot run) or returns the
//! plan [`Plan::measure`](crate::Plan::measure) carries out.

use crate::candidates::parse_chunks;
use crate::score::chunk_text;
use crate::workload::{parse_workload, Workload};
use crate::Error;
use nvraid_array::detect_signature;
use nvraid_bench::cli::Engine;
use nvraid_bench::presets::Step;
use nvraid_bench::JobSpec;
use nvraid_io::queue::{Queue, Target};
use nvraid_layout::{Geometry, Level};
use nvraid_member::{Member, OpenOptions};
use std::sync::Arc;
use std::time::Duration;

/// What to tune, as `nvraid tune`'s flags give it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The members (every one is overwritten).
    pub members: Vec<String>,
    /// The level as given: `0`, `raid10`, `5`...
    pub level: String,
    /// `default`, a bench preset, or job options.
    pub workload: String,
    /// The chunk sizes to try, comma-separated; `None`: the default list.
    pub chunks: Option<String>,
    /// Score differences below this percentage are ties.
    pub noise_pct: f64,
    /// Passes over the chunk sizes; each value is the best of this many.
    pub rounds: u32,
    /// Measured time of each step in each round.
    pub runtime: Duration,
    /// Time each step runs before measuring starts.
    pub ramp: Duration,
    /// Bytes of each array the steps use (capped to the smallest array).
    pub size_bytes: u64,
    /// Members whose bytes outlive the run may be overwritten.
    pub destructive: bool,
    /// The I/O engine of the measurements.
    pub engine: Engine,
    /// O_DIRECT on the members.
    pub direct: bool,
}

/// A checked run: every chunk makes an array of the level over the
/// members, and every step of the workload runs on it (or is skipped, with
/// the reason).
#[derive(Debug)]
pub struct Plan {
    pub(crate) request: Request,
    pub(crate) level: Level,
    pub(crate) level_name: String,
    pub(crate) chunks: Vec<u64>,
    pub(crate) workload: Workload,
    /// The region every step uses, bytes from the array's start.
    pub(crate) region: u64,
    /// Each step's label and fitted job, or why it is skipped.
    pub(crate) jobs: Vec<(String, Result<JobSpec, String>)>,
}

/// The level as the JSON names it: `raid0`, `raid10`, `raid4`...
fn level_name(text: &str) -> String {
    format!("raid{}", text.trim_start_matches("raid"))
}

impl Plan {
    /// Every check that can refuse the run, before any byte moves: the
    /// level, `--noise`, the chunk list, the workload, members exist,
    /// nobody else claims them, their data may be destroyed, every chunk
    /// makes an array of the level over them, and every job fits it.
    pub fn new(request: Request) -> Result<Plan, Error> {
        let level = Level::parse(&request.level).map_err(Error::Level)?;
        if !level.has_chunks() {
            return Err(Error::NoChunk);
        }
        if !(request.noise_pct.is_finite() && request.noise_pct >= 0.0) {
            return Err(Error::Noise(request.noise_pct));
        }
        let chunks = parse_chunks(request.chunks.as_deref())?;
        let workload = parse_workload(&request.workload, request.runtime, request.ramp)?;
        let (region, jobs) = check(&request, level, &chunks, &workload)?;
        Ok(Plan {
            level_name: level_name(&request.level),
            request,
            level,
            chunks,
            workload,
            region,
            jobs,
        })
    }

    /// The request, as given.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The level as reports name it: `raid0`, `raid10`...
    pub fn level_name(&self) -> &str {
        &self.level_name
    }

    /// The chunk sizes tried, ascending.
    pub fn chunks(&self) -> &[u64] {
        &self.chunks
    }

    /// The workload.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// Bytes of each array the steps use, from its start.
    pub fn region_bytes(&self) -> u64 {
        self.region
    }

    /// How many steps run on each array.
    pub fn steps(&self) -> usize {
        self.jobs.iter().filter(|(_, job)| job.is_ok()).count()
    }

    /// The steps skipped on these members: label and reason.
    pub fn skipped(&self) -> impl Iterator<Item = (&str, &str)> {
        self.jobs.iter().filter_map(|(label, job)| match job {
            Err(reason) => Some((label.as_str(), reason.as_str())),
            Ok(_) => None,
        })
    }

    /// Measuring time (ramp and runtime) of every step of every chunk in
    /// every round; creating and filling the arrays come on top.
    pub fn measuring_time(&self) -> Duration {
        let per_chunk: Duration = self
            .jobs
            .iter()
            .filter_map(|(_, job)| job.as_ref().ok())
            .map(|job| job.ramp + job.runtime)
            .sum();
        per_chunk * (self.chunks.len() as u32 * self.request.rounds)
    }

    /// The line the reports carry: `raid0, 4 members: m0, m1, m2, m3`.
    pub fn subject(&self) -> String {
        nvraid_bench::subject_line(&self.level_name, &self.request.members, None)
    }
}

/// A target with an array's size and sector, to check the jobs against
/// before any array exists. It opens no queue.
struct Planned {
    size_bytes: u64,
    sector_bytes: u32,
}

impl Target for Planned {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn sector_bytes(&self) -> u32 {
        self.sector_bytes
    }
    fn writable(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "the array".into()
    }
    fn open_queue(&self, _depth: u32, _max_io_bytes: u32) -> std::io::Result<Box<dyn Queue>> {
        Err(std::io::Error::other("a planned array opens no queue"))
    }
}

/// A step fitted to the arrays: over the region, its block size raised to
/// the sector (or the step skipped) as bench does for presets.
fn fit(workload: &Workload, step: &Step, region: u64, sector: u32) -> Result<JobSpec, String> {
    let mut job = step.job.clone();
    if workload.from_preset && job.bs_bytes < sector {
        if !step.bs_round_up_to_sector {
            return Err(format!(
                "block size {} is below the sector size {sector}",
                job.bs_bytes
            ));
        }
        job.bs_bytes = job.bs_bytes.next_multiple_of(sector);
    }
    job.offset_bytes = 0;
    job.size_bytes = Some(region);
    Ok(job)
}

/// The region and fitted jobs, or the first reason to refuse the run.
#[allow(clippy::type_complexity)]
fn check(
    request: &Request,
    level: Level,
    chunks: &[u64],
    workload: &Workload,
) -> Result<(u64, Vec<(String, Result<JobSpec, String>)>), Error> {
    let count = request.members.len() as u32;
    for &chunk in chunks {
        Geometry::new(level, count, chunk, 1 << 40).map_err(|source| Error::Geometry {
            level: request.level.trim_start_matches("raid").to_string(),
            members: count,
            source,
        })?;
    }
    let mut probes = Vec::with_capacity(request.members.len());
    for spec in &request.members {
        let member = Member::open(
            spec,
            OpenOptions {
                write: false,
                create_bytes: None,
                ..Default::default()
            },
        )?;
        member.check_claimable()?;
        probes.push(member);
    }
    let persistent: Vec<&Member> = probes.iter().filter(|m| m.is_persistent()).collect();
    if !persistent.is_empty() && !request.destructive {
        let mut found = Vec::new();
        for member in &persistent {
            let what = detect_signature(member).map_err(|source| Error::Read {
                spec: member.spec().to_string(),
                source,
            })?;
            found.push(match what {
                Some(what) => format!("{} holds {what}", member.spec()),
                None => format!(
                    "{} holds data nvraid does not recognise (or none)",
                    member.spec()
                ),
            });
        }
        return Err(Error::Destructive { found });
    }
    let member_bytes = probes.iter().map(Member::size_bytes).min().unwrap_or(0);
    let data_bytes = member_bytes.saturating_sub(nvraid_array::DATA_OFFSET_SECTORS * 512) & !4095;
    let mut smallest_array = u64::MAX;
    for &chunk in chunks {
        let geometry =
            Geometry::new(level, count, chunk, data_bytes).map_err(|source| Error::TooSmall {
                spec: probes
                    .iter()
                    .min_by_key(|m| m.size_bytes())
                    .map_or("a member", |m| m.spec())
                    .to_string(),
                chunk: chunk_text(chunk),
                source,
            })?;
        smallest_array = smallest_array.min(geometry.array_bytes());
    }
    let sector = probes
        .iter()
        .map(Member::logical_block_bytes)
        .max()
        .unwrap_or(512)
        .max(512);
    let region = request.size_bytes.min(smallest_array) / u64::from(sector) * u64::from(sector);
    if region == 0 {
        return Err(Error::NoRegion);
    }
    let planned: Arc<dyn Target> = Arc::new(Planned {
        size_bytes: smallest_array,
        sector_bytes: sector,
    });
    let mut jobs = Vec::with_capacity(workload.steps.len());
    for step in &workload.steps {
        let fitted = fit(workload, step, region, sector);
        if let Ok(job) = &fitted {
            job.validate(std::slice::from_ref(&planned))
                .map_err(|source| Error::Job {
                    workload: workload.name.clone(),
                    source,
                })?;
        }
        jobs.push((step.label.clone(), fitted));
    }
    if jobs.iter().all(|(_, job)| job.is_err()) {
        return Err(Error::NothingRuns {
            workload: workload.name.clone(),
        });
    }
    Ok((region, jobs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(members: &[&str], level: &str, workload: &str) -> Request {
        Request {
            members: members.iter().map(|m| m.to_string()).collect(),
            level: level.into(),
            workload: workload.into(),
            chunks: Some("16k,64k".into()),
            noise_pct: 10.0,
            rounds: 3,
            runtime: Duration::from_millis(100),
            ramp: Duration::from_millis(20),
            size_bytes: 8 << 20,
            destructive: false,
            engine: Engine::Auto,
            direct: false,
        }
    }

    #[test]
    fn a_plan_over_memory_members() {
        let plan = Plan::new(request(&["mem:32M"; 4], "5", "default")).unwrap();
        assert_eq!(plan.level_name(), "raid5");
        assert_eq!(plan.chunks(), [16 << 10, 64 << 10]);
        assert_eq!(plan.region_bytes(), 8 << 20);
        assert_eq!(plan.steps(), 16);
        assert_eq!(plan.skipped().count(), 0);
        // 16 steps of 120 ms, 2 chunks, 3 rounds.
        assert_eq!(
            plan.measuring_time(),
            Duration::from_millis(16 * 120 * 2 * 3)
        );
        assert_eq!(
            plan.subject(),
            "raid5, 4 members: mem:32M, mem:32M, mem:32M, mem:32M"
        );
    }

    #[test]
    fn refusals_name_the_culprit() {
        let refused = |r: Request| Plan::new(r).unwrap_err().to_string();
        assert_eq!(
            refused(request(&["mem:32M"; 2], "1", "default")),
            "--level 1: a raid1 has no chunk to tune (use 0, 10, 4, 5 or 6)"
        );
        let error = refused(request(&["mem:32M"; 3], "raid6", "default"));
        assert!(error.starts_with("--level 6 over 3 member(s): "), "{error}");
        let mut noisy = request(&["mem:32M"; 2], "0", "default");
        noisy.noise_pct = -1.0;
        assert_eq!(refused(noisy), "--noise -1: a percentage, 0 or more");
        let mut empty = request(&["mem:32M"; 2], "0", "default");
        empty.size_bytes = 0;
        assert_eq!(
            refused(empty),
            "--size 0: the workload needs some of the array"
        );
        assert_eq!(
            refused(request(&["mem:32M"; 2], "0", "rw=read,bs=3000")),
            "--workload rw=read,bs=3000,iodepth=1,numjobs=1: --bs 3000: not a multiple of \
             the sector size (512 bytes) of the array"
        );
        assert_eq!(
            refused(request(&["mem:32M", "/nonexistent/m1"], "0", "default")),
            "/nonexistent/m1: does not exist"
        );
    }
}
