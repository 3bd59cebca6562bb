//! `nvraid grow` on a bad day and md's level changes (docs/reshape.md):
//! a member failing in the middle of an offline grow is recorded failed
//! on the others and the RAID 5 grows on degraded (md's rule), a grow is
//! continued with a member missing, and what md cannot continue is
//! refused with nothing written. The kernel's md assembles what nvraid
//! left and reads the same bytes.

mod common;

use common::reshape::*;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Data bytes each member holds (15 MiB files less 1 MiB of metadata).
const PER: u64 = 14 * MIB;

/// A RAID `level` of `count` members `d0..` of 15 MiB without a bitmap,
/// named `name`, filled with the pattern; the members and the bytes.
fn filled(dir: &Path, level: &str, count: usize, name: &str) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", level, "--bitmap", "none", "--size", "15M", "--name", name,
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

/// Grow the array on `members` (`failing`'s member among them, reached
/// through it) by `new` to `n` members, and make `failing` fail once the
/// reshape has moved some bytes; whether the grow succeeded, its stdout
/// and its stderr.
fn grow_with_a_failure(
    dir: &Path,
    members: &[String],
    new: &str,
    n: &str,
    failing: &FailingNode,
) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .args(with(
            &["grow", "-n", n, "--add", new, "--step", "1M"],
            members,
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut failed_at = None;
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        // The first progress line past 0% (about a second in): fail it.
        if failed_at.is_none() && line.starts_with("reshape:") && !line.contains(" 0.0%") {
            assert!(!line.contains("100.0%"), "the grow ended too soon: {line}");
            failing.fail();
            failed_at = Some(line.clone());
        }
        seen.push(line);
    }
    let out = child.wait_with_output().unwrap();
    assert!(failed_at.is_some(), "no progress seen: {}", seen.join("\n"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        seen.join("\n"),
    )
}

/// [`grow_with_a_failure`] of a RAID 5 to 5 members: it must finish,
/// degraded; its stdout.
fn grow_while_failing(dir: &Path, members: &[String], new: &str, failing: &FailingNode) -> String {
    let (success, stdout, stderr) = grow_with_a_failure(dir, members, new, "5", failing);
    assert!(
        success,
        "the grow did not go on degraded: {stderr}\n{stdout}"
    );
    stdout
}

#[test]
fn a_member_failing_mid_grow_is_recorded_failed_and_the_raid5_grows_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, data) = filled(d, "5", 4, "failing");
    let new = blank(d, "d4");
    // d1 (an old member, whose chunks the steps then rebuild from parity)
    // fails part-way through.
    let node = FailingNode::slow(d, "d1");
    let through: Vec<String> = vec![m[0].clone(), node.uri(), m[2].clone(), m[3].clone()];
    let out = grow_while_failing(d, &through, &new, &node);
    assert!(
        out.contains("grown from 4 to 5 members") && out.contains("failed") && out.contains("d1"),
        "{out}"
    );
    drop(node);
    let all: Vec<String> = vec!["d0", "d1", "d2", "d3", "d4"]
        .into_iter()
        .map(String::from)
        .collect();
    // The others record d1 faulty; d1 itself is stale mid-reshape.
    let examine: serde_json::Value =
        serde_json::from_str(&ok(&["examine", "--json", "d0"], d)).unwrap();
    let features = examine[0]["superblock"]["feature_map"].as_u64().unwrap();
    assert_eq!(features & 4, 0, "d0 still records a reshape: {examine}");
    let survivors: Vec<String> = vec!["d0", "d2", "d3", "d4"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_degraded_holds(d, &survivors, 5, &data, 4 * PER);
    // With the stale d1 given too, nvraid refuses it by name and reads
    // nothing (md leaves it out: the others record it failed).
    let said = refusal(&with(&["read", "--length", "4096"], &all), d);
    assert!(said.contains("d1"), "{said}");
    // A blank member rebuilt into the missing role: every row's parity
    // agrees with its data, which reads back the same.
    let spare = blank(d, "d5");
    ok(&with(&["add", "--new", &spare], &survivors), d);
    let mut whole = survivors.clone();
    whole.push(spare);
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], &whole), d)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    let got = read(d, &whole, 4 * PER);
    assert!(
        got[..data.len()] == data[..],
        "the bytes differ after the rebuild"
    );
}

/// Run `grow` by `add` with a crash point armed; it must die there.
fn grow_killed_at(dir: &Path, members: &[String], add: &[String], point: &str) {
    let n = (members.len() + add.len()).to_string();
    let mut args = vec!["grow", "-n", &n, "--step", "1M"];
    for a in add {
        args.extend(["--add", a.as_str()]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .env("NVRAID_FAILPOINT", point)
        .args(with(&args, members))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("failpoint"),
        "grow did not stop at {point}: {stderr}"
    );
}

/// A RAID `level` of `count` members grown by `add` new ones, killed
/// mid-way, continued without the members `missing`: the array that is
/// left (degraded) reads back; its members, all of them.
fn continued_without(
    dir: &Path,
    level: &str,
    count: usize,
    add: usize,
    missing: &[&str],
) -> Vec<String> {
    let (m, data) = filled(dir, level, count, &format!("cont{level}"));
    let new: Vec<String> = (count..count + add)
        .map(|i| blank(dir, &format!("d{i}")))
        .collect();
    grow_killed_at(dir, &m, &new, "reshape-write:40");
    let all: Vec<String> = m.iter().chain(&new).cloned().collect();
    let given: Vec<String> = all
        .iter()
        .filter(|n| !missing.contains(&n.as_str()))
        .cloned()
        .collect();
    let out = ok(&with(&["grow", "--continue", "--step", "1M"], &given), dir);
    assert!(
        out.contains(&format!("to {} members", count + add)) && out.contains("degraded"),
        "{level}: {out}"
    );
    let got = read(dir, &given, data.len() as u64);
    assert!(
        got == data,
        "RAID {level}: the bytes differ after a degraded --continue"
    );
    all
}

#[test]
fn a_grow_killed_mid_way_is_continued_with_members_missing_where_the_level_covers_them() {
    // RAID 5 without an old member (its chunks rebuilt from parity),
    // RAID 6 without two, RAID 10 near without one copy of a pair.
    for (level, count, add, missing) in [
        ("5", 4, 1, vec!["d1"]),
        ("6", 5, 1, vec!["d0", "d3"]),
        ("10", 4, 1, vec!["d2"]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        continued_without(dir.path(), level, count, add, &missing);
    }
}

#[test]
fn a_grow_is_not_continued_without_members_the_level_cannot_spare() {
    // A RAID 5 without two members, a RAID 10 without both copies of a
    // pair: refused naming the roles, nothing written.
    for (level, count, missing) in [("5", 4, vec!["d1", "d4"]), ("10", 4, vec!["d0", "d1"])] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, _) = filled(d, level, count, "short");
        let new = vec![blank(d, &format!("d{count}"))];
        grow_killed_at(d, &m, &new, "reshape-write:40");
        let given: Vec<String> = m
            .iter()
            .chain(&new)
            .filter(|n| !missing.contains(&n.as_str()))
            .cloned()
            .collect();
        refused(
            &with(&["grow", "--continue"], &given),
            d,
            &["missing", "do not hold every byte"],
        );
    }
}

