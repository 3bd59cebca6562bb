//! `nvraid grow` without room to move the data offset: the RAID 4/5/6
//! grows in place, its critical section kept in a backup area on the new
//! members (docs/reshape.md); a crash at any write of the section is put
//! right by `grow --continue`. A degraded array grown with `--force`; the
//! crash window between the new members' superblocks.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Data bytes each member holds (7 MiB members less 1 MiB of metadata).
const PER: u64 = 6 * MIB;

/// A RAID `level` of `count` members of 7 MiB in chunks of 1 MiB (its
/// data offset, 1 MiB, leaves less than a chunk of room below the data),
/// no bitmap, filled with the pattern: the members and the bytes.
fn no_room(dir: &Path, level: &str, count: usize) -> (Vec<String>, Vec<u8>) {
    no_room_with(dir, level, count, "none")
}

/// [`no_room`] with `--bitmap bitmap`.
fn no_room_with(dir: &Path, level: &str, count: usize, bitmap: &str) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", level, "--chunk", "1M", "--bitmap", bitmap, "--size", "7M", "--name",
        "inplace",
    ];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let data_members = count as u64 - if level == "6" { 2 } else { 1 };
    let data = pattern(data_members * PER);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, data)
}

fn examine(dir: &Path, name: &str) -> serde_json::Value {
    let out = ok(&["examine", "--json", name], dir);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["superblock"].clone()
}

/// Every byte of the grown array back (the pattern, then zeros), and
/// every parity right.
fn assert_grown(dir: &Path, members: &[String], data: &[u8], size: u64, what: &str) {
    let got = read(dir, members, size);
    assert!(
        got[..data.len()] == data[..],
        "{what}: the old bytes moved wrong"
    );
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "{what}: the new space is not zeros"
    );
    assert_checks_clean(dir, members, what);
}

#[test]
fn a_raid5_without_room_to_move_its_data_grows_in_place_with_a_backup() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = no_room(dir.path(), "5", 4);
    let new = blank_mib(dir.path(), "d4", 12);
    let out = ok(
        &with(&["grow", "-n", "5", "--add", &new, "--json"], &m),
        dir.path(),
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_eq!(grown["size_bytes"], 4 * PER, "{grown}");
    // The old members' data stayed where it was.
    assert_eq!(grown["data_offset_bytes"], MIB, "{grown}");
    m.push(new);
    for name in &m[..4] {
        assert_eq!(examine(dir.path(), name)["data_offset_sectors"], 2048);
    }
    // The new member's data starts above its backup area (a chunk of each
    // old member and a 4 KiB header).
    assert_eq!(
        examine(dir.path(), "d4")["data_offset_sectors"],
        (MIB + 4 * MIB + 4096) / 512
    );
    assert_grown(dir.path(), &m, &data, 4 * PER, "grown in place");
    // RAID 6: two new members, each with the backup.
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = no_room(dir.path(), "6", 4);
    let (a, b) = (
        blank_mib(dir.path(), "d4", 12),
        blank_mib(dir.path(), "d5", 12),
    );
    ok(
        &with(&["grow", "-n", "6", "--add", &a, "--add", &b], &m),
        dir.path(),
    );
    m.extend([a, b]);
    assert_grown(dir.path(), &m, &data, 4 * PER, "RAID 6 grown in place");
    // Q right as well: two members gone, every byte still there.
    assert!(read(dir.path(), &m[2..], data.len() as u64) == data);
    // RAID 4 (parity-last: the new member holds data).
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = no_room(dir.path(), "4", 3);
    let new = blank_mib(dir.path(), "d3", 12);
    ok(&with(&["grow", "-n", "4", "--add", &new], &m), dir.path());
    m.push(new);
    assert_grown(dir.path(), &m, &data, 3 * PER, "RAID 4 grown in place");
    // With a write-intent bitmap (kept where it is, below the data).
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = no_room_with(dir.path(), "5", 4, "internal");
    let new = blank_mib(dir.path(), "d4", 12);
    ok(&with(&["grow", "-n", "5", "--add", &new], &m), dir.path());
    m.push(new);
    let d: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &m), dir.path())).unwrap();
    assert_eq!(d["state"], "clean", "{d}");
    assert_grown(
        dir.path(),
        &m,
        &data,
        4 * PER,
        "grown in place with a bitmap",
    );
}

