//! Real faults through real processes: a member served by nbdkit behind
//! nbdfuse and a loop device (`tools/faultbed/faulty-member`) starts
//! returning EIO while `nvraid serve` runs fio with crc32c verification
//! through NBD. The client sees no error; the member is faulty in `status`
//! and in the other members' superblocks.
//!
//! Needs root, nbdkit, nbdfuse (fuse3), losetup and fio (`./test.sh`
//! installs them).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A member that fails on command; brought down when dropped.
struct FaultyMember {
    dir: PathBuf,
    device: String,
}

impl FaultyMember {
    fn up(dir: &Path, size: &str) -> FaultyMember {
        let script = repo().join("tools/faultbed/faulty-member");
        let out = Command::new(&script)
            .arg("up")
            .arg(dir)
            .arg(size)
            .arg("all")
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success() && device.starts_with("/dev/loop"),
            "faulty-member up failed (needs root, nbdkit, nbdfuse, losetup): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        FaultyMember {
            dir: dir.to_path_buf(),
            device,
        }
    }

    fn call(&self, what: &str) {
        let status = Command::new(repo().join("tools/faultbed/faulty-member"))
            .arg(what)
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(status.success(), "faulty-member {what}");
    }
}

impl Drop for FaultyMember {
    fn drop(&mut self) {
        self.call("down");
    }
}

