//! `nvraid grow --chunk` / `--layout`: an array restriped in place with
//! its members kept, in md's format (docs/reshape.md). Every byte reads
//! back after, with the parity right; a restripe killed at member and
//! superblock writes reads back mid-way and `grow --continue` finishes it
//! (the data offset moved down, forwards, and up, backwards); what md
//! refuses is refused by name with nothing written; the kernel's md
//! assembles a restriped array and finishes ones nvraid left mid-way.

mod common;

use common::reshape::*;
use common::*;
use std::path::Path;

/// Data bytes each member holds (`--size 15M` less 1 MiB of metadata).
const PER: u64 = 14 * MIB;

/// A RAID `level` of `count` members (`file_mib` MiB files, 15 MiB of
/// each used), `extra` create options, made clean and filled with the
/// pattern; the members' names and the bytes written.
fn filled(
    dir: &Path,
    level: &str,
    count: usize,
    file_mib: u64,
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
    // Members that were there already: the parity is made right first.
    ok(&with(&["repair"], &names), dir);
    let data_members = match level {
        "10" => count as u64 / 2,
        "6" => count as u64 - 2,
        _ => count as u64 - 1,
    };
    let data = pattern(data_members * PER);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, data)
}

fn no_mismatch(dir: &Path, members: &[String], what: &str) {
    let check = ok(&with(&["check", "--json"], members), dir);
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{what}: {check}");
}

#[test]
fn a_raid5_chunk_grows_then_shrinks_and_every_byte_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "5", 4, 15, &["--bitmap", "none"]);
    let out = ok(
        &with(&["grow", "--chunk", "256K", "--step", "1M", "--json"], &m),
        dir.path(),
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(grown["size_bytes"], 3 * PER, "{grown}");
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    // Room only below the data (15 MiB files): the offset moved down, by
    // at least the larger chunk.
    let offset = grown["data_offset_bytes"].as_u64().unwrap();
    assert!(offset <= MIB - 256 * 1024, "{grown}");
    let d = detail(dir.path(), &m);
    assert_eq!(d["chunk_bytes"], 256 * 1024, "{d}");
    assert_eq!(d["layout"], "left-symmetric", "{d}");
    assert_eq!(d["state"], "clean", "{d}");
    assert!(read(dir.path(), &m, 3 * PER) == data, "64K -> 256K");
    no_mismatch(dir.path(), &m, "64K -> 256K");
    // And down to 16 KiB chunks with a layout change, in the room left
    // (about as much now above the data as below it): the offset moves
    // by at least the larger chunk, either way.
    ok(
        &with(&["grow", "-c", "16K", "-p", "right-asymmetric"], &m),
        dir.path(),
    );
    let d = detail(dir.path(), &m);
    assert_eq!(d["chunk_bytes"], 16 * 1024, "{d}");
    assert_eq!(d["layout"], "right-asymmetric", "{d}");
    assert!(
        d["data_offset_bytes"].as_u64().unwrap().abs_diff(offset) >= 256 * 1024,
        "{d}"
    );
    assert!(read(dir.path(), &m, 3 * PER) == data, "256K -> 16K ra");
    no_mismatch(dir.path(), &m, "256K -> 16K ra");
}

