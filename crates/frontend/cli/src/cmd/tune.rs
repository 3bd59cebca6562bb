//! `nvraid tune`: find the chunk size that suits a workload, by measuring.
//!
//! The search, the scoring and the recommendation are nvraid-tune's; this
//! file reads the flags, shows the run's progress on stderr, prints the
//! table or the JSON, and with `--create` reports the array it made.
//! docs/tune.md is the user's guide.

use anyhow::Result;
use clap::Args;
use nvraid_bench::cli::Engine;
use nvraid_bench::units::{parse_duration, parse_size_bytes};
use nvraid_bench::RunContext;
use nvraid_tune::{Observer, Plan, Position, Request, Stage};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

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

/// `1 round`, `5 rounds`.
fn count_text(count: usize, what: &str) -> String {
    match count {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
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

impl Observer for Eta {
    fn follows_steps(&self) -> bool {
        self.live
    }

    fn stage(&mut self, at: &Position, stage: Stage<'_>) {
        match stage {
            Stage::Creating => self.show(&format!("{at}: creating the array"), Duration::ZERO),
            Stage::Filling { bytes } => self.show(
                &format!(
                    "{at}: writing {} of random data",
                    nvraid_member::format_size(bytes)
                ),
                Duration::ZERO,
            ),
            Stage::Measuring(p) => self.show(
                &format!(
                    "{at}: {} {:.1}/{:.1}s",
                    p.job_name,
                    p.elapsed.min(p.total).as_secs_f64(),
                    p.total.as_secs_f64()
                ),
                p.elapsed.min(p.total),
            ),
        }
    }

    fn step_done(&mut self, measured: Duration) {
        self.done += measured;
    }

    fn chunk_done(&mut self) {
        if !self.done.is_zero() {
            self.factor = self.started.elapsed().as_secs_f64() / self.done.as_secs_f64();
        }
    }
}

/// `nvraid tune`.
pub fn run(args: &TuneArgs, direct: bool) -> Result<u8> {
    let plan = Plan::new(Request {
        members: args.members.clone(),
        level: args.level.clone(),
        workload: args.workload.clone(),
        chunks: args.chunks.clone(),
        noise_pct: args.noise,
        rounds: args.rounds,
        runtime: args.runtime,
        ramp: args.ramp,
        size_bytes: args.size,
        destructive: args.destructive,
        engine: args.engine,
        direct,
    })?;
    let total = plan.measuring_time();
    eprintln!(
        "nvraid: tune: {} x {} x {} on {} of a {} over {}: {:.0} s of measuring, \
         plus creating and filling the arrays",
        count_text(args.rounds as usize, "round"),
        count_text(plan.chunks().len(), "chunk size"),
        count_text(plan.steps(), "step"),
        nvraid_member::format_size(plan.region_bytes()),
        plan.level_name(),
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
    let outcome = plan.measure(&mut eta);
    eta.clear();
    let outcome = outcome?;

    let mut stdout = std::io::stdout().lock();
    if args.json {
        let context = RunContext::here(plan.subject());
        let document = nvraid_tune::report::to_json(&context, &plan, &outcome);
        serde_json::to_writer_pretty(&mut stdout, &document)?;
        writeln!(stdout)?;
    } else {
        nvraid_tune::report::write_text(&mut stdout, &plan, &outcome)?;
    }
    stdout.flush()?;
    drop(stdout);

    if args.create {
        create_chosen(&plan, &args.name, outcome.recommendation.chunk_bytes)?;
    }
    Ok(0)
}

/// `--create`: the real array, with the recommended chunk.
fn create_chosen(plan: &Plan, name: &str, chunk: u64) -> Result<()> {
    let array = plan.create_array(chunk, name)?;
    let detail = nvraid_array::info::detail(&array);
    let needs_resync = array.resync_from().is_some();
    array.close()?;
    eprintln!(
        "nvraid: created {} array {} ({}) of {} members, chunk {}, {}",
        detail.level_name(),
        detail.uuid,
        detail.name,
        detail.raid_disks,
        nvraid_bench::units::format_size(chunk),
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
