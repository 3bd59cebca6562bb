//! `nvraid grow`: a RAID 4/5/6 gains members offline, in md's format
//! (docs/reshape.md). Every byte reads back and the parity is right after
//! the grow; a grow killed at any member write or superblock write reads
//! back mid-way and `grow --continue` finishes it; bad input is refused
//! with nothing written; the kernel's md reads the grown array, and
//! finishes an array nvraid left mid-reshape.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Data bytes each member holds (15 MiB files less 1 MiB of metadata).
const PER: u64 = 14 * MIB;

/// A RAID `level` of `count` members of 15 MiB, no bitmap, named `name`,
/// filled with the pattern; the members' names and the bytes written.
fn filled_named(dir: &Path, level: &str, count: usize, name: &str) -> (Vec<String>, Vec<u8>) {
    filled_with(dir, level, count, name, "none")
}

/// As [`filled_named`], with `--bitmap bitmap` (`none` or `internal`).
fn filled_with(
    dir: &Path,
    level: &str,
    count: usize,
    name: &str,
    bitmap: &str,
) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", level, "--bitmap", bitmap, "--size", "15M", "--name", name,
    ];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let data_members = match level {
        "0" => count as u64,
        "1" => 1,
        "10" => count as u64 / 2,
        "6" => count as u64 - 2,
        _ => count as u64 - 1,
    };
    let data = pattern(data_members * PER);
    std::fs::write(dir.join("data"), &data).unwrap();
    let mut args = vec!["write", "--input", "data"];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, data)
}

fn filled(dir: &Path, level: &str, count: usize) -> (Vec<String>, Vec<u8>) {
    filled_named(dir, level, count, "grow")
}

#[test]
fn a_raid5_grows_from_4_to_5_members_and_every_byte_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = filled(dir.path(), "5", 4);
    let new = blank(dir.path(), "d4");
    let out = ok(
        &with(
            &["grow", "--raid-devices", "5", "--add", &new, "--json"],
            &m,
        ),
        dir.path(),
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(grown["raid_disks_before"], 4, "{grown}");
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_eq!(grown["size_bytes"], 4 * PER, "{grown}");
    // md's move: 256 KiB down from 1 MiB.
    assert_eq!(grown["data_offset_bytes"], 768 * 1024, "{grown}");
    m.push(new);
    let d: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), dir.path())).unwrap();
    assert_eq!(d["raid_disks"], 5, "{d}");
    assert_eq!(d["state"], "clean", "{d}");
    let got = read(dir.path(), &m, 4 * PER);
    assert!(got[..data.len()] == data[..], "the old bytes moved wrong");
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "the new space is not zeros"
    );
    let check = ok(&with(&["check", "--json"], &m), dir.path());
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
}

#[test]
fn a_raid6_grows_by_two_members_with_p_and_q_right() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = filled(dir.path(), "6", 4);
    let (a, b) = (blank(dir.path(), "d4"), blank(dir.path(), "d5"));
    ok(
        &with(
            &["grow", "-n", "6", "--add", &a, "--add", &b, "--step", "1M"],
            &m,
        ),
        dir.path(),
    );
    m.extend([a, b]);
    let got = read(dir.path(), &m, 4 * PER);
    assert!(got[..data.len()] == data[..]);
    let check = ok(&with(&["check", "--json"], &m), dir.path());
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    // Q is right too: with two members gone, the bytes come back.
    let degraded: Vec<String> = m[2..].to_vec();
    assert!(read(dir.path(), &degraded, data.len() as u64) == data);
}

#[test]
fn a_raid4_grows_from_3_to_4_members() {
    // Parity-last: the new member is a data member, the parity stays on
    // the last role of the new shape.
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = filled(dir.path(), "4", 3);
    let new = blank(dir.path(), "d3");
    ok(&with(&["grow", "-n", "4", "--add", &new], &m), dir.path());
    m.push(new);
    let d: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), dir.path())).unwrap();
    assert_eq!(d["layout"], "parity-last", "{d}");
    assert_eq!(d["size_bytes"], 3 * PER, "{d}");
    let got = read(dir.path(), &m, 3 * PER);
    assert!(got[..data.len()] == data[..]);
    ok(&with(&["check"], &m), dir.path());
}