#[test]
fn a_grow_in_place_with_new_members_too_small_for_the_backup_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = no_room(dir.path(), "5", 4);
    // Room for the data area, none for the backup below it.
    let new = blank_mib(dir.path(), "d4", 8);
    refused(
        &with(&["grow", "-n", "5", "--add", &new], &m),
        dir.path(),
        &["d4", "too small", "backup of the critical section"],
    );
}

/// Copy every file of `from` into a new temporary directory.
fn copied(from: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

#[test]
fn a_grow_in_place_killed_at_any_write_of_its_critical_section_reads_back_and_is_restored_by_continue(
) {
    // RAID 5 of 4 members to 5, chunks of 1 MiB: a stripe of the new shape
    // holds 4 MiB, of the old 3 MiB; the steps from 0, 4 MiB and 8 MiB
    // each write a row the old shape still reads (the critical section),
    // from 12 MiB on the reads run ahead. Each of those steps: 3 backup
    // writes (header cleared, rows, header), 6 member writes (5 members,
    // then the flush), then 5 superblocks; the record before them is 5
    // superblocks. Every one of these points is crashed at.
    let template = tempfile::tempdir().unwrap();
    let (old, data) = no_room(template.path(), "5", 4);
    blank_mib(template.path(), "d4", 12);
    let grow = with(&["grow", "-n", "5", "--add", "d4", "--step", "4M"], &old);
    let mut m = old.clone();
    m.push("d4".into());
    let mut points: Vec<String> = Vec::new();
    points.extend((1..=9).map(|n| format!("reshape-backup:{n}")));
    points.extend((1..=18).map(|n| format!("reshape-write:{n}")));
    points.extend((1..=20).map(|n| format!("reshape-superblock:{n}")));
    for point in &points {
        let dir = copied(template.path());
        killed_at(dir.path(), &grow, point);
        // Read as it was left, once every member records the reshape
        // (the first 5 superblock points cut the record short, which
        // `read` refuses by name): the rows the step was overwriting
        // come from its backup.
        let recorded = !(1..=5).any(|n| *point == format!("reshape-superblock:{n}"));
        if recorded {
            assert!(
                read(dir.path(), &m, data.len() as u64) == data,
                "{point}: the array read as left differs"
            );
        }
        let out = ok(
            &with(&["grow", "--continue", "--step", "4M"], &m),
            dir.path(),
        );
        assert!(out.contains("to 5 members"), "{point}: {out}");
        assert_grown(dir.path(), &m, &data, 4 * PER, point);
    }
}

#[test]
fn the_kernel_reads_a_raid5_nvraid_grew_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, data) = no_room(dir.path(), "5", 4);
    let new = blank_mib(dir.path(), "d4", 12);
    ok(&with(&["grow", "-n", "5", "--add", &new], &m), dir.path());
    m.push(new);
    let mut whole = data.clone();
    whole.resize((4 * PER) as usize, 0);
    assert!(read(dir.path(), &m, 4 * PER) == whole);
    let images: Vec<PathBuf> = m.iter().map(|n| dir.path().join(n)).collect();
    let report = kernel_reads(&images, &[sha(&whole)]);
    assert!(report.contains("level=raid5"), "{report}");
}

