//! `nvraid serve` going on with reshapes the kernel's md (or nvraid)
//! left part-way that it once refused: the kernel's RAID 10 near grows
//! served and finished while clients read, then assembled by the
//! kernel's md in tools/mdvm with every byte in place and no mismatch.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Serve the kernel's `state` (a RAID 10 near growing, stopped cleanly
/// at `position`) in `d`: the grow goes on from the kernel's position
/// while the old shape's 30 MiB read back as the pattern, and finishes;
/// the array assembled afterwards is `raid_disks` members of `size`
/// bytes, the pattern then zeros, the copies agreeing. Its images.
fn serve_finishes_the_kernels_raid10_grow(
    d: &Path,
    state: &str,
    position: u64,
    raid_disks: u64,
    size: u64,
) -> Vec<PathBuf> {
    let m = md_state(state, d);
    let server = serve_with(d, &m, &["--reshape-speed", "1"]);
    let log = serve_log(d);
    assert!(
        log.contains(&format!(
            "event=reshape-resumed position={position} raid_disks=4->{raid_disks}"
        )),
        "{log}"
    );
    let s = status(d);
    assert_eq!(s["array"]["size_bytes"], 30 << 20, "{s}");
    let got = served_bytes(d);
    assert_eq!(
        status(d)["array"]["reshape"]["state"],
        "running",
        "the grow ended before the read"
    );
    assert!(
        got == pattern(30 << 20),
        "{state}: a byte read wrong mid-grow"
    );
    let s = wait_reshape_finished(d);
    assert_eq!(s["array"]["reshape"]["raid_disks"], raid_disks, "{s}");
    server.interrupt();
    let grown = detail(d, &m);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], raid_disks, "{grown}");
    assert_eq!(grown["size_bytes"], size, "{grown}");
    assert_eq!(grown["data_offset_bytes"], 1920 * 512, "{grown}");
    let all = ok_bytes(&with(&["read"], &m), d);
    assert_eq!(all.len() as u64, size);
    assert!(all[..30 << 20] == pattern(30 << 20)[..], "{state}");
    assert!(
        all[30 << 20..].iter().all(|&b| b == 0),
        "{state}: new space"
    );
    assert_checks_clean(d, &m, state);
    m.iter().map(|name| d.join(name)).collect()
}

#[test]
fn serve_goes_on_with_the_kernels_raid10_grows_and_md_assembles_the_result() {
    // The kernel's RAID 10 near=2 of 4 growing to 5 (no bitmap, stopped
    // at 448 KiB) and to 6 (md's bitmap resized to 8 KiB chunks, stopped
    // at 384 KiB), both stopped cleanly: `serve` refused them, naming
    // `grow --continue`. Now each is served in its old shape while the
    // grow goes on to its end, every byte read back through NBD; the
    // kernel's md then assembles both results (one VM boot), reads the
    // pattern and its check finds no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let (five, six) = (dir.path().join("five"), dir.path().join("six"));
    std::fs::create_dir(&five).unwrap();
    std::fs::create_dir(&six).unwrap();
    let mut images =
        serve_finishes_the_kernels_raid10_grow(&five, "reshape", 448 << 10, 5, 75 << 19);
    images.extend(serve_finishes_the_kernels_raid10_grow(
        &six,
        "reshape_r10_bitmap",
        384 << 10,
        6,
        45 << 20,
    ));
    assert_eq!(
        detail(&six, &md_state_names(&six))["bitmap"]["chunk_bytes"],
        8192
    );
    let report = kernel_finishes(&images, 30 << 20);
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 2, "{report}");
    for (disks, size) in [(5, 75u64 << 19), (6, 45 << 20)] {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("disks={disks} ")))
            .unwrap_or_else(|| panic!("no array of {disks} members:\n{report}"));
        assert!(
            line.contains("level=raid10")
                && line.contains(&format!("size={size} "))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0"),
            "{line}\n{report}"
        );
    }
}