/// Run `grow` with a crash point armed; it must die there.
fn grow_killed_at(dir: &Path, members: &[String], new: &str, point: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .env("NVRAID_FAILPOINT", point)
        .args(with(
            &["grow", "--raid-devices", "5", "--add", new, "--step", "1M"],
            members,
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("failpoint"),
        "grow did not stop at {point}: {stderr}"
    );
}

#[test]
fn a_grow_killed_at_any_write_reads_back_and_continues_from_its_record() {
    // Every member write of a step (5 members, then the flush) and every
    // superblock write, early and late in the reshape: after the crash the
    // array reads back every byte through the recorded position, and
    // `grow --continue` finishes it.
    let points = [
        "reshape-superblock:1", // the new member recorded, the old ones not
        "reshape-superblock:3",
        "reshape-superblock:5", // every member recorded, nothing moved
        "reshape-write:1",
        "reshape-write:3",
        "reshape-write:6", // a step written and flushed, not recorded
        "reshape-superblock:8",
        "reshape-write:40",
        "reshape-superblock:60",
        "reshape-write:200",
    ];
    for point in points {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, data) = filled(dir.path(), "5", 4);
        let new = blank(dir.path(), "d4");
        grow_killed_at(dir.path(), &m, &new, point);
        m.push(new);
        // The new member is recorded first.
        let examine = ok(&["examine", "d4"], dir.path());
        assert!(examine.contains("Reshape Pos'n"), "{point}: {examine}");
        // Readable mid-way when every member carries the record (a crash
        // inside the first record has members disagree; --continue mends it).
        if point != "reshape-superblock:1" && point != "reshape-superblock:3" {
            let got = read(dir.path(), &m, data.len() as u64);
            assert!(got == data, "{point}: the bytes read mid-reshape differ");
        }
        let out = ok(
            &with(&["grow", "--continue", "--step", "1M"], &m),
            dir.path(),
        );
        assert!(out.contains("to 5 members"), "{point}: {out}");
        let got = read(dir.path(), &m, 4 * PER);
        assert!(
            got[..data.len()] == data[..],
            "{point}: the bytes differ after --continue"
        );
        let check = ok(&with(&["check", "--json"], &m), dir.path());
        let check: serde_json::Value = serde_json::from_str(&check).unwrap();
        assert_eq!(check["mismatch_sectors"], 0, "{point}: {check}");
    }
}

/// The superblock events counter of member `name`.
fn events(dir: &Path, name: &str) -> u64 {
    let out = ok(&["examine", "--json", name], dir);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["superblock"]["events"].as_u64().unwrap()
}

#[test]
fn a_grow_killed_while_its_end_is_recorded_is_finished_by_continue() {
    // How many superblock writes a whole grow makes (5 for the record, 5 per
    // checkpoint, 5 for the end), from a run to the end; the same grow is
    // then killed after 3 of the 5 writes of its end: those members carry
    // the finished shape (the new data offset), the others the reshape.
    let scratch = tempfile::tempdir().unwrap();
    let (m, _) = filled(scratch.path(), "5", 4);
    let before = events(scratch.path(), "d0");
    let new = blank(scratch.path(), "d4");
    let out = ok(
        &with(
            &["grow", "-n", "5", "--add", &new, "--step", "1M", "--json"],
            &m,
        ),
        scratch.path(),
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    let writes = 5 * (grown["events"].as_u64().unwrap() - before);
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = filled(dir.path(), "5", 4);
    let new = blank(dir.path(), "d4");
    grow_killed_at(
        dir.path(),
        &m,
        &new,
        &format!("reshape-superblock:{}", writes - 2),
    );
    m.push(new);
    let d0 = ok(&["examine", "d0"], dir.path());
    let d4 = ok(&["examine", "d4"], dir.path());
    assert!(
        !d0.contains("Reshape Pos'n") && d0.contains("Data Offset : 1536"),
        "{d0}"
    );
    assert!(
        d4.contains("Reshape Pos'n") && d4.contains("Data Offset : 2048"),
        "{d4}"
    );
    ok(&with(&["grow", "--continue"], &m), dir.path());
    for name in &m {
        let e = ok(&["examine", name], dir.path());
        assert!(
            !e.contains("Reshape Pos'n") && e.contains("Data Offset : 1536"),
            "{e}"
        );
    }
    let got = read(dir.path(), &m, 4 * PER);
    assert!(got[..data.len()] == data[..]);
    ok(&with(&["check"], &m), dir.path());
}

#[test]
fn a_degraded_array_is_not_grown_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled(dir.path(), "5", 4);
    let new = blank(dir.path(), "d4");
    refused(
        &with(&["grow", "--raid-devices", "4", "--add", &new], &m[..3]),
        dir.path(),
        &["degraded", "role 3 is missing"],
    );
}

