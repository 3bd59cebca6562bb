//! `nvraid bench`: build the targets the flags describe, then hand them to
//! nvraid-bench.
//!
//! Targets: the array the members form (assembled); with `--raw`, each
//! member as a plain target (JBOD); with `--level`, a throwaway array formed
//! from `mem:`/`null:` members (or, with `--destructive`, from real ones);
//! with no member, a temporary 4-member RAID 0 on sparse files.

use crate::cmd::create::parse_level;
use anyhow::{bail, Context, Result};
use nvraid_array::{
    assemble, create, detect_signature, Array, AssembleOptions, CreateOptions, FanoutTarget,
    CHUNK_BYTES_DEFAULT,
};
use nvraid_bench::{array_subject, array_target, engine_for, prefill, BenchArgs};
use nvraid_io::queue::Target;
use nvraid_member::{Member, OpenOptions};
use std::io::IsTerminal;
use std::sync::Arc;

/// Members of the default temporary array, and their (sparse) size.
const DEFAULT_MEMBERS: usize = 4;
const DEFAULT_MEMBER_BYTES: u64 = 1 << 30;
/// How much of the temporary array is written before measuring (the quick
/// preset's region), so reads measure data rather than holes in sparse
/// files, as CrystalDiskMark writes its test file before reading it.
const PREFILL_BYTES: u64 = 1 << 30;

pub fn run(args: &BenchArgs, direct_flag: bool) -> Result<u8> {
    let plan = nvraid_bench::plan(args)?;
    if let Some(path) = &args.html {
        // Found out now, not after the run.
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        if dir.is_some_and(|dir| !dir.is_dir()) {
            bail!("--html {}: no such directory", path.display());
        }
    }
    let writes = plan.writes();
    let direct = direct_flag && args.direct != 0;
    let _tempdir;
    let (targets, arrays) = if args.members.is_empty() {
        let dir = tempfile::Builder::new()
            .prefix("nvraid-bench-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let specs: Vec<String> = (0..DEFAULT_MEMBERS)
            .map(|i| dir.path().join(format!("m{i}")).display().to_string())
            .collect();
        let options = CreateOptions {
            level: nvraid_layout::Level::Raid0,
            chunk_bytes: args.chunk.unwrap_or(CHUNK_BYTES_DEFAULT),
            name: "bench".into(),
            size_bytes: Some(DEFAULT_MEMBER_BYTES),
            force: false,
            direct,
            bitmap: nvraid_array::BitmapChoice::Auto,
        };
        let array = Arc::new(create(&specs, &options)?);
        eprintln!(
            "nvraid: benchmarking a temporary RAID 0 of {DEFAULT_MEMBERS} sparse files in {}",
            dir.path().display()
        );
        let fill = PREFILL_BYTES.min(array.size_bytes());
        eprintln!(
            "nvraid: writing {} MiB of random data to read back",
            fill >> 20
        );
        prefill(&array, fill)?;
        _tempdir = dir;
        array_targets(array, args)
    } else if args.raw {
        (raw_targets(args, writes, direct)?, Vec::new())
    } else if let Some(level) = &args.level {
        let array = Arc::new(throwaway_array(args, level, direct)?);
        array_targets(array, args)
    } else {
        if writes && !args.destructive {
            bail!("this job writes, which would destroy the data of the array on {}; add --destructive to go ahead", args.members.join(", "));
        }
        let array = Arc::new(assemble(
            &args.members,
            AssembleOptions {
                writable: writes,
                direct,
                allow_degraded: args.degraded,
            },
        )?);
        array_targets(array, args)
    };
    let progress = std::io::stderr().is_terminal();
    let mut stdout = std::io::stdout().lock();
    // Writes to an array with a bitmap pay for it as under `serve`: bits
    // set before the data, cleared by the same daemon.
    let daemons: Vec<nvraid_array::BitmapDaemon> = arrays
        .iter()
        .map(nvraid_array::BitmapDaemon::start)
        .collect();
    let subject = match arrays.first() {
        Some(array) => array_subject(array),
        None => format!(
            "{} raw member(s), side by side: {}",
            args.members.len(),
            args.members.join(", ")
        ),
    };
    let context = nvraid_bench::RunContext::here(subject);
    let outcome = nvraid_bench::run(args, targets, context, &mut stdout, progress);
    drop(daemons);
    for array in arrays {
        if let Ok(array) = Arc::try_unwrap(array) {
            array.close()?;
        }
    }
    let report = outcome?;
    if let Some(path) = &args.html {
        let json = nvraid_bench::report::to_json(&report);
        crate::cmd::report::bench_page(json, path)?;
        eprintln!("nvraid: wrote {}", path.display());
    }
    Ok(0)
}

fn array_targets(array: Arc<Array>, args: &BenchArgs) -> (Vec<Arc<dyn Target>>, Vec<Arc<Array>>) {
    (vec![array_target(array.clone(), args.engine)], vec![array])
}

fn raw_targets(args: &BenchArgs, writes: bool, direct: bool) -> Result<Vec<Arc<dyn Target>>> {
    let mut targets: Vec<Arc<dyn Target>> = Vec::new();
    for spec in &args.members {
        let member = Member::open(
            spec,
            OpenOptions {
                write: writes,
                create_bytes: None,
                direct,
                ..Default::default()
            },
        )?;
        if writes && !args.destructive && member.is_persistent() {
            if let Some(what) =
                detect_signature(&member).with_context(|| format!("{spec}: cannot read"))?
            {
                bail!("{spec}: carries {what}; a write job would destroy it (add --destructive to go ahead)");
            }
        }
        let engine = engine_for(args.engine, &[&member]);
        targets.push(Arc::new(FanoutTarget::raw(Arc::new(member), engine)));
    }
    Ok(targets)
}

fn throwaway_array(args: &BenchArgs, level: &str, direct: bool) -> Result<Array> {
    let in_memory = args
        .members
        .iter()
        .all(|m| m.starts_with("mem:") || m.starts_with("null:"));
    if !in_memory && !args.destructive {
        bail!("--level writes new superblocks on {}; add --destructive to go ahead (or use mem:/null: members)", args.members.join(", "));
    }
    let options = CreateOptions {
        level: parse_level(level)?,
        chunk_bytes: args.chunk.unwrap_or(CHUNK_BYTES_DEFAULT),
        name: "bench".into(),
        size_bytes: None,
        force: args.destructive,
        direct,
        bitmap: nvraid_array::BitmapChoice::Auto,
    };
    Ok(create(&args.members, &options)?)
}