#[test]
fn a_raid6_restriped_with_room_only_after_the_data_moves_it_up_and_reads_back() {
    // 17 MiB files of which 15 are used: more room after the data than
    // before it, so the data offset moves up and the reshape runs
    // backwards, as mdadm would run it. With a write-intent bitmap.
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "6", 5, 17, &["--bitmap", "internal"]);
    let out = ok(
        &with(
            &[
                "grow",
                "--chunk",
                "128K",
                "--layout",
                "left-symmetric-6",
                "--step",
                "1M",
                "--json",
            ],
            &m,
        ),
        dir.path(),
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        grown["data_offset_bytes"].as_u64().unwrap() >= MIB + 128 * 1024,
        "{grown}"
    );
    let d = detail(dir.path(), &m);
    assert_eq!(d["layout"], "left-symmetric-6", "{d}");
    assert_eq!(d["chunk_bytes"], 128 * 1024, "{d}");
    assert!(read(dir.path(), &m, 3 * PER) == data);
    no_mismatch(dir.path(), &m, "raid6 backwards");
    // P and Q both right: any two members gone, the bytes come back.
    assert!(read(dir.path(), &m[2..], 3 * PER) == data, "without 0, 1");
    assert!(read(dir.path(), &m[..3], 3 * PER) == data, "without 3, 4");
    let bitmap = detail(dir.path(), &m)["bitmap"].clone();
    assert!(bitmap.is_object(), "the bitmap is kept: {bitmap}");
    eprintln!("{bitmap}");
}

#[test]
fn a_raid10_near_chunk_change_reads_back_with_equal_copies() {
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "10", 4, 15, &["--bitmap", "internal"]);
    ok(
        &with(&["grow", "--chunk", "32K", "--step", "1M"], &m),
        dir.path(),
    );
    let d = detail(dir.path(), &m);
    assert_eq!(d["chunk_bytes"], 32 * 1024, "{d}");
    assert_eq!(d["layout"], "near=2", "{d}");
    assert!(read(dir.path(), &m, 2 * PER) == data);
    no_mismatch(dir.path(), &m, "raid10 64K -> 32K");
    // Each half of the pairs alone holds every byte.
    let seconds = vec![m[1].clone(), m[3].clone()];
    assert!(read(dir.path(), &seconds, 2 * PER) == data, "second copies");
}

#[test]
fn a_restripe_killed_at_any_write_reads_back_and_continues_either_way() {
    // Moving down (15 MiB files) and up (17 MiB files): killed while the
    // record is written (some members one event behind), inside a step
    // (rows written, not recorded), after a step's flush, at checkpoints,
    // and while the end is written; the bytes read back mid-way whenever
    // every member carries the record, and `grow --continue` finishes.
    let points = [
        "reshape-superblock:2",
        "reshape-superblock:4",
        "reshape-write:1",
        "reshape-write:3",
        "reshape-write:5", // a step written and flushed, not recorded
        "reshape-superblock:9",
        "reshape-write:23",
        "reshape-superblock:30",
        "reshape-write:61",
    ];
    for file_mib in [15, 17] {
        for point in points {
            let what = format!("{file_mib} MiB files, {point}");
            let dir = tempfile::tempdir().unwrap();
            let (m, data) = filled(dir.path(), "5", 4, file_mib, &["--bitmap", "internal"]);
            killed_at(
                dir.path(),
                &with(&["grow", "--chunk", "128K", "--step", "1M"], &m),
                point,
            );
            let examine = ok(&["examine", "d0"], dir.path());
            let recorded = examine.contains("Reshape Pos'n");
            if point != "reshape-superblock:2" {
                assert!(recorded, "{what}: {examine}");
                let got = read(dir.path(), &m, 3 * PER);
                assert!(got == data, "{what}: the bytes read mid-way differ");
            }
            ok(
                &with(&["grow", "--continue", "--step", "1M"], &m),
                dir.path(),
            );
            let d = detail(dir.path(), &m);
            assert_eq!(d["chunk_bytes"], 128 * 1024, "{what}: {d}");
            let got = read(dir.path(), &m, 3 * PER);
            assert!(got == data, "{what}: the bytes differ after --continue");
            no_mismatch(dir.path(), &m, &what);
        }
    }
}

