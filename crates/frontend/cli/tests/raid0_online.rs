//! `nvraid grow --socket CTL -n N --add NEW...` of a served RAID 0: grown
//! as md grows one (taken over as a RAID 4 with its parity missing, back
//! to RAID 0 at the end) while clients read and write; a server killed
//! part-way leaves md's record, which `grow --continue` (or the kernel)
//! finishes; a member failing stops it at the recorded position. The same
//! for `nvraid grow --socket CTL --chunk SIZE`, a served RAID 0's chunk
//! changed as md changes it (restriped as that RAID 4).

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn create0(dir: &Path, members: &[String], size: &str, name: &str) {
    let mut args = vec![
        "create", "--level", "0", "--size", size, "--name", name, "--force",
    ];
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

fn grow_cmd(dir: &Path, raid_devices: u32, add: &[&str]) -> Child {
    let n = raid_devices.to_string();
    let ctl = control(dir);
    let mut args = vec!["grow", "--socket", &ctl, "-n", &n];
    for a in add {
        args.extend(["--add", a]);
    }
    args.extend(["--step", "1M"]);
    Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `grow --socket CTL --chunk SIZE` (1 MiB steps).
fn restripe0_cmd(dir: &Path, chunk: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .args(["grow", "--socket", &control(dir), "--chunk", chunk])
        .args(["--step", "1M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn examine_sb(dir: &Path, member: &str) -> serde_json::Value {
    let e: serde_json::Value =
        serde_json::from_str(&ok(&["examine", "--json", member], dir)).unwrap();
    e[0]["superblock"].clone()
}

/// `pattern` written over the array's first `bytes` (`nvraid write`).
fn write_pattern(dir: &Path, members: &[String], bytes: u64) {
    std::fs::write(dir.join("data"), pattern(bytes)).unwrap();
    ok(&with(&["write", "--input", "data"], members), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
}

/// fio writes and verifies through NBD while a served RAID 0 of three
/// grows to four; mid-grow the members record md's RAID 4 of the grow
/// (level 4, five roles, the first new member recovering); the array
/// assembled afterwards is a RAID 0 of four at the larger size, and fio
/// finds every block it wrote.
#[test]
fn fio_verifies_through_nbd_while_a_served_raid0_grows_from_3_to_4_members() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..3).map(|i| format!("m{i}.img")).collect();
    create0(d, &members, "32M", "grow0");
    blank_mib(d, "new.img", 33);
    let size_before = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let server = serve_with(d, &members, &["--reshape-speed", "12"]);
    let fio = fio_verify(d, "grow0", 2000, 11, false);
    std::thread::sleep(Duration::from_millis(300));
    let grow = grow_cmd(d, 4, &["new.img"]);
    let mid = wait_reshape_past(d, 0);
    let r = &mid["array"]["reshape"];
    assert_eq!(r["kind"], "grow", "{mid}");
    assert_eq!(r["raid_disks_before"], 3, "{mid}");
    assert_eq!(r["raid_disks"], 4, "{mid}");
    // md's record of a RAID 0 grow: its RAID 4 of one more member.
    let old_sb = examine_sb(d, "m0.img");
    assert_eq!(old_sb["level"], 4, "{old_sb}");
    assert_eq!(old_sb["raid_disks"], 5, "{old_sb}");
    assert_eq!(old_sb["delta_disks"], 1, "{old_sb}");
    let new_sb = examine_sb(d, "new.img");
    assert_eq!(new_sb["level"], 4, "{new_sb}");
    assert_ne!(
        new_sb["feature_map"].as_u64().unwrap() & 2,
        0,
        "the first new member is not recorded recovering: {new_sb}"
    );
    let out = grow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "grow --socket: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("from 3 to 4"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    fio_done(fio);
    server.interrupt();
    members.push("new.img".into());
    let grown = detail(d, &members);
    assert_eq!(grown["level"], 0, "{grown}");
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    assert_eq!(
        grown["size_bytes"].as_u64().unwrap(),
        size_before / 3 * 4,
        "{grown}"
    );
    assert_plain_raid0(d, &members, 4);
    let server = serve(d, &members);
    fio_done(fio_verify(d, "grow0", 2000, 11, true));
    server.interrupt();
}

/// qemu-io's writes through NBD, acknowledged while a served RAID 0 grows
/// (half below the position, in the new shape, half past it), then the
/// server killed with SIGKILL: `serve` again finishes the grow before it
/// serves (a RAID 0's grow does not go on beside clients once the server
/// that ran it is gone: it is md's RAID 4 with its parity missing), as a
/// RAID 0, and every acknowledged write reads back through it, the rest
/// zeros.
#[test]
fn writes_acknowledged_during_an_online_raid0_grow_survive_a_sigkill_and_continue() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..3).map(|i| format!("m{i}.img")).collect();
    create0(d, &members, "24M", "kill0");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    blank_mib(d, "new.img", 25);
    let mut server = serve_with(d, &members, &["--reshape-speed", "3"]);
    let grow = grow_cmd(d, 4, &["new.img"]);
    let mid = wait_reshape_past(d, 0);
    let position = mid["array"]["reshape"]["position_bytes"].as_u64().unwrap();
    let mut want = vec![0u8; size as usize];
    write_blocks(d, position, 600, 0x2545_f491, &mut want);
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "running", "{s}");
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = grow.wait_with_output();
    members.push("new.img".into());
    // `serve` finishes it first, saying so, then serves the grown RAID 0.
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(
        log.contains("event=reshape-finishing-offline")
            && log.contains("a RAID 0 reshaped as md's RAID 4")
            && log.contains("event=reshape-finished raid_disks=3->4 "),
        "{log}"
    );
    let got = served_bytes(d);
    server.interrupt();
    let grown = detail(d, &members);
    assert_eq!(grown["level"], 0, "{grown}");
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(got.len() as u64, size / 3 * 4);
    want.resize(got.len(), 0);
    for b in 0..got.len() / 4096 {
        assert!(
            got[b * 4096..(b + 1) * 4096] == want[b * 4096..(b + 1) * 4096],
            "block {b} lost an acknowledged write across the kill"
        );
    }
}

