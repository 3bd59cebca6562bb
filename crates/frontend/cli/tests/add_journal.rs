//! `nvraid add-journal` (and `serve --cache journal --journal J` on RAID
//! 4/5/6, which adds md's journal the same way): an existing array gets md's
//! write journal, keeps its data, refuses what md would refuse without
//! touching a byte, and survives a crash in the middle of the change.
//! (tests/kernel_md.rs has the kernel assembling such an array.)

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// A RAID 5 of four 32 MiB members (a write-intent bitmap, the default)
/// holding a pattern; its members and the pattern's sha256.
fn raid5_with_data(d: &Path) -> (Vec<String>, String) {
    let members: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    let mut create = vec!["create", "--level", "5", "--size", "32M"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i * 7 + i / 4093) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    let mut write = vec!["write", "--input", "data"];
    write.extend(members.iter().map(String::as_str));
    ok(&write, d);
    std::fs::remove_file(d.join("data")).unwrap();
    (members, sha(&data))
}

/// The first 3 MiB of the array on `members`, hashed.
fn data_sha(d: &Path, members: &[String]) -> String {
    let mut read = vec!["read", "--length", "3M"];
    read.extend(members.iter().map(String::as_str));
    sha(&ok_bytes(&read, d))
}

fn detail(d: &Path, members: &[String]) -> serde_json::Value {
    let mut args = vec!["detail", "--json"];
    args.extend(members.iter().map(String::as_str));
    serde_json::from_str(&ok(&args, d)).unwrap()
}

fn add_journal_args<'a>(members: &'a [String], journal: &'a str) -> Vec<&'a str> {
    let mut args = vec!["add-journal", "--journal", journal];
    args.extend(members.iter().map(String::as_str));
    args
}

/// `add-journal --journal j` on `members`, the process aborted after
/// `written` superblock writes (failpoint `add-journal-superblock`).
fn add_journal_cut_short(d: &Path, members: &[String], written: u32) {
    let crashed = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(add_journal_args(members, "j"))
        .env(
            "NVRAID_FAILPOINT",
            format!("add-journal-superblock:{written}"),
        )
        .current_dir(d)
        .output()
        .unwrap();
    assert!(!crashed.status.success(), "{written}: {crashed:?}");
    assert!(
        String::from_utf8_lossy(&crashed.stderr).contains("failpoint"),
        "{crashed:?}"
    );
}

/// A server on `members` is sent 1 MiB of 0x5a at offset 0 (nbdcopy), then
/// killed with SIGKILL: the array is left needing its resync.
fn write_then_kill(d: &Path, members: &[String]) {
    let mut server = serve(d, members);
    std::fs::write(d.join("one"), vec![0x5au8; 1 << 20]).unwrap();
    let copied = Command::new("nbdcopy")
        .arg(d.join("one"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::remove_file(d.join("one")).unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
}

#[test]
fn add_journal_gives_a_raid5_mds_journal_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (members, pattern) = raid5_with_data(d);
    assert_eq!(detail(d, &members)["consistency_policy"], "bitmap");
    std::fs::write(d.join("j"), vec![0u8; 24 << 20]).unwrap();
    let mut args = add_journal_args(&members, "j");
    args.push("--json");
    let out = nvraid(&args, d);
    assert!(out.status.success(), "{out:?}");
    let added: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(added["journal"], "j");
    assert_eq!(added["bitmap_removed"], true);
    // 24 MiB less the 1 MiB metadata area.
    assert_eq!(added["log_bytes"], 23 << 20);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bitmap was removed"), "{stderr}");
    let mut all = members.clone();
    all.push("j".into());
    let d_json = detail(d, &all);
    assert_eq!(d_json["consistency_policy"], "journal", "{d_json}");
    assert_eq!(d_json["state"], "clean", "{d_json}");
    let states: Vec<&str> = d_json["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["active", "active", "active", "active", "journal"]);
    // Every superblock records the journal: the members' say it is needed
    // (a writable assembly without it is refused), the journal's own its role.
    let examined: serde_json::Value =
        serde_json::from_str(&ok(&["examine", "--json", "j"], d)).unwrap();
    assert_eq!(examined[0]["role"], "journal", "{examined}");
    let mut without = vec!["write", "--input", "/dev/null"];
    without.extend(members.iter().map(String::as_str));
    let refusal = refusal(&without, d);
    assert!(refusal.contains("journal member"), "{refusal}");
    assert_eq!(data_sha(d, &all), pattern);
    // A second journal is refused.
    std::fs::write(d.join("k"), vec![0u8; 24 << 20]).unwrap();
    refused(
        &add_journal_args(&all, "k"),
        d,
        &["k", "already has a write journal"],
    );
}

/// Every refusal names the culprit and changes no byte of any file.
#[test]
fn add_journal_refusals_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (members, _) = raid5_with_data(d);
    std::fs::write(d.join("small"), vec![0u8; 4 << 20]).unwrap();
    std::fs::write(d.join("fs"), vec![0u8; 24 << 20]).unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(d.join("fs"))
        .status()
        .unwrap();
    assert!(mkfs.success());
    std::fs::write(d.join("j"), vec![0u8; 24 << 20]).unwrap();
    refused(
        &add_journal_args(&members, "small"),
        d,
        &["small", "too small", "4194304"],
    );
    refused(
        &add_journal_args(&members, "m2"),
        d,
        &["m2", "a member of the array"],
    );
    refused(
        &add_journal_args(&members, "fs"),
        d,
        &["fs", "filesystem", "--force"],
    );
    refused(&add_journal_args(&members, "missing"), d, &["missing"]);
    refused(
        &add_journal_args(&members[..3], "j"),
        d,
        &["j", "degraded", "role 3"],
    );
    // The same through serve: nothing is added, nothing served.
    let mut serving = vec!["serve", "--listen", "unix:md.sock"];
    serving.extend(["--cache", "journal", "--journal", "small"]);
    serving.extend(members.iter().map(String::as_str));
    refused(&serving, d, &["small", "too small"]);
    // A member mid-rebuild (md's recovery offset recorded on it; a rebuild
    // by bitmap would lose the bitmap).
    {
        let path = d.join("m1");
        let mut bytes = std::fs::read(&path).unwrap();
        let mut sb = nvraid_metadata::Superblock::decode(&bytes[4096..8192]).unwrap();
        sb.feature_map |= nvraid_metadata::features::RECOVERY_OFFSET;
        sb.recovery_offset = 1 << 10;
        sb.encode(&mut bytes[4096..8192]).unwrap();
        let before = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        refused(
            &add_journal_args(&members, "j"),
            d,
            &["j", "m1 is being rebuilt"],
        );
        std::fs::write(&path, before).unwrap();
    }
    // Levels md journals not.
    ok(&["create", "--level", "1", "--size", "32M", "r0", "r1"], d);
    refused(
        &add_journal_args(&["r0".into(), "r1".into()], "j"),
        d,
        &["j", "raid1", "RAID 4/5/6"],
    );
    // md keeps a journal or a partial parity log.
    ok(
        &[
            "create",
            "--level",
            "5",
            "--size",
            "32M",
            "--consistency-policy",
            "ppl",
            "p0",
            "p1",
            "p2",
        ],
        d,
    );
    refused(
        &add_journal_args(&["p0".into(), "p1".into(), "p2".into()], "j"),
        d,
        &["j", "partial parity log"],
    );
    // An array that needs its resync (a server killed while writing).
    write_then_kill(d, &members);
    assert_eq!(
        detail(d, &members)["state"],
        "active",
        "md's word for not clean"
    );
    refused(&add_journal_args(&members, "j"), d, &["j", "resync"]);
}

/// A member held by a running server is refused.
#[test]
fn add_journal_refuses_members_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (members, _) = raid5_with_data(d);
    std::fs::write(d.join("j"), vec![0u8; 24 << 20]).unwrap();
    let server = serve(d, &members);
    refused(&add_journal_args(&members, "j"), d, &["m0", "in use"]);
    drop(server);
}