#[test]
fn the_kernel_assembles_degraded_what_nvraid_grew_with_a_member_failing_or_missing() {
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    // A RAID 5 whose d1 failed part-way through the grow (all five
    // images given: the stale d1 must be left out by md too).
    let sub = dir.path().join("failing");
    std::fs::create_dir(&sub).unwrap();
    let (m, _) = filled(&sub, "5", 4, "failing");
    let new = blank(&sub, "d4");
    {
        let node = FailingNode::slow(&sub, "d1");
        let through: Vec<String> = vec![m[0].clone(), node.uri(), m[2].clone(), m[3].clone()];
        grow_while_failing(&sub, &through, &new, &node);
    }
    images.extend((0..5).map(|i| sub.join(format!("d{i}"))));
    // Grows killed mid-way and continued without members.
    for (level, count, missing) in [("5", 4, vec!["d1"]), ("6", 5, vec!["d0", "d3"])] {
        let sub = dir.path().join(format!("cont{level}"));
        std::fs::create_dir(&sub).unwrap();
        let all = continued_without(&sub, level, count, 1, &missing);
        images.extend(all.iter().map(|n| sub.join(n)));
    }
    let report = kernel_reports(
        &images,
        &[("failing", 3 * PER), ("cont5", 3 * PER), ("cont6", 3 * PER)],
    );
    for (name, level, disks, degraded, size) in [
        ("failing", "raid5", 5, 1, 4 * PER),
        ("cont5", "raid5", 5, 1, 4 * PER),
        ("cont6", "raid6", 6, 2, 4 * PER),
    ] {
        let line = kernel_line(&report, name);
        assert!(
            line.contains(&format!("level={level} "))
                && line.contains(&format!("disks={disks} "))
                && line.contains(&format!("degraded={degraded} "))
                && line.contains(&format!("size={size} "))
                && line.contains("pattern=ok"),
            "{line}\n{report}"
        );
    }
}

#[test]
fn a_raid0_grows_through_md_raid4_and_is_a_raid0_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut m, data) = filled(d, "0", 3, "r0");
    let new = blank(d, "d3");
    let out = ok(
        &with(
            &["grow", "-n", "4", "--add", &new, "--step", "1M", "--json"],
            &m,
        ),
        d,
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(grown["raid_disks_before"], 3, "{grown}");
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    assert_eq!(grown["size_bytes"], 4 * PER, "{grown}");
    assert_eq!(grown["failed"].as_array().unwrap().len(), 0, "{grown}");
    m.push(new);
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), d)).unwrap();
    assert_eq!(detail["level"], 0, "{detail}");
    assert_eq!(detail["raid_disks"], 4, "{detail}");
    assert_eq!(detail["size_bytes"], 4 * PER, "{detail}");
    let got = read(d, &m, 4 * PER);
    assert!(
        got[..data.len()] == data[..],
        "the RAID 0's bytes moved wrong"
    );
    for name in &m {
        let e: serde_json::Value =
            serde_json::from_str(&ok(&["examine", "--json", name], d)).unwrap();
        let sb = &e[0]["superblock"];
        assert_eq!(sb["level"], 0, "{name}: {sb}");
        assert_eq!(
            sb["feature_map"].as_u64().unwrap() & (4 | 2),
            0,
            "{name}: {sb}"
        );
    }
}

#[test]
fn a_raid0_grow_killed_at_any_write_is_continued_to_a_raid0() {
    // The record (new member first), a step's member writes and flush, a
    // checkpoint, late steps, the end: `grow --continue` finishes each
    // as a RAID 0 of four holding every byte.
    for point in [
        "reshape-superblock:1",
        "reshape-superblock:4", // every member recorded, nothing moved
        "reshape-write:2",
        "reshape-write:4", // a step written and flushed, not recorded
        "reshape-superblock:9",
        "reshape-write:150",
        "reshape-superblock:200",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (mut m, data) = filled(d, "0", 3, "r0k");
        let new = blank(d, "d3");
        grow_killed_at(d, &m, std::slice::from_ref(&new), point);
        m.push(new);
        let e: serde_json::Value =
            serde_json::from_str(&ok(&["examine", "--json", "d3"], d)).unwrap();
        assert_eq!(e[0]["superblock"]["level"], 4, "{point}: md's RAID 4: {e}");
        let out = ok(&with(&["grow", "--continue", "--step", "1M"], &m), d);
        assert!(out.contains("to 4 members"), "{point}: {out}");
        let detail: serde_json::Value =
            serde_json::from_str(&ok(&with(&["detail", "--json"], &m), d)).unwrap();
        assert_eq!(detail["level"], 0, "{point}: {detail}");
        assert_eq!(detail["size_bytes"], 4 * PER, "{point}: {detail}");
        let got = read(d, &m, 4 * PER);
        assert!(got[..data.len()] == data[..], "{point}: the bytes differ");
    }
}

