//! `nvraid serve --ublk`: the array as /dev/ublkbN.
//!
//! In the kernel VM (Linux 6.12, tools/mdvm `--kernel 6.12`, modules
//! ublk_drv and ext4; `NVRAID_MDVM` may name another mdvm with the same
//! interface), over a RAID 5 of 3 and a RAID 0 of 3 virtio disks that
//! nvraid created here; the in-VM script is `kernel_ublk_serve.sh` beside
//! this file, each step printing a line checked here:
//!
//! 1. /dev/ublkb0 appears with the array's size, 512-byte logical blocks,
//!    4 KiB physical, io_min = the 64 KiB chunk, io_opt = the 128 KiB
//!    stripe, 512 KiB requests, discards by chunk, a volatile write cache
//!    with FUA; `nvraid status` shows the device;
//! 2. 32 MiB of O_DIRECT data across stripes read back equal;
//! 3. mkfs.ext4 (which discards the device), 20 files written and synced;
//! 4. `kill -9` of nvraid while a writer syncs file after file: the device
//!    and the mount stay, a new `nvraid serve --ublk 0` takes the device
//!    over (and says so), the writer goes on, every synced file verifies;
//! 5. a second server asking for the live device is refused by name;
//! 6. umount, e2fsck clean, SIGTERM: the device is deleted and the array
//!    closed clean (also checked here on the images afterwards);
//! 7. a RAID 0 of 3 (192 KiB stripe: io_opt left unset), `--ublk auto`
//!    behind `--cache writeback`: data read back, SIGTERM, the data on the
//!    members (`nvraid read`), clean;
//! 8. that RAID 0 served `--read-only` as device 4 (the kernel's disk is
//!    read-only, a write fails, reads give the data), its server killed for good: `nvraid
//!    ublk delete` refuses while the server runs, `ublk list` shows the
//!    device with no server, `ublk delete` frees it and a read waiting on
//!    it fails.
//!
//! On the host (no ublk_drv here): `--ublk` is refused before the array
//! is assembled, naming the module and `--listen`.

mod common;

use common::*;
use std::path::{Path, PathBuf};

