//! `nvraid grow --socket --chunk/--layout`: a served RAID 5/6 restriped
//! (64 KiB -> 128 KiB chunks, left-symmetric -> right-asymmetric) while fio
//! writes and verifies through NBD; `status` shows it; a server killed
//! or stopped mid-restripe is served again and the restripe finished with
//! every acknowledged byte in place; the kernel's md finishes one left
//! mid-way; what cannot be restriped served is refused by name, with no
//! byte changed.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A RAID `level` of `count` members using `size` of each, in 64 KiB
/// chunks, left-symmetric (md's default).
fn create(dir: &Path, level: &str, count: usize, size: &str) -> Vec<String> {
    let members: Vec<String> = (0..count).map(|i| format!("m{i}.img")).collect();
    ok(
        &with(
            &[
                "create", "--level", level, "--size", size, "--chunk", "64K", "--force",
            ],
            &members,
        ),
        dir,
    );
    members
}

fn read_all(dir: &Path, members: &[String]) -> Vec<u8> {
    ok_bytes(&with(&["read"], members), dir)
}

/// The restripe the tests ask of a RAID 5/6: 128 KiB chunks,
/// right-asymmetric.
const TO_128K_RA: [&str; 4] = ["--chunk", "128K", "--layout", "right-asymmetric"];

/// `grow --socket` to 128 KiB chunks, right-asymmetric; it waits for the
/// restripe's end (or the server's).
fn restripe_cmd(dir: &Path) -> Child {
    restripe_to(dir, &TO_128K_RA)
}

/// `grow --socket` with `shape` (`--chunk`, `--layout`).
fn restripe_to(dir: &Path, shape: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .args(["grow", "--socket", &control(dir), "--step", "1M"])
        .args(shape)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The array is in the new shape: 128 KiB chunks, right-asymmetric,
/// clean, the same size, parity in agreement.
fn in_the_new_shape(dir: &Path, members: &[String], size: u64) {
    in_shape(dir, members, size, "right-asymmetric")
}

/// The array is clean in 128 KiB chunks and `layout`, of `size`, its
/// parity (or copies) in agreement.
fn in_shape(dir: &Path, members: &[String], size: u64, layout: &str) {
    let d = detail(dir, members);
    assert_eq!(d["state"], "clean", "{d}");
    assert_eq!(d["chunk_bytes"], 128 * 1024, "{d}");
    assert_eq!(d["layout"], layout, "{d}");
    assert_eq!(d["raid_disks"], members.len(), "{d}");
    assert_eq!(d["size_bytes"], size, "{d}");
    assert_checks_clean(dir, members, "after the online restripe");
}

fn restripes_online_while_fio_verifies(level: &str, count: usize) {
    restripes_online_to(level, count, &TO_128K_RA, "right-asymmetric");
}

/// A served RAID `level` of `count` members restriped with `shape` while
/// fio writes and verifies; it ends in 128 KiB chunks and `layout`.
fn restripes_online_to(level: &str, count: usize, shape: &[&str], layout: &str) {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = create(d, level, count, "32M");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let server = serve_with(d, &members, &["--reshape-speed", "12"]);
    let fio = fio_verify_restripe(d, false);
    std::thread::sleep(Duration::from_millis(300));
    let restripe = restripe_to(d, shape);
    let mid = wait_reshape_past(d, 0);
    let r = &mid["array"]["reshape"];
    assert_eq!(r["kind"], "restripe", "{mid}");
    assert_eq!(r["raid_disks"], count, "{mid}");
    assert_eq!(r["raid_disks_before"], count, "{mid}");
    assert_eq!(r["end_bytes"], size, "{mid}");
    assert!(r["bytes_per_sec"].as_u64().unwrap() > 0, "{mid}");
    assert!(r["eta_seconds"].as_u64().is_some(), "{mid}");
    // The text status shows it too.
    let text = ok(&["status", "--socket", &control(d)], d);
    assert!(text.contains("reshape: restripe running"), "{text}");
    // The members record md's chunk and layout change mid-way.
    let sb = &serde_json::from_str::<serde_json::Value>(&ok(&["examine", "--json", "m0.img"], d))
        .unwrap()[0]["superblock"];
    assert_ne!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{sb}");
    assert_eq!(sb["new_chunk"], 256, "{sb}");
    assert_eq!(sb["delta_disks"], 0, "{sb}");
    let out = restripe.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "grow --socket --chunk: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("restriped online"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    fio_done(fio);
    server.interrupt();
    in_shape(d, &members, size, layout);
    // Served again in the new shape: fio finds every block it wrote.
    let server = serve(d, &members);
    fio_done(fio_verify_restripe(d, true));
    server.interrupt();
}

#[test]
fn fio_verifies_through_nbd_while_a_served_raid5_is_restriped_to_128k_right_asymmetric() {
    restripes_online_while_fio_verifies("5", 4);
}

#[test]
fn fio_verifies_through_nbd_while_a_served_raid6_is_restriped_to_128k_right_asymmetric() {
    restripes_online_while_fio_verifies("6", 5);
}

#[test]
fn fio_verifies_through_nbd_while_a_served_raid10_near_is_restriped_to_128k_chunks() {
    restripes_online_to("10", 4, &["--chunk", "128K"], "near=2");
}

/// A byte pattern the array is filled with first.
fn fill(dir: &Path, members: &[String], size: u64) -> Vec<u8> {
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 ^ 0x3c).collect();
    std::fs::write(dir.join("data.bin"), &data).unwrap();
    ok(&with(&["write", "--input", "data.bin"], members), dir);
    std::fs::remove_file(dir.join("data.bin")).unwrap();
    data
}

fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    assert_eq!(got.len(), want.len());
    (0..got.len() / 4096).find(|&b| got[b * 4096..(b + 1) * 4096] != want[b * 4096..(b + 1) * 4096])
}

#[test]
fn a_server_killed_mid_online_restripe_is_served_again_with_every_acknowledged_write() {
    // The served RAID 5 restripes slowly; qemu-io writes blocks on both
    // sides of the position, then the server is killed with SIGKILL (the
    // array dirty). Served again, the restripe is finished before the
    // array is served, then resynced; every acknowledged write reads back,
    // in the new chunk and layout, parity in agreement.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = create(d, "5", 4, "24M");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let mut want = fill(d, &members, size);
    let mut server = serve_with(d, &members, &["--reshape-speed", "3"]);
    let restripe = restripe_cmd(d);
    let mid = wait_reshape_past(d, 0);
    let position = mid["array"]["reshape"]["position_bytes"].as_u64().unwrap();
    write_blocks(d, position, 400, 0x2545_f491, &mut want);
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "running", "{s}");
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = restripe.wait_with_output();
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(log.contains("event=reshape-finishing-offline"), "{log}");
    wait_resynced(d);
    server.interrupt();
    let got = read_all(d, &members);
    assert_eq!(
        first_difference(&got, &want),
        None,
        "a block lost an acknowledged write across the kill"
    );
    in_the_new_shape(d, &members, size);
}

#[test]
fn a_restripe_stopped_with_the_server_goes_on_online_when_served_again() {
    // The server is stopped (SIGINT) mid-restripe: the array is clean,
    // the members record the position. Served again, the restripe goes
    // on from there while served (status shows it running, the log says
    // where it resumed) and qemu-io's writes on both sides of the
    // position read back once it has finished.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = create(d, "5", 4, "24M");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let mut want = fill(d, &members, size);
    let server = serve_with(d, &members, &["--reshape-speed", "3"]);
    let restripe = restripe_cmd(d);
    wait_reshape_past(d, 2 * MIB);
    server.interrupt();
    let _ = restripe.wait_with_output();
    let sb = &serde_json::from_str::<serde_json::Value>(&ok(&["examine", "--json", "m1.img"], d))
        .unwrap()[0]["superblock"];
    let recorded = sb["reshape_position"].as_u64().unwrap() * 512;
    assert!(recorded > 0 && recorded < size, "{sb}");
    let server = serve_with(d, &members, &["--reshape-speed", "3"]);
    let log = serve_log(d);
    assert!(
        log.contains(&format!("event=reshape-resumed position={recorded}")),
        "{log}"
    );
    let mid = wait_reshape_past(d, recorded);
    assert_eq!(mid["array"]["reshape"]["kind"], "restripe", "{mid}");
    let position = mid["array"]["reshape"]["position_bytes"].as_u64().unwrap();
    write_blocks(d, position, 400, 0x2545_f491, &mut want);
    wait_reshape_finished(d);
    server.interrupt();
    let got = read_all(d, &members);
    assert_eq!(
        first_difference(&got, &want),
        None,
        "a block differs after the resumed restripe"
    );
    in_the_new_shape(d, &members, size);
}

