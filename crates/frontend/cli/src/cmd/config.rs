//! `nvraid config`: the arrays this machine starts at boot
//! (`/etc/nvraid/nvraid.conf`), and mdadm kept away from them.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use nvraid_service::config::{self, check_name, ArrayEntry, Config, Export};
use nvraid_service::{incremental, mdadm};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// The configuration file (default: $NVRAID_CONF, else
    /// /etc/nvraid/nvraid.conf).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Declare the array the members form: an ARRAY line in the
    /// configuration, and an `ARRAY <ignore>` line in mdadm.conf so that
    /// mdadm (and the initramfs, after update-initramfs -u) never assembles
    /// it. Refused for an array the kernel's md holds now.
    Add {
        /// Members of the array (one is enough; each one given is checked).
        #[arg(required = true)]
        members: Vec<String>,
        /// The array's name: /dev/nvraid/NAME, nvraid@NAME.service
        /// (default: the md name in the superblock, without its host part).
        #[arg(long)]
        name: Option<String>,
        /// How it is exported: ublk, ublk:<id>, nbd:<listen-address>, none.
        #[arg(long, default_value = "ublk", value_parser = Export::parse)]
        export: Export,
        /// Seconds to wait for a missing member before starting degraded.
        #[arg(long, value_name = "SECONDS", default_value_t = config::DEFAULT_DEGRADED_AFTER)]
        degraded_after: u32,
        /// Where this array's daemon serves Prometheus metrics (HOST:PORT;
        /// each array needs its own; without it, METRICS of the file when
        /// only one array uses that).
        #[arg(long, value_name = "HOST:PORT")]
        metrics: Option<String>,
        /// mdadm's configuration, where the `ARRAY <ignore>` line goes
        /// (nothing is written when its directory does not exist: no mdadm).
        #[arg(long, value_name = "FILE", default_value = mdadm::DEFAULT_PATH)]
        mdadm_conf: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take an array out of the configuration (and its line out of
    /// mdadm.conf's nvraid block). Its members are not touched.
    Remove {
        name: String,
        #[arg(long, value_name = "FILE", default_value = mdadm::DEFAULT_PATH)]
        mdadm_conf: PathBuf,
    },
    /// List the configured arrays (and the lines that do not parse).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check the configuration: every line parses, every array is in
    /// mdadm.conf's nvraid block (when mdadm.conf exists), and some member
    /// of each is present. Exit 1 on any problem.
    Check {
        #[arg(long, value_name = "FILE", default_value = mdadm::DEFAULT_PATH)]
        mdadm_conf: PathBuf,
    },
}

pub fn run(args: &ConfigArgs) -> Result<u8> {
    let path = config::path(args.config.as_deref());
    match &args.command {
        ConfigCommand::Add {
            members,
            name,
            export,
            degraded_after,
            metrics,
            mdadm_conf,
            json,
        } => add(
            &path,
            members,
            name.as_deref(),
            export,
            *degraded_after,
            metrics.as_deref(),
            mdadm_conf,
            *json,
        ),
        ConfigCommand::Remove { name, mdadm_conf } => remove(&path, name, mdadm_conf),
        ConfigCommand::List { json } => list(&path, *json),
        ConfigCommand::Check { mdadm_conf } => check(&path, mdadm_conf),
    }
}

/// The file's text ("" when it does not exist yet).
fn read_text(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The directory `/dev` (or `NVRAID_DEV_DIR`, for tests) the commands
/// look for members and ublk devices in.
pub fn dev_dir() -> PathBuf {
    std::env::var_os("NVRAID_DEV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev"))
}

#[allow(clippy::too_many_arguments)]
fn add(
    path: &Path,
    members: &[String],
    name: Option<&str>,
    export: &Export,
    degraded_after: u32,
    metrics: Option<&str>,
    mdadm_conf: &Path,
    json: bool,
) -> Result<u8> {
    // Everything is checked before either file is written.
    let report = nvraid_array::scan(members);
    if let Some(ignored) = report.ignored.first() {
        bail!(
            "{}: {}; config add takes members of an md array",
            ignored.path,
            ignored.reason
        );
    }
    let array = match report.arrays.as_slice() {
        [one] => one,
        [] => bail!("no md member among {}", members.join(", ")),
        many => bail!(
            "the members belong to {} different arrays ({}); give the members of one",
            many.len(),
            many.iter()
                .map(|a| format!(
                    "{} on {}",
                    a.uuid,
                    a.members
                        .iter()
                        .map(|m| m.path.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    let sysfs = mdadm::sysfs_root();
    for member in members {
        if let Some(md) = mdadm::held_by_md(&sysfs, Path::new(member)) {
            bail!(
                "{member} is held by the kernel's md as {md}: that array is the kernel's now, \
                 and nvraid does not take it (stop it first: mdadm --stop {md}, then run \
                 config add again)"
            );
        }
    }
    let name = match name {
        Some(name) => name.to_string(),
        None => {
            let md_name = array.name.rsplit(':').next().unwrap_or("").to_string();
            if check_name(&md_name).is_err() {
                bail!(
                    "the array's md name {:?} is not usable as its name here; give --name",
                    array.name
                );
            }
            md_name
        }
    };
    check_name(&name).map_err(anyhow::Error::msg)?;
    let uuid = config::parse_uuid(&array.uuid).context("the scan's UUID")?;
    let text = read_text(path)?;
    let (existing, _) = Config::parse(&text);
    if let Some(other) = existing.by_uuid(&uuid) {
        bail!(
            "{}: the array {} is listed already, as {} on line {}",
            path.display(),
            array.uuid,
            other.name,
            other.line
        );
    }
    if let Some(other) = existing.by_name(&name) {
        bail!(
            "{}: the name {name} is taken by line {} (UUID {}); give another --name",
            path.display(),
            other.line,
            other.uuid_text()
        );
    }
    let entry = ArrayEntry {
        name: name.clone(),
        uuid,
        export: export.clone(),
        degraded_after,
        metrics: metrics.map(str::to_string),
        line: 0,
    };
    let new_text = config::with_array(&text, &entry);
    // The new line must stand on its own in the file as it will be (a bad
    // line already there with the same UUID or name would refuse both).
    let (after, errors) = Config::parse(&new_text);
    let Some(added) = after.by_name(&name) else {
        let why = errors
            .iter()
            .filter(|e| e.array.as_deref() == Some(name.as_str()) || e.reason.contains(&array.uuid))
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        bail!("{}: the new line would be refused: {why}", path.display());
    };
    let line = added.line;
    // mdadm first: an array in nvraid's configuration must never be one
    // mdadm may assemble.
    let mdadm_written = keep_mdadm_away(mdadm_conf, &array.uuid)?;
    config::write_atomically(path, &new_text)
        .with_context(|| format!("cannot write {}", path.display()))?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "name": name,
                "uuid": array.uuid,
                "config": path,
                "line": line,
                "status": array.status,
                "mdadm_conf": mdadm_written,
            }))?
        );
        return Ok(0);
    }
    println!("{}: line {line}: {}", path.display(), entry.to_line());
    match &mdadm_written {
        Some(conf) => println!(
            "{conf}: ARRAY <ignore> UUID={} (mdadm will not assemble it); run \
             `update-initramfs -u` so that the initramfs's mdadm leaves it alone too",
            array.uuid
        ),
        None => println!(
            "{}: not written (no {}: mdadm is not installed); run `nvraid config add` again \
             if it ever is",
            mdadm_conf.display(),
            mdadm_conf.parent().unwrap_or(Path::new("/")).display()
        ),
    }
    println!(
        "at boot: nvraid@{name}.service serves it{}",
        match export {
            Export::Ublk(_) => format!(" as /dev/nvraid/{name}"),
            Export::Nbd(address) => format!(" over NBD on {address}"),
            Export::None => String::new(),
        }
    );
    Ok(0)
}

/// The `ARRAY <ignore>` line for `uuid` in mdadm.conf: the file written
/// (`None`: no mdadm, its directory is missing).
fn keep_mdadm_away(conf: &Path, uuid: &str) -> Result<Option<String>> {
    if conf
        .parent()
        .is_some_and(|d| !d.as_os_str().is_empty() && !d.is_dir())
    {
        return Ok(None);
    }
    let text = read_text(conf)?;
    let new_text = mdadm::add_ignore(&text, uuid);
    if new_text != text {
        config::write_atomically(conf, &new_text)
            .with_context(|| format!("cannot write {}", conf.display()))?;
    }
    Ok(Some(conf.display().to_string()))
}

fn remove(path: &Path, name: &str, mdadm_conf: &Path) -> Result<u8> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    // The UUID of every line for the name, even one refused as a duplicate.
    let uuids: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let content = line.split('#').next().unwrap_or("");
            let words: Vec<&str> = content.split_whitespace().collect();
            (words.first() == Some(&"ARRAY") && words.get(1) == Some(&name)).then(|| {
                words[2..].iter().find_map(|w| {
                    w.strip_prefix("UUID=")
                        .or_else(|| w.strip_prefix("uuid="))
                        .and_then(config::parse_uuid)
                        .map(|u| nvraid_metadata::format_uuid(&u))
                })
            })?
        })
        .collect();
    let (new_text, removed) = config::without_array(&text, name);
    if removed == 0 {
        bail!("{}: no ARRAY line for {name}", path.display());
    }
    config::write_atomically(path, &new_text)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "{}: ARRAY {name} removed ({removed} line(s))",
        path.display()
    );
    let still_listed = |uuid: &String| {
        let (after, _) = Config::parse(&new_text);
        after.arrays.iter().any(|a| &a.uuid_text() == uuid)
    };
    if mdadm_conf.exists() {
        let md_text = read_text(mdadm_conf)?;
        let mut md_new = md_text.clone();
        for uuid in uuids.iter().filter(|u| !still_listed(u)) {
            md_new = mdadm::remove_ignore(&md_new, uuid);
        }
        if md_new != md_text {
            config::write_atomically(mdadm_conf, &md_new)
                .with_context(|| format!("cannot write {}", mdadm_conf.display()))?;
            println!(
                "{}: its ARRAY <ignore> line removed: mdadm may assemble the array again \
                 (run `update-initramfs -u` for the initramfs)",
                mdadm_conf.display()
            );
        }
    }
    Ok(0)
}

