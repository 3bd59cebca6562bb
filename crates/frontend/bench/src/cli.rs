//! The `nvraid bench` flags and the entry point the binary calls.
//!
//! The binary parses [`BenchArgs`], builds the targets from the member
//! arguments (`--raw`, `--level`, `--chunk`, `--engine`, `--direct` and
//! `--destructive` are its business; they are carried here so that every flag
//! is defined once), asks [`plan`] whether the run writes, and calls [`run`].
//!
//! Which jobs run: `--preset NAME` runs that preset (`--runtime`, `--ramp`,
//! `--size`, `--offset`, `--best-of`, `--interval` override its values);
//! otherwise any of `--rw`, `--bs`, `--iodepth`, `--numjobs`, `--rwmixread`
//! makes one job from the flags (fio's defaults for the rest: read, 4 KiB,
//! QD 1, 1 worker, 10 s); otherwise the `quick` preset runs.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvraid_io::queue::Target;

use crate::machine::RunContext;
use crate::presets::{self, Layout, Preset, Step};
use crate::report::{self, BenchReport, StepReport};
use crate::runner::{run_job, JobResult, Progress};
use crate::spec::{JobSpec, RwMode, SpecError};
use crate::units::{parse_duration, parse_size_bytes, MB_BYTES};
use crate::Error;

/// Which I/O engine the targets use (chosen by the binary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// io_uring.
    Uring,
    /// pread/pwrite from a thread per queue.
    Psync,
    /// io_uring where the kernel has it, else psync.
    #[default]
    Auto,
}

fn size_arg(text: &str) -> Result<u64, String> {
    parse_size_bytes(text).map_err(|error| error.to_string())
}

fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|error| error.to_string())
}

/// Flags of `nvraid bench`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct BenchArgs {
    /// Members to bench: devices, files, `mem:SIZE` or `null:SIZE`. They are
    /// assembled into their array (or formed into one with --level), or
    /// benched side by side with --raw. None: a temporary 4-member RAID 0 on
    /// sparse files, with the quick preset.
    #[arg(value_name = "MEMBER")]
    pub members: Vec<String>,

    /// Access pattern: read, write, randread, randwrite, randrw.
    #[arg(long, value_enum, value_name = "PATTERN")]
    pub rw: Option<RwMode>,
    /// Percentage of reads in randrw (default 50).
    #[arg(long, value_name = "PCT")]
    pub rwmixread: Option<u32>,
    /// Bytes per I/O: 512, 4k, 128K, 1M... (binary units; default 4k).
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub bs: Option<u64>,
    /// I/Os each worker keeps in flight (default 1).
    #[arg(long, value_name = "N")]
    pub iodepth: Option<u32>,
    /// Worker threads (default 1).
    #[arg(long, value_name = "N")]
    pub numjobs: Option<u32>,
    /// Measured time per job: 10s, 500ms, 2m (default 10s).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub runtime: Option<Duration>,
    /// Time each job runs before measuring starts (default 0).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub ramp: Option<Duration>,
    /// Bytes of each target to use, from --offset (default: to the end).
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub size: Option<u64>,
    /// First byte of each target to use (default 0).
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub offset: Option<u64>,
    /// Run a preset: quick, cdm, cdm-nvme, atto, as-ssd, iometer-4k,
    /// iometer-64k, sweep, sweep-write.
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Run each job N times and report the best (CrystalDiskMark's count).
    #[arg(long, value_name = "N")]
    pub best_of: Option<u32>,
    /// Idle time between runs (CrystalDiskMark's interval).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub interval: Option<Duration>,

    /// Print fio-style JSON instead of the table.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV instead of the table.
    #[arg(long)]
    pub csv: bool,
    /// Also write the results as one HTML page of charts (as `nvraid
    /// report` draws them) to FILE.
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,

    /// Bench the members as independent plain targets, without RAID (JBOD,
    /// the baseline); each worker spreads its I/Os over all of them.
    #[arg(long)]
    pub raw: bool,
    /// RAID level of a throwaway array formed from the members (0, 1, 10).
    #[arg(long, value_name = "LEVEL")]
    pub level: Option<String>,
    /// Chunk size of a throwaway array (e.g. 512k).
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub chunk: Option<u64>,
    /// I/O engine.
    #[arg(long, value_enum, default_value_t = Engine::Auto)]
    pub engine: Engine,
    /// Allow writing jobs on members that hold an array or a filesystem.
    #[arg(long)]
    pub destructive: bool,
    /// Benchmark the array even with members missing or set aside (a RAID
    /// 1/10 reads the copies left, a RAID 4/5/6 rebuilds missing chunks
    /// from parity on every read).
    #[arg(long)]
    pub degraded: bool,
    /// 1: O_DIRECT (default); 0: through the page cache.
    #[arg(long, value_name = "0|1", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub direct: u8,
}