#[test]
fn a_new_member_too_small_or_carrying_a_signature_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled(dir.path(), "5", 4);
    let small = "small".to_string();
    std::fs::File::create(dir.path().join(&small))
        .unwrap()
        .set_len(8 * MIB)
        .unwrap();
    refused(
        &with(&["grow", "--raid-devices", "5", "--add", &small], &m),
        dir.path(),
        &["small", "too small"],
    );
    // A member of another array.
    ok(
        &["create", "--level", "1", "--size", "15M", "o0", "o1"],
        dir.path(),
    );
    refused(
        &with(&["grow", "--raid-devices", "5", "--add", "o1"], &m),
        dir.path(),
        &["o1", "already carries"],
    );
    // A count that does not match the members added.
    let new = blank(dir.path(), "d4");
    refused(
        &with(&["grow", "--raid-devices", "6", "--add", &new], &m),
        dir.path(),
        &["--raid-devices", "one --add per new member"],
    );
}

#[test]
fn a_second_reshape_while_one_is_recorded_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, _) = filled(dir.path(), "5", 4);
    let new = blank(dir.path(), "d4");
    grow_killed_at(dir.path(), &m, &new, "reshape-superblock:8");
    m.push(new);
    let more = blank(dir.path(), "d5");
    refused(
        &with(&["grow", "--raid-devices", "6", "--add", &more], &m),
        dir.path(),
        &["second reshape", "grow --continue"],
    );
}

#[test]
fn a_raid1_gains_a_mirror_that_holds_every_byte() {
    // md's `--grow --raid-devices 3 --add NEW` on a RAID 1: the member
    // count raised, the new member rebuilt; it alone then reads back the
    // whole array.
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = filled_with(dir.path(), "1", 2, "mirror", "internal");
    let new = blank(dir.path(), "d2");
    let out = ok(
        &with(&["grow", "-n", "3", "--add", &new, "--json"], &m),
        dir.path(),
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(grown["raid_disks_before"], 2, "{grown}");
    assert_eq!(grown["raid_disks"], 3, "{grown}");
    assert_eq!(grown["size_bytes"], PER, "{grown}");
    assert_eq!(grown["moved_bytes"], PER, "{grown}");
    m.push(new.clone());
    let d: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), dir.path())).unwrap();
    assert_eq!(d["raid_disks"], 3, "{d}");
    assert_eq!(d["state"], "clean", "{d}");
    assert_eq!(d["bitmap"]["dirty_chunks"], 0, "{d}");
    let alone = vec![new];
    assert!(
        read(dir.path(), &alone, PER) == data,
        "the new mirror differs"
    );
    let check = ok(&with(&["check", "--json"], &m), dir.path());
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
}

#[test]
fn a_raid10_near_grows_from_4_to_5_members_and_every_byte_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = filled_with(dir.path(), "10", 4, "r10", "none");
    assert_eq!(data.len() as u64, 2 * PER);
    let new = blank(dir.path(), "d4");
    let out = ok(
        &with(
            &["grow", "-n", "5", "--add", &new, "--step", "1M", "--json"],
            &m,
        ),
        dir.path(),
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(grown["size_bytes_before"], 2 * PER, "{grown}");
    // 5 members of 14 MiB, two copies: 35 MiB.
    assert_eq!(grown["size_bytes"], 5 * PER / 2, "{grown}");
    assert_eq!(grown["data_offset_bytes"], 768 * 1024, "{grown}");
    m.push(new);
    let got = read(dir.path(), &m, 5 * PER / 2);
    assert!(got[..data.len()] == data[..], "the old bytes moved wrong");
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "the new space is not zeros"
    );
    let check = ok(&with(&["check", "--json"], &m), dir.path());
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    // Both copies are right: without any one member every byte reads.
    for gone in 0..5 {
        let rest: Vec<String> = (0..5)
            .filter(|&i| i != gone)
            .map(|i| m[i].clone())
            .collect();
        assert!(
            read(dir.path(), &rest, data.len() as u64) == data,
            "without d{gone}: the copies differ"
        );
    }
}

#[test]
fn a_raid10_grow_killed_mid_way_reads_back_and_continues() {
    for point in [
        "reshape-superblock:5",
        "reshape-write:4",
        "reshape-write:20",
        "reshape-superblock:17",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, data) = filled_with(dir.path(), "10", 4, "r10", "none");
        let new = blank(dir.path(), "d4");
        grow_killed_at(dir.path(), &m, &new, point);
        m.push(new);
        let got = read(dir.path(), &m, data.len() as u64);
        assert!(got == data, "{point}: the bytes read mid-reshape differ");
        ok(
            &with(&["grow", "--continue", "--step", "1M"], &m),
            dir.path(),
        );
        let got = read(dir.path(), &m, 5 * PER / 2);
        assert!(
            got[..data.len()] == data[..],
            "{point}: the bytes differ after --continue"
        );
        let check = ok(&with(&["check", "--json"], &m), dir.path());
        let check: serde_json::Value = serde_json::from_str(&check).unwrap();
        assert_eq!(check["mismatch_sectors"], 0, "{point}: {check}");
    }
}

