//! `nvraid serve` of an array its members record mid-grow: a clean one
//! (the server stopped, or the kernel's md) is served in its old shape
//! while the grow goes on from the recorded position; a dirty one (the
//! server killed) is finished offline first and resynced; what cannot go
//! on is refused by name, with no byte changed.

mod common;

use common::reshape::*;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn create(dir: &Path, members: &[String], size: &str) {
    let mut args = vec!["create", "--level", "5", "--size", size, "--force"];
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

/// `grow --socket` to one more member (`add`), started once the server
/// records it; the command itself waits for the grow's end (or the
/// server's), so it runs on beside the test (`GrowCmd` ends it).
fn grow(dir: &Path, raid_devices: u32, add: &str) -> GrowCmd {
    let child = Command::new(env!("CARGO_BIN_EXE_nvraid"))
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
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    GrowCmd(child)
}

/// A `grow --socket` command, killed when dropped.
struct GrowCmd(Child);

impl Drop for GrowCmd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The array, served again after the grow, is the new shape: every block
/// fio wrote reads back, the parity checks clean, the size is the new one.
fn finished_at_the_new_size(dir: &Path, members: &[String], size_before: u64) {
    let server = serve(dir, members);
    fio_done(fio_verify_resume(dir, true));
    server.interrupt();
    let grown = detail(dir, members);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], members.len(), "{grown}");
    assert_eq!(
        grown["size_bytes"].as_u64().unwrap(),
        size_before / 3 * 4,
        "{grown}"
    );
    assert_checks_clean(dir, members, "after the grow was finished");
}

/// Four 32 MiB members (a 96 MiB RAID 5) and a blank fifth.
fn four_and_a_blank(dir: &Path) -> (Vec<String>, u64) {
    let members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(dir, &members, "32M");
    blank_mib(dir, "new.img", 32);
    let size = detail(dir, &members)["size_bytes"].as_u64().unwrap();
    (members, size)
}

#[test]
fn a_server_killed_mid_grow_is_served_again_with_the_grow_finished_and_fio_verifying() {
    // fio writes and verifies through NBD while the served RAID 5 grows
    // (slowly); the server is then killed with SIGKILL mid-grow (the array
    // dirty). Served again, the grow is finished before it is served and
    // the array resynced; fio's verify pass reads every block it wrote.
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut members, size) = four_and_a_blank(d);
    let mut server = serve_with(d, &members, &["--reshape-speed", "1"]);
    let _grow = grow(d, 5, "new.img");
    fio_done(fio_verify_resume(d, false));
    wait_mid_grow(d, 0);
    server.kill().unwrap();
    server.wait().unwrap();
    members.push("new.img".into());
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(log.contains("event=reshape-finishing-offline"), "{log}");
    assert!(
        log.contains("event=reshape-finished raid_disks=4->5"),
        "{log}"
    );
    // The array came up dirty: fio's read pass goes beside its resync.
    fio_done(fio_verify_resume(d, true));
    wait_resynced(d);
    server.interrupt();
    finished_at_the_new_size(d, &members, size);
}

#[test]
fn a_grow_stopped_with_the_server_goes_on_when_served_again_and_survives_a_kill() {
    // The server is stopped (SIGTERM) mid-grow; served again, the grow
    // goes on from the recorded position while fio writes and verifies
    // through NBD (status shows it, the log says where it resumed); the
    // server is then killed with SIGKILL during the resumed grow, and
    // served again the grow is finished and every block fio wrote reads
    // back.
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut members, size) = four_and_a_blank(d);
    let server = serve_with(d, &members, &["--reshape-speed", "8"]);
    let _grow = grow(d, 5, "new.img");
    let stopped_at = wait_mid_grow(d, 0);
    Command::new("kill")
        .arg("-TERM")
        .arg(server.id().to_string())
        .status()
        .unwrap();
    let mut server = server;
    assert!(server.wait().unwrap().success());
    members.push("new.img".into());
    let d0 = detail(d, &members);
    assert_eq!(d0["state"], "reshaping", "{d0}");
    let recorded = d0["position_bytes"].as_u64().unwrap();
    assert!(recorded >= stopped_at, "{d0}");
    let mut server = serve_with(d, &members, &["--reshape-speed", "1"]);
    let log = serve_log(d);
    assert!(
        log.contains(&format!(
            "event=reshape-resumed position={recorded} raid_disks=4->5"
        )),
        "{log}"
    );
    let s = status(d);
    // Served in the old shape until it is assembled again.
    assert_eq!(s["array"]["size_bytes"], size, "{s}");
    assert_eq!(s["array"]["reshape"]["raid_disks_before"], 4, "{s}");
    fio_done(fio_verify_resume(d, false));
    wait_mid_grow(d, recorded);
    server.kill().unwrap();
    server.wait().unwrap();
    let d1 = detail(d, &members);
    assert_eq!(d1["state"], "reshaping", "{d1}");
    assert!(d1["position_bytes"].as_u64().unwrap() > recorded, "{d1}");
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(
        log.contains("event=reshape-finished raid_disks=4->5"),
        "{log}"
    );
    fio_done(fio_verify_resume(d, true));
    wait_resynced(d);
    server.interrupt();
    finished_at_the_new_size(d, &members, size);
}

