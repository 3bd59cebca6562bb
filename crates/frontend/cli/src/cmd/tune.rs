//! `nvraid tune`: find the chunk size that suits a workload, by measuring.
//!
//! For each chunk size tried, tune creates a throwaway array on the members
//! (destroying what they held), writes random data over the region the
//! workload uses (so reads read data, not holes), runs the workload with
//! nvraid-bench and closes the array. Then it scores every chunk on every
//! metric, recommends one (with the reason, and saying when the
//! measurements cannot tell the best ones apart), and with `--create`
//! makes the real array with it.
//!
//! Everything that could refuse the run is checked before the first byte
//! moves: the chunk list, the level against the member count, the
//! workload's jobs against the array they will run on, members claimed by
//! another nvraid writer, and members holding data without `--destructive`.
//! docs/tune.md is the user's guide; its rule is [`recommend`].

use crate::cmd::bench::engine_for;
use crate::cmd::create::parse_level;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use nvraid_array::{create, detect_signature, BitmapChoice, CreateOptions, FanoutTarget};
use nvraid_bench::cli::Engine;
use nvraid_bench::presets::{self, Layout, Step};
use nvraid_bench::report::{BenchReport, StepReport};
use nvraid_bench::units::{
    format_duration, format_size, parse_duration, parse_size_bytes, MB_BYTES,
};
use nvraid_bench::{JobResult, JobSpec, Progress, RunContext, RwMode};
use nvraid_io::queue::{Queue, Target};
use nvraid_layout::{Geometry, Level};
use nvraid_member::{Member, MemberError, OpenOptions};
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `schema` of tune's JSON.
pub const SCHEMA: &str = "nvraid-tune/1";

/// Chunk sizes tried without `--chunks`: 4 KiB to 1 MiB, powers of two.
const DEFAULT_CHUNKS: [u64; 9] = [
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
];

/// The chunk sizes md and nvraid accept.
const CHUNK_BYTES_MIN: u64 = 4 << 10;
const CHUNK_BYTES_MAX: u64 = 4 << 20;

/// The chunk a tie goes towards: nvraid's default.
const TIE_CHUNK_BYTES: u64 = nvraid_array::CHUNK_BYTES_DEFAULT;

/// The ATTO transfer sizes of the default workload (ATTO sweeps 512 B to
/// 64 MiB; these four, every third power of two, span the chunks tried).
const ATTO_SIZES: [u32; 4] = [8 << 10, 64 << 10, 512 << 10, 4 << 20];

/// The name the throwaway arrays' superblocks carry.
const THROWAWAY_NAME: &str = "tune";

fn size_arg(text: &str) -> Result<u64, String> {
    parse_size_bytes(text).map_err(|e| e.to_string())
}

fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

/// Flags of `nvraid tune`.
#[derive(Args, Debug)]
pub struct TuneArgs {
    /// Members to tune on (all of them are overwritten): devices, files,
    /// mem:SIZE or null:SIZE.
    #[arg(required = true, value_name = "MEMBER")]
    members: Vec<String>,
    /// RAID level of the arrays: 0, 10, 4, 5 or 6 (raid1 has no chunk).
    #[arg(long, short = 'l')]
    level: String,
    /// What to measure: `default` (CrystalDiskMark's four tests and an ATTO
    /// sweep of 8K, 64K, 512K and 4M, read and write), a bench preset
    /// (quick, cdm, atto, ...), or one job in fio's words:
    /// "rw=randread,bs=4k,iodepth=32,numjobs=1" (keys rw, bs, iodepth,
    /// numjobs, rwmixread; "--rw randread --bs 4k" works too).
    #[arg(
        long,
        value_name = "PRESET|JOB",
        default_value = "default",
        allow_hyphen_values = true
    )]
    workload: String,
    /// Chunk sizes to try, comma-separated powers of two from 4K to 4M
    /// (default 4k,8k,16k,32k,64k,128k,256k,512k,1m).
    #[arg(long, value_name = "LIST")]
    chunks: Option<String>,
    /// Score differences below this percentage are ties (noise): the best
    /// must beat another chunk's score by this much to be told apart.
    #[arg(long, value_name = "PCT", default_value_t = 10.0)]
    noise: f64,
    /// Passes over the chunk sizes (ascending, then descending, ...):
    /// each value is the best of this many runs.
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Measured time of each step in each round (applies to presets too).
    #[arg(long, value_name = "DURATION", default_value = "120ms",
          value_parser = duration_arg)]
    runtime: Duration,
    /// Time each step runs before measuring starts.
    #[arg(long, value_name = "DURATION", default_value = "30ms",
          value_parser = duration_arg)]
    ramp: Duration,
    /// Bytes of the array every step uses, from its start (written with
    /// random data before measuring); capped to the smallest array tried.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = size_arg)]
    size: u64,
    /// Go ahead on members whose bytes outlive the run (files, devices,
    /// NBD exports): tune overwrites every member, whatever it holds.
    #[arg(long)]
    destructive: bool,
    /// Then create the real array with the recommended chunk (same level
    /// and members).
    #[arg(long)]
    create: bool,
    /// Array name --create stores in the superblock.
    #[arg(long, short = 'N', default_value = "nvraid")]
    name: String,
    /// I/O engine of the measurements.
    #[arg(long, value_enum, default_value_t = Engine::Auto)]
    engine: Engine,
    /// Print the result as JSON (schema nvraid-tune/1) instead of the table.
    #[arg(long)]
    json: bool,
}