/// The member images in `d`, sorted (what [`md_state`] unpacked there).
fn md_state_names(d: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".img"))
        .collect();
    names.sort();
    names
}
/// Five members of `file_mib` MiB in a RAID 5 (`--size` two MiB less,
/// its default bitmap, resynced), the first `new size` bytes [`pattern`], shrunk
/// offline to four (`grow -n 4 --array-size`, 1 MiB steps) and killed at
/// the failpoint `point`: the members' names and the new size.
fn shrink_killed(d: &Path, file_mib: u64, point: &str) -> (Vec<String>, u64) {
    let m: Vec<String> = (0..5).map(|i| format!("d{i}")).collect();
    for name in &m {
        let f = std::fs::File::create(d.join(name)).unwrap();
        f.set_len(file_mib * MIB).unwrap();
    }
    let size = format!("{}M", file_mib - 2);
    ok(
        &with(&["create", "--level", "5", "--size", &size, "--force"], &m),
        d,
    );
    ok(&with(&["repair"], &m), d);
    let old = detail(d, &m)["size_bytes"].as_u64().unwrap();
    let new_size = old / 4 * 3;
    std::fs::write(d.join("data"), pattern(new_size)).unwrap();
    ok(&with(&["write", "--input", "data"], &m), d);
    std::fs::remove_file(d.join("data")).unwrap();
    let array_size = new_size.to_string();
    killed_at(
        d,
        &with(
            &[
                "grow",
                "-n",
                "4",
                "--array-size",
                &array_size,
                "--step",
                "1M",
            ],
            &m,
        ),
        point,
    );
    let left = detail(d, &m);
    assert_eq!(left["state"], "reshaping", "{left}");
    assert_eq!(left["direction"], "backwards", "{left}");
    (m, new_size)
}

#[test]
fn a_shrink_killed_mid_way_is_served_and_finished_and_md_assembles_the_result() {
    // nvraid's own shrink of a RAID 5 from 5 to 4 members, killed part-way
    // (clean: an offline reshape marks nothing dirty): `serve` refused it,
    // naming `grow --continue`. Now it is served at the new, smaller size
    // from the start while the reshape goes on backwards (the position
    // falling to 0); every byte reads back through NBD while it runs, it
    // finishes, the array assembled afterwards is 4 members with the
    // fifth a spare, the parity checks clean, and the kernel's md
    // assembles it, reads the pattern and finds no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, new_size) = shrink_killed(d, 17, "reshape-superblock:30");
    let recorded = detail(d, &m)["position_bytes"].as_u64().unwrap();
    assert!(recorded > 0 && recorded < new_size, "{recorded}");
    let server = serve_with(d, &m, &["--reshape-speed", "2"]);
    let log = serve_log(d);
    assert!(
        log.contains(&format!(
            "event=reshape-resumed position={recorded} raid_disks=5->4"
        )),
        "{log}"
    );
    let s = status(d);
    assert_eq!(s["array"]["size_bytes"], new_size, "{s}");
    assert_eq!(s["array"]["reshape"]["kind"], "shrink", "{s}");
    let got = served_bytes(d);
    assert_eq!(
        status(d)["array"]["reshape"]["state"],
        "running",
        "the shrink ended before the read"
    );
    assert!(got == pattern(new_size), "a byte read wrong mid-shrink");
    let s = wait_reshape_finished(d);
    assert_eq!(s["array"]["reshape"]["position_bytes"], 0, "{s}");
    assert!(served_bytes(d) == pattern(new_size), "after the shrink");
    server.interrupt();
    let shrunk = detail(d, &m);
    assert_eq!(shrunk["state"], "clean", "{shrunk}");
    assert_eq!(shrunk["raid_disks"], 4, "{shrunk}");
    assert_eq!(shrunk["size_bytes"], new_size, "{shrunk}");
    assert_checks_clean(d, &m[..4], "after the served shrink");
    assert!(read(d, &m[..4], new_size) == pattern(new_size));
    let e = ok(&["examine", "d4"], d);
    assert!(device_role(&e) == "spare", "the leaving member: {e}");
    let images: Vec<PathBuf> = m.iter().map(|name| d.join(name)).collect();
    let report = kernel_finishes(&images, new_size);
    let line = report
        .lines()
        .find(|l| l.starts_with("KERNEL "))
        .unwrap_or_else(|| panic!("the kernel assembled nothing:\n{report}"));
    assert!(
        line.contains("level=raid5")
            && line.contains("disks=4 ")
            && line.contains(&format!("size={new_size} "))
            && line.contains("pattern=ok")
            && line.contains("mismatch=0"),
        "{line}\n{report}"
    );
}

