//! `nvraid grow --socket`: a served RAID 5/6 gains a member while fio
//! writes and verifies through NBD; `status` shows the reshape; the array
//! assembled afterwards is the new shape with every byte in place; a
//! server killed mid-grow leaves a record `grow --continue` finishes; what
//! must wait for the grow, or the grow for it, is refused by name.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn create(dir: &Path, level: &str, members: &[String], size: &str) {
    let mut args = vec!["create", "--level", level, "--size", size, "--force"];
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

fn grow_cmd(dir: &Path, raid_devices: u32, add: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .args([
            "grow",
            "--socket",
            &control(dir),
            "-n",
            &raid_devices.to_string(),
            "--add",
            add,
            "--step",
            "1M",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Poll `status` until the reshape shows part-way; returns that status.
fn wait_mid_grow(dir: &Path) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let s = status(dir);
        let r = &s["array"]["reshape"];
        let (p, end) = (
            r["position_bytes"].as_u64().unwrap_or(0),
            r["end_bytes"].as_u64().unwrap_or(0),
        );
        if r["state"] == "running" && p > 0 && p < end {
            return s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no grow part-way: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn grows_online_while_fio_verifies(level: &str, count: usize) {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..count).map(|i| format!("m{i}.img")).collect();
    create(d, level, &members, "32M");
    blank_mib(d, "new.img", 32);
    let size_before = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let server = serve_with(d, &members, &["--reshape-speed", "12"]);
    let fio = fio_verify_grow(d, false);
    std::thread::sleep(Duration::from_millis(300));
    let grow = grow_cmd(d, count as u32 + 1, "new.img");
    let mid = wait_mid_grow(d);
    let r = &mid["array"]["reshape"];
    assert_eq!(r["raid_disks"], count + 1, "{mid}");
    assert!(r["bytes_per_sec"].as_u64().unwrap() > 0, "{mid}");
    // Members neither join nor get checked while it runs.
    let refused = refusal(&["check", "--socket", &control(d)], d);
    assert!(refused.contains("a grow runs"), "{refused}");
    let out = grow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "grow --socket: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("from {count} to {}", count + 1)),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    fio_done(fio);
    server.interrupt();
    members.push("new.img".into());
    let grown = detail(d, &members);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], count + 1, "{grown}");
    assert!(
        grown["size_bytes"].as_u64().unwrap() > size_before,
        "{grown}"
    );
    assert_checks_clean(d, &members, "after the online grow");
    // Served again in the new shape: fio finds every block it wrote.
    let server = serve(d, &members);
    fio_done(fio_verify_grow(d, true));
    server.interrupt();
}

/// A served RAID 1 gains a mirror: the count is raised in the running
/// array, the new member is rebuilt while fio writes and verifies, and
/// after a restart every byte is on every mirror.
#[test]
fn fio_verifies_through_nbd_while_a_served_raid1_gains_a_third_mirror() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..2).map(|i| format!("m{i}.img")).collect();
    create(d, "1", &members, "56M");
    blank_mib(d, "new.img", 64);
    let server = serve_with(d, &members, &["--reshape-speed", "12"]);
    let fio = fio_verify_grow(d, false);
    std::thread::sleep(Duration::from_millis(300));
    let grow = grow_cmd(d, 3, "new.img");
    let mid = wait_mid_grow(d);
    let r = &mid["array"]["reshape"];
    assert_eq!(r["kind"], "mirror", "{mid}");
    assert_eq!(r["raid_disks"], 3, "{mid}");
    // The new mirror is recorded recovering on the members while it runs.
    let new_sb = &examine_member(d, "new.img")[0]["superblock"];
    assert_eq!(new_sb["raid_disks"], 3, "{new_sb}");
    assert_ne!(
        new_sb["feature_map"].as_u64().unwrap() & 2,
        0,
        "no recovery offset on the new mirror mid-copy: {new_sb}"
    );
    let old_sb = &examine_member(d, "m0.img")[0]["superblock"];
    assert_eq!(old_sb["raid_disks"], 3, "{old_sb}");
    let out = grow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "grow --socket: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("from 2 to 3"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    fio_done(fio);
    server.interrupt();
    members.push("new.img".into());
    let grown = detail(d, &members);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], 3, "{grown}");
    assert_checks_clean(d, &members, "after the online mirror add");
    // The new mirror holds the same bytes as an old one, all of them.
    let data_of = |name: &str| {
        let sb = &examine_member(d, name)[0]["superblock"];
        let at = sb["data_offset_sectors"].as_u64().unwrap() as usize * 512;
        let len = sb["size_sectors"].as_u64().unwrap() as usize * 512;
        std::fs::read(d.join(name)).unwrap()[at..at + len].to_vec()
    };
    assert!(
        data_of("new.img") == data_of("m0.img"),
        "the new mirror's data differs from the old mirror's"
    );
    let server = serve(d, &members);
    fio_done(fio_verify_grow(d, true));
    server.interrupt();
}