/// What one metric counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    /// I/Os per second (random steps).
    Iops,
    /// 10^6 bytes per second (sequential steps).
    MbS,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Iops => "IOPS",
            Unit::MbS => "MB/s",
        }
    }
}

/// One column of the comparison: a step's label and direction.
#[derive(Clone, Debug, PartialEq)]
struct Metric {
    /// `RND4K Q32T1 read`.
    key: String,
    unit: Unit,
}

/// What tune runs on each array.
struct Workload {
    /// How the JSON and the table name it: `default`, a preset's name, or
    /// the job's options (`rw=randread,bs=4k,iodepth=32,numjobs=1`).
    name: String,
    /// The `preset` of each chunk's bench report.
    preset: Option<String>,
    /// The layout of each chunk's bench report.
    layout: Layout,
    /// The steps, with tune's runtime and ramp.
    steps: Vec<Step>,
    /// Whether the steps are a preset's (whose small block sizes are
    /// rounded up or skipped on large sectors, as bench does).
    from_preset: bool,
}

/// A job with every field given; its name is `label` and the direction.
fn job(label: &str, rw: RwMode, bs_bytes: u32, iodepth: u32) -> Step {
    let mut job = JobSpec::new(rw);
    job.bs_bytes = bs_bytes;
    job.iodepth = iodepth;
    job.name = format!("{label} {rw}");
    Step {
        label: label.to_string(),
        job,
        bs_round_up_to_sector: false,
    }
}

/// The default workload: CrystalDiskMark 8's four tests (reads, then
/// writes) and ATTO's queue depth 4 at [`ATTO_SIZES`], each size written
/// then read.
fn default_steps() -> Vec<Step> {
    let cdm = [
        ("SEQ1M Q8T1", false, 1 << 20, 8),
        ("SEQ1M Q1T1", false, 1 << 20, 1),
        ("RND4K Q32T1", true, 4 << 10, 32),
        ("RND4K Q1T1", true, 4 << 10, 1),
    ];
    let mut steps = Vec::new();
    for writes in [false, true] {
        for (label, random, bs, depth) in cdm {
            let rw = match (random, writes) {
                (false, false) => RwMode::Read,
                (false, true) => RwMode::Write,
                (true, false) => RwMode::Randread,
                (true, true) => RwMode::Randwrite,
            };
            steps.push(job(label, rw, bs, depth));
        }
    }
    for bs in ATTO_SIZES {
        let label = format!("ATTO {}", format_size(u64::from(bs)));
        for rw in [RwMode::Write, RwMode::Read] {
            steps.push(job(&label, rw, bs, 4));
        }
    }
    steps
}

/// Reads `--workload`: `default`, a preset name, or job options.
fn parse_workload(text: &str, runtime: Duration, ramp: Duration) -> Result<Workload> {
    let text = text.trim();
    let mut workload = if text.contains('=') || text.starts_with('-') {
        let (step, name) = parse_job_options(text)?;
        Workload {
            name,
            preset: None,
            layout: Layout::Jobs,
            steps: vec![step],
            from_preset: false,
        }
    } else if text == "default" {
        Workload {
            name: "default".into(),
            preset: Some("tune".into()),
            layout: Layout::Jobs,
            steps: default_steps(),
            from_preset: false,
        }
    } else {
        let Some(preset) = presets::preset(text) else {
            bail!(
                "--workload {text:?}: not a workload; use default, a preset ({}) or job \
                 options such as rw=randread,bs=4k,iodepth=32",
                presets::NAMES.join(", ")
            );
        };
        Workload {
            name: preset.name.to_string(),
            preset: Some(preset.name.to_string()),
            layout: preset.layout,
            steps: preset.steps,
            from_preset: true,
        }
    };
    for step in &mut workload.steps {
        step.job.runtime = runtime;
        step.job.ramp = ramp;
    }
    Ok(workload)
}