#[test]
fn an_array_served_over_ublk_carries_ext4_and_survives_a_killed_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r5 = ["r5a.img", "r5b.img", "r5c.img"];
    let r0 = ["r0a.img", "r0b.img", "r0c.img"];
    let mut create = vec!["create", "--level", "5", "--chunk", "64K", "--size", "128M"];
    create.extend(r5);
    ok(&create, d);
    let mut create = vec!["create", "--level", "0", "--chunk", "64K", "--size", "32M"];
    create.extend(r0);
    ok(&create, d);
    let mut detail = vec!["detail", "--json"];
    detail.extend(r5);
    let detail: serde_json::Value = serde_json::from_str(&ok(&detail, d)).unwrap();
    let size = detail["size_bytes"].as_u64().unwrap();

    let inside = nvraid_testing::vm::ship(
        d,
        &[
            PathBuf::from(env!("CARGO_BIN_EXE_nvraid")),
            nvraid_testing::vm::host_tool("mkfs.ext4"),
            nvraid_testing::vm::host_tool("e2fsck"),
        ],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kernel_ublk_serve.sh");
    let images: Vec<PathBuf> = r5.iter().chain(&r0).map(|m| d.join(m)).collect();
    let console = run_vm_612(&["ublk_drv", "ext4"], &inside, &script, &images, 500);
    assert_eq!(
        console_line(&console, "LIMITS raid5"),
        format!(
            "LIMITS raid5 size={size} lbs=512 pbs=4096 min=65536 opt=131072 max_kb=512 \
             discard_gran=65536 cache=write back fua=1 ro=0"
        )
    );
    assert!(
        console_line(&console, "STATUS ")
            .contains("ublk: /dev/ublkb0 (device 0, 2 queues of 24 tags"),
        "{console}"
    );
    for step in [
        "RAW 32 MiB ok",
        "FILES 20 written and synced",
        "KILLED nvraid under a writer",
        "REATTACHED after",
        "VERIFIED 20 files and",
        "RECORD /run/nvraid/ublk/data holds 0, ublk name ublkb0: data",
        "RESTARTED under the mounted filesystem:",
        "FSCK clean",
        "RECORD removed with the device",
        "STOPPED: device removed; nvraid: stopped; array flushed and closed",
        "RAID0 16 MiB ok",
        "WRITTEN BACK 16 MiB through --cache writeback",
        "DONE",
    ] {
        console_line(&console, step);
    }
    assert!(
        console_line(&console, "STATUS2 ").contains("taken over from a killed server"),
        "{console}"
    );
    // SIGTERM under the mounted filesystem left the device to the next
    // server with the array marked clean (nothing half-written).
    let handover = console_line(&console, "HANDOVER ");
    assert!(handover.ends_with("State : clean"), "{handover}");
    let refused = console_line(&console, "REFUSED ");
    assert!(
        refused.contains("ublk device 0 (/dev/ublkb0) is in use, served by process"),
        "{refused}"
    );
    assert!(
        console_line(&console, "READ-ONLY ").starts_with("READ-ONLY ro=1:"),
        "--read-only must give a read-only disk"
    );
    assert!(
        console_line(&console, "DELETE-LIVE ").contains("is served by process"),
        "nvraid ublk delete must refuse a running server's device"
    );
    let listed = console_line(&console, "LIST ");
    assert!(
        listed.contains("/dev/ublkb4") && listed.contains("no server"),
        "{listed}"
    );
    console_line(&console, "RELEASED /dev/ublkb4");
    // --ublk-recovery off: the device goes with its server, its number
    // stays taken until deleted, and the refusal says how to free it.
    let gone = console_line(&console, "NO-RECOVERY ");
    assert!(gone.contains("nvraid ublk delete 5"), "{gone}");
    let raid0 = console_line(&console, "LIMITS raid0");
    assert!(
        raid0.contains(" min=65536 opt=0 max_kb=512 discard_gran=65536"),
        "a 192 KiB stripe is no power of two: no io_opt: {raid0}"
    );
    for level in ["raid5", "raid0"] {
        let state = console_line(&console, &format!("DETAIL {level}"));
        assert!(state.ends_with("State : clean"), "{state}");
    }
    // The images, as the host sees them after the VM: both arrays clean.
    for members in [&r5, &r0] {
        let mut detail = vec!["detail"];
        detail.extend(members.iter());
        let text = ok(&detail, d);
        assert!(text.lines().any(|l| l.trim() == "State : clean"), "{text}");
    }
    for l in console.lines().filter(|l| {
        ["DEVICE", "REATTACHED", "VERIFIED"]
            .iter()
            .any(|p| l.starts_with(p))
    }) {
        eprintln!("{l}");
    }
}

/// Where the kernel has no ublk driver (this host), `serve --ublk` is
/// refused before the array is assembled: the message names the module
/// and says NBD works without it, and no member changes.
#[test]
fn serve_ublk_without_the_driver_names_ublk_drv_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "5", "--size", "8M", "a.img", "b.img", "c.img",
        ],
        d,
    );
    let help = ok(&["serve", "--help"], d);
    assert!(help.contains("--ublk [<ID>]"), "{help}");
    // A member where the device number should be is caught by the parser.
    let out = nvraid(&["serve", "--ublk", "a.img", "b.img", "c.img"], d);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("\"a.img\" is not a device number or `auto`"),
        "{stderr}"
    );
    assert!(
        !Path::new("/dev/ublk-control").exists(),
        "this test is about a kernel without ublk_drv; this one has /dev/ublk-control \
         (kernel_ublk_serve's VM test covers the driver)"
    );
    refused(
        &["serve", "--ublk", "auto", "a.img", "b.img", "c.img"],
        d,
        &["module ublk_drv", "--listen"],
    );
    refused(
        &["serve", "a.img", "b.img", "c.img", "--ublk=3"],
        d,
        &["module ublk_drv"],
    );
}
