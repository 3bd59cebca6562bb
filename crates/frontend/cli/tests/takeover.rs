//! `nvraid grow` on a bad day and md's level changes (docs/reshape.md):
//! a member failing in the middle of an offline grow is recorded failed
//! on the others and the RAID 5 grows on degraded (md's rule), a grow is
//! continued with a member missing, and what md cannot continue is
//! refused with nothing written. The kernel's md assembles what nvraid
//! left and reads the same bytes.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;

/// Data bytes each member holds (15 MiB files less 1 MiB of metadata).
const PER: u64 = 14 * MIB;

/// md's test pattern (tools/mdvm/pattern.c): 4 KiB block N holds the
/// little-endian u64 N, repeated.
fn pattern(bytes: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes as usize);
    for block in 0..bytes / 4096 {
        for _ in 0..512 {
            out.extend_from_slice(&block.to_le_bytes());
        }
    }
    out
}

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

/// A blank 16 MiB member file.
fn blank(dir: &Path, name: &str) -> String {
    let f = std::fs::File::create(dir.join(name)).unwrap();
    f.set_len(16 * MIB).unwrap();
    name.into()
}

fn with<'a>(head: &[&'a str], members: &'a [String]) -> Vec<&'a str> {
    let mut args = head.to_vec();
    args.extend(members.iter().map(String::as_str));
    args
}

/// Read `len` bytes of the array.
fn read(dir: &Path, members: &[String], len: u64) -> Vec<u8> {
    let len = len.to_string();
    ok_bytes(&with(&["read", "--length", &len], members), dir)
}

/// An nbdkit serving the file `image` in `dir` on a unix socket, with
/// nbdkit's error filter (every request fails with EIO once `trigger`
/// exists) over its delay filter (each write a little slow, so
/// that a grow lasts a few seconds).
struct FailingNode {
    child: std::process::Child,
    socket: PathBuf,
    trigger: PathBuf,
}

impl FailingNode {
    fn up(dir: &Path, image: &str) -> FailingNode {
        let socket = dir.join(format!("{image}.sock"));
        let trigger = dir.join(format!("{image}.trigger"));
        let child = Command::new(tool("nbdkit"))
            .arg("-f")
            .arg("-U")
            .arg(&socket)
            .args(["--filter=error", "--filter=delay", "file"])
            .arg(dir.join(image))
            .arg("error-rate=100%")
            .arg(format!("error-file={}", trigger.display()))
            .arg("wdelay=60ms")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit (./test.sh installs it)");
        for _ in 0..200 {
            if socket.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(socket.exists(), "nbdkit did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
        FailingNode {
            child,
            socket,
            trigger,
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    fn fail(&self) {
        std::fs::write(&self.trigger, b"").unwrap();
    }
}

impl Drop for FailingNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Grow the RAID 5 on `members` (`failing`'s member among them, reached
/// through it) by `new`, and make `failing` fail once the reshape has
/// moved some bytes: the grow must finish, degraded; its stdout.
fn grow_while_failing(dir: &Path, members: &[String], new: &str, failing: &FailingNode) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .args(with(
            &["grow", "-n", "5", "--add", new, "--step", "1M"],
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
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the grow did not go on degraded: {}\n{stdout}",
        seen.join("\n")
    );
    assert!(failed_at.is_some(), "no progress seen: {}", seen.join("\n"));
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
    let node = FailingNode::up(d, "d1");
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
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&with(&["detail", "--json"], &survivors), d)).unwrap();
    assert_eq!(detail["raid_disks"], 5, "{detail}");
    assert!(
        detail["state"].as_str().unwrap().contains("degraded"),
        "{detail}"
    );
    let got = read(d, &survivors, 4 * PER);
    assert!(
        got[..data.len()] == data[..],
        "the bytes read degraded differ"
    );
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "new space not zeros"
    );
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