#[test]
fn chunk_and_layout_changes_md_refuses_are_refused_by_name_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let r0: Vec<String> = (0..3).map(|i| format!("z{i}")).collect();
    ok(
        &with(&["create", "--level", "0", "--size", "15M"], &r0),
        dir.path(),
    );
    // A RAID 0's chunk changes (through md's RAID 4); its layout does not.
    refused(
        &with(&["grow", "--layout", "left-symmetric"], &r0),
        dir.path(),
        &["layout of a raid0", "--chunk"],
    );
    let r1: Vec<String> = (0..2).map(|i| format!("m{i}")).collect();
    ok(
        &with(&["create", "--level", "1", "--size", "15M"], &r1),
        dir.path(),
    );
    refused(
        &with(&["grow", "--chunk", "128K"], &r1),
        dir.path(),
        &["raid1", "neither"],
    );
    let r10: Vec<String> = (0..4).map(|i| format!("t{i}")).collect();
    ok(
        &with(&["create", "--level", "10", "--size", "15M"], &r10),
        dir.path(),
    );
    refused(
        &with(&["grow", "--layout", "n3"], &r10),
        dir.path(),
        &["number of copies"],
    );
    refused(
        &with(&["grow", "--layout", "f2"], &r10),
        dir.path(),
        &["far layout", "md refuses"],
    );
    let f2: Vec<String> = (0..4).map(|i| format!("f{i}")).collect();
    ok(
        &with(
            &["create", "--level", "10", "--layout", "f2", "--size", "15M"],
            &f2,
        ),
        dir.path(),
    );
    refused(
        &with(&["grow", "--chunk", "128K"], &f2),
        dir.path(),
        &["far=2", "only the near layout"],
    );
    let r5: Vec<String> = (0..4).map(|i| format!("p{i}")).collect();
    ok(
        &with(
            &[
                "create", "--level", "5", "--bitmap", "none", "--size", "15M",
            ],
            &r5,
        ),
        dir.path(),
    );
    // 14 MiB per member is no whole number of 4 MiB chunks.
    refused(
        &with(&["grow", "--chunk", "4M"], &r5),
        dir.path(),
        &["would shrink", "multiple of the new chunk"],
    );
    refused(
        &with(&["grow", "--chunk", "64K"], &r5),
        dir.path(),
        &["nothing to change"],
    );
    refused(
        &with(&["grow", "--chunk", "48K"], &r5),
        dir.path(),
        &["--chunk"],
    );
    refused(
        &with(&["grow", "--layout", "sideways"], &r5),
        dir.path(),
        &["--layout", "sideways"],
    );
    refused(
        &with(&["grow", "--chunk", "128K"], &r5[..3]),
        dir.path(),
        &["degraded", "role 3 is missing"],
    );
}

#[test]
fn a_restripe_with_no_room_on_either_side_is_refused_and_nothing_is_written() {
    // 1 MiB chunks over 15 MiB files: the room before the data (below 1
    // MiB, above the superblock and bitmap) is less than the chunk, and
    // nothing is free after it.
    let dir = tempfile::tempdir().unwrap();
    let m: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    ok(
        &with(
            &["create", "--level", "5", "--chunk", "1M", "--size", "15M"],
            &m,
        ),
        dir.path(),
    );
    refused(
        &with(&["grow", "--chunk", "512K"], &m),
        dir.path(),
        &["free before the data", "larger chunk", "backup file"],
    );
}

