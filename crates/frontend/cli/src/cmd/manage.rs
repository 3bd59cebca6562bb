//! `nvraid add`, `rebuild`, `check` and `repair`: put a new member into a
//! degraded RAID 1/10/4/5/6 and rebuild it; compare the copies (or parity)
//! and put them right.
//! In the foreground, with progress on stderr.

use super::bytes_text;
use anyhow::{bail, Context, Result};
use clap::Args;
use nvraid_array::recovery::{self, Added, Mode, Progress, Rebuilt, Scrubbed};
use nvraid_array::{assemble, detect_signature};
use nvraid_member::{format_size, Member};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct AddArgs {
    #[command(flatten)]
    new: NewMember,
    /// A running `nvraid serve`'s control socket: add NEW there (it is
    /// rebuilt in the background while the server serves; `status` shows
    /// the progress).
    #[arg(long, value_name = "PATH", conflicts_with = "members")]
    socket: Option<std::path::PathBuf>,
    /// Without --socket: the array's members, in any order.
    #[arg(required_unless_present = "socket")]
    members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct AddJournalArgs {
    /// The new journal: a fast device or file of its own (its whole space
    /// past the array's metadata area becomes the log, at least 4 MiB).
    #[arg(long, value_name = "MEMBER")]
    journal: String,
    /// Use a journal member that carries a filesystem or another array.
    #[arg(long, short = 'f')]
    force: bool,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
    /// The array's members (every working member, and any spares).
    #[arg(required = true)]
    members: Vec<String>,
}

/// `add-journal`: md's write journal for an existing RAID 4/5/6, written
/// offline (no server may hold the members).
pub fn add_journal(args: &AddJournalArgs, direct: bool) -> Result<u8> {
    let added = nvraid_array::add_journal(
        &args.members,
        &args.journal,
        nvraid_array::AddJournalOptions {
            direct,
            force: args.force,
        },
    )?;
    print_journal_added(&added);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&added)?);
    }
    Ok(0)
}

/// What adding md's journal did, on stderr.
pub fn print_journal_added(added: &nvraid_array::JournalAdded) {
    eprintln!(
        "nvraid: {} is now the array's write journal (md's format, device slot {}, {} of log); \
         name it with the members from now on",
        added.journal,
        added.dev_number,
        format_size(added.log_bytes)
    );
    if added.bitmap_removed {
        eprintln!(
            "nvraid: the array's write-intent bitmap was removed: md keeps a journal or a \
             bitmap, not both (the journal closes the write hole the bitmap's resync covered)"
        );
    }
}

#[derive(Args, Debug)]
pub struct RemoveArgs {
    /// The member to take out: a faulty member, or an unused hot spare.
    #[arg(long, value_name = "MEMBER")]
    member: String,
    /// The running `nvraid serve`'s control socket.
    #[arg(long, value_name = "PATH")]
    socket: std::path::PathBuf,
}

/// `remove --socket`: take a faulty member (or an unused spare) out of a
/// running server's array; its device slot is freed (md's `--remove`).
pub fn remove(args: &RemoveArgs) -> Result<u8> {
    let reply = nvraid_serve::request(
        &args.socket,
        &serde_json::json!({"command": "remove", "member": args.member}),
    )?;
    eprintln!("nvraid: {} removed ({reply})", args.member);
    Ok(0)
}

/// A new member and how to rebuild it (`add`, `replace`).
#[derive(Args, Debug)]
pub struct NewMember {
    /// The new member: it takes the first role with no working member (with
    /// `replace`, OLD's) and is rebuilt from the other copies; with `add`
    /// and no role missing it becomes a spare.
    #[arg(long = "new", value_name = "NEW")]
    spec: String,
    /// Use NEW even if it carries a filesystem or an md superblock.
    #[arg(long, short = 'f')]
    force: bool,
    /// Print the outcome as JSON (progress still goes to stderr).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    speed: SpeedArgs,
}

