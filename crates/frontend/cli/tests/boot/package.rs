//! The Debian package (`dist/build-deb`) on a real Debian trixie booted with systemd
//! (`tools/bootvm`: mkroot's root filesystem through a qcow2 overlay of this test's
//! own, Debian's initramfs, trixie's 6.12 kernel, TCG), two boots of one machine;
//! the guest's half is `boot/package.sh` beside this file.
//!
//! Boot 1: the .deb built from this test's binary installs with `apt-get install
//! ./nvraid_*.deb` and no network (so its Depends hold on a stock trixie with the
//! bed's packages); `nvraid --version` is this binary's; every man page `nvraid man`
//! makes is in man's directory; the bash completion loads, the zsh and fish ones
//! are in their vendor directories; every unit of dist/systemd is known to systemd
//! and every rule of dist/udev passes `udevadm verify`; the example config is a
//! conffile. `apt-get remove` takes it all away but the conffile and leaves the
//! RAID 1 member on nv0 as it was (the first 8 MiB: superblock, bitmap, data). The
//! boot ends in a power cut (`bootvm --cut`).
//! Boot 2, the same root after the cut (an ext4 whose journal is not replayed yet,
//! from which bootvm still reads the initramfs): what boot 1 wrote and synced there
//! is read back, `apt-get purge` removes the conffile, the member is still as it
//! was, and the machine powers off cleanly. A blank disk between the two members is
//! left out this time (`--absent`): the second member keeps its name (virtio-nv2).
//! Each boot's timing is printed (bootvm's line). The guest's
//! mdadm assembles the RAID 1 as md127 (auto-read-only) at every boot: the script
//! prints it (MDSTAT); nvraid's own peace with mdadm is `nvraid config add`'s.

use crate::common::*;
use nvraid_testing::bootvm::{build_package, Boot, Machine};
use std::path::{Path, PathBuf};

/// The sha256 of the first 8 MiB of `image`.
fn head_sha(image: &Path) -> String {
    let bytes = std::fs::read(image).unwrap();
    sha(&bytes[..8 << 20])
}

/// The regular files directly in the repository's `dist/<sub>`.
fn dist_files(sub: &str) -> usize {
    match std::fs::read_dir(repo().join("dist").join(sub)) {
        Ok(entries) => entries
            .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_file())
            .count(),
        Err(_) => 0,
    }
}

#[test]
fn the_package_installs_offline_on_debian_and_its_removal_leaves_the_array_alone_across_a_power_cut(
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "1", "--size", "32M", "m0.img", "m1.img",
        ],
        d,
    );
    let members: Vec<PathBuf> = ["m0.img", "m1.img"].iter().map(|m| d.join(m)).collect();
    let member_sha = head_sha(&members[0]);
    let member2_sha = head_sha(&members[1]);
    // a blank disk between the members: nv0 = m0, nv1 = blank, nv2 = m1
    std::fs::File::create(d.join("blank.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let disks = [members[0].clone(), d.join("blank.img"), members[1].clone()];

    // the package, from this test's binary
    let inside = d.join("in");
    build_package(Path::new(env!("CARGO_BIN_EXE_nvraid")), &inside);
    let version = ok(&["--version"], d).trim().to_string();
    std::fs::create_dir_all(d.join("man")).unwrap();
    ok(&["man", "--dir", "man"], d);
    let pages = std::fs::read_dir(d.join("man")).unwrap().count();
    let conf = if repo().join("dist/nvraid.conf").is_file() {
        "present"
    } else {
        "absent"
    };

    let machine = Machine::new(d, &disks);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/boot/package.sh");
    let mark = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let env = |boot: &str| {
        vec![
            ("BOOT", boot.to_string()),
            ("MEMBER_SHA", member_sha.clone()),
            ("MARK", mark.clone()),
            ("MEMBER2_SHA", member2_sha.clone()),
        ]
    };

    let first = machine.boot(
        &script,
        &Boot {
            indir: Some(&inside),
            env: env("1"),
            cut: Some("^CUT$"),
            ..Boot::default()
        },
    );
    first.succeeded();
    assert!(
        first.stderr.contains("bootvm: power cut (qemu killed)"),
        "boot 1 was not cut: {}",
        first.stderr
    );
    assert_eq!(
        first.line("INSTALLED"),
        format!(
            "INSTALLED nvraid {} install ok installed",
            version.trim_start_matches("nvraid ")
        )
    );
    assert_eq!(first.line("VERSION"), format!("VERSION {version}"));
    assert_eq!(first.line("BINARY"), "BINARY /usr/bin/nvraid");
    assert_eq!(first.line("MAN"), format!("MAN {pages} pages"));
    assert_eq!(first.line("COMPLETIONS"), "COMPLETIONS bash zsh fish");
    assert_eq!(
        first.line("UNITS"),
        format!("UNITS {} known to systemd", dist_files("systemd"))
    );
    assert_eq!(
        first.line("RULES"),
        format!("RULES {} verified by udevadm", dist_files("udev"))
    );
    assert_eq!(first.line("CONF"), format!("CONF {conf}"));
    // removed, not purged: the conffile (if any) and the postrm stay until a purge
    let left = "deinstall ok config-files";
    assert_eq!(first.line("REMOVED"), format!("REMOVED {left}"));
    assert_eq!(first.line("MEMBER"), "MEMBER unchanged");
    assert_eq!(first.line("MARK"), "MARK written");
    assert_eq!(
        head_sha(&members[0]),
        member_sha,
        "boot 1 changed the member"
    );

    let second = machine.boot(
        &script,
        &Boot {
            env: env("2"),
            absent: vec![1],
            ..Boot::default()
        },
    );
    second.succeeded();
    assert_eq!(second.line("MARK"), "MARK read");
    assert_eq!(second.line("DISKS"), "DISKS nv0 nv2, nv1 left out");
    assert_eq!(second.line("LEFT"), format!("LEFT {left}"));
    assert_eq!(second.line("PURGED"), "PURGED not known");
    assert_eq!(second.line("MEMBER"), "MEMBER unchanged");
    assert_eq!(
        head_sha(&members[0]),
        member_sha,
        "boot 2 changed the member"
    );

    eprintln!(
        "boot 1: {:?} in all; {}\nboot 2: {:?} in all; {}",
        first.wall,
        first.times(),
        second.wall,
        second.times()
    );
}
