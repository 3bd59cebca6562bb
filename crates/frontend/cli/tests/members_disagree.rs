//! Members whose superblocks disagree or are damaged, and messages that
//! must not mislead: every command either refuses, naming the member and
//! the field, or serves the whole array as md would; never a short read
//! with exit 0.

mod common;

use common::*;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Where md's v1.2 superblock lives on a member.
const SB_AT: u64 = 4096;

/// A superblock field nvraid reads the geometry from: name (as messages
/// call it), byte offset, width.
const FIELDS: [(&str, usize, usize); 7] = [
    ("level", 72, 4),
    ("layout", 76, 4),
    ("size", 80, 8),
    ("chunk_size", 88, 4),
    ("raid_disks", 92, 4),
    ("data_offset", 128, 8),
    ("data_size", 136, 8),
];

/// The extreme values of the issue (0, 1, 3, 2^63, the largest), cut to
/// the field's width.
fn extremes(width: usize) -> [u64; 5] {
    let top = if width == 4 {
        u64::from(u32::MAX)
    } else {
        u64::MAX
    };
    [0, 1, 3, 1u64 << (width * 8 - 1), top]
}

fn superblock(path: &Path) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut sb = vec![0u8; 4096];
    f.read_exact_at(&mut sb, SB_AT).unwrap();
    sb
}

fn put_superblock(path: &Path, sb: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(sb, SB_AT).unwrap();
}

/// `sb` with `value` at `at` (`width` bytes, little-endian) and md's
/// checksum made valid again.
fn with_field(sb: &[u8], at: usize, width: usize, value: u64) -> Vec<u8> {
    let mut out = sb.to_vec();
    out[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
    let max_dev = u32::from_le_bytes(out[220..224].try_into().unwrap()) as usize;
    let csum = nvraid_metadata::checksum(&out[..256 + 2 * max_dev]);
    out[216..220].copy_from_slice(&csum.to_le_bytes());
    out
}

/// An array of `level` over `names` (4 MiB each), filled with a pattern;
/// the pattern (the whole array).
fn filled(dir: &Path, level: &str, names: &[&str]) -> Vec<u8> {
    let mut args = vec!["create", "--level", level, "--size", "4M"];
    args.extend_from_slice(names);
    ok(&args, dir);
    let mut detail = vec!["detail", "--json"];
    detail.extend_from_slice(names);
    let d: serde_json::Value = serde_json::from_str(&ok(&detail, dir)).unwrap();
    let size = d["size_bytes"].as_u64().unwrap() as usize;
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(dir.join("in"), &data).unwrap();
    let mut write = vec!["write", "--input", "in"];
    write.extend_from_slice(names);
    ok(&write, dir);
    data
}

/// Every order of `names` worth trying: as given, and each rotation of it
/// reversed and not (every order for two or three members).
fn orders<'a>(names: &[&'a str]) -> Vec<Vec<&'a str>> {
    let mut out: Vec<Vec<&str>> = Vec::new();
    for r in 0..names.len() {
        let mut o = names.to_vec();
        o.rotate_left(r);
        out.push(o.clone());
        o.reverse();
        out.push(o);
    }
    out.sort();
    out.dedup();
    out
}

/// Run `detail`, `read` and `assemble` on `order`: each either refuses
/// (exit 1) naming `culprit` and `field`, or shows the whole array and
/// reads back exactly `data`.
fn judge(dir: &Path, order: &[&str], data: &[u8], culprit: &str, field: &str, what: &str) {
    for command in ["detail", "read", "assemble"] {
        let mut args = vec![command];
        if command != "read" {
            args.push("--json");
        }
        args.extend_from_slice(order);
        let out = nvraid(&args, dir);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{what}: {args:?}: {stderr}");
        match out.status.code() {
            Some(0) if command == "read" => assert!(
                out.stdout == data,
                "{what}: {args:?} read {} bytes of {} with exit 0",
                out.stdout.len(),
                data.len()
            ),
            Some(0) => {
                let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(
                    d["size_bytes"].as_u64(),
                    Some(data.len() as u64),
                    "{what}: {args:?} shows another size: {d}"
                );
            }
            Some(1) => {
                assert!(
                    stderr.contains(culprit) && stderr.contains(field),
                    "{what}: {args:?} refused without naming {culprit} and {field}: {stderr}"
                );
                said_once(&stderr);
            }
            other => panic!("{what}: {args:?} exit {other:?}: {stderr}"),
        }
    }
}