#[test]
fn the_kernel_assembles_a_restriped_array_and_finishes_ones_nvraid_left_mid_way() {
    // RAID 5 of 4 members, 64K -> 128K chunks and left-symmetric ->
    // right-asymmetric: one restriped to the end, one left mid-way moving
    // its data offset down (forwards), one mid-way moving it up
    // (backwards, 17 MiB files). md assembles all three, finishes the two,
    // reads the pattern and finds no mismatch, in the new shape.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, file_mib, point) in [
        ("done", 15, None),
        ("down", 15, Some("reshape-write:23")),
        ("up", 17, Some("reshape-write:23")),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (m, _) = filled(
            &sub,
            "5",
            4,
            file_mib,
            &["--bitmap", "none", "--name", name],
        );
        let args = with(
            &[
                "grow",
                "--chunk",
                "128K",
                "--layout",
                "right-asymmetric",
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
    let report = kernel_finishes(&images, 3 * PER);
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 3, "three arrays expected:\n{report}");
    for line in lines {
        assert!(
            line.contains("level=raid5")
                && line.contains("layout=1 ")
                && line.contains("chunk=131072")
                && line.contains(&format!("size={}", 3 * PER))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("reshape=none"),
            "{line}\n{report}"
        );
    }
}

#[test]
fn a_raid10_with_more_room_after_the_data_moves_it_up_and_reads_back_with_equal_copies() {
    // 17 MiB files of which 15 are used: more room after the data than
    // before it, so a RAID 10 near's chunk change moves the data offset up
    // and runs backwards from the array's end, as mdadm picks for it too
    // (nvraid used to move a RAID 10's offset down only). With a bitmap.
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "10", 4, 17, &["--bitmap", "internal"]);
    let out = ok(
        &with(&["grow", "--chunk", "32K", "--step", "1M", "--json"], &m),
        dir.path(),
    );
    let grown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        grown["data_offset_bytes"].as_u64().unwrap() >= MIB + 64 * 1024,
        "the offset did not move up: {grown}"
    );
    let d = detail(dir.path(), &m);
    assert_eq!(d["chunk_bytes"], 32 * 1024, "{d}");
    assert_eq!(d["layout"], "near=2", "{d}");
    assert!(read(dir.path(), &m, 2 * PER) == data);
    no_mismatch(dir.path(), &m, "raid10 up 64K -> 32K");
    let firsts = vec![m[0].clone(), m[2].clone()];
    assert!(read(dir.path(), &firsts, 2 * PER) == data, "first copies");
    let seconds = vec![m[1].clone(), m[3].clone()];
    assert!(read(dir.path(), &seconds, 2 * PER) == data, "second copies");
    assert!(d["bitmap"].is_object(), "the bitmap is kept: {d}");
}

#[test]
fn a_raid10_restripe_moving_up_killed_mid_way_reads_back_and_continues() {
    for point in [
        "reshape-superblock:4",
        "reshape-write:3",
        "reshape-write:5",
        "reshape-superblock:9",
        "reshape-write:23",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (m, data) = filled(dir.path(), "10", 4, 17, &["--bitmap", "internal"]);
        killed_at(
            dir.path(),
            &with(&["grow", "--chunk", "128K", "--step", "1M"], &m),
            point,
        );
        let examine = ok(&["examine", "d0"], dir.path());
        assert!(
            examine.contains("Reshape Pos'n") && examine.contains("RESHAPE_BACKWARDS"),
            "{point}: not left moving up: {examine}"
        );
        let got = read(dir.path(), &m, 2 * PER);
        assert!(got == data, "{point}: the bytes read mid-way differ");
        ok(
            &with(&["grow", "--continue", "--step", "1M"], &m),
            dir.path(),
        );
        let d = detail(dir.path(), &m);
        assert_eq!(d["chunk_bytes"], 128 * 1024, "{point}: {d}");
        assert!(
            read(dir.path(), &m, 2 * PER) == data,
            "{point}: after --continue"
        );
        no_mismatch(dir.path(), &m, point);
    }
}

#[test]
fn the_kernel_finishes_a_raid10_restripe_nvraid_left_moving_up() {
    // RAID 10 near of 4 over 17 MiB files, 64K -> 32K chunks, the offset
    // moving up: one restriped to the end, one left mid-way (backwards).
    // md assembles both, finishes the second, reads the pattern, finds the
    // copies equal.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, point) in [("up", None), ("upmid", Some("reshape-write:23"))] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (m, _) = filled(&sub, "10", 4, 17, &["--bitmap", "none", "--name", name]);
        let args = with(&["grow", "--chunk", "32K", "--step", "1M"], &m);
        match point {
            None => {
                ok(&args, &sub);
            }
            Some(point) => {
                killed_at(&sub, &args, point);
                let examine = ok(&["examine", "d0"], &sub);
                assert!(
                    examine.contains("Reshape Pos'n") && examine.contains("RESHAPE_BACKWARDS"),
                    "{name}: not left moving up: {examine}"
                );
            }
        }
        images.extend(m.iter().map(|n| sub.join(n)));
    }
    let report = kernel_finishes(&images, 2 * PER);
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 2, "two arrays expected:\n{report}");
    for line in lines {
        assert!(
            line.contains("level=raid10")
                && line.contains("chunk=32768")
                && line.contains(&format!("size={}", 2 * PER))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("reshape=none"),
            "{line}\n{report}"
        );
    }
}