/// A member of a served RAID 0 fails part-way through its online grow
/// (nbdkit's error filter): a RAID 0 has no redundancy, so the grow stops
/// at the position its superblocks record, saying so, and the member is
/// not recorded faulty; the clients' requests to other members go on.
/// Once the member answers again, `grow --continue` finishes the RAID 0
/// and every byte written before reads back.
#[test]
fn a_member_failing_mid_online_raid0_grow_stops_it_at_its_recorded_position() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..3).map(|i| format!("m{i}.img")).collect();
    create0(d, &members, "24M", "fail0");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    write_pattern(d, &members, size);
    blank_mib(d, "new.img", 25);
    let node = FailingNode::up(d, "m1.img");
    let through = vec![members[0].clone(), node.uri(), members[2].clone()];
    let mut server = serve_with(d, &through, &["--reshape-speed", "4"]);
    let grow = grow_cmd(d, 4, &["new.img"]);
    wait_reshape_past(d, 2 * MIB);
    node.fail();
    let out = grow.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "the grow went on without a member");
    let stopped: u64 = stderr
        .split("stopped at ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no position in: {stderr}"));
    assert!(
        stderr.contains("no redundancy") && stderr.contains("grow --continue"),
        "{stderr}"
    );
    assert!(stopped > 2 * MIB && stopped < size / 3 * 4, "{stderr}");
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "failed", "{s}");
    assert_eq!(
        s["array"]["reshape"]["position_bytes"].as_u64().unwrap(),
        stopped,
        "{s}"
    );
    // The server serves on: a read of a block on another member below
    // the position (the new shape) and past it (the old) still answers.
    let chunk = 512 * 1024;
    for at in [0u64, stopped + 4 * chunk] {
        let out = Command::new(tool("qemu-io"))
            .args(["-f", "raw", "-c", &format!("read -P {} {at} 4096", 0)])
            .arg(format!(
                "nbd+unix:///?socket={}",
                d.join("md.sock").display()
            ))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("read 4096/4096") && !text.contains("Input/output error"),
            "a read at {at} failed after the grow stopped: {text}"
        );
    }
    server.kill().unwrap();
    server.wait().unwrap();
    let sb = examine_sb(d, "m0.img");
    assert_ne!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{sb}");
    assert_eq!(
        sb["reshape_position"].as_u64().unwrap() * 512,
        stopped,
        "{sb}"
    );
    // md's role table (v1.2: the superblock 4 KiB in, its entries from
    // byte 256): no member recorded faulty (0xfffe) on any member.
    let max_dev = sb["max_dev"].as_u64().unwrap() as usize;
    for m in ["m0.img", "m1.img", "m2.img", "new.img"] {
        let image = std::fs::read(d.join(m)).unwrap();
        let table = &image[4096 + 256..4096 + 256 + 2 * max_dev];
        assert!(
            !table.chunks(2).any(|e| e == [0xfe, 0xff]),
            "{m} records a member faulty in a RAID 0: {table:?}"
        );
    }
    drop(node);
    members.push("new.img".into());
    ok(&with(&["grow", "--continue"], &members), d);
    let grown = detail(d, &members);
    assert_eq!(grown["level"], 0, "{grown}");
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    let got = read(d, &members, size / 3 * 4);
    assert!(
        got[..size as usize] == pattern(size)[..],
        "the data moved wrong"
    );
    assert!(
        got[size as usize..].iter().all(|&b| b == 0),
        "new space not zeros"
    );
}

