//! Presets that reproduce the classic benchmark tools, as data.
//!
//! Each preset is a list of [`Step`]s (a row label and a [`JobSpec`]) plus
//! how many times each step is repeated (best-of), the pause between runs, and
//! the layout of its text report. Sources are in each function's doc comment
//! and in docs/bench.md. Time-based runs stand in for the tools that move a
//! fixed amount of data (ATTO, AS SSD); that and other differences are listed
//! in docs/bench.md.

use std::time::Duration;

use crate::spec::{JobSpec, RwMode};
use crate::units::format_size;

const KIB: u32 = 1024;
const MIB: u32 = 1024 * 1024;
const GIB: u64 = 1024 * 1024 * 1024;

/// How a preset's text report is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// CrystalDiskMark: a `[Read]` block then a `[Write]` block, one line per
    /// test with MB/s, IOPS and mean latency.
    CrystalDiskMark,
    /// ATTO: one row per transfer size with write and read rates.
    Atto,
    /// AS SSD: rows Seq, 4K, 4K-64Thrd, Acc.time; read and write columns; the
    /// score.
    AsSsd,
    /// fio-like: one block per job.
    Jobs,
}

/// One step of a preset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Row label in the report (`SEQ1M Q8T1`, `4K-64Thrd`, `64M`).
    pub label: String,
    /// The job run.
    pub job: JobSpec,
    /// Raise `bs` to the target's sector size when it is smaller (AS SSD's
    /// 512-byte access-time writes); otherwise such a step is skipped.
    pub bs_round_up_to_sector: bool,
}

/// A named set of steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preset {
    /// Name given to `--preset`.
    pub name: &'static str,
    /// What it reproduces, with its source.
    pub source: &'static str,
    /// Runs of each step; the best (highest bandwidth) is reported.
    pub best_of: u32,
    /// Idle time between runs (CrystalDiskMark's "Interval").
    pub interval: Duration,
    /// The steps, in the order they run.
    pub steps: Vec<Step>,
    /// Text report layout.
    pub layout: Layout,
}

impl Preset {
    /// Whether any step writes (for the caller's `--destructive` check).
    pub fn writes(&self) -> bool {
        self.steps.iter().any(|step| step.job.job_writes())
    }

    /// Total time of a run, pauses included (for the user's patience).
    pub fn duration_estimate(&self) -> Duration {
        let per_run: Duration = self
            .steps
            .iter()
            .map(|s| s.job.ramp + s.job.runtime + self.interval)
            .sum();
        per_run * self.best_of
    }
}

/// Every preset name, in the order `--help` lists them.
pub const NAMES: [&str; 9] = [
    "quick",
    "cdm",
    "cdm-nvme",
    "atto",
    "as-ssd",
    "iometer-4k",
    "iometer-64k",
    "sweep",
    "sweep-write",
];

/// The preset called `name`, if there is one.
pub fn preset(name: &str) -> Option<Preset> {
    let preset = match name {
        "quick" => quick(),
        "cdm" => crystal_disk_mark(),
        "cdm-nvme" => crystal_disk_mark_nvme(),
        "atto" => atto(),
        "as-ssd" => as_ssd(),
        "iometer-4k" => iometer_4k(),
        "iometer-64k" => iometer_64k(),
        "sweep" => sweep(RwMode::Randread),
        "sweep-write" => sweep(RwMode::Randwrite),
        _ => return None,
    };
    Some(preset)
}

/// A job with every field given; the name is `label` plus the direction.
fn job(label: &str, rw: RwMode, bs_bytes: u32, iodepth: u32, numjobs: u32) -> JobSpec {
    let mut job = JobSpec::new(rw);
    job.bs_bytes = bs_bytes;
    job.iodepth = iodepth;
    job.numjobs = numjobs;
    job.name = format!("{label} {rw}");
    job
}

fn step(label: &str, job: JobSpec) -> Step {
    Step {
        label: label.to_string(),
        job,
        bs_round_up_to_sector: false,
    }
}

/// Sets runtime, ramp and region size of every step.
fn timed(
    mut steps: Vec<Step>,
    runtime: Duration,
    ramp: Duration,
    size_bytes: Option<u64>,
) -> Vec<Step> {
    for step in &mut steps {
        step.job.runtime = runtime;
        step.job.ramp = ramp;
        step.job.size_bytes = size_bytes;
    }
    steps
}