/// Decompress the kernel-made state `state` (tests/fixtures/md-states)
/// into `dir`; the member file names, by disk.
fn unpack(state: &str, dir: &Path) -> Vec<String> {
    let src = repo().join("tests/fixtures/md-states").join(state);
    let mut names = Vec::new();
    for disk in 0.. {
        let xz = src.join(format!("disk{disk}.img.xz"));
        if !xz.exists() {
            break;
        }
        let out = Command::new("xz").arg("-dc").arg(&xz).output().expect("xz");
        assert!(out.status.success(), "xz -dc {}", xz.display());
        let name = format!("d{disk}");
        std::fs::write(dir.join(&name), out.stdout).unwrap();
        names.push(name);
    }
    assert!(!names.is_empty(), "no members in {}", src.display());
    names
}

#[test]
fn nvraid_finishes_the_kernels_raid0_grow_as_a_raid0() {
    // The kernel's RAID 0 of 3 growing to 4 (mdadm's RAID 4 of 5, parity
    // role missing), stopped at 6 MiB: `grow --continue` finishes it and
    // takes it back to RAID 0, the kernel's 45 MiB read back, the new
    // space zeros.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = unpack("reshape_r0_grow", d);
    let grown: serde_json::Value =
        serde_json::from_str(&ok(&with(&["grow", "--continue", "--json"], &m), d)).unwrap();
    assert_eq!(grown["raid_disks_before"], 3, "{grown}");
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    assert_eq!(grown["size_bytes"], 60 * MIB, "{grown}");
    assert_eq!(grown["data_offset_bytes"], 1536 * 512, "{grown}");
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), d)).unwrap();
    assert_eq!(detail["level"], 0, "{detail}");
    assert_eq!(detail["raid_disks"], 4, "{detail}");
    let all = read(d, &m, 60 * MIB);
    let kernel = std::fs::read_to_string(
        repo().join("tests/fixtures/md-states/reshape_r0_grow/kernel-sha256.txt"),
    )
    .unwrap();
    assert_eq!(sha(&all[..(45 * MIB) as usize]), kernel.trim());
    assert!(
        all[(45 * MIB) as usize..].iter().all(|&b| b == 0),
        "new space not zeros"
    );
}

#[test]
fn the_kernel_reads_a_raid0_nvraid_grew_and_finishes_one_left_mid_grow() {
    // Three arrays for md: a RAID 0 nvraid grew from 3 to 4 members; one
    // nvraid left part-way (md's RAID 4 record, steps recorded, the next
    // written and not recorded), which md assembles and finishes as the
    // RAID 4 of 5 with its parity missing (as it finishes its own when
    // mdadm is gone); and the kernel's own mid-grow RAID 0 finished by
    // nvraid. Each holds the pattern.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, point) in [("r0done", None), ("r0mid", Some("reshape-write:150"))] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (mut m, _) = filled(&sub, "0", 3, name);
        let new = blank(&sub, "d3");
        match point {
            None => {
                ok(
                    &with(&["grow", "-n", "4", "--add", &new, "--step", "1M"], &m),
                    &sub,
                );
            }
            Some(point) => grow_killed_at(&sub, &m, std::slice::from_ref(&new), point),
        }
        m.push(new);
        images.extend(m.iter().map(|n| sub.join(n)));
    }
    let sub = dir.path().join("r0fix");
    std::fs::create_dir(&sub).unwrap();
    let m = unpack("reshape_r0_grow", &sub);
    ok(&with(&["grow", "--continue"], &m), &sub);
    images.extend(m.iter().map(|n| sub.join(n)));
    let report = kernel_reports(
        &images,
        &[
            ("r0done", 3 * PER),
            ("r0mid", 3 * PER),
            ("reshape_r0_grow", 45 * MIB),
        ],
    );
    for (name, level, disks, degraded, size) in [
        ("r0done", "raid0", 4, 0, 4 * PER),
        ("r0mid", "raid4", 5, 1, 4 * PER),
        ("reshape_r0_grow", "raid0", 4, 0, 60 * MIB),
    ] {
        let line = kernel_line(&report, name);
        assert!(
            line.contains(&format!("level={level} "))
                && line.contains(&format!("disks={disks} "))
                && (level == "raid0" || line.contains(&format!("degraded={degraded} ")))
                && line.contains(&format!("size={size} "))
                && line.contains("pattern=ok"),
            "{line}\n{report}"
        );
    }
}

/// md's level and layout words of member `name`.
fn level_layout(dir: &Path, name: &str) -> (i64, i64, i64) {
    let e: serde_json::Value =
        serde_json::from_str(&ok(&["examine", "--json", name], dir)).unwrap();
    let sb = &e[0]["superblock"];
    (
        sb["level"].as_i64().unwrap(),
        sb["layout"].as_i64().unwrap(),
        sb["raid_disks"].as_i64().unwrap(),
    )
}