fn examine_member(dir: &Path, member: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&["examine", "--json", member], dir)).unwrap()
}

/// An old member of a served RAID 5 fails part-way through its online
/// grow: it is recorded faulty, the grow goes on degraded to the end (the
/// failed member's chunks read through the parity, the new shape's
/// parity covering it) while fio writes and verifies; the grown array is
/// degraded, every byte fio wrote reads back, and a member added after
/// is rebuilt with every row's parity in agreement.
#[test]
fn a_member_failing_mid_online_grow_is_recorded_faulty_and_the_raid5_grows_degraded() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "32M");
    blank_mib(d, "new.img", 32);
    let node = FailingNode::up(d, "m1.img");
    let through = vec![
        members[0].clone(),
        node.uri(),
        members[2].clone(),
        members[3].clone(),
    ];
    let server = serve_with(d, &through, &["--reshape-speed", "12"]);
    let fio = fio_verify_grow(d, false);
    std::thread::sleep(Duration::from_millis(300));
    let grow = grow_cmd(d, 5, "new.img");
    wait_mid_grow(d);
    node.fail();
    let out = grow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the grow did not go on degraded: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("from 4 to 5"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    fio_done(fio);
    server.interrupt();
    drop(node);
    // The others record m1 faulty and the finished shape.
    let examine: serde_json::Value =
        serde_json::from_str(&ok(&["examine", "--json", "m0.img"], d)).unwrap();
    let sb = &examine[0]["superblock"];
    assert_eq!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{examine}");
    assert_eq!(sb["raid_disks"], 5, "{examine}");
    let survivors: Vec<String> = ["m0.img", "m2.img", "m3.img", "new.img"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let degraded = detail(d, &survivors);
    assert_eq!(degraded["raid_disks"], 5, "{degraded}");
    assert!(
        degraded["state"].as_str().unwrap().contains("degraded"),
        "{degraded}"
    );
    // Served degraded: fio finds every block it wrote.
    let server = serve(d, &survivors);
    fio_done(fio_verify_grow(d, true));
    server.interrupt();
    // A blank member rebuilt into the missing role: check is clean, and
    // fio finds every block again.
    blank_mib(d, "spare.img", 32);
    let mut add = vec!["add", "--new", "spare.img"];
    add.extend(survivors.iter().map(String::as_str));
    ok(&add, d);
    let mut whole = survivors.clone();
    whole.push("spare.img".into());
    assert_checks_clean(d, &whole, "after the degraded online grow and a rebuild");
    let server = serve(d, &whole);
    fio_done(fio_verify_grow(d, true));
    server.interrupt();
}

#[test]
fn fio_verifies_through_nbd_while_a_served_raid5_grows_from_4_to_5_members() {
    grows_online_while_fio_verifies("5", 4);
}

/// A second member of a served RAID 5 failing mid online grow, beyond
/// what the parity covers: the grow stops at the position its
/// superblocks record (the first failure it went on past).
#[test]
fn a_second_member_failing_mid_online_raid5_grow_stops_it_at_the_recorded_position() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "32M");
    blank_mib(d, "new.img", 32);
    let first = FailingNode::up(d, "m1.img");
    let second = FailingNode::up(d, "m2.img");
    let through = vec![
        members[0].clone(),
        first.uri(),
        second.uri(),
        members[3].clone(),
    ];
    let server = serve_with(d, &through, &["--reshape-speed", "8"]);
    let grow = grow_cmd(d, 5, "new.img");
    wait_mid_grow(d);
    first.fail();
    // The grow goes on past the first failure.
    let started = Instant::now();
    let went_on = loop {
        let s = status(d);
        let r = &s["array"]["reshape"];
        let p = r["position_bytes"].as_u64().unwrap_or(0);
        let degraded = s["array"]["members"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m.to_string().contains("faulty")))
            || s["array"]["state"].to_string().contains("degraded");
        if degraded && p > 8 << 20 {
            break p;
        }
        assert_eq!(r["state"], "running", "{s}");
        assert!(started.elapsed() < Duration::from_secs(30), "{s}");
        std::thread::sleep(Duration::from_millis(50));
    };
    second.fail();
    let out = grow.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "the grow went on without two members"
    );
    let stopped: u64 = stderr
        .split("stopped at ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no position in: {stderr}"));
    assert!(stopped >= went_on, "{stopped} < {went_on}: {stderr}");
    // Two members gone: the server cannot close the array clean (a
    // superblock update needs one of them); what the members record is
    // what the last update wrote.
    let mut server = server;
    server.kill().unwrap();
    server.wait().unwrap();
    let examine: serde_json::Value =
        serde_json::from_str(&ok(&["examine", "--json", "m0.img"], d)).unwrap();
    let sb = &examine[0]["superblock"];
    assert_ne!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{examine}");
    assert_eq!(
        sb["reshape_position"].as_u64().unwrap() * 512,
        stopped,
        "{examine}"
    );
}