/// CrystalDiskMark-style tests: every read test, then every write test
/// (the order of CrystalDiskMark's report).
fn cdm_steps(tests: &[(&str, bool, u32, u32, u32)]) -> Vec<Step> {
    let mut steps = Vec::new();
    for writes in [false, true] {
        for &(label, random, bs_bytes, iodepth, numjobs) in tests {
            let rw = match (random, writes) {
                (false, false) => RwMode::Read,
                (false, true) => RwMode::Write,
                (true, false) => RwMode::Randread,
                (true, true) => RwMode::Randwrite,
            };
            steps.push(step(label, job(label, rw, bs_bytes, iodepth, numjobs)));
        }
    }
    steps
}

/// CrystalDiskMark 8, default test set: SEQ1M Q8T1, SEQ1M Q1T1, RND4K Q32T1,
/// RND4K Q1T1; 1 GiB test size, 5 runs (best reported), 5 s measure and 5 s
/// interval. Source: CrystalDiskMark 8.0's own result text ("Test: 1 GiB
/// (x5)", "Measure 5 sec / Interval 5 sec", the eight result lines) and its
/// settings menu, Crystal Dew World (crystalmark.info).
pub fn crystal_disk_mark() -> Preset {
    let tests = [
        ("SEQ1M Q8T1", false, MIB, 8, 1),
        ("SEQ1M Q1T1", false, MIB, 1, 1),
        ("RND4K Q32T1", true, 4 * KIB, 32, 1),
        ("RND4K Q1T1", true, 4 * KIB, 1, 1),
    ];
    Preset {
        name: "cdm",
        source: "CrystalDiskMark 8 (Crystal Dew World), default tests",
        best_of: 5,
        interval: Duration::from_secs(5),
        steps: timed(
            cdm_steps(&tests),
            Duration::from_secs(5),
            Duration::ZERO,
            Some(GIB),
        ),
        layout: Layout::CrystalDiskMark,
    }
}

/// CrystalDiskMark 8 with its "NVMe SSD" test set: SEQ1M Q8T1, SEQ128K
/// Q32T1, RND4K Q32T16, RND4K Q1T1; otherwise as [`crystal_disk_mark`].
/// Source: CrystalDiskMark 8.0 result texts with those lines, Crystal Dew
/// World (crystalmark.info).
pub fn crystal_disk_mark_nvme() -> Preset {
    let tests = [
        ("SEQ1M Q8T1", false, MIB, 8, 1),
        ("SEQ128K Q32T1", false, 128 * KIB, 32, 1),
        ("RND4K Q32T16", true, 4 * KIB, 32, 16),
        ("RND4K Q1T1", true, 4 * KIB, 1, 1),
    ];
    Preset {
        name: "cdm-nvme",
        source: "CrystalDiskMark 8 (Crystal Dew World), NVMe SSD tests",
        steps: timed(
            cdm_steps(&tests),
            Duration::from_secs(5),
            Duration::ZERO,
            Some(GIB),
        ),
        ..crystal_disk_mark()
    }
}

/// A few seconds in all: SEQ1M Q8T1 and RND4K Q32T1, read and write, 1 s each
/// after a 250 ms ramp, on up to 1 GiB. What the README's first command runs.
pub fn quick() -> Preset {
    let tests = [
        ("SEQ1M Q8T1", false, MIB, 8, 1),
        ("RND4K Q32T1", true, 4 * KIB, 32, 1),
    ];
    Preset {
        name: "quick",
        source: "nvraid's own: two CrystalDiskMark 8 tests, shortened",
        best_of: 1,
        interval: Duration::ZERO,
        steps: timed(
            cdm_steps(&tests),
            Duration::from_secs(1),
            Duration::from_millis(250),
            Some(GIB),
        ),
        layout: Layout::CrystalDiskMark,
    }
}

/// ATTO Disk Benchmark's default sweep: sequential transfers from 512 B to
/// 64 MiB, queue depth 4 ("Overlapped I/O", depth 4), 256 MiB total length,
/// direct I/O; each size written, then read. Source: ATTO Disk Benchmark 4
/// defaults as shown in its window and in reviews that state them (e.g. "0.5KB
/// through 64MB transfer sizes ... total max volume length of 256MB"). We
/// sweep powers of two; ATTO 4 may also list 12, 24 and 48 MiB (not sure).
pub fn atto() -> Preset {
    let mut steps = Vec::new();
    for shift in 9..=26u32 {
        let bs_bytes = 1u32 << shift;
        let label = format_size(u64::from(bs_bytes));
        for rw in [RwMode::Write, RwMode::Read] {
            steps.push(step(&label, job(&label, rw, bs_bytes, 4, 1)));
        }
    }
    Preset {
        name: "atto",
        source: "ATTO Disk Benchmark 4 (ATTO Technology), default sweep",
        best_of: 1,
        interval: Duration::ZERO,
        steps: timed(
            steps,
            Duration::from_secs(1),
            Duration::ZERO,
            Some(256 << 20),
        ),
        layout: Layout::Atto,
    }
}