#[test]
fn a_grow_killed_between_its_new_members_superblocks_is_finished_by_continue() {
    // Two members added: killed after the first new member's superblock
    // (the second still blank), and after the second's (the old members
    // not yet recorded). `grow --continue` with every member given, the
    // blank one too, finishes either; the moved-offset grow (with a
    // write-intent bitmap and without) and the one in place alike.
    let cases = [
        ("5", "15M", 16, true, "none"),
        ("5", "15M", 16, true, "internal"),
        ("5", "7M", 12, false, "none"),
    ];
    for (level, size, new_mib, room, bitmap) in cases {
        for point in ["reshape-superblock:1", "reshape-superblock:2"] {
            let dir = tempfile::tempdir().unwrap();
            let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
            let mut args = vec![
                "create", "--level", level, "--bitmap", bitmap, "--size", size,
            ];
            if !room {
                args.extend(["--chunk", "1M"]);
            }
            args.extend(names.iter().map(String::as_str));
            ok(&args, dir.path());
            let per = if room { 14 * MIB } else { PER };
            let data = pattern(3 * per);
            std::fs::write(dir.path().join("data"), &data).unwrap();
            ok(&with(&["write", "--input", "data"], &names), dir.path());
            std::fs::remove_file(dir.path().join("data")).unwrap();
            let (a, b) = (
                blank_mib(dir.path(), "d4", new_mib),
                blank_mib(dir.path(), "d5", new_mib),
            );
            killed_at(
                dir.path(),
                &with(&["grow", "-n", "6", "--add", &a, "--add", &b], &names),
                point,
            );
            let mut m = names.clone();
            m.extend([a, b]);
            let out = ok(&with(&["grow", "--continue"], &m), dir.path());
            assert!(out.contains("to 6 members"), "{point}: {out}");
            assert_grown(dir.path(), &m, &data, 5 * per, point);
        }
    }
}

#[test]
fn a_blank_member_past_the_start_of_a_reshape_is_refused_by_name_unchanged() {
    // A grow killed after its first step was recorded: the new member's
    // bytes are on it, so a blank one in its place is not taken for it.
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = no_room(dir.path(), "5", 4);
    blank_mib(dir.path(), "d4", 12);
    killed_at(
        dir.path(),
        &with(&["grow", "-n", "5", "--add", "d4", "--step", "4M"], &old),
        "reshape-superblock:7",
    );
    blank_mib(dir.path(), "other", 12);
    let mut m = old.clone();
    m.push("other".into());
    refused(
        &with(&["grow", "--continue"], &m),
        dir.path(),
        &["other", "no md superblock", "position 0", "nvraid add"],
    );
}

/// A RAID `level` of `count` members of 15 MiB (1 MiB data offset, room
/// to move it), no bitmap, filled with the pattern.
fn roomy(dir: &Path, level: &str, count: usize) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", level, "--bitmap", "none", "--size", "15M",
    ];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let data_members = match level {
        "6" => count as u64 - 2,
        "10" => count as u64 / 2,
        _ => count as u64 - 1,
    };
    let data = pattern(data_members * 14 * MIB);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, data)
}

#[test]
fn a_degraded_raid5_or_raid6_grows_with_force_and_a_rebuild_makes_it_whole() {
    // RAID 5 of 4 without d3 to 5 members; RAID 6 of 4 without d0 and d3
    // to 5; a RAID 5 without room, in place: every byte reads back
    // degraded, a blank member rebuilt into the missing role checks clean.
    let cases: [(&str, &[usize], u64, &str, bool); 3] = [
        ("5", &[3], 16, "role 3 (missing)", true),
        ("6", &[0, 3], 16, "role 0 (missing)", true),
        ("5", &[1], 12, "role 1 (missing)", false),
    ];
    for (level, missing, new_mib, said, room) in cases {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, data) = if room {
            roomy(d, level, 4)
        } else {
            no_room(d, level, 4)
        };
        let given: Vec<String> = (0..4)
            .filter(|i| !missing.contains(i))
            .map(|i| m[i].clone())
            .collect();
        let new = blank_mib(d, "d4", new_mib);
        let out = ok(
            &with(
                &["grow", "-n", "5", "--add", &new, "--force", "--json"],
                &given,
            ),
            d,
        );
        let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(grown["raid_disks"], 5, "{grown}");
        assert!(grown["failed"].to_string().contains(said), "{grown}");
        let mut survivors = given.clone();
        survivors.push(new);
        let size = grown["size_bytes"].as_u64().unwrap();
        let got = read(d, &survivors, size);
        assert!(
            got[..data.len()] == data[..],
            "RAID {level}: the bytes read degraded differ"
        );
        assert!(got[data.len()..].iter().all(|&b| b == 0));
        let mut whole = survivors.clone();
        for (k, _) in missing.iter().enumerate() {
            let spare = blank_mib(d, &format!("s{k}"), new_mib);
            ok(&with(&["add", "--new", &spare], &whole), d);
            whole.push(spare);
        }
        assert_grown(d, &whole, &data, size, &format!("RAID {level} rebuilt"));
        // Every member's own bytes count: the new ones alone with parity.
        if level == "6" {
            assert!(read(d, &whole[2..], data.len() as u64) == data);
        }
    }
}