/// The process dies after each superblock write in turn (the journal's
/// first, then the members' one by one): the array still assembles with
/// its data, and the command run again finishes the job.
#[test]
fn add_journal_cut_short_by_a_crash_is_finished_by_running_it_again() {
    for written in 1..=4 {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (members, pattern) = raid5_with_data(d);
        std::fs::write(d.join("j"), vec![0u8; 24 << 20]).unwrap();
        add_journal_cut_short(d, &members, written);
        let mut all = members.clone();
        all.push("j".into());
        // Readable as it is, members one event behind or not.
        assert_eq!(data_sha(d, &all), pattern, "{written} superblocks written");
        let out = nvraid(&add_journal_args(&members, "j"), d);
        assert!(
            out.status.success(),
            "{written}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let after = detail(d, &all);
        assert_eq!(after["consistency_policy"], "journal", "{after}");
        assert_eq!(after["state"], "clean", "{after}");
        for m in after["members"].as_array().unwrap() {
            assert_eq!(m["events"], after["events"], "{written}: {after}");
        }
        for member in &all {
            let sb: serde_json::Value =
                serde_json::from_str(&ok(&["examine", "--json", member], d)).unwrap();
            let features = sb[0]["superblock"]["feature_map"].as_u64().unwrap();
            assert_ne!(features & 0x200, 0, "{member}: no journal feature: {sb}");
            assert_eq!(features & 0x1, 0, "{member}: still a bitmap: {sb}");
        }
        assert_eq!(data_sha(d, &all), pattern);
    }
}

/// Cut short after the journal's superblock, then served without the
/// journal and killed while writing: the array needs its resync, so the
/// re-run that would finish the job is refused (a journal would make md skip
/// the resync) until `repair` has run; then it finishes, and the array keeps
/// what was written.
#[test]
fn a_cut_short_add_on_an_array_then_crashed_waits_for_its_resync() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (members, _) = raid5_with_data(d);
    std::fs::write(d.join("j"), vec![0u8; 24 << 20]).unwrap();
    add_journal_cut_short(d, &members, 1);
    write_then_kill(d, &members);
    refused(&add_journal_args(&members, "j"), d, &["j", "resync"]);
    let mut repair = vec!["repair"];
    repair.extend(members.iter().map(String::as_str));
    ok(&repair, d);
    ok(&add_journal_args(&members, "j"), d);
    let mut all = members.clone();
    all.push("j".into());
    let after = detail(d, &all);
    assert_eq!(after["consistency_policy"], "journal", "{after}");
    assert_eq!(after["state"], "clean", "{after}");
    let mut read = vec!["read", "--length", "1M"];
    read.extend(all.iter().map(String::as_str));
    assert_eq!(ok_bytes(&read, d), vec![0x5au8; 1 << 20]);
    assert_checks_clean(d, &all, "parity after the resync and the journal");
}