#[test]
fn a_mirror_that_fails_under_fio_verify_costs_the_client_nothing() {
    for (level, count) in [("1", 2usize), ("10", 4)] {
        let dir = tempfile::tempdir().unwrap();
        let bad = FaultyMember::up(&dir.path().join("bed"), "80M");
        // The failing member takes role 1.
        let mut members: Vec<String> = (0..count).map(|i| format!("m{i}.img")).collect();
        members[1] = bad.device.clone();
        let mut create = vec!["create", "--level", level, "--size", "64M", "--force"];
        create.extend(members.iter().map(String::as_str));
        ok(&create, dir.path());
        let mut server = serve(dir.path(), &members);

        // fio, rate-limited so that the member fails during its write phase;
        // then it reads every block back and checks its crc32c. The loop
        // device over FUSE is buffered: a failure reaches nvraid when the
        // page cache goes to the member, so fio flushes every 32 writes
        // (without it, whether an error surfaces at all depended on
        // writeback timing).
        let fio = fio_nbd(dir.path(), "failover")
            .args(FIO_VERIFY_JOB)
            .args([
                "--size=24m",
                "--offset_increment=24m",
                "--rate_iops=2000",
                "--fsync=32",
                "--do_verify=1",
                "--output-format=json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fio (apt-get install fio)");
        std::thread::sleep(Duration::from_millis(700));
        bad.call("fail");
        let out = fio.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "raid{level}: fio failed: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
        let job = &report["jobs"][0];
        assert_eq!(job["error"], 0, "raid{level}: {job}");
        assert!(
            job["read"]["io_bytes"].as_u64().unwrap() >= 48 << 20,
            "raid{level}: verify read {job}"
        );

        let control = dir.path().join("md.ctl");
        let status: serde_json::Value = serde_json::from_str(&ok(
            &["status", "--json", "--socket", control.to_str().unwrap()],
            dir.path(),
        ))
        .unwrap();
        let failed = status["array"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == bad.device.as_str())
            .unwrap_or_else(|| panic!("{status}"));
        assert_eq!(failed["state"], "faulty", "raid{level}: {status}");
        let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
        assert!(log.contains("marked faulty"), "raid{level}: {log}");
        // The survivors' superblocks record role 1 faulty (read them while
        // the server runs: detail only reads).
        let mut detail = vec!["detail", "--json"];
        detail.extend(members.iter().map(String::as_str));
        let d: serde_json::Value = serde_json::from_str(&ok(&detail, dir.path())).unwrap();
        assert!(
            d["state"].as_str().unwrap().contains("degraded"),
            "raid{level}: {d}"
        );

        // `replace` through the control socket: the failed member goes, a
        // fresh one takes role 1 and is rebuilt while served; fio then
        // verifies every block it wrote, through the rebuilt array.
        std::fs::File::create(dir.path().join("fresh.img"))
            .unwrap()
            .set_len(80 << 20)
            .unwrap();
        let control = dir.path().join("md.ctl");
        let control = control.to_str().unwrap();
        ok(
            &[
                "replace",
                "--socket",
                control,
                "--old",
                &bad.device,
                "--new",
                "fresh.img",
            ],
            dir.path(),
        );
        let started = std::time::Instant::now();
        while self::status(dir.path())["array"]["recovery"]["rebuild"]["finished"] != true {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "raid{level}: rebuild"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let verify = fio_nbd(dir.path(), "failover")
            .args(FIO_VERIFY_JOB)
            .args(["--size=24m", "--offset_increment=24m", "--verify_only"])
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "raid{level}: verify after the rebuild: {}{}",
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        );
        Command::new("kill")
            .arg("-INT")
            .arg(server.id().to_string())
            .status()
            .unwrap();
        assert!(server.wait().unwrap().success(), "raid{level}: serve exit");
        let mut now = members.clone();
        now[1] = "fresh.img".into();
        let mut check = vec!["check"];
        check.extend(now.iter().map(String::as_str));
        assert_eq!(
            nvraid(&check, dir.path()).status.code(),
            Some(0),
            "raid{level}: copies differ after the rebuild"
        );
        let mut detail = vec!["detail", "--json"];
        detail.extend(now.iter().map(String::as_str));
        let d: serde_json::Value = serde_json::from_str(&ok(&detail, dir.path())).unwrap();
        assert_eq!(d["state"], "clean", "raid{level}: whole again: {d}");
        bad.call("heal");
    }
}

fn status(dir: &Path) -> serde_json::Value {
    let control = dir.join("md.ctl");
    serde_json::from_str(&ok(
        &["status", "--json", "--socket", control.to_str().unwrap()],
        dir,
    ))
    .unwrap()
}

/// Serve the array, copy `data` to its start through NBD, and kill the
/// server with SIGKILL: the array is left dirty.
fn write_then_kill(dir: &Path, members: &[String], data: &[u8]) {
    let mut server = serve(dir, members);
    std::fs::write(dir.join("data"), data).unwrap();
    let copied = Command::new("nbdcopy")
        .arg(dir.join("data"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            dir.join("md.sock").display()
        ))
        .status()
        .expect("nbdcopy (apt-get install libnbd-bin)");
    assert!(copied.success());
    server.kill().unwrap();
    server.wait().unwrap();
}

fn stop(mut server: Served) {
    Command::new("kill")
        .arg("-INT")
        .arg(server.id().to_string())
        .status()
        .unwrap();
    assert!(server.wait().unwrap().success(), "serve exit");
}

/// An array that comes up dirty (its server was killed with kill -9, and
/// one copy was torn) is resynced by `serve` in the background while fio
/// writes and verifies through it; the resync holds one region at a time
/// against the client's writes, so at the end every copy agrees and fio saw
/// its own data. A resync killed half-way resumes from its checkpoint.
#[test]
fn serve_resyncs_a_dirty_mirror_beside_a_verifying_client() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = vec!["m0.img".to_string(), "m1.img".to_string()];
    ok(
        &[
            "create", "--level", "1", "--size", "48M", "m0.img", "m1.img",
        ],
        d,
    );
    // A first server takes writes and dies without a clean shutdown.
    let data: Vec<u8> = (0..(32u32 << 20)).map(|i| (i % 247) as u8).collect();
    write_then_kill(d, &members, &data);
    // A torn write: one copy differs in 64 KiB at 40 MiB.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("m1.img"))
        .unwrap();
    f.write_all_at(&[0x5a; 65536], (1 << 20) + (40 << 20))
        .unwrap();
    drop(f);
    let mut detail = vec!["detail", "--json"];
    detail.extend(members.iter().map(String::as_str));
    let before: serde_json::Value = serde_json::from_str(&ok(&detail, d)).unwrap();
    assert_eq!(before["state"], "active", "dirty after kill -9: {before}");

    // Resync at 8 MB/s (47 MiB: about 6 s), killed once it has checkpointed.
    let mut server = serve_with(d, &members, &["--resync-speed", "8"]);
    std::thread::sleep(Duration::from_millis(2500));
    server.kill().unwrap();
    server.wait().unwrap();
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("resyncing from byte 0"), "{log}");

    // Resumed (not from 0), with fio writing and verifying meanwhile.
    let server = serve_with(d, &members, &["--resync-speed", "8"]);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    let from: u64 = log
        .split("resyncing from byte ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{log}"));
    assert!(from > 0, "the resync restarted from 0: {log}");
    let fio = fio_nbd(d, "resync")
        .args([
            "--rw=randwrite",
            "--bs=4k",
            "--size=40m",
            "--iodepth=8",
            "--rate_iops=1500",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--output-format=json",
        ])
        .output()
        .expect("fio");
    let text = String::from_utf8_lossy(&fio.stdout);
    assert!(fio.status.success(), "fio: {text}");
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(report["jobs"][0]["error"], 0, "{report}");
    for _ in 0..400 {
        if status(d)["array"]["resync"]["finished"] == true {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let now = status(d);
    assert_eq!(now["array"]["resync"]["finished"], true, "{now}");
    assert_eq!(
        now["array"]["state"], "active",
        "dirty while serving writes: {now}"
    );
    stop(server);
    let after: serde_json::Value = serde_json::from_str(&ok(&detail, d)).unwrap();
    assert_eq!(after["state"], "clean", "{after}");
    assert_checks_clean(d, &members, "copies differ after the resync");
}

/// `nvraid fail`: offline, and in a running server through its control
/// socket. The member is marked faulty in the others' superblocks; the last
/// copy and RAID 0 are refused.
#[test]
fn fail_marks_a_member_faulty_offline_and_online() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "1", "--size", "16M", "a.img", "b.img", "c.img",
        ],
        d,
    );
    ok(&["fail", "--member", "c.img", "a.img", "b.img", "c.img"], d);
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&["detail", "--json", "a.img", "b.img", "c.img"], d)).unwrap();
    assert_eq!(detail["members"][3]["state"], "faulty", "{detail}");
    assert_eq!(detail["members"][3]["path"], "c.img", "{detail}");

    let members = vec!["a.img".to_string(), "b.img".to_string()];
    let server = serve(d, &members);
    let control = d.join("md.ctl");
    let socket = control.to_str().unwrap();
    ok(&["fail", "--socket", socket, "--member", "b.img"], d);
    let now = status(d);
    let states: Vec<&str> = now["array"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, vec!["active", "faulty", "missing"], "{now}");
    // a.img now holds the last copy.
    let out = nvraid(&["fail", "--socket", socket, "--member", "a.img"], d);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only copy"));
    let out = nvraid(&["fail", "--socket", socket, "--member", "nope.img"], d);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a working member"));
    stop(server);
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&["detail", "--json", "a.img", "b.img"], d)).unwrap();
    assert!(
        detail["state"].as_str().unwrap().contains("degraded"),
        "{detail}"
    );
    ok(
        &[
            "create", "--level", "0", "--size", "16M", "r0.img", "r1.img",
        ],
        d,
    );
    let out = nvraid(&["fail", "--member", "r1.img", "r0.img", "r1.img"], d);
    assert_eq!(out.status.code(), Some(1), "raid0 cannot lose a member");
}