#[test]
fn a_degraded_array_is_grown_only_with_force_and_raid10_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, _) = roomy(d, "5", 4);
    let new = blank_mib(d, "d4", 16);
    refused(
        &with(&["grow", "-n", "5", "--add", &new], &m[..3]),
        d,
        &[
            "degraded",
            "role 3 is missing",
            "--force",
            "mdadm --grow --force",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, _) = roomy(d, "10", 4);
    let new = blank_mib(d, "d4", 16);
    refused(
        &with(&["grow", "-n", "5", "--add", &new, "--force"], &m[1..]),
        d,
        &["degraded", "raid10", "RAID 4/5/6"],
    );
}

/// A RAID `level` of 4 members in `dir/name` (named `name`), filled:
/// `no_room` or `roomy`, with the array's name set.
fn named(dir: &Path, name: &str, level: &str, room: bool) -> (PathBuf, Vec<String>, u64) {
    if room {
        named_sized(dir, name, level, &["--size", "15M"], 14 * MIB)
    } else {
        named_sized(dir, name, level, &["--size", "7M", "--chunk", "1M"], PER)
    }
}

/// A RAID `level` of 4 members created with `shape` in `dir/name` (named
/// `name`, no bitmap), `per` data bytes of each filled with the pattern;
/// the directory, the members and the pattern's length.
fn named_sized(
    dir: &Path,
    name: &str,
    level: &str,
    shape: &[&str],
    per: u64,
) -> (PathBuf, Vec<String>, u64) {
    let sub = dir.join(name);
    std::fs::create_dir(&sub).unwrap();
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", level, "--bitmap", "none", "--name", name,
    ];
    args.extend(shape);
    args.extend(names.iter().map(String::as_str));
    ok(&args, &sub);
    let data_members = if level == "6" { 2 } else { 3 };
    std::fs::write(sub.join("data"), pattern(data_members * per)).unwrap();
    ok(&with(&["write", "--input", "data"], &names), &sub);
    std::fs::remove_file(sub.join("data")).unwrap();
    (sub, names, data_members * per)
}

