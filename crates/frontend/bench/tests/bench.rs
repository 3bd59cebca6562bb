//! nvraid-bench end to end on test-double targets: validation, the runner,
//! presets and the three report formats. Time bounds are loose on purpose.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use nvraid_bench::cli::{plan, run, BenchArgs};
use nvraid_bench::report::CSV_COLUMNS;
use nvraid_bench::{run_job, Error, JobSpec, RunContext, RwMode, SpecError};
use nvraid_io::queue::Target;
use nvraid_testing::MemTarget;

const MIB: u64 = 1 << 20;

/// Parses `nvraid bench` flags the way the binary will.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(flags: &[&str]) -> BenchArgs {
    let argv = std::iter::once("bench").chain(flags.iter().copied());
    Cli::try_parse_from(argv).expect("flags parse").bench
}

fn targets(list: &[&Arc<MemTarget>]) -> Vec<Arc<dyn Target>> {
    list.iter()
        .map(|t| Arc::clone(*t) as Arc<dyn Target>)
        .collect()
}

fn short_job(rw: RwMode, bs_bytes: u32, iodepth: u32, numjobs: u32) -> JobSpec {
    let mut job = JobSpec::new(rw);
    job.bs_bytes = bs_bytes;
    job.iodepth = iodepth;
    job.numjobs = numjobs;
    job.runtime = Duration::from_millis(150);
    job
}

fn spec_error(job: &JobSpec, target: MemTarget) -> SpecError {
    let target: Arc<dyn Target> = Arc::new(target);
    job.validate(&[target]).unwrap_err()
}

// ------------------------------------------------------------ validation

#[test]
fn bs_not_a_multiple_of_the_sector_is_refused() {
    let job = short_job(RwMode::Randread, 1000, 1, 1);
    let err = spec_error(&job, MemTarget::null(MIB));
    assert!(matches!(
        err,
        SpecError::BlockSizeUnaligned {
            bs_bytes: 1000,
            sector_bytes: 512,
            ..
        }
    ));
    assert!(err.to_string().starts_with("--bs 1000"), "{err}");
    let job = short_job(RwMode::Randread, 512, 1, 1);
    let err = spec_error(&job, MemTarget::null(MIB).sector_bytes(4096));
    assert!(err.to_string().contains("4096"), "{err}");
}

#[test]
fn zero_or_huge_values_are_refused() {
    let mut job = short_job(RwMode::Read, 4096, 0, 1);
    assert_eq!(
        spec_error(&job, MemTarget::null(MIB)),
        SpecError::IodepthRange { iodepth: 0 }
    );
    job.iodepth = 1;
    job.numjobs = 0;
    assert!(spec_error(&job, MemTarget::null(MIB))
        .to_string()
        .starts_with("--numjobs 0"));
    job.numjobs = 1;
    job.runtime = Duration::ZERO;
    assert_eq!(
        spec_error(&job, MemTarget::null(MIB)),
        SpecError::ZeroRuntime
    );
    job.runtime = Duration::from_secs(1);
    job.bs_bytes = 0;
    assert!(spec_error(&job, MemTarget::null(MIB))
        .to_string()
        .starts_with("--bs 0"));
    job.bs_bytes = 4096;
    job.rw = RwMode::Randrw;
    job.rwmixread_pct = 101;
    assert!(spec_error(&job, MemTarget::null(MIB))
        .to_string()
        .starts_with("--rwmixread 101"));
}

#[test]
fn region_outside_the_target_is_refused() {
    let mut job = short_job(RwMode::Read, 4096, 1, 1);
    job.size_bytes = Some(2 * MIB);
    let err = spec_error(&job, MemTarget::null(MIB).named("small"));
    assert!(matches!(err, SpecError::RegionOutside { target_bytes, .. } if target_bytes == MIB));
    assert!(
        err.to_string().contains("--size") && err.to_string().contains("small"),
        "{err}"
    );
    job.size_bytes = None;
    job.offset_bytes = MIB;
    assert!(matches!(
        spec_error(&job, MemTarget::null(MIB)),
        SpecError::RegionOutside { .. }
    ));
    job.offset_bytes = 100;
    assert!(spec_error(&job, MemTarget::null(MIB))
        .to_string()
        .starts_with("--offset 100"));
    job.offset_bytes = MIB - 512;
    assert!(matches!(
        spec_error(&job, MemTarget::null(MIB)),
        SpecError::RegionSmallerThanBlock { .. }
    ));
    job.offset_bytes = 0;
    job.size_bytes = Some(0);
    assert_eq!(spec_error(&job, MemTarget::null(MIB)), SpecError::ZeroSize);
}

