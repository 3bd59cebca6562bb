//! `nvraid grow --socket CTL -n N --array-size SIZE`: a served RAID 5/6 or
//! RAID 10 near shrunk by members while clients read and write (the size
//! capped first, md's backwards reshape recorded on the running array,
//! the leaving members released as spares at the end); what it refuses,
//! with nothing written; a server killed mid-shrink (`serve` again
//! finishes it, every acknowledged write reads back); a member failing
//! mid-shrink (recorded faulty, read around; a leaving one faulty in the
//! role tables, not a spare); a shrink whose launch fails (the old size
//! served again, nothing recorded); the kernel's RAID 10 shrink served
//! and finished; and the kernel's md in tools/mdvm assembling what served
//! shrinks left, finished, killed or degraded, a RAID 6's, and an array
//! grown then shrunk in one server run.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// `count` members of `file_mib` MiB in a RAID `level` (`size` of each
/// used, `extra` create options), resynced, the pattern written over the
/// first `keep` bytes and 0xa5 past them (what a shrink to one member
/// fewer cuts off). The members' names.
fn filled(
    d: &Path,
    level: &str,
    count: usize,
    file_mib: u64,
    size: &str,
    keep: u64,
    extra: &[&str],
) -> Vec<String> {
    let m: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    for name in &m {
        std::fs::File::create(d.join(name))
            .unwrap()
            .set_len(file_mib * MIB)
            .unwrap();
    }
    let mut args = vec!["create", "--level", level, "--size", size, "--force"];
    args.extend_from_slice(extra);
    ok(&with(&args, &m), d);
    ok(&with(&["repair"], &m), d);
    let all = detail(d, &m)["size_bytes"].as_u64().unwrap();
    let mut data = pattern(keep);
    data.resize(all as usize, 0xa5);
    std::fs::write(d.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &m), d);
    std::fs::remove_file(d.join("data")).unwrap();
    m
}

/// The size the array on `m` has with `n` members (what `--array-size`
/// must not exceed): the refusal without `--array-size` names it.
fn smaller_size(d: &Path, m: &[String], n: u32) -> u64 {
    let old = detail(d, m);
    let count = old["raid_disks"].as_u64().unwrap();
    let size = old["size_bytes"].as_u64().unwrap();
    // Data chunks per stripe (a RAID 10 near: array bytes per member).
    let data = |c: u64| match old["level"].as_u64().unwrap() {
        6 => c - 2,
        10 => c,
        _ => c - 1,
    };
    size / data(count) * data(u64::from(n))
}