/// What a run will do: the steps and how to repeat and show them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The preset's name (`None`: one job from the flags).
    pub preset: Option<String>,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Runs per step.
    pub best_of: u32,
    /// Idle time between runs.
    pub interval: Duration,
    /// Text layout.
    pub layout: Layout,
    /// Whether `--size` was given (presets' sizes are otherwise fitted to
    /// small targets).
    pub size_given: bool,
}

impl Plan {
    /// Whether any step writes (for the `--destructive` check).
    pub fn writes(&self) -> bool {
        self.steps.iter().any(|step| step.job.job_writes())
    }
}

fn job_flags_given(args: &BenchArgs) -> Option<&'static str> {
    let flags = [
        (args.rw.is_some(), "--rw"),
        (args.bs.is_some(), "--bs"),
        (args.iodepth.is_some(), "--iodepth"),
        (args.numjobs.is_some(), "--numjobs"),
        (args.rwmixread.is_some(), "--rwmixread"),
    ];
    flags
        .into_iter()
        .find(|(given, _)| *given)
        .map(|(_, name)| name)
}

fn job_from_flags(args: &BenchArgs) -> Result<JobSpec, SpecError> {
    let mut job = JobSpec::new(args.rw.unwrap_or(RwMode::Read));
    if let Some(bs) = args.bs {
        job.bs_bytes =
            u32::try_from(bs).map_err(|_| SpecError::BlockSizeRange { bs_bytes: u32::MAX })?;
    }
    job.iodepth = args.iodepth.unwrap_or(job.iodepth);
    job.numjobs = args.numjobs.unwrap_or(job.numjobs);
    job.rwmixread_pct = args.rwmixread.unwrap_or(job.rwmixread_pct);
    job.name = job.default_name();
    Ok(job)
}

fn preset_or_job(args: &BenchArgs) -> Result<Preset, SpecError> {
    let job_flag = job_flags_given(args);
    match (&args.preset, job_flag) {
        (Some(_), Some(flag)) => Err(SpecError::BadValue {
            option: flag,
            message: "cannot be combined with --preset (a preset defines the jobs)".into(),
        }),
        (Some(name), None) => presets::preset(name).ok_or_else(|| SpecError::UnknownPreset {
            name: name.clone(),
            known: presets::NAMES.join(", "),
        }),
        (None, Some(_)) => {
            let job = job_from_flags(args)?;
            let label = job.name.clone();
            Ok(Preset {
                name: "",
                source: "",
                best_of: 1,
                interval: Duration::ZERO,
                steps: vec![Step {
                    label,
                    job,
                    bs_round_up_to_sector: false,
                }],
                layout: Layout::Jobs,
            })
        }
        (None, None) => Ok(presets::quick()),
    }
}

/// The steps `args` ask for, with every override applied. Fails on an
/// unknown preset, a job flag combined with a preset, or `--best-of 0`.
pub fn plan(args: &BenchArgs) -> Result<Plan, SpecError> {
    let preset = preset_or_job(args)?;
    let best_of = args.best_of.unwrap_or(preset.best_of);
    if best_of == 0 {
        return Err(SpecError::BadValue {
            option: "--best-of",
            message: "must be at least 1".into(),
        });
    }
    let mut steps = preset.steps;
    for step in &mut steps {
        let job = &mut step.job;
        job.runtime = args.runtime.unwrap_or(job.runtime);
        job.ramp = args.ramp.unwrap_or(job.ramp);
        job.size_bytes = args.size.or(job.size_bytes);
        job.offset_bytes = args.offset.unwrap_or(job.offset_bytes);
        job.direct = args.direct == 1;
    }
    Ok(Plan {
        preset: (!preset.name.is_empty()).then(|| preset.name.to_string()),
        steps,
        best_of,
        interval: args.interval.unwrap_or(preset.interval),
        layout: preset.layout,
        size_given: args.size.is_some(),
    })
}

/// Adapts a step to the targets: a preset's region shrinks to fit small
/// targets, a block below the sector size is rounded up or the step skipped.
/// Returns the job to run, or why the step is skipped.
fn fit_step(
    step: &Step,
    targets: &[Arc<dyn Target>],
    size_given: bool,
    from_preset: bool,
) -> Result<JobSpec, String> {
    let mut job = step.job.clone();
    let sector_bytes = targets
        .iter()
        .map(|t| t.sector_bytes())
        .max()
        .unwrap_or(512)
        .max(1);
    // Only a preset's own small sizes (ATTO's 512 B on a 4 KiB-sector
    // target) are rounded up or skipped; a block size the user gave that
    // does not fit the sector is refused by validation.
    if from_preset && job.bs_bytes < sector_bytes {
        if !step.bs_round_up_to_sector {
            return Err(format!(
                "block size {} is below the sector size {sector_bytes}",
                job.bs_bytes
            ));
        }
        job.bs_bytes = job.bs_bytes.next_multiple_of(sector_bytes);
    }
    if !size_given {
        let room = targets
            .iter()
            .map(|t| t.size_bytes().saturating_sub(job.offset_bytes))
            .min()
            .unwrap_or(0);
        job.size_bytes = job.size_bytes.map(|size| size.min(room));
    }
    Ok(job)
}