#[test]
fn a_raid0_and_a_far_raid10_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let new = blank(dir.path(), "n0");
    let (m, _) = filled_with(dir.path(), "0", 2, "stripes", "none");
    // A RAID 0 grows (tests/takeover.rs); a count that does not match the
    // members added is refused.
    refused(
        &with(&["grow", "-n", "4", "--add", &new], &m),
        dir.path(),
        &["--raid-devices", "one --add per new member"],
    );
    let dir = tempfile::tempdir().unwrap();
    let new = blank(dir.path(), "n0");
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    ok(
        &with(
            &[
                "create", "--level", "10", "--layout", "f2", "--bitmap", "none", "--size", "15M",
            ],
            &names,
        ),
        dir.path(),
    );
    refused(
        &with(&["grow", "-n", "5", "--add", &new], &names),
        dir.path(),
        &["md reshapes only the near layout"],
    );
}

#[test]
fn a_raid5_parity_last_becomes_md_raid4_and_back_with_no_byte_moved() {
    // md's takeover: RAID 4 and RAID 5 parity-last put every byte at the
    // same place; only the superblocks change. (nvraid's own RAID 4 is md
    // level 5 with the parity-last layout; mdadm's is level 4.)
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled_with(dir.path(), "4", 3, "takeover", "internal");
    let images = |dir: &Path| -> Vec<Vec<u8>> {
        m.iter()
            .map(|name| std::fs::read(dir.join(name)).unwrap()[1 << 20..].to_vec())
            .collect()
    };
    let levels = |dir: &Path| -> Vec<String> {
        m.iter()
            .map(|name| {
                let e = ok(&["examine", name], dir);
                e.lines()
                    .find(|l| l.contains("Raid Level"))
                    .unwrap()
                    .trim()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(levels(dir.path()), vec!["Raid Level : raid5"; 3]);
    let before = images(dir.path());
    let out = ok(&with(&["grow", "--level", "4", "--json"], &m), dir.path());
    let changed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(changed["md_level_before"], 5, "{changed}");
    assert_eq!(changed["md_level"], 4, "{changed}");
    assert_eq!(levels(dir.path()), vec!["Raid Level : raid4"; 3]);
    let d: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), dir.path())).unwrap();
    assert_eq!(d["layout"], "parity-last", "{d}");
    assert_eq!(d["state"], "clean", "{d}");
    assert_eq!(d["bitmap"]["dirty_chunks"], 0, "{d}");
    assert!(images(dir.path()) == before, "a data byte moved");
    assert!(read(dir.path(), &m, data.len() as u64) == data);
    ok(&with(&["grow", "--level", "5"], &m), dir.path());
    assert_eq!(levels(dir.path()), vec!["Raid Level : raid5"; 3]);
    let d: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), dir.path())).unwrap();
    assert_eq!(d["layout"], "parity-last", "{d}");
    assert_eq!(d["bitmap"]["dirty_chunks"], 0, "{d}");
    assert!(images(dir.path()) == before, "a data byte moved");
}

#[test]
fn level_changes_md_makes_otherwise_are_refused_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled_with(dir.path(), "5", 3, "r5", "internal");
    refused(
        &with(&["grow", "--level", "4"], &m),
        dir.path(),
        &["parity-last layout"],
    );
    refused(
        &with(&["grow", "--level", "6"], &m),
        dir.path(),
        &["without a member for Q", "--raid-devices 4 --add NEW"],
    );
    refused(
        &with(&["grow", "--level", "1"], &m),
        dir.path(),
        &["only with two members"],
    );
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled_with(dir.path(), "1", 3, "r1", "internal");
    refused(
        &with(&["grow", "--level", "5"], &m),
        dir.path(),
        &["RAID 1 of 3 members", "exactly two members"],
    );
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled_with(dir.path(), "0", 2, "r0", "none");
    refused(
        &with(&["grow", "--level", "10"], &m),
        dir.path(),
        &["member 2i"],
    );
}

#[test]
fn the_kernel_assembles_as_raid4_what_nvraid_took_over_from_raid5_parity_last() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled_with(dir.path(), "4", 3, "takeover", "internal");
    ok(&with(&["grow", "--level", "4"], &m), dir.path());
    let images: Vec<PathBuf> = m.iter().map(|name| dir.path().join(name)).collect();
    let report = kernel_finishes(&images, 2 * PER);
    assert!(
        report.contains("ASSEMBLED 0") && report.contains("STALE_BITMAPS 0"),
        "md resynced or found a bitmap out of date:\n{report}"
    );
    let line = report
        .lines()
        .find(|l| l.starts_with("KERNEL "))
        .unwrap_or_else(|| panic!("no array assembled:\n{report}"));
    assert!(
        line.contains("level=raid4")
            && line.contains("disks=3")
            && line.contains(&format!("size={}", 2 * PER))
            && line.contains("pattern=ok")
            && line.contains("mismatch=0"),
        "{line}\n{report}"
    );
}