/// `nvraid grow --socket` shrinking the array served in `d` to `n`
/// members with `--array-size size`, 1 MiB steps (`extra` appended).
fn shrink_cmd(d: &Path, n: u32, size: u64, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(d)
        .args([
            "grow",
            "--socket",
            &control(d),
            "-n",
            &n.to_string(),
            "--array-size",
            &size.to_string(),
            "--step",
            "1M",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait for a `grow --socket` and check that it succeeded; its stdout.
fn succeeded(grow: Child) -> String {
    let out = grow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "grow --socket: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The whole served array through NBD (`nbdcopy`), at the size a new
/// connection is told.
fn served_bytes(d: &Path) -> Vec<u8> {
    let got = Command::new(tool("nbdcopy"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .arg("-")
        .output()
        .unwrap();
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    got.stdout
}

/// An NBD client connected now (told the size as it is now) that, once
/// `go` exists in `d`, reads and writes 4 KiB at `past` (beyond the size
/// a shrink gives) and at `below`, and prints what each did.
fn early_client(d: &Path, past: u64, below: u64) -> Child {
    let script = format!(
        r#"
import os, time
print("SIZE", h.get_size(), flush=True)
while not os.path.exists("go"):
    time.sleep(0.02)
for what, off in (("PAST", {past}), ("BELOW", {below})):
    try:
        h.pwrite(b"\x5a" * 4096, off)
        print(what, "WRITE ok", flush=True)
    except nbd.Error as e:
        print(what, "WRITE errno", e.errno, flush=True)
    try:
        h.pread(4096, off)
        print(what, "READ ok", flush=True)
    except nbd.Error as e:
        print(what, "READ errno", e.errno, flush=True)
"#
    );
    // The system's python3, which has libnbd's module (nbdsh runs the
    // first python3 on PATH).
    Command::new("/usr/bin/python3")
        .current_dir(d)
        .args(["-m", "nbd"])
        .arg("-u")
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .arg("-c")
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with libnbd's module (python3-libnbd)")
}

#[test]
fn a_served_raid5_shrinks_from_5_to_4_while_clients_write_and_every_byte_reads_back() {
    // A RAID 5 of five served; a client connects (told the old size);
    // `grow --socket -n 4 --array-size` shrinks it while qemu-io writes
    // blocks on both sides of the falling position. The served size is
    // the smaller one from the start: the early client's requests past it
    // fail (ENOSPC/EINVAL), those below it go on. `status` shows the
    // shrink running with its rate; it ends, the fifth member a spare,
    // every byte (pattern, the writes) in place, the parity right.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let keep = 42 * MIB;
    let m = filled(d, "5", 5, 17, "15M", keep, &[]);
    let new_size = smaller_size(d, &m, 4);
    assert_eq!(new_size, keep);
    let old_size = detail(d, &m)["size_bytes"].as_u64().unwrap();
    let server = serve_with(d, &m, &["--reshape-speed", "3:3"]);
    let client = early_client(d, new_size + MIB, MIB);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let grow = shrink_cmd(d, 4, new_size, &[]);
    let mid = wait_reshape_below(d, new_size - MIB);
    let r = &mid["array"]["reshape"];
    assert_eq!(r["kind"], "shrink", "{mid}");
    assert_eq!(r["raid_disks_before"], 5, "{mid}");
    assert_eq!(r["raid_disks"], 4, "{mid}");
    assert!(r["bytes_per_sec"].as_u64().unwrap() > 0, "{mid}");
    assert_eq!(mid["array"]["size_bytes"], new_size, "{mid}");
    std::fs::write(d.join("go"), b"").unwrap();
    let out = client.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("SIZE {old_size}")),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("PAST WRITE errno ENOSPC") && said.contains("PAST READ errno EINVAL"),
        "a request past the shrunk size: {said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("BELOW WRITE ok") && said.contains("BELOW READ ok"),
        "{said}"
    );
    let mut data = pattern(new_size);
    data[MIB as usize..(MIB + 4096) as usize].fill(0x5a);
    let position = status(d)["array"]["reshape"]["position_bytes"]
        .as_u64()
        .unwrap();
    write_blocks(d, position, 40, 11, &mut data);
    let said = succeeded(grow);
    assert!(said.contains("shrunk online from 5 to 4 members"), "{said}");
    assert!(!said.contains("failed"), "{said}");
    assert_eq!(
        status(d)["array"]["reshape"]["left_faulty"],
        serde_json::json!([]),
        "no leaving member failed"
    );
    assert!(served_bytes(d) == data, "after the served shrink");
    server.interrupt();
    let log = serve_log(d);
    assert!(
        log.contains("event=reshape-started kind=shrink raid_disks=5->4"),
        "{log}"
    );
    let shrunk = detail(d, &m[..4]);
    assert_eq!(shrunk["state"], "clean", "{shrunk}");
    assert_eq!(shrunk["raid_disks"], 4, "{shrunk}");
    assert_eq!(shrunk["size_bytes"], new_size, "{shrunk}");
    assert!(read(d, &m[..4], new_size) == data);
    assert_checks_clean(d, &m[..4], "after the served shrink");
    let e = ok(&["examine", "d4"], d);
    assert!(device_role(&e) == "spare", "the leaving member: {e}");
}

#[test]
fn what_a_served_shrink_refuses_is_named_and_no_byte_of_any_member_changes() {
    // Served RAID 5 of five: no --array-size (the smaller size named),
    // one too large, a count that is no shrink or below the level's
    // fewest, an ext4 filesystem larger than --array-size, a second reshape while
    // one runs; a served RAID 1 and a degraded RAID 5. Each refusal names
    // its culprit; nothing is written (the members hash the same).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = filled(d, "5", 5, 17, "15M", 42 * MIB, &[]);
    let new_size = smaller_size(d, &m, 4);
    let server = serve(d, &m);
    let ctl = control(d);
    let before = hash_files(d);
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        (
            vec!["-n".into(), "4".into()],
            vec![
                "--array-size".into(),
                new_size.to_string(),
                "nothing was written".into(),
            ],
        ),
        (
            vec![
                "-n".into(),
                "4".into(),
                "--array-size".into(),
                (new_size + MIB).to_string(),
            ],
            vec![
                "do not fit".into(),
                format!("holds {new_size} bytes"),
                "nothing was written".into(),
            ],
        ),
        (
            vec![
                "-n".into(),
                "5".into(),
                "--array-size".into(),
                new_size.to_string(),
            ],
            vec!["--raid-devices".into(), "fewer members".into()],
        ),
        (
            vec!["-n".into(), "1".into(), "--array-size".into(), "1M".into()],
            vec!["--raid-devices".into(), "at least 2".into()],
        ),
    ];
    for (args, needles) in &cases {
        let mut all = vec!["grow", "--socket", &ctl];
        all.extend(args.iter().map(String::as_str));
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        refused(&all, d, &needles);
        assert_eq!(hash_files(d), before, "{args:?} changed a byte");
    }
    assert!(
        status(d)["array"]["reshape"].is_null(),
        "a refused shrink left a reshape"
    );
    server.interrupt();

    // An ext4 filesystem of the whole array: larger than --array-size.
    let fs = dir.path().join("fs");
    std::fs::create_dir(&fs).unwrap();
    let m = filled(&fs, "5", 5, 17, "15M", 42 * MIB, &["--bitmap", "none"]);
    let whole = detail(&fs, &m)["size_bytes"].as_u64().unwrap();
    let img = fs.join("ext4.img");
    std::fs::File::create(&img).unwrap().set_len(whole).unwrap();
    let mk = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&img)
        .output()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(
        mk.status.success(),
        "{}",
        String::from_utf8_lossy(&mk.stderr)
    );
    ok(&with(&["write", "--input", "ext4.img"], &m), &fs);
    std::fs::remove_file(&img).unwrap();
    let server = serve(&fs, &m);
    let before = hash_files(&fs);
    let size = smaller_size(&fs, &m, 4).to_string();
    refused(
        &[
            "grow",
            "--socket",
            &control(&fs),
            "-n",
            "4",
            "--array-size",
            &size,
        ],
        &fs,
        &["ext2/3/4 filesystem", "resize2fs", "--force"],
    );
    assert_eq!(hash_files(&fs), before, "the ext4 refusal changed a byte");
    server.interrupt();

    // A second reshape while a shrink runs.
    let busy = dir.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    let m = filled(&busy, "5", 5, 17, "15M", 42 * MIB, &[]);
    let size = smaller_size(&busy, &m, 4);
    let server = serve_with(&busy, &m, &["--reshape-speed", "1:1"]);
    let grow = shrink_cmd(&busy, 4, size, &[]);
    wait_reshape_below(&busy, size);
    // The running shrink writes the members meanwhile: only the answer
    // is checked here (`refused` would see the shrink's own writes).
    let said = refusal(
        &[
            "grow",
            "--socket",
            &control(&busy),
            "-n",
            "3",
            "--array-size",
            &(size / 3 * 2).to_string(),
        ],
        &busy,
    );
    assert!(
        said.contains("a second reshape") && said.contains("wait for its end"),
        "{said}"
    );
    let s = status(&busy);
    assert_eq!(s["array"]["reshape"]["raid_disks"], 4, "{s}");
    assert_eq!(s["array"]["reshape"]["state"], "running", "{s}");
    drop(grow);
    server.interrupt();

    // A served RAID 1, and a RAID 5 served degraded.
    let r1 = dir.path().join("r1");
    std::fs::create_dir(&r1).unwrap();
    let m = filled(&r1, "1", 3, 17, "15M", MIB, &[]);
    let server = serve(&r1, &m);
    let before = hash_files(&r1);
    refused(
        &[
            "grow",
            "--socket",
            &control(&r1),
            "-n",
            "2",
            "--array-size",
            "1M",
        ],
        &r1,
        &["fewer mirrors of a raid1"],
    );
    // More mirrors without --add: named as no shrink, --add named.
    refused(
        &[
            "grow",
            "--socket",
            &control(&r1),
            "-n",
            "4",
            "--array-size",
            "1M",
        ],
        &r1,
        &["a shrink goes to fewer members", "--add"],
    );
    assert_eq!(hash_files(&r1), before, "the RAID 1 refusal changed a byte");
    server.interrupt();
    let deg = dir.path().join("deg");
    std::fs::create_dir(&deg).unwrap();
    let m = filled(&deg, "5", 5, 17, "15M", 42 * MIB, &[]);
    let size = smaller_size(&deg, &m, 4).to_string();
    let server = serve(&deg, &m[..4]);
    let before = hash_files(&deg);
    refused(
        &[
            "grow",
            "--socket",
            &control(&deg),
            "-n",
            "4",
            "--array-size",
            &size,
        ],
        &deg,
        &["degraded"],
    );
    assert_eq!(
        hash_files(&deg),
        before,
        "the degraded refusal changed a byte"
    );
    server.interrupt();
}

#[test]
fn a_served_shrink_whose_launch_fails_leaves_the_array_served_at_its_old_size() {
    // The served shrink caps the size, then records itself on every
    // member; the error point fails its launch right after
    // (`NVRAID_FAILERR=reshape-launch:1`). The array is served at its old
    // size again, every byte (the 0xa5 past the smaller size too) reads
    // back, no member records a reshape, and a second shrink on the same
    // server (the record was dropped) starts and finishes.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = filled(d, "5", 5, 17, "15M", 42 * MIB, &[]);
    let new_size = smaller_size(d, &m, 4);
    let old_size = detail(d, &m)["size_bytes"].as_u64().unwrap();
    let before = read(d, &m, old_size);
    let failed_launch = || {
        let server = serve_env(d, &m, &[], &[("NVRAID_FAILERR", "reshape-launch:1")]);
        let out = shrink_cmd(d, 4, new_size, &[]).wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the launch did not fail: {said}");
        assert!(said.contains("reshape launch"), "{said}");
        let s = status(d);
        assert_eq!(s["array"]["size_bytes"], old_size, "{s}");
        assert!(s["array"]["reshape"].is_null(), "{s}");
        let got = served_bytes(d);
        assert_eq!(got.len() as u64, old_size, "a new connection's size");
        assert!(got == before, "the bytes after the failed launch");
        server
    };
    failed_launch().interrupt();
    let left = detail(d, &m);
    assert_eq!(left["state"], "clean", "{left}");
    assert_eq!(left["raid_disks"], 5, "{left}");
    assert_eq!(left["size_bytes"], old_size, "{left}");
    assert!(read(d, &m, old_size) == before);

    // The same server (its error point passed) shrinks the array.
    let server = failed_launch();
    let said = succeeded(shrink_cmd(d, 4, new_size, &[]));
    assert!(said.contains("shrunk online from 5 to 4 members"), "{said}");
    assert!(served_bytes(d) == before[..new_size as usize]);
    server.interrupt();
    assert_checks_clean(d, &m[..4], "the shrink after a failed launch");
}

#[test]
fn a_server_killed_mid_shrink_is_served_again_and_every_block_fio_wrote_reads_back() {
    // fio writes and verifies through NBD while a served RAID 5 shrinks
    // from 5 to 4; the server is killed (SIGKILL) part-way. Served again,
    // the shrink (the array dirty) is finished before it is served, fio's
    // verify pass reads every block it wrote, the parity is right once
    // resynced, and the bytes fio did not touch are the pattern.
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = filled(d, "5", 5, 33, "31M", 90 * MIB, &[]);
    let new_size = smaller_size(d, &m, 4);
    assert_eq!(new_size, 90 * MIB);
    let mut server = serve_with(d, &m, &["--reshape-speed", "2:2"]);
    let grow = shrink_cmd(d, 4, new_size, &[]);
    wait_reshape_below(d, new_size);
    fio_done(fio_verify(d, "shrink", 3000, 5, false));
    let mid = wait_reshape_below(d, new_size - 8 * MIB);
    let reached = mid["array"]["reshape"]["position_bytes"].as_u64().unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = grow.wait_with_output();
    let left = detail(d, &m);
    assert_eq!(left["state"], "reshaping", "{left}");
    assert_eq!(left["direction"], "backwards", "{left}");
    let at = left["position_bytes"].as_u64().unwrap();
    assert!(at > 0 && at <= reached, "{left}");
    let server = serve(d, &m);
    let log = serve_log(d);
    assert!(log.contains("event=reshape-finishing-offline"), "{log}");
    assert!(
        log.contains("event=reshape-finished raid_disks=5->4"),
        "{log}"
    );
    assert_eq!(status(d)["array"]["size_bytes"], new_size);
    fio_done(fio_verify(d, "shrink", 3000, 5, true));
    wait_resynced(d);
    server.interrupt();
    let shrunk = detail(d, &m[..4]);
    assert_eq!(shrunk["state"], "clean", "{shrunk}");
    assert_eq!(shrunk["raid_disks"], 4, "{shrunk}");
    assert_checks_clean(d, &m[..4], "after the killed served shrink");
    let all = read(d, &m[..4], new_size);
    assert!(all[48 << 20..] == pattern(new_size)[48 << 20..]);
}

/// A served RAID `level` of `count` members, its second member through
/// nbdkit's error filter, shrinks by one; part-way that member's every
/// request fails. It is recorded faulty, the steps and client reads go
/// on around it (md's reshape goes on degraded too), the shrink
/// finishes, and the smaller array reads the pattern, degraded.
fn member_fails_mid_shrink(level: &str, count: usize) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut m = filled(d, level, count, 17, "15M", 42 * MIB, &["--bitmap", "none"]);
    let n = count as u32 - 1;
    let new_size = smaller_size(d, &m, n);
    assert_eq!(new_size, 42 * MIB);
    let node = FailingNode::up(d, "d1");
    let mut served = m.clone();
    served[1] = node.uri();
    let server = serve_with(d, &served, &["--reshape-speed", "3:3"]);
    let grow = shrink_cmd(d, n, new_size, &[]);
    wait_reshape_below(d, new_size - 4 * MIB);
    node.fail();
    let said = succeeded(grow);
    assert!(
        said.contains(&format!("shrunk online from {count} to {n} members")),
        "{said}"
    );
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "finished", "{s}");
    assert!(
        served_bytes(d) == pattern(new_size),
        "read around the failed member"
    );
    server.interrupt();
    let log = serve_log(d);
    assert!(log.contains("faulty"), "{log}");
    drop(node);
    // The failed member left out: the kept roles but one.
    m.remove(1);
    assert_degraded_holds(d, &m[..count - 2], n, &pattern(new_size), new_size);
}

