//! `nvraid grow -n N` with fewer members: a RAID 4/5/6 shrunk by members
//! offline, in md's format (a backwards reshape, the data offset moved up,
//! the members that leave made spares; docs/reshape.md "Shrinking by
//! members"), and a RAID 5 of more than two taken to RAID 1 through it.
//! Every byte the smaller array holds reads back with the parity right; a
//! shrink killed at member and superblock writes reads back mid-way and
//! `grow --continue` finishes it; bad input is refused by name with no
//! byte of any member changed; the kernel's md assembles a shrunk array
//! and finishes one nvraid left mid-way.

mod common;

use common::reshape::*;
use common::*;
use std::path::Path;
use std::process::Command;

/// Data bytes each member holds (`--size 15M` less 1 MiB of metadata).
const PER: u64 = 14 * MIB;

/// A RAID `level` of `count` members (`file_mib` MiB files, 15 MiB of each
/// used), `extra` create options, made clean; the pattern written over
/// `keep` bytes (what the smaller shape will hold) and other bytes (0xa5)
/// over the rest, which the shrink cuts off. The members' names and the
/// pattern.
fn filled(
    dir: &Path,
    level: &str,
    count: usize,
    file_mib: u64,
    keep: u64,
    extra: &[&str],
) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    for name in &names {
        let f = std::fs::File::create(dir.join(name)).unwrap();
        f.set_len(file_mib * MIB).unwrap();
    }
    let mut args = vec!["create", "--level", level, "--size", "15M", "--force"];
    args.extend_from_slice(extra);
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    if level != "0" {
        ok(&with(&["repair"], &names), dir);
    }
    let data_members = match level {
        "6" => count as u64 - 2,
        "0" => count as u64,
        "10" => count as u64 / 2,
        _ => count as u64 - 1,
    };
    let mut all = pattern(keep);
    all.resize((data_members * PER) as usize, 0xa5);
    std::fs::write(dir.join("data"), &all).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    all.truncate(keep as usize);
    (names, all)
}

fn no_mismatch(dir: &Path, members: &[String], what: &str) {
    let check = ok(&with(&["check", "--json"], members), dir);
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{what}: {check}");
}

/// The role `examine` gives `member`.
fn role_of(dir: &Path, member: &str) -> String {
    let e = ok(&["examine", member], dir);
    e.lines()
        .find(|l| l.trim_start().starts_with("Device Role"))
        .unwrap_or_else(|| panic!("no role in {e}"))
        .split(':')
        .nth(1)
        .unwrap()
        .trim()
        .to_string()
}

/// Shrink the array on `m` (every member) to `n` members, the array cut to
/// `keep` bytes; check the outcome: the pattern reads back from the
/// remaining members, the parity is right, the data offset moved up and
/// the members that left are spares.
fn shrink_and_check(dir: &Path, m: &[String], n: usize, keep: u64, data: &[u8], what: &str) {
    let keep_text = keep.to_string();
    let n_text = n.to_string();
    let before = detail(dir, m);
    let out = ok(
        &with(
            &[
                "grow",
                "--raid-devices",
                &n_text,
                "--array-size",
                &keep_text,
                "--step",
                "1M",
                "--json",
            ],
            m,
        ),
        dir,
    );
    let shrunk: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shrunk["raid_disks_before"], m.len(), "{what}: {shrunk}");
    assert_eq!(shrunk["raid_disks"], n, "{what}: {shrunk}");
    assert_eq!(shrunk["size_bytes"], keep, "{what}: {shrunk}");
    let leaving: Vec<String> = m[n..].to_vec();
    assert_eq!(shrunk["spares"], serde_json::json!(leaving), "{what}");
    assert!(
        shrunk["data_offset_bytes"].as_u64().unwrap()
            > before["data_offset_bytes"].as_u64().unwrap(),
        "{what}: the data offset did not move up: {shrunk}"
    );
    let d = detail(dir, &m[..n]);
    assert_eq!(d["raid_disks"], n, "{what}: {d}");
    assert_eq!(d["state"], "clean", "{what}: {d}");
    assert_eq!(d["size_bytes"], keep, "{what}: {d}");
    assert!(read(dir, &m[..n], keep) == data, "{what}: the bytes differ");
    no_mismatch(dir, &m[..n], what);
    for spare in &leaving {
        assert_eq!(role_of(dir, spare), "spare", "{what}: {spare}");
    }
}

