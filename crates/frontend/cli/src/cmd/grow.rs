//! `nvraid grow`: add members to a RAID 4/5/6 or RAID 10 near and reshape it, offline, in
//! md's format (docs/reshape.md), or mirrors to a RAID 1; `--level`
//! changes the level where md does it without moving data; `-n` with fewer
//! members and `--array-size` shrinks a RAID 4/5/6 or RAID 10 near (a backwards reshape);
//! `--chunk` and `--layout` restripe it in place; `--continue`
//! resumes a reshape a crash or an interrupted run left part-way.

use super::{bytes_text, size_arg};
use anyhow::{bail, Result};
use clap::Args;
use nvraid_array::reshape::{
    add_q, change_level, change_shape, continue_grow, continue_grow_with_backup_file, grow,
    grow_with_backup_file, raid0_to_raid10, raid1_to_raid5_grown, resize, shrink, shrink_to_two,
    GrowOptions, GrowProgress, Grown, ShapeOptions, ShrinkOptions, Shrunk, SizeOptions, SizeTarget,
};
use nvraid_member::format_size;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct GrowArgs {
    /// The member count after the grow (mdadm's --raid-devices): the
    /// array's members plus one --add for each new one; fewer than the
    /// array has shrinks a RAID 4/5/6 or RAID 10 near (with --array-size).
    #[arg(
        long,
        short = 'n',
        value_name = "N",
        required_unless_present_any = ["cont", "level", "chunk", "layout", "size", "consistency_policy", "bitmap"]
    )]
    raid_devices: Option<u32>,
    /// A member to add (repeat for several); it must be blank (or --force)
    /// and at least as large as the others' data area.
    #[arg(long, value_name = "MEMBER")]
    add: Vec<String>,
    /// Continue a reshape recorded on the members (every member, the added
    /// ones included), from the recorded position.
    #[arg(long = "continue", conflicts_with_all = ["raid_devices", "add", "level", "chunk", "layout"])]
    cont: bool,
    /// Change the level where md does it without moving data (its
    /// takeovers): 1 of two members <-> 5 of two (left-symmetric, chunk
    /// 64K or the largest below that divides the array; with
    /// --raid-devices N --add NEW... the RAID 5 is then grown to N);
    /// 4 <-> 5 with the parity-last layout; 4 without its parity member
    /// -> 0; 5 -> 6 with
    /// --raid-devices N+1 --add NEW (Q on the new last member, which is
    /// then rebuilt); 6 -> 5 when Q is on the last member (a `-6` layout
    /// or parity-last; that member leaves); 0 -> 10 near=2 with
    /// --raid-devices 2N --add NEW... (member i becomes 2i, the new
    /// mirrors rebuilt); 10 near=2 -> 0 (the second copies leave). md's
    /// other level changes are refused, naming md's path. With --socket,
    /// the served array, without -n/--add (see --socket), but for 5 -> 6
    /// with -n N+1 --add NEW (Q rebuilt while served) and 0 -> 10 with
    /// --add NEW... (the second copies rebuilt while served; without
    /// --add the RAID 10 is served degraded), 1 of two -> 5 with -n N
    /// --add NEW... (the takeover, then the served RAID 5's grow) and 5 of
    /// more than two -> 1 with --array-size (the served shrink to two,
    /// then the takeover, made by the server when the shrink ends).
    #[arg(long, value_name = "LEVEL")]
    level: Option<i32>,
    /// Restripe the array in chunks of this size (RAID 4/5/6, RAID 10
    /// near; RAID 0 as md does it, through a RAID 4 with its parity
    /// missing; a power of two from 4K), keeping its members and size: the
    /// data offset moves down or up, where there is room (md's new_offset;
    /// a RAID 0's only down).
    #[arg(long, short = 'c', value_parser = size_arg, conflicts_with_all = ["raid_devices", "add", "level"])]
    chunk: Option<u64>,
    /// Restripe the array to this layout (md's names: RAID 5/6
    /// left-symmetric, left-asymmetric, right-symmetric, right-asymmetric,
    /// parity-first, parity-last, RAID 6 also the -6 forms; mdadm's
    /// `normalise` takes a RAID 6 out of a -6 layout, e.g. after --level 6,
    /// and `preserve` keeps the layout), keeping its members and size.
    #[arg(long, short = 'p', value_name = "LAYOUT", conflicts_with_all = ["raid_devices", "add", "level"])]
    layout: Option<String>,
    /// How much of each member the array uses (mdadm's --size): `max`
    /// after every member grew (the new region is resynced, as md does),
    /// or SIZE; a smaller size cuts the array's end off and is refused
    /// without --force (shrink the filesystem first). Nothing moves.
    #[arg(long, short = 'z', value_name = "max|SIZE", conflicts_with_all = ["raid_devices", "add", "level", "chunk", "layout", "cont"])]
    size: Option<String>,
    /// Shrinking by members (-n fewer than the array has, RAID 4/5/6; or
    /// --level 1 of a RAID 5 of more than two, shrunk to two first): the
    /// size the array's data fits in, at most what the smaller shape holds
    /// (mdadm's --array-size). Required: without it the command names that
    /// size and the filesystem check to make. The reshape runs backwards,
    /// the data offset moved up; the members that leave become spares.
    #[arg(long = "array-size", short = 'Z', value_name = "SIZE", value_parser = size_arg, conflicts_with_all = ["add", "cont", "chunk", "layout", "size"])]
    array_size: Option<u64>,
    /// Use new members that carry a filesystem or another array; grow a
    /// degraded RAID 4/5/6 whose parity covers the missing members (md
    /// allows it, mdadm asks for --force), reading around them; with
    /// --size, shrink the array; with --array-size, shrink though a
    /// filesystem at the array's start says it is larger.
    #[arg(long, short = 'f')]
    force: bool,
    /// The most array bytes moved between two checkpoints of the position.
    #[arg(long, default_value = "16M", value_parser = size_arg)]
    step: u64,
    /// Change how the array stays consistent after a crash (mdadm's
    /// --grow --consistency-policy), offline: `bitmap` (md's internal
    /// write-intent bitmap, every bit clear), `resync` (none), `ppl` (md's
    /// partial parity log, RAID 4/5). A clean, whole array without md's
    /// write journal; md reshapes no array with a partial parity log, so
    /// switch it to resync first and back after.
    #[arg(long = "consistency-policy", value_name = "bitmap|resync|ppl", conflicts_with_all = ["raid_devices", "add", "cont", "level", "chunk", "layout", "size", "array_size", "socket", "bitmap"])]
    consistency_policy: Option<String>,
    /// mdadm's --grow --bitmap: `internal` adds md's write-intent bitmap,
    /// `none` removes it (the same as --consistency-policy bitmap|resync).
    #[arg(long, value_name = "internal|none", conflicts_with_all = ["raid_devices", "add", "cont", "level", "chunk", "layout", "size", "array_size", "socket"])]
    bitmap: Option<String>,
    /// With a bitmap added: bytes of the array per bit (a power of two
    /// from 4K; default mdadm's for the array's size).
    #[arg(long = "bitmap-chunk", value_name = "SIZE", value_parser = size_arg)]
    bitmap_chunk: Option<u64>,
    /// Print the outcome as JSON on stdout (progress stays on stderr).
    #[arg(long)]
    json: bool,
    /// A running `nvraid serve`'s control socket: grow the served RAID
    /// 4/5/6 or RAID 10 near there (a RAID 0 too, as md grows one: through
    /// a RAID 4 with its parity missing), or add mirrors to a served RAID 1,
    /// while its clients
    /// read and write (with -n and --add;
    /// waits for the end, showing the progress). Once it ends the server
    /// serves the new shape and size (NBD connections made after it, and
    /// NVMe/TCP hosts, see the new size), and another reshape may follow
    /// in the same run. With -n fewer than the array has and
    /// --array-size (no --add): shrink the served RAID 4/5/6 or RAID 10
    /// near (its size capped first, the rows moved backwards, the leaving
    /// members spares at the end). With --chunk and/or --layout: restripe the served RAID 4/5/6
    /// or RAID 10 near (members kept, the data offset moved down; refused,
    /// naming the offline command, when there is no room below the data).
    /// With --level (and no -n/--add): the served array taken over as
    /// that level where md moves no byte (4 <-> 5 parity-last, 1 of two
    /// <-> 5 of two, 6 -> 5 with Q on the last member, 4 without its
    /// parity -> 0, 10 near=2 of 2N -> 0 of N keeping the first working
    /// copy of each pair, 0 of N -> 10 near=2 of 2N with the second copies
    /// missing, filled by --add), its requests drained for the superblock
    /// writes. With --level 5 -n N --add NEW... of a served RAID 1 of two:
    /// the takeover as a RAID 5 of two, then its grow to N, every check of
    /// both made first. With --level 1 --array-size SIZE of a served RAID 5
    /// of more than two: the shrink to two, then the takeover as RAID 1
    /// (waits for both).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["members", "cont"])]
    socket: Option<std::path::PathBuf>,
    /// mdadm's --backup-file: a RAID 4/5/6 grown in place (no room to move
    /// the data offset) keeps its critical section in this new file too,
    /// in mdadm's format (or only there, when the new members have no
    /// room for nvraid's backup area), which `mdadm --assemble
    /// --backup-file` also restores; removed when the grow ends. With
    /// --continue: the section of a grow in place stopped inside it is
    /// restored from the file (mdadm's or nvraid's; refused by name when
    /// it is another array's, damaged, or older than the position).
    /// Ignored where no backup is needed (a grow that moves the data
    /// offset, a reshape past its section), as mdadm ignores it.
    #[arg(long = "backup-file", value_name = "FILE", conflicts_with = "socket")]
    backup_file: Option<std::path::PathBuf>,
    /// Without --socket: the array's members, in any order.
    #[arg(required_unless_present = "socket")]
    members: Vec<String>,
}

