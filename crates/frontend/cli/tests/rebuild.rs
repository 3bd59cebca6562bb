//! `nvraid add` and `nvraid rebuild`: a replaced member is rebuilt from the
//! other copies; a rebuild cut short by kill -9 resumes from the checkpoint
//! in the new member's superblock; the real kernel md assembles both the
//! half-rebuilt and the rebuilt array and reads the same bytes; bad input
//! is refused with nothing changed.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A RAID 1 of a.img and b.img holding `data`, then b.img lost and the array
/// written degraded.
fn degraded_mirror(dir: &Path, size: &str, data: &[u8]) {
    ok(
        &["create", "--level", "1", "--size", size, "a.img", "b.img"],
        dir,
    );
    std::fs::write(dir.join("data"), data).unwrap();
    ok(&["write", "--input", "data", "a.img", "b.img"], dir);
    std::fs::remove_file(dir.join("b.img")).unwrap();
    ok(&["write", "--degraded", "--input", "data", "a.img"], dir);
}

fn detail(dir: &Path, members: &[&str]) -> serde_json::Value {
    let mut args = vec!["detail", "--json"];
    args.extend_from_slice(members);
    serde_json::from_slice(&ok_bytes(&args, dir)).unwrap()
}

#[test]
fn add_refuses_bad_new_members_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    degraded_mirror(d, "16M", &[5u8; 1 << 20]);
    std::fs::File::create(d.join("small.img"))
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    refused(
        &["add", "--new", "small.img", "a.img"],
        d,
        &["small.img", "too small"],
    );
    refused(
        &["add", "--new", "a.img", "a.img"],
        d,
        &["a.img: given both"],
    );
    ok(
        &["create", "--level", "1", "--size", "16M", "x.img", "y.img"],
        d,
    );
    refused(
        &["add", "--new", "x.img", "a.img"],
        d,
        &["x.img: already carries an md", "--force"],
    );
    ok(
        &[
            "create", "--level", "0", "--size", "16M", "r0.img", "r1.img",
        ],
        d,
    );
    std::fs::File::create(d.join("n.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    refused(
        &["add", "--new", "n.img", "r0.img", "r1.img"],
        d,
        &["raid0"],
    );
}

#[test]
fn a_lost_mirror_is_rebuilt_onto_a_new_member() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data: Vec<u8> = (0..(12u32 << 20)).map(|i| (i % 241) as u8).collect();
    degraded_mirror(d, "16M", &data);
    std::fs::File::create(d.join("new.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let out: serde_json::Value = serde_json::from_slice(&ok_bytes(
        &["add", "--json", "--new", "new.img", "a.img"],
        d,
    ))
    .unwrap();
    assert_eq!(out["outcome"], "rebuilt");
    assert_eq!(out["rebuilt"][0]["role"], 1);
    assert_eq!(out["rebuilt"][0]["bytes"], 15u64 << 20);
    let both = detail(d, &["a.img", "new.img"]);
    assert_eq!(both["state"], "clean", "{both}");
    // The new member alone holds the data.
    let alone = ok_bytes(&["read", "--length", "12M", "new.img"], d);
    assert!(alone == data, "new member content");
    // With the array complete, another new member becomes a spare.
    std::fs::File::create(d.join("spare.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let out: serde_json::Value = serde_json::from_slice(&ok_bytes(
        &["add", "--json", "--new", "spare.img", "a.img", "new.img"],
        d,
    ))
    .unwrap();
    assert_eq!(out["outcome"], "spare");
    let three = detail(d, &["a.img", "new.img", "spare.img"]);
    assert_eq!(three["members"][2]["state"], "spare", "{three}");
}