/// Reads job options: `key=value` or `--key value` (or `--key=value`),
/// separated by commas or spaces. Returns the step and the options
/// normalised as `rw=...,bs=...,iodepth=...,numjobs=...[,rwmixread=...]`.
fn parse_job_options(text: &str) -> Result<(Step, String)> {
    let bad = |what: String| anyhow!("--workload {text:?}: {what}");
    let mut tokens = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty());
    let mut job = JobSpec::new(RwMode::Read);
    let mut rwmix_given = false;
    while let Some(token) = tokens.next() {
        let token = token.trim_start_matches('-');
        let (key, value) = match token.split_once('=') {
            Some((key, value)) => (key, value),
            None => (
                token,
                tokens
                    .next()
                    .ok_or_else(|| bad(format!("{token} has no value")))?,
            ),
        };
        let number = |value: &str| -> Result<u32> {
            value
                .parse::<u32>()
                .map_err(|_| bad(format!("{key}={value} is not a whole number")))
        };
        match key {
            "rw" | "readwrite" => {
                job.rw = RwMode::from_str(value, true).map_err(|_| {
                    bad(format!(
                        "rw={value}: use read, write, randread, randwrite or randrw"
                    ))
                })?
            }
            "bs" => {
                let bytes = parse_size_bytes(value).map_err(|e| bad(e.to_string()))?;
                job.bs_bytes = u32::try_from(bytes)
                    .map_err(|_| bad(format!("bs={value}: at most 256 MiB")))?;
            }
            "iodepth" => job.iodepth = number(value)?,
            "numjobs" => job.numjobs = number(value)?,
            "rwmixread" => {
                job.rwmixread_pct = number(value)?;
                rwmix_given = true;
            }
            other => bail!(bad(format!(
                "unknown job option {other:?} (use rw, bs, iodepth, numjobs, rwmixread)"
            ))),
        }
    }
    let mut name = format!(
        "rw={},bs={},iodepth={},numjobs={}",
        job.rw,
        format_size(u64::from(job.bs_bytes)).to_lowercase(),
        job.iodepth,
        job.numjobs
    );
    if job.rw == RwMode::Randrw || rwmix_given {
        name.push_str(&format!(",rwmixread={}", job.rwmixread_pct));
    }
    // A label in CrystalDiskMark's shorthand: RND4K Q32T1 (70%r).
    let mut label = format!(
        "{}{} Q{}T{}",
        if job.rw.is_random() { "RND" } else { "SEQ" },
        format_size(u64::from(job.bs_bytes)),
        job.iodepth,
        job.numjobs
    );
    if job.rw == RwMode::Randrw {
        label.push_str(&format!(" {}%r", job.rwmixread_pct));
    }
    job.name = format!("{label} {}", job.rw);
    let step = Step {
        label,
        job,
        bs_round_up_to_sector: false,
    };
    Ok((step, name))
}

/// Reads `--chunks`: each entry a power of two from 4K to 4M. Sorted, each
/// size once.
fn parse_chunks(text: Option<&str>) -> Result<Vec<u64>> {
    let Some(text) = text else {
        return Ok(DEFAULT_CHUNKS.to_vec());
    };
    let mut chunks = Vec::new();
    for entry in text.split(',').map(str::trim) {
        if entry.is_empty() {
            bail!("--chunks {text:?}: an empty entry");
        }
        let bytes = parse_size_bytes(entry).map_err(|e| anyhow!("--chunks: {e}"))?;
        if !bytes.is_power_of_two() {
            bail!("--chunks: {entry} ({bytes} bytes) is not a power of two");
        }
        if !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&bytes) {
            bail!("--chunks: {entry} is outside 4K-4M");
        }
        chunks.push(bytes);
    }
    chunks.sort_unstable();
    chunks.dedup();
    Ok(chunks)
}