pub fn run(args: &GrowArgs, direct: bool) -> Result<u8> {
    if let Some(socket) = &args.socket {
        return grow_online(args, socket);
    }
    // mdadm accepts --backup-file with any reshape and uses it only where
    // it needs one; nvraid keeps one for a grow by members in place.
    let file_used = args.cont
        || (args.level.is_none()
            && !args.add.is_empty()
            && args.chunk.is_none()
            && args.layout.is_none());
    if let (Some(file), false) = (&args.backup_file, file_used) {
        eprintln!(
            "nvraid: --backup-file {}: not used by this change (nvraid keeps what it needs on the members); not made",
            file.display()
        );
    }
    if args.consistency_policy.is_some() || args.bitmap.is_some() {
        return super::grow_policy::run(
            &args.members,
            args.consistency_policy.as_deref(),
            args.bitmap.as_deref(),
            args.bitmap_chunk,
            args.json,
            direct,
        );
    }
    if args.level == Some(1) && args.add.is_empty() && args.array_size.is_some() {
        return raid5_to_raid1(args, direct);
    }
    if let Some(level) = args.level.filter(|_| args.add.is_empty()) {
        let changed = change_level(&args.members, level, direct)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&changed)?);
        } else {
            println!(
                "level changed from {} (md level {}) to {} (md level {}); {} unchanged, no byte moved; events {}",
                changed.level_before,
                changed.md_level_before,
                changed.level,
                changed.md_level,
                bytes_text(changed.size_bytes),
                changed.events
            );
        }
        if !changed.released.is_empty() {
            println!(
                "{} left the array (no longer a member; blank it before using it elsewhere)",
                changed.released.join(", ")
            );
        }
        return Ok(0);
    }
    if let Some(size) = &args.size {
        let target = if size == "max" {
            SizeTarget::Max
        } else {
            SizeTarget::MemberBytes(
                size_arg(size).map_err(|e| anyhow::anyhow!("--size {size}: {e}"))?,
            )
        };
        let options = SizeOptions {
            target,
            force: args.force,
            direct,
        };
        let r = resize(&args.members, &options)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            println!(
                "resized from {} to {} ({} to {} of each member); events {}",
                bytes_text(r.size_bytes_before),
                bytes_text(r.size_bytes),
                bytes_text(r.member_bytes_before),
                bytes_text(r.member_bytes),
                r.events
            );
            if let Some(from) = r.resync_from_bytes {
                println!(
                    "the new region is to be resynced from {} (`nvraid repair`, or `serve` in the background)",
                    bytes_text(from)
                );
            }
        }
        return Ok(0);
    }
    let mut progress = progress_printer();
    let grown = if args.chunk.is_some() || args.layout.is_some() {
        let options = ShapeOptions {
            chunk_bytes: args.chunk,
            layout: args.layout.clone(),
            direct,
            step_bytes: args.step,
        };
        change_shape(&args.members, &options, &mut progress)?
    } else if args.cont {
        match &args.backup_file {
            Some(file) => continue_grow_with_backup_file(
                &args.members,
                direct,
                args.step,
                file,
                &mut progress,
            )?,
            None => continue_grow(&args.members, direct, args.step, &mut progress)?,
        }
    } else {
        let Some(raid_devices) = args.raid_devices else {
            bail!("--raid-devices N is needed (or --continue)");
        };
        let options = GrowOptions {
            raid_devices,
            add: args.add.clone(),
            direct,
            force: args.force,
            step_bytes: args.step,
        };
        match args.level {
            Some(5) => raid1_to_raid5_grown(&args.members, &options, &mut progress)?,
            Some(6) => add_q(&args.members, &options, &mut progress)?,
            Some(10) => raid0_to_raid10(&args.members, &options, &mut progress)?,
            Some(other) => bail!(
                "--level {other} with --add: md adds members with a level change only from a RAID 1 of two to RAID 5 (--level 5, then grown), from RAID 5 to RAID 6 (--level 6) and from RAID 0 to RAID 10 (--level 10)"
            ),
            None if args.add.is_empty() => {
                let shrunk = shrink(&args.members, &shrink_options(args, direct), &mut progress)?;
                print_shrunk(&shrunk, args.json)?;
                return Ok(0);
            }
            None => match &args.backup_file {
                Some(file) => grow_with_backup_file(&args.members, &options, file, &mut progress)?,
                None => grow(&args.members, &options, &mut progress)?,
            },
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&grown)?);
    } else {
        print_text(&grown);
    }
    Ok(0)
}

