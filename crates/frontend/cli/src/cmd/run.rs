//! `nvraid run NAME`: the service's start (nvraid@NAME.service): find the
//! configured array's members, decide whether it may start, and become
//! `nvraid serve` for it (exec, so systemd's main process is the server
//! and its READY=1 comes from there). `--last-resort`: the degraded start
//! after the array's `degraded-after` seconds.

use anyhow::{bail, Context, Result};
use clap::Args;
use nvraid_array::ScannedArray;
use nvraid_service::config::{self, ArrayEntry, Config};
use nvraid_service::incremental::{self, RunDir, Systemctl};
use nvraid_service::launch;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The array's name in the configuration.
    name: String,
    /// The configuration file (default: $NVRAID_CONF, else
    /// /etc/nvraid/nvraid.conf).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The last-resort start (nvraid-last-resort@NAME.service): wait until
    /// `degraded-after` seconds have passed since the first member came;
    /// if the array is still incomplete but can run, allow the degraded
    /// start (the run directory's degraded-ok) and start nvraid@NAME.service.
    #[arg(long)]
    last_resort: bool,
    /// Print the `nvraid serve` command as JSON instead of running it.
    #[arg(long, conflicts_with = "last_resort")]
    dry_run: bool,
}

pub fn run(args: &RunArgs, direct: bool) -> Result<u8> {
    let path = config::path(args.config.as_deref());
    let Some((config, errors)) =
        Config::load(&path).with_context(|| format!("cannot read {}", path.display()))?
    else {
        bail!(
            "{}: no such file; declare the array with nvraid config add",
            path.display()
        );
    };
    for e in &errors {
        if e.array.as_deref() == Some(args.name.as_str()) {
            bail!(
                "{}: {e}; array {} is not started",
                path.display(),
                args.name
            );
        }
        eprintln!("nvraid: warning: {}: {e}", path.display());
    }
    let Some(entry) = config.by_name(&args.name) else {
        bail!("{}: no ARRAY line for {}", path.display(), args.name);
    };
    let run = RunDir::from_env();
    if args.last_resort {
        return last_resort(entry, &run);
    }
    let (members, array) = find_members(entry, &run);
    let Some(array) = array else {
        bail!(
            "no member of {} (UUID {}) found (recorded by udev in {}, or in {})",
            entry.name,
            entry.uuid_text(),
            run.array_dir(&entry.uuid).display(),
            super::config::dev_dir().display()
        );
    };
    match array.status {
        "complete" => {}
        "degraded" if run.degraded_allowed(&entry.uuid) => eprintln!(
            "nvraid: {}: starting degraded ({}), as the last resort allowed",
            entry.name,
            array.reason.as_deref().unwrap_or("")
        ),
        "degraded" => bail!(
            "{} is degraded ({}); it starts degraded only after its last-resort timer \
             (degraded-after={} s) allows it ({}), or by hand: nvraid run {} --last-resort",
            entry.name,
            array.reason.as_deref().unwrap_or(""),
            entry.degraded_after,
            run.degraded_ok(&entry.uuid).display(),
            entry.name
        ),
        _ => bail!(
            "{} cannot start: {}",
            entry.name,
            array.reason.as_deref().unwrap_or("not startable")
        ),
    }
    let ublk = launch::ublk_id(entry, &run, &super::config::dev_dir());
    let mut serve_args = vec!["serve".to_string()];
    if !direct {
        serve_args.insert(0, "--buffered".into());
    }
    // The array must not stay down for its metrics: an address another
    // process holds (which `nvraid serve --metrics` refuses) is said loudly
    // and left out; the array starts without its endpoint.
    let mut alerts = config.alerts.clone();
    let mut launched = entry.clone();
    if let Some(address) = config.metrics_of(entry) {
        if let Err(why) = nvraid_monitor::metrics::bind(&address) {
            eprintln!(
                "nvraid: {}: warning: {why}; the array starts without metrics",
                entry.name
            );
            alerts.metrics = None;
            launched.metrics = None;
        }
    }
    serve_args.extend(launch::serve_args(
        &launched, &alerts, &run, &ublk, &members,
    ));
    let program = std::env::current_exe().context("cannot find this program's path")?;
    eprintln!(
        "nvraid: {}: exec {} {}",
        entry.name,
        program.display(),
        serve_args.join(" ")
    );
    if args.dry_run {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "program": program,
                "args": serve_args,
                "members": members,
                "status": array.status,
            }))?
        );
        return Ok(0);
    }
    use std::os::unix::process::CommandExt;
    let error = std::process::Command::new(&program)
        .args(&serve_args)
        .exec();
    Err(error).with_context(|| format!("cannot exec {}", program.display()))
}