#[test]
fn write_job_on_a_read_only_target_is_refused() {
    let job = short_job(RwMode::Randwrite, 4096, 1, 1);
    let err = spec_error(&job, MemTarget::null(MIB).read_only().named("ro"));
    assert_eq!(
        err.to_string(),
        "--rw randwrite: the job writes, but ro is open read-only"
    );
    let reads = short_job(RwMode::Randread, 4096, 1, 1);
    let target: Arc<dyn Target> = Arc::new(MemTarget::null(MIB).read_only());
    assert!(reads.validate(&[target]).is_ok());
    assert!(matches!(reads.validate(&[]), Err(SpecError::NoTargets)));
}

#[test]
fn job_writes_follows_the_pattern_and_mix() {
    assert!(!JobSpec::new(RwMode::Read).job_writes());
    assert!(!JobSpec::new(RwMode::Randread).job_writes());
    assert!(JobSpec::new(RwMode::Write).job_writes());
    assert!(JobSpec::new(RwMode::Randwrite).job_writes());
    let mut mixed = JobSpec::new(RwMode::Randrw);
    assert!(mixed.job_writes());
    mixed.rwmixread_pct = 100;
    assert!(!mixed.job_writes());
}

#[test]
fn flags_make_plans() {
    let single = plan(&args(&[
        "--rw",
        "randrw",
        "--bs",
        "8k",
        "--iodepth",
        "16",
        "--numjobs",
        "2",
        "--rwmixread",
        "70",
        "--runtime",
        "2s",
        "--ramp",
        "500ms",
        "--size",
        "1G",
        "--offset",
        "4k",
        "mem:2G",
    ]))
    .unwrap();
    assert_eq!(single.preset, None);
    assert_eq!(single.steps.len(), 1);
    let job = &single.steps[0].job;
    assert_eq!(
        (
            job.rw,
            job.bs_bytes,
            job.iodepth,
            job.numjobs,
            job.rwmixread_pct
        ),
        (RwMode::Randrw, 8192, 16, 2, 70)
    );
    assert_eq!(
        (job.runtime, job.ramp),
        (Duration::from_secs(2), Duration::from_millis(500))
    );
    assert_eq!((job.size_bytes, job.offset_bytes), (Some(1 << 30), 4096));
    assert!(single.writes());

    let quick = plan(&args(&[])).unwrap();
    assert_eq!(quick.preset.as_deref(), Some("quick"));
    let sweep = plan(&args(&[
        "--preset",
        "sweep",
        "--runtime",
        "1s",
        "--best-of",
        "3",
    ]))
    .unwrap();
    assert!(!sweep.writes());
    assert_eq!(sweep.best_of, 3);
    assert!(sweep
        .steps
        .iter()
        .all(|s| s.job.runtime == Duration::from_secs(1)));
    let plain = plan(&args(&["--bs", "64k"])).unwrap();
    assert_eq!(plain.steps[0].job.rw, RwMode::Read, "fio's default rw");
}

#[test]
fn bad_flags_are_refused() {
    let err = plan(&args(&["--preset", "nope"])).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--preset nope: no such preset (known: quick, cdm"),
        "{err}"
    );
    let err = plan(&args(&["--preset", "cdm", "--bs", "4k"])).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--bs: cannot be combined with --preset"),
        "{err}"
    );
    let err = plan(&args(&["--best-of", "0"])).unwrap_err();
    assert!(err.to_string().starts_with("--best-of"), "{err}");
    let argv = ["bench", "--bs", "4q"];
    assert!(Cli::try_parse_from(argv).is_err());
    assert!(Cli::try_parse_from(["bench", "--direct", "2"]).is_err());
    assert!(Cli::try_parse_from(["bench", "--json", "--csv"]).is_err());
    assert!(Cli::try_parse_from(["bench", "--runtime", "5 weeks"]).is_err());
}

