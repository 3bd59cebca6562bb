//! What tune runs on each array: `default`, a bench preset, or one job in
//! fio's words (`--workload`).

use crate::Error;
use clap::ValueEnum;
use nvraid_bench::presets::{self, Layout, Step};
use nvraid_bench::units::{format_size, parse_size_bytes};
use nvraid_bench::{JobSpec, RwMode};
use std::time::Duration;

/// The ATTO transfer sizes of the default workload (ATTO sweeps 512 B to
/// 64 MiB; these four, every third power of two, span the chunks tried).
pub const ATTO_SIZES: [u32; 4] = [8 << 10, 64 << 10, 512 << 10, 4 << 20];

/// What tune runs on each array.
#[derive(Clone, Debug)]
pub struct Workload {
    /// How the JSON and the table name it: `default`, a preset's name, or
    /// the job's options (`rw=randread,bs=4k,iodepth=32,numjobs=1`).
    pub name: String,
    /// The `preset` of each chunk's bench report.
    pub preset: Option<String>,
    /// The layout of each chunk's bench report.
    pub layout: Layout,
    /// The steps, with tune's runtime and ramp.
    pub steps: Vec<Step>,
    /// Whether the steps are a preset's (whose small block sizes are
    /// rounded up or skipped on large sectors, as bench does).
    pub from_preset: bool,
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
pub fn default_steps() -> Vec<Step> {
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

/// Reads `--workload`: `default`, a preset name, or job options; every
/// step gets `runtime` and `ramp`.
pub fn parse_workload(text: &str, runtime: Duration, ramp: Duration) -> Result<Workload, Error> {
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
            return Err(Error::UnknownWorkload {
                text: text.into(),
                presets: presets::NAMES.join(", "),
            });
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
pub fn parse_job_options(text: &str) -> Result<(Step, String), Error> {
    let bad = |what: String| Error::JobOption {
        text: text.into(),
        what,
    };
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
        let number = |value: &str| -> Result<u32, Error> {
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
            other => {
                return Err(bad(format!(
                    "unknown job option {other:?} (use rw, bs, iodepth, numjobs, rwmixread)"
                )))
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_options_in_both_spellings() {
        let (step, name) = parse_job_options("rw=randread,bs=4k,iodepth=32").unwrap();
        assert_eq!(name, "rw=randread,bs=4k,iodepth=32,numjobs=1");
        assert_eq!(step.label, "RND4K Q32T1");
        assert_eq!(step.job.name, "RND4K Q32T1 randread");
        assert_eq!(
            (step.job.rw, step.job.bs_bytes, step.job.iodepth),
            (RwMode::Randread, 4096, 32)
        );
        let (other, other_name) = parse_job_options("--rw randread --bs=4k --iodepth 32").unwrap();
        assert_eq!((other.job, other_name), (step.job, name));
        let (mixed, name) = parse_job_options("rw=randrw rwmixread=70 bs=64k").unwrap();
        assert_eq!(name, "rw=randrw,bs=64k,iodepth=1,numjobs=1,rwmixread=70");
        assert_eq!(mixed.label, "RND64K Q1T1 70%r");
        for (bad, message) in [
            (
                "rw=sideways",
                "--workload \"rw=sideways\": rw=sideways: use read, write, randread, \
                 randwrite or randrw",
            ),
            (
                "iodepth=-1",
                "--workload \"iodepth=-1\": iodepth=-1 is not a whole number",
            ),
            (
                "colour=red",
                "--workload \"colour=red\": unknown job option \"colour\" (use rw, bs, \
                 iodepth, numjobs, rwmixread)",
            ),
            ("--rw", "--workload \"--rw\": rw has no value"),
        ] {
            assert_eq!(parse_job_options(bad).unwrap_err().to_string(), message);
        }
        assert!(parse_job_options("bs=x").is_err());
    }

    #[test]
    fn workloads_by_name() {
        let ms = Duration::from_millis;
        let default = parse_workload("default", ms(300), ms(50)).unwrap();
        assert_eq!(default.steps.len(), 16);
        assert_eq!(default.preset.as_deref(), Some("tune"));
        assert_eq!(default.steps[2].job.name, "RND4K Q32T1 randread");
        assert_eq!(default.steps[8].job.name, "ATTO 8K write");
        assert!(default
            .steps
            .iter()
            .all(|s| s.job.runtime == ms(300) && s.job.ramp == ms(50)));
        let cdm = parse_workload("cdm", ms(300), ms(0)).unwrap();
        assert_eq!((cdm.steps.len(), cdm.from_preset), (8, true));
        let one = parse_workload(" rw=write,bs=64k ", ms(20), ms(0)).unwrap();
        assert_eq!(one.name, "rw=write,bs=64k,iodepth=1,numjobs=1");
        assert_eq!((one.steps.len(), one.preset), (1, None));
        let error = parse_workload("crystal", ms(300), ms(0)).err().unwrap();
        assert!(
            error
                .to_string()
                .starts_with("--workload \"crystal\": not a workload; use default, a preset ("),
            "{error}"
        );
        assert!(error.to_string().contains("cdm"), "{error}");
    }
}