/// A server stopped in order (SIGINT) while it resyncs records how far the
/// resync got, and the next server resumes there (as md does when it goes
/// clean mid-resync).
#[test]
fn an_orderly_stop_keeps_the_resync_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = vec!["m0.img".to_string(), "m1.img".to_string()];
    ok(
        &[
            "create", "--level", "1", "--size", "48M", "m0.img", "m1.img",
        ],
        d,
    );
    write_then_kill(d, &members, &[7u8; 1 << 20]);
    let server = serve_with(d, &members, &["--resync-speed", "8"]);
    std::thread::sleep(Duration::from_millis(2500));
    stop(server);
    let examine: serde_json::Value =
        serde_json::from_str(&ok(&["examine", "--json", "m0.img"], d)).unwrap();
    let offset = examine[0]["superblock"]["resync_offset"].as_u64().unwrap();
    assert!(
        offset > 0 && offset < 94208,
        "resync_offset {offset} sectors: {examine}"
    );
    let server = serve(d, &members);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains(&format!("resyncing from byte {}", offset * 512)),
        "{log}"
    );
    stop(server);
}

/// A RAID 5 member (the kernel-made `raid5_ls_4d`'s member 1, copied onto
/// an nbdkit-backed device) starts failing every read: the assembly sets it
/// aside as unreadable (its superblock cannot be read) and `nvraid read`
/// still gives the kernel's bytes, each chunk that member held rebuilt from
/// the rest of its stripe and the parity.
#[test]
fn a_raid5_member_that_fails_reads_is_read_around_through_parity() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let state = repo().join("tests/fixtures/md-states/raid5_ls_4d");
    let bad = FaultyMember::up(&d.join("bed"), "16M");
    let mut members = Vec::new();
    for disk in 0..4 {
        let out = Command::new("xz")
            .arg("-dc")
            .arg(state.join(format!("disk{disk}.img.xz")))
            .output()
            .expect("xz (apt-get install xz-utils)");
        assert!(out.status.success());
        if disk == 1 {
            let mut device = std::fs::OpenOptions::new()
                .write(true)
                .open(&bad.device)
                .unwrap();
            std::io::Write::write_all(&mut device, &out.stdout).unwrap();
            device.sync_all().unwrap();
            members.push(bad.device.clone());
        } else {
            let name = format!("d{disk}.img");
            std::fs::write(d.join(&name), &out.stdout).unwrap();
            members.push(name);
        }
    }
    let kernel = std::fs::read_to_string(state.join("kernel-sha256.txt")).unwrap();
    let mut read = vec!["read"];
    read.extend(members.iter().map(String::as_str));
    assert_eq!(sha(&ok_bytes(&read, d)), kernel.trim(), "healthy");
    bad.call("fail");
    let out = nvraid(&read, d);
    assert!(
        out.status.success(),
        "read with a failing member: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha(&out.stdout), kernel.trim(), "rebuilt from parity");
    let mut detail = vec!["detail", "--json"];
    detail.extend(members.iter().map(String::as_str));
    let dj: serde_json::Value = serde_json::from_str(&ok(&detail, d)).unwrap();
    let failed = dj["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == bad.device.as_str())
        .unwrap_or_else(|| panic!("{dj}"));
    assert_eq!(failed["state"], "unreadable", "{dj}");
    assert!(dj["state"].as_str().unwrap().contains("degraded"), "{dj}");
    bad.call("heal");
}

/// A crash between two members' superblock writes leaves one a single
/// event behind: it missed no write, and md takes it as in sync (the
/// kernel's assembly and mdadm alike). Further behind, it is stale.
#[test]
fn a_member_one_event_behind_is_in_sync_and_two_behind_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &["create", "--level", "1", "--size", "8M", "a.img", "b.img"],
        d,
    );
    let detail = || -> serde_json::Value {
        serde_json::from_str(&ok(&["detail", "--json", "a.img", "b.img"], d)).unwrap()
    };
    set_events(&d.join("a.img"), |_| 1);
    let one = detail();
    assert_eq!(one["state"], "clean", "{one}");
    assert_eq!(one["members"][1]["state"], "active", "{one}");
    set_events(&d.join("a.img"), |_| 2);
    let two = detail();
    assert!(two["state"].as_str().unwrap().contains("degraded"), "{two}");
    let b = two["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == "b.img")
        .unwrap_or_else(|| panic!("{two}"));
    assert_eq!(b["state"], "stale", "{two}");
}