#[test]
fn a_member_failing_mid_shrink_is_recorded_faulty_and_the_shrink_finishes_around_it() {
    member_fails_mid_shrink("5", 5);
    member_fails_mid_shrink("6", 6);
}

#[test]
fn a_leaving_member_failing_mid_shrink_is_recorded_faulty_not_spare() {
    // A served RAID 5 of five shrinks to four; part-way the fifth member
    // (the one leaving) fails. The shrink finishes on the four kept
    // members, and every role table records the fifth faulty, as md
    // does, not a spare the shrink released; its own superblock, which
    // the array wrote no more, does not call it a spare either.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = filled(d, "5", 5, 17, "15M", 42 * MIB, &["--bitmap", "none"]);
    let new_size = smaller_size(d, &m, 4);
    let examined = |name: &str| -> serde_json::Value {
        serde_json::from_str(&ok(&["examine", "--json", name], d)).unwrap()
    };
    let leaving = examined("d4")[0]["superblock"]["dev_number"]
        .as_u64()
        .unwrap();
    let node = FailingNode::up(d, "d4");
    let mut served = m.clone();
    served[4] = node.uri();
    let server = serve_with(d, &served, &["--reshape-speed", "3:3"]);
    let grow = shrink_cmd(d, 4, new_size, &[]);
    wait_reshape_below(d, new_size - 4 * MIB);
    node.fail();
    let said = succeeded(grow);
    assert!(said.contains("shrunk online from 5 to 4 members"), "{said}");
    assert!(
        said.contains(&format!("but {} failed during the shrink", node.uri())),
        "{said}"
    );
    let s = status(d);
    assert_eq!(
        s["array"]["reshape"]["left_faulty"],
        serde_json::json!([node.uri()]),
        "{s}"
    );
    assert!(served_bytes(d) == pattern(new_size));
    server.interrupt();
    assert!(serve_log(d).contains("faulty"), "{}", serve_log(d));
    drop(node);
    // Each kept member's role table (md's v1.2 superblock: 4 KiB into
    // the member, the table at byte 256, two bytes per device) names the
    // fifth faulty (0xfffe), not a spare (0xffff).
    for kept in &m[..4] {
        let sb = examined(kept);
        let at = sb[0]["superblock"]["super_offset_sectors"]
            .as_u64()
            .unwrap()
            * 512
            + 256
            + 2 * leaving;
        let bytes = std::fs::read(d.join(kept)).unwrap();
        let entry = u16::from_le_bytes([bytes[at as usize], bytes[at as usize + 1]]);
        assert_eq!(
            entry, 0xfffe,
            "{kept}'s role table entry of the failed leaving member (device {leaving})"
        );
        // `examine --json` reads the same table.
        assert_eq!(
            sb[0]["role_table"][leaving as usize],
            serde_json::json!({"device": leaving, "role": "faulty", "slot": null}),
            "{kept}: {sb}"
        );
    }
    let e = ok(&["examine", "d4"], d);
    assert!(device_role(&e) != "spare", "the failed leaving member: {e}");
    let shrunk = detail(d, &m[..4]);
    assert_eq!(shrunk["state"], "clean", "{shrunk}");
    assert_eq!(shrunk["raid_disks"], 4, "{shrunk}");
    assert_checks_clean(d, &m[..4], "after the leaving member failed");
    assert!(read(d, &m[..4], new_size) == pattern(new_size));
}