#[test]
fn serve_goes_on_with_the_kernels_forwards_chunk_change_and_finishes_it() {
    // The kernel's RAID 5 of 4, 64 -> 128 KiB chunks, the offset moved
    // down, stopped at 9 MiB of 45 (tests/fixtures/md-states): served, the
    // restripe goes on from the kernel's position and finishes; the array
    // then reads the kernel's bytes in 128 KiB chunks, parity clean.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let states = repo().join("tests/fixtures/md-states/reshape_r5_chunk_down");
    let mut members = Vec::new();
    for disk in 0..4 {
        let out = Command::new("xz")
            .arg("-dc")
            .arg(states.join(format!("disk{disk}.img.xz")))
            .output()
            .expect("xz (apt-get install xz-utils)");
        assert!(out.status.success());
        let name = format!("k{disk}.img");
        std::fs::write(d.join(&name), out.stdout).unwrap();
        members.push(name);
    }
    let kernel_sha = std::fs::read_to_string(states.join("kernel-sha256.txt"))
        .unwrap()
        .trim()
        .to_string();
    let server = serve(d, &members);
    let log = serve_log(d);
    assert!(
        log.contains(&format!("event=reshape-resumed position={}", 9 * MIB)),
        "{log}"
    );
    let done = wait_reshape_finished(d);
    assert_eq!(done["array"]["reshape"]["kind"], "restripe", "{done}");
    server.interrupt();
    let d2 = detail(d, &members);
    assert_eq!(d2["state"], "clean", "{d2}");
    assert_eq!(d2["chunk_bytes"], 128 * 1024, "{d2}");
    assert_eq!(sha(&read_all(d, &members)), kernel_sha);
    assert_checks_clean(d, &members, "after serve finished the kernel's restripe");
}

#[test]
fn restripes_a_served_array_cannot_take_are_refused_by_name_and_change_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The members' bytes (the server's log may grow).
    let images = |d: &Path| -> Vec<(PathBuf, String)> {
        hash_files(d)
            .into_iter()
            .filter(|(p, _)| p.extension().is_some_and(|e| e == "img"))
            .collect()
    };
    let refused_online = |d: &Path, args: &[&str], needles: &[&str]| {
        // The server's own writes as it comes up (its first superblock
        // update) settle first.
        let mut before = images(d);
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = images(d);
            if now == before {
                break;
            }
            before = now;
        }
        let mut all = vec!["grow", "--socket"];
        let ctl = control(d);
        all.push(&ctl);
        all.extend_from_slice(args);
        let text = refusal(&all, d);
        for needle in needles {
            assert!(text.contains(needle), "{needle:?} not in: {text}");
        }
        assert!(!before.is_empty());
        assert_eq!(before, images(d), "a refused restripe changed a byte");
        said_once(&text);
    };
    // No room below the data: 1 MiB chunks, 17 MiB files of which 15 are
    // used; the room is after the data only (the offline restripe moves
    // the offset up there; served, it runs forwards only).
    let members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    for m in &members {
        std::fs::File::create(d.join(m))
            .unwrap()
            .set_len(17 * MIB)
            .unwrap();
    }
    ok(
        &with(
            &[
                "create", "--level", "5", "--chunk", "1M", "--size", "15M", "--force",
            ],
            &members,
        ),
        d,
    );
    let server = serve(d, &members);
    refused_online(
        d,
        &["--chunk", "512K"],
        &[
            "free before the data",
            "larger chunk",
            "nvraid grow --chunk SIZE --layout NAME MEMBERS",
        ],
    );
    // A chunk the members' data is not a whole number of (15 MiB - 1 MiB
    // of metadata = 14 MiB, not a multiple of 4 MiB).
    refused_online(
        d,
        &["--chunk", "4M"],
        &["not a whole number of the new chunks"],
    );
    // A layout md does not give a RAID 5, and nothing to change.
    refused_online(d, &["--layout", "left-symmetric-6"], &["--layout"]);
    refused_online(
        d,
        &["--chunk", "1M", "--layout", "left-symmetric"],
        &["nothing to change"],
    );
    server.interrupt();
    // A served RAID 0 (restriped as md's RAID 4 with its parity missing,
    // `raid0_online.rs`): a layout (md's RAID 0 has none), a chunk md
    // refuses, one the members' 13 MiB of data are not a whole number of,
    // and one (1 MiB) more than the room below the data, which is 1 MiB
    // less the superblock's (it moves forwards only, offline too).
    let sub = d.join("r0");
    std::fs::create_dir(&sub).unwrap();
    let r0 = create(&sub, "0", 4, "14M");
    let server = serve(&sub, &r0);
    refused_online(
        &sub,
        &["--layout", "left-symmetric"],
        &["layout of a raid0", "--chunk"],
    );
    refused_online(&sub, &["--chunk", "96K"], &["--chunk", "power of two"]);
    refused_online(
        &sub,
        &["--chunk", "4M"],
        &["not a whole number of the new chunks"],
    );
    refused_online(
        &sub,
        &["--chunk", "1M"],
        &["free before the data", "larger chunk", "RAID 0's restripe"],
    );
    server.interrupt();
    // A second reshape while one runs: another restripe, and a grow.
    let sub = d.join("second");
    std::fs::create_dir(&sub).unwrap();
    let r5 = create(&sub, "5", 4, "24M");
    std::fs::File::create(sub.join("new.img"))
        .unwrap()
        .set_len(24 * MIB)
        .unwrap();
    let server = serve_with(&sub, &r5, &["--reshape-speed", "1"]);
    let restripe = restripe_cmd(&sub);
    wait_reshape_past(&sub, 0);
    // The running restripe writes its members: only new.img is compared.
    let blank_sha = sha(&std::fs::read(sub.join("new.img")).unwrap());
    let text = refusal(
        &["grow", "--socket", &control(&sub), "--chunk", "256K"],
        &sub,
    );
    assert!(text.contains("second reshape"), "{text}");
    let text = refusal(
        &[
            "grow",
            "--socket",
            &control(&sub),
            "-n",
            "5",
            "--add",
            "new.img",
        ],
        &sub,
    );
    assert!(text.contains("second grow"), "{text}");
    assert_eq!(
        blank_sha,
        sha(&std::fs::read(sub.join("new.img")).unwrap()),
        "a refused grow wrote to the new member"
    );
    let sb =
        &serde_json::from_str::<serde_json::Value>(&ok(&["examine", "--json", "m0.img"], &sub))
            .unwrap()[0]["superblock"];
    assert_eq!(
        sb["new_chunk"], 256,
        "the running restripe's record changed: {sb}"
    );
    server.interrupt();
    let _ = restripe.wait_with_output();
}

