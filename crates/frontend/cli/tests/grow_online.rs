//! `nvraid grow --socket`: a served RAID 5/6 gains a member while fio
//! writes and verifies through NBD; `status` shows the reshape; the array
//! assembled afterwards is the new shape with every byte in place; a
//! server killed mid-grow leaves a record `grow --continue` finishes; what
//! must wait for the grow, or the grow for it, is refused by name.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn control(dir: &Path) -> String {
    dir.join("md.ctl").display().to_string()
}

fn status(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&["status", "--json", "--socket", &control(dir)], dir)).unwrap()
}

fn create(dir: &Path, level: &str, members: &[String], size: &str) {
    let mut args = vec!["create", "--level", level, "--size", size, "--force"];
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

fn blank(dir: &Path, name: &str, bytes: u64) {
    std::fs::File::create(dir.join(name))
        .unwrap()
        .set_len(bytes)
        .unwrap();
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

fn fio_verify(dir: &Path, verify_only: bool) -> Child {
    let mut fio = fio_nbd(dir, "grow");
    fio.args(FIO_VERIFY_JOB).args([
        "--size=24m",
        "--offset_increment=24m",
        "--rate_iops=2000",
        "--do_verify=1",
        "--randseed=7",
        "--output-format=json",
    ]);
    if verify_only {
        fio.arg("--verify_only");
    }
    fio.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio (apt-get install fio)")
}

fn fio_done(fio: Child) {
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 48 << 20,
        "fio verified less than it wrote: {job}"
    );
}

fn detail(dir: &Path, members: &[String]) -> serde_json::Value {
    let mut args = vec!["detail", "--json"];
    args.extend(members.iter().map(String::as_str));
    serde_json::from_slice(&ok_bytes(&args, dir)).unwrap()
}

fn grows_online_while_fio_verifies(level: &str, count: usize) {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..count).map(|i| format!("m{i}.img")).collect();
    create(d, level, &members, "32M");
    blank(d, "new.img", 32 << 20);
    let size_before = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let server = serve_with(d, &members, &["--reshape-speed", "12"]);
    let fio = fio_verify(d, false);
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
    fio_done(fio_verify(d, true));
    server.interrupt();
}

#[test]
fn fio_verifies_through_nbd_while_a_served_raid5_grows_from_4_to_5_members() {
    grows_online_while_fio_verifies("5", 4);
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
    blank(d, "new.img", 24 << 20);
    let mut server = serve_with(d, &members, &["--reshape-speed", "4"]);
    let grow = grow_cmd(d, 5, "new.img");
    wait_mid_grow(d);
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = grow.wait_with_output();
    members.push("new.img".into());
    // The record is on the members; serve refuses it until it is finished.
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
    blank(d, "new.img", 24 << 20);
    blank(d, "other.img", 24 << 20);
    blank(d, "spare.img", 24 << 20);
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