#[test]
fn a_mirror_grow_killed_while_the_count_is_written_is_finished_by_running_it_again() {
    // Killed after the first member recorded the new count (the members
    // then disagree, one event apart) and after both did (a degraded RAID 1
    // of three): the same command finishes either, and the new mirror alone
    // reads back the array.
    for point in ["reshape-superblock:1", "reshape-superblock:2"] {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, data) = filled_with(dir.path(), "1", 2, "mirror", "internal");
        let new = blank(dir.path(), "d2");
        let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
            .current_dir(dir.path())
            .env("NVRAID_FAILPOINT", point)
            .args(with(&["grow", "-n", "3", "--add", &new], &m))
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("failpoint"),
            "{point}: grow did not stop there"
        );
        ok(&with(&["grow", "-n", "3", "--add", &new], &m), dir.path());
        m.push(new.clone());
        let d: serde_json::Value =
            serde_json::from_str(&ok(&with(&["detail", "--json"], &m), dir.path())).unwrap();
        assert_eq!(d["raid_disks"], 3, "{point}: {d}");
        assert_eq!(d["state"], "clean", "{point}: {d}");
        assert_eq!(d["bitmap"]["dirty_chunks"], 0, "{point}: {d}");
        assert!(
            read(dir.path(), &[new], PER) == data,
            "{point}: the new mirror differs"
        );
    }
    // A RAID 1 already whole at the count asked: refused, nothing written.
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled_with(dir.path(), "1", 2, "mirror", "internal");
    let new = blank(dir.path(), "d2");
    refused(
        &with(&["grow", "-n", "2", "--add", &new], &m),
        dir.path(),
        &["--raid-devices", "one --add per new member"],
    );
}

/// The array's bitmap as `detail --json` shows it.
fn bitmap_of(dir: &Path, members: &[String]) -> serde_json::Value {
    let d: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], members), dir)).unwrap();
    d["bitmap"].clone()
}

#[test]
fn a_raid5_with_a_bitmap_grows_and_keeps_its_bitmap_believed() {
    // md grows a RAID 5 keeping its bitmap (its bits count member rows,
    // which adding members does not change). The new member gets the
    // bitmap, and every member's bitmap header keeps up with its
    // superblock's events: a header left behind is taken as all dirty.
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = filled_with(dir.path(), "5", 4, "grow", "internal");
    let before = bitmap_of(dir.path(), &m);
    assert!(before["chunks"].as_u64().unwrap() > 0, "{before}");
    assert_eq!(before["dirty_chunks"], 0, "{before}");
    let new = blank(dir.path(), "d4");
    ok(
        &with(&["grow", "-n", "5", "--add", &new, "--step", "1M"], &m),
        dir.path(),
    );
    m.push(new);
    // `detail` reads every member's bitmap (the new one's included: one
    // without it, or with a header older than its superblock, would show
    // as refused or all dirty).
    let after = bitmap_of(dir.path(), &m);
    assert_eq!(after, before, "the bitmap changed in the grow");
    let got = read(dir.path(), &m, 4 * PER);
    assert!(got[..data.len()] == data[..], "the old bytes moved wrong");
    let check = ok(&with(&["check", "--json"], &m), dir.path());
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
}

#[test]
fn a_bitmap_grow_killed_mid_way_continues_with_its_bitmap_believed() {
    for point in [
        "reshape-superblock:1",
        "reshape-superblock:2",
        "reshape-write:3",
        "reshape-superblock:12",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, data) = filled_with(dir.path(), "5", 4, "grow", "internal");
        let before = bitmap_of(dir.path(), &m);
        let new = blank(dir.path(), "d4");
        grow_killed_at(dir.path(), &m, &new, point);
        m.push(new);
        ok(
            &with(&["grow", "--continue", "--step", "1M"], &m),
            dir.path(),
        );
        let after = bitmap_of(dir.path(), &m);
        assert_eq!(after, before, "{point}: the bitmap changed in the grow");
        let got = read(dir.path(), &m, 4 * PER);
        assert!(got[..data.len()] == data[..], "{point}: the bytes differ");
        ok(&with(&["check"], &m), dir.path());
    }
}