fn shrink_options(args: &GrowArgs, direct: bool) -> ShrinkOptions {
    ShrinkOptions {
        raid_devices: args.raid_devices.unwrap_or(2),
        array_size: args.array_size,
        force: args.force,
        direct,
        step_bytes: args.step,
    }
}

fn print_shrunk(s: &Shrunk, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    let g = &s.grown;
    println!(
        "shrunk from {} to {} members: {} -> {}",
        g.raid_disks_before,
        g.raid_disks,
        bytes_text(g.size_bytes_before),
        bytes_text(g.size_bytes)
    );
    println!(
        "moved {} in {:.1} s; data offset now {}; events {}",
        bytes_text(g.moved_bytes),
        g.seconds,
        bytes_text(g.data_offset_bytes),
        g.events
    );
    if !s.spares.is_empty() {
        println!(
            "{} left the array and {} (`nvraid remove`, or blank before using elsewhere)",
            s.spares.join(", "),
            if s.spares.len() == 1 {
                "is a spare"
            } else {
                "are spares"
            }
        );
    }
    Ok(())
}

/// `grow --level 1 --array-size SIZE` of a RAID 5 of more than two
/// members: shrunk to two (a backwards reshape), then taken over as a RAID
/// 1 (no byte moves). A RAID 5 of two goes straight to the takeover.
fn raid5_to_raid1(args: &GrowArgs, direct: bool) -> Result<u8> {
    let mut progress = progress_printer();
    let shrunk = shrink_to_two(&args.members, &shrink_options(args, direct), &mut progress)?;
    let remaining: Vec<String> = match &shrunk {
        Some(s) => {
            if !args.json {
                print_shrunk(s, false)?;
            }
            args.members
                .iter()
                .filter(|m| !s.spares.contains(m))
                .cloned()
                .collect()
        }
        None => args.members.clone(),
    };
    let changed = change_level(&remaining, 1, direct)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "shrunk": shrunk,
                "level_changed": changed,
            }))?
        );
    } else {
        println!(
            "level changed from {} (md level {}) to {} (md level {}); {} unchanged, no byte moved; events {}",
            changed.level_before,
            changed.md_level_before,
            changed.level,
            changed.md_level,
            bytes_text(changed.size_bytes),
            changed.events
        );
    }
    Ok(0)
}