#[test]
fn serve_goes_on_with_raid10_shrinks_the_kernels_and_nvraids_and_starts_one() {
    // The kernel's RAID 10 near=2 shrink 5 -> 4 (its data offset moved up,
    // stopped at 39168 sectors), which `serve` once refused ("a RAID 10 running
    // backwards"): served now at 24 MiB from the start, the kernel's
    // bytes read mid-way, finished. nvraid's own RAID 10 shrink killed
    // mid-way: the same. Then a served RAID 10 near of five shrunk to
    // four on the socket. Each ends with four members, the copies equal,
    // the fifth a spare.
    let dir = tempfile::tempdir().unwrap();
    let k = dir.path().join("kernel");
    std::fs::create_dir(&k).unwrap();
    let m = md_state("reshape_r10_shrink", &k);
    let server = serve_with(&k, &m, &["--reshape-speed", "1:1"]);
    let log = serve_log(&k);
    assert!(
        log.contains(&format!(
            "event=reshape-resumed position={} raid_disks=5->4",
            39168 * 512
        )),
        "{log}"
    );
    assert_eq!(status(&k)["array"]["size_bytes"], 24 << 20);
    let got = served_bytes(&k);
    assert_eq!(status(&k)["array"]["reshape"]["state"], "running");
    assert_eq!(sha(&got), md_state_sha("reshape_r10_shrink"));
    wait_reshape_finished(&k);
    assert_eq!(sha(&served_bytes(&k)), md_state_sha("reshape_r10_shrink"));
    server.interrupt();
    let four: Vec<String> = m
        .iter()
        .filter(|n| !n.ends_with("-4.img"))
        .cloned()
        .collect();
    let done = detail(&k, &four);
    assert_eq!(done["state"], "clean", "{done}");
    assert_eq!(done["raid_disks"], 4, "{done}");
    assert_checks_clean(&k, &four, "the kernel's RAID 10 shrink served");

    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    let m = filled(&own, "10", 5, 17, "15M", 28 * MIB, &["--bitmap", "none"]);
    let size = smaller_size(&own, &m, 4);
    assert_eq!(size, 28 * MIB);
    killed_at(
        &own,
        &with(
            &[
                "grow",
                "-n",
                "4",
                "--array-size",
                &size.to_string(),
                "--step",
                "1M",
            ],
            &m,
        ),
        "reshape-superblock:40",
    );
    let server = serve_with(&own, &m, &["--reshape-speed", "2:2"]);
    assert!(
        serve_log(&own).contains("event=reshape-resumed"),
        "{}",
        serve_log(&own)
    );
    wait_reshape_finished(&own);
    assert!(served_bytes(&own) == pattern(size));
    server.interrupt();
    assert_checks_clean(&own, &m[..4], "nvraid's RAID 10 shrink served");
    assert!(read(&own, &m[..4], size) == pattern(size));

    let start = dir.path().join("start");
    std::fs::create_dir(&start).unwrap();
    let m = filled(
        &start,
        "10",
        5,
        17,
        "15M",
        28 * MIB,
        &["--bitmap", "internal"],
    );
    let server = serve_with(&start, &m, &["--reshape-speed", "3:3"]);
    let grow = shrink_cmd(&start, 4, size, &[]);
    wait_reshape_below(&start, size - MIB);
    let mut data = pattern(size);
    let position = status(&start)["array"]["reshape"]["position_bytes"]
        .as_u64()
        .unwrap();
    write_blocks(&start, position, 30, 3, &mut data);
    let said = succeeded(grow);
    assert!(said.contains("shrunk online from 5 to 4 members"), "{said}");
    assert!(served_bytes(&start) == data);
    server.interrupt();
    let shrunk = detail(&start, &m[..4]);
    assert_eq!(shrunk["raid_disks"], 4, "{shrunk}");
    assert_eq!(shrunk["state"], "clean", "{shrunk}");
    assert_checks_clean(&start, &m[..4], "a served RAID 10 shrunk on the socket");
    assert!(read(&start, &m[..4], size) == data);
    let e = ok(&["examine", "d4"], &start);
    assert!(device_role(&e) == "spare", "{e}");
}