/// A step's label and its fitted job, or why it is skipped.
type PreparedStep = (String, Result<JobSpec, String>);

/// Fits every step and validates every job before any I/O.
fn prepare(plan: &Plan, targets: &[Arc<dyn Target>]) -> Result<Vec<PreparedStep>, Error> {
    let mut prepared = Vec::with_capacity(plan.steps.len());
    for step in &plan.steps {
        let fitted = fit_step(step, targets, plan.size_given, plan.preset.is_some());
        if let Ok(job) = &fitted {
            job.validate(targets)?;
        }
        prepared.push((step.label.clone(), fitted));
    }
    Ok(prepared)
}

/// Runs what `args` ask for on `targets`, writes the report to `out` (text,
/// `--json` or `--csv`) and returns it. With `progress`, a live line goes to
/// stderr. Every job is validated before the first I/O.
pub fn run(
    args: &BenchArgs,
    targets: Vec<Arc<dyn Target>>,
    context: RunContext,
    out: &mut dyn Write,
    progress: bool,
) -> Result<BenchReport, Error> {
    let plan = plan(args)?;
    let mut report = run_plan(&plan, &targets, progress)?;
    report.context = context;
    if args.json {
        report::write_json(&report, out)?;
    } else if args.csv {
        report::write_csv(&report, out)?;
    } else {
        report::write_text(&report, out)?;
    }
    Ok(report)
}

/// Runs a plan's steps and gathers their best results (with an empty
/// [`RunContext`]: the caller fills it in).
pub fn run_plan(
    plan: &Plan,
    targets: &[Arc<dyn Target>],
    progress: bool,
) -> Result<BenchReport, Error> {
    let prepared = prepare(plan, targets)?;
    let mut steps = Vec::with_capacity(prepared.len());
    let mut first_run = true;
    for (label, fitted) in prepared {
        let job = match fitted {
            Ok(job) => job,
            Err(reason) => {
                steps.push(StepReport {
                    label,
                    result: None,
                    skipped: Some(reason),
                    runs: 0,
                });
                continue;
            }
        };
        let mut best: Option<JobResult> = None;
        for run_index in 0..plan.best_of {
            if !first_run && !plan.interval.is_zero() {
                std::thread::sleep(plan.interval);
            }
            first_run = false;
            let result = run_one(&job, targets, progress, run_index, plan.best_of)?;
            if best
                .as_ref()
                .is_none_or(|b| result.total_bw_bytes() > b.total_bw_bytes())
            {
                best = Some(result);
            }
        }
        steps.push(StepReport {
            label,
            result: best,
            skipped: None,
            runs: plan.best_of,
        });
    }
    Ok(BenchReport {
        preset: plan.preset.clone(),
        layout: plan.layout,
        steps,
        context: RunContext::default(),
    })
}

fn run_one(
    job: &JobSpec,
    targets: &[Arc<dyn Target>],
    progress: bool,
    run_index: u32,
    runs: u32,
) -> Result<JobResult, Error> {
    if !progress {
        return run_job(job, targets, None);
    }
    let mut line = ProgressLine::new(run_index, runs);
    let result = run_job(job, targets, Some(&mut |p: &Progress| line.update(p)));
    line.clear();
    result
}

/// The live line on stderr: job, run, time, and the rate since last time.
struct ProgressLine {
    run_index: u32,
    runs: u32,
    last: (Instant, u64, u64),
}

impl ProgressLine {
    fn new(run_index: u32, runs: u32) -> ProgressLine {
        ProgressLine {
            run_index,
            runs,
            last: (Instant::now(), 0, 0),
        }
    }

    fn update(&mut self, progress: &Progress) {
        let now = Instant::now();
        let (then, ios, bytes) = self.last;
        let secs = now.duration_since(then).as_secs_f64().max(1e-9);
        let iops = progress.ios.saturating_sub(ios) as f64 / secs;
        let mb_s = progress.bytes.saturating_sub(bytes) as f64 / secs / MB_BYTES;
        self.last = (now, progress.ios, progress.bytes);
        let phase = if progress.ramping { " (ramp)" } else { "" };
        eprint!(
            "\r\x1b[2K{} [run {}/{}] {:.1}/{:.1}s{phase}: {iops:.0} IOPS, {mb_s:.1} MB/s",
            progress.job_name,
            self.run_index + 1,
            self.runs,
            progress.elapsed.as_secs_f64(),
            progress.total.as_secs_f64()
        );
    }

    fn clear(&self) {
        eprint!("\r\x1b[2K");
    }
}