#[test]
fn the_kernel_assembles_what_nvraid_grew_degraded_or_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    // RAID 5 without d3 and RAID 6 without d0 and d3, grown with --force.
    for (name, level, missing) in [("force5", "5", vec![3]), ("force6", "6", vec![0, 3])] {
        let (sub, m, _) = named(dir.path(), name, level, true);
        let given: Vec<String> = (0..4)
            .filter(|i| !missing.contains(i))
            .map(|i| m[i].clone())
            .collect();
        let new = blank_mib(&sub, "d4", 16);
        ok(
            &with(&["grow", "-n", "5", "--add", &new, "--force"], &given),
            &sub,
        );
        images.extend(given.iter().chain([&new]).map(|n| sub.join(n)));
    }
    // A RAID 5 grown in place, killed past its critical section (every
    // member records the fourth step's position): md goes on from there.
    let (sub, m, _) = named(dir.path(), "past", "5", false);
    let new = blank_mib(&sub, "d4", 12);
    killed_at(
        &sub,
        &with(&["grow", "-n", "5", "--add", &new, "--step", "4M"], &m),
        "reshape-superblock:25",
    );
    images.extend(m.iter().chain([&new]).map(|n| sub.join(n)));
    // One killed inside it (the second step's position recorded): md
    // cannot restore nvraid's backup, and must not take it up.
    let (inside, inside_m, inside_bytes) = named(dir.path(), "inside", "5", false);
    let new = blank_mib(&inside, "d4", 12);
    killed_at(
        &inside,
        &with(
            &["grow", "-n", "5", "--add", &new, "--step", "4M"],
            &inside_m,
        ),
        "reshape-superblock:10",
    );
    let mut inside_all = inside_m.clone();
    inside_all.push(new);
    images.extend(inside_all.iter().map(|n| inside.join(n)));
    let report = kernel_reports(
        dir.path(),
        &images,
        &[
            ("force5", 3 * 14 * MIB),
            ("force6", 2 * 14 * MIB),
            ("past", 3 * PER),
        ],
    );
    for (name, level, degraded, size) in [
        ("force5", "raid5", 1, 4 * 14 * MIB),
        ("force6", "raid6", 2, 3 * 14 * MIB),
        ("past", "raid5", 0, 4 * PER),
    ] {
        let line = kernel_line(&report, name);
        assert!(
            line.contains(&format!("level={level} "))
                && line.contains("disks=5 ")
                && line.contains(&format!("degraded={degraded} "))
                && line.contains(&format!("size={size} "))
                && line.contains("pattern=ok")
                && (degraded > 0 || line.contains("mismatch=0")),
            "{line}\n{report}"
        );
    }
    assert!(
        report.contains("Failed to restore critical section")
            && !report
                .lines()
                .any(|l| l.starts_with("KERNEL ") && l.contains("inside")),
        "md took up a grow left inside its critical section:\n{report}"
    );
    // The images are as nvraid left them (md ran on snapshots): nvraid
    // puts the section back and finishes.
    ok(&with(&["grow", "--continue"], &inside_all), &inside);
    let got = read(&inside, &inside_all, 4 * PER);
    assert!(got[..inside_bytes as usize] == pattern(inside_bytes)[..]);
    assert_checks_clean(&inside, &inside_all, "inside, continued");
}

#[test]
fn a_degraded_grow_in_place_killed_in_its_critical_section_is_continued_degraded() {
    // A RAID 5 without d1 grown in place with --force, killed inside its
    // critical section (a backup write, member writes of the first and
    // second step, a checkpoint): `grow --continue` on the members given
    // puts the section back, reads around d1 and finishes.
    let template = tempfile::tempdir().unwrap();
    let (old, data) = no_room(template.path(), "5", 4);
    blank_mib(template.path(), "d4", 12);
    let given = vec![old[0].clone(), old[2].clone(), old[3].clone()];
    let grow = with(
        &["grow", "-n", "5", "--add", "d4", "--force", "--step", "4M"],
        &given,
    );
    let mut m = given.clone();
    m.push("d4".into());
    // 4 members written per step (d1 missing), then the flush.
    for point in [
        "reshape-backup:2",
        "reshape-write:2",
        "reshape-write:7",
        "reshape-superblock:6",
        "reshape-write:12",
    ] {
        let dir = copied(template.path());
        killed_at(dir.path(), &grow, point);
        let out = ok(
            &with(&["grow", "--continue", "--step", "4M"], &m),
            dir.path(),
        );
        assert!(out.contains("to 5 members"), "{point}: {out}");
        let got = read(dir.path(), &m, 4 * PER);
        assert!(got[..data.len()] == data[..], "{point}: the bytes differ");
        assert!(got[data.len()..].iter().all(|&b| b == 0), "{point}");
    }
}

