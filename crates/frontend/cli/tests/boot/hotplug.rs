//! A member pulled and plugged back while its array runs, on a Debian trixie
//! machine booted with systemd (`tools/bootvm --hotplug`: the disk behind a
//! PCIe root port of its own, unplugged and plugged back through qemu's QMP);
//! the guest's half is `boot/hotplug.sh` beside this file.
//!
//! One boot: the package installed, a RAID 5 of 3 declared (`config add
//! --metrics`), udev starts `nvraid@hp`. nv1 is unplugged (`device_del`):
//! udev's remove event runs `nvraid assemble --incremental DEV --removed`,
//! whose daemon fails and removes it (`/metrics` shows it missing). 2 MiB are
//! written; nv1 is plugged back (`device_add`, same serial): udev's add event
//! hands it to the running daemon, which re-adds it by the bitmap once udev
//! lets go of the disk (the journal says so, and the rebuild copied a few
//! bitmap chunks' rows, not the member). Every byte written reads back; after the poweroff the host finds
//! the members clean and the parity right.

use crate::common::*;
use nvraid_testing::bootvm::{build_package, Boot, Machine};
use std::path::{Path, PathBuf};

#[test]
fn a_member_pulled_and_plugged_back_while_its_array_runs_is_re_added_by_the_bitmap() {
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
            "64M",
            "--name",
            "hp",
            "--bitmap-chunk",
            "1M",
            "m0.img",
            "m1.img",
            "m2.img",
        ],
        d,
    );
    let members: Vec<PathBuf> = (0..3).map(|i| d.join(format!("m{i}.img"))).collect();
    let inside = d.join("in");
    build_package(Path::new(env!("CARGO_BIN_EXE_nvraid")), &inside);
    let machine = Machine::new(d, &members);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/boot/hotplug.sh");
    let booted = machine.boot(
        &script,
        &Boot {
            indir: Some(&inside),
            hotplug: vec![1],
            timeout_s: Some(900),
            ..Boot::default()
        },
    );
    booted.succeeded();
    assert!(booted.line("SERVED /dev/ublkb").ends_with(" active"));
    booted.line("UNPLUGGED nv1 missing");
    let replugged = booted.line("REPLUGGED ");
    let number = |key: &str| -> u64 {
        replugged
            .split(key)
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {replugged}"))
    };
    // Copied by the bitmap, whole 1 MiB chunks of rows, not the member's 63
    // MiB: the 2 MiB at 16 MiB of the array written while nv1 was away are
    // rows 8 to 9 MiB (RAID 5 of 3), one chunk; the 4 MiB written at 0 just
    // before the pull (rows 0 to 2 MiB) may still have had their two bits
    // set when the member failed (the daemon clears a bit after seconds of
    // quiet), and a member that failed keeps every bit set since.
    let copied = number("\"copied_bytes\":");
    assert!(
        (1 << 20..=3 << 20).contains(&copied) && copied % (1 << 20) == 0,
        "{replugged}"
    );
    assert_eq!(number(" of "), 64 << 20, "{replugged}");
    // udev's add event finds the daemon; the daemon takes the disk at once
    // or, while udev still holds it (it locks a disk during its event), as
    // soon as udev lets go.
    let said = booted.line("UDEV-SAID ");
    let readded = booted.line("READDED ");
    assert!(said.contains("went away: removed;"), "{said}");
    assert!(
        said.contains("is back: re-added (bitmap) in role 1 of the running array")
            || (said.contains("is back: handed to the running array")
                && readded.contains("role=1 recovery=bitmap")),
        "{said}\n{readded}"
    );
    booted.line("VERIFIED 6 MiB");
    assert_eq!(booted.line("STOPPED "), "STOPPED inactive");
    eprintln!("{}", booted.times());
    let names: Vec<String> = members.iter().map(|p| p.display().to_string()).collect();
    let mut detail = vec!["detail"];
    detail.extend(names.iter().map(String::as_str));
    let shown = ok(&detail, d);
    assert!(
        shown.lines().any(|l| l.trim() == "State : clean"),
        "{shown}"
    );
    assert_checks_clean(d, &names, "after the member came back");
}