#[test]
fn nothing_is_submitted_when_a_later_step_is_invalid() {
    // quick = reads then writes; the writes are invalid on a read-only target.
    let target = Arc::new(MemTarget::null(64 * MIB).read_only());
    let mut out = Vec::new();
    let result = run(
        &args(&["--runtime", "50ms"]),
        targets(&[&target]),
        RunContext::default(),
        &mut out,
        false,
    );
    assert!(matches!(
        result,
        Err(Error::Spec(SpecError::ReadOnlyTarget { .. }))
    ));
    assert_eq!(target.counters().submitted.load(Ordering::Relaxed), 0);
    assert!(out.is_empty());
}

// ------------------------------------------------------------ runner

#[test]
fn counts_add_up() {
    let target = Arc::new(MemTarget::null(64 * MIB));
    let job = short_job(RwMode::Randread, 4096, 8, 2);
    let result = run_job(&job, &targets(&[&target]), None).unwrap();
    let worker_ios: u64 = result.workers.iter().map(|w| w.read.ios).sum();
    assert!(result.read.ios > 0);
    assert_eq!(result.read.ios, worker_ios);
    assert_eq!(result.read.bytes, result.read.ios * 4096);
    assert_eq!(result.read.clat.count(), result.read.ios);
    assert_eq!(result.write.ios, 0);
    assert_eq!(result.workers.len(), 2);
    assert!(result.workers.iter().all(|w| w.read.ios > 0));
    let done = target.counters().reads.load(Ordering::Relaxed);
    assert!(
        done >= result.read.ios,
        "the target completed at least what was counted"
    );
    assert_eq!(
        done,
        target.counters().submitted.load(Ordering::Relaxed),
        "all drained"
    );
    assert_eq!(result.runtime_ns, 150_000_000);
    let iops = result.total_iops();
    assert!((iops - result.read.ios as f64 / 0.15).abs() < 1e-6 * iops.max(1.0));
}

#[test]
fn mixed_ratio_is_within_tolerance() {
    let target = Arc::new(MemTarget::null(64 * MIB));
    let mut job = short_job(RwMode::Randrw, 4096, 4, 1);
    job.rwmixread_pct = 70;
    job.runtime = Duration::from_millis(300);
    let result = run_job(&job, &targets(&[&target]), None).unwrap();
    let total = result.read.ios + result.write.ios;
    assert!(total > 2000, "enough I/Os for a ratio: {total}");
    let read_share = result.read.ios as f64 / total as f64;
    assert!((read_share - 0.70).abs() < 0.04, "read share {read_share}");
    let writes_done = target.counters().writes.load(Ordering::Relaxed);
    assert!(writes_done >= result.write.ios);
}

#[test]
fn ramp_is_excluded_and_latency_is_measured() {
    let target = Arc::new(MemTarget::null(64 * MIB).latency(Duration::from_millis(1)));
    let mut job = short_job(RwMode::Randread, 4096, 1, 1);
    job.ramp = Duration::from_millis(200);
    job.runtime = Duration::from_millis(200);
    let started = Instant::now();
    let result = run_job(&job, &targets(&[&target]), None).unwrap();
    let wall = started.elapsed();
    // At QD 1 with 1 ms per I/O, at most ~200 I/Os fit in the window.
    assert!(
        result.read.ios > 0 && result.read.ios <= 201,
        "{}",
        result.read.ios
    );
    let done = target.counters().reads.load(Ordering::Relaxed);
    assert!(
        done > result.read.ios,
        "ramp I/Os ran but were not counted: {done}"
    );
    assert!(
        result.read.clat.min_ns() >= 1_000_000,
        "clat includes the device time"
    );
    assert!(result.read.clat.percentile_ns(50.0) >= 1_000_000);
    assert!(
        wall >= Duration::from_millis(400),
        "ramp + runtime: {wall:?}"
    );
    assert!(
        wall < Duration::from_secs(10),
        "loose upper bound: {wall:?}"
    );
}