#[test]
fn a_raid5_shrinks_from_5_to_4_members_and_every_byte_reads_back() {
    // 17 MiB files, 15 MiB used: room after the data to move it up. With
    // a write-intent bitmap, which is kept.
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "5", 5, 17, 3 * PER, &["--bitmap", "internal"]);
    shrink_and_check(dir.path(), &m, 4, 3 * PER, &data, "raid5 5 -> 4");
    assert!(detail(dir.path(), &m[..4])["bitmap"].is_object());
    // The three members without the fourth still read it (P right).
    let mut three = m[..4].to_vec();
    three.remove(1);
    assert!(read(dir.path(), &three, 3 * PER) == data, "degraded read");
}

#[test]
fn a_raid6_shrinks_from_6_to_5_members_with_p_and_q_right() {
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "6", 6, 17, 3 * PER, &["--bitmap", "none"]);
    shrink_and_check(dir.path(), &m, 5, 3 * PER, &data, "raid6 6 -> 5");
    // Without any two members, P and Q give every byte back.
    let three = vec![m[0].clone(), m[2].clone(), m[4].clone()];
    assert!(read(dir.path(), &three, 3 * PER) == data, "two missing");
    // Killed inside a step and at a checkpoint, then continued.
    for point in ["reshape-write:9", "reshape-superblock:40"] {
        let dir = tempfile::tempdir().unwrap();
        let (m, data) = filled(dir.path(), "6", 6, 17, 3 * PER, &["--bitmap", "none"]);
        killed_at(
            dir.path(),
            &with(
                &["grow", "-n", "5", "--array-size", "42M", "--step", "1M"],
                &m,
            ),
            point,
        );
        assert!(read(dir.path(), &m, 3 * PER) == data, "{point}: mid-way");
        ok(&with(&["grow", "--continue"], &m), dir.path());
        assert!(read(dir.path(), &m[..5], 3 * PER) == data, "{point}");
        no_mismatch(dir.path(), &m[..5], point);
        let three = vec![m[1].clone(), m[3].clone(), m[4].clone()];
        assert!(read(dir.path(), &three, 3 * PER) == data, "{point}: P, Q");
    }
}

#[test]
fn a_raid5_shrinks_by_two_members_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "5", 5, 17, 2 * PER, &["--bitmap", "none"]);
    shrink_and_check(dir.path(), &m, 3, 2 * PER, &data, "raid5 5 -> 3");
}

#[test]
fn a_raid10_near_shrinks_from_5_to_4_members_and_every_byte_reads_back() {
    // md's RAID 10 shrink: backwards, the data offset moved up, the fifth
    // member a spare; every chunk's two copies equal afterwards. With a
    // write-intent bitmap, kept.
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "10", 5, 17, 2 * PER, &["--bitmap", "internal"]);
    shrink_and_check(dir.path(), &m, 4, 2 * PER, &data, "raid10 5 -> 4");
    assert!(detail(dir.path(), &m[..4])["bitmap"].is_object());
    // One copy of each pair (roles 0 and 2 of four) gives every byte back.
    let halves = vec![m[0].clone(), m[2].clone()];
    assert!(read(dir.path(), &halves, 2 * PER) == data, "one copy each");
    // Killed inside a step and at a checkpoint, then continued.
    for point in ["reshape-write:9", "reshape-superblock:40"] {
        let dir = tempfile::tempdir().unwrap();
        let (m, data) = filled(dir.path(), "10", 5, 17, 2 * PER, &["--bitmap", "none"]);
        killed_at(
            dir.path(),
            &with(
                &["grow", "-n", "4", "--array-size", "28M", "--step", "1M"],
                &m,
            ),
            point,
        );
        let e = ok(&["examine", "d0"], dir.path());
        assert!(
            e.contains("Reshape Pos'n") && e.contains("RESHAPE_BACKWARDS"),
            "{point}: not left shrinking: {e}"
        );
        assert!(read(dir.path(), &m, 2 * PER) == data, "{point}: mid-way");
        ok(&with(&["grow", "--continue"], &m), dir.path());
        assert!(read(dir.path(), &m[..4], 2 * PER) == data, "{point}");
        no_mismatch(dir.path(), &m[..4], point);
        assert_eq!(role_of(dir.path(), "d4"), "spare", "{point}");
    }
}