#[test]
fn the_kernel_reads_a_grown_array_and_finishes_one_nvraid_left_mid_reshape() {
    let dir = tempfile::tempdir().unwrap();
    // One grown to the end (which also counts the superblock writes of a
    // whole grow); then three killed part-way: with the record written and
    // nothing moved (position 0), early (a step recorded, the next written
    // and not recorded), and late (a checkpoint past the old shape's end,
    // in the rows md fills with zeros, half written).
    let mut images = Vec::new();
    let mut add = |name: &str, point: Option<String>| -> Option<u64> {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (mut m, _) = filled_named(&sub, "5", 4, name);
        let before = events(&sub, "d0");
        let new = blank(&sub, "d4");
        let writes = match point {
            None => {
                let out = ok(
                    &with(
                        &["grow", "-n", "5", "--add", &new, "--step", "1M", "--json"],
                        &m,
                    ),
                    &sub,
                );
                let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
                Some(5 * (grown["events"].as_u64().unwrap() - before))
            }
            Some(point) => {
                grow_killed_at(&sub, &m, &new, &point);
                None
            }
        };
        m.push(new);
        images.extend(m.iter().map(|name| sub.join(name)));
        writes
    };
    let writes = add("done", None).unwrap();
    add("start", Some("reshape-superblock:5".into()));
    add("early", Some("reshape-write:30".into()));
    add(
        "late",
        Some(format!("reshape-superblock:{}", writes - 5 - 2)),
    );
    let report = kernel_finishes(&images, 3 * PER);
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 4, "four arrays expected:\n{report}");
    for line in lines {
        assert!(
            line.contains("disks=5")
                && line.contains(&format!("size={}", 4 * PER))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("offset=1536,"),
            "{line}\n{report}"
        );
    }
}

#[test]
fn the_kernel_assembles_a_grown_bitmap_array_clean_and_finishes_one_left_mid_grow() {
    // RAID 5 arrays with md's internal bitmap: one grown by nvraid to the
    // end, one killed early in the grow (a step recorded, the next written
    // and not recorded). md assembles both without a resync (every
    // bitmap header is as fresh as its superblock: md forces a full
    // resync of a bitmap it finds out of date), keeps the bitmap where it
    // was, finishes the second, reads the pattern, finds no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, point) in [("bdone", None), ("bearly", Some("reshape-write:30"))] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (mut m, _) = filled_with(&sub, "5", 4, name, "internal");
        let new = blank(&sub, "d4");
        match point {
            None => {
                ok(
                    &with(&["grow", "-n", "5", "--add", &new, "--step", "1M"], &m),
                    &sub,
                );
            }
            Some(point) => grow_killed_at(&sub, &m, &new, point),
        }
        m.push(new);
        images.extend(m.iter().map(|name| sub.join(name)));
    }
    let report = kernel_finishes(&images, 3 * PER);
    assert!(
        report.contains("ASSEMBLED 0"),
        "md resynced or recovered on assembly:\n{report}"
    );
    assert!(
        report.contains("STALE_BITMAPS 0"),
        "md found a bitmap out of date:\n{report}"
    );
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 2, "two arrays expected:\n{report}");
    for line in lines {
        assert!(
            line.contains("disks=5")
                && line.contains(&format!("size={}", 4 * PER))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("offset=1536,")
                && line.contains("bitmap=+8"),
            "{line}\n{report}"
        );
    }
}

#[test]
fn the_kernel_reads_a_raid1_nvraid_gave_a_mirror() {
    // md assembles the widened RAID 1 whole (three members, none
    // recovering), reads the pattern, finds no mismatch between the copies.
    let dir = tempfile::tempdir().unwrap();
    let (mut m, _) = filled_with(dir.path(), "1", 2, "mirror", "internal");
    let new = blank(dir.path(), "d2");
    ok(&with(&["grow", "-n", "3", "--add", &new], &m), dir.path());
    m.push(new);
    let images: Vec<PathBuf> = m.iter().map(|name| dir.path().join(name)).collect();
    let report = kernel_finishes(&images, PER);
    assert!(
        report.contains("ASSEMBLED 0") && report.contains("STALE_BITMAPS 0"),
        "md recovered, resynced or found a bitmap out of date:\n{report}"
    );
    let line = report
        .lines()
        .find(|l| l.starts_with("KERNEL "))
        .unwrap_or_else(|| panic!("no array assembled:\n{report}"));
    assert!(
        line.contains("disks=3")
            && line.contains(&format!("size={PER}"))
            && line.contains("pattern=ok")
            && line.contains("mismatch=0")
            && line.contains("bitmap=+8"),
        "{line}\n{report}"
    );
}