#[test]
fn a_served_shrink_killed_with_the_server_is_finished_and_every_block_fio_wrote_reads_back() {
    // A shrink left part-way is served; fio writes and verifies through
    // NBD while it goes on backwards; the server is killed (SIGKILL, the
    // array dirty) part-way. Served again, the shrink is finished offline
    // before it is served, and fio's verify pass reads every block it
    // wrote; the array is 4 members with its parity right once resynced.
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, new_size) = shrink_killed(d, 33, "reshape-superblock:30");
    let recorded = detail(d, &m)["position_bytes"].as_u64().unwrap();
    let mut server = serve_with(d, &m, &["--reshape-speed", "1"]);
    assert_eq!(status(d)["array"]["size_bytes"], new_size);
    fio_done(fio_verify(d, "shrink", 3000, 7, false));
    wait_reshape_below(d, recorded);
    server.kill().unwrap();
    server.wait().unwrap();
    let left = detail(d, &m);
    assert_eq!(left["state"], "reshaping", "{left}");
    assert!(
        left["position_bytes"].as_u64().unwrap() < recorded,
        "{left}"
    );
    let server = serve(d, &m);
    let log = serve_log(d);
    assert!(log.contains("event=reshape-finishing-offline"), "{log}");
    assert!(
        log.contains("event=reshape-finished raid_disks=5->4"),
        "{log}"
    );
    fio_done(fio_verify(d, "shrink", 3000, 7, true));
    wait_resynced(d);
    server.interrupt();
    let shrunk = detail(d, &m[..4]);
    assert_eq!(shrunk["state"], "clean", "{shrunk}");
    assert_eq!(shrunk["raid_disks"], 4, "{shrunk}");
    assert_checks_clean(d, &m[..4], "after the shrink finished offline");
    // Past fio's 48 MiB the pattern is untouched.
    let all = read(d, &m[..4], new_size);
    assert!(all[48 << 20..] == pattern(new_size)[48 << 20..]);
}