/// Data bytes each 15 MiB member holds (1 MiB of metadata before them).
const PER: u64 = 14 * MIB;

/// Two arrays of `level` over four 15 MiB members holding the pattern
/// over `bytes`, each served and restriped with `shape` through the
/// control socket: one to the end (the server then stopped), one killed
/// with SIGKILL part-way (its record at the last recorded position, the
/// array dirty). The kernel's md assembles both and finishes the second;
/// its report line for each.
fn restriped_online_then_by_the_kernel(level: &str, shape: &[&str], bytes: u64) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, kill) in [("done", false), ("killed", true)] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
        ok(
            &with(
                &[
                    "create", "--level", level, "--size", "15M", "--chunk", "64K", "--name", name,
                ],
                &names,
            ),
            &sub,
        );
        std::fs::write(sub.join("data"), pattern(bytes)).unwrap();
        ok(&with(&["write", "--input", "data"], &names), &sub);
        std::fs::remove_file(sub.join("data")).unwrap();
        let speed = if kill { "2" } else { "50" };
        let mut server = serve_with(&sub, &names, &["--reshape-speed", speed]);
        let restripe = restripe_to(&sub, shape);
        if kill {
            wait_reshape_past(&sub, MIB);
            server.kill().unwrap();
            server.wait().unwrap();
            let _ = restripe.wait_with_output();
            let sb =
                &serde_json::from_str::<serde_json::Value>(&ok(&["examine", "--json", "d0"], &sub))
                    .unwrap()[0]["superblock"];
            assert_ne!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{sb}");
        } else {
            let out = restripe.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            server.interrupt();
        }
        images.extend(names.iter().map(|n| sub.join(n)));
    }
    let report = kernel_finishes(&images, bytes);
    let lines: Vec<String> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .map(|l| format!("{l}\n{report}"))
        .collect();
    assert_eq!(lines.len(), 2, "two arrays expected:\n{report}");
    lines
}

#[test]
fn the_kernel_assembles_a_raid5_restriped_online_and_finishes_one_killed_mid_restripe() {
    // md runs both in 128 KiB chunks right-asymmetric (md's layout 1),
    // reads the pattern and finds no parity mismatch.
    for line in restriped_online_then_by_the_kernel("5", &TO_128K_RA, 3 * PER) {
        assert!(
            line.contains("level=raid5")
                && line.contains("layout=1 ")
                && line.contains("chunk=131072")
                && line.contains("disks=4")
                && line.contains(&format!("size={}", 3 * PER))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0"),
            "{line}"
        );
    }
}

#[test]
fn the_kernel_assembles_a_raid10_restriped_online_and_finishes_one_killed_mid_restripe() {
    // md runs both in 128 KiB chunks, near=2 (md's layout 0x102), reads
    // the pattern and finds no copy that differs.
    for line in restriped_online_then_by_the_kernel("10", &["--chunk", "128K"], 2 * PER) {
        assert!(
            line.contains("level=raid10")
                && line.contains("layout=258 ")
                && line.contains("chunk=131072")
                && line.contains("disks=4")
                && line.contains(&format!("size={}", 2 * PER))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0"),
            "{line}"
        );
    }
}

/// fio's verified writes through NBD over a served restripe (or the read
/// pass checking them).
fn fio_verify_restripe(dir: &Path, verify_only: bool) -> Child {
    fio_verify(dir, "restripe", 2000, 11, verify_only)
}