/// What the kernel's md must find in [`the_kernel_assembles_what_served_shrinks_left`]:
/// a RAID 5 grown 4 -> 5 then shrunk 5 -> 4 in one `serve`; a served
/// shrink whose server died inside a step (`NVRAID_FAILPOINT`); a served
/// RAID 10 near shrunk 5 -> 4. Each holds the pattern over its first
/// `KEEP` bytes.
const KEEP: u64 = 28 * MIB;

/// A RAID 5 of four grown to five online and, in the same server run,
/// shrunk back to four online; the images (all five: md takes the fifth
/// as a spare).
fn grown_then_shrunk(d: &Path) -> Vec<PathBuf> {
    let mut m = filled(d, "5", 4, 17, "15M", KEEP, &["--name", "twice"]);
    assert_eq!(smaller_size(d, &m, 3), KEEP);
    blank_mib(d, "d4", 17);
    let server = serve_with(d, &m, &["--reshape-speed", "4:4"]);
    let grow = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(d)
        .args(["grow", "--socket", &control(d), "-n", "5", "--add", "d4"])
        .args(["--step", "1M"])
        .output()
        .unwrap();
    assert!(
        grow.status.success(),
        "{}",
        String::from_utf8_lossy(&grow.stderr)
    );
    m.push("d4".into());
    // The data past KEEP (0xa5, then the grown space's zeros) is cut off.
    let size = 42 * MIB;
    let said = succeeded(shrink_cmd(d, 4, size, &[]));
    assert!(said.contains("shrunk online from 5 to 4 members"), "{said}");
    let got = served_bytes(d);
    assert_eq!(got.len() as u64, size);
    assert!(got[..KEEP as usize] == pattern(KEEP)[..]);
    server.interrupt();
    assert_checks_clean(d, &m[..4], "grown then shrunk");
    m.iter().map(|n| d.join(n)).collect()
}