#[test]
fn fio_verifies_through_nbd_while_a_served_raid10_grows_from_4_to_5_members() {
    grows_online_while_fio_verifies("10", 4);
}

#[test]
fn fio_verifies_through_nbd_while_a_served_raid6_grows_from_5_to_6_members() {
    grows_online_while_fio_verifies("6", 5);
}

#[test]
fn a_server_killed_mid_grow_leaves_a_grow_that_continue_finishes_with_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "24M");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 ^ 0x5a).collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    let mut write = vec!["write", "--input", "data.bin"];
    write.extend(members.iter().map(String::as_str));
    ok(&write, d);
    blank_mib(d, "new.img", 24);
    let mut server = serve_with(d, &members, &["--reshape-speed", "4"]);
    let grow = grow_cmd(d, 5, "new.img");
    wait_mid_grow(d);
    server.kill().unwrap();
    server.wait().unwrap();
    // The command following the grow says the server stopped, where the
    // grow stood and how it goes on.
    let out = grow.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    for words in [
        "the server stopped answering during its grow, last seen at",
        "of 92 MiB",
        "grow --continue",
    ] {
        assert!(said.contains(words), "no {words:?} in: {said}");
    }
    members.push("new.img".into());
    // The record is on the members; `grow --continue` finishes it offline
    // (`serve` would too: grow_resume.rs).
    let mut cont = vec!["grow", "--continue"];
    cont.extend(members.iter().map(String::as_str));
    ok(&cont, d);
    let mut read = vec!["read"];
    read.extend(members.iter().map(String::as_str));
    let got = ok_bytes(&read, d);
    assert!(got.len() as u64 > size);
    assert!(
        got[..size as usize] == data[..],
        "a byte changed across the killed grow"
    );
    assert!(got[size as usize..].iter().all(|&b| b == 0));
}