#[test]
fn a_raid5_becomes_a_raid6_with_q_on_the_added_member_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, data) = filled(d, "5", 4, "r56");
    let before: Vec<Vec<u8>> = m
        .iter()
        .map(|n| std::fs::read(d.join(n)).unwrap())
        .collect();
    let new = blank(d, "d4");
    let out = ok(
        &with(
            &["grow", "--level", "6", "-n", "5", "--add", &new, "--json"],
            &m,
        ),
        d,
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_eq!(grown["size_bytes"], 3 * PER, "{grown}");
    // md's left-symmetric-6 (18): data and P where the RAID 5 had them.
    assert_eq!(level_layout(d, "d0"), (6, 18, 5));
    for (name, old) in m.iter().zip(&before) {
        let now = std::fs::read(d.join(name)).unwrap();
        assert!(now[1 << 20..] == old[1 << 20..], "{name}: data moved");
    }
    let mut all = m.clone();
    all.push(new.clone());
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], &all), d)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "P or Q wrong: {check}");
    assert!(read(d, &all, data.len() as u64) == data);
    // Q's member alone lost: the others still read every byte (Q is real).
    assert!(read(d, &all[1..], data.len() as u64) == data);
    // And back: the Q member leaves; a RAID 5 of the four, nothing moved.
    let out = ok(&with(&["grow", "--level", "5"], &all), d);
    assert!(out.contains("d4 left the array"), "{out}");
    assert_eq!(level_layout(d, "d0"), (5, 2, 4));
    for (name, old) in m.iter().zip(&before) {
        let now = std::fs::read(d.join(name)).unwrap();
        assert!(now[1 << 20..] == old[1 << 20..], "{name}: data moved");
    }
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], &m), d)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    assert!(read(d, &m, data.len() as u64) == data);
}

#[test]
fn level_changes_with_members_md_does_not_make_are_refused_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // RAID 6 in the rotating layout: Q is not on one member.
    let (m6, _) = filled(d, "6", 4, "r6");
    refused(
        &with(&["grow", "--level", "5"], &m6),
        d,
        &["-6", "last member"],
    );
    let sub = d.join("r5");
    std::fs::create_dir(&sub).unwrap();
    let (m5, _) = filled(&sub, "5", 3, "r5");
    let new = blank(&sub, "d3");
    let extra = blank(&sub, "d9");
    // 5 -> 6 without a member for Q; with two; with a wrong count.
    refused(&with(&["grow", "--level", "6"], &m5), &sub, &["--add"]);
    refused(
        &with(
            &[
                "grow", "--level", "6", "-n", "5", "--add", &new, "--add", &extra,
            ],
            &m5,
        ),
        &sub,
        &["exactly one --add"],
    );
    refused(
        &with(&["grow", "--level", "6", "-n", "5", "--add", &new], &m5),
        &sub,
        &["--raid-devices"],
    );
    // A new member too small.
    let small = "small".to_string();
    std::fs::File::create(sub.join(&small))
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    refused(
        &with(&["grow", "--level", "6", "-n", "4", "--add", &small], &m5),
        &sub,
        &["small"],
    );
    // A RAID 0 of members of different sizes (several zones: the
    // kernel's own, tests/fixtures/md-states/zones).
    let sub = d.join("zones");
    std::fs::create_dir(&sub).unwrap();
    let z = unpack("zones", &sub);
    let new = blank(&sub, "z3");
    refused(
        &with(&["grow", "-n", "4", "--add", &new], &z),
        &sub,
        &["several zones"],
    );
}

#[test]
fn the_kernel_assembles_the_arrays_nvraid_took_over_to_another_level() {
    // A RAID 5 of 4 nvraid made a RAID 6 of 5 (Q on the added member), one
    // taken to RAID 6 and back, a RAID 0 of 2 made a RAID 10 near=2 of 4
    // (its mirrors added) and one taken back to RAID 0: md assembles each
    // whole, reads the pattern, and its check finds no P, Q or copy
    // mismatch.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for name in ["to6", "back5"] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (mut m, _) = filled(&sub, "5", 4, name);
        let new = blank(&sub, "d4");
        ok(
            &with(&["grow", "--level", "6", "-n", "5", "--add", &new], &m),
            &sub,
        );
        if name == "back5" {
            let mut all = m.clone();
            all.push(new);
            ok(&with(&["grow", "--level", "5"], &all), &sub);
        } else {
            m.push(new);
        }
        images.extend(m.iter().map(|n| sub.join(n)));
    }
    for name in ["to10", "back0"] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (m, _) = filled(&sub, "0", 2, name);
        let new = vec![blank(&sub, "d2"), blank(&sub, "d3")];
        let mut args = vec!["grow", "--level", "10", "-n", "4"];
        for n in &new {
            args.extend(["--add", n.as_str()]);
        }
        ok(&with(&args, &m), &sub);
        let all: Vec<String> = m.iter().chain(&new).cloned().collect();
        if name == "back0" {
            ok(&with(&["grow", "--level", "0"], &all), &sub);
            images.extend(m.iter().map(|n| sub.join(n)));
        } else {
            images.extend(all.iter().map(|n| sub.join(n)));
        }
    }
    let report = kernel_reports(
        &images,
        &[
            ("to6", 3 * PER),
            ("back5", 3 * PER),
            ("to10", 2 * PER),
            ("back0", 2 * PER),
        ],
    );
    for (name, level, disks, size) in [
        ("to6", "raid6", 5, 3 * PER),
        ("back5", "raid5", 4, 3 * PER),
        ("to10", "raid10", 4, 2 * PER),
        ("back0", "raid0", 2, 2 * PER),
    ] {
        let line = kernel_line(&report, name);
        assert!(
            line.contains(&format!("level={level} "))
                && line.contains(&format!("disks={disks} "))
                && (level == "raid0" || line.contains("degraded=0 "))
                && line.contains(&format!("size={size} "))
                && line.contains("pattern=ok")
                && (level == "raid0" || line.contains("mismatch=0")),
            "{line}\n{report}"
        );
    }
}

