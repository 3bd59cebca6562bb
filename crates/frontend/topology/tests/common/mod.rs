//! Helpers shared by the integration tests: fixture trees and running the command.

#![allow(dead_code)]

use std::path::Path;

use nvraid_topology::cli::{run, TopologyArgs};
use nvraid_topology::fixture::expand_manifest;
use nvraid_topology::{Level, Measurer};

/// Expands `tests/fixtures/<platform>/sysfs.manifest` into a fresh temporary sysfs tree.
pub fn fixture(platform: &str) -> tempfile::TempDir {
    let manifest_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(platform)
        .join("sysfs.manifest");
    let manifest = std::fs::read_to_string(&manifest_path).expect("fixture manifest");
    let dir = tempfile::tempdir().expect("temp dir");
    expand_manifest(&manifest, dir.path()).expect("manifest expands");
    dir
}

pub fn args(root: &Path) -> TopologyArgs {
    TopologyArgs {
        sysfs_root: root.to_path_buf(),
        json: false,
        plan: false,
        level: Level::Raid0,
        measure: false,
        measure_secs: 1,
        dev_dir: "/dev".into(),
        devices: Vec::new(),
    }
}

pub fn plan_args(root: &Path, level: Level, devices: &[&str]) -> TopologyArgs {
    TopologyArgs {
        plan: true,
        level,
        devices: devices.iter().map(|d| d.to_string()).collect(),
        ..args(root)
    }
}

/// Runs the command; returns (exit code, output).
pub fn run_to_string(args: &TopologyArgs, measurer: Option<&dyn Measurer>) -> (i32, String) {
    let mut out = Vec::new();
    let code = run(args, measurer, &mut out).expect("run succeeds");
    (code, String::from_utf8(out).expect("utf-8 output"))
}

pub const PLATFORMS: [&str; 6] = ["z170", "z170-x2", "x99", "amd-x570", "server-2numa", "vmd"];