#[test]
fn the_kernel_reads_a_raid10_nvraid_grew_and_finishes_one_left_mid_grow() {
    // RAID 10 near=2 from 4 to 5 members: one grown to the end, one killed
    // early (a step recorded, the next written and not recorded), one late
    // (at 32 MiB of 35, past the old shape's end of 28 MiB). md assembles
    // all three, finishes the two,
    // reads the pattern and finds the copies equal.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, point) in [
        ("tdone", None),
        ("tearly", Some("reshape-write:20")),
        ("tlate", Some("reshape-superblock:170")),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (mut m, _) = filled_with(&sub, "10", 4, name, "none");
        let new = blank(&sub, "d4");
        match point {
            None => {
                ok(
                    &with(&["grow", "-n", "5", "--add", &new, "--step", "1M"], &m),
                    &sub,
                );
            }
            Some(point) => grow_killed_at(&sub, &m, &new, point),
        }
        m.push(new);
        images.extend(m.iter().map(|name| sub.join(name)));
    }
    let report = kernel_finishes(&images, 2 * PER);
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 3, "three arrays expected:\n{report}");
    for line in lines {
        assert!(
            line.contains("disks=5")
                && line.contains(&format!("size={}", 5 * PER / 2))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("offset=1536,"),
            "{line}\n{report}"
        );
    }
}

/// A RAID 10 near of 4 members of 15 MiB with md's internal bitmap of
/// 4 KiB chunks (28 MiB: 7168 bits, 1152 bytes with the header, so three
/// sectors), filled with the pattern.
fn raid10_with_small_bitmap(dir: &Path, name: &str) -> (Vec<String>, Vec<u8>) {
    raid10_with_bitmap(dir, name, "4K")
}

/// A RAID 10 near of 4 members of 15 MiB, a bitmap of `chunk` chunks, the
/// pattern over its 30 MiB.
fn raid10_with_bitmap(dir: &Path, name: &str, chunk: &str) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    ok(
        &with(
            &[
                "create",
                "--level",
                "10",
                "--bitmap",
                "internal",
                "--bitmap-chunk",
                chunk,
                "--size",
                "15M",
                "--name",
                name,
            ],
            &names,
        ),
        dir,
    );
    let data = pattern(2 * PER);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, data)
}

#[test]
fn a_raid10_with_a_bitmap_grows_and_its_bitmap_is_resized_as_md_resizes_it() {
    // A RAID 10's bits count array bytes, so md resizes its bitmap for
    // the larger array when the grow starts: the chunk kept while the
    // bits fit in the sectors the bitmap had (4 -> 5 members: 8960 bits,
    // 1376 bytes, still three sectors), doubled otherwise (4 -> 6: 10752
    // bits of 4 KiB would take 1600 bytes, so 8 KiB chunks, 5376 bits).
    for (count, chunk) in [(5usize, 4096u64), (6, 8192)] {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, data) = raid10_with_small_bitmap(dir.path(), "r10bm");
        let before = bitmap_of(dir.path(), &m);
        assert_eq!(before["chunk_bytes"], 4096, "{before}");
        let mut args = vec!["grow".to_string(), "-n".into(), count.to_string()];
        let new: Vec<String> = (4..count)
            .map(|i| blank(dir.path(), &format!("d{i}")))
            .collect();
        for n in &new {
            args.push("--add".into());
            args.push(n.clone());
        }
        args.extend(["--step".into(), "1M".into()]);
        args.extend(m.iter().cloned());
        ok(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            dir.path(),
        );
        m.extend(new);
        let size = count as u64 * PER / 2;
        let after = bitmap_of(dir.path(), &m);
        assert_eq!(after["chunk_bytes"], chunk, "{count} members: {after}");
        assert_eq!(after["chunks"], size / chunk, "{count} members: {after}");
        assert_eq!(after["dirty_chunks"], 0, "{count} members: {after}");
        let got = read(dir.path(), &m, size);
        assert!(
            got[..data.len()] == data[..],
            "{count} members: the old bytes moved wrong"
        );
        assert!(
            got[data.len()..].iter().all(|&b| b == 0),
            "{count} members: the new space"
        );
        let check = ok(&with(&["check", "--json"], &m), dir.path());
        let check: serde_json::Value = serde_json::from_str(&check).unwrap();
        assert_eq!(check["mismatch_sectors"], 0, "{count} members: {check}");
    }
}