#[test]
fn a_raid0_grow_stops_at_its_recorded_position_when_a_member_fails_and_continues_once_it_is_back() {
    // A RAID 0 (md's RAID 4 without parity while it grows) cannot lose a
    // member: the grow stops with the member named, nothing recorded past
    // the last checkpoint and the member not recorded failed; once the
    // member answers again, `grow --continue` finishes it as a RAID 0.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, data) = filled(d, "0", 3, "r0f");
    let new = blank(d, "d3");
    let node = FailingNode::slow(d, "d1");
    let through: Vec<String> = vec![m[0].clone(), node.uri(), m[2].clone()];
    let (success, stdout, stderr) = grow_with_a_failure(d, &through, &new, "4", &node);
    assert!(!success, "a RAID 0 grew on without a member: {stdout}");
    assert!(
        stderr.contains("stopped at the position last recorded") && stderr.contains("d1.sock"),
        "{stderr}"
    );
    // Every member still records the reshape, one position for all, and
    // none records d1 faulty.
    let mut positions = Vec::new();
    for name in ["d0", "d2", "d3"] {
        let e: serde_json::Value =
            serde_json::from_str(&ok(&["examine", "--json", name], d)).unwrap();
        let sb = &e[0]["superblock"];
        assert_eq!(sb["feature_map"].as_u64().unwrap() & 4, 4, "{name}: {sb}");
        positions.push(sb["reshape_position"].as_u64().unwrap());
        let text = ok(&["examine", name], d);
        assert!(!text.to_lowercase().contains("faulty"), "{name}: {text}");
    }
    assert!(
        positions.iter().all(|&p| p == positions[0] && p > 0),
        "{positions:?}"
    );
    // The member answers again.
    node.heal();
    let mut all = through.clone();
    all.push(new);
    let out = ok(&with(&["grow", "--continue", "--step", "1M"], &all), d);
    assert!(
        out.contains("to 4 members") && !out.contains("degraded"),
        "{out}"
    );
    drop(node);
    let files: Vec<String> = ["d0", "d1", "d2", "d3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &files), d)).unwrap();
    assert_eq!(detail["level"], 0, "{detail}");
    let got = read(d, &files, 4 * PER);
    assert!(got[..data.len()] == data[..], "the bytes differ");
}

#[test]
fn a_raid0_becomes_a_raid10_near2_with_its_members_doubled_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, data) = filled(d, "0", 2, "r010");
    let before: Vec<Vec<u8>> = m
        .iter()
        .map(|n| std::fs::read(d.join(n)).unwrap())
        .collect();
    let new = vec![blank(d, "d2"), blank(d, "d3")];
    let out = ok(
        &with(
            &[
                "grow", "--level", "10", "-n", "4", "--add", &new[0], "--add", &new[1],
            ],
            &m,
        ),
        d,
    );
    assert!(out.contains("from 2 to 4 members"), "{out}");
    // RAID 0 member i is RAID 10 member 2i; nothing moved on it.
    let e: serde_json::Value = serde_json::from_str(&ok(&["examine", "--json", "d1"], d)).unwrap();
    assert_eq!(e[0]["superblock"]["level"], 10, "{e}");
    assert_eq!(e[0]["role"], "Active device 2", "{e}");
    for (name, old) in m.iter().zip(&before) {
        let now = std::fs::read(d.join(name)).unwrap();
        assert!(now[1 << 20..] == old[1 << 20..], "{name}: data moved");
    }
    let all: Vec<String> = m.iter().chain(&new).cloned().collect();
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], &all), d)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "the copies differ: {check}");
    // The new mirrors alone hold every byte.
    assert!(
        read(d, &new, data.len() as u64) == data,
        "the mirrors differ"
    );
    // And back: one copy of each pair kept.
    let out = ok(&with(&["grow", "--level", "0"], &all), d);
    assert!(out.contains("left the array"), "{out}");
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), d)).unwrap();
    assert_eq!(detail["level"], 0, "{detail}");
    assert_eq!(detail["raid_disks"], 2, "{detail}");
    assert!(read(d, &m, data.len() as u64) == data);
    // A RAID 0 without its mirrors named: refused, md's path named.
    let sub = d.join("bare");
    std::fs::create_dir(&sub).unwrap();
    let (m0, _) = filled(&sub, "0", 2, "bare");
    refused(&with(&["grow", "--level", "10"], &m0), &sub, &["--add NEW"]);
    let one = blank(&sub, "d2");
    refused(
        &with(&["grow", "--level", "10", "-n", "4", "--add", &one], &m0),
        &sub,
        &["--raid-devices", "one --add per new mirror"],
    );
}

/// Every member file's bytes in `dir`, by name.
fn snapshot(dir: &Path, names: &[String]) -> Vec<Vec<u8>> {
    names
        .iter()
        .map(|n| std::fs::read(dir.join(n)).unwrap())
        .collect()
}

#[test]
fn a_raid1_of_two_becomes_a_raid5_of_two_and_back_with_no_byte_moved() {
    // md's takeover: a two-member RAID 5 (left-symmetric, 64 KiB chunks:
    // 14 MiB is a multiple) whose parity is a copy of its one data chunk
    // per stripe, so both members keep the mirror's bytes.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, data) = filled(d, "1", 2, "r15");
    let before = snapshot(d, &m);
    let out = ok(&with(&["grow", "--level", "5", "--json"], &m), d);
    let changed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(changed["md_level"], 5, "{changed}");
    assert_eq!(changed["chunk_bytes"], 64 * 1024, "{changed}");
    assert_eq!(changed["size_bytes"], PER, "{changed}");
    assert_eq!(level_layout(d, "d0"), (5, 2, 2));
    for (name, old) in m.iter().zip(&before) {
        let now = std::fs::read(d.join(name)).unwrap();
        assert!(now[1 << 20..] == old[1 << 20..], "{name}: data moved");
    }
    assert!(read(d, &m, PER) == data);
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], &m), d)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    // Written as a RAID 5 (parity of one chunk), each member alone still
    // holds every byte.
    let patch = vec![0xa5u8; 3 * 65536 + 4096];
    std::fs::write(d.join("patch"), &patch).unwrap();
    ok(
        &with(&["write", "--input", "patch", "--offset", "61440"], &m),
        d,
    );
    let mut data = data;
    data[61440..61440 + patch.len()].copy_from_slice(&patch);
    for one in &m {
        assert!(
            read(d, std::slice::from_ref(one), PER) == data,
            "{one} alone"
        );
    }
    // And back: a RAID 1 of the two, the same bytes.
    let out = ok(&with(&["grow", "--level", "1", "--json"], &m), d);
    let changed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(changed["md_level"], 1, "{changed}");
    assert_eq!(changed["size_bytes"], PER, "{changed}");
    assert_eq!(level_layout(d, "d0"), (1, 0, 2));
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], &m), d)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    assert!(read(d, &m, PER) == data);
}