#[test]
fn a_grow_through_the_socket_is_refused_while_one_runs_or_a_rebuild_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "24M");
    blank_mib(d, "new.img", 24);
    blank_mib(d, "other.img", 24);
    blank_mib(d, "spare.img", 24);
    // A rebuild runs: the grow waits for it.
    let server = serve_with(d, &members, &["--rebuild-speed", "1:1"]);
    ok(&["fail", "--socket", &control(d), "--member", "m1.img"], d);
    ok(
        &["remove", "--socket", &control(d), "--member", "m1.img"],
        d,
    );
    ok(&["add", "--socket", &control(d), "--new", "spare.img"], d);
    let blank_sha = sha(&std::fs::read(d.join("new.img")).unwrap());
    let refused = refusal(
        &[
            "grow",
            "--socket",
            &control(d),
            "-n",
            "5",
            "--add",
            "new.img",
        ],
        d,
    );
    assert!(
        refused.contains("rebuild") || refused.contains("degraded"),
        "{refused}"
    );
    assert_eq!(
        blank_sha,
        sha(&std::fs::read(d.join("new.img")).unwrap()),
        "a refused grow wrote to the new member"
    );
    server.interrupt();
    // A grow runs: a second one, and an add, are refused.
    let members: Vec<String> = (0..4).map(|i| format!("g{i}.img")).collect();
    create(d, "5", &members, "24M");
    let server = serve_with(d, &members, &["--reshape-speed", "1"]);
    let grow = grow_cmd(d, 5, "new.img");
    wait_mid_grow(d);
    let refused = refusal(
        &[
            "grow",
            "--socket",
            &control(d),
            "-n",
            "6",
            "--add",
            "other.img",
        ],
        d,
    );
    assert!(refused.contains("second grow"), "{refused}");
    let refused = refusal(&["add", "--socket", &control(d), "--new", "other.img"], d);
    assert!(refused.contains("a grow runs"), "{refused}");
    server.interrupt();
    // The waiting `grow --socket` sees the server go and fails.
    assert!(!grow.wait_with_output().unwrap().status.success());
}

/// Data bytes each 15 MiB member holds (1 MiB of metadata before them).
const PER: u64 = 14 * MIB;

/// Two arrays of `level` on four 15 MiB members holding the pattern (over
/// `bytes`), each served and grown to five through the control socket:
/// `tags[0]` to the end (the server then stopped), `tags[1]` killed with
/// SIGKILL part-way (its record at the last recorded position, the array
/// dirty). Their ten images, for the kernel.
fn two_grown_online(dir: &Path, level: &str, tags: [&str; 2], bytes: u64) -> Vec<PathBuf> {
    let mut images = Vec::new();
    for (name, kill) in [(tags[0], false), (tags[1], true)] {
        let sub = dir.join(name);
        std::fs::create_dir(&sub).unwrap();
        let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
        let mut args = vec!["create", "--level", level, "--size", "15M", "--name", name];
        args.extend(names.iter().map(String::as_str));
        ok(&args, &sub);
        let size = detail(&sub, &names)["size_bytes"].as_u64().unwrap();
        assert_eq!(size, bytes);
        std::fs::write(sub.join("data"), pattern(size)).unwrap();
        let mut args = vec!["write", "--input", "data"];
        args.extend(names.iter().map(String::as_str));
        ok(&args, &sub);
        std::fs::remove_file(sub.join("data")).unwrap();
        blank_mib(&sub, "d4", 16);
        let speed = if kill { "2" } else { "50" };
        let mut server = serve_with(&sub, &names, &["--reshape-speed", speed]);
        let grow = grow_cmd(&sub, 5, "d4");
        if kill {
            wait_mid_grow(&sub);
            server.kill().unwrap();
            server.wait().unwrap();
            let _ = grow.wait_with_output();
        } else {
            let out = grow.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            server.interrupt();
        }
        images.extend(names.iter().chain([&"d4".to_string()]).map(|n| sub.join(n)));
    }
    images
}