/// Each geometry field of one member, set to each extreme value with a
/// valid checksum, in every member order: refused by name or read whole.
fn one_member_disagrees(level: &str, names: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = filled(d, level, names);
    for culprit in names {
        let path = d.join(culprit);
        let original = superblock(&path);
        for (field, at, width) in FIELDS {
            for value in extremes(width) {
                put_superblock(&path, &with_field(&original, at, width, value));
                for order in orders(names) {
                    let what = format!("raid{level}, {culprit}'s {field} = {value}");
                    judge(d, &order, &data, culprit, field, &what);
                }
            }
        }
        put_superblock(&path, &original);
    }
    let mut read = vec!["read"];
    read.extend_from_slice(names);
    assert!(ok_bytes(&read, d) == data, "restored");
}

#[test]
fn a_geometry_field_one_raid1_member_disagrees_on_is_refused_by_name_in_any_order() {
    one_member_disagrees("1", &["m0", "m1"]);
}

#[test]
fn a_geometry_field_one_raid5_member_disagrees_on_is_refused_by_name_in_any_order() {
    one_member_disagrees("5", &["m0", "m1", "m2"]);
}

/// The case: member 1's `size` at 3 sectors made `read` return
/// 1,536 bytes with exit 0 when it was named first.
#[test]
fn a_member_whose_size_disagrees_is_named_whichever_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    filled(d, "1", &["m0", "m1"]);
    let path = d.join("m1");
    put_superblock(&path, &with_field(&superblock(&path), 80, 8, 3));
    for order in [["m1", "m0"], ["m0", "m1"]] {
        let mut args = vec!["read"];
        args.extend_from_slice(&order);
        // Two members: no majority; both are named, with both values.
        refused(
            &args,
            d,
            &[
                "superblock's size is",
                "3 sectors",
                "6144 sectors",
                "m0",
                "m1",
                "disagree",
            ],
        );
    }
    // `serve` exported 1,536 bytes: now it refuses too, before listening.
    let stderr = refusal(&["serve", "--listen", "unix:md.sock", "m1", "m0"], d);
    assert!(
        stderr.contains("size is") && stderr.contains("disagree"),
        "{stderr}"
    );
    // Three members: the one the others outvote is named.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    filled(d, "1", &["a", "b", "c"]);
    let path = d.join("a");
    put_superblock(&path, &with_field(&superblock(&path), 80, 8, 3));
    for order in orders(&["a", "b", "c"]) {
        let mut args = vec!["detail"];
        args.extend_from_slice(&order);
        refused(&args, d, &["a: its superblock's size is 3 sectors"]);
    }
}

#[test]
fn a_member_with_a_bad_superblock_checksum_is_set_aside_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = filled(d, "1", &["m0", "m1"]);
    let path = d.join("m1");
    let mut sb = superblock(&path);
    sb[100] ^= 0x77; // new_level: covered by the checksum only
    put_superblock(&path, &sb);
    for order in [["m1", "m0"], ["m0", "m1"]] {
        let mut args = vec!["detail", "--json"];
        args.extend_from_slice(&order);
        let out = nvraid(&args, d);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(
            stderr.contains("m1") && stderr.contains("checksum mismatch"),
            "the warning names the member and the reason: {stderr}"
        );
        let detail: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let m1 = detail["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == "m1")
            .unwrap();
        assert_eq!(m1["state"], "invalid", "{detail}");
        assert!(
            m1["reason"]
                .as_str()
                .unwrap()
                .contains("md superblock checksum mismatch"),
            "{detail}"
        );
        assert!(detail["state"].as_str().unwrap().contains("degraded"));
        let mut read = vec!["read"];
        read.extend_from_slice(&order);
        assert!(ok_bytes(&read, d) == data);
        // `assemble` says degraded (exit 3), as `assemble --scan` does.
        let mut assemble = vec!["assemble"];
        assemble.extend_from_slice(&order);
        assert_eq!(nvraid(&assemble, d).status.code(), Some(3));
    }
    let scan = nvraid(&["assemble", "--scan", "m0", "m1"], d);
    assert_eq!(scan.status.code(), Some(3));
    // `examine` looks at the one superblock: it refuses it.
    refused(
        &["examine", "m1"],
        d,
        &["m1: md superblock checksum mismatch"],
    );
    // With no good superblock left, the array cannot start: both named.
    let path = d.join("m0");
    let mut sb = superblock(&path);
    sb[100] ^= 0x77;
    put_superblock(&path, &sb);
    refused(
        &["read", "m0", "m1"],
        d,
        &[
            "cannot start",
            "m0 (its superblock is damaged",
            "m1 (its superblock",
        ],
    );
}

#[test]
fn create_refuses_a_size_no_member_can_have_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for level in ["1", "0", "5"] {
        let stderr = refusal(
            &[
                "create",
                "--level",
                level,
                "--size",
                "18446744073709551615",
                "m0",
                "m1",
                "m2",
            ],
            d,
        );
        assert!(
            stderr.contains("--size 18446744073709551615") && stderr.contains("signed 64-bit"),
            "{stderr}"
        );
        assert!(!stderr.contains("integral type"), "{stderr}");
    }
    assert!(hash_files(d).is_empty(), "no member file was created");
}