/// `1 round`, `5 rounds`.
fn count_text(count: usize, what: &str) -> String {
    match count {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

/// `64K`, `1M`.
fn chunk_text(bytes: u64) -> String {
    format_size(bytes)
}

/// The level as the JSON names it: `raid0`, `raid10`, `raid4`...
fn level_name(text: &str) -> String {
    format!("raid{}", text.trim_start_matches("raid"))
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

/// What the checks before the run found.
struct Checked {
    /// The region every step uses, bytes from the array's start.
    region: u64,
    /// Each step's fitted job, or why it is skipped.
    jobs: Vec<(String, Result<JobSpec, String>)>,
}

/// Every check that can refuse the run, before any byte moves: members
/// exist, nobody else claims them, their data may be destroyed, every
/// chunk makes an array of the level over them, and every job fits it.
fn check(args: &TuneArgs, level: Level, chunks: &[u64], workload: &Workload) -> Result<Checked> {
    let count = args.members.len() as u32;
    for &chunk in chunks {
        Geometry::new(level, count, chunk, 1 << 40).map_err(|e| {
            anyhow!(
                "--level {} over {count} member(s): {e}",
                args.level.trim_start_matches("raid")
            )
        })?;
    }
    let mut probes = Vec::with_capacity(args.members.len());
    for spec in &args.members {
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
    if !persistent.is_empty() && !args.destructive {
        let mut found = Vec::new();
        for member in &persistent {
            let what = detect_signature(member)
                .with_context(|| format!("{}: cannot read", member.spec()))?;
            found.push(match what {
                Some(what) => format!("{} holds {what}", member.spec()),
                None => format!(
                    "{} holds data nvraid does not recognise (or none)",
                    member.spec()
                ),
            });
        }
        bail!(
            "tune creates throwaway arrays on every member, destroying what they hold: {}; \
             add --destructive to go ahead",
            found.join("; ")
        );
    }
    let member_bytes = probes.iter().map(Member::size_bytes).min().unwrap_or(0);
    let data_bytes = member_bytes.saturating_sub(nvraid_array::DATA_OFFSET_SECTORS * 512) & !4095;
    let mut smallest_array = u64::MAX;
    for &chunk in chunks {
        let geometry = Geometry::new(level, count, chunk, data_bytes).map_err(|e| {
            anyhow!(
                "{}: too small for a chunk of {}: {e}",
                probes
                    .iter()
                    .min_by_key(|m| m.size_bytes())
                    .map_or("a member", |m| m.spec()),
                chunk_text(chunk)
            )
        })?;
        smallest_array = smallest_array.min(geometry.array_bytes());
    }
    let sector = probes
        .iter()
        .map(Member::logical_block_bytes)
        .max()
        .unwrap_or(512)
        .max(512);
    let region = args.size.min(smallest_array) / u64::from(sector) * u64::from(sector);
    if region == 0 {
        bail!("--size 0: the workload needs some of the array");
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
                .map_err(|e| anyhow!("--workload {}: {e}", workload.name))?;
        }
        jobs.push((step.label.clone(), fitted));
    }
    if jobs.iter().all(|(_, job)| job.is_err()) {
        bail!(
            "--workload {}: no step can run on these members",
            workload.name
        );
    }
    Ok(Checked { region, jobs })
}

/// Waits until every member can be claimed again. The array just closed
/// may still hold a claim for a moment (the kernel lets go of an
/// io_uring's registered files after the ring is gone); a claim held by
/// another process fails at once.
fn wait_claimable(specs: &[String]) -> Result<()> {
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

/// The live line on stderr (a terminal only): chunk, step, time left.
struct Eta {
    live: bool,
    started: Instant,
    /// Measuring time (ramp + runtime) of every step of every chunk.
    total: Duration,
    /// Of it, the steps finished.
    done: Duration,
    /// Wall time per measuring time, from the chunks finished (create and
    /// prefill included); 1 until the first chunk ends.
    factor: f64,
}

impl Eta {
    fn left(&self, in_step: Duration) -> Duration {
        let rest = self.total.saturating_sub(self.done + in_step);
        rest.mul_f64(self.factor.max(1.0))
    }

    fn show(&self, what: &str, in_step: Duration) {
        if !self.live {
            return;
        }
        let secs = self.left(in_step).as_secs();
        eprint!(
            "\r\x1b[2Ktune: {what}; about {}m{:02}s left",
            secs / 60,
            secs % 60
        );
    }

    fn clear(&self) {
        if self.live {
            eprint!("\r\x1b[2K");
        }
    }
}

/// One chunk's measurements: the best run of each step over the rounds.
struct ChunkRun {
    chunk_bytes: u64,
    report: BenchReport,
}

/// Creates the array for `chunk`, writes random data over its first
/// `fill` bytes, runs every step, closes the array (also when a step
/// failed). `what` names the chunk and round in the live line.
#[allow(clippy::too_many_arguments)]
fn run_chunk(
    args: &TuneArgs,
    level: Level,
    chunk: u64,
    fill: u64,
    what: &str,
    checked: &Checked,
    direct: bool,
    eta: &mut Eta,
) -> Result<Vec<StepReport>> {
    eta.show(&format!("{what}: creating the array"), Duration::ZERO);
    wait_claimable(&args.members)?;
    let options = CreateOptions {
        level,
        chunk_bytes: chunk,
        name: THROWAWAY_NAME.into(),
        size_bytes: None,
        force: true,
        direct,
        bitmap: BitmapChoice::Auto,
    };
    let array = Arc::new(create(&args.members, &options)?);
    let fill = fill.min(array.size_bytes());
    eta.show(
        &format!(
            "{what}: writing {} of random data",
            nvraid_member::format_size(fill)
        ),
        Duration::ZERO,
    );
    let measured = crate::cmd::bench::prefill(&array, fill).and_then(|()| {
        let members: Vec<&Member> = array.slots().iter().flatten().map(|s| &s.member).collect();
        let engine = engine_for(args.engine, &members);
        let target: Arc<dyn Target> = Arc::new(FanoutTarget::array(array.clone(), engine));
        let daemon = nvraid_array::BitmapDaemon::start(&array);
        let steps = run_steps(what, checked, &target, eta);
        drop(daemon);
        steps
    });
    let closed = match Arc::try_unwrap(array) {
        Ok(array) => array.close().map_err(anyhow::Error::from),
        Err(_) => Err(anyhow!("the array of chunk {} is still in use", chunk)),
    };
    let steps = measured?;
    closed?;
    Ok(steps)
}

/// Keeps the better run of each step (the higher bandwidth, as bench's
/// best-of does) and counts the runs.
fn keep_best(best: &mut Option<Vec<StepReport>>, round: Vec<StepReport>) {
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

/// Runs the fitted steps on `target`, with the live line.
fn run_steps(
    what: &str,
    checked: &Checked,
    target: &Arc<dyn Target>,
    eta: &mut Eta,
) -> Result<Vec<StepReport>> {
    let mut steps = Vec::with_capacity(checked.jobs.len());
    for (label, fitted) in &checked.jobs {
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
        let result = if eta.live {
            let eta_now = &*eta;
            let mut show = |p: &Progress| {
                eta_now.show(
                    &format!(
                        "{what}: {} {:.1}/{:.1}s",
                        p.job_name,
                        p.elapsed.min(p.total).as_secs_f64(),
                        p.total.as_secs_f64()
                    ),
                    p.elapsed.min(p.total),
                )
            };
            nvraid_bench::run_job(job, targets, Some(&mut show))
        } else {
            nvraid_bench::run_job(job, targets, None)
        }
        .with_context(|| format!("{what}: {}", job.name))?;
        eta.done += job.ramp + job.runtime;
        steps.push(StepReport {
            label: label.clone(),
            result: Some(result),
            skipped: None,
            runs: 1,
        });
    }
    Ok(steps)
}

/// The metric a step's result gives, and its value.
fn metric_of(label: &str, result: &JobResult) -> (Metric, f64) {
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
fn metrics(runs: &[ChunkRun]) -> (Vec<Metric>, Vec<Vec<f64>>) {
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
fn tie_break(tied: &[u64]) -> u64 {
    let distance = |c: u64| (c.ilog2() as i64 - TIE_CHUNK_BYTES.ilog2() as i64).unsigned_abs();
    *tied
        .iter()
        .min_by_key(|&&c| (distance(c), std::cmp::Reverse(c)))
        .expect("the best chunk is always tied with itself")
}

/// The rule (docs/tune.md): score every chunk ([`scores`]); the chunks
/// whose score the best beats by less than `noise_pct` percent are within
/// noise. With one chunk there, it is the recommendation; with several,
/// [`tie_break`] picks one and the reason says so.
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
    // Where the chosen chunk is best, and how far behind it is elsewhere.
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
    let facts = match (best_on.len(), behind) {
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
    };
    if tied.len() > 1 {
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
        return Recommendation {
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
        };
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

/// A table cell: IOPS and large rates whole, small rates to a tenth.
fn value_text(value: f64) -> String {
    if value >= 1000.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// The table: a row per metric, a column per chunk, the best of each row
/// starred; the score row; the recommendation and its reason.
fn write_table(
    out: &mut dyn Write,
    head: &str,
    runs: &[ChunkRun],
    keys: &[Metric],
    values: &[Vec<f64>],
    recommendation: &Recommendation,
) -> std::io::Result<()> {
    let scores = scores(values);
    let label_width = keys
        .iter()
        .map(|k| k.key.len())
        .chain(["metric".len(), "score".len()])
        .max()
        .unwrap_or(6);
    let cell_width = values
        .iter()
        .flatten()
        .map(|&v| value_text(v).len() + 1)
        .chain([7])
        .max()
        .unwrap_or(7)
        + 1;
    writeln!(out, "{head}")?;
    write!(out, "{:<label_width$} {:<4}", "metric", "unit")?;
    for run in runs {
        write!(out, " {:>cell_width$}", chunk_text(run.chunk_bytes) + " ")?;
    }
    writeln!(out)?;
    for (m, metric) in keys.iter().enumerate() {
        write!(
            out,
            "{:<label_width$} {:<4}",
            metric.key,
            metric.unit.as_str()
        )?;
        let best = values.iter().map(|row| row[m]).fold(0.0, f64::max);
        for row in values {
            let star = if row[m] >= best { "*" } else { " " };
            write!(out, " {:>cell_width$}", value_text(row[m]) + star)?;
        }
        writeln!(out)?;
    }
    write!(out, "{:<label_width$} {:<4}", "score", "")?;
    let best = scores.iter().copied().fold(0.0, f64::max);
    for &score in &scores {
        let star = if score >= best { "*" } else { " " };
        write!(out, " {:>cell_width$}", format!("{score:.3}{star}"))?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "* best of the row; score: geometric mean over the rows of value / the row's best"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "Recommended chunk: {}",
        chunk_text(recommendation.chunk_bytes)
    )?;
    writeln!(out, "Reason: {}", recommendation.reason)?;
    if !recommendation.within_noise.is_empty() {
        let names: Vec<String> = recommendation
            .within_noise
            .iter()
            .map(|&c| chunk_text(c))
            .collect();
        writeln!(out, "Within noise: {}", names.join(", "))?;
    }
    Ok(())
}

/// `nvraid tune`.
pub fn run(args: &TuneArgs, direct: bool) -> Result<u8> {
    let level = parse_level(&args.level)?;
    if !level.has_chunks() {
        bail!("--level 1: a raid1 has no chunk to tune (use 0, 10, 4, 5 or 6)");
    }
    if !(args.noise.is_finite() && args.noise >= 0.0) {
        bail!("--noise {}: a percentage, 0 or more", args.noise);
    }
    let chunks = parse_chunks(args.chunks.as_deref())?;
    let workload = parse_workload(&args.workload, args.runtime, args.ramp)?;
    let checked = check(args, level, &chunks, &workload)?;

    let level_text = level_name(&args.level);
    let per_chunk: Duration = checked
        .jobs
        .iter()
        .filter_map(|(_, job)| job.as_ref().ok())
        .map(|job| job.ramp + job.runtime)
        .sum();
    let steps = checked.jobs.iter().filter(|(_, job)| job.is_ok()).count();
    let total = per_chunk * (chunks.len() as u32 * args.rounds);
    eprintln!(
        "nvraid: tune: {} x {} x {} on {} of a {level_text} over {}: {:.0} s of measuring, \
         plus creating and filling the arrays",
        count_text(args.rounds as usize, "round"),
        count_text(chunks.len(), "chunk size"),
        count_text(steps, "step"),
        nvraid_member::format_size(checked.region),
        args.members.join(", "),
        total.as_secs_f64()
    );
    let mut eta = Eta {
        live: std::io::stderr().is_terminal(),
        started: Instant::now(),
        total,
        done: Duration::ZERO,
        factor: 1.0,
    };
    // Reads must read data, not never-written space (which zram, sparse
    // files and thin devices answer without touching storage). Members
    // that keep their bytes from one array to the next are filled once:
    // every array maps the region onto the same member ranges (give or
    // take a stripe, hence the margin). mem: members are new each time.
    let fresh_each_time = args.members.iter().any(|m| m.starts_with("mem:"));
    let largest_stripe = chunks.last().copied().unwrap_or(0) * args.members.len() as u64;
    let mut filled = false;
    let mut best: Vec<Option<Vec<StepReport>>> = vec![None; chunks.len()];
    for round in 0..args.rounds {
        // Odd rounds go the other way: a slow spell of the machine, or a
        // drift over the run, does not fall on the same chunks each time.
        let order: Vec<usize> = match round % 2 {
            0 => (0..chunks.len()).collect(),
            _ => (0..chunks.len()).rev().collect(),
        };
        for (nth, index) in order.into_iter().enumerate() {
            let chunk = chunks[index];
            let what = format!(
                "round {}/{}, chunk {} ({}/{})",
                round + 1,
                args.rounds,
                chunk_text(chunk),
                nth + 1,
                chunks.len()
            );
            let fill = match (filled, fresh_each_time) {
                (false, _) => checked.region + largest_stripe,
                (true, true) => checked.region,
                (true, false) => 0,
            };
            filled = true;
            match run_chunk(args, level, chunk, fill, &what, &checked, direct, &mut eta) {
                Ok(steps) => keep_best(&mut best[index], steps),
                Err(e) => {
                    eta.clear();
                    return Err(e);
                }
            }
            if !eta.done.is_zero() {
                eta.factor = eta.started.elapsed().as_secs_f64() / eta.done.as_secs_f64();
            }
        }
    }
    eta.clear();
    let runs: Vec<ChunkRun> = chunks
        .iter()
        .zip(best)
        .map(|(&chunk, steps)| ChunkRun {
            chunk_bytes: chunk,
            report: BenchReport {
                preset: workload.preset.clone(),
                layout: workload.layout,
                steps: steps.unwrap_or_default(),
                context: RunContext::here(crate::cmd::bench::subject_line(
                    &level_text,
                    &args.members,
                    Some(chunk),
                )),
            },
        })
        .collect();

    let (keys, values) = metrics(&runs);
    let names: Vec<String> = keys.iter().map(|k| k.key.clone()).collect();
    let tried: Vec<u64> = runs.iter().map(|r| r.chunk_bytes).collect();
    let recommendation = recommend(&tried, &names, &values, args.noise);
    let subject_line = crate::cmd::bench::subject_line(&level_text, &args.members, None);

    let mut stdout = std::io::stdout().lock();
    if args.json {
        let context = RunContext::here(subject_line);
        let document = to_json(
            &context,
            &level_text,
            args,
            &workload,
            &runs,
            &keys,
            &values,
            &recommendation,
        );
        serde_json::to_writer_pretty(&mut stdout, &document)?;
        writeln!(stdout)?;
    } else {
        let runs_text = match args.rounds {
            1 => format!("{} per step", format_duration(args.runtime)),
            n => format!(
                "best of {n} runs of {} per step",
                format_duration(args.runtime)
            ),
        };
        let ramp_text = match args.ramp.is_zero() {
            true => "no ramp".to_string(),
            false => format!("after a {} ramp", format_duration(args.ramp)),
        };
        let head = format!(
            "nvraid tune: {subject_line}; workload {}; {} of each array, {runs_text}, {ramp_text}",
            workload.name,
            nvraid_member::format_size(checked.region),
        );
        write_table(&mut stdout, &head, &runs, &keys, &values, &recommendation)?;
        for (label, job) in &checked.jobs {
            if let Err(reason) = job {
                writeln!(stdout, "skipped {label}: {reason}")?;
            }
        }
    }
    stdout.flush()?;
    drop(stdout);

    if args.create {
        create_chosen(args, level, recommendation.chunk_bytes, direct)?;
    }
    Ok(0)
}

/// `--create`: the real array, with the recommended chunk.
fn create_chosen(args: &TuneArgs, level: Level, chunk: u64, direct: bool) -> Result<()> {
    wait_claimable(&args.members)?;
    let options = CreateOptions {
        level,
        chunk_bytes: chunk,
        name: args.name.clone(),
        size_bytes: None,
        force: true,
        direct,
        bitmap: BitmapChoice::Auto,
    };
    let array = create(&args.members, &options)?;
    let detail = nvraid_array::info::detail(&array);
    let needs_resync = array.resync_from().is_some();
    array.close()?;
    eprintln!(
        "nvraid: created {} array {} ({}) of {} members, chunk {}, {}",
        detail.level_name(),
        detail.uuid,
        detail.name,
        detail.raid_disks,
        chunk_text(chunk),
        crate::cmd::bytes_text(detail.size_bytes)
    );
    if needs_resync {
        eprintln!(
            "nvraid: its parity does not match the members' old bytes yet: `nvraid repair` \
             computes it (`nvraid serve` does it in the background)"
        );
    }
    Ok(())
}

/// The JSON document (schema nvraid-tune/1; docs/tune.md has every field).
#[allow(clippy::too_many_arguments)]
fn to_json(
    context: &RunContext,
    level: &str,
    args: &TuneArgs,
    workload: &Workload,
    runs: &[ChunkRun],
    keys: &[Metric],
    values: &[Vec<f64>],
    recommendation: &Recommendation,
) -> Value {
    let metrics: Vec<Value> = keys
        .iter()
        .map(|k| json!({"key": k.key, "unit": k.unit.as_str()}))
        .collect();
    let chunks: Vec<Value> = runs
        .iter()
        .zip(values)
        .map(|(run, row)| {
            let values: serde_json::Map<String, Value> = keys
                .iter()
                .zip(row)
                .map(|(k, &v)| (k.key.clone(), json!(v)))
                .collect();
            json!({
                "chunk_bytes": run.chunk_bytes,
                "values": values,
                "bench": nvraid_bench::report::to_json(&run.report),
            })
        })
        .collect();
    json!({
        "schema": SCHEMA,
        "nvraid version": env!("CARGO_PKG_VERSION"),
        "command": context.command,
        "subject": context.subject,
        "machine": context.machine.to_json(),
        "level": level,
        "members": args.members,
        "workload": workload.name,
        "noise_pct": args.noise,
        "metrics": metrics,
        "chunks": chunks,
        "recommendation": {
            "chunk_bytes": recommendation.chunk_bytes,
            "reason": recommendation.reason,
            "within_noise": recommendation.within_noise,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    #[test]
    fn chunks_are_powers_of_two_from_4k_to_4m() {
        assert_eq!(
            parse_chunks(Some("64k, 16K,512k,16k")).unwrap(),
            vec![16 * K, 64 * K, 512 * K]
        );
        assert_eq!(parse_chunks(None).unwrap(), DEFAULT_CHUNKS.to_vec());
        for (bad, needle) in [
            ("48k", "not a power of two"),
            ("2k", "outside 4K-4M"),
            ("8M", "outside 4K-4M"),
            ("abc", "cannot read"),
            ("64k,,128k", "empty entry"),
        ] {
            let error = parse_chunks(Some(bad)).unwrap_err().to_string();
            assert!(error.contains(needle), "{bad}: {error}");
        }
    }

    #[test]
    fn job_options_in_both_spellings() {
        let (step, name) = parse_job_options("rw=randread,bs=4k,iodepth=32").unwrap();
        assert_eq!(name, "rw=randread,bs=4k,iodepth=32,numjobs=1");
        assert_eq!(step.label, "RND4K Q32T1");
        assert_eq!(
            (step.job.rw, step.job.bs_bytes, step.job.iodepth),
            (RwMode::Randread, 4096, 32)
        );
        let (other, other_name) = parse_job_options("--rw randread --bs=4k --iodepth 32").unwrap();
        assert_eq!((other.job, other_name), (step.job, name));
        let (mixed, name) = parse_job_options("rw=randrw rwmixread=70 bs=64k").unwrap();
        assert_eq!(name, "rw=randrw,bs=64k,iodepth=1,numjobs=1,rwmixread=70");
        assert_eq!(mixed.label, "RND64K Q1T1 70%r");
        for bad in ["rw=sideways", "bs=x", "iodepth=-1", "colour=red", "--rw"] {
            assert!(parse_job_options(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn workloads_by_name() {
        let ms = Duration::from_millis;
        let default = parse_workload("default", ms(300), ms(50)).unwrap();
        assert_eq!(default.steps.len(), 16);
        assert!(default
            .steps
            .iter()
            .all(|s| s.job.runtime == ms(300) && s.job.ramp == ms(50)));
        assert_eq!(
            parse_workload("cdm", ms(300), ms(0)).unwrap().steps.len(),
            8
        );
        let error = parse_workload("crystal", ms(300), ms(0)).err().unwrap();
        assert!(error.to_string().contains("cdm"), "{error}");
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
        assert!(
            r.reason.starts_with("64K: best on m0 and m1"),
            "{}",
            r.reason
        );
        assert!(
            r.reason.contains("41% above the next best, 16K"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn a_tie_is_said_and_goes_towards_the_default() {
        let chunks = [16 * K, 256 * K, 512 * K];
        let values = vec![vec![50.0], vec![97.0], vec![100.0]];
        let r = recommend(&chunks, &keys(1), &values, 10.0);
        assert_eq!(r.within_noise, vec![256 * K, 512 * K]);
        assert_eq!(r.chunk_bytes, 256 * K);
        assert!(
            r.reason.starts_with(
                "256K and 512K are within noise (3.1% apart, under the 10% threshold; 512K \
                 scored highest), so 256K, the nearest to nvraid's default (64K), is chosen"
            ),
            "{}",
            r.reason
        );
        // With no noise allowance the best wins.
        assert_eq!(
            recommend(&chunks, &keys(1), &values, 0.0).chunk_bytes,
            512 * K
        );
    }

    #[test]
    fn scores_are_geometric_means_of_ratios_to_the_best() {
        let s = scores(&[vec![50.0, 100.0], vec![100.0, 25.0]]);
        assert!((s[0] - 0.5f64.sqrt()).abs() < 1e-12);
        assert!((s[1] - 0.25f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn ties_break_towards_64k_then_larger() {
        assert_eq!(tie_break(&[4 * K, 1024 * K]), 1024 * K);
        assert_eq!(tie_break(&[4 * K, 512 * K]), 512 * K);
        assert_eq!(tie_break(&[8 * K, 1024 * K]), 8 * K);
        assert_eq!(tie_break(&[32 * K, 128 * K]), 128 * K);
        assert_eq!(tie_break(&[256 * K, 512 * K, 1024 * K]), 256 * K);
    }
}