#[test]
fn a_raid1_of_two_grows_to_a_raid5_of_three_through_md_takeover_even_killed_mid_way() {
    // mdadm's `--grow --level 5 -n 3 --add NEW` on a RAID 1 of two: the
    // takeover, then the RAID 5's grow; uninterrupted, and killed in the
    // grow's record, its steps and a checkpoint, then `grow --continue`.
    for point in [
        None,
        Some("reshape-superblock:3"), // the takeover done, the new member recorded
        Some("reshape-write:3"),
        Some("reshape-superblock:9"),
        Some("reshape-write:20"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, data) = filled(d, "1", 2, "r153");
        let new = blank(d, "d2");
        let args = with(
            &[
                "grow", "--level", "5", "-n", "3", "--add", &new, "--step", "1M",
            ],
            &m,
        );
        let mut all = m.clone();
        all.push(new.clone());
        match point {
            None => {
                let out = ok(&args, d);
                assert!(out.contains("grown from 2 to 3 members"), "{out}");
            }
            Some(point) => {
                let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
                    .current_dir(d)
                    .env("NVRAID_FAILPOINT", point)
                    .args(&args)
                    .output()
                    .unwrap();
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    !out.status.success() && stderr.contains("failpoint"),
                    "grow did not stop at {point}: {stderr}"
                );
                let out = ok(&with(&["grow", "--continue", "--step", "1M"], &all), d);
                assert!(out.contains("to 3 members"), "{point}: {out}");
            }
        }
        let what = point.unwrap_or("uninterrupted");
        assert_eq!(level_layout(d, "d0"), (5, 2, 3), "{what}");
        let detail: serde_json::Value =
            serde_json::from_str(&ok(&with(&["detail", "--json"], &all), d)).unwrap();
        assert_eq!(detail["size_bytes"], 2 * PER, "{what}: {detail}");
        assert_eq!(detail["chunk_bytes"], 64 * 1024, "{what}: {detail}");
        assert!(read(d, &all, PER) == data, "{what}: the bytes differ");
        let check: serde_json::Value =
            serde_json::from_str(&ok(&with(&["check", "--json"], &all), d)).unwrap();
        assert_eq!(check["mismatch_sectors"], 0, "{what}: {check}");
    }
}

#[test]
fn a_raid1_of_three_as_a_raid5_is_refused_naming_md_two_member_rule_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, _) = filled(d, "1", 3, "r13");
    let new = blank(d, "d3");
    let mut every = m.clone();
    every.push(new.clone());
    let before = snapshot(d, &every);
    refused(
        &with(&["grow", "--level", "5"], &m),
        d,
        &["RAID 1 of 3 members", "exactly two members"],
    );
    refused(
        &with(&["grow", "--level", "5", "-n", "4", "--add", &new], &m),
        d,
        &["3 members", "exactly two members"],
    );
    // A RAID 1 of two, but a count that does not match the --add.
    let sub = d.join("two");
    std::fs::create_dir(&sub).unwrap();
    let (m2, _) = filled(&sub, "1", 2, "r12");
    let new2 = blank(&sub, "d2");
    let mut every2 = m2.clone();
    every2.push(new2.clone());
    let before2 = snapshot(&sub, &every2);
    refused(
        &with(&["grow", "--level", "5", "-n", "4", "--add", &new2], &m2),
        &sub,
        &["--raid-devices", "2 + the --add count"],
    );
    // A new member too small for the RAID 5's rows.
    std::fs::File::create(sub.join("small"))
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    refused(
        &with(&["grow", "--level", "5", "-n", "3", "--add", "small"], &m2),
        &sub,
        &["small"],
    );
    assert!(snapshot(d, &every) == before, "a byte changed (three)");
    assert!(snapshot(&sub, &every2) == before2, "a byte changed (two)");
}