/// A served RAID 5 of five shrinking to four whose server dies inside a
/// step (a member's rows half written); the images.
fn served_shrink_killed(d: &Path) -> Vec<PathBuf> {
    let m = filled(d, "5", 5, 17, "15M", KEEP, &["--name", "killed"]);
    let size = smaller_size(d, &m, 4);
    let server = serve_env(d, &m, &[], &[("NVRAID_FAILPOINT", "reshape-write:30")]);
    let _ = shrink_cmd(d, 4, size, &[]).wait_with_output();
    let mut server = server;
    let exited = server.wait().unwrap();
    assert!(
        !exited.success(),
        "the server did not stop at the failpoint"
    );
    let left = detail(d, &m);
    assert_eq!(left["state"], "reshaping", "{left}");
    assert_eq!(left["direction"], "backwards", "{left}");
    assert!(read(d, &m, KEEP) == pattern(KEEP), "mid-way");
    m.iter().map(|n| d.join(n)).collect()
}

/// A served RAID 10 near of five shrunk to four on the socket; the images.
fn served_raid10_shrunk(d: &Path) -> Vec<PathBuf> {
    let m = filled(d, "10", 5, 17, "15M", KEEP, &["--name", "ten"]);
    let size = smaller_size(d, &m, 4);
    let server = serve(d, &m);
    succeeded(shrink_cmd(d, 4, size, &[]));
    server.interrupt();
    m.iter().map(|n| d.join(n)).collect()
}