/// Data bytes each 15 MiB member holds (1 MiB of metadata before them).
const PER: u64 = 14 * MIB;

/// md (tools/mdvm) assembles RAID 0s grown online: one to the end, one
/// whose server was killed with SIGKILL part-way and that `grow
/// --continue` finished, and one left killed, which the kernel's md
/// continues from nvraid's record as its own RAID 4 grow (its parity
/// missing); and a RAID 5 of four that became a RAID 6 of five while
/// served (Q rebuilt online), whole, its check finding no mismatch: each
/// reads the pattern written before.
#[test]
fn the_kernel_assembles_raid0s_grown_online_and_a_raid5_that_took_q_online() {
    let dir = tempfile::tempdir().unwrap();
    let mut images: Vec<PathBuf> = Vec::new();
    for (name, kill, cont) in [
        ("done0", false, false),
        ("cont0", true, true),
        ("left0", true, false),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let names: Vec<String> = (0..3).map(|i| format!("d{i}")).collect();
        create0(&sub, &names, "15M", name);
        write_pattern(&sub, &names, 3 * PER);
        blank_mib(&sub, "d3", 16);
        let speed = if kill { "2" } else { "50" };
        let mut server = serve_with(&sub, &names, &["--reshape-speed", speed]);
        let grow = grow_cmd(&sub, 4, &["d3"]);
        if kill {
            wait_reshape_past(&sub, MIB);
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
        let all: Vec<String> = names.iter().cloned().chain(["d3".into()]).collect();
        if cont {
            ok(&with(&["grow", "--continue"], &all), &sub);
        }
        images.extend(all.iter().map(|n| sub.join(n)));
    }
    // A RAID 5 of four that became a RAID 6 of five while served.
    let sub = dir.path().join("q6");
    std::fs::create_dir(&sub).unwrap();
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    create(&sub, "5", &names, "15M", "q6");
    write_pattern(&sub, &names, 3 * PER);
    blank_mib(&sub, "d4", 16);
    let server = serve_with(&sub, &names, &["--reshape-speed", "50"]);
    let out = add_q_cmd(&sub, 5, "d4").wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.interrupt();
    images.extend(names.iter().chain([&"d4".to_string()]).map(|n| sub.join(n)));
    let report = kernel_reports(
        dir.path(),
        &images,
        &[
            ("done0", 3 * PER),
            ("cont0", 3 * PER),
            ("left0", 3 * PER),
            ("q6", 3 * PER),
        ],
    );
    let line = kernel_line(&report, "q6");
    assert!(
        line.contains("level=raid6")
            && line.contains("disks=5")
            && line.contains("degraded=0")
            && line.contains(&format!("size={}", 3 * PER))
            && line.contains("pattern=ok")
            && line.contains("mismatch=0"),
        "{line}\n{report}"
    );
    for name in ["done0", "cont0"] {
        let line = kernel_line(&report, name);
        assert!(
            line.contains("level=raid0")
                && line.contains("disks=4")
                && line.contains(&format!("size={}", 4 * PER))
                && line.contains("pattern=ok"),
            "{line}\n{report}"
        );
    }
    // The kernel finishes its RAID 4 (mdadm's process that would take it
    // back to RAID 0 is not there): five roles, the parity missing.
    let line = kernel_line(&report, "left0");
    assert!(
        line.contains("level=raid4")
            && line.contains("disks=5")
            && line.contains("degraded=1")
            && line.contains(&format!("size={}", 4 * PER))
            && line.contains("pattern=ok"),
        "{line}\n{report}"
    );
}

fn create(dir: &Path, level: &str, members: &[String], size: &str, name: &str) {
    let mut args = vec![
        "create", "--level", level, "--size", size, "--name", name, "--force",
    ];
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

/// `grow --socket CTL --level 6 -n N+1 --add NEW`.
fn add_q_cmd(dir: &Path, raid_devices: u32, add: &str) -> Child {
    let n = raid_devices.to_string();
    let ctl = control(dir);
    Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .args([
            "grow", "--socket", &ctl, "--level", "6", "-n", &n, "--add", add, "--step", "1M",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait until the server reports its rebuild finished (within 120 s).
fn wait_rebuilt(dir: &Path) -> serde_json::Value {
    let started = std::time::Instant::now();
    loop {
        let s = status(dir);
        let rebuild = &s["array"]["recovery"]["rebuild"];
        if rebuild["finished"] == true {
            return s;
        }
        assert!(rebuild["error"].is_null(), "{s}");
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "rebuild not finished: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A served RAID 5 of four becomes md's RAID 6 of five (the `-6` layout,
/// Q on the added member) while fio writes and verifies through NBD: the
/// members record level 6 at once, the new member recovering while Q is
/// rebuilt on it (client writes below the position writing Q too); after
/// the restart the RAID 6 is whole and clean, its P and Q check clean,
/// and fio finds every block.
#[test]
fn fio_verifies_through_nbd_while_a_served_raid5_becomes_a_raid6_with_q_on_an_added_member() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "32M", "q6");
    blank_mib(d, "new.img", 32);
    let size_before = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let server = serve_with(d, &members, &["--reshape-speed", "8"]);
    let fio = fio_verify(d, "q6", 2000, 13, false);
    std::thread::sleep(Duration::from_millis(300));
    let grow = add_q_cmd(d, 5, "new.img");
    let mid = wait_reshape_past(d, 0);
    let r = &mid["array"]["reshape"];
    assert_eq!(r["kind"], "add-q", "{mid}");
    assert_eq!(r["raid_disks_before"], 4, "{mid}");
    assert_eq!(r["raid_disks"], 5, "{mid}");
    let old_sb = examine_sb(d, "m0.img");
    assert_eq!(old_sb["level"], 6, "{old_sb}");
    assert_eq!(old_sb["raid_disks"], 5, "{old_sb}");
    let new_sb = examine_sb(d, "new.img");
    assert_eq!(new_sb["level"], 6, "{new_sb}");
    assert_ne!(
        new_sb["feature_map"].as_u64().unwrap() & 2,
        0,
        "the Q member is not recorded recovering: {new_sb}"
    );
    // Members neither join nor get checked while it runs.
    let out = grow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "grow --socket --level 6: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("raid5 to raid6, 4 to 5 members"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    fio_done(fio);
    server.interrupt();
    members.push("new.img".into());
    let grown = detail(d, &members);
    assert_eq!(grown["level"], 6, "{grown}");
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(
        grown["size_bytes"].as_u64().unwrap(),
        size_before,
        "{grown}"
    );
    assert_checks_clean(d, &members, "after RAID 5 -> 6 online");
    // The RAID 6 reads every byte without two of its members (Q is used).
    let server = serve(d, &members);
    fio_done(fio_verify(d, "q6", 2000, 13, true));
    server.interrupt();
    let whole = read(d, &members, 48 * MIB);
    let without_two = read(d, &members[2..], 48 * MIB);
    assert!(
        whole == without_two,
        "the RAID 6 without two members reads other bytes"
    );
}

/// qemu-io's writes through NBD, acknowledged on both sides of the Q
/// rebuild's position, then the server killed with SIGKILL: `serve`
/// assembles md's RAID 6 with the Q member recovering from its offset and
/// rebuilds it; every acknowledged write reads back and P and Q check
/// clean.
#[test]
fn writes_acknowledged_while_a_served_raid5_takes_q_survive_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "24M", "kq6");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    blank_mib(d, "new.img", 24);
    let mut server = serve_with(d, &members, &["--reshape-speed", "3"]);
    let grow = add_q_cmd(d, 5, "new.img");
    let mid = wait_reshape_past(d, 0);
    let position = mid["array"]["reshape"]["position_bytes"].as_u64().unwrap();
    let mut want = vec![0u8; size as usize];
    write_blocks(d, position, 600, 0x1234_5679, &mut want);
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "running", "{s}");
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = grow.wait_with_output();
    members.push("new.img".into());
    let server = serve(d, &members);
    wait_rebuilt(d);
    wait_resynced(d);
    server.interrupt();
    let grown = detail(d, &members);
    assert_eq!(grown["level"], 6, "{grown}");
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_checks_clean(d, &members, "after the killed RAID 5 -> 6 was rebuilt");
    let got = read(d, &members, size);
    for b in 0..(size / 4096) as usize {
        assert!(
            got[b * 4096..(b + 1) * 4096] == want[b * 4096..(b + 1) * 4096],
            "block {b} lost an acknowledged write across the kill"
        );
    }
}

/// The added member fails while Q is rebuilt on it (nbdkit's error
/// filter): it is recorded faulty, the rebuild stops saying that the
/// array is a RAID 6 with its Q role missing, and clients go on; the
/// array assembled afterwards is that degraded RAID 6 and every byte
/// (the pattern written before, a write made after the failure) reads
/// back.
#[test]
fn a_q_member_failing_while_a_served_raid5_takes_q_is_recorded_faulty_and_no_byte_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "24M", "fq6");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    write_pattern(d, &members, size);
    blank_mib(d, "new.img", 24);
    let node = FailingNode::up(d, "new.img");
    let server = serve_with(d, &members, &["--reshape-speed", "4"]);
    let grow = add_q_cmd(d, 5, &node.uri());
    wait_reshape_past(d, 2 * MIB);
    node.fail();
    let out = grow.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "the Q rebuild went on: {stderr}");
    assert!(
        stderr.contains("recorded faulty") && stderr.contains("Q role missing"),
        "{stderr}"
    );
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "failed", "{s}");
    // Clients go on: a write after the failure, read back.
    let out = Command::new(tool("qemu-io"))
        .args([
            "-f",
            "raw",
            "-c",
            "write -P 7 0 65536",
            "-c",
            "read -P 7 0 65536",
        ])
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("wrote 65536/65536") && text.contains("read 65536/65536"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.interrupt();
    drop(node);
    let after = detail(d, &members);
    assert_eq!(after["level"], 6, "{after}");
    assert_eq!(after["raid_disks"], 5, "{after}");
    assert!(
        after["state"].as_str().unwrap().contains("degraded"),
        "{after}"
    );
    let mut want = pattern(size);
    want[..65536].fill(7);
    assert!(
        read(d, &members, size) == want,
        "bytes lost with the Q member"
    );
}