#[test]
fn a_grow_stopped_with_the_server_finishes_while_served_again() {
    // Stopped mid-grow, served again at full speed: the grow goes on to
    // its end while served ("finished" in status), bytes written before
    // it read back through NBD, and the array assembled afterwards is the
    // new shape with every byte in place and its parity right.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut members, size) = four_and_a_blank(d);
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 ^ 0x3c).collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    let mut write = vec!["write", "--input", "data.bin"];
    write.extend(members.iter().map(String::as_str));
    ok(&write, d);
    let server = serve_with(d, &members, &["--reshape-speed", "4"]);
    let _grow = grow(d, 5, "new.img");
    wait_mid_grow(d, 0);
    server.interrupt();
    members.push("new.img".into());
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(log.contains("event=reshape-resumed"), "{log}");
    let s = wait_reshape_finished(d);
    assert_eq!(s["array"]["reshape"]["raid_disks"], 5, "{s}");
    let got = Command::new("nbdcopy")
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .arg("-")
        .output()
        .expect("nbdcopy (libnbd-bin)");
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    // The served array took the grown shape at the end: a new connection
    // is told the new size, the grown region zeros.
    let new_size = s["array"]["reshape"]["new_size_bytes"].as_u64().unwrap();
    assert!(new_size > size, "{s}");
    assert_eq!(got.stdout.len() as u64, new_size);
    assert!(
        got.stdout[..size as usize] == data[..],
        "a byte changed across the resumed grow"
    );
    assert!(got.stdout[size as usize..].iter().all(|&b| b == 0));
    server.interrupt();
    let grown = detail(d, &members);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_checks_clean(d, &members, "after the resumed grow");
    let mut read = vec!["read"];
    read.extend(members.iter().map(String::as_str));
    let all = ok_bytes(&read, d);
    assert_eq!(all.len() as u64, size / 3 * 4);
    assert!(all[..size as usize] == data[..]);
    assert!(all[size as usize..].iter().all(|&b| b == 0));
}

/// A RAID 5 recorded mid-grow in `dir`, the server killed (dirty) or
/// stopped (clean) part-way; every member's name, the added one last.
fn left_mid_grow(d: &Path, kill: bool) -> Vec<String> {
    let (mut members, _) = four_and_a_blank(d);
    let mut server = serve_with(d, &members, &["--reshape-speed", "2"]);
    let _grow = grow(d, 5, "new.img");
    wait_mid_grow(d, 0);
    if kill {
        server.kill().unwrap();
        server.wait().unwrap();
    } else {
        server.interrupt();
    }
    members.push("new.img".into());
    members
}

#[test]
fn a_dirty_array_recorded_mid_grow_with_a_member_missing_is_refused_and_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = left_mid_grow(d, true);
    let before = hash_files(d);
    // The added member missing, then an old one.
    for left_out in [4, 1] {
        let given: Vec<String> = (0..5)
            .filter(|&i| i != left_out)
            .map(|i| members[i].clone())
            .collect();
        let mut args = vec!["serve", "--listen", "unix:md.sock"];
        args.extend(given.iter().map(String::as_str));
        refused(
            &args,
            d,
            &[
                "not stopped cleanly",
                &format!("role(s) {left_out} have no member"),
                "stale",
                "grow --continue",
            ],
        );
        assert_eq!(hash_files(d), before, "a refused serve changed a byte");
    }
}