#[test]
fn a_spoiled_backup_of_the_critical_section_is_refused_by_name_unchanged() {
    // Killed while the second step's rows were written; then a byte of
    // the backup's rows on d4 (the only copy) changes: `grow --continue`
    // cannot know the old rows, so it writes nothing and names d4.
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = no_room(dir.path(), "5", 4);
    blank_mib(dir.path(), "d4", 12);
    killed_at(
        dir.path(),
        &with(&["grow", "-n", "5", "--add", "d4", "--step", "4M"], &old),
        "reshape-write:8",
    );
    // d4's data starts at 1 MiB + 4 MiB + 4 KiB; its backup's rows (a
    // chunk of each of the 4 old members) end 4 KiB below that.
    let path = dir.path().join("d4");
    let mut image = std::fs::read(&path).unwrap();
    let at = (MIB + 4 * MIB + 4096 - 4096 - 2 * MIB) as usize;
    image[at] ^= 0x5a;
    std::fs::write(&path, &image).unwrap();
    let mut m = old.clone();
    m.push("d4".into());
    refused(
        &with(&["grow", "--continue"], &m),
        dir.path(),
        &["d4", "backup of the critical section", "checksum"],
    );
}

/// Which member fails inside the critical section, and how.
enum SectionFailure {
    /// An old member, every request (the backup's read of its rows fails).
    OldEverything,
    /// An old member, its writes only (the backup is made; the step's
    /// write of its rows fails, and the rows are put back and redone).
    OldWrites,
    /// A new member holding the backup, every request.
    NewHost,
}

/// Grow the in-place array `members` by `new` to `n` members, the member
/// named by `failure` reached through an nbdkit node that starts failing
/// while the grow is paused before the critical-section step at `at`;
/// the grow's output (it must succeed) and the names of the survivors.
fn grow_in_place_failing(
    d: &Path,
    members: &[String],
    new: &[String],
    n: &str,
    at: u64,
    failure: SectionFailure,
) -> (String, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let (victim, node) = match failure {
        SectionFailure::OldEverything => ("d1", FailingNode::up(d, "d1")),
        SectionFailure::OldWrites => ("d1", FailingNode::slow_failing_writes(d, "d1")),
        SectionFailure::NewHost => (new[0].as_str(), FailingNode::up(d, &new[0])),
    };
    let through = |name: &String| {
        if name == victim {
            node.uri()
        } else {
            name.clone()
        }
    };
    let mut args: Vec<String> = vec!["grow".into(), "-n".into(), n.into(), "--json".into()];
    for m in new {
        args.extend(["--add".into(), through(m)]);
    }
    args.extend(members.iter().map(through));
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(d)
        .env("NVRAID_PAUSE", format!("reshape-section:{at}:1500"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut paused = false;
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        if !paused && line.contains("pause point reshape-section reached") {
            node.fail();
            paused = true;
        }
        seen.push(line);
    }
    let out = child.wait_with_output().unwrap();
    let seen = seen.join("\n");
    assert!(
        paused,
        "the grow never reached the section step at {at}: {seen}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the grow did not go on degraded past {victim}'s failure: {seen}\n{stdout}"
    );
    drop(node);
    let survivors = members
        .iter()
        .chain(new)
        .filter(|m| m.as_str() != victim)
        .cloned()
        .collect();
    (stdout, survivors)
}

#[test]
fn a_member_failing_inside_the_critical_section_of_a_grow_in_place_is_recorded_faulty_and_the_grow_goes_on(
) {
    // RAID 5 of 4 members to 5: the steps from 0, 4 MiB and 8 MiB are the
    // critical section (see above); the failure comes before the second.
    for failure in [SectionFailure::OldEverything, SectionFailure::OldWrites] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, data) = no_room(d, "5", 4);
        let new = vec![blank_mib(d, "d4", 12)];
        let (out, survivors) = grow_in_place_failing(d, &m, &new, "5", 4 * MIB, failure);
        let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(grown["raid_disks"], 5, "{grown}");
        assert_degraded_holds(d, &survivors, 5, &data, 4 * PER);
    }
    // RAID 6 of 4 to 6: its one critical step is the first; one of the two
    // new members holding the backup fails, the other keeps it.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, data) = no_room(d, "6", 4);
    let new = vec![blank_mib(d, "d4", 12), blank_mib(d, "d5", 12)];
    let (_, survivors) = grow_in_place_failing(d, &m, &new, "6", 0, SectionFailure::NewHost);
    assert_degraded_holds(d, &survivors, 6, &data, 4 * PER);
}