/// A served RAID 5 of five shrunk to four whose second member (through
/// nbdkit's error filter) fails part-way: the shrink finishes degraded.
/// The images of the four kept members but the failed one (left out, as
/// a dead disk would be; the released fifth too, which md would take as
/// a spare and rebuild onto).
fn served_shrink_degraded(d: &Path) -> Vec<PathBuf> {
    let m = filled(
        d,
        "5",
        5,
        17,
        "15M",
        KEEP,
        &["--name", "degraded", "--bitmap", "none"],
    );
    let size = smaller_size(d, &m, 4);
    let node = FailingNode::up(d, "d1");
    let mut served = m.clone();
    served[1] = node.uri();
    let server = serve_with(d, &served, &["--reshape-speed", "3:3"]);
    let grow = shrink_cmd(d, 4, size, &[]);
    wait_reshape_below(d, size - 4 * MIB);
    node.fail();
    let said = succeeded(grow);
    assert!(said.contains("shrunk online from 5 to 4 members"), "{said}");
    server.interrupt();
    drop(node);
    m.iter()
        .filter(|n| *n != "d1" && *n != "d4")
        .map(|n| d.join(n))
        .collect()
}

/// A served RAID 6 of six shrunk to five on the socket; the images.
fn served_raid6_shrunk(d: &Path) -> Vec<PathBuf> {
    let m = filled(d, "6", 6, 17, "15M", KEEP, &["--name", "six"]);
    let size = smaller_size(d, &m, 5);
    let server = serve(d, &m);
    let said = succeeded(shrink_cmd(d, 5, size, &[]));
    assert!(said.contains("shrunk online from 6 to 5 members"), "{said}");
    server.interrupt();
    m.iter().map(|n| d.join(n)).collect()
}