/// The array's members: udev's records; when those do not make the array
/// complete, a scan of the block devices in /dev as well. The member
/// paths of the array, and how the scan judged it.
fn find_members(entry: &ArrayEntry, run: &RunDir) -> (Vec<String>, Option<ScannedArray>) {
    let recorded = run.recorded(&entry.uuid);
    let mut array = incremental::judge(&entry.uuid, &recorded);
    if array.as_ref().is_none_or(|a| a.status != "complete") {
        let mut candidates = recorded;
        for device in incremental::devices_in(&super::config::dev_dir()) {
            if !candidates.contains(&device) {
                candidates.push(device);
            }
        }
        array = incremental::judge(&entry.uuid, &candidates);
    }
    let members = array
        .as_ref()
        .map(|a| a.members.iter().map(|m| m.path.clone()).collect())
        .unwrap_or_default();
    (members, array)
}

/// `--last-resort`: wait out `degraded-after` (from the first member's
/// arrival), then start the array: complete as it is, or degraded when it
/// can run, with degraded-ok written first.
fn last_resort(entry: &ArrayEntry, run: &RunDir) -> Result<u8> {
    let systemctl = Systemctl::from_env();
    let first = run.first_seen(&entry.uuid).unwrap_or_else(SystemTime::now);
    let deadline = first + Duration::from_secs(u64::from(entry.degraded_after));
    let array = loop {
        let (_, array) = find_members(entry, run);
        if array.as_ref().is_some_and(|a| a.status == "complete") {
            eprintln!("nvraid: {}: every member is here; starting it", entry.name);
            systemctl.start(&incremental::service_unit(&entry.name))?;
            return Ok(0);
        }
        let Ok(left) = deadline.duration_since(SystemTime::now()) else {
            break array;
        };
        std::thread::sleep(left.min(Duration::from_secs(1)));
    };
    match array {
        Some(a) if a.status == "degraded" => {
            run.allow_degraded(&entry.uuid).with_context(|| {
                format!("cannot write {}", run.degraded_ok(&entry.uuid).display())
            })?;
            eprintln!(
                "nvraid: {}: still {} after {} s: starting it degraded",
                entry.name,
                a.reason.as_deref().unwrap_or("degraded"),
                entry.degraded_after
            );
            systemctl.start(&incremental::service_unit(&entry.name))?;
            Ok(0)
        }
        Some(a) => bail!(
            "{} cannot start even degraded: {}; waiting for its members",
            entry.name,
            a.reason.as_deref().unwrap_or(a.status)
        ),
        None => bail!(
            "no member of {} (UUID {}) found; nothing to start",
            entry.name,
            entry.uuid_text()
        ),
    }
}