/// A RAID `level` of 4 members of 24 MiB in chunks of 1 MiB in
/// `dir/name` (named `name`), no room below the data, filled: large
/// enough for mdadm's backup of the whole critical section at the tail of
/// the new members' data; the directory, the members and the pattern's
/// length.
fn named_roomy_tail(dir: &Path, name: &str, level: &str) -> (PathBuf, Vec<String>, u64) {
    named_sized(
        dir,
        name,
        level,
        &["--size", "24M", "--chunk", "1M"],
        23 * MIB,
    )
}

/// mdadm's backup record on the new member `name` (where mdadm looks: the
/// last 4 KiB of the used size from the data offset): its magic and its
/// length in sectors.
fn md_backup_record(dir: &Path, name: &str) -> (String, u64) {
    let sb = examine(dir, name);
    let at = (sb["data_offset_sectors"].as_u64().unwrap() + sb["size_sectors"].as_u64().unwrap())
        * 512
        - 4096;
    let image = std::fs::read(dir.join(name)).unwrap();
    let record = &image[at as usize..at as usize + 512];
    (
        String::from_utf8_lossy(&record[..16]).into_owned(),
        u64::from_le_bytes(record[56..64].try_into().unwrap()),
    )
}

#[test]
fn mdadm_restores_the_critical_section_of_a_grow_in_place_nvraid_left_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    let mut expect = Vec::new();
    // Killed with the first or second step's position recorded: inside
    // the section (RAID 5 4 -> 5: it ends at 12 MiB; RAID 6 4 -> 5: 6 MiB).
    // Killed past it: the record forgotten before the step past it.
    for (name, level, point, section) in [
        ("in5", "5", "reshape-superblock:10", Some(12 * MIB)),
        ("in6", "6", "reshape-superblock:10", Some(6 * MIB)),
        ("past5", "5", "reshape-superblock:25", None),
    ] {
        let (sub, m, bytes) = named_roomy_tail(dir.path(), name, level);
        let new = blank_mib(&sub, "d4", 32);
        killed_at(
            &sub,
            &with(&["grow", "-n", "5", "--add", &new, "--step", "4M"], &m),
            point,
        );
        let (magic, sectors) = md_backup_record(&sub, &new);
        assert_eq!(magic, "md_backup_data-1", "{name}: no mdadm record");
        match section {
            Some(len) => assert_eq!(sectors * 512, len, "{name}: the section's length"),
            None => assert_eq!(sectors, 0, "{name}: the record was not forgotten"),
        }
        let position = examine(&sub, "d0")["reshape_position"].as_u64().unwrap() * 512;
        assert!(
            section.is_none_or(|len| position > 0 && position < len),
            "{name}: killed at {position}, not inside the section"
        );
        images.extend(m.iter().chain([&new]).map(|n| sub.join(n)));
        let data_members = if level == "6" { 3 } else { 4 };
        expect.push((name, level, bytes, data_members * 23 * MIB));
    }
    let bytes: Vec<(&str, u64)> = expect.iter().map(|e| (e.0, e.2)).collect();
    let report = kernel_reports(dir.path(), &images, &bytes);
    assert!(
        report.contains("restoring critical section") && !report.contains("Failed to restore"),
        "mdadm did not restore the section:\n{report}"
    );
    for (name, level, _, size) in expect {
        let line = kernel_line(&report, name);
        assert!(
            line.contains(&format!("level=raid{level} "))
                && line.contains("disks=5 ")
                && line.contains("degraded=0 ")
                && line.contains(&format!("size={size} "))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0"),
            "{line}\n{report}"
        );
    }
}