/// Decompress the kernel-made state `state` (tests/fixtures/md-states)
/// into `dir`; the member file names, by disk.
fn unpack(state: &str, dir: &Path) -> Vec<String> {
    let src = repo().join("tests/fixtures/md-states").join(state);
    let mut names = Vec::new();
    for disk in 0.. {
        let xz = src.join(format!("disk{disk}.img.xz"));
        if !xz.exists() {
            break;
        }
        let out = Command::new("xz").arg("-dc").arg(&xz).output().expect("xz");
        assert!(out.status.success(), "xz -dc {}", xz.display());
        let name = format!("d{disk}");
        std::fs::write(dir.join(&name), out.stdout).unwrap();
        names.push(name);
    }
    assert!(!names.is_empty(), "no members in {}", src.display());
    names
}

/// A served RAID 0 grow md would not make, or asked wrongly, is refused
/// by the server naming the cause, and no byte of any member (the new
/// ones included) changes: a RAID 0 of several zones (the kernel's own,
/// members of different sizes), a count other than the members plus one
/// per `--add`, a new member that is not blank.
#[test]
fn online_raid0_grows_md_would_not_make_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let images = |names: &[String]| -> Vec<Vec<u8>> {
        names
            .iter()
            .map(|n| std::fs::read(d.join(n)).unwrap())
            .collect()
    };
    let refused = |members: &[String], args: &[&str], want: &str| {
        let mut all: Vec<String> = members.to_vec();
        all.extend(
            args.iter()
                .zip(args.iter().skip(1))
                .filter(|(a, _)| **a == "--add")
                .map(|(_, n)| n.to_string()),
        );
        let before = images(&all);
        let ctl = control(d);
        let mut full = vec!["grow", "--socket", &ctl];
        full.extend_from_slice(args);
        let out = refusal(&full, d);
        assert!(out.contains(want), "{args:?}: {out}");
        assert!(images(&all) == before, "{args:?} changed a member");
    };
    let zones = unpack("zones", d);
    blank_mib(d, "z3", 64);
    let server = serve(d, &zones);
    refused(&zones, &["-n", "4", "--add", "z3"], "several zones");
    server.interrupt();
    let members: Vec<String> = (0..3).map(|i| format!("m{i}.img")).collect();
    create0(d, &members, "16M", "refuse0");
    blank_mib(d, "new.img", 17);
    let other: Vec<String> = (0..2).map(|i| format!("o{i}.img")).collect();
    create0(d, &other, "17M", "other0");
    let server = serve(d, &members);
    refused(&members, &["-n", "5", "--add", "new.img"], "--raid-devices");
    refused(&members, &["-n", "4", "--add", "o0.img"], "o0.img");
    server.interrupt();
}

