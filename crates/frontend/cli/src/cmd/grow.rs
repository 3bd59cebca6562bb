//! `nvraid grow`: add members to a RAID 4/5/6 or RAID 10 near and reshape it, offline, in
//! md's format (docs/reshape.md), or mirrors to a RAID 1; `--level`
//! changes the level where md does it without moving data; `--continue`
//! resumes a reshape a crash or an interrupted run left part-way.

use super::{bytes_text, size_arg};
use anyhow::{bail, Result};
use clap::Args;
use nvraid_array::reshape::{
    add_q, change_level, continue_grow, grow, raid0_to_raid10, GrowOptions, GrowProgress, Grown,
};
use nvraid_member::format_size;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct GrowArgs {
    /// The member count after the grow (mdadm's --raid-devices): the
    /// array's members plus one --add for each new one.
    #[arg(
        long,
        short = 'n',
        value_name = "N",
        required_unless_present_any = ["cont", "level"]
    )]
    raid_devices: Option<u32>,
    /// A member to add (repeat for several); it must be blank (or --force)
    /// and at least as large as the others' data area.
    #[arg(long, value_name = "MEMBER")]
    add: Vec<String>,
    /// Continue a reshape recorded on the members (every member, the added
    /// ones included), from the recorded position.
    #[arg(long = "continue", conflicts_with_all = ["raid_devices", "add", "level"])]
    cont: bool,
    /// Change the level where md does it without moving data (its
    /// takeovers): 4 <-> 5 with the parity-last layout; 5 -> 6 with
    /// --raid-devices N+1 --add NEW (Q on the new last member, which is
    /// then rebuilt); 6 -> 5 when Q is on the last member (a `-6` layout
    /// or parity-last; that member leaves); 0 -> 10 near=2 with
    /// --raid-devices 2N --add NEW... (member i becomes 2i, the new
    /// mirrors rebuilt); 10 near=2 -> 0 (the second copies leave). md's
    /// other level changes are refused, naming md's path.
    #[arg(long, value_name = "LEVEL")]
    level: Option<i32>,
    /// Use new members that carry a filesystem or another array.
    #[arg(long, short = 'f')]
    force: bool,
    /// The most array bytes moved between two checkpoints of the position.
    #[arg(long, default_value = "16M", value_parser = size_arg)]
    step: u64,
    /// Print the outcome as JSON on stdout (progress stays on stderr).
    #[arg(long)]
    json: bool,
    /// The array's members, in any order.
    #[arg(required = true)]
    members: Vec<String>,
}

pub fn run(args: &GrowArgs, direct: bool) -> Result<u8> {
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
    let mut progress = progress_printer();
    let grown = if args.cont {
        continue_grow(&args.members, direct, args.step, &mut progress)?
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
            Some(6) => add_q(&args.members, &options, &mut progress)?,
            Some(10) => raid0_to_raid10(&args.members, &options, &mut progress)?,
            Some(other) => bail!(
                "--level {other} with --add: md adds members with a level change only from RAID 5 to RAID 6 (--level 6) and from RAID 0 to RAID 10 (--level 10)"
            ),
            None => grow(&args.members, &options, &mut progress)?,
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&grown)?);
    } else {
        print_text(&grown);
    }
    Ok(0)
}

fn print_text(g: &Grown) {
    println!(
        "grown from {} to {} members: {} -> {}",
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