#[test]
fn a_shrink_killed_at_any_write_reads_back_and_continues() {
    // An uninterrupted shrink counts the superblock writes (five members,
    // one write each per recorded event), so the last points fall in the
    // writing of the finished record.
    let probe = tempfile::tempdir().unwrap();
    let (m, _) = filled(probe.path(), "5", 5, 17, 3 * PER, &["--bitmap", "internal"]);
    let before = detail(probe.path(), &m)["events"].as_u64().unwrap();
    let out = ok(
        &with(
            &[
                "grow",
                "-n",
                "4",
                "--array-size",
                "42M",
                "--step",
                "1M",
                "--json",
            ],
            &m,
        ),
        probe.path(),
    );
    let after = serde_json::from_str::<serde_json::Value>(&out).unwrap()["events"]
        .as_u64()
        .unwrap();
    let writes = 5 * (after - before);
    let late = format!("reshape-superblock:{}", writes - 2);
    let last_step = format!("reshape-superblock:{}", writes - 7);
    let points = [
        "reshape-superblock:2",
        "reshape-write:1",
        "reshape-write:3",
        "reshape-superblock:7",
        "reshape-write:40",
        "reshape-superblock:60",
        last_step.as_str(),
        late.as_str(),
    ];
    for point in points {
        let dir = tempfile::tempdir().unwrap();
        let (m, data) = filled(dir.path(), "5", 5, 17, 3 * PER, &["--bitmap", "internal"]);
        killed_at(
            dir.path(),
            &with(
                &["grow", "-n", "4", "--array-size", "42M", "--step", "1M"],
                &m,
            ),
            point,
        );
        if point != "reshape-superblock:2" && point != late {
            // Every member carries the record: the bytes read through it.
            let e = ok(&["examine", "d0"], dir.path());
            assert!(
                e.contains("Reshape Pos'n") && e.contains("RESHAPE_BACKWARDS"),
                "{point}: not left shrinking: {e}"
            );
            assert!(
                read(dir.path(), &m, 3 * PER) == data,
                "{point}: the bytes read mid-way differ"
            );
        }
        ok(
            &with(&["grow", "--continue", "--step", "1M"], &m),
            dir.path(),
        );
        let d = detail(dir.path(), &m[..4]);
        assert_eq!(d["raid_disks"], 4, "{point}: {d}");
        assert_eq!(d["state"], "clean", "{point}: {d}");
        assert!(
            read(dir.path(), &m[..4], 3 * PER) == data,
            "{point}: the bytes differ after --continue"
        );
        no_mismatch(dir.path(), &m[..4], point);
        assert_eq!(role_of(dir.path(), "d4"), "spare", "{point}");
    }
}

#[test]
fn a_raid5_of_four_becomes_a_raid1_through_a_shrink_to_two() {
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "5", 4, 17, PER, &["--bitmap", "internal"]);
    // Without the size cut first: refused, naming the path and the size.
    refused(
        &with(&["grow", "--level", "1"], &m),
        dir.path(),
        &["two members", "--array-size 14680064"],
    );
    let out = ok(
        &with(&["grow", "--level", "1", "--array-size", "14M"], &m),
        dir.path(),
    );
    assert!(
        out.contains("shrunk from 4 to 2 members") && out.contains("to raid1"),
        "{out}"
    );
    let d = detail(dir.path(), &m[..2]);
    assert_eq!(d["level"], 1, "{d}");
    assert_eq!(d["raid_disks"], 2, "{d}");
    assert_eq!(d["size_bytes"], PER, "{d}");
    // Each mirror alone holds every byte.
    for one in &m[..2] {
        assert!(
            read(dir.path(), std::slice::from_ref(one), PER) == data,
            "{one} alone"
        );
    }
    no_mismatch(dir.path(), &m[..2], "raid1 of the shrunk raid5");
    assert_eq!(role_of(dir.path(), "d2"), "spare");
    assert_eq!(role_of(dir.path(), "d3"), "spare");
    // Killed mid-shrink: `grow --continue` finishes the shrink, then the
    // takeover of the two active members.
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "5", 4, 17, PER, &["--bitmap", "internal"]);
    killed_at(
        dir.path(),
        &with(
            &[
                "grow",
                "--level",
                "1",
                "--array-size",
                "14M",
                "--step",
                "1M",
            ],
            &m,
        ),
        "reshape-superblock:20",
    );
    assert!(read(dir.path(), &m, PER) == data, "mid-shrink");
    ok(&with(&["grow", "--continue"], &m), dir.path());
    // Given with the spares, the takeover names them.
    refused(
        &with(&["grow", "--level", "1"], &m),
        dir.path(),
        &["d2", "a spare"],
    );
    ok(&with(&["grow", "--level", "1"], &m[..2]), dir.path());
    assert_eq!(detail(dir.path(), &m[..2])["level"], 1);
    for one in &m[..2] {
        assert!(
            read(dir.path(), std::slice::from_ref(one), PER) == data,
            "{one} alone after the continued shrink"
        );
    }
}