/// fio writes and verifies through NBD while a served RAID 0 of three is
/// restriped from 64 KiB to 256 KiB chunks; `status` shows a restripe
/// with its position and rate; mid-way the members record md's RAID 4 of
/// the restripe (level 4, four roles, no member added, the new chunk, the
/// data offset moving down); at the end it is a RAID 0 of three in 256
/// KiB chunks at the same size, and fio finds every block it wrote.
#[test]
fn fio_verifies_through_nbd_while_a_served_raid0_is_restriped_to_256k_chunks() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..3).map(|i| format!("m{i}.img")).collect();
    create0(d, &members, "32M", "chunk0");
    let before = detail(d, &members);
    assert_eq!(before["chunk_bytes"], 64 * 1024, "{before}");
    let size = before["size_bytes"].as_u64().unwrap();
    let server = serve_with(d, &members, &["--reshape-speed", "12"]);
    let fio = fio_verify(d, "chunk0", 2000, 23, false);
    std::thread::sleep(Duration::from_millis(300));
    let restripe = restripe0_cmd(d, "256K");
    let mid = wait_reshape_past(d, 0);
    let r = &mid["array"]["reshape"];
    assert_eq!(r["kind"], "restripe", "{mid}");
    assert_eq!(r["raid_disks_before"], 3, "{mid}");
    assert_eq!(r["raid_disks"], 3, "{mid}");
    assert_eq!(r["end_bytes"], size, "{mid}");
    assert!(r["bytes_per_sec"].as_u64().unwrap() > 0, "{mid}");
    // md's record of a RAID 0's chunk change: its RAID 4 of one more
    // member, the parity role named by no member.
    let sb = examine_sb(d, "m0.img");
    assert_eq!(sb["level"], 4, "{sb}");
    assert_eq!(sb["raid_disks"], 4, "{sb}");
    assert_eq!(sb["delta_disks"], 0, "{sb}");
    assert_eq!(sb["new_chunk"], 512, "{sb}");
    assert_eq!(sb["chunk_sectors"], 128, "{sb}");
    assert_ne!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{sb}");
    assert!(
        (sb["new_offset"].as_u64().unwrap() as u32 as i32) < 0,
        "{sb}"
    );
    let out = restripe.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "grow --socket --chunk: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The served array is in the new shape already: a second restripe
    // back starts from it (and is stopped with the server).
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "finished", "{s}");
    fio_done(fio);
    server.interrupt();
    let done = detail(d, &members);
    assert_eq!(done["level"], 0, "{done}");
    assert_eq!(done["raid_disks"], 3, "{done}");
    assert_eq!(done["chunk_bytes"], 256 * 1024, "{done}");
    assert_eq!(done["size_bytes"], size, "{done}");
    assert_eq!(done["state"], "clean", "{done}");
    assert_plain_raid0(d, &members, 3);
    let server = serve(d, &members);
    fio_done(fio_verify(d, "chunk0", 2000, 23, true));
    server.interrupt();
}