/// AS SSD Benchmark (Alex Intelligent Software, Alexej Schepeljanski): Seq
/// (16 MiB blocks, 1 GiB), 4K (random, QD 1), 4K-64Thrd (random, 64 threads
/// of QD 1), Acc.time (random reads of 4 KiB over the whole device, random
/// writes of 512 B within 1 GiB, QD 1, mean latency), read then write for
/// each. Sources: Tom's Hardware's AS SSD description (2011) and
/// ssd-tester.com's; the access-time block sizes from a third-party write-up
/// (less sure). AS SSD moves fixed amounts; we run each step for 5 s.
pub fn as_ssd() -> Preset {
    let rows = [
        ("Seq", RwMode::Read, RwMode::Write, 16 * MIB, 1),
        ("4K", RwMode::Randread, RwMode::Randwrite, 4 * KIB, 1),
        (
            "4K-64Thrd",
            RwMode::Randread,
            RwMode::Randwrite,
            4 * KIB,
            64,
        ),
    ];
    let mut steps = Vec::new();
    for (label, read, write, bs_bytes, numjobs) in rows {
        for rw in [read, write] {
            steps.push(step(label, job(label, rw, bs_bytes, 1, numjobs)));
        }
    }
    let mut steps = timed(steps, Duration::from_secs(5), Duration::ZERO, Some(GIB));
    let mut access_read = step("Acc.time", job("Acc.time", RwMode::Randread, 4 * KIB, 1, 1));
    access_read.job.runtime = Duration::from_secs(5);
    let mut access_write = step("Acc.time", job("Acc.time", RwMode::Randwrite, 512, 1, 1));
    access_write.job.runtime = Duration::from_secs(5);
    access_write.job.size_bytes = Some(GIB);
    access_write.bs_round_up_to_sector = true;
    steps.push(access_read);
    steps.push(access_write);
    Preset {
        name: "as-ssd",
        source: "AS SSD Benchmark 2 (Alex Intelligent Software)",
        best_of: 1,
        interval: Duration::ZERO,
        steps,
        layout: Layout::AsSsd,
    }
}

/// AS SSD's scores from its rates in MB/s. Weights as published by Tom's
/// Hardware (2011) and ssd-tester.com, which agree; a forum post gives other
/// write weights, and AS SSD is closed source, so treat them as "probably
/// right": read = 0.1 seq + 4K + 4K-64; write = 0.1 seq + 4K + 4K-64;
/// total = 0.1 seq read + 0.15 seq write + 2 x 4K read + 4K write
/// + 1.5 x 4K-64 read + 4K-64 write. Rounded to whole points.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AsSsdRates {
    /// Seq read, MB/s.
    pub seq_read: f64,
    /// Seq write, MB/s.
    pub seq_write: f64,
    /// 4K read, MB/s.
    pub k4_read: f64,
    /// 4K write, MB/s.
    pub k4_write: f64,
    /// 4K-64Thrd read, MB/s.
    pub k4_64_read: f64,
    /// 4K-64Thrd write, MB/s.
    pub k4_64_write: f64,
}

/// AS SSD's three scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsSsdScore {
    /// Read score.
    pub read: u64,
    /// Write score.
    pub write: u64,
    /// Total score.
    pub total: u64,
}

impl AsSsdRates {
    /// The scores (see [`AsSsdRates`] for the formula and its source).
    pub fn score(&self) -> AsSsdScore {
        let read = 0.1 * self.seq_read + self.k4_read + self.k4_64_read;
        let write = 0.1 * self.seq_write + self.k4_write + self.k4_64_write;
        let total = 0.1 * self.seq_read
            + 0.15 * self.seq_write
            + 2.0 * self.k4_read
            + self.k4_write
            + 1.5 * self.k4_64_read
            + self.k4_64_write;
        AsSsdScore {
            read: read.round() as u64,
            write: write.round() as u64,
            total: total.round() as u64,
        }
    }
}

