//! An nvraid array a machine lives on: a Debian trixie booted with systemd
//! (`tools/bootvm`, Debian's own initramfs with mdadm's hook, trixie's 6.12
//! kernel, TCG), the package installed, a RAID 5 of 4 virtio disks declared in
//! nvraid.conf and mounted from fstab as `/dev/nvraid/data`, and a kernel md
//! RAID 1 on two other disks; six boots of the same machine (the guest's half
//! is `boot/array.sh`):
//!
//! 1. setup: the package, `config add` (mdadm.conf's `ARRAY <ignore>`,
//!    `update-initramfs -u`), udev starts the array, XFS, fstab, 20 files;
//! 2. a clean reboot: mounted at boot, the kernel's md assembled its own
//!    array and not nvraid's, no resync (the superblock said clean before the
//!    service started); `systemctl restart` of the array's service under fio
//!    with verification, then `kill -9` of its daemon under fio (systemd
//!    restarts it, the new daemon takes the device over): the filesystem
//!    stays mounted, fio sees no error;
//! 3. another clean reboot, then a writer and a power cut (qemu killed);
//! 4. the boot after the cut: the array was dirty, only the bitmap's dirty
//!    regions are resynced, every file fsync'ed before the cut reads back;
//! 5. one disk (nv2) left out: the array starts degraded after the timeout,
//!    mounts before systemd's 90 s device timeout, the alert program got
//!    `DegradedArray`, the metrics show the member missing;
//! 6. the disk back (a third clean reboot): re-added by the bitmap, every
//!    member active, every file intact.
//!
//! Then, on the host: the members' superblocks say clean, and nvraid's check
//! finds the parity right.

use crate::common::*;
use nvraid_testing::bootvm::{build_package, Boot, Booted, Machine};
use std::path::{Path, PathBuf};

/// Seconds of uptime in a MOUNTED line ("... at 31.2 s of uptime ...").
fn mounted_at(line: &str) -> f64 {
    let at = line.split(" at ").nth(1).expect(line);
    at.split(' ').next().unwrap().parse().expect(line)
}