/// A RAID 5 of four taken to RAID 6 with a fifth member (md's `-6`
/// layout: Q on the last member), filled with the pattern.
fn raid6_of_the_takeover(dir: &Path) -> (Vec<String>, Vec<u8>) {
    let (mut m, data) = filled(dir, "5", 4, 15, &["--bitmap", "none"]);
    let f = std::fs::File::create(dir.join("d4")).unwrap();
    f.set_len(15 * MIB).unwrap();
    ok(
        &with(&["grow", "--level", "6", "-n", "5", "--add", "d4"], &m),
        dir,
    );
    m.push("d4".into());
    assert_eq!(detail(dir, &m)["layout"], "left-symmetric-6");
    (m, data)
}

#[test]
fn a_raid6_left_in_a_minus6_layout_by_the_takeover_is_normalised_and_reads_back() {
    // mdadm's `--layout normalise` (and the ordinary layout named): the
    // `-6` layout's rotation with P and Q rotating, every byte read back,
    // P and Q right; also killed mid-way and continued.
    for (layout, point) in [
        ("normalise", None),
        ("left-symmetric", Some("reshape-write:7")),
        ("normalise", Some("reshape-superblock:12")),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, data) = raid6_of_the_takeover(d);
        let args = with(&["grow", "--layout", layout, "--step", "1M"], &m);
        match point {
            None => {
                ok(&args, d);
            }
            Some(point) => {
                killed_at(d, &args, point);
                let mid = read(d, &m, 3 * PER);
                assert!(mid == data, "{point}: mid-way");
                ok(&with(&["grow", "--continue", "--step", "1M"], &m), d);
            }
        }
        let what = format!("{layout} {point:?}");
        let dd = detail(d, &m);
        assert_eq!(dd["layout"], "left-symmetric", "{what}: {dd}");
        assert_eq!(dd["level"], 6, "{what}: {dd}");
        assert_eq!(dd["chunk_bytes"], 64 * 1024, "{what}: {dd}");
        assert!(read(d, &m, 3 * PER) == data, "{what}");
        no_mismatch(d, &m, &what);
        assert!(read(d, &m[2..], 3 * PER) == data, "{what}: without 0, 1");
        assert!(read(d, &m[..3], 3 * PER) == data, "{what}: without 3, 4");
    }
}

#[test]
fn normalise_of_a_raid6_in_an_ordinary_layout_or_of_a_raid5_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m6, _) = filled(d, "6", 4, 15, &["--bitmap", "none"]);
    let sub = d.join("r5");
    std::fs::create_dir(&sub).unwrap();
    let (m5, _) = filled(&sub, "5", 3, 15, &["--bitmap", "none"]);
    let bytes = |dir: &Path, m: &[String]| -> Vec<Vec<u8>> {
        m.iter()
            .map(|n| std::fs::read(dir.join(n)).unwrap())
            .collect()
    };
    let (before6, before5) = (bytes(d, &m6), bytes(&sub, &m5));
    refused(
        &with(&["grow", "--layout", "normalise"], &m6),
        d,
        &["normalise", "ordinary layout already"],
    );
    refused(
        &with(&["grow", "--layout", "normalise"], &m5),
        &sub,
        &["normalise", "-6 layout", "raid5"],
    );
    // `preserve` with nothing else to change: nothing to do.
    refused(
        &with(&["grow", "--layout", "preserve"], &m6),
        d,
        &["nothing to change"],
    );
    assert!(bytes(d, &m6) == before6, "a RAID 6 byte changed");
    assert!(bytes(&sub, &m5) == before5, "a RAID 5 byte changed");
}