#[test]
fn the_kernel_assembles_what_nvraid_took_between_raid1_and_raid5_and_restriped() {
    // One VM boot: a RAID 1 of two nvraid took over as a RAID 5 of two,
    // one taken there and grown to three (`--level 5 -n 3 --add`), one
    // taken there and back to RAID 1, a RAID 0 of three whose chunk nvraid
    // changed (through md's RAID 4), and a RAID 6 nvraid took out of the
    // `-6` layout the RAID 5 -> 6 takeover left (`--layout normalise`):
    // md assembles each whole, reads the pattern and finds no mismatch.
    // And a RAID 0 restripe nvraid left mid-way, which md finishes; a RAID
    // 4 without its parity member nvraid took over as a RAID 0.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for name in ["r15", "r153", "r151"] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (mut m, _) = filled(&sub, "1", 2, name);
        match name {
            "r15" => {
                ok(&with(&["grow", "--level", "5"], &m), &sub);
            }
            "r153" => {
                let new = blank(&sub, "d2");
                ok(
                    &with(&["grow", "--level", "5", "-n", "3", "--add", &new], &m),
                    &sub,
                );
                m.push(new);
            }
            _ => {
                ok(&with(&["grow", "--level", "5"], &m), &sub);
                ok(&with(&["grow", "--level", "1"], &m), &sub);
            }
        }
        images.extend(m.iter().map(|n| sub.join(n)));
    }
    let sub = dir.path().join("r0c");
    std::fs::create_dir(&sub).unwrap();
    let (m, _) = filled(&sub, "0", 3, "r0c");
    ok(&with(&["grow", "--chunk", "256K"], &m), &sub);
    images.extend(m.iter().map(|n| sub.join(n)));
    // One killed mid-restripe: md's RAID 4 of four with its parity role
    // empty, which the kernel finishes (as a RAID 4; mdadm's watcher,
    // which would take it back to RAID 0, is not there).
    let sub = dir.path().join("r0m");
    std::fs::create_dir(&sub).unwrap();
    let (m, _) = filled(&sub, "0", 3, "r0m");
    let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(&sub)
        .env("NVRAID_FAILPOINT", "reshape-write:20")
        .args(with(&["grow", "--chunk", "128K", "--step", "1M"], &m))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("failpoint"),
        "the restripe did not stop mid-way"
    );
    images.extend(m.iter().map(|n| sub.join(n)));
    // A RAID 4 without its parity member taken over as a RAID 0.
    let sub = dir.path().join("r40");
    std::fs::create_dir(&sub).unwrap();
    let (m, _) = filled(&sub, "4", 4, "r40");
    ok(&with(&["fail", "--member", "d3"], &m), &sub);
    ok(&with(&["grow", "--level", "0"], &m[..3]), &sub);
    images.extend(m[..3].iter().map(|n| sub.join(n)));
    let sub = dir.path().join("r6n");
    std::fs::create_dir(&sub).unwrap();
    let (mut m, _) = filled(&sub, "5", 4, "r6n");
    let new = blank(&sub, "d4");
    ok(
        &with(&["grow", "--level", "6", "-n", "5", "--add", &new], &m),
        &sub,
    );
    m.push(new);
    ok(&with(&["grow", "--layout", "normalise"], &m), &sub);
    images.extend(m.iter().map(|n| sub.join(n)));
    let report = kernel_reports(
        &images,
        &[
            ("r15", PER),
            ("r153", PER),
            ("r151", PER),
            ("r0c", 3 * PER),
            ("r0m", 3 * PER),
            ("r40", 3 * PER),
            ("r6n", 3 * PER),
        ],
    );
    for (name, level, disks, size) in [
        ("r15", "raid5", 2, PER),
        ("r153", "raid5", 3, 2 * PER),
        ("r151", "raid1", 2, PER),
        ("r0c", "raid0", 3, 3 * PER),
        ("r0m", "raid4", 4, 3 * PER),
        ("r40", "raid0", 3, 3 * PER),
        ("r6n", "raid6", 5, 3 * PER),
    ] {
        let line = kernel_line(&report, name);
        let degraded = if name == "r0m" {
            "degraded=1 "
        } else {
            "degraded=0 "
        };
        assert!(
            line.contains(&format!("level={level} "))
                && line.contains(&format!("disks={disks} "))
                && (level == "raid0" || line.contains(degraded))
                && line.contains(&format!("size={size} "))
                && line.contains("pattern=ok")
                && (level == "raid0" || name == "r0m" || line.contains("mismatch=0")),
            "{line}\n{report}"
        );
    }
    // md runs them in the chunk and layout nvraid recorded (and finished
    // the restripe nvraid left in md's RAID 4, parity-last).
    for (name, words) in [
        ("r15", "chunk=65536 layout=2"),
        ("r0c", "chunk=262144 "),
        ("r0m", "chunk=131072 layout=5"),
        ("r6n", "chunk=65536 layout=2"),
    ] {
        let line = kernel_line(&report, name);
        assert!(line.contains(words), "{name}: {words}: {line}");
    }
}

#[test]
fn nvraid_reads_the_raid5_the_kernel_took_over_from_a_raid1_and_takes_it_back() {
    // The kernel's takeover of a RAID 1 of two (`mdadm --grow --level=5`,
    // tests/fixtures/md-states/takeover_r1_r5): nvraid sees md's RAID 5 of
    // two (left-symmetric, the chunk md picked), reads the kernel's bytes,
    // finds each member's parity (a copy) right, and takes it back to a
    // RAID 1 that each member alone reads.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = unpack("takeover_r1_r5", d);
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), d)).unwrap();
    assert_eq!(detail["level"], 5, "{detail}");
    assert_eq!(detail["raid_disks"], 2, "{detail}");
    assert_eq!(detail["layout"], "left-symmetric", "{detail}");
    assert_eq!(detail["chunk_bytes"], 64 * 1024, "{detail}");
    let size = detail["size_bytes"].as_u64().unwrap();
    assert_eq!(size, 15 * MIB, "{detail}");
    let all = read(d, &m, size);
    let kernel = std::fs::read_to_string(
        repo().join("tests/fixtures/md-states/takeover_r1_r5/kernel-sha256.txt"),
    )
    .unwrap();
    assert_eq!(sha(&all), kernel.trim());
    assert!(all == pattern(size), "the kernel wrote the pattern");
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], &m), d)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    ok(&with(&["grow", "--level", "1"], &m), d);
    assert_eq!(level_layout(d, "d0"), (1, 0, 2));
    for one in &m {
        assert!(
            read(d, std::slice::from_ref(one), size) == all,
            "{one} alone"
        );
    }
}

#[test]
fn nvraid_reads_the_raid0_the_kernel_restriped_and_restripes_it_back() {
    // mdadm's chunk change of a RAID 0 of three (64 -> 128 KiB, through
    // md's RAID 4 with its parity missing and back; the data offset moved
    // down 2048 -> 1024 sectors; tests/fixtures/md-states/reshape_r0_chunk):
    // nvraid reads the kernel's bytes, then changes the chunk back to 64
    // KiB its own way and reads the same bytes.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = unpack("reshape_r0_chunk", d);
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), d)).unwrap();
    assert_eq!(detail["level"], 0, "{detail}");
    assert_eq!(detail["raid_disks"], 3, "{detail}");
    assert_eq!(detail["chunk_bytes"], 128 * 1024, "{detail}");
    assert_eq!(detail["data_offset_bytes"], 1024 * 512, "{detail}");
    let size = detail["size_bytes"].as_u64().unwrap();
    assert_eq!(size, 45 * MIB, "{detail}");
    let all = read(d, &m, size);
    let kernel = std::fs::read_to_string(
        repo().join("tests/fixtures/md-states/reshape_r0_chunk/kernel-sha256.txt"),
    )
    .unwrap();
    assert_eq!(sha(&all), kernel.trim());
    assert!(all == pattern(size), "the kernel wrote the pattern");
    ok(&with(&["grow", "--chunk", "64K", "--step", "1M"], &m), d);
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), d)).unwrap();
    assert_eq!(detail["level"], 0, "{detail}");
    assert_eq!(detail["chunk_bytes"], 64 * 1024, "{detail}");
    assert!(read(d, &m, size) == all, "64 KiB again: the bytes differ");
}