#[derive(Args, Debug)]
pub struct SpeedArgs {
    /// Rebuild speed limits in MB/s, md-style `MIN:MAX` (or `MAX`). The
    /// rebuild never goes faster than MAX; MIN is the floor it keeps when
    /// client I/O competes (an online rebuild; the offline one has no
    /// competition). Default: unlimited.
    #[arg(long, value_name = "MIN:MAX", value_parser = parse_speed)]
    rebuild_speed: Option<(u64, u64)>,
}

/// `MIN:MAX` or `MAX`, in MB/s (10^6 bytes), MAX > 0 and MIN <= MAX.
pub fn parse_speed(text: &str) -> Result<(u64, u64), String> {
    let (min, max) = match text.split_once(':') {
        Some((min, max)) => (min, max),
        None => ("0", text),
    };
    let number = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| format!("{s:?} is not a whole number of MB/s"))
    };
    let (min, max) = (number(min)?, number(max)?);
    if max == 0 || min > max {
        return Err(format!("{text}: need 0 <= MIN <= MAX and MAX > 0 (MB/s)"));
    }
    Ok((min, max))
}

#[derive(Args, Debug)]
pub struct RebuildArgs {
    /// Print the outcome as JSON (progress still goes to stderr).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    speed: SpeedArgs,
    /// The array's members, in any order (a member whose rebuild was cut
    /// short resumes from its checkpoint).
    #[arg(required = true)]
    members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// Print the outcome as JSON (progress still goes to stderr).
    #[arg(long)]
    json: bool,
    /// A running `nvraid serve`'s control socket: run it there, beside the
    /// clients (each region held against their writes while compared).
    #[arg(long, value_name = "PATH", conflicts_with = "members")]
    socket: Option<std::path::PathBuf>,
    /// Without --socket: the array's members, in any order.
    #[arg(required_unless_present = "socket")]
    members: Vec<String>,
}