#[test]
fn io_errors_fail_the_job_with_the_first_one_named() {
    let target = Arc::new(
        MemTarget::null(64 * MIB)
            .fail_from_io(50, libc::EIO)
            .named("bad"),
    );
    let job = short_job(RwMode::Randwrite, 4096, 4, 2);
    let err = run_job(&job, &targets(&[&target]), None).unwrap_err();
    let Error::IoFailed { count, first, .. } = &err else {
        panic!("{err}")
    };
    assert!(*count >= 1);
    assert!(
        first.starts_with("write of 4096 bytes at offset "),
        "{first}"
    );
    assert!(
        first.contains("on bad") && first.contains("os error 5"),
        "{first}"
    );
    assert!(err.to_string().contains("I/O error(s)"), "{err}");

    let short = Arc::new(MemTarget::null(64 * MIB).short_from_io(10));
    let err = run_job(
        &short_job(RwMode::Read, 4096, 2, 1),
        &targets(&[&short]),
        None,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("short transfer of 2048 bytes"),
        "{err}"
    );

    let closed = Arc::new(MemTarget::null(64 * MIB).fail_open());
    let err = run_job(
        &short_job(RwMode::Read, 4096, 2, 3),
        &targets(&[&closed]),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, Error::OpenQueue { .. }), "{err}");
}

/// Every 4 KiB block of `contents` is either untouched (zeros) or carries its
/// own offset in its first 8 bytes followed by random data.
fn written_blocks(contents: &[u8]) -> usize {
    let mut written = 0;
    for (index, block) in contents.chunks(4096).enumerate() {
        if block.iter().all(|&b| b == 0) {
            continue;
        }
        let stamp = u64::from_le_bytes(block[..8].try_into().unwrap());
        assert_eq!(
            stamp,
            index as u64 * 4096,
            "block {index} holds another block's data"
        );
        assert!(block[8..].iter().any(|&b| b != 0));
        written += 1;
    }
    written
}

#[test]
fn random_writes_land_where_they_were_aimed_and_read_back() {
    let target = Arc::new(MemTarget::mem(4 * MIB));
    let job = short_job(RwMode::Randwrite, 4096, 4, 2);
    let result = run_job(&job, &targets(&[&target]), None).unwrap();
    assert!(result.write.ios > 0);
    let written = written_blocks(&target.contents());
    assert!(written > 0);
    assert!(written as u64 <= target.counters().writes.load(Ordering::Relaxed));
    let reads = run_job(
        &short_job(RwMode::Randread, 4096, 4, 1),
        &targets(&[&target]),
        None,
    )
    .unwrap();
    assert!(reads.read.ios > 0);
}

#[test]
fn sequential_writes_cover_the_region_and_stay_inside_it() {
    let target = Arc::new(MemTarget::mem(2 * MIB));
    let mut job = short_job(RwMode::Write, 4096, 2, 2);
    job.offset_bytes = 256 * 1024;
    job.size_bytes = Some(MIB);
    job.runtime = Duration::from_millis(300);
    run_job(&job, &targets(&[&target]), None).unwrap();
    let contents = target.contents();
    assert_eq!(
        written_blocks(&contents),
        256,
        "all 256 blocks of the region"
    );
    assert!(
        contents[..256 * 1024].iter().all(|&b| b == 0),
        "nothing before --offset"
    );
    assert!(
        contents[256 * 1024 + MIB as usize..]
            .iter()
            .all(|&b| b == 0),
        "nothing after --size"
    );
}

#[test]
fn several_targets_share_each_worker_round_robin() {
    let a = Arc::new(MemTarget::null(64 * MIB).named("a"));
    let b = Arc::new(MemTarget::null(32 * MIB).named("b"));
    let job = short_job(RwMode::Randread, 4096, 8, 2);
    let result = run_job(&job, &targets(&[&a, &b]), None).unwrap();
    let done_a = a.counters().submitted.load(Ordering::Relaxed);
    let done_b = b.counters().submitted.load(Ordering::Relaxed);
    assert!(done_a > 0 && done_b > 0);
    assert!(
        done_a.abs_diff(done_b) <= 2,
        "round-robin per I/O: {done_a} vs {done_b}"
    );
    assert_eq!(result.targets, vec!["a".to_string(), "b".to_string()]);
}