#[test]
fn a_raid10_bitmap_grow_killed_mid_way_continues_with_its_bitmap_resized() {
    // Killed while the resized bitmap and the record are written, and in
    // the steps: the bitmap was resized before any superblock recorded the
    // reshape, so whatever the crash left reads, and `--continue` finishes
    // with md's resized bitmap (8 KiB chunks over 6 members' 42 MiB).
    // (Not between the two new members' superblocks: `--continue` needs
    // every member to carry one.)
    for point in [
        "reshape-superblock:2",
        "reshape-superblock:4",
        "reshape-write:5",
        "reshape-superblock:20",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, data) = raid10_with_small_bitmap(dir.path(), "r10bm");
        let d4 = blank(dir.path(), "d4");
        let d5 = blank(dir.path(), "d5");
        let mut args = vec![
            "grow", "-n", "6", "--add", &d4, "--add", &d5, "--step", "1M",
        ];
        args.extend(m.iter().map(String::as_str));
        let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
            .args(&args)
            .current_dir(dir.path())
            .env("NVRAID_FAILPOINT", point)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{point}: the grow was not stopped");
        m.push(d4);
        m.push(d5);
        ok(
            &with(&["grow", "--continue", "--step", "1M"], &m),
            dir.path(),
        );
        let after = bitmap_of(dir.path(), &m);
        assert_eq!(after["chunk_bytes"], 8192, "{point}: {after}");
        assert_eq!(after["chunks"], 3 * PER / 8192, "{point}: {after}");
        let got = read(dir.path(), &m, 3 * PER);
        assert!(got[..data.len()] == data[..], "{point}: the bytes differ");
        let check = ok(&with(&["check", "--json"], &m), dir.path());
        let check: serde_json::Value = serde_json::from_str(&check).unwrap();
        assert_eq!(check["mismatch_sectors"], 0, "{point}: {check}");
    }
}

#[test]
fn the_kernel_assembles_a_grown_bitmap_raid10_clean_and_finishes_one_left_mid_grow() {
    // RAID 10 near with md's bitmap of 4 KiB chunks, grown by nvraid from
    // 4 to 6 members (the chunk doubled to 8 KiB, as md doubles it): one
    // to the end, one killed mid-way. md assembles both without a resync
    // and with no bitmap out of date, keeps the bitmap's place and the
    // doubled chunk, finishes the second, reads the pattern, finds the
    // copies equal.
    //
    // And one with md's default bitmap chunk (64 MiB: one chunk holds the
    // old end and the new region) killed before its first step: md
    // finishing it resyncs the new region by its bits, which nvraid set
    // on disk (md marks it only in its memory when it resizes the bitmap
    // itself); without them its copies differed (mismatch 8704).
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, point, chunk) in [
        ("rdone", None, "4K"),
        ("rmid", Some("reshape-write:30"), "4K"),
        ("rbig", Some("reshape-superblock:6"), "64M"),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (mut m, _) = raid10_with_bitmap(&sub, name, chunk);
        let d4 = blank(&sub, "d4");
        let d5 = blank(&sub, "d5");
        let mut args = vec![
            "grow", "-n", "6", "--add", &d4, "--add", &d5, "--step", "1M",
        ];
        args.extend(m.iter().map(String::as_str));
        match point {
            None => {
                ok(&args, &sub);
            }
            Some(point) => {
                let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
                    .args(&args)
                    .current_dir(&sub)
                    .env("NVRAID_FAILPOINT", point)
                    .output()
                    .unwrap();
                assert!(!out.status.success(), "{point}: the grow was not stopped");
                let d = ok(
                    &with(
                        &["detail", "--json"],
                        &[m.clone(), vec![d4.clone(), d5.clone()]].concat(),
                    ),
                    &sub,
                );
                assert!(d.contains("reshaping"), "not left mid-grow: {d}");
            }
        }
        m.push(d4);
        m.push(d5);
        images.extend(m.iter().map(|name| sub.join(name)));
    }
    let report = kernel_finishes(&images, 2 * PER);
    assert!(
        report.contains("ASSEMBLED 0"),
        "md resynced or recovered on assembly:\n{report}"
    );
    assert!(
        report.contains("STALE_BITMAPS 0"),
        "md found a bitmap out of date:\n{report}"
    );
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 3, "three arrays expected:\n{report}");
    let big = lines
        .iter()
        .filter(|l| l.contains("bchunk=67108864"))
        .count();
    assert_eq!(big, 1, "one array with 64 MiB bitmap chunks:\n{report}");
    for line in lines {
        assert!(
            line.contains("disks=6")
                && line.contains(&format!("size={}", 3 * PER))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("bitmap=+8")
                && (line.contains("bchunk=8192") || line.contains("bchunk=67108864")),
            "{line}\n{report}"
        );
    }
}

/// A new blank member of 16 MiB named `name`.
fn blank(dir: &Path, name: &str) -> String {
    blank_mib(dir, name, 16)
}