/// qemu-io's writes through NBD, acknowledged while a served RAID 0 is
/// restriped to 256 KiB chunks (half below the position, in the new
/// chunk, half past it), a second reshape refused meanwhile, then the
/// server killed with SIGKILL: `serve` again finishes the restripe before
/// it serves (md's RAID 4 with its parity missing), a RAID 0 in 256 KiB
/// chunks, and every acknowledged write reads back through it, the rest
/// zeros.
#[test]
fn writes_acknowledged_during_an_online_raid0_restripe_survive_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..3).map(|i| format!("m{i}.img")).collect();
    create0(d, &members, "24M", "kill0c");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    blank_mib(d, "new.img", 25);
    let mut server = serve_with(d, &members, &["--reshape-speed", "3"]);
    let restripe = restripe0_cmd(d, "256K");
    let mid = wait_reshape_past(d, 0);
    let position = mid["array"]["reshape"]["position_bytes"].as_u64().unwrap();
    let mut want = vec![0u8; size as usize];
    write_blocks(d, position, 600, 0x2545_f4a1, &mut want);
    // A second reshape while it runs: refused, the new member untouched.
    let blank = std::fs::read(d.join("new.img")).unwrap();
    let text = refusal(&["grow", "--socket", &control(d), "--chunk", "128K"], d);
    assert!(text.contains("second reshape"), "{text}");
    let text = refusal(
        &[
            "grow",
            "--socket",
            &control(d),
            "-n",
            "4",
            "--add",
            "new.img",
        ],
        d,
    );
    assert!(text.contains("second"), "{text}");
    assert!(
        std::fs::read(d.join("new.img")).unwrap() == blank,
        "a refused grow wrote to the new member"
    );
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "running", "{s}");
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = restripe.wait_with_output();
    let sb = examine_sb(d, "m0.img");
    assert_ne!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{sb}");
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(
        log.contains("event=reshape-finishing-offline")
            && log.contains("a RAID 0 reshaped as md's RAID 4")
            && log.contains("event=reshape-finished"),
        "{log}"
    );
    let got = served_bytes(d);
    server.interrupt();
    let done = detail(d, &members);
    assert_eq!(done["level"], 0, "{done}");
    assert_eq!(done["raid_disks"], 3, "{done}");
    assert_eq!(done["chunk_bytes"], 256 * 1024, "{done}");
    assert_eq!(done["state"], "clean", "{done}");
    assert_eq!(got.len() as u64, size);
    for b in 0..got.len() / 4096 {
        assert!(
            got[b * 4096..(b + 1) * 4096] == want[b * 4096..(b + 1) * 4096],
            "block {b} lost an acknowledged write across the kill"
        );
    }
}

