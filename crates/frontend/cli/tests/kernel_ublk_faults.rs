//! Bad days under a mounted filesystem on `/dev/ublkb0`, in the kernel VM
//! (Linux 6.12, tools/mdvm `--kernel 6.12`, modules ublk_drv, xfs and
//! dm_mod; `NVRAID_MDVM` may name another mdvm with the same interface).
//! The in-VM script is `kernel_ublk_faults.sh` beside this file. One member
//! of each array is used through device-mapper, whose table the script
//! swaps for dm's `error` target (every I/O fails) while a writer fsyncs
//! file after file on XFS:
//!
//! 1. RAID 1 of 2: the writer goes on, the kernel logs no error for the
//!    device, `nvraid status` shows the member faulty, every synced file
//!    verifies after a remount, `xfs_repair -n` is clean, SIGTERM stops;
//! 2. RAID 5 of 3: `kill -9` of the server under the writer (user
//!    recovery): the device stays, a new server takes it over, the writer
//!    goes on; then the member fails under the same writer, with the same
//!    checks as RAID 1;
//! 3. RAID 0 of 2: the writer gets EIO, the server stays up and answers
//!    `status`, umount returns, SIGTERM removes the device, and no process
//!    is left in D state.

mod common;

use common::*;
use std::path::PathBuf;

#[test]
fn a_member_failing_under_xfs_on_ublk_is_absorbed_by_raid1_and_raid5_and_is_eio_on_raid0() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let arrays: [(&str, &str, &[&str]); 3] = [
        ("1", "512M", &["r1a.img", "r1b.img"]),
        ("5", "256M", &["r5a.img", "r5b.img", "r5c.img"]),
        ("0", "256M", &["r0a.img", "r0b.img"]),
    ];
    let mut images = Vec::new();
    for (level, size, members) in arrays {
        let mut create = vec!["create", "--level", level, "--size", size];
        if level != "1" {
            create.extend(["--chunk", "64K"]);
        }
        create.extend(members);
        ok(&create, d);
        images.extend(members.iter().map(|m| d.join(m)));
    }
    let inside = vm_indir(
        d,
        &[
            PathBuf::from(env!("CARGO_BIN_EXE_nvraid")),
            host_tool("mkfs.xfs"),
            host_tool("xfs_repair"),
            host_tool("dmsetup"),
        ],
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kernel_ublk_faults.sh");
    let modules = ["ublk_drv", "xfs", "dm_mod"];
    let console = run_vm_612(&modules, &inside, &script, &images, 400);
    for (name, member) in [("raid1", "f1"), ("raid5", "f5")] {
        let survived = console_line(&console, &format!("SURVIVED {name}: "));
        assert!(
            survived.ends_with("kernel errors 0"),
            "the kernel logged an error for /dev/ublkb0: {survived}"
        );
        let status = console_line(&console, &format!("STATUS {name} "));
        assert!(
            status.contains(" faulty ") && status.ends_with(&format!("/dev/mapper/{member} ")),
            "nvraid status does not show {member} faulty: {status}"
        );
        for step in [
            format!("VERIFIED {name}: "),
            format!("REPAIR {name} clean"),
            format!("STOPPED {name}: nvraid: stopped; array flushed and closed"),
        ] {
            console_line(&console, &step);
        }
    }
    console_line(&console, "REATTACHED raid5: killed after");
    let writer = console_line(&console, "WRITER raid0: ");
    assert!(writer.ends_with("Input/output error"), "{writer}");
    let status = console_line(&console, "STATUS raid0 ");
    assert!(
        status.starts_with("STATUS raid0 array: ") && status.contains("/dev/mapper/f0"),
        "the server did not answer status after the failure: {status}"
    );
    console_line(&console, "UMOUNTED raid0");
    console_line(&console, "STOPPED raid0: exit 0: nvraid: stopped");
    assert_eq!(console_line(&console, "STUCK "), "STUCK []");
    console_line(&console, "DONE");
}