#[test]
fn a_rebuild_killed_half_way_resumes_and_the_kernel_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data: Vec<u8> = (0..(60u32 << 20)).map(|i| (i % 239) as u8 ^ 0x33).collect();
    degraded_mirror(d, "64M", &data);
    std::fs::File::create(d.join("new.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    // 63 MiB at 20 MB/s: about 3 s. Killed once its first checkpoint (after
    // a second) is on disk.
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(["add", "--rebuild-speed", "20", "--new", "new.img", "a.img"])
        .current_dir(d)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(50));
        let out = nvraid(&["detail", "--json", "a.img", "new.img"], d);
        let Ok(now) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            continue;
        };
        if now["members"][1]["in_sync_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0)
        {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let half = detail(d, &["a.img", "new.img"]);
    let in_sync = half["members"][1]["in_sync_bytes"]
        .as_u64()
        .expect("still recovering");
    assert!(in_sync > 0 && in_sync < 63 << 20, "{half}");
    // Until it is rebuilt, the array reads from the good copy: the same bytes.
    let read = ok_bytes(&["read", "--length", "60M", "a.img", "new.img"], d);
    assert!(read == data);

    // The kernel, given the half-rebuilt array, reads nvraid's data too.
    let mut whole = vec![0u8; 63 << 20];
    whole[..data.len()].copy_from_slice(&data);
    let expected = [sha(&whole)];
    kernel_reads(&[d.join("a.img"), d.join("new.img")], &expected);

    // Resumed: it starts at the checkpoint, not at 0.
    let out: serde_json::Value =
        serde_json::from_slice(&ok_bytes(&["rebuild", "--json", "a.img", "new.img"], d)).unwrap();
    assert_eq!(out["rebuilt"][0]["from_bytes"], in_sync, "{out}");
    let done = detail(d, &["a.img", "new.img"]);
    assert!(done["members"][1]["in_sync_bytes"].is_null(), "{done}");
    let alone = ok_bytes(&["read", "--length", "60M", "new.img"], d);
    assert!(alone == data, "rebuilt member content");
    kernel_reads(&[d.join("a.img"), d.join("new.img")], &expected);
}

/// Far and offset layouts rebuild too: the lost member's chunks come from
/// copies in other bands or rows of the other members.
#[test]
fn far_and_offset_raid10_members_are_rebuilt() {
    for layout in ["f2", "o2"] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let members = ["m0.img", "m1.img", "m2.img"];
        let mut create = vec![
            "create", "--level", "10", "--layout", layout, "--size", "16M",
        ];
        create.extend_from_slice(&members);
        ok(&create, d);
        let data: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 229) as u8).collect();
        std::fs::write(d.join("data"), &data).unwrap();
        let mut write = vec!["write", "--input", "data"];
        write.extend_from_slice(&members);
        ok(&write, d);
        std::fs::remove_file(d.join("m1.img")).unwrap();
        std::fs::File::create(d.join("n.img"))
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        ok(&["add", "--new", "n.img", "m0.img", "m2.img"], d);
        let check = ["check", "m0.img", "n.img", "m2.img"];
        assert_eq!(
            nvraid(&check, d).status.code(),
            Some(0),
            "{layout}: copies differ"
        );
        let read = ["read", "--length", "20M", "n.img", "m2.img", "m0.img"];
        assert!(ok_bytes(&read, d) == data, "{layout}");
        // Without m0, every chunk it held must come from the rebuilt member
        // (or m2): right only if the rebuild put each chunk where the
        // layout says.
        let read = ["read", "--length", "20M", "n.img", "m2.img"];
        assert!(ok_bytes(&read, d) == data, "{layout} without m0");
    }
}