/// IOMeter-style access specification from the seeds (Micron 9100 review,
/// 2016): 4 KiB aligned, 100% random, 50%, 70% and 100% reads, 256 outstanding
/// I/Os per worker, 4 workers; 10 s each after a 2 s ramp.
pub fn iometer_4k() -> Preset {
    let mut steps = Vec::new();
    for read_pct in [50u32, 70, 100] {
        let label = format!("4K {read_pct}% read");
        let rw = if read_pct == 100 {
            RwMode::Randread
        } else {
            RwMode::Randrw
        };
        let mut job = job(&label, rw, 4 * KIB, 256, 4);
        job.rwmixread_pct = read_pct;
        job.name = label.clone();
        steps.push(step(&label, job));
    }
    Preset {
        name: "iometer-4k",
        source: "IOMeter access spec from the seeds: 4K aligned, 100% random, QD 256, 4 workers",
        best_of: 1,
        interval: Duration::ZERO,
        steps: timed(steps, Duration::from_secs(10), Duration::from_secs(2), None),
        layout: Layout::Jobs,
    }
}

/// The seeds' per-drive peak spec (Micron 9100 review, 2016): 64 KiB blocks,
/// 4 workers x QD 256, random read, random write, sequential read, sequential
/// write; 10 s each after a 2 s ramp.
pub fn iometer_64k() -> Preset {
    let mut steps = Vec::new();
    for rw in [
        RwMode::Randread,
        RwMode::Randwrite,
        RwMode::Read,
        RwMode::Write,
    ] {
        let label = format!("64K {rw}");
        let mut job = job(&label, rw, 64 * KIB, 256, 4);
        job.name = label.clone();
        steps.push(step(&label, job));
    }
    Preset {
        name: "iometer-64k",
        source: "IOMeter-style peak spec from the seeds: 64K, 4 workers x QD 256",
        best_of: 1,
        interval: Duration::ZERO,
        steps: timed(steps, Duration::from_secs(10), Duration::from_secs(2), None),
        layout: Layout::Jobs,
    }
}