/// The kernel's two `KERNEL` lines of `report`, each holding every one of
/// `must` (five members, the grown size, the pattern, mismatch 0...).
fn assert_both_finished(report: &str, must: &[String]) {
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 2, "two arrays expected:\n{report}");
    for line in lines {
        for want in must {
            assert!(line.contains(want.as_str()), "{want}: {line}\n{report}");
        }
    }
}

#[test]
fn the_kernel_assembles_a_raid5_grown_online_and_finishes_one_left_mid_online_grow() {
    // md assembles both, finishes the second, reads the pattern, finds no
    // parity mismatch.
    let dir = tempfile::tempdir().unwrap();
    let images = two_grown_online(dir.path(), "5", ["done", "killed"], 3 * PER);
    let report = kernel_finishes(&images, 3 * PER);
    let must = [
        "disks=5".to_string(),
        format!("size={}", 4 * PER),
        "pattern=ok".into(),
        "mismatch=0".into(),
    ];
    assert_both_finished(&report, &must);
}

#[test]
fn the_kernel_assembles_a_raid10_grown_online_and_finishes_one_left_mid_online_grow() {
    // RAID 10 near=2: md assembles both, finishes the second, reads the
    // pattern, finds no copy that differs.
    let dir = tempfile::tempdir().unwrap();
    let images = two_grown_online(dir.path(), "10", ["done10", "killed10"], 2 * PER);
    let report = kernel_finishes(&images, 2 * PER);
    let must = [
        "level=raid10".to_string(),
        "disks=5".into(),
        format!("size={}", 5 * PER / 2),
        "pattern=ok".into(),
        "mismatch=0".into(),
    ];
    assert_both_finished(&report, &must);
}

#[test]
fn writes_acknowledged_during_an_online_grow_survive_a_sigkill_and_continue() {
    // qemu-io writes 4 KiB blocks at random places of a served RAID 5
    // through NBD (each block filled with its write's own byte) while the
    // grow is part-way, so they land in both shapes; the server is then
    // killed with SIGKILL, `grow --continue` finishes the grow, and every
    // acknowledged write reads back, the untouched blocks still zeros.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "24M");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    blank_mib(d, "new.img", 24);
    let mut server = serve_with(d, &members, &["--reshape-speed", "3"]);
    let grow = grow_cmd(d, 5, "new.img");
    let mid = wait_mid_grow(d);
    let position = mid["array"]["reshape"]["position_bytes"].as_u64().unwrap();
    let mut want = vec![0u8; size as usize];
    write_blocks(d, position, 600, 0x9e37_79b9, &mut want);
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "running", "{s}");
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = grow.wait_with_output();
    members.push("new.img".into());
    let mut cont = vec!["grow", "--continue"];
    cont.extend(members.iter().map(String::as_str));
    ok(&cont, d);
    let mut read = vec!["read"];
    read.extend(members.iter().map(String::as_str));
    let got = ok_bytes(&read, d);
    let blocks = size / 4096;
    assert!(got.len() as u64 > size);
    for b in 0..blocks as usize {
        assert!(
            got[b * 4096..(b + 1) * 4096] == want[b * 4096..(b + 1) * 4096],
            "block {b} lost an acknowledged write across the kill"
        );
    }
}

/// fio's verified writes through NBD while a served array grows (or the
/// read pass checking them).
fn fio_verify_grow(dir: &Path, verify_only: bool) -> Child {
    fio_verify(dir, "grow", 2000, 7, verify_only)
}