#[test]
fn a_shrink_without_the_array_size_cut_is_refused_naming_the_size_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled(dir.path(), "5", 5, 17, 3 * PER, &["--bitmap", "internal"]);
    let new_size = (3 * PER).to_string();
    refused(
        &with(&["grow", "-n", "4"], &m),
        dir.path(),
        &[
            "--array-size",
            &new_size,
            "resize2fs",
            "nothing was written",
        ],
    );
    // More than the smaller shape holds.
    refused(
        &with(&["grow", "-n", "4", "--array-size", "43M"], &m),
        dir.path(),
        &["--array-size", &new_size, "do not fit"],
    );
    // An ext4 filesystem at the array's start whose superblock says it is
    // 50 MiB (12800 blocks of 4 KiB): larger than the size asked.
    let mut head = vec![0u8; 4096];
    head[1024 + 4..1024 + 8].copy_from_slice(&12800u32.to_le_bytes());
    head[1024 + 24..1024 + 28].copy_from_slice(&2u32.to_le_bytes());
    head[1080..1082].copy_from_slice(&[0x53, 0xef]);
    std::fs::write(dir.path().join("head"), &head).unwrap();
    ok(&with(&["write", "--input", "head"], &m), dir.path());
    std::fs::remove_file(dir.path().join("head")).unwrap();
    refused(
        &with(&["grow", "-n", "4", "--array-size", "42M"], &m),
        dir.path(),
        &[
            "ext2/3/4 filesystem of 52428800 bytes",
            "resize2fs",
            "--force",
        ],
    );
    // Told the filesystem is not in use, it shrinks.
    ok(
        &with(&["grow", "-n", "4", "--array-size", "42M", "--force"], &m),
        dir.path(),
    );
    assert_eq!(detail(dir.path(), &m[..4])["raid_disks"], 4);
}

#[test]
fn shrinks_md_refuses_are_refused_by_name_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled(dir.path(), "5", 5, 17, 3 * PER, &["--bitmap", "none"]);
    // A degraded array (md shrinks only a whole one).
    refused(
        &with(&["grow", "-n", "4", "--array-size", "42M"], &m[..4]),
        dir.path(),
        &["degraded", "role 4 is missing"],
    );
    // Below the level's fewest members, and not fewer at all.
    refused(
        &with(&["grow", "-n", "1", "--array-size", "14M"], &m),
        dir.path(),
        &["--raid-devices", "at least 2"],
    );
    // (A served array is shrunk online now: its refusals are
    // shrink_online.rs's.)
    // RAID 6 below four members.
    let r6 = tempfile::tempdir().unwrap();
    let (m6, _) = filled(r6.path(), "6", 5, 17, 3 * PER, &["--bitmap", "none"]);
    refused(
        &with(&["grow", "-n", "3", "--array-size", "14M"], &m6),
        r6.path(),
        &["--raid-devices", "at least 4"],
    );
    // RAID 0 and RAID 10.
    let r0 = tempfile::tempdir().unwrap();
    let (m0, _) = filled(r0.path(), "0", 3, 17, 2 * PER, &[]);
    refused(
        &with(&["grow", "-n", "2", "--array-size", "28M"], &m0),
        r0.path(),
        &["shrinking a raid0 by members"],
    );
    // RAID 10: near=2 not below two members; the far layout not at all
    // (md reshapes a RAID 10 only in its near layout).
    let r10 = tempfile::tempdir().unwrap();
    let (m10, _) = filled(r10.path(), "10", 4, 17, PER, &["--bitmap", "none"]);
    refused(
        &with(&["grow", "-n", "1", "--array-size", "14M"], &m10),
        r10.path(),
        &["--raid-devices", "at least 2"],
    );
    let f2 = tempfile::tempdir().unwrap();
    let (mf2, _) = filled(
        f2.path(),
        "10",
        4,
        17,
        PER,
        &["--bitmap", "none", "--layout", "f2"],
    );
    refused(
        &with(&["grow", "-n", "3", "--array-size", "14M"], &mf2),
        f2.path(),
        &["shrinking a raid10 far layout", "near"],
    );
    // No room after the data (15 MiB files, all used).
    let full = tempfile::tempdir().unwrap();
    let (mf, _) = filled(full.path(), "5", 5, 15, 3 * PER, &["--bitmap", "none"]);
    refused(
        &with(&["grow", "-n", "4", "--array-size", "42M"], &mf),
        full.path(),
        &["free after the data", "grow --size"],
    );
}