/// Workers x queue depth (the seeds' fio thread sweep: past some thread count
/// the CPU, not the drive, limits IOPS): 4 KiB random, workers 1, 2, 4, 8 x
/// depth 1, 8, 32, 128; 3 s each after a 1 s ramp.
pub fn sweep(rw: RwMode) -> Preset {
    let mut steps = Vec::new();
    for numjobs in [1u32, 2, 4, 8] {
        for iodepth in [1u32, 8, 32, 128] {
            let mut job = job("", rw, 4 * KIB, iodepth, numjobs);
            job.name = job.default_name();
            steps.push(step(&format!("T{numjobs} Q{iodepth}"), job));
        }
    }
    let name = if rw == RwMode::Randread {
        "sweep"
    } else {
        "sweep-write"
    };
    Preset {
        name,
        source: "the seeds' fio thread sweep (workers x queue depth)",
        best_of: 1,
        interval: Duration::ZERO,
        steps: timed(steps, Duration::from_secs(3), Duration::from_secs(1), None),
        layout: Layout::Jobs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(step: &Step) -> (RwMode, u32, u32, u32) {
        (
            step.job.rw,
            step.job.bs_bytes,
            step.job.iodepth,
            step.job.numjobs,
        )
    }

    #[test]
    fn every_name_resolves_and_is_valid_alone() {
        for name in NAMES {
            let preset = preset(name).unwrap();
            assert_eq!(preset.name, name);
            assert!(!preset.steps.is_empty());
            for step in &preset.steps {
                assert!(step.job.bs_bytes > 0 && step.job.iodepth > 0, "{name}");
                assert!(!step.job.runtime.is_zero(), "{name}");
            }
        }
        assert!(preset("nope").is_none());
    }

    #[test]
    fn crystal_disk_mark_default() {
        let cdm = crystal_disk_mark();
        let shapes: Vec<_> = cdm.steps.iter().map(shape).collect();
        assert_eq!(
            shapes,
            vec![
                (RwMode::Read, MIB, 8, 1),
                (RwMode::Read, MIB, 1, 1),
                (RwMode::Randread, 4096, 32, 1),
                (RwMode::Randread, 4096, 1, 1),
                (RwMode::Write, MIB, 8, 1),
                (RwMode::Write, MIB, 1, 1),
                (RwMode::Randwrite, 4096, 32, 1),
                (RwMode::Randwrite, 4096, 1, 1),
            ]
        );
        assert_eq!(cdm.best_of, 5);
        assert_eq!(cdm.interval, Duration::from_secs(5));
        for step in &cdm.steps {
            assert_eq!(step.job.runtime, Duration::from_secs(5));
            assert_eq!(step.job.size_bytes, Some(GIB));
        }
        assert_eq!(cdm.steps[2].label, "RND4K Q32T1");
    }

    #[test]
    fn crystal_disk_mark_nvme() {
        let nvme = super::crystal_disk_mark_nvme();
        let reads: Vec<_> = nvme.steps[..4].iter().map(shape).collect();
        assert_eq!(
            reads,
            vec![
                (RwMode::Read, MIB, 8, 1),
                (RwMode::Read, 128 * KIB, 32, 1),
                (RwMode::Randread, 4096, 32, 16),
                (RwMode::Randread, 4096, 1, 1),
            ]
        );
        assert_eq!(nvme.steps[6].job.rw, RwMode::Randwrite);
        assert_eq!(nvme.steps[6].job.numjobs, 16);
        assert_eq!(nvme.best_of, 5);
    }

    #[test]
    fn atto_sweeps_512_bytes_to_64_mib_at_qd4() {
        let atto = atto();
        assert_eq!(atto.steps.len(), 36);
        assert_eq!(atto.steps[0].job.bs_bytes, 512);
        assert_eq!(atto.steps[0].job.rw, RwMode::Write);
        assert_eq!(atto.steps[1].job.rw, RwMode::Read);
        assert_eq!(atto.steps[35].job.bs_bytes, 64 * MIB);
        assert_eq!(atto.steps[35].label, "64M");
        for pair in atto.steps.chunks(2) {
            assert_eq!(pair[0].job.bs_bytes, pair[1].job.bs_bytes);
        }
        assert!(atto
            .steps
            .iter()
            .all(|s| s.job.iodepth == 4 && s.job.numjobs == 1));
        assert!(atto
            .steps
            .iter()
            .all(|s| s.job.size_bytes == Some(256 << 20)));
        assert!(atto.steps.iter().all(|s| !s.job.rw.is_random()));
    }

    #[test]
    fn as_ssd_steps() {
        let as_ssd = as_ssd();
        let shapes: Vec<_> = as_ssd.steps.iter().map(shape).collect();
        assert_eq!(
            shapes,
            vec![
                (RwMode::Read, 16 * MIB, 1, 1),
                (RwMode::Write, 16 * MIB, 1, 1),
                (RwMode::Randread, 4096, 1, 1),
                (RwMode::Randwrite, 4096, 1, 1),
                (RwMode::Randread, 4096, 1, 64),
                (RwMode::Randwrite, 4096, 1, 64),
                (RwMode::Randread, 4096, 1, 1),
                (RwMode::Randwrite, 512, 1, 1),
            ]
        );
        assert_eq!(
            as_ssd.steps[6].job.size_bytes, None,
            "read access time spans the device"
        );
        assert_eq!(as_ssd.steps[7].job.size_bytes, Some(GIB));
        assert!(as_ssd.steps[7].bs_round_up_to_sector);
    }

    #[test]
    fn as_ssd_score_formula() {
        let rates = AsSsdRates {
            seq_read: 500.0,
            seq_write: 400.0,
            k4_read: 30.0,
            k4_write: 80.0,
            k4_64_read: 300.0,
            k4_64_write: 250.0,
        };
        let score = rates.score();
        assert_eq!(score.read, 50 + 30 + 300);
        assert_eq!(score.write, 40 + 80 + 250);
        assert_eq!(score.total, 50 + 60 + 60 + 80 + 450 + 250);
    }

    #[test]
    fn iometer_matches_the_seeds_spec() {
        let iometer = iometer_4k();
        let mixes: Vec<_> = iometer
            .steps
            .iter()
            .map(|s| s.job.rw.read_pct(s.job.rwmixread_pct))
            .collect();
        assert_eq!(mixes, vec![50, 70, 100]);
        for step in &iometer.steps {
            assert_eq!(
                (step.job.bs_bytes, step.job.iodepth, step.job.numjobs),
                (4096, 256, 4)
            );
            assert!(step.job.rw.is_random());
        }
        let peak = iometer_64k();
        assert!(peak
            .steps
            .iter()
            .all(|s| s.job.bs_bytes == 64 * KIB && s.job.iodepth == 256));
    }

    #[test]
    fn sweep_covers_workers_by_depth() {
        let sweep = sweep(RwMode::Randread);
        assert_eq!(sweep.steps.len(), 16);
        assert!(!sweep.writes());
        assert_eq!(shape(&sweep.steps[0]), (RwMode::Randread, 4096, 1, 1));
        assert_eq!(shape(&sweep.steps[15]), (RwMode::Randread, 4096, 128, 8));
        assert!(super::sweep(RwMode::Randwrite).writes());
    }

    #[test]
    fn quick_is_quick() {
        let quick = quick();
        assert_eq!(quick.steps.len(), 4);
        assert!(quick.duration_estimate() <= Duration::from_secs(10));
    }
}