#[test]
fn check_and_repair_a_raid10_copy_and_refuse_raid0() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = ["m0.img", "m1.img", "m2.img", "m3.img"];
    let mut create = vec!["create", "--level", "10", "--chunk", "64K", "--size", "16M"];
    create.extend_from_slice(&members);
    ok(&create, d);
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 233) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    let mut write = vec!["write", "--input", "data"];
    write.extend_from_slice(&members);
    ok(&write, d);
    // Member 3 holds copy 1 of chunks 1, 3, 5... (near=2 on 4 members):
    // garble 3 sectors of its data area at 200 KiB.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("m3.img"))
        .unwrap();
    f.write_all_at(&[0xee; 1536], (1 << 20) + (200 << 10))
        .unwrap();
    drop(f);
    let mut check = vec!["check", "--json"];
    check.extend_from_slice(&members);
    let out = nvraid(&check, d);
    assert_eq!(out.status.code(), Some(5));
    let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(found["mismatch_sectors"], 3, "{found}");
    let mut repair = vec!["repair", "--json"];
    repair.extend_from_slice(&members);
    let repaired: serde_json::Value = serde_json::from_slice(&ok_bytes(&repair, d)).unwrap();
    assert_eq!(repaired["repaired_sectors"], 3, "{repaired}");
    assert_eq!(repaired["resynced"], false, "a clean array needs no resync");
    assert_eq!(nvraid(&check, d).status.code(), Some(0));
    let mut read = vec!["read", "--length", "8M"];
    read.extend_from_slice(&members);
    assert!(ok_bytes(&read, d) == data, "repair kept the data");
    // RAID 0 has nothing to compare.
    ok(
        &[
            "create", "--level", "0", "--size", "16M", "r0.img", "r1.img",
        ],
        d,
    );
    refused(&["check", "r0.img", "r1.img"], d, &["raid0"]);
    refused(&["repair", "r0.img", "r1.img"], d, &["raid0"]);
}

/// `create --spares`: the spare carries the array's superblock with md's
/// spare role (the kernel assembles the array with it as a spare), and when
/// a member is lost `rebuild` puts the spare into the missing role.
#[test]
fn a_hot_spare_takes_over_a_lost_member() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "1", "--spares", "1", "--size", "16M", "a.img", "b.img", "s.img",
        ],
        d,
    );
    let three = detail(d, &["a.img", "b.img", "s.img"]);
    assert_eq!(three["members"][2]["state"], "spare", "{three}");
    let report = kernel_reads(
        &[d.join("a.img"), d.join("b.img"), d.join("s.img")],
        &[sha(&vec![0u8; 15 << 20])],
    );
    assert!(
        report.contains("spare"),
        "the kernel sees the spare: {report}"
    );
    let data: Vec<u8> = (0..(9u32 << 20)).map(|i| (i % 227) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    ok(&["write", "--input", "data", "a.img", "b.img", "s.img"], d);
    std::fs::remove_file(d.join("b.img")).unwrap();
    let out: serde_json::Value =
        serde_json::from_slice(&ok_bytes(&["rebuild", "--json", "s.img", "a.img"], d)).unwrap();
    assert_eq!(out["rebuilt"][0]["role"], 1, "{out}");
    assert!(ok_bytes(&["read", "--length", "9M", "s.img"], d) == data);
    refused(
        &[
            "create", "--level", "0", "--spares", "1", "--size", "16M", "x", "y", "z",
        ],
        d,
        &["spares for a raid0"],
    );
}

/// `replace`: the old member is failed and a new one rebuilt in its role;
/// a new member that does not fit is refused before anything changes.
#[test]
fn replace_rebuilds_a_new_member_in_the_old_ones_role() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "10", "--size", "16M", "a.img", "b.img", "c.img",
        ],
        d,
    );
    let data: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 223) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    ok(&["write", "--input", "data", "a.img", "b.img", "c.img"], d);
    std::fs::File::create(d.join("tiny.img"))
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    refused(
        &[
            "replace", "--old", "b.img", "--new", "tiny.img", "a.img", "b.img", "c.img",
        ],
        d,
        &["tiny.img", "too small"],
    );
    std::fs::File::create(d.join("n.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let out: serde_json::Value = serde_json::from_slice(&ok_bytes(
        &[
            "replace", "--json", "--old", "b.img", "--new", "n.img", "a.img", "b.img", "c.img",
        ],
        d,
    ))
    .unwrap();
    assert_eq!(out["rebuilt"][0]["role"], 1, "{out}");
    let after = detail(d, &["a.img", "b.img", "c.img", "n.img"]);
    let state = |path: &str| {
        after["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == path)
            .map(|m| m["state"].clone())
            .unwrap()
    };
    assert_eq!(state("n.img"), "active", "{after}");
    assert_eq!(state("b.img"), "faulty", "{after}");
    assert!(ok_bytes(&["read", "--length", "20M", "n.img", "a.img", "c.img"], d) == data);
    assert_eq!(
        nvraid(&["check", "a.img", "n.img", "c.img"], d)
            .status
            .code(),
        Some(0)
    );
}