/// `nvraid assemble --incremental DEV`: what udev runs for each
/// `linux_raid_member`. An array not in the configuration: nothing at all
/// (no output, exit 0, nothing written). Otherwise the member is recorded
/// and the array's service started when every role is present, or its
/// last-resort timer armed.
pub fn incremental(device: &str, config_path: Option<&Path>) -> Result<u8> {
    let path = config::path(config_path);
    let Some((config, _)) =
        Config::load(&path).with_context(|| format!("cannot read {}", path.display()))?
    else {
        return Ok(0);
    };
    let Some(uuid) = member_uuid(device) else {
        return Ok(0);
    };
    let Some(entry) = config.by_uuid(&uuid) else {
        return Ok(0);
    };
    // Recorded as an absolute path: the service reads it from elsewhere.
    let absolute = std::path::absolute(device)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| device.to_string());
    let device = absolute.as_str();
    let run = RunDir::from_env();
    let new = run
        .record(&uuid, device)
        .with_context(|| format!("cannot record {device} in {}", run.root.display()))?;
    if !new {
        // A change event of a member seen before (udev's watch fires when a
        // writer closes it: the daemon stopping): no start from it, or a
        // stopped array would come back by itself.
        return Ok(0);
    }
    // The array runs already (started degraded without this member, or
    // the member was unplugged and is back): its daemon takes the member
    // back, by the bitmap when it can, as md's incremental assembly does.
    let control = run.control(&entry.name);
    if control.exists() {
        let add = serde_json::json!({"command": "add", "member": device, "force": false});
        match nvraid_serve::request(&control, &add) {
            Ok(reply) => {
                let how = if reply["re_added"] == true {
                    "re-added (bitmap) in"
                } else {
                    "added in"
                };
                let role = &reply["role"];
                udev_log(
                    entry,
                    device,
                    &format!("{device} is back: {how} role {role} of the running array"),
                );
                return Ok(0);
            }
            Err(nvraid_serve::Error::Control(why))
                if !why.contains(&control.display().to_string()) =>
            {
                // The daemon answered and refused (a working member
                // already, or one it cannot take back): said, nothing else.
                udev_log(
                    entry,
                    device,
                    &format!("{device}: the running array did not take it: {why}"),
                );
                return Ok(0);
            }
            // No daemon behind the socket (a stale file): as at boot.
            Err(_) => {}
        }
    }
    let recorded = run.recorded(&uuid);
    let array = incremental::judge(&uuid, &recorded);
    let systemctl = Systemctl::from_env();
    match incremental::decide(array.as_ref()) {
        incremental::Decision::Start => {
            let unit = incremental::service_unit(&entry.name);
            udev_log(
                entry,
                device,
                &format!("{device} recorded; every member is here: starting {unit}"),
            );
            systemctl.start(&unit)?;
        }
        incremental::Decision::Wait { why } => {
            let unit = incremental::timer_unit(&entry.name);
            let so_far = recorded.len();
            udev_log(
                entry,
                device,
                &format!("{device} recorded ({so_far} so far, {why}): {unit} armed"),
            );
            systemctl.start(&unit)?;
        }
    }
    Ok(0)
}

/// `nvraid assemble --incremental DEV --removed`: what udev runs when a
/// member goes away. Its record is dropped (so that its return counts as
/// new), and the array's running daemon fails it (unless its I/O did
/// already) and removes it, leaving its role for the member's return.
pub fn incremental_removed(device: &str, config_path: Option<&Path>) -> Result<u8> {
    let path = config::path(config_path);
    let config = Config::load(&path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .map(|(config, _)| config)
        .unwrap_or_default();
    let absolute = std::path::absolute(device)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| device.to_string());
    let device = absolute.as_str();
    let run = RunDir::from_env();
    for uuid in run.arrays_of(device) {
        run.forget(&uuid, device)
            .with_context(|| format!("cannot forget {device} in {}", run.root.display()))?;
        let Some(entry) = config.by_uuid(&uuid) else {
            continue;
        };
        let control = run.control(&entry.name);
        if !control.exists() {
            continue;
        }
        for (command, done) in [("fail", "failed"), ("remove", "removed")] {
            let request = serde_json::json!({"command": command, "member": device});
            match nvraid_serve::request(&control, &request) {
                Ok(_) => udev_log(entry, device, &format!("{device} went away: {done}")),
                Err(e) => udev_log(
                    entry,
                    device,
                    &format!("{device} went away; {command}: {e}"),
                ),
            }
        }
    }
    Ok(0)
}

/// What the udev-run commands say: udev keeps no output of the programs
/// its rules run, so it goes to the journal (standard error without one),
/// with the array and member as fields: `journalctl -t nvraid`.
fn udev_log(entry: &ArrayEntry, device: &str, message: &str) {
    let message = format!("{}: {message}", entry.name);
    nvraid_monitor::sink::Journal::from_env().log(
        5,
        &message,
        &[
            ("NVRAID_ARRAY", entry.name.as_str()),
            ("NVRAID_MEMBER", device),
        ],
    );
}

/// The array UUID in `device`'s md superblock, if it has one.
fn member_uuid(device: &str) -> Option<[u8; 16]> {
    let member = nvraid_member::Member::open(
        device,
        nvraid_member::OpenOptions {
            write: false,
            create_bytes: None,
            direct: false,
            ..Default::default()
        },
    )
    .ok()?;
    nvraid_array::read_superblock(&member)
        .ok()
        .map(|sb| sb.set_uuid)
}