#[test]
fn a_takeover_killed_between_its_superblocks_is_finished_by_running_it_again() {
    // One member written (the new level, one event ahead), the other not:
    // the members disagree, which neither nvraid nor md assembles. The
    // same command run again writes the rest (no byte moved, none written
    // since). RAID 1 -> 5 and back (with a bitmap), 4 <-> 5 parity-last,
    // and mdadm's `--level 5 -n 3 --add` cut short in its takeover.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let names = vec!["d0".to_string(), "d1".to_string()];
    ok(
        &with(
            &[
                "create", "--level", "1", "--bitmap", "internal", "--size", "15M", "--name", "r1k",
            ],
            &names,
        ),
        d,
    );
    let data = pattern(PER);
    std::fs::write(d.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), d);
    for (to, words) in [("5", (5, 2, 2)), ("1", (1, 0, 2))] {
        let args = with(&["grow", "--level", to], &names);
        killed_at(d, &args, "reshape-superblock:1");
        assert_eq!(level_layout(d, "d0"), words, "--level {to}: d0 written");
        assert_ne!(level_layout(d, "d1"), words, "--level {to}: d1 not");
        let out = ok(&args, d);
        assert!(out.contains("level changed"), "{out}");
        assert_eq!(level_layout(d, "d1"), words, "--level {to}: finished");
        let detail: serde_json::Value =
            serde_json::from_str(&ok(&with(&["detail", "--json"], &names), d)).unwrap();
        assert_eq!(detail["state"], "clean", "--level {to}: {detail}");
        assert!(detail["bitmap"].is_object(), "--level {to}: {detail}");
        assert!(read(d, &names, PER) == data, "--level {to}");
        let check: serde_json::Value =
            serde_json::from_str(&ok(&with(&["check", "--json"], &names), d)).unwrap();
        assert_eq!(check["mismatch_sectors"], 0, "--level {to}: {check}");
    }
    // nvraid's RAID 4 (md level 5 parity-last) to md's raid4 and back.
    let sub = d.join("r4");
    std::fs::create_dir(&sub).unwrap();
    let (m4, data4) = filled(&sub, "4", 3, "r4k");
    for (to, level) in [("4", 4), ("5", 5)] {
        let args = with(&["grow", "--level", to], &m4);
        killed_at(&sub, &args, "reshape-superblock:2");
        ok(&args, &sub);
        for name in &m4 {
            assert_eq!(level_layout(&sub, name).0, level, "--level {to}: {name}");
        }
        assert!(read(&sub, &m4, data4.len() as u64) == data4, "--level {to}");
    }
    // The takeover then grow, killed in the takeover, run again.
    let sub = d.join("r153");
    std::fs::create_dir(&sub).unwrap();
    let (m, data) = filled(&sub, "1", 2, "r153k");
    let new = blank(&sub, "d2");
    let args = with(
        &[
            "grow", "--level", "5", "-n", "3", "--add", &new, "--step", "1M",
        ],
        &m,
    );
    killed_at(&sub, &args, "reshape-superblock:1");
    let out = ok(&args, &sub);
    assert!(out.contains("grown from 2 to 3 members"), "{out}");
    let mut all = m.clone();
    all.push(new);
    assert_eq!(level_layout(&sub, "d2"), (5, 2, 3));
    assert!(read(&sub, &all, PER) == data);
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], &all), &sub)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
}

#[test]
fn a_raid4_without_its_parity_member_becomes_a_raid0_and_a_whole_one_is_refused() {
    // md's raid0_takeover_raid45: a RAID 4 (nvraid's, md level 5
    // parity-last; and md's level 4) whose parity member is gone is the
    // RAID 0 of the others, no byte moved. A whole one, or one missing a
    // data member, is refused with nothing written.
    for to4 in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, data) = filled(d, "4", 4, "r40");
        if to4 {
            ok(&with(&["grow", "--level", "4"], &m), d);
        }
        let before = snapshot(d, &m);
        refused(
            &with(&["grow", "--level", "0"], &m),
            d,
            &["parity member (role 3) missing", "nvraid fail"],
        );
        assert!(snapshot(d, &m) == before, "a whole RAID 4: a byte changed");
        // Without a data member (role 0) and the parity: refused too.
        refused(
            &with(&["grow", "--level", "0"], &m[1..3]),
            d,
            &["role(s) [0, 3]", "parity member"],
        );
        assert!(snapshot(d, &m) == before, "two missing: a byte changed");
        ok(&with(&["fail", "--member", "d3"], &m), d);
        let out = ok(&with(&["grow", "--level", "0", "--json"], &m[..3]), d);
        let changed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(changed["md_level"], 0, "{changed}");
        assert_eq!(changed["size_bytes"], 3 * PER, "{changed}");
        assert_eq!(level_layout(d, "d0").0, 0);
        assert_eq!(level_layout(d, "d0").2, 3);
        for (name, old) in m[..3].iter().zip(&before) {
            let now = std::fs::read(d.join(name)).unwrap();
            assert!(now[1 << 20..] == old[1 << 20..], "{name}: data moved");
        }
        assert!(read(d, &m[..3], 3 * PER) == data, "md level 4: {to4}");
    }
}

/// A new blank member of 16 MiB named `name`.
fn blank(dir: &Path, name: &str) -> String {
    blank_mib(dir, name, 16)
}

/// [`common::reshape::kernel_reports`] with the script beside the
/// images' directory.
fn kernel_reports(images: &[PathBuf], bytes: &[(&str, u64)]) -> String {
    let beside = images[0].parent().unwrap().parent().unwrap();
    common::reshape::kernel_reports(beside, images, bytes)
}