/// A served start that gives a new member its superblock and fails at the
/// error point `point` (`NVRAID_FAILERR=POINT:1`): `reshape-launch`, after
/// the new member's superblock and the record were written on every member;
/// `reshape-thread`, after client requests were routed through the start
/// too. The start is forgotten: the record is dropped from the array's
/// members and the added member is left without a superblock (it joined
/// nothing: one left behind, an event ahead and recording a reshape the
/// others do not, would compete with theirs at the next assembly). The
/// array stays as it was, clean, with its bytes, served on the fast path
/// again, and the same server then makes the change with the same member.
/// `how`: the level, member count and `grow --socket` arguments.
fn a_served_start_failing_at(point: &str, level: &str, count: u32, how: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..count).map(|i| format!("m{i}.img")).collect();
    create(d, level, &members, "16M");
    blank_mib(d, "new.img", 16);
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let data: Vec<u8> = (0..size).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    let mut args = vec!["write", "--input", "data.bin"];
    args.extend(members.iter().map(String::as_str));
    ok(&args, d);
    let failerr = format!("{point}:1");
    let server = serve_env(d, &members, &[], &[("NVRAID_FAILERR", &failerr)]);
    let ctl = control(d);
    let mut grow = vec!["grow", "--socket", &ctl];
    grow.extend(how);
    grow.extend(["--add", "new.img", "--step", "1M"]);
    let said = refusal(&grow, d);
    assert!(
        said.contains("reshape launch") || said.contains("thread"),
        "{point}: {said}"
    );
    let s = status(d);
    assert!(s["array"]["reshape"].is_null(), "{point}: {s}");
    assert_eq!(s["array"]["size_bytes"], size, "{point}: {s}");
    // The added member holds no superblock (its first 8 KiB are zeros, as
    // blank_mib made them).
    let head = std::fs::read(d.join("new.img")).unwrap();
    assert!(
        head[..8192].iter().all(|&b| b == 0),
        "{point}: the added member keeps a superblock"
    );
    // No member records a reshape (md's RESHAPE_ACTIVE feature bit, 4),
    // and each records the array as it was.
    for m in &members {
        let e = examine_member(d, m);
        let sb = &e[0]["superblock"];
        assert_eq!(
            sb["feature_map"].as_u64().unwrap() & 4,
            0,
            "{point}: {m} records a reshape: {e}"
        );
        assert_eq!(sb["raid_disks"], count, "{point}: {m}: {e}");
        assert_eq!(
            sb["level"],
            level.parse::<i64>().unwrap(),
            "{point}: {m}: {e}"
        );
    }
    assert!(
        served_bytes(d) == data,
        "{point}: the bytes after the failed launch"
    );
    // The error point passed: the same member is added this time.
    ok(&grow, d);
    assert!(served_bytes(d)[..data.len()] == data[..], "{point}");
    server.interrupt();
    let mut grown = members.clone();
    grown.push("new.img".into());
    let g = detail(d, &grown);
    assert_eq!(g["raid_disks"], count + 1, "{point}: {g}");
    assert_eq!(g["state"], "clean", "{point}: {g}");
    assert_checks_clean(d, &grown, "the change after a failed launch");
}

#[test]
fn a_served_grow_whose_launch_fails_leaves_the_added_member_blank() {
    a_served_start_failing_at("reshape-launch", "5", 4, &["-n", "5"]);
}

/// The same with the thread that would move the rows not made: the route
/// set for the start is dropped too, and requests take the fast path again.
#[test]
fn a_served_grow_whose_thread_fails_to_start_leaves_the_added_member_blank() {
    a_served_start_failing_at("reshape-thread", "5", 4, &["-n", "5"]);
}

/// A RAID 1 gaining a mirror (`LiveMirror`) and a RAID 5 taking a Q member
/// to become a RAID 6 (`LiveQ`), each failing at both points.
#[test]
fn served_mirror_and_q_adds_whose_launch_fails_leave_the_new_member_blank() {
    for point in ["reshape-launch", "reshape-thread"] {
        a_served_start_failing_at(point, "1", 2, &["-n", "3"]);
        a_served_start_failing_at(point, "5", 4, &["--level", "6", "-n", "5"]);
    }
}
