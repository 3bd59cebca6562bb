//! `nvraid serve --ublk` across an online grow: the device follows the
//! array's new size where the kernel's ublk driver can change a started
//! device's size (`UBLK_U_CMD_UPDATE_SIZE`, Linux 6.16 on), and keeps its
//! own where it cannot.
//!
//! In the kernel VM (tools/mdvm; `NVRAID_MDVM` may name another mdvm with
//! the same interface), over a RAID 5 of 3 virtio disks nvraid created
//! here and a fourth, blank one; the in-VM script is
//! `kernel_ublk_resize.sh` beside this file. ext4 is made on /dev/ublkb0,
//! 20 files written, and the array grown online onto the fourth disk
//! (`grow --socket`) while it is mounted. Then:
//!
//! - **trixie-backports' kernel** (`--kernel backports`, Linux 7): the
//!   device grows to the array's new size by itself (the server's
//!   `event=ublk-resized`), 8 MiB past the old end are written and read
//!   back with O_DIRECT, resize2fs grows ext4 online into it;
//! - **Linux 6.12** (no UPDATE_SIZE): the device keeps its size (the
//!   server says so, `event=ublk-size-kept`); the server is killed and a
//!   new one takes the device over under the mounted filesystem, the
//!   array now larger than the device (a device is refused only when it
//!   is larger than the array), and resyncs what the kill left dirty;
//!
//! and in both, 20 more files, e2fsck clean, all 40 verify, SIGTERM, and
//! the array is clean with 4 members (checked here on the images too).

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// The test's array on `series`' kernel: its console, and the array's
/// size before and after the grow.
fn grown_under_ext4(series: &str, d: &Path) -> (String, u64, u64) {
    let members = ["a.img", "b.img", "c.img"];
    let mut create = vec!["create", "--level", "5", "--chunk", "64K", "--size", "128M"];
    create.extend(members);
    ok(&create, d);
    let mut detail = vec!["detail", "--json"];
    detail.extend(members);
    let detail: serde_json::Value = serde_json::from_str(&ok(&detail, d)).unwrap();
    let size = detail["size_bytes"].as_u64().unwrap();
    let member_bytes = std::fs::metadata(d.join("a.img")).unwrap().len();
    std::fs::File::create(d.join("d.img"))
        .unwrap()
        .set_len(member_bytes)
        .unwrap();
    let inside = nvraid_testing::vm::ship(
        d,
        &[
            PathBuf::from(env!("CARGO_BIN_EXE_nvraid")),
            nvraid_testing::vm::host_tool("mkfs.ext4"),
            nvraid_testing::vm::host_tool("e2fsck"),
            nvraid_testing::vm::host_tool("resize2fs"),
        ],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kernel_ublk_resize.sh");
    let images: Vec<PathBuf> = ["a.img", "b.img", "c.img", "d.img"]
        .iter()
        .map(|m| d.join(m))
        .collect();
    let console = run_vm_series(
        series,
        &["ublk_drv", "ext4"],
        &inside,
        &script,
        &images,
        600,
    );
    assert_eq!(
        console_line(&console, "MOUNTED "),
        format!("MOUNTED {size} bytes")
    );
    console_line(&console, "GROWN grown online from 3 to 4 members");
    for step in ["VERIFIED 40 files, fsck clean", "DONE"] {
        console_line(&console, step);
    }
    let state = console_line(&console, "DETAIL ");
    assert!(
        state.contains("Raid Devices : 4") && state.contains("State : clean"),
        "{state}"
    );
    let detail = ["detail", "--json", "a.img", "b.img", "c.img", "d.img"];
    let grown: serde_json::Value = serde_json::from_str(&ok(&detail, d)).unwrap();
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    assert_eq!(grown["state"], "clean", "{grown}");
    let new_size = grown["size_bytes"].as_u64().unwrap();
    assert_eq!(new_size, size / 2 * 3, "{grown}");
    (console, size, new_size)
}

#[test]
fn a_ublk_device_grows_with_its_array_where_the_kernel_has_update_size() {
    let dir = tempfile::tempdir().unwrap();
    let (console, size, grown) = grown_under_ext4("backports", dir.path());
    let kernel = console_line(&console, "KERNEL ");
    assert!(!kernel.starts_with("KERNEL 6.1"), "{kernel}");
    assert_eq!(
        console_line(&console, "RESIZED "),
        format!("RESIZED old={size} new={grown}")
    );
    console_line(&console, "TAIL 8 MiB past the old end ok");
    let ext4 = console_line(&console, "EXT4 grown to ");
    let kib: u64 = ext4
        .trim_start_matches("EXT4 grown to ")
        .trim_end_matches(" KiB")
        .parse()
        .unwrap();
    assert!(kib * 1024 > size, "{ext4}");
}

#[test]
fn a_ublk_device_keeps_its_size_on_6_12_and_is_taken_over_after_the_grow() {
    let dir = tempfile::tempdir().unwrap();
    let (console, size, _) = grown_under_ext4("6.12", dir.path());
    assert!(console_line(&console, "KERNEL ").starts_with("KERNEL 6.12."));
    assert_eq!(
        console_line(&console, "KEPT "),
        format!("KEPT {size} bytes: device=/dev/ublkb0")
    );
    assert_eq!(
        console_line(&console, "REATTACHED "),
        format!("REATTACHED {size} bytes under the mounted filesystem")
    );
    console_line(&console, "RESYNCED after the kill");
}