fn print_text(g: &Grown) {
    if g.raid_disks_before == g.raid_disks {
        println!(
            "restriped in place over {} members: {} unchanged",
            g.raid_disks,
            bytes_text(g.size_bytes)
        );
    } else {
        println!(
            "{} from {} to {} members: {} -> {}",
            if g.raid_disks < g.raid_disks_before {
                "shrunk"
            } else {
                "grown"
            },
            g.raid_disks_before,
            g.raid_disks,
            bytes_text(g.size_bytes_before),
            bytes_text(g.size_bytes)
        );
    }
    println!(
        "moved {} in {:.1} s; data offset now {}; events {}",
        bytes_text(g.moved_bytes),
        g.seconds,
        bytes_text(g.data_offset_bytes),
        g.events
    );
    if !g.failed.is_empty() {
        println!(
            "degraded: {} failed during the reshape and {} recorded faulty on the other members; add a member to rebuild (`nvraid add`)",
            g.failed.join(", "),
            if g.failed.len() == 1 { "is" } else { "are" }
        );
    }
}

/// The reshape's position on stderr, at most once a second (redrawn in
/// place on a terminal), with the rate and the time left.
fn progress_printer() -> impl FnMut(GrowProgress) {
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last: Option<Instant> = None;
    let mut first: Option<u64> = None;
    move |p: GrowProgress| {
        let from = *first.get_or_insert(p.position_bytes);
        let finished = p.position_bytes >= p.end_bytes;
        if !finished && last.is_some_and(|l| l.elapsed() < Duration::from_secs(1)) {
            return;
        }
        last = Some(Instant::now());
        let seconds = started.elapsed().as_secs_f64().max(1e-3);
        let rate = (p.position_bytes - from) as f64 / seconds;
        let left = (p.end_bytes - p.position_bytes) as f64 / rate.max(1.0);
        let eta = if p.position_bytes > from {
            format!("{}:{:02}", (left as u64) / 60, (left as u64) % 60)
        } else {
            "-".into()
        };
        let line = format!(
            "reshape: {:5.1}%  {} of {}  {}/s  ETA {eta}",
            100.0 * p.position_bytes as f64 / p.end_bytes.max(1) as f64,
            format_size(p.position_bytes),
            format_size(p.end_bytes),
            format_size(rate as u64),
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

/// `grow --socket`: ask the server to grow its array, then follow its
/// `status` until the grow has finished or failed.
fn grow_online(args: &GrowArgs, socket: &std::path::Path) -> Result<u8> {
    if let Some(size) = &args.size {
        return size_online(args, socket, size);
    }
    // RAID 5 -> 6 with its Q member added is a rebuild the server runs;
    // the other level changes are answered at once.
    let add_q = args.level == Some(6) && !args.add.is_empty();
    // RAID 1 of two -> RAID 5 grown, RAID 5 -> two members -> RAID 1: a
    // takeover and a reshape, the server making both.
    let raid5_grown = args.level == Some(5) && !args.add.is_empty();
    let raid1_shrunk = args.level == Some(1) && args.add.is_empty() && args.array_size.is_some();
    if let Some(level) = args
        .level
        .filter(|_| !add_q && !raid5_grown && !raid1_shrunk)
    {
        return level_online(args, socket, level);
    }
    let restripe = args.chunk.is_some() || args.layout.is_some();
    let request = if restripe {
        serde_json::json!({
            "command": "grow",
            "chunk_bytes": args.chunk,
            "layout": args.layout,
            "step_bytes": args.step,
        })
    } else if raid1_shrunk {
        // Two members unless -n says otherwise (the server refuses another
        // count, as the offline command does).
        serde_json::json!({
            "command": "grow",
            "level": 1,
            "raid_devices": args.raid_devices,
            "array_size": args.array_size,
            "force": args.force,
            "step_bytes": args.step,
        })
    } else {
        let Some(raid_devices) = args.raid_devices else {
            bail!("--raid-devices N is needed (or --chunk/--layout)");
        };
        if args.add.is_empty() {
            // Fewer members: a served shrink (the server checks the count,
            // and names the size when --array-size is missing).
            serde_json::json!({
                "command": "grow",
                "raid_devices": raid_devices,
                "array_size": args.array_size,
                "force": args.force,
                "step_bytes": args.step,
            })
        } else {
            serde_json::json!({
                "command": "grow",
                "level": args.level,
                "raid_devices": raid_devices,
                "add": args.add,
                "force": args.force,
                "step_bytes": args.step,
            })
        }
    };
    let answer = nvraid_serve::request(socket, &request)?;
    if let Some(error) = answer["error"].as_str() {
        if raid5_grown || raid1_shrunk {
            bail!("level change in the server refused: {error}");
        }
        bail!("grow in the server refused: {error}");
    }
    if !answer["level_changed"].is_null() && !args.json {
        print_level_changed(args, &answer["level_changed"])?;
    }
    if let Some(error) = answer["grow_error"].as_str() {
        bail!(
            "taken over as a RAID 5 of two, but its grow could not start: {error}; the server serves the RAID 5 of two (grow it with `nvraid grow --socket CTL -n N --add NEW...`)"
        );
    }
    if !answer["level"].is_null() && answer["started"].is_null() {
        // `--level 1 --array-size` of a RAID 5 of two (or of another
        // level): the takeover alone, answered at once.
        print_level_changed(args, &answer)?;
        return Ok(0);
    }
    let mut progress = progress_printer();
    // What the last status showed: (kind, bytes done, of how many).
    let mut last: Option<(String, u64, u64)> = None;
    loop {
        let status = match nvraid_serve::request(socket, &serde_json::json!({"command": "status"}))
        {
            Ok(status) => status,
            // The server stopped (or was killed) under the reshape: say
            // where it stood and how it goes on, not only the socket error.
            Err(e) => bail!("{}", stopped_answering(last.as_ref(), &e.to_string())),
        };
        let reshape = &status["array"]["reshape"];
        let (mut position, end) = (
            reshape["position_bytes"].as_u64().unwrap_or(0),
            reshape["end_bytes"].as_u64().unwrap_or(0),
        );
        // A shrink's position falls from the end to 0: shown as bytes done.
        let shrinking = reshape["kind"] == "shrink";
        if shrinking {
            position = end - position.min(end);
        }
        if let Some(kind) = reshape["kind"].as_str() {
            last = Some((kind.to_string(), position, end));
        }
        match reshape["state"].as_str() {
            // The end is printed once, below.
            Some("running") if position < end => progress(GrowProgress {
                position_bytes: position,
                end_bytes: end,
            }),
            Some("running") => {}
            // The shrink ended; the server's takeover as RAID 1 follows.
            Some("finished") if reshape["then_level"]["state"] == "pending" => {}
            Some("finished") if reshape["then_level"]["state"] == "failed" => bail!(
                "shrunk online to {} members, but the takeover as RAID 1 failed: {}",
                reshape["raid_disks"],
                reshape["then_level"]["error"]
                    .as_str()
                    .unwrap_or("(no reason given)")
            ),
            Some("finished") if raid1_shrunk && reshape["kind"] == "level" => {
                if args.json {
                    println!("{}", serde_json::to_string_pretty(reshape)?);
                } else {
                    println!(
                        "shrunk online to two members and taken over as a RAID 1 (md level {}): {} served from now on; the members that left are spares",
                        reshape["md_level"],
                        bytes_text(reshape["new_size_bytes"].as_u64().unwrap_or(0)),
                    );
                }
                return Ok(0);
            }
            Some("finished") => {
                progress(GrowProgress {
                    position_bytes: end,
                    end_bytes: end,
                });
                if args.json {
                    println!("{}", serde_json::to_string_pretty(reshape)?);
                } else if add_q {
                    println!(
                        "level changed online from raid5 to raid6, {} to {} members (Q on {}, rebuilt): {} unchanged",
                        reshape["raid_disks_before"],
                        reshape["raid_disks"],
                        args.add[0],
                        bytes_text(reshape["new_size_bytes"].as_u64().unwrap_or(0)),
                    );
                } else if shrinking {
                    let failed: Vec<&str> = reshape["left_faulty"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|m| m.as_str())
                        .collect();
                    println!(
                        "shrunk online from {} to {} members: {} served from now on; the members that left are spares{}",
                        reshape["raid_disks_before"],
                        reshape["raid_disks"],
                        bytes_text(reshape["new_size_bytes"].as_u64().unwrap_or(0)),
                        if failed.is_empty() {
                            String::new()
                        } else {
                            format!(
                                ", but {} failed during the shrink and {} recorded faulty",
                                failed.join(", "),
                                if failed.len() == 1 { "is" } else { "are" }
                            )
                        }
                    );
                } else if restripe {
                    println!(
                        "restriped online over {} members: {} unchanged (in the new chunk and layout from here on)",
                        reshape["raid_disks"],
                        bytes_text(reshape["new_size_bytes"].as_u64().unwrap_or(0)),
                    );
                } else {
                    println!(
                        "grown online from {} to {} members: {} served from now on (clients connecting from now on see the new size)",
                        reshape["raid_disks_before"],
                        reshape["raid_disks"],
                        bytes_text(reshape["new_size_bytes"].as_u64().unwrap_or(0)),
                    );
                }
                return Ok(0);
            }
            Some("failed") => bail!(
                "the {} in the server stopped at {} bytes: {}",
                if shrinking { "shrink" } else { "grow" },
                reshape["position_bytes"].as_u64().unwrap_or(0),
                reshape["error"].as_str().unwrap_or("(no reason given)")
            ),
            _ => bail!("the server shows no grow in its status"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What `grow --socket` says when the server stops answering while it
/// follows a reshape: `last` what the last status showed (kind, bytes done,
/// of how many), `error` the socket's error.
fn stopped_answering(last: Option<&(String, u64, u64)>, error: &str) -> String {
    let stood = match last {
        Some((kind, done, end)) => format!(
            "during its {kind}, last seen at {} of {}",
            bytes_text(*done),
            bytes_text(*end)
        ),
        None => "before it showed the reshape".to_string(),
    };
    format!(
        "the server stopped answering {stood} ({error}); the members record how far it got: serving the array again goes on from there (`nvraid serve`), and `nvraid grow --continue MEMBER...` finishes a grow, shrink or restripe offline"
    )
}

/// `grow --socket --size max|SIZE`: ask the server to change how much of
/// each member its array uses, then follow the new region's resync in its
/// `status` until it has finished (a shrink ends at the answer).
fn size_online(args: &GrowArgs, socket: &std::path::Path, size: &str) -> Result<u8> {
    if args.raid_devices.is_some()
        || !args.add.is_empty()
        || args.level.is_some()
        || args.chunk.is_some()
        || args.layout.is_some()
    {
        bail!("--size with -n/--add/--level/--chunk/--layout on a served array: a served array changes one thing at a time; change the size alone (`grow --socket CTL --size max`), then the rest");
    }
    let size = if size == "max" {
        serde_json::json!("max")
    } else {
        serde_json::json!(size_arg(size).map_err(|e| anyhow::anyhow!("--size {size}: {e}"))?)
    };
    let answer = nvraid_serve::request(
        socket,
        &serde_json::json!({"command": "grow", "size": size, "force": args.force}),
    )?;
    if let Some(error) = answer["error"].as_str() {
        bail!("size change in the server refused: {error}");
    }
    let (before, after) = (
        answer["size_bytes_before"].as_u64().unwrap_or(0),
        answer["size_bytes"].as_u64().unwrap_or(0),
    );
    if answer["resync_from_bytes"].is_null() {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
        } else {
            println!(
                "resized online from {} to {} ({} to {} of each member): requests past the new end fail from now on; events {}",
                bytes_text(before),
                bytes_text(after),
                bytes_text(answer["member_bytes_before"].as_u64().unwrap_or(0)),
                bytes_text(answer["member_bytes"].as_u64().unwrap_or(0)),
                answer["events"],
            );
        }
        return Ok(0);
    }
    if !args.json {
        println!(
            "resized online from {} to {} ({} to {} of each member): clients connecting from now on see the new size; resyncing the new region",
            bytes_text(before),
            bytes_text(after),
            bytes_text(answer["member_bytes_before"].as_u64().unwrap_or(0)),
            bytes_text(answer["member_bytes"].as_u64().unwrap_or(0)),
        );
    }
    // The new region's resync is the server's resync (`status`'s
    // `array.resync`), counted from the old end.
    let from = answer["resync_from_bytes"].as_u64().unwrap_or(0);
    let mut progress = progress_printer();
    let mut last = (0, 0);
    loop {
        let status = match nvraid_serve::request(socket, &serde_json::json!({"command": "status"})) {
            Ok(status) => status,
            Err(e) => bail!(
                "the server stopped answering during the new region's resync, last seen at {} of {} ({e}); the members record the new size, and the resync goes on from its checkpoint when the array is served again",
                bytes_text(last.0),
                bytes_text(last.1)
            ),
        };
        let resync = &status["array"]["resync"];
        if resync.is_null() {
            bail!("the server shows no resync of the new region in its status");
        }
        let (done, total) = (
            resync["done_bytes"].as_u64().unwrap_or(0),
            resync["total_bytes"].as_u64().unwrap_or(0),
        );
        last = (done, total);
        if let Some(error) = resync["error"].as_str() {
            bail!(
                "the new region's resync stopped at {} bytes: {error}",
                from + done
            );
        }
        progress(GrowProgress {
            position_bytes: from + done,
            end_bytes: from + total,
        });
        if resync["finished"].as_bool() == Some(true) {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&answer)?);
            } else {
                println!("the new region is resynced: the array is in sync");
            }
            return Ok(0);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `grow --socket --level N`: ask the server to take its array over as
/// md level N (no byte moves); the answer says what changed.
fn level_online(args: &GrowArgs, socket: &std::path::Path, level: i32) -> Result<u8> {
    if level == 10 {
        return raid10_online(args, socket);
    }
    if args.raid_devices.is_some() || !args.add.is_empty() {
        bail!(
            "--level {level} with -n/--add on a served array: nvraid changes a served array's level with members added only from RAID 5 to RAID 6 (`--level 6 -n N+1 --add NEW`), RAID 0 to RAID 10 (`--level 10 --add NEW...`) and RAID 1 of two to RAID 5 grown (`--level 5 -n N --add NEW...`), otherwise only where md adds no member (4 <-> 5 parity-last, 1 of two <-> 5 of two, 6 -> 5, 4 without its parity -> 0, 10 near=2 -> 0); stop serve and use `nvraid grow --level {level} -n N --add NEW...`"
        );
    }
    if args.chunk.is_some() || args.layout.is_some() || args.array_size.is_some() {
        bail!(
            "--level {level} with --chunk, --layout or --array-size on a served array: a served array changes one thing at a time; change the level (`grow --socket CTL --level {level}`), then restripe (`grow --socket CTL --chunk SIZE --layout NAME`) or shrink (`grow --socket CTL -n N --array-size SIZE`)"
        );
    }
    let answer = nvraid_serve::request(
        socket,
        &serde_json::json!({"command": "grow", "level": level}),
    )?;
    if let Some(error) = answer["error"].as_str() {
        bail!("level change in the server refused: {error}");
    }
    print_level_changed(args, &answer)?;
    Ok(0)
}

/// What the server answered to a level change: as JSON, or in words.
fn print_level_changed(args: &GrowArgs, answer: &serde_json::Value) -> Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        println!(
            "level changed online from {} (md level {}) to {} (md level {}), {} to {} members; {} unchanged, no byte moved; events {}",
            answer["level_before"].as_str().unwrap_or("?"),
            answer["md_level_before"],
            answer["level"].as_str().unwrap_or("?"),
            answer["md_level"],
            answer["raid_disks_before"],
            answer["raid_disks"],
            bytes_text(answer["size_bytes"].as_u64().unwrap_or(0)),
            answer["events"],
        );
        if let Some(released) = answer["released"].as_array().filter(|r| !r.is_empty()) {
            let names: Vec<&str> = released.iter().filter_map(|v| v.as_str()).collect();
            println!(
                "{} left the array (the server no longer uses it; blank it before using it elsewhere)",
                names.join(", ")
            );
        }
    }
    Ok(())
}

/// `grow --socket CTL --level 10 [-n 2N] [--add NEW...]`: the served RAID
/// 0 of N taken over as md's RAID 10 near=2 of 2N (the second copies
/// missing), each NEW put into a missing role and rebuilt by the server
/// while clients go on; waits for those rebuilds, showing the progress.
/// Without --add the degraded RAID 10 is served (`nvraid add --socket`
/// fills it later).
fn raid10_online(args: &GrowArgs, socket: &std::path::Path) -> Result<u8> {
    if args.chunk.is_some() || args.layout.is_some() || args.array_size.is_some() {
        bail!(
            "--level 10 with --chunk, --layout or --array-size on a served array: a served array changes one thing at a time; change the level (`grow --socket CTL --level 10 --add NEW...`), then restripe"
        );
    }
    let answer = nvraid_serve::request(
        socket,
        &serde_json::json!({
            "command": "grow",
            "level": 10,
            "raid_devices": args.raid_devices,
            "add": args.add,
            "force": args.force,
        }),
    )?;
    if let Some(error) = answer["error"].as_str() {
        bail!("level change in the server refused: {error}");
    }
    if !args.json {
        print_level_changed(args, &answer)?;
    }
    let added: Vec<String> = answer["added"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["member"].as_str().map(str::to_string))
        .collect();
    if let Some(error) = answer["add_error"].as_str() {
        bail!(
            "taken over as a RAID 10 (degraded), but a member could not join: {error}; add the missing second copies with `nvraid add --socket CTL NEW`"
        );
    }
    if added.is_empty() {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
        } else {
            println!(
                "the RAID 10 is served degraded (its second copies missing): add them with `nvraid add --socket CTL NEW`"
            );
        }
        return Ok(0);
    }
    // Follow the rebuilds of the added members until each is active.
    let mut progress = progress_printer();
    loop {
        let status = nvraid_serve::request(socket, &serde_json::json!({"command": "status"}))?;
        let members = status["array"]["members"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let state_of = |spec: &str| {
            members
                .iter()
                .find(|m| m["path"].as_str() == Some(spec))
                .map(|m| m["state"].as_str().unwrap_or("?").to_string())
                .unwrap_or_else(|| "gone".into())
        };
        if let Some(bad) = added
            .iter()
            .find(|a| !matches!(state_of(a).as_str(), "active" | "rebuilding"))
        {
            bail!(
                "{bad} stopped rebuilding ({}): the RAID 10 serves without it; `nvraid status --socket` shows why",
                state_of(bad)
            );
        }
        if added.iter().all(|a| state_of(a) == "active") {
            break;
        }
        let rebuild = &status["array"]["recovery"]["rebuild"];
        if let (Some(done), Some(total)) = (
            rebuild["done_bytes"].as_u64(),
            rebuild["total_bytes"].as_u64(),
        ) {
            if done < total {
                progress(GrowProgress {
                    position_bytes: done,
                    end_bytes: total,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        println!(
            "{} rebuilt as the second copies: the RAID 10 near=2 of {} members is whole",
            added.join(", "),
            answer["raid_disks"]
        );
    }
    Ok(0)
}
