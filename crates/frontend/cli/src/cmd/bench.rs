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
use nvraid_bench::cli::Engine;
use nvraid_bench::BenchArgs;
use nvraid_io::engine::EngineKind;
use nvraid_io::queue::Target;
use nvraid_member::{Member, MemberKind, OpenOptions};
use std::io::IsTerminal;
use std::sync::Arc;

/// Members of the default temporary array, and their (sparse) size.
const DEFAULT_MEMBERS: usize = 4;
const DEFAULT_MEMBER_BYTES: u64 = 1 << 30;
/// How much of the temporary array is written before measuring (the quick
/// preset's region), so reads measure data rather than holes in sparse
/// files, as CrystalDiskMark writes its test file before reading it.
const PREFILL_BYTES: u64 = 1 << 30;

/// Writes random bytes over the first `len` bytes of `array` and flushes,
/// so that reads measure data rather than holes (bench's temporary array,
/// tune's throwaway arrays).
pub fn prefill(array: &Array, len: u64) -> Result<()> {
    const BLOCK_BYTES: usize = 4 << 20;
    let mut block = nvraid_io::AlignedBuf::zeroed(BLOCK_BYTES);
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut block))
        .context("/dev/urandom")?;
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(BLOCK_BYTES as u64) as usize;
        array.write_at(&block[..n], at, false)?;
        at += n as u64;
    }
    array.flush()?;
    Ok(())
}

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

/// One line on what an array is: "raid0, 4 members, chunk 512 KiB: a, b, c, d".
pub fn array_subject(array: &Array) -> String {
    let geometry = array.geometry();
    let members: Vec<String> = array
        .slots()
        .iter()
        .flatten()
        .map(|slot| slot.member.spec().to_string())
        .collect();
    subject_line(
        &geometry.level().to_string(),
        &members,
        geometry.chunk_bytes(),
    )
}

/// The one-line description of an array every report carries:
/// "raid0, 4 members, chunk 512 KiB: a, b, c, d" (no chunk: none given).
pub fn subject_line(level: &str, members: &[String], chunk_bytes: Option<u64>) -> String {
    let chunk = chunk_bytes
        .map(|bytes| format!(", chunk {} KiB", bytes >> 10))
        .unwrap_or_default();
    format!(
        "{level}, {} members{chunk}: {}",
        members.len(),
        members.join(", ")
    )
}

/// The engine for `auto`: psync when every member completes I/O inline in
/// the submitting thread (RAM-backed: mem:, tmpfs files, zram), where
/// io_uring only adds work; io_uring otherwise. Arrays of null: members only
/// never reach an engine (the queue completes their operations itself), so
/// they get the batching queue. The measurements behind the rule:
/// docs/performance-history.md#engine-choice---engine-auto.
pub fn engine_for(choice: Engine, members: &[&Member]) -> EngineKind {
    let all_null = members.iter().all(|m| m.kind() == MemberKind::Null);
    match choice {
        Engine::Uring => EngineKind::Uring,
        Engine::Psync => EngineKind::Psync,
        Engine::Auto if all_null => EngineKind::Uring,
        Engine::Auto if members.iter().all(|m| completes_inline(m)) => EngineKind::Psync,
        Engine::Auto => EngineKind::Uring,
    }
}

fn completes_inline(member: &Member) -> bool {
    match member.kind() {
        // Remote members never reach the inner engine (their worker
        // channels do their I/O), so they do not ask for io_uring.
        MemberKind::Mem | MemberKind::Null | MemberKind::Nbd => true,
        MemberKind::File => member
            .path()
            .is_some_and(|p| nvraid_io::sys::is_on_tmpfs(&p)),
        MemberKind::BlockDevice => member.path().is_some_and(|p| is_zram(&p)),
    }
}

fn is_zram(path: &std::path::Path) -> bool {
    std::fs::canonicalize(path)
        .ok()
        .and_then(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().starts_with("zram"))
        })
        .unwrap_or(false)
}

fn array_targets(array: Arc<Array>, args: &BenchArgs) -> (Vec<Arc<dyn Target>>, Vec<Arc<Array>>) {
    let members: Vec<&Member> = array.slots().iter().flatten().map(|s| &s.member).collect();
    let engine = engine_for(args.engine, &members);
    let target: Arc<dyn Target> = Arc::new(FanoutTarget::array(array.clone(), engine));
    (vec![target], vec![array])
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