#[test]
fn option_errors_name_the_flag_not_the_array_name_twice() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (args, needle) in [
        (
            &["--level", "1", "--bitmap-chunk", "3K"][..],
            "--bitmap-chunk 3072",
        ),
        (
            &["--level", "1", "--consistency-policy", "ppl"][..],
            "--consistency-policy ppl",
        ),
        (
            &["--level", "0", "--bitmap", "internal"][..],
            "--bitmap internal",
        ),
    ] {
        let mut all = vec!["create", "--size", "8M"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["m0", "m1", "m2"]);
        refused(&all, d, &[needle]);
        let stderr = refusal(&all, d);
        assert!(stderr.starts_with("nvraid: "), "{stderr}");
        assert!(!stderr.contains("nvraid: nvraid"), "{stderr}");
    }
}

#[test]
fn a_name_longer_than_md_holds_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let long = "n".repeat(200);
    refused(
        &[
            "create", "--level", "1", "--size", "8M", "--name", &long, "m0", "m1",
        ],
        d,
        &["--name", "200 bytes", "at most 32"],
    );
    assert!(hash_files(d).is_empty(), "no member file was created");
    let full = "x".repeat(32);
    ok(
        &[
            "create", "--level", "1", "--size", "8M", "--name", &full, "m0", "m1",
        ],
        d,
    );
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&["detail", "--json", "m0", "m1"], d)).unwrap();
    assert_eq!(detail["name"], full.as_str());
}

/// What a rebuild cut short leaves on the new member: RECOVERY_OFFSET with
/// its checkpoint.
fn recovering(path: &Path, in_sync_sectors: u64) {
    let sb = superblock(path);
    let features = u32::from_le_bytes(sb[8..12].try_into().unwrap());
    let sb = with_field(&sb, 8, 4, u64::from(features | 2));
    put_superblock(path, &with_field(&sb, 152, 8, in_sync_sectors));
}

#[test]
fn a_member_being_rebuilt_is_shown_rebuilding_not_active() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(&["create", "--level", "1", "--size", "24M", "m0", "m1"], d);
    recovering(&d.join("m1"), 2048);
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&["detail", "--json", "m0", "m1"], d)).unwrap();
    assert_eq!(detail["members"][0]["state"], "active", "{detail}");
    assert_eq!(detail["members"][1]["state"], "rebuilding", "{detail}");
    assert_eq!(detail["members"][1]["in_sync_bytes"], 1 << 20, "{detail}");
    let text = ok(&["detail", "m0", "m1"], d);
    let line = text
        .lines()
        .find(|l| l.ends_with("m1") || l.contains(" m1 "))
        .unwrap();
    assert!(line.contains("rebuilding"), "{text}");

    // A server resumes the rebuild (slowly here): `status` says so too.
    let _server = serve_with(d, &["m0".into(), "m1".into()], &["--rebuild-speed", "1:1"]);
    let control = d.join("md.ctl");
    let socket = control.to_str().unwrap();
    let status: serde_json::Value =
        serde_json::from_str(&ok(&["status", "--json", "--socket", socket], d)).unwrap();
    assert_eq!(status["array"]["members"][0]["state"], "active", "{status}");
    assert_eq!(
        status["array"]["members"][1]["state"], "rebuilding",
        "{status}"
    );
    let text = ok(&["status", "--socket", socket], d);
    let line = text.lines().find(|l| l.ends_with("m1")).unwrap();
    assert!(line.contains("rebuilding"), "{text}");
}

/// `nvraid COMMAND | head`: the reader is gone before nvraid writes.
fn into_closed_pipe(args: &[&str], dir: &Path) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (child.wait().unwrap(), stderr)
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_as_cat_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    filled(d, "1", &["m0", "m1"]);
    for args in [
        &["detail", "--json", "m0", "m1"][..],
        &["detail", "m0", "m1"][..],
        &["examine", "--json", "m0"][..],
        &["assemble", "--scan", "--json", "."][..],
        &["read", "m0", "m1"][..],
        &["completions", "bash"][..],
    ] {
        let (status, stderr) = into_closed_pipe(args, d);
        assert_eq!(stderr, "", "nvraid {args:?} said something");
        assert_eq!(
            status.signal(),
            Some(13),
            "nvraid {args:?} should end by SIGPIPE as cat does: {status:?}"
        );
    }
    // The same command into a reader that stays: output and exit 0.
    assert!(!ok(&["detail", "--json", "m0", "m1"], d).is_empty());
}