#[test]
fn the_kernel_assembles_what_served_shrinks_left() {
    // One VM boot, five arrays: a RAID 5 grown 4 -> 5 and shrunk 5 -> 4
    // in the same `serve`; a served shrink whose server died inside a
    // step (the kernel's md goes on with nvraid's backwards record); a
    // served RAID 10 near shrunk 5 -> 4; a served RAID 5 shrink finished
    // degraded (a member failed mid-way, its image left out); a served
    // RAID 6 shrunk 6 -> 5. md assembles each (the leaving member a
    // spare, the degraded one degraded), finishes what is left, reads
    // the pattern, and its check finds no mismatch on the whole ones.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, make) in [
        ("twice", grown_then_shrunk as fn(&Path) -> Vec<PathBuf>),
        ("killed", served_shrink_killed),
        ("ten", served_raid10_shrunk),
        ("degraded", served_shrink_degraded),
        ("six", served_raid6_shrunk),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        images.extend(make(&sub));
    }
    let report = kernel_finishes(&images, KEEP);
    eprintln!("{report}");
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 5, "five arrays expected:\n{report}");
    let (six, five): (Vec<&str>, Vec<&str>) =
        lines.iter().partition(|l| l.contains("level=raid6 "));
    let (degraded, whole): (Vec<&str>, Vec<&str>) =
        five.iter().partition(|l| l.contains("degraded=1"));
    assert_eq!(six.len(), 1, "one RAID 6:\n{report}");
    assert_eq!(degraded.len(), 1, "one degraded RAID 5:\n{report}");
    for line in whole {
        assert!(
            line.contains("disks=4 ")
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("reshape=none")
                && line.contains("degraded=0"),
            "{line}\n{report}"
        );
    }
    assert!(
        six[0].contains("disks=5 ")
            && six[0].contains("pattern=ok")
            && six[0].contains("mismatch=0")
            && six[0].contains("reshape=none")
            && six[0].contains("degraded=0"),
        "{}\n{report}",
        six[0]
    );
    assert!(
        degraded[0].contains("level=raid5 ")
            && degraded[0].contains("disks=4 ")
            && degraded[0].contains("pattern=ok")
            && degraded[0].contains("reshape=none"),
        "{}\n{report}",
        degraded[0]
    );
    assert!(
        report.matches("[4](S)").count() >= 3 && report.matches("[5](S)").count() >= 1,
        "the leaving members are not md's spares:\n{report}"
    );
}