/// A member of a served RAID 0 fails part-way through its online
/// restripe (nbdkit's error filter): the restripe stops at the position
/// its superblocks record, saying so, the member not recorded faulty;
/// reads on the other members go on in both chunks. Once the member
/// answers again, `grow --continue` finishes it: a RAID 0 in 256 KiB
/// chunks, every byte written before in place.
#[test]
fn a_member_failing_mid_online_raid0_restripe_stops_it_at_its_recorded_position() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..3).map(|i| format!("m{i}.img")).collect();
    create0(d, &members, "24M", "failc0");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    write_pattern(d, &members, size);
    let node = FailingNode::up(d, "m1.img");
    let through = vec![members[0].clone(), node.uri(), members[2].clone()];
    let mut server = serve_with(d, &through, &["--reshape-speed", "4"]);
    let restripe = restripe0_cmd(d, "256K");
    wait_reshape_past(d, 2 * MIB);
    node.fail();
    let out = restripe.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "the restripe went on without a member"
    );
    let stopped: u64 = stderr
        .split("restripe stopped at ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no position in: {stderr}"));
    assert!(
        stderr.contains("no redundancy") && stderr.contains("grow --continue"),
        "{stderr}"
    );
    assert!(stopped > 2 * MIB && stopped < size, "{stderr}");
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "failed", "{s}");
    assert_eq!(
        s["array"]["reshape"]["position_bytes"].as_u64().unwrap(),
        stopped,
        "{s}"
    );
    // Blocks on m0 (the first chunk of a row in either chunk) below the
    // position and past it still read, and read the pattern (block b
    // holds b).
    let want = pattern(size);
    // (A multiple of 768 KiB starts a row on m0 in either chunk.)
    let row = 3 * 256 * 1024;
    for at in [row, (stopped + row) / row * row] {
        assert!(at + 4096 <= size, "{at}");
        let out = Command::new(tool("qemu-io"))
            .args(["-f", "raw", "-c", &format!("read -v {at} 4096")])
            .arg(format!(
                "nbd+unix:///?socket={}",
                d.join("md.sock").display()
            ))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("read 4096/4096") && !text.contains("Input/output error"),
            "a read at {at} failed after the restripe stopped: {text}"
        );
        let first: Vec<u8> = text
            .lines()
            .next()
            .unwrap()
            .split(':')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .take(16)
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect();
        assert_eq!(first[..], want[at as usize..at as usize + 16], "at {at}");
    }
    server.kill().unwrap();
    server.wait().unwrap();
    let sb = examine_sb(d, "m0.img");
    assert_ne!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{sb}");
    assert_eq!(
        sb["reshape_position"].as_u64().unwrap() * 512,
        stopped,
        "{sb}"
    );
    let max_dev = sb["max_dev"].as_u64().unwrap() as usize;
    for m in &members {
        let image = std::fs::read(d.join(m)).unwrap();
        let table = &image[4096 + 256..4096 + 256 + 2 * max_dev];
        assert!(
            !table.chunks(2).any(|e| e == [0xfe, 0xff]),
            "{m} records a member faulty in a RAID 0: {table:?}"
        );
    }
    drop(node);
    ok(&with(&["grow", "--continue"], &members), d);
    let done = detail(d, &members);
    assert_eq!(done["level"], 0, "{done}");
    assert_eq!(done["chunk_bytes"], 256 * 1024, "{done}");
    assert!(read(d, &members, size) == want, "the data moved wrong");
}