#[test]
fn progress_is_reported() {
    let target = Arc::new(MemTarget::null(64 * MIB));
    let mut job = short_job(RwMode::Randread, 4096, 4, 1);
    job.runtime = Duration::from_millis(350);
    let mut calls = Vec::new();
    run_job(
        &job,
        &targets(&[&target]),
        Some(&mut |p| calls.push((p.ios, p.elapsed))),
    )
    .unwrap();
    assert!(!calls.is_empty());
    assert!(calls
        .windows(2)
        .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
}

// ------------------------------------------------------------ reports

fn run_to_string(flags: &[&str], target: MemTarget) -> String {
    let target: Arc<dyn Target> = Arc::new(target);
    let mut out = Vec::new();
    run(
        &args(flags),
        vec![target],
        RunContext::default(),
        &mut out,
        false,
    )
    .unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn json_uses_fio_field_names() {
    let text = run_to_string(
        &[
            "--json",
            "--rw",
            "randrw",
            "--rwmixread",
            "60",
            "--iodepth",
            "4",
            "--numjobs",
            "2",
            "--runtime",
            "150ms",
        ],
        MemTarget::null(64 * MIB),
    );
    let root: serde_json::Value = serde_json::from_str(&text).unwrap();
    let jobs = root["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job["jobname"], "randrw 60%r 4K Q4T2");
    assert_eq!(job["job options"]["rw"], "randrw");
    assert_eq!(job["job options"]["bs"], "4K");
    assert_eq!(job["job_runtime"], 150);
    for dir in ["read", "write"] {
        let d = &job[dir];
        let ios = d["total_ios"].as_u64().unwrap();
        assert!(ios > 0, "{dir}");
        assert_eq!(d["io_bytes"].as_u64().unwrap(), ios * 4096);
        assert_eq!(d["io_kbytes"].as_u64().unwrap(), ios * 4);
        let iops = d["iops"].as_f64().unwrap();
        assert!((iops - ios as f64 / 0.15).abs() < 0.01 * iops);
        let bw_bytes = d["bw_bytes"].as_f64().unwrap();
        assert!((bw_bytes - iops * 4096.0).abs() <= 1.0 + 1e-6 * bw_bytes);
        assert!((d["bw"].as_f64().unwrap() - bw_bytes / 1024.0).abs() <= 1.0);
        assert_eq!(d["runtime"], 150);
        let clat = &d["clat_ns"];
        assert_eq!(clat["N"].as_u64().unwrap(), ios);
        for key in ["min", "max", "mean", "stddev"] {
            assert!(clat[key].is_number(), "{key}");
        }
        let pct = clat["percentile"].as_object().unwrap();
        assert_eq!(pct.len(), 17);
        let p50 = pct["50.000000"].as_u64().unwrap();
        let p9999 = pct["99.990000"].as_u64().unwrap();
        assert!(clat["min"].as_u64().unwrap() <= p50 && p50 <= p9999);
        assert!(p9999 <= clat["max"].as_u64().unwrap());
    }
    assert!(job["usr_cpu"].is_number() && job["sys_cpu"].is_number());
    let nvraid = &job["nvraid"];
    assert_eq!(nvraid["threads"].as_array().unwrap().len(), 2);
    let mb_s = nvraid["mb_s"].as_f64().unwrap();
    let mib_s = nvraid["mib_s"].as_f64().unwrap();
    assert!((mb_s / mib_s - 1.048576).abs() < 1e-9);
    assert!(root["nvraid version"].is_string());
    assert!(root["preset"].is_null());
}

#[test]
fn csv_has_a_header_and_a_row_per_direction() {
    let text = run_to_string(
        &["--csv", "--runtime", "50ms", "--ramp", "0s"],
        MemTarget::null(64 * MIB),
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], CSV_COLUMNS.join(","));
    assert_eq!(lines.len(), 5, "quick: 4 one-direction jobs");
    for line in &lines[1..] {
        assert_eq!(line.split(',').count(), CSV_COLUMNS.len(), "{line}");
    }
    assert!(lines[1].starts_with("SEQ1M Q8T1,SEQ1M Q8T1 read,read,1048576,8,1,50,read,"));
    assert!(lines[4].contains(",randwrite,4096,32,1,50,write,"));
}

#[test]
fn quick_preset_prints_a_crystal_disk_mark_table() {
    let text = run_to_string(
        &["--runtime", "50ms", "--ramp", "0s"],
        MemTarget::null(64 * MIB),
    );
    let read_at = text.find("[Read]").unwrap();
    let write_at = text.find("[Write]").unwrap();
    assert!(read_at < write_at);
    assert_eq!(text.matches("SEQ1M Q8T1").count(), 2, "{text}");
    assert_eq!(text.matches("RND4K Q32T1").count(), 2, "{text}");
    assert!(text.contains("MB/s") && text.contains("IOPS") && text.contains(" us>"));
    assert!(text.contains("Preset: quick"));
}

#[test]
fn as_ssd_preset_reports_a_score_and_fits_the_sector_size() {
    let flags = ["--preset", "as-ssd", "--runtime", "40ms", "--json"];
    let text = run_to_string(&flags, MemTarget::null(64 * MIB).sector_bytes(4096));
    let root: serde_json::Value = serde_json::from_str(&text).unwrap();
    let jobs = root["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 8);
    assert_eq!(
        jobs[7]["job options"]["bs"], "4K",
        "512-byte access writes raised to the sector"
    );
    assert!(jobs[5]["nvraid"]["threads"].as_array().unwrap().len() == 64);
    let score = &root["as_ssd_score"];
    let total = score["total"].as_u64().unwrap();
    assert!(total > 0 && total >= score["read"].as_u64().unwrap());
    let table = run_to_string(
        &["--preset", "as-ssd", "--runtime", "20ms"],
        MemTarget::null(64 * MIB),
    );
    for row in ["Seq", "4K-64Thrd", "Acc.time", "Score", "Total"] {
        assert!(table.contains(row), "{row} in {table}");
    }
}

#[test]
fn atto_skips_transfers_below_the_sector_size() {
    let flags = [
        "--preset",
        "atto",
        "--runtime",
        "20ms",
        "--size",
        "128M",
        "--csv",
    ];
    let target = MemTarget::null(256 * MIB).sector_bytes(4096);
    let text = run_to_string(&flags, target);
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 30, "512 B, 1 KiB, 2 KiB skipped; 15 sizes x 2");
    assert!(rows[0].starts_with("4K,"));
    assert!(rows[29].starts_with("64M,"));
    let table = run_to_string(
        &["--preset", "atto", "--runtime", "10ms", "--size", "128M"],
        MemTarget::null(256 * MIB).sector_bytes(4096),
    );
    assert!(
        table.contains("skipped 512: block size 512 is below the sector size 4096"),
        "{table}"
    );
}

#[test]
fn best_of_keeps_the_best_run() {
    let target = Arc::new(MemTarget::null(64 * MIB));
    let mut out = Vec::new();
    let flags = args(&[
        "--rw",
        "read",
        "--runtime",
        "30ms",
        "--best-of",
        "3",
        "--json",
    ]);
    let context = RunContext::here("a null target");
    let report = run(&flags, targets(&[&target]), context, &mut out, false).unwrap();
    assert_eq!(report.steps[0].runs, 3);
    let root: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(root["jobs"][0]["nvraid"]["runs"], 3);
    // Where the numbers came from travels with them (nvraid report shows it).
    assert_eq!(root["schema"], "nvraid-bench/1");
    assert_eq!(root["subject"], "a null target");
    assert_eq!(root["layout"], "jobs");
    assert!(root["command"].as_str().unwrap().starts_with("bench-"));
    assert!(root["machine"]["nproc"].as_u64().unwrap() >= 1);
    assert!(!root["machine"]["kernel"].as_str().unwrap().is_empty());
}