/// Run `check` or `repair` in a server and wait for its result.
fn scrub_online(socket: &std::path::Path, command: &str, json: bool) -> Result<u8> {
    nvraid_serve::request(socket, &serde_json::json!({"command": command}))?;
    let started = Instant::now();
    loop {
        let status = nvraid_serve::request(socket, &serde_json::json!({"command": "status"}))?;
        let scrub = &status["array"]["recovery"]["scrub"];
        if scrub["finished"] == true {
            if let Some(error) = scrub["error"].as_str() {
                bail!("{command} in the server failed: {error}");
            }
            let found = &scrub["result"];
            if json {
                println!("{}", serde_json::to_string_pretty(found)?);
            } else {
                println!(
                    "nvraid: {command} in the server: {} bytes in {:.1} s, {} mismatched sectors in {} regions, {} rewritten",
                    found["bytes"], found["seconds"].as_f64().unwrap_or(0.0),
                    found["mismatch_sectors"],
                    found["regions"].as_array().map_or(0, Vec::len),
                    found["repaired_sectors"]
                );
            }
            let mismatched = found["mismatch_sectors"].as_u64().unwrap_or(0) > 0;
            return Ok(if command == "check" && mismatched {
                EXIT_MISMATCH
            } else {
                0
            });
        }
        if std::io::stderr().is_terminal() {
            let (done, total) = (
                scrub["done_bytes"].as_u64().unwrap_or(0),
                scrub["total_bytes"].as_u64().unwrap_or(0),
            );
            eprint!(
                "\r{command}: {done} of {total} bytes, {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[derive(Args, Debug)]
pub struct ReplaceArgs {
    /// The member to take out.
    #[arg(long, value_name = "OLD")]
    old: String,
    #[command(flatten)]
    new: NewMember,
    /// A running `nvraid serve`'s control socket: replace there (NEW is
    /// rebuilt in the background).
    #[arg(long, value_name = "PATH", conflicts_with = "members")]
    socket: Option<std::path::PathBuf>,
    /// Without --socket: the array's members (OLD among them), in any order.
    #[arg(required_unless_present = "socket")]
    members: Vec<String>,
}

/// `replace`: fail OLD, then put NEW into its role and rebuild it. Unlike
/// md's replace (which copies to the new member while the old one still
/// serves), the array runs without OLD's copy until the rebuild ends.
pub fn replace(args: &ReplaceArgs, direct: bool) -> Result<u8> {
    let spec = &args.new.spec;
    if let Some(socket) = &args.socket {
        let reply = nvraid_serve::request(
            socket,
            &serde_json::json!({"command": "replace", "old": args.old, "new": spec, "force": args.new.force}),
        )?;
        eprintln!(
            "nvraid: {spec} replaces {} in role {}; rebuilding in the server (see `nvraid status`)",
            args.old, reply["role"]
        );
        return Ok(0);
    }
    if args.members.contains(spec) {
        bail!("{spec}: given both as --new and as a member");
    }
    let array = assemble(&args.members, super::writable(direct))?;
    let role = role_of(&array, &args.old)?;
    let new = open_new(spec, args.new.force, direct)?;
    // Everything that could refuse NEW is checked before OLD is failed.
    let needed = array.superblock().data_offset_sectors * 512
        + array.geometry().member_used_bytes_of(role as u32);
    if new.size_bytes() < needed {
        bail!(
            "{spec}: {} bytes is too small: a member of this array needs {needed} bytes",
            new.size_bytes()
        );
    }
    if array
        .slots()
        .iter()
        .flatten()
        .any(|s| new.identity().is_some() && s.member.identity() == new.identity())
    {
        bail!("{spec}: already a member of this array");
    }
    array.fail_member(role, &administrator())?;
    let (array, added) = recovery::add_member(array, new)?;
    let Added::Recovering { role: taken } = added else {
        bail!("{spec}: no role was free for it after failing {}", args.old);
    };
    eprintln!(
        "nvraid: {spec} replaces {} in role {taken}; rebuilding",
        args.old
    );
    let rebuilt = recovery::rebuild(
        &array,
        max_rate(&args.new.speed),
        &mut progress_printer("rebuild"),
    )?;
    array.close()?;
    report(&rebuilt, args.new.json, "rebuilt")
}

/// `spec`, opened for writing, when it carries a superblock of this very
/// array (a member that failed or was removed, come back).
fn former_member(array: &nvraid_array::Array, spec: &str, direct: bool) -> Result<Option<Member>> {
    let member = nvraid_array::recovery::online::open_for_writing(spec, direct)?;
    Ok(nvraid_array::read_superblock(&member)
        .ok()
        .filter(|sb| sb.set_uuid == array.superblock().set_uuid)
        .map(|_| member))
}

/// Open a new member for writing, refusing one that carries a signature
/// unless `force`.
fn open_new(spec: &str, force: bool, direct: bool) -> Result<Member> {
    let new = nvraid_array::recovery::online::open_for_writing(spec, direct)?;
    if !force && new.is_persistent() {
        if let Some(what) = detect_signature(&new).with_context(|| spec.to_string())? {
            bail!("{spec}: already carries {what} (use --force to overwrite it)");
        }
    }
    Ok(new)
}

#[derive(Args, Debug)]
pub struct FailArgs {
    /// The member to mark faulty.
    #[arg(long, value_name = "MEMBER")]
    member: String,
    /// A running `nvraid serve`'s control socket: fail the member there.
    #[arg(long, value_name = "PATH", conflicts_with = "members")]
    socket: Option<std::path::PathBuf>,
    /// Without --socket: the array's members, in any order.
    #[arg(required_unless_present = "socket")]
    members: Vec<String>,
}

/// Mark a member faulty: it is no longer read or written, and the other
/// members record it so (events + 1). Refused for the last copy of any data
/// and on RAID 0.
pub fn fail(args: &FailArgs, direct: bool) -> Result<u8> {
    if let Some(socket) = &args.socket {
        let reply = nvraid_serve::request(
            socket,
            &serde_json::json!({"command": "fail", "member": args.member}),
        )?;
        eprintln!(
            "nvraid: {} marked faulty (role {}, events {})",
            args.member, reply["role"], reply["events"]
        );
        return Ok(0);
    }
    let array = assemble(&args.members, super::writable(direct))?;
    let role = role_of(&array, &args.member)?;
    array.fail_member(role, &administrator())?;
    eprintln!(
        "nvraid: {} marked faulty (role {role}, events {})",
        args.member,
        array.events()
    );
    array.close()?;
    Ok(0)
}

/// The error a member is failed with on request.
pub fn administrator() -> std::io::Error {
    nvraid_array::recovery::online::administrator()
}

/// The role of the present member named `spec` (same path, or the same
/// file or device).
pub fn role_of(array: &nvraid_array::Array, spec: &str) -> Result<usize> {
    nvraid_array::recovery::online::role_of(array, spec).map_err(anyhow::Error::msg)
}

pub fn add(args: &AddArgs, direct: bool) -> Result<u8> {
    let spec = &args.new.spec;
    if let Some(socket) = &args.socket {
        return add_through_server(socket, args);
    }
    if args.members.contains(spec) {
        bail!("{spec}: given both as --new and as a member");
    }
    let array = assemble(&args.members, super::writable(direct))?;
    if !args.new.force {
        if let Some(old) = former_member(&array, spec, direct)? {
            // md's re-add: back into its role, recovering only what the
            // bitmap says it missed.
            let (array, role) = recovery::re_add(array, old)
                .map_err(|e| anyhow::anyhow!("{e} (add it with --force for a full rebuild)"))?;
            eprintln!("nvraid: {spec} re-added in role {role}; recovering what it missed");
            let rebuilt = recovery::rebuild(
                &array,
                max_rate(&args.new.speed),
                &mut progress_printer("re-add"),
            )?;
            array.close()?;
            return report(&rebuilt, args.new.json, "re-added");
        }
    }
    let new = open_new(spec, args.new.force, direct)?;
    let (array, added) = recovery::add_member(array, new)?;
    let rebuilt = match added {
        Added::Spare => {
            eprintln!("nvraid: {spec} added as a spare (no role is missing)");
            Vec::new()
        }
        Added::Recovering { role } => {
            eprintln!("nvraid: {spec} takes role {role}; rebuilding");
            recovery::rebuild(
                &array,
                max_rate(&args.new.speed),
                &mut progress_printer("rebuild"),
            )?
        }
    };
    array.close()?;
    report(
        &rebuilt,
        args.new.json,
        match added {
            Added::Spare => "spare",
            Added::Recovering { .. } => "rebuilt",
        },
    )
}

/// `add --socket`: the running server adds the member (and rebuilds
/// it beside its clients).
fn add_through_server(socket: &std::path::Path, args: &AddArgs) -> Result<u8> {
    let spec = &args.new.spec;
    let reply = nvraid_serve::request(
        socket,
        &serde_json::json!({"command": "add", "member": spec, "force": args.new.force}),
    )?;
    if reply["spare"] == true {
        eprintln!("nvraid: {spec} added to the server's array as a spare");
    } else {
        eprintln!(
            "nvraid: {spec} {} role {}; rebuilding in the server (see `nvraid status`)",
            if reply["re_added"] == true {
                "re-added in"
            } else {
                "takes"
            },
            reply["role"]
        );
    }
    if args.new.json {
        println!("{reply}");
    }
    Ok(0)
}

pub fn rebuild(args: &RebuildArgs, direct: bool) -> Result<u8> {
    let array = assemble(&args.members, super::writable(direct))?;
    // A spare given with a degraded array takes a missing role.
    let (array, promoted) = recovery::promote_spares(array, direct)?;
    for (spec, role) in &promoted {
        eprintln!("nvraid: spare {spec} takes role {role}; rebuilding");
    }
    let rebuilt = recovery::rebuild(
        &array,
        max_rate(&args.speed),
        &mut progress_printer("rebuild"),
    )?;
    array.close()?;
    if rebuilt.is_empty() {
        eprintln!("nvraid: no member is being recovered and no spare can take a missing role; nothing to do");
    }
    report(&rebuilt, args.json, "rebuilt")
}

/// Exit code of `check` when some copies differ.
pub const EXIT_MISMATCH: u8 = 5;

pub fn check(args: &ScrubArgs, direct: bool) -> Result<u8> {
    if let Some(socket) = &args.socket {
        return scrub_online(socket, "check", args.json);
    }
    let array = assemble(&args.members, super::read_only(direct))?;
    let found = recovery::scrub(&array, Mode::Check, &mut progress_printer("check"))?;
    print_scrub(&found, args.json, "checked")?;
    Ok(if found.mismatch_sectors > 0 {
        EXIT_MISMATCH
    } else {
        0
    })
}

pub fn repair(args: &ScrubArgs, direct: bool) -> Result<u8> {
    if let Some(socket) = &args.socket {
        return scrub_online(socket, "repair", args.json);
    }
    let array = assemble(&args.members, super::writable(direct))?;
    let found = recovery::scrub(&array, Mode::Repair, &mut progress_printer("repair"))?;
    array.close()?;
    print_scrub(&found, args.json, "repaired")?;
    Ok(0)
}

fn print_scrub(found: &Scrubbed, json: bool, what: &str) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(found)?);
        return Ok(());
    }
    println!(
        "nvraid: {what} {} in {:.1} s: {} mismatched sectors in {} regions{}{}",
        bytes_text(found.bytes),
        found.seconds,
        found.mismatch_sectors,
        found.regions.len(),
        if found.repaired_sectors > 0 {
            format!(
                ", {} sectors rewritten ({})",
                found.repaired_sectors,
                if found.parity {
                    "parity recomputed from the data"
                } else {
                    "from the first copy"
                }
            )
        } else {
            String::new()
        },
        if found.resynced {
            "; the array was dirty and is now resynced and clean"
        } else {
            ""
        }
    );
    for (start, end) in found.regions.iter().take(20) {
        println!("  mismatch in array bytes {start}..{end}");
    }
    if found.regions.len() > 20 {
        println!(
            "  ... {} more regions (--json lists all)",
            found.regions.len() - 20
        );
    }
    Ok(())
}

/// The cap in bytes per second.
fn max_rate(speed: &SpeedArgs) -> Option<u64> {
    speed.rebuild_speed.map(|(_, max)| max * 1_000_000)
}

fn report(rebuilt: &[Rebuilt], json: bool, outcome: &str) -> Result<u8> {
    if json {
        let items: Vec<serde_json::Value> = rebuilt
            .iter()
            .map(|r| {
                serde_json::json!({
                    "role": r.role,
                    "from_bytes": r.from_bytes,
                    "bytes": r.bytes,
                    "seconds": r.seconds,
                    "rate_bytes_per_second": rate(r.bytes, r.seconds),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "outcome": outcome,
                "rebuilt": items,
            }))?
        );
    } else {
        for r in rebuilt {
            println!(
                "nvraid: role {} rebuilt: {} in {:.1} s ({}/s)",
                r.role,
                bytes_text(r.bytes),
                r.seconds,
                format_size(rate(r.bytes, r.seconds))
            );
        }
    }
    Ok(0)
}

fn rate(bytes: u64, seconds: f64) -> u64 {
    if seconds > 0.0 {
        (bytes as f64 / seconds) as u64
    } else {
        0
    }
}

/// A progress line on stderr, at most once a second (redrawn in place on a
/// terminal), with the rate and the time left.
fn progress_printer(what: &'static str) -> impl FnMut(Progress) {
    let tty = std::io::stderr().is_terminal();
    let mut last = Instant::now();
    move |p: Progress| {
        let finished = p.done_bytes >= p.total_bytes;
        if !finished && last.elapsed() < Duration::from_secs(1) {
            return;
        }
        last = Instant::now();
        let seconds = p.elapsed.as_secs_f64().max(1e-3);
        let rate = p.done_bytes as f64 / seconds;
        let left = (p.total_bytes - p.done_bytes) as f64 / rate.max(1.0);
        let subject = if what == "rebuild" {
            format!("rebuild role {}", p.role)
        } else {
            what.to_string()
        };
        let line = format!(
            "{subject}: {:5.1}%  {} of {}  {}/s  ETA {}:{:02}",
            100.0 * p.done_bytes as f64 / p.total_bytes.max(1) as f64,
            format_size(p.done_bytes),
            format_size(p.total_bytes),
            format_size(rate as u64),
            (left as u64) / 60,
            (left as u64) % 60
        );
        let mut err = std::io::stderr().lock();
        if tty {
            let _ = write!(err, "\r{line}");
            if finished {
                let _ = writeln!(err);
            }
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
}
