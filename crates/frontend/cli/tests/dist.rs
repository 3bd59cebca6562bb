//! What `dist/` installs: the systemd units pass `systemd-analyze verify`
//! (with no warning), pointed at the binary this build made; the udev
//! rules run commands that exist and that nvraid accepts; the example
//! configuration parses.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn dist() -> PathBuf {
    common::repo().join("dist")
}

/// The units copied to `dir` with /usr/bin/nvraid replaced by this build's
/// binary (verify checks that ExecStart's program exists and runs).
fn units_in(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dist().join("systemd")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        if name.ends_with(".service") {
            assert!(
                text.contains("ExecStart=/usr/bin/nvraid "),
                "{name} runs no nvraid"
            );
        }
        let text = text.replace("/usr/bin/nvraid", env!("CARGO_BIN_EXE_nvraid"));
        std::fs::write(dir.join(&name), text).unwrap();
        names.push(name);
    }
    names.sort();
    names
}

#[test]
fn the_units_pass_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    let names = units_in(dir.path());
    assert_eq!(
        names,
        [
            "nvraid-last-resort@.service",
            "nvraid-last-resort@.timer",
            "nvraid@.service"
        ]
    );
    // Templates are verified as an instance.
    let instances: Vec<String> = names
        .iter()
        .map(|n| {
            dir.path()
                .join(n.replace("@.", "@data."))
                .display()
                .to_string()
        })
        .collect();
    let out = Command::new(common::tool("systemd-analyze"))
        .args(["verify", "--man=no"])
        .args(&instances)
        .output()
        .expect("systemd-analyze (Debian package systemd; test.sh installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    // verify exits 0 on an unknown key or a value it cannot parse, and
    // says so: any word from it is a defect.
    assert!(said.trim().is_empty(), "systemd-analyze verify: {said}");
}

#[test]
fn a_unit_with_a_bad_value_is_caught() {
    // The check above can fail: the same units with one bad value.
    let dir = tempfile::tempdir().unwrap();
    units_in(dir.path());
    let service = dir.path().join("nvraid@.service");
    let text = std::fs::read_to_string(&service).unwrap();
    std::fs::write(&service, text.replace("Type=notify", "Type=notifyy")).unwrap();
    let out = Command::new(common::tool("systemd-analyze"))
        .args(["verify", "--man=no"])
        .arg(dir.path().join("nvraid@data.service"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("notifyy"), "{said}");
}

#[test]
fn the_udev_rules_run_nvraid_commands_that_parse() {
    let rules = std::fs::read_to_string(dist().join("udev/64-nvraid.rules")).unwrap();
    let mut commands = Vec::new();
    for line in rules
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        for key in ["RUN+=\"", "PROGRAM=\""] {
            if let Some(rest) = line.split(key).nth(1) {
                commands.push(rest.split('"').next().unwrap().to_string());
            }
        }
    }
    assert_eq!(
        commands,
        [
            "/usr/bin/nvraid assemble --incremental $devnode",
            "/usr/bin/nvraid assemble --incremental $devnode --removed",
            "/usr/bin/nvraid ublk name %k"
        ]
    );
    // Each command's words (udev's substitutions filled in) parse: run with
    // an empty run directory and no configuration, both exit as designed.
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_nvraid"))
            .args(args)
            .env("NVRAID_CONF", dir.path().join("none.conf"))
            .env("NVRAID_RUN_DIR", dir.path())
            .output()
            .unwrap()
    };
    let out = run(&["assemble", "--incremental", "/dev/null"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let out = run(&["assemble", "--incremental", "/dev/null", "--removed"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let out = run(&["ublk", "name", "ublkb0"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // The symlink is /dev/nvraid/NAME, the name the program prints.
    assert!(rules.contains("SYMLINK+=\"nvraid/%c\""));
    assert!(rules.contains("ENV{ID_FS_TYPE}==\"linux_raid_member\""));
}

#[test]
fn the_example_configuration_parses_and_declares_nothing() {
    let text = std::fs::read_to_string(dist().join("nvraid.conf")).unwrap();
    let (config, errors) = nvraid_service::Config::parse(&text);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(config.arrays.is_empty(), "the example starts an array");
    // Its commented examples parse once uncommented.
    let uncommented: String = text
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter(|l| {
            ["ARRAY ", "PROGRAM ", "MAILADDR ", "MAILFROM ", "METRICS "]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let (config, errors) = nvraid_service::Config::parse(&uncommented);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(config.arrays.len(), 2);
    assert!(config.alerts.metrics.is_some() && config.alerts.program.is_some());
}
