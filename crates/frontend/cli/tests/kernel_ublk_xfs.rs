//! XFS on `/dev/ublkb0` over every RAID level nvraid serves, in the kernel
//! VM (Linux 6.12, tools/mdvm `--kernel 6.12`, modules ublk_drv and xfs;
//! `NVRAID_MDVM` may name another mdvm with the same interface). The in-VM
//! script is `kernel_ublk_xfs.sh` beside this file.
//!
//! Arrays of 1 GiB (mkfs.xfs ignores a device's stripe hints below that),
//! on sparse images: RAID 0 of 2 (128 KiB chunks), RAID 1 of 2, RAID 10 of
//! 4 (near 2, 64 KiB), RAID 5 of 3 (64 KiB), RAID 6 of 6 (32 KiB), and a
//! RAID 5 of 4 (64 KiB: a 192 KiB stripe, no power of two). Each in turn:
//! served as /dev/ublkb0; mkfs.xfs, whose stripe unit and width must be
//! the array's where the device can say them (io_min = chunk, io_opt =
//! full stripe, powers of two) and are given as docs/ublk.md says
//! (`-d su=64k,sw=3`) where it cannot; files written, synced, verified
//! after a remount; umount; `xfs_repair -n` clean; SIGTERM; then the
//! kernel's md assembles the same members (read-only) and the same files
//! verify through it. Afterwards, on the host, every array is clean for
//! nvraid and for `mdadm --examine`.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

/// (name, level, chunk, members, member size, mkfs.xfs sunit and swidth in
/// 4 KiB blocks).
const ARRAYS: [(&str, &str, &str, usize, &str, u32, u32); 6] = [
    ("raid0", "0", "128K", 2, "560M", 32, 64),
    ("raid1", "1", "", 2, "1100M", 0, 0),
    ("raid10", "10", "64K", 4, "560M", 16, 32),
    ("raid5", "5", "64K", 3, "560M", 16, 32),
    ("raid6", "6", "32K", 6, "280M", 8, 32),
    ("raid5x4", "5", "64K", 4, "380M", 16, 48),
];

#[test]
fn xfs_on_ublk_over_every_level_takes_the_arrays_stripe_and_the_kernels_md_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut images = Vec::new();
    for (name, level, chunk, members, size, ..) in ARRAYS {
        let names: Vec<String> = (0..members).map(|i| format!("{name}-{i}.img")).collect();
        let mut create = vec!["create", "--level", level, "--size", size];
        if !chunk.is_empty() {
            create.extend(["--chunk", chunk]);
        }
        create.extend(names.iter().map(String::as_str));
        ok(&create, d);
        images.extend(names.iter().map(|n| d.join(n)));
    }
    let inside = vm_indir(
        d,
        &[
            PathBuf::from(env!("CARGO_BIN_EXE_nvraid")),
            host_tool("mkfs.xfs"),
            host_tool("xfs_repair"),
        ],
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kernel_ublk_xfs.sh");
    let console = run_vm_612(&["ublk_drv", "xfs"], &inside, &script, &images, 400);
    for (name, level, chunk, members, _, sunit, swidth) in ARRAYS {
        let hints = console_line(&console, &format!("HINTS {name} "));
        if name == "raid5x4" {
            assert_eq!(
                hints, "HINTS raid5x4 min=65536 opt=0",
                "no power of two: no io_opt"
            );
        } else if !chunk.is_empty() {
            // The chunk, and the full stripe: the mkfs.xfs numbers below.
            let unit = u64::from(sunit) * 4096;
            assert_eq!(
                hints,
                format!("HINTS {name} min={unit} opt={}", u64::from(swidth) * 4096)
            );
        }
        assert_eq!(
            console_line(&console, &format!("MKFS {name} ")),
            format!("MKFS {name} sunit={sunit} swidth={swidth} blks"),
            "mkfs.xfs on a RAID {level} of {members} ({chunk} chunks)"
        );
        for step in [
            format!("VERIFIED {name} 7 files through ublk"),
            format!("REPAIR {name} clean"),
            format!("VERIFIED {name} 7 files through the kernel's md"),
            format!("LEVEL {name} done"),
        ] {
            console_line(&console, &step);
        }
        let md = console_line(&console, &format!("MD {name} "));
        // Assembled read-only ("readonly"; "clean" where md keeps redundancy).
        assert!(
            md.contains(&format!("Raid Level : raid{level} "))
                && !md.contains("degraded")
                && (md.contains("State : clean") || md.contains("State : readonly")),
            "{md}"
        );
    }
    console_line(&console, "DONE");
    // On the host: every array clean, for nvraid and for mdadm.
    let mut first = 0;
    for (name, _, _, members, ..) in ARRAYS {
        let names: Vec<String> = (0..members).map(|i| format!("{name}-{i}.img")).collect();
        let mut detail = vec!["detail"];
        detail.extend(names.iter().map(String::as_str));
        let text = ok(&detail, d);
        assert!(
            text.lines().any(|l| l.trim() == "State : clean"),
            "{name}: {text}"
        );
        let examine = Command::new(tool("mdadm"))
            .arg("--examine")
            .arg(&images[first])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&examine.stdout);
        assert!(
            text.lines().any(|l| l.trim() == "State : clean"),
            "{name}: mdadm --examine:\n{text}"
        );
        first += members;
    }
}
