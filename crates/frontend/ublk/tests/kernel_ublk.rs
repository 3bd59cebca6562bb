//! nvraid-ublk against the real ublk driver: Linux 6.12 in the kernel VM
//! (tools/mdvm `--kernel 6.12`, modules ublk_drv and ext4), where
//! `ublk-ram` (this crate's RAM disk) serves /dev/ublkb0 from a tmpfs
//! file. The in-VM script is `kernel_ublk.sh` beside this file; each of
//! its steps prints a line checked here:
//!
//! 1. the device appears (its limits as set), 32 MiB of raw O_DIRECT data
//!    read back equal;
//! 2. a discard punches the range out of the server's file and reads zeros;
//! 3. mkfs.ext4, 20 files written and synced;
//! 4. `kill -9` of the server (user recovery on): the device stays, a write
//!    issued meanwhile waits, `ublk-ram --recover 0` re-attaches, the write
//!    completes and every file verifies from the device (caches dropped);
//! 5. fstrim, umount, `e2fsck -fn` clean;
//! 6. SIGTERM: the server stops and deletes the device (and reports having
//!    served FLUSH, FUA and DISCARD requests);
//! 7. `kill -9` without recovery under a writer that writes and verifies
//!    the device round after round: /dev/ublkb0 goes away, the writer
//!    ends with an error, no process is left in D state, the dead device
//!    keeps /dev/ublkc0 until `ublk-ram --delete 0`.
//!
//! `NVRAID_MDVM` may name another mdvm with the same interface (to run
//! this where tools/mdvm has no 6.12 kernel yet).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// `field=N` from a `served ...` line.
fn counter(line: &str, field: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{field}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field}= in {line:?}"))
}

#[test]
fn a_ram_disk_over_ublk_carries_a_filesystem_and_survives_its_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let inside = nvraid_testing::vm::ship(
        d,
        &[
            PathBuf::from(env!("CARGO_BIN_EXE_ublk-ram")),
            nvraid_testing::vm::host_tool("mkfs.ext4"),
            nvraid_testing::vm::host_tool("e2fsck"),
        ],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kernel_ublk.sh");
    let mdvm = std::env::var_os("NVRAID_MDVM")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("tools/mdvm/mdvm"));
    let out = Command::new(&mdvm)
        .args(["--kernel", "6.12", "--modules", "ublk_drv ext4"])
        .args(["--smp", "2", "--mem", "1G", "--timeout", "300", "--indir"])
        .arg(&inside)
        .arg("--script")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (./test.sh installs its tools)", mdvm.display()));
    let console = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the VM script failed:\n{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in [
        "DEVICE /dev/ublkb0 after",
        "LIMITS lbs=512 pbs=4096 max_kb=512 discard_gran=4096 cache=write back",
        "RAW 32 MiB ok",
        "DISCARD ok",
        "FILES 20 written and synced",
        "KILLED server 1: /dev/ublkb0 stays",
        "RECOVERED after",
        "VERIFIED 21 files after recovery",
        "FSCK clean",
        "STOPPED: device removed",
        "GONE without recovery",
        "WRITER ended after",
        "DELETED the dead device",
    ] {
        assert!(
            console.lines().any(|l| l.starts_with(step)),
            "no {step:?} in:\n{console}"
        );
    }
    // Server 2's account: it served the fsck's reads, the sync's FLUSH,
    // the journal's FUA writes and fstrim's discards, with no error.
    let served = console
        .lines()
        .find(|l| l.starts_with("ublk-ram: served"))
        .unwrap_or_else(|| panic!("no served line in:\n{console}"));
    for field in ["reads", "writes", "flushes", "fua", "discards"] {
        assert!(counter(served, field) > 0, "{field} = 0: {served}");
    }
    assert_eq!(counter(served, "errors"), 0, "{served}");
    for line in console.lines().filter(|l| {
        ["DEVICE", "RAW", "RECOVERED", "GONE"]
            .iter()
            .any(|p| l.starts_with(p))
    }) {
        eprintln!("{line}");
    }
}
