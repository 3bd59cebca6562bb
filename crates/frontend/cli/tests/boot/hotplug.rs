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
//! hands it to the running daemon, which re-adds it by the bitmap (the
//! journal says so, and the rebuild copied a bitmap chunk's rows, not the
//! member). Every byte written reads back; after the poweroff the host finds
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
            timeout_s: Some(600),
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
    // 2 MiB at 16 MiB of the array are member rows 8 to 9 MiB (RAID 5 of 3):
    // one 1 MiB bitmap chunk of rows, not the member's 63 MiB.
    assert_eq!(number("\"copied_bytes\":"), 1 << 20, "{replugged}");
    let said = booted.line("UDEV-SAID ");
    assert!(
        said.contains("went away: removed;")
            && said.contains("is back: re-added (bitmap) in role 1 of the running array"),
        "{said}"
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