fn list(path: &Path, json: bool) -> Result<u8> {
    let (config, errors) = Config::load(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .unwrap_or_default();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "config": path,
                "arrays": config.arrays,
                "alerts": config.alerts,
                "errors": errors,
            }))?
        );
        return Ok(0);
    }
    for e in &errors {
        eprintln!("nvraid: {}: {e}", path.display());
    }
    if config.arrays.is_empty() {
        println!("no arrays in {}", path.display());
    }
    for a in &config.arrays {
        let metrics = config
            .metrics_of(a)
            .map_or_else(String::new, |m| format!(" metrics={m}"));
        println!(
            "{:<16} {}  export={} degraded-after={}s{metrics}  (line {})",
            a.name,
            a.uuid_text(),
            a.export,
            a.degraded_after,
            a.line
        );
    }
    Ok(0)
}

fn check(path: &Path, mdadm_conf: &Path) -> Result<u8> {
    let Some((config, errors)) =
        Config::load(path).with_context(|| format!("cannot read {}", path.display()))?
    else {
        bail!("{}: no such file", path.display());
    };
    let mut problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
    if mdadm_conf.exists() {
        let ignored = mdadm::ignored(&read_text(mdadm_conf)?);
        for a in &config.arrays {
            if !ignored.contains(&a.uuid_text()) {
                problems.push(format!(
                    "line {}: {} ({}) has no ARRAY <ignore> line in {}: mdadm may assemble it \
                     (nvraid config remove {} and config add again)",
                    a.line,
                    a.name,
                    a.uuid_text(),
                    mdadm_conf.display(),
                    a.name
                ));
            }
        }
    }
    let dev = dev_dir();
    let devices = incremental::devices_in(&dev);
    let report = nvraid_array::scan(&devices);
    for a in &config.arrays {
        match report.arrays.iter().find(|s| s.uuid == a.uuid_text()) {
            Some(found) => println!(
                "{}: {} ({} of {} members found in {})",
                a.name,
                found.status,
                found.members.len(),
                found.raid_disks,
                dev.display()
            ),
            None => problems.push(format!(
                "line {}: no member of {} (UUID {}) in {}",
                a.line,
                a.name,
                a.uuid_text(),
                dev.display()
            )),
        }
    }
    for p in &problems {
        eprintln!("nvraid: {}: {p}", path.display());
    }
    if problems.is_empty() {
        println!("{}: ok, {} arrays", path.display(), config.arrays.len());
        Ok(0)
    } else {
        Ok(1)
    }
}