/// A RAID 0 of `count` members (15 MiB files, no bitmap) named `name`,
/// filled with the pattern.
fn raid0_filled(dir: &Path, count: usize, name: &str) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    let mut args = vec!["create", "--level", "0", "--size", "15M", "--name", name];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let data = pattern(count as u64 * PER);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, data)
}

#[test]
fn a_raid0_chunk_changes_through_md_raid4_and_is_a_raid0_again() {
    // md's way: taken over as a RAID 4 of one more member (its parity
    // missing), restriped, taken back. Uninterrupted both ways, and
    // killed in the record, a step, a checkpoint and late, then continued
    // from the members alone (the parity role was never held).
    for (chunk, point) in [
        ("256K", None),
        ("16K", Some("reshape-superblock:2")),
        ("256K", Some("reshape-write:3")),
        ("16K", Some("reshape-superblock:9")),
        ("256K", Some("reshape-write:60")),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, data) = raid0_filled(d, 3, "r0c");
        let layout = detail(d, &m)["layout"].clone();
        let args = with(&["grow", "--chunk", chunk, "--step", "1M"], &m);
        match point {
            None => {
                let out = ok(&args, d);
                assert!(out.contains("restriped in place over 3 members"), "{out}");
            }
            Some(point) => {
                killed_at(d, &args, point);
                let e: serde_json::Value =
                    serde_json::from_str(&ok(&["examine", "--json", "d0"], d)).unwrap();
                let sb = &e[0]["superblock"];
                if point != "reshape-superblock:2" || sb["level"] == 4 {
                    assert_eq!(sb["level"], 4, "{point}: md's RAID 4: {e}");
                    assert_eq!(sb["raid_disks"], 4, "{point}: {e}");
                }
                let out = ok(&with(&["grow", "--continue", "--step", "1M"], &m), d);
                assert!(out.contains("3 members"), "{point}: {out}");
            }
        }
        let what = format!("{chunk} {point:?}");
        let dd = detail(d, &m);
        assert_eq!(dd["level"], 0, "{what}: {dd}");
        assert_eq!(dd["raid_disks"], 3, "{what}: {dd}");
        assert_eq!(dd["layout"], layout, "{what}: {dd}");
        assert_eq!(
            dd["chunk_bytes"],
            if chunk == "16K" {
                16 * 1024
            } else {
                256 * 1024
            },
            "{what}: {dd}"
        );
        assert_eq!(dd["size_bytes"], 3 * PER, "{what}: {dd}");
        assert!(read(d, &m, 3 * PER) == data, "{what}: the bytes differ");
        if point.is_none() {
            // And back down to 32K, from the first restripe's shape.
            ok(&with(&["grow", "-c", "32K", "--step", "1M"], &m), d);
            assert_eq!(detail(d, &m)["chunk_bytes"], 32 * 1024);
            assert!(read(d, &m, 3 * PER) == data, "256K -> 32K");
        }
    }
}

#[test]
fn a_raid0_layout_change_or_a_chunk_that_shrinks_it_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, _) = raid0_filled(d, 2, "r0r");
    let before: Vec<Vec<u8>> = m
        .iter()
        .map(|n| std::fs::read(d.join(n)).unwrap())
        .collect();
    refused(
        &with(&["grow", "--layout", "left-symmetric"], &m),
        d,
        &["layout of a raid0"],
    );
    // 14 MiB per member is no multiple of 4 MiB chunks.
    refused(&with(&["grow", "--chunk", "4M"], &m), d, &["shrink"]);
    let after: Vec<Vec<u8>> = m
        .iter()
        .map(|n| std::fs::read(d.join(n)).unwrap())
        .collect();
    assert!(after == before, "a byte changed");
}