#[test]
fn a_clean_array_recorded_mid_grow_with_a_member_missing_is_refused_and_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = left_mid_grow(d, false);
    let before = hash_files(d);
    let mut args = vec!["serve", "--listen", "unix:md.sock"];
    args.extend(members[..4].iter().map(String::as_str));
    refused(
        &args,
        d,
        &[
            "role(s) 4 have no member",
            "every member",
            "grow --continue",
        ],
    );
    // Read-only, the grow could not go on.
    let mut args = vec!["serve", "--read-only", "--listen", "unix:md.sock"];
    args.extend(members.iter().map(String::as_str));
    refused(&args, d, &["read-only", "grow --continue"]);
    assert_eq!(hash_files(d), before, "a refused serve changed a byte");
}

#[test]
fn writes_in_flight_when_a_growing_server_is_killed_leave_acknowledged_blocks_and_right_parity() {
    // qemu-io writes 4 KiB blocks (each a block of its own, filled with
    // the write's byte) at random places of a served RAID 5 mid-grow,
    // on both sides of the position, and the server is killed with
    // SIGKILL while they go on: some were acknowledged, some in flight
    // (a stripe's data and parity may disagree). Served again, the grow
    // is finished and the array resynced: every acknowledged block reads
    // back, the others are theirs or zeros, and the parity checks clean.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut members, size) = four_and_a_blank(d);
    let mut server = serve_with(d, &members, &["--reshape-speed", "1"]);
    let _grow = grow(d, 5, "new.img");
    let position = wait_mid_grow(d, 0);
    let blocks = size / 4096;
    let mut rng = 0x2545_f491_u64;
    let mut seen = std::collections::HashSet::new();
    let mut writes = Vec::new();
    let mut qemu_io = Command::new("qemu-io");
    qemu_io.args(["-f", "raw"]);
    for i in 0..4000u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Half below the position (the new shape), half above (the old);
        // each block written once.
        let below = (position / 4096).max(1);
        let b = if i % 2 == 0 {
            rng % below
        } else {
            below + rng % (blocks - below)
        };
        if !seen.insert(b) {
            continue;
        }
        let byte = (i % 250 + 1) as u8;
        qemu_io.args(["-c", &format!("write -P {byte} {} 4096", b * 4096)]);
        writes.push((b, byte));
    }
    let qemu_io = qemu_io
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-io (qemu-utils)");
    std::thread::sleep(Duration::from_millis(400));
    server.kill().unwrap();
    server.wait().unwrap();
    let out = qemu_io.wait_with_output().unwrap();
    let acked: std::collections::HashSet<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("wrote 4096/4096 bytes at offset ")?;
            rest.parse::<u64>().ok().map(|offset| offset / 4096)
        })
        .collect();
    assert!(
        !acked.is_empty(),
        "no write acknowledged: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    members.push("new.img".into());
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(
        log.contains("event=reshape-finished raid_disks=4->5"),
        "{log}"
    );
    wait_resynced(d);
    server.interrupt();
    assert_checks_clean(
        d,
        &members,
        "after the killed grow was finished and resynced",
    );
    let mut read = vec!["read"];
    read.extend(members.iter().map(String::as_str));
    let got = ok_bytes(&read, d);
    assert_eq!(got.len() as u64, size / 3 * 4);
    let written: std::collections::HashMap<u64, u8> = writes.iter().copied().collect();
    for b in 0..blocks {
        let block = &got[(b * 4096) as usize..((b + 1) * 4096) as usize];
        match written.get(&b) {
            Some(&byte) if acked.contains(&b) => assert!(
                block.iter().all(|&x| x == byte),
                "block {b}: an acknowledged write was lost across the kill"
            ),
            Some(&byte) => assert!(
                block.iter().all(|&x| x == byte || x == 0),
                "block {b}: neither its write nor zeros"
            ),
            None => assert!(block.iter().all(|&x| x == 0), "block {b} changed"),
        }
    }
    eprintln!(
        "{} of {} writes acknowledged before the kill",
        acked.len(),
        writes.len()
    );
}