#[test]
fn an_array_in_fstab_comes_back_after_reboots_a_power_cut_and_a_missing_disk() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create",
            "--level",
            "5",
            "--chunk",
            "64K",
            "--size",
            "256M",
            "--name",
            "data",
            // 16 bits over each member's 256 MiB of rows (md's RAID 5
            // bitmap counts member rows): what a cut leaves dirty is a
            // small part of the array
            "--bitmap-chunk",
            "16M",
            "m0.img",
            "m1.img",
            "m2.img",
            "m3.img",
        ],
        d,
    );
    let raid5: Vec<PathBuf> = (0..4).map(|i| d.join(format!("m{i}.img"))).collect();
    let mut disks = raid5.clone();
    for k in ["k0.img", "k1.img"] {
        let f = std::fs::File::create(d.join(k)).unwrap();
        f.set_len(64 << 20).unwrap();
        disks.push(d.join(k));
    }
    let inside = d.join("in");
    build_package(Path::new(env!("CARGO_BIN_EXE_nvraid")), &inside);
    std::fs::write(
        inside.join("alert"),
        "#!/bin/sh\necho \"$*\" >> /var/log/nvraid-alerts\n",
    )
    .unwrap();

    let machine = Machine::new(d, &disks);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/boot/array.sh");
    let boot = |phase: &str, absent: Vec<usize>, cut: Option<&str>| -> Booted {
        let booted = machine.boot(
            &script,
            &Boot {
                indir: Some(&inside),
                env: vec![("PHASE", phase.to_string())],
                absent,
                hotplug: vec![],
                cut,
                // the setup rebuilds Debian's initramfs (update-initramfs)
                timeout_s: Some(if phase == "setup" { 900 } else { 400 }),
            },
        );
        if cut.is_none() {
            booted.succeeded();
        }
        booted
    };
    let mut times = Vec::new();

    // 1. setup
    let setup = boot("setup", vec![], None);
    setup.line("MDGRAB");
    assert!(
        setup.line("CONFIG").ends_with("1 ignore line"),
        "{}",
        setup.line("CONFIG")
    );
    assert!(setup.line("SERVED /dev/ublkb").ends_with(" active"));
    setup.line("SETUP 20 files");

    // 2. a clean reboot, and a restart of the service under fio
    let clean = boot("clean", vec![], None);
    let mounted = clean.line("MOUNTED /srv/data from /dev/ublkb");
    times.push(("clean reboot", mounted_at(mounted)));
    // the kernel's md assembled its RAID 1, and nothing of nvraid's
    let mdstat = clean.line("MDSTAT ");
    assert_eq!(mdstat.matches("raid1").count(), 1, "{mdstat}");
    assert!(!mdstat.contains("raid5"), "{mdstat}");
    assert_eq!(
        clean.line("RESYNC "),
        "RESYNC 0 lines; state before start: clean"
    );
    assert_eq!(clean.line("VERIFIED "), "VERIFIED 20 files");
    let restarted = clean.line("RESTARTED under fio");
    assert!(
        restarted.contains("fio ok") && restarted.ends_with("left 1, taken over 1"),
        "{restarted}"
    );
    let killed = clean.line("KILLED under fio");
    assert!(
        killed.contains("fio ok") && killed.ends_with("taken over 2 times in all"),
        "{killed}"
    );

    // 3. another clean reboot, then a power cut under a writer
    let cut = boot("cut", vec![], Some("^SYNCED 12 "));
    times.push(("clean reboot", mounted_at(cut.line("MOUNTED "))));
    assert_eq!(
        cut.line("RESYNC "),
        "RESYNC 0 lines; state before start: clean"
    );
    let synced: Vec<String> = cut
        .output
        .lines()
        .filter_map(|l| l.strip_prefix("SYNCED "))
        .map(|l| {
            let (i, sum) = l.split_once(' ').unwrap();
            format!("{sum}  w{i}\n")
        })
        .collect();
    assert!(synced.len() >= 12, "{}", cut.output);
    std::fs::write(inside.join("synced"), synced.concat()).unwrap();

    // 4. the boot after the cut
    let after = boot("after-cut", vec![], None);
    times.push(("after the power cut", mounted_at(after.line("MOUNTED "))));
    assert_eq!(after.line("STATE-AT-BOOT"), "STATE-AT-BOOT active");
    let resynced = after.line("RESYNCED ");
    let total: u64 = resynced
        .split("\"resynced_bytes\":")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{resynced}"));
    let mut detail = vec!["detail", "--json"];
    let names: Vec<String> = raid5.iter().map(|p| p.display().to_string()).collect();
    detail.extend(names.iter().map(String::as_str));
    let detail: serde_json::Value = serde_json::from_str(&ok(&detail, d)).unwrap();
    let size = detail["size_bytes"].as_u64().unwrap();
    assert!(
        total > 0 && total < size,
        "the resync after the cut covered {total} of {size} bytes: not the bitmap's dirty regions only"
    );
    assert_eq!(after.line("VERIFIED "), "VERIFIED 20 files");
    assert_eq!(
        after.line("SYNCED-FILES"),
        format!("SYNCED-FILES {} verified", synced.len())
    );

    // 5. nv2 left out
    let absent = boot("absent", vec![2], None);
    let mounted = absent.line("MOUNTED ");
    times.push(("one disk missing", mounted_at(mounted)));
    // The mount waited for the degraded start, well within systemd's 90 s
    // device timeout (the boot did not fall into emergency mode: the script
    // ran after multi-user.target).
    let waited: f64 = absent
        .line("WAITED ")
        .split(' ')
        .nth(1)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{}", absent.line("WAITED ")));
    assert!(
        waited < 90.0,
        "the degraded start came {waited} s after the first member: past systemd's device timeout"
    );
    assert!(
        absent.line("ALERTS ").contains("DegradedArray data"),
        "{}",
        absent.line("ALERTS ")
    );
    let metrics = absent.line("METRICS ");
    assert!(
        metrics.contains("nvraid_array_degraded{") && metrics.contains("state=\"missing\"} 1;"),
        "{metrics}"
    );
    let degraded = metrics
        .trim_start_matches("METRICS ")
        .split(';')
        .find(|l| l.starts_with("nvraid_array_degraded{"))
        .unwrap();
    assert!(degraded.ends_with(" 1"), "{metrics}");
    absent.line("DEGRADED-WRITES 8 files");

    // 6. nv2 back: re-added by the bitmap
    let back = boot("back", vec![], None);
    times.push(("the disk back", mounted_at(back.line("MOUNTED "))));
    let readded = back.line("READDED ");
    assert!(readded.contains("recovery=bitmap"), "{readded}");
    back.line("ACTIVE 4 members");
    assert_eq!(back.line("VERIFIED "), "VERIFIED 28 files");

    // The host reads the members: clean, and the parity right.
    let mut text = vec!["detail"];
    text.extend(names.iter().map(String::as_str));
    let shown = ok(&text, d);
    assert!(
        shown.lines().any(|l| l.trim() == "State : clean"),
        "{shown}"
    );
    assert_checks_clean(d, &names, "after six boots");
    for (what, at) in &times {
        eprintln!("boot-to-mounted, {what}: {at} s of guest uptime");
    }
    eprintln!("degraded start: {waited} s after the first member");
}