/// The kernel's shrink left mid-way (tests/fixtures/md-states/
/// reshape_r5_shrink: mdadm's 5 -> 4 with a backup file, the data offset
/// kept, stopped at 18 MiB), unpacked into `dir`; the members' names.
fn kernel_shrink(dir: &Path) -> Vec<String> {
    let fixture = repo().join("tests/fixtures/md-states/reshape_r5_shrink");
    let mut names = Vec::new();
    for i in 0..5 {
        let name = format!("disk{i}.img");
        let out = Command::new("xz")
            .arg("-dc")
            .arg(fixture.join(format!("{name}.xz")))
            .output()
            .expect("xz");
        assert!(out.status.success(), "xz -dc {name}.xz");
        std::fs::write(dir.join(&name), out.stdout).unwrap();
        names.push(name);
    }
    names
}

/// The events count `examine` gives `member`.
fn events_of(dir: &Path, member: &str) -> u64 {
    let e = ok(&["examine", member], dir);
    e.lines()
        .find(|l| l.trim_start().starts_with("Events"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no events in {e}"))
}

/// The kernel's finished shrink is the first 36 MiB of the four members
/// left, as the kernel read them (`kernel-sha256.txt`), parity clean,
/// the fifth member a spare.
fn is_the_kernels_result(dir: &Path, names: &[String], what: &str) {
    let fixture = repo().join("tests/fixtures/md-states/reshape_r5_shrink");
    let kernel = std::fs::read_to_string(fixture.join("kernel-sha256.txt")).unwrap();
    let kernel = kernel.split_whitespace().next().unwrap();
    let d = detail(dir, &names[..4]);
    assert_eq!(d["raid_disks"], 4, "{what}: {d}");
    assert_eq!(d["size_bytes"], 36 * MIB, "{what}: {d}");
    assert_eq!(
        sha(&read(dir, &names[..4], 36 * MIB)),
        kernel,
        "{what}: not the kernel's bytes"
    );
    no_mismatch(dir, &names[..4], what);
    assert_eq!(role_of(dir, &names[4]), "spare", "{what}");
}

#[test]
fn nvraid_finishes_the_kernels_shrink_in_place_with_its_critical_section_kept_on_the_leaving_member(
) {
    // The kernel moved no data offset: near the start no step is safe by
    // itself, so each of the last steps keeps the rows it overwrites on the
    // leaving member first (its rows past the cut-off end). Uninterrupted,
    // then killed inside those steps (while the backup is written, and
    // while a backed step's rows are) and continued: the kernel's bytes.
    let probe = tempfile::tempdir().unwrap();
    let names = kernel_shrink(probe.path());
    let before = events_of(probe.path(), &names[0]);
    let out = ok(
        &with(&["grow", "--continue", "--step", "1M", "--json"], &names),
        probe.path(),
    );
    let after = serde_json::from_str::<serde_json::Value>(&out).unwrap()["events"]
        .as_u64()
        .unwrap();
    is_the_kernels_result(probe.path(), &names, "uninterrupted");
    // The record put back, one checkpoint per step but the last, the end:
    // each step writes four members' rows and flushes (five points).
    let writes = 5 * (after - before - 1);
    let last = format!("reshape-write:{}", writes - 2);
    let second_last = format!("reshape-write:{}", writes - 7);
    for point in [
        last.as_str(),
        second_last.as_str(),
        "reshape-backup:2",
        "reshape-backup:3",
        "reshape-backup:5",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let names = kernel_shrink(dir.path());
        killed_at(
            dir.path(),
            &with(&["grow", "--continue", "--step", "1M"], &names),
            point,
        );
        let e = ok(&["examine", &names[0]], dir.path());
        assert!(e.contains("Reshape Pos'n"), "{point}: {e}");
        ok(
            &with(&["grow", "--continue", "--step", "1M"], &names),
            dir.path(),
        );
        is_the_kernels_result(dir.path(), &names, point);
    }
}

#[test]
fn the_kernel_assembles_a_shrunk_array_and_finishes_one_nvraid_left_mid_way() {
    // RAID 5 of five shrunk to four: one to the end, one killed mid-way
    // (a step written and recorded, more to go), and one more mid-way with
    // a write-intent bitmap (kept). md assembles all three (the
    // fifth members as spares), the second goes on backwards from nvraid's
    // record; both read the pattern over the smaller size and md's check
    // finds no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("done", None, "none"),
        ("mid", Some("reshape-superblock:60"), "none"),
        ("bitmap", Some("reshape-superblock:60"), "internal"),
    ];
    let images = shrunk_for_the_kernel(dir.path(), "5", 3 * PER, "42M", &cases);
    let report = kernel_finishes(&images, 3 * PER);
    // /proc/mdstat, shown twice: the shrunk array's fifth member a spare
    // both times, the others' once md has finished their shrink.
    assert_kernel_shrunk(&report, "raid5", 3, 3 * PER, 4);
}

/// Arrays of `level` on five members (the pattern over `keep` bytes)
/// shrunk to four with `--array-size array_size`, one per case (`name`,
/// the failpoint it is killed at or `None` to the end, its bitmap); the
/// images of all five members of each (md takes the fifth as a spare).
fn shrunk_for_the_kernel(
    dir: &Path,
    level: &str,
    keep: u64,
    array_size: &str,
    cases: &[(&str, Option<&str>, &str)],
) -> Vec<std::path::PathBuf> {
    let mut images = Vec::new();
    for &(name, point, bitmap) in cases {
        let sub = dir.join(name);
        std::fs::create_dir(&sub).unwrap();
        let (m, _) = filled(
            &sub,
            level,
            5,
            17,
            keep,
            &["--bitmap", bitmap, "--name", name],
        );
        let args = with(
            &[
                "grow",
                "-n",
                "4",
                "--array-size",
                array_size,
                "--step",
                "1M",
            ],
            &m,
        );
        match point {
            None => {
                ok(&args, &sub);
            }
            Some(point) => {
                killed_at(&sub, &args, point);
                let examine = ok(&["examine", "d0"], &sub);
                assert!(examine.contains("Reshape Pos'n"), "{name}: {examine}");
            }
        }
        images.extend(m.iter().map(|n| sub.join(n)));
    }
    images
}

/// The kernel's report of `count` arrays shrunk to four members: each a
/// whole `level` of `size` bytes, the pattern read, no mismatch, no
/// reshape left; the leaving members md's spares (`[4](S)` at least
/// `spares` times in /proc/mdstat's two showings).
fn assert_kernel_shrunk(report: &str, level: &str, count: usize, size: u64, spares: usize) {
    eprintln!("{report}");
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), count, "{count} arrays expected:\n{report}");
    assert!(
        report.matches("[4](S)").count() >= spares,
        "the leaving members are not md's spares:\n{report}"
    );
    for line in lines {
        assert!(
            line.contains(&format!("level={level}"))
                && line.contains("disks=4 ")
                && line.contains(&format!("size={size}"))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("reshape=none")
                && line.contains("degraded=0"),
            "{line}\n{report}"
        );
    }
}

#[test]
fn the_kernel_assembles_a_raid10_shrunk_and_finishes_one_nvraid_left_mid_way() {
    // RAID 10 near=2 of five shrunk to four: one to the end, one killed
    // mid-way (steps written and recorded, more to go). md assembles both
    // (the fifth members as spares), the second goes on backwards from
    // nvraid's record; both read the pattern over the smaller size and
    // md's check finds no copy that differs.
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("done10", None, "none"),
        ("mid10", Some("reshape-superblock:40"), "none"),
    ];
    let images = shrunk_for_the_kernel(dir.path(), "10", 2 * PER, "28M", &cases);
    let report = kernel_finishes(&images, 2 * PER);
    assert_kernel_shrunk(&report, "raid10", 2, 2 * PER, 2);
}