#[test]
fn a_raid6_whose_offline_grow_was_killed_mid_checkpoint_grows_on_while_served() {
    // `nvraid grow` of a RAID 6 from 5 to 6 members dies in the middle of
    // a checkpoint (some superblocks at the new position, the others one
    // event behind at the last): the array was never dirtied, so `serve`
    // goes on with the grow from the freshest position while serving it,
    // and it ends with every byte in place and the parity right.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..5).map(|i| format!("m{i}.img")).collect();
    let mut args = vec!["create", "--level", "6", "--size", "32M", "--force"];
    args.extend(members.iter().map(String::as_str));
    ok(&args, d);
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let data: Vec<u8> = (0..size).map(|i| (i % 247) as u8 ^ 0xa5).collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    let mut write = vec!["write", "--input", "data.bin"];
    write.extend(members.iter().map(String::as_str));
    ok(&write, d);
    blank_mib(d, "new.img", 32);
    // Six superblocks record the reshape, then six per checkpoint: the
    // 27th is the third of the fourth checkpoint's.
    let mut args = vec![
        "grow",
        "--raid-devices",
        "6",
        "--add",
        "new.img",
        "--step",
        "1M",
    ];
    args.extend(members.iter().map(String::as_str));
    let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(d)
        .env("NVRAID_FAILPOINT", "reshape-superblock:27")
        .args(&args)
        .output()
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("failpoint"),
        "grow did not stop: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    members.push("new.img".into());
    let before = detail(d, &members);
    assert_eq!(before["state"], "reshaping", "{before}");
    let recorded = before["position_bytes"].as_u64().unwrap();
    assert!(recorded > 0, "{before}");
    let events: std::collections::BTreeSet<u64> = before["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["events"].as_u64().unwrap())
        .collect();
    assert_eq!(events.len(), 2, "not killed mid-checkpoint: {before}");
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(
        log.contains(&format!(
            "event=reshape-resumed position={recorded} raid_disks=5->6"
        )),
        "{log}"
    );
    let s = wait_reshape_finished(d);
    // The finished shape is served at once (`Array::swap_shape`).
    assert!(s["array"]["size_bytes"].as_u64().unwrap() > size, "{s}");
    assert_eq!(
        s["array"]["size_bytes"], s["array"]["reshape"]["new_size_bytes"],
        "{s}"
    );
    assert_eq!(s["array"]["raid_disks"], 6, "{s}");
    server.interrupt();
    let grown = detail(d, &members);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], 6, "{grown}");
    assert_checks_clean(d, &members, "after the resumed RAID 6 grow");
    let mut read = vec!["read"];
    read.extend(members.iter().map(String::as_str));
    let all = ok_bytes(&read, d);
    assert_eq!(all.len() as u64, size / 3 * 4);
    assert!(all[..size as usize] == data[..], "a byte changed");
    assert!(all[size as usize..].iter().all(|&b| b == 0));
}

#[test]
fn a_dirty_array_recorded_mid_grow_given_with_a_strangers_member_is_refused_before_the_grow_moves()
{
    // The grow of a dirty array is finished before it is served; a member
    // of another array given with it is refused first, by name, and no
    // byte of any member moves.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = left_mid_grow(d, true);
    let strangers = ["x0.img".to_string(), "x1.img".to_string()];
    let mut args = vec!["create", "--level", "1", "--size", "8M", "--force"];
    args.extend(strangers.iter().map(String::as_str));
    ok(&args, d);
    let mut args = vec!["serve", "--listen", "unix:md.sock"];
    args.extend(members.iter().map(String::as_str));
    args.push("x0.img");
    refused(&args, d, &["x0.img", "members of two different arrays"]);
}

/// fio's verified writes through NBD over a grow served again (or the
/// read pass checking them).
fn fio_verify_resume(dir: &Path, verify_only: bool) -> Child {
    fio_verify(dir, "resume", 3000, 11, verify_only)
}

/// [`wait_reshape_past`]'s position.
fn wait_mid_grow(dir: &Path, past: u64) -> u64 {
    wait_reshape_past(dir, past)["array"]["reshape"]["position_bytes"]
        .as_u64()
        .unwrap()
}

/// Four 32 MiB members in a RAID 10 near=2 (its default bitmap kept)
/// holding [`pattern`], and a blank fifth; the members' names and the
/// array's size.
fn raid10_and_a_blank(d: &Path) -> (Vec<String>, u64) {
    let members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    ok(
        &with(
            &["create", "--level", "10", "--size", "32M", "--force"],
            &members,
        ),
        d,
    );
    blank_mib(d, "new.img", 32);
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    std::fs::write(d.join("data.bin"), pattern(size)).unwrap();
    ok(&with(&["write", "--input", "data.bin"], &members), d);
    (members, size)
}