#[test]
fn serve_goes_on_with_the_kernels_backwards_chunk_change_and_md_assembles_the_result() {
    // The kernel's RAID 5 chunk change 64 -> 32 KiB that moved the data
    // offset up (2048 -> 4096 sectors) and so runs backwards, stopped at
    // 27 MiB of 36: `serve` refused it. Now it goes on while served, every
    // byte read back through NBD mid-way, finishes; the array is the
    // kernel's 36 MiB in 32 KiB chunks at the new offset, the parity
    // right, and the kernel's md assembles it with no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = md_state("reshape_r5_chunk_up", d);
    let server = serve_with(d, &m, &["--reshape-speed", "1"]);
    let log = serve_log(d);
    assert!(
        log.contains("event=reshape-resumed position=28311552 raid_disks=4->4"),
        "{log}"
    );
    let s = status(d);
    assert_eq!(s["array"]["size_bytes"], 36 << 20, "{s}");
    assert_eq!(s["array"]["reshape"]["kind"], "restripe", "{s}");
    let got = served_bytes(d);
    assert_eq!(
        status(d)["array"]["reshape"]["state"],
        "running",
        "the restripe ended before the read"
    );
    assert_eq!(sha(&got), md_state_sha("reshape_r5_chunk_up"));
    wait_reshape_finished(d);
    server.interrupt();
    let done = detail(d, &m);
    assert_eq!(done["state"], "clean", "{done}");
    assert_eq!(done["chunk_bytes"], 32 << 10, "{done}");
    assert_eq!(done["data_offset_bytes"], 4096 * 512, "{done}");
    let all = read(d, &m, 36 << 20);
    assert_eq!(sha(&all), md_state_sha("reshape_r5_chunk_up"));
    assert_checks_clean(d, &m, "after the served backwards restripe");
    let whole = ok_bytes(&with(&["read"], &m), d);
    let images: Vec<PathBuf> = m.iter().map(|name| d.join(name)).collect();
    let out = Command::new(repo().join("tools/mdvm/mdvm-check"))
        .arg("--scrub")
        .arg("--expect")
        .arg(sha(&whole))
        .arg("--")
        .args(&images)
        .output()
        .expect("tools/mdvm/mdvm-check (./test.sh installs its tools)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = report
        .lines()
        .find(|l| l.starts_with("MDVM_CHECK "))
        .unwrap_or_else(|| panic!("the kernel assembled nothing:\n{report}"));
    assert!(
        line.contains("level=raid5") && line.contains("mismatch=0"),
        "{line}\n{report}"
    );
}

/// `serve` of an array recording a reshape it does not go on with while
/// serving (`d`, its `members`): the reshape is finished first, said in
/// the log (why, then `raid_disks` from -> to at its end), and then the
/// array is served. The server, and the whole served array.
fn served_after_finishing(d: &Path, members: &[String], raid_disks: &str) -> (Served, Vec<u8>) {
    let server = serve(d, members);
    let log = serve_log(d);
    assert!(
        log.contains("event=reshape-finishing-offline")
            && log.contains("serve does not go on with it while serving")
            && log.contains(&format!("event=reshape-finished raid_disks={raid_disks} ")),
        "{log}"
    );
    let got = served_bytes(d);
    (server, got)
}

#[test]
fn a_kernel_shrink_that_kept_its_data_offset_is_finished_by_serve_before_it_serves() {
    // The kernel's shrink in place (mdadm's backup file, the data offset
    // kept): its steps cannot go on beside clients, so `serve` finishes it
    // first (keeping the rows its first steps overwrite on the leaving
    // member, as `grow --continue` does) and then serves the kernel's
    // bytes, the array left clean with 4 members.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = md_state("reshape_r5_shrink", d);
    let server = serve(d, &m);
    let log = serve_log(d);
    assert!(
        log.contains("event=reshape-finishing-offline")
            && log.contains("backwards")
            && log.contains("event=reshape-finished raid_disks=5->4"),
        "{log}"
    );
    let s = status(d);
    assert_eq!(s["array"]["raid_disks"], 4, "{s}");
    let got = served_bytes(d);
    assert_eq!(got.len(), 36 << 20);
    assert_eq!(sha(&got), md_state_sha("reshape_r5_shrink"));
    server.interrupt();
    let shrunk = detail(d, &m);
    assert_eq!(shrunk["state"], "clean", "{shrunk}");
    assert_eq!(shrunk["raid_disks"], 4, "{shrunk}");
}

#[test]
fn a_served_shrink_stopped_with_the_server_goes_on_from_where_the_server_left_it() {
    // A shrink going on while served is stopped (SIGTERM) part-way: the
    // record the served steps wrote is md's (backwards, the position it
    // reached, the array clean), so served again it goes on from there,
    // not from where the offline shrink was killed, and finishes with
    // every byte in place.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, new_size) = shrink_killed(d, 17, "reshape-superblock:30");
    let recorded = detail(d, &m)["position_bytes"].as_u64().unwrap();
    let server = serve_with(d, &m, &["--reshape-speed", "2"]);
    wait_reshape_below(d, recorded);
    server.interrupt();
    let left = detail(d, &m);
    assert_eq!(left["state"], "reshaping", "{left}");
    assert_eq!(left["direction"], "backwards", "{left}");
    let reached = left["position_bytes"].as_u64().unwrap();
    assert!(reached < recorded && reached > 0, "{left}");
    assert!(read(d, &m, new_size) == pattern(new_size), "mid-way");
    let server = serve(d, &m);
    let log = serve_log(d);
    assert!(
        log.contains(&format!(
            "event=reshape-resumed position={reached} raid_disks=5->4"
        )),
        "{log}"
    );
    wait_reshape_finished(d);
    assert!(served_bytes(d) == pattern(new_size));
    server.interrupt();
    let shrunk = detail(d, &m);
    assert_eq!(shrunk["state"], "clean", "{shrunk}");
    assert_eq!(shrunk["raid_disks"], 4, "{shrunk}");
    assert_checks_clean(d, &m[..4], "after the shrink resumed twice");
}

#[test]
fn reshapes_serve_does_not_go_on_with_while_serving_are_finished_first_and_served() {
    // What `serve` does not go on with beside clients, each finished
    // before the array is served (an array taken down mid-reshape comes
    // back by itself): the kernel's RAID 0 grow (md's RAID 4 with its
    // parity missing), and nvraid's own grow in place (no room to move the
    // data offset: its critical section needs the backup), killed past
    // the section. Each serves every byte afterwards.
    let dir = tempfile::tempdir().unwrap();
    let r0 = dir.path().join("r0");
    std::fs::create_dir(&r0).unwrap();
    let m = md_state("reshape_r0_grow", &r0);
    // A RAID 0 of 3 x 15 MiB grown to 4.
    let (server, got) = served_after_finishing(&r0, &m, "3->4");
    assert_eq!(got.len(), 60 << 20);
    assert_eq!(sha(&got[..45 << 20]), md_state_sha("reshape_r0_grow"));
    server.interrupt();
    let grown = detail(&r0, &m);
    assert_eq!(grown["level"], 0, "{grown}");
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    assert_eq!(grown["state"], "clean", "{grown}");

    let inplace = dir.path().join("inplace");
    std::fs::create_dir(&inplace).unwrap();
    let mut m: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    ok(
        &with(
            &[
                "create", "--level", "5", "--bitmap", "none", "--size", "7M", "--chunk", "1M",
            ],
            &m,
        ),
        &inplace,
    );
    let data = pattern(3 * (6 << 20));
    std::fs::write(inplace.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &m), &inplace);
    std::fs::remove_file(inplace.join("data")).unwrap();
    let new = blank_mib(&inplace, "d4", 12);
    killed_at(
        &inplace,
        &with(&["grow", "-n", "5", "--add", &new, "--step", "4M"], &m),
        "reshape-superblock:25",
    );
    m.push(new);
    assert_eq!(detail(&inplace, &m)["state"], "reshaping");
    let (server, got) = served_after_finishing(&inplace, &m, "4->5");
    assert!(got[..data.len()] == data[..], "the grown array's bytes");
    assert!(got[data.len()..].iter().all(|&b| b == 0), "the new region");
    server.interrupt();
    assert_checks_clean(&inplace, &m, "after serve finished the grow in place");
}