/// md (tools/mdvm) assembles RAID 0s restriped online from 64 KiB to 256
/// KiB chunks: one to the end, one whose server was killed part-way and
/// that `grow --continue` finished (both RAID 0s of three in 256 KiB
/// chunks), and one left killed, which the kernel continues from
/// nvraid's record as its own RAID 4 restripe (its parity missing: md's
/// level 4, degraded by that role, in 256 KiB chunks): each reads the
/// pattern written before.
#[test]
fn the_kernel_assembles_raid0s_restriped_online_and_finishes_one_left_mid_restripe() {
    let dir = tempfile::tempdir().unwrap();
    let mut images: Vec<PathBuf> = Vec::new();
    for (name, kill, cont) in [
        ("rdone0", false, false),
        ("rcont0", true, true),
        ("rleft0", true, false),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let names: Vec<String> = (0..3).map(|i| format!("d{i}")).collect();
        create0(&sub, &names, "15M", name);
        write_pattern(&sub, &names, 3 * PER);
        let speed = if kill { "2" } else { "50" };
        let mut server = serve_with(&sub, &names, &["--reshape-speed", speed]);
        let restripe = restripe0_cmd(&sub, "256K");
        if kill {
            wait_reshape_past(&sub, MIB);
            server.kill().unwrap();
            server.wait().unwrap();
            let _ = restripe.wait_with_output();
        } else {
            let out = restripe.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            server.interrupt();
        }
        if cont {
            ok(&with(&["grow", "--continue"], &names), &sub);
        }
        images.extend(names.iter().map(|n| sub.join(n)));
    }
    let report = kernel_reports(
        dir.path(),
        &images,
        &[
            ("rdone0", 3 * PER),
            ("rcont0", 3 * PER),
            ("rleft0", 3 * PER),
        ],
    );
    for name in ["rdone0", "rcont0"] {
        let line = kernel_line(&report, name);
        assert!(
            line.contains("level=raid0")
                && line.contains("disks=3")
                && line.contains(&format!("size={}", 3 * PER))
                && line.contains("pattern=ok")
                && line.contains("chunk=262144"),
            "{line}\n{report}"
        );
    }
    let line = kernel_line(&report, "rleft0");
    assert!(
        line.contains("level=raid4")
            && line.contains("disks=4")
            && line.contains("degraded=1")
            && line.contains(&format!("size={}", 3 * PER))
            && line.contains("pattern=ok")
            && line.contains("chunk=262144"),
        "{line}\n{report}"
    );
}

/// A server dying inside a served RAID 0's restripe (`NVRAID_FAILPOINT`,
/// no cleanup, as a power cut ends it): inside a step (after its first,
/// or a later, member write) and after a step's record. The next `serve`
/// finishes the restripe before it serves, and every byte of the pattern
/// written before reads back through it; the array is a RAID 0 of three
/// in 256 KiB chunks (in 64 KiB ones when it died before any member
/// recorded the restripe).
#[test]
fn a_server_dying_inside_an_online_raid0_restripe_leaves_every_byte() {
    for kill in [
        "reshape-write:1",
        "reshape-write:8",
        "reshape-superblock:1",
        "reshape-superblock:4",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let members: Vec<String> = (0..3).map(|i| format!("m{i}.img")).collect();
        create0(d, &members, "8M", "diec0");
        let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
        write_pattern(d, &members, size);
        let mut server = serve_env(d, &members, &[], &[("NVRAID_FAILPOINT", kill)]);
        let restripe = restripe0_cmd(d, "256K");
        let exit = server.wait().unwrap();
        assert!(!exit.success(), "{kill}: the server lived");
        let _ = restripe.wait_with_output();
        assert!(
            serve_log(d).contains(&format!("failpoint {}", kill.split(':').next().unwrap())),
            "{kill}: {}",
            serve_log(d)
        );
        // The record reaches the members with the first step's superblock
        // update: a server dying inside that step leaves a RAID 0 in its
        // old chunk (the step wrote only below the data), any later one
        // md's record.
        let recorded = (examine_sb(d, "m0.img")["feature_map"].as_u64().unwrap() & 4) != 0;
        assert!(
            recorded || kill == "reshape-write:1",
            "{kill}: no record on m0"
        );
        let server = serve(d, &members);
        let log = serve_log(d);
        assert!(
            !recorded
                || log.contains("event=reshape-finishing-offline")
                    && log.contains("event=reshape-finished"),
            "{kill}: {log}"
        );
        let got = served_bytes(d);
        server.interrupt();
        assert_eq!(got.len() as u64, size, "{kill}");
        assert!(got == pattern(size), "{kill}: a byte moved wrong");
        let done = detail(d, &members);
        assert_eq!(done["level"], 0, "{kill}: {done}");
        let chunk = if recorded { 256 } else { 64 } * 1024;
        assert_eq!(done["chunk_bytes"], chunk, "{kill}: {done}");
        assert_eq!(done["state"], "clean", "{kill}: {done}");
    }
}

/// Every member's superblock records a RAID 0 of `raid_disks`, with no
/// recovery or reshape in progress (feature bits 2 and 4).
fn assert_plain_raid0(d: &Path, members: &[String], raid_disks: u32) {
    for m in members {
        let sb = examine_sb(d, m);
        assert_eq!(sb["level"], 0, "{m}: {sb}");
        assert_eq!(sb["raid_disks"], raid_disks, "{m}: {sb}");
        assert_eq!(
            sb["feature_map"].as_u64().unwrap() & (2 | 4),
            0,
            "{m}: {sb}"
        );
    }
}