#[test]
fn a_raid10_grow_stopped_with_the_server_goes_on_when_served_again_and_md_assembles_it() {
    // A RAID 10 near=2 growing from 4 to 5 members while served is
    // stopped (SIGTERM) part-way; served again, the grow goes on from the
    // recorded position (it was refused before, naming `grow --continue`):
    // every byte reads back through NBD while it runs, it finishes, the
    // array assembled afterwards is the 5-member one with the pattern in
    // place, zeros past it and its copies agreeing, and the kernel's md
    // assembles it, reads the pattern and finds no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut members, size) = raid10_and_a_blank(d);
    let server = serve_with(d, &members, &["--reshape-speed", "4"]);
    let _grow = grow(d, 5, "new.img");
    wait_mid_grow(d, 0);
    server.interrupt();
    members.push("new.img".into());
    let d0 = detail(d, &members);
    assert_eq!(d0["state"], "reshaping", "{d0}");
    let recorded = d0["position_bytes"].as_u64().unwrap();
    let server = serve_with(d, &members, &["--reshape-speed", "2"]);
    let log = serve_log(d);
    assert!(
        log.contains(&format!(
            "event=reshape-resumed position={recorded} raid_disks=4->5"
        )),
        "{log}"
    );
    let s = status(d);
    assert_eq!(s["array"]["size_bytes"], size, "{s}");
    let got = served_bytes(d);
    assert_eq!(
        status(d)["array"]["reshape"]["state"],
        "running",
        "the grow ended before the read"
    );
    assert!(
        got == pattern(size),
        "a byte changed across the resumed grow"
    );
    let s = wait_reshape_finished(d);
    assert_eq!(s["array"]["reshape"]["raid_disks"], 5, "{s}");
    // Served in the grown shape from its end on: the pattern, then the
    // grown region's zeros.
    let served = served_bytes(d);
    assert!(served.len() as u64 > size, "not served at the grown size");
    assert!(
        served[..size as usize] == pattern(size)[..],
        "after the grow finished"
    );
    assert!(served[size as usize..].iter().all(|&b| b == 0));
    server.interrupt();
    let grown = detail(d, &members);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    let new_size = grown["size_bytes"].as_u64().unwrap();
    assert_eq!(new_size, size / 4 * 5, "{grown}");
    assert_checks_clean(d, &members, "after the resumed RAID 10 grow");
    let all = ok_bytes(&with(&["read"], &members), d);
    assert!(all[..size as usize] == pattern(size)[..]);
    assert!(all[size as usize..].iter().all(|&b| b == 0), "new space");
    let images: Vec<std::path::PathBuf> = members.iter().map(|m| d.join(m)).collect();
    let report = kernel_finishes(&images, size);
    let line = report
        .lines()
        .find(|l| l.starts_with("KERNEL "))
        .unwrap_or_else(|| panic!("the kernel assembled nothing:\n{report}"));
    assert!(
        line.contains("level=raid10")
            && line.contains("disks=5")
            && line.contains(&format!("size={new_size}"))
            && line.contains("pattern=ok")
            && line.contains("mismatch=0"),
        "{line}\n{report}"
    );
}

#[test]
fn a_server_killed_mid_raid10_grow_is_served_again_with_the_grow_finished_and_fio_verifying() {
    // fio writes and verifies through NBD while a served RAID 10 grows
    // from 4 to 5 members; the server is killed (SIGKILL, the array
    // dirty). Served again, the grow is finished offline before it is
    // served (refused before, naming `grow --continue`), the array comes
    // up in its new shape and fio's verify pass reads every block it
    // wrote; the copies agree once it is resynced.
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut members, size) = raid10_and_a_blank(d);
    let mut server = serve_with(d, &members, &["--reshape-speed", "1"]);
    let _grow = grow(d, 5, "new.img");
    fio_done(fio_verify_resume(d, false));
    wait_mid_grow(d, 0);
    server.kill().unwrap();
    server.wait().unwrap();
    members.push("new.img".into());
    assert_eq!(detail(d, &members)["state"], "reshaping");
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(log.contains("event=reshape-finishing-offline"), "{log}");
    assert!(
        log.contains("event=reshape-finished raid_disks=4->5"),
        "{log}"
    );
    assert_eq!(status(d)["array"]["size_bytes"], size / 4 * 5);
    fio_done(fio_verify_resume(d, true));
    wait_resynced(d);
    server.interrupt();
    let grown = detail(d, &members);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_checks_clean(d, &members, "after the RAID 10 grow finished offline");
}
