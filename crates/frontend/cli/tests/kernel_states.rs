//! Arrays the real kernel md left in unusual states (tests/fixtures/md-states,
//! made by its `make` script in the tools/mdvm VM): nvraid either reads
//! exactly what the kernel reads, or refuses with a message that names the
//! state. And after nvraid writes to a degraded array, the kernel assembles
//! it and reads nvraid's data, not the stale copy.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn states_dir() -> PathBuf {
    repo().join("tests/fixtures/md-states")
}

/// Decompress a state's members into `dir`; their file names, by disk.
fn unpack(state: &str, dir: &Path) -> Vec<String> {
    let src = states_dir().join(state);
    let mut names = Vec::new();
    for disk in 0.. {
        let xz = src.join(format!("disk{disk}.img.xz"));
        if !xz.exists() {
            break;
        }
        let name = format!("{state}-{disk}.img");
        let out = Command::new("xz")
            .arg("-dc")
            .arg(&xz)
            .output()
            .expect("xz (apt-get install xz-utils)");
        assert!(out.status.success(), "xz -dc {}", xz.display());
        std::fs::write(dir.join(&name), out.stdout).unwrap();
        names.push(name);
    }
    assert!(!names.is_empty(), "no members in {}", src.display());
    names
}

fn kernel_sha(state: &str) -> String {
    std::fs::read_to_string(states_dir().join(state).join("kernel-sha256.txt"))
        .unwrap()
        .trim()
        .to_string()
}

/// The whole array as nvraid reads it.
fn read_all(dir: &Path, members: &[String]) -> Vec<u8> {
    let mut args = vec!["read"];
    args.extend(members.iter().map(String::as_str));
    ok_bytes(&args, dir)
}

fn detail(dir: &Path, members: &[String]) -> serde_json::Value {
    let mut args = vec!["detail", "--json"];
    args.extend(members.iter().map(String::as_str));
    serde_json::from_slice(&ok_bytes(&args, dir)).unwrap()
}

fn member<'a>(detail: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    detail["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == path)
        .unwrap_or_else(|| panic!("{path} not in {detail}"))
}

#[test]
fn a_spare_given_with_the_array_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("spare", dir.path());
    assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("spare"));
    let d = detail(dir.path(), &m);
    assert_eq!(member(&d, &m[2])["state"], "spare");
    assert_eq!(d["state"], "clean");
}

#[test]
fn a_member_being_recovered_is_read_only_below_its_recovery_offset() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("recovering", dir.path());
    let d = detail(dir.path(), &m);
    let in_sync = member(&d, &m[1])["in_sync_bytes"]
        .as_u64()
        .expect("in_sync_bytes");
    assert!(in_sync > 0 && in_sync < 8 << 20, "{in_sync}");
    // md's `spare rebuilding`: not `active` until the recovery ends.
    assert_eq!(member(&d, &m[1])["state"], "rebuilding", "{d}");
    // Above the offset the member holds zeros; every byte must still be right.
    for _ in 0..3 {
        assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("recovering"));
    }
    // Alone, the recovering member serves what it has and refuses the rest.
    let alone = [m[1].clone()];
    let below = ok_bytes(&["read", "--length", "64K", &alone[0]], dir.path());
    assert_eq!(below, read_all(dir.path(), &m)[..64 << 10]);
    let above = in_sync.to_string();
    let err = refusal(
        &["read", "--offset", &above, "--length", "4K", &alone[0]],
        dir.path(),
    );
    assert!(err.contains("no readable copy"), "{err}");
}

#[test]
fn bad_blocks_are_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("badblocks", dir.path());
    let d = detail(dir.path(), &m);
    // The make script marked device sectors 4096+512 on disk 0 and
    // 8192+1024 on disk 1 and overwrote them; data starts at sector 2048.
    let bad0 = member(&d, &m[0])["bad_ranges"].clone();
    assert_eq!(bad0, serde_json::json!([[2048 * 512, 2560 * 512]]));
    assert!(!member(&d, &m[1])["bad_ranges"]
        .as_array()
        .unwrap()
        .is_empty());
    for _ in 0..3 {
        assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("badblocks"));
    }
    // Member 0 alone has no good copy of its bad range: EIO-like refusal.
    let err = refusal(
        &["read", "--offset", "1M", "--length", "4K", &m[0]],
        dir.path(),
    );
    assert!(err.contains("no readable copy"), "{err}");
}

#[test]
fn a_dirty_mirror_is_read_from_its_first_copy() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("dirty", dir.path());
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "active");
    // The kernel's resync had reached 1152 KiB (2304 sectors, 6.4%) when
    // the array stopped.
    assert_eq!(d["resync_from_bytes"], 2304 * 512, "{d}");
    // The copies differ at 8 MiB; md reads (and resyncs from) the first.
    for _ in 0..3 {
        assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("dirty"));
    }
}

#[test]
fn halves_that_ran_apart_are_refused_and_each_half_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("splitbrain", dir.path());
    let err = refusal(&["detail", &m[0], &m[1]], dir.path());
    assert!(err.contains("split brain"), "{err}");
    assert!(err.contains(&m[0]) && err.contains(&m[1]), "{err}");
    let err = refusal(&["read", "--length", "4K", &m[1], &m[0]], dir.path());
    assert!(err.contains("split brain"), "{err}");
    for (member, text) in [(&m[0], b"half A"), (&m[1], b"half B")] {
        let head = ok_bytes(&["read", "--length", "4K", member], dir.path());
        assert_eq!(&head[..6], text, "{member}");
    }
}

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

/// The first block where `got` and the pattern differ (`None`: none).
fn first_wrong_block(got: &[u8]) -> Option<usize> {
    let want = pattern(got.len() as u64);
    (0..got.len() / 4096).find(|&b| got[b * 4096..(b + 1) * 4096] != want[b * 4096..(b + 1) * 4096])
}

#[test]
fn a_reshape_in_progress_refuses_writes_by_name() {
    // nvraid reads an array the kernel left mid-reshape, but `write` to it
    // stays refused (and nothing is written) until the reshape is finished
    // (`serve` goes on with a grow: grow_resume.rs).
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("reshape", dir.path());
    std::fs::write(dir.path().join("in"), vec![7u8; 4096]).unwrap();
    let mut args = vec!["write", "--input", "in"];
    args.extend(m.iter().map(String::as_str));
    refused(
        &args,
        dir.path(),
        &["RESHAPE_ACTIVE", "reshape is in progress"],
    );
}

#[test]
fn a_raid10_the_kernel_left_mid_reshape_reads_every_byte() {
    // raid10 near=2 growing from 4 to 5 members, stopped at 448 KiB with
    // the data offset moving down (NEW_OFFSET): below the position the
    // bytes are in the new shape at the new offset, above it in the old.
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("reshape", dir.path());
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "reshaping", "{d}");
    assert_eq!(d["position_bytes"], 448 * 1024, "{d}");
    assert_eq!(d["direction"], "forwards", "{d}");
    assert_eq!(d["old"]["raid_disks"], 4, "{d}");
    assert_eq!(d["new"]["raid_disks"], 5, "{d}");
    // While reshaping, the array is the old shape's 30 MiB, as md gives it.
    assert_eq!(d["size_bytes"], 30 << 20, "{d}");
    assert_eq!(
        member(&d, &m[4])["new_data_offset_bytes"],
        1920 * 512,
        "{d}"
    );
    let got = read_all(dir.path(), &m);
    assert_eq!(got.len(), 30 << 20);
    assert_eq!(first_wrong_block(&got), None);
}

#[test]
fn nvraid_finishes_the_kernels_raid10_grow() {
    // raid10 near=2 growing from 4 to 5 members, left by the kernel at 448
    // KiB with the data offset moving down 64 KiB: `grow --continue` takes
    // the kernel's record as it is and finishes it; the 30 MiB the kernel
    // wrote read back, the new space (to 37.5 MiB) is zeros, the copies
    // agree.
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("reshape", dir.path());
    let mut args = vec!["grow", "--continue", "--step", "1M", "--json"];
    args.extend(m.iter().map(String::as_str));
    let grown: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_eq!(grown["size_bytes"], 75 << 19, "{grown}");
    assert_eq!(grown["data_offset_bytes"], 1920 * 512, "{grown}");
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "clean", "{d}");
    let got = read_all(dir.path(), &m);
    assert_eq!(got.len(), 75 << 19);
    assert_eq!(first_wrong_block(&got[..30 << 20]), None);
    assert!(
        got[30 << 20..].iter().all(|&b| b == 0),
        "the new space is not zeros"
    );
    let mut args = vec!["check", "--json"];
    args.extend(m.iter().map(String::as_str));
    let check: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
}

#[test]
fn a_raid5_the_kernel_left_mid_grow_reads_every_byte() {
    // raid5 left-symmetric growing from 4 to 5 members, held by the kernel
    // at 12 MiB of the array and stopped there, its data offset moving down
    // 512 sectors: the first 12 MiB are only in the new shape (the old rows
    // under them were overwritten), the rest only in the old.
    let dir = tempfile::tempdir().unwrap();
    let mut m = unpack("reshape_r5_grow", dir.path());
    m.rotate_left(2); // roles decide, not the order given
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "reshaping", "{d}");
    assert_eq!(d["position_bytes"], 12 << 20, "{d}");
    assert_eq!(d["direction"], "forwards", "{d}");
    assert_eq!(d["old"]["level"], "raid5", "{d}");
    assert_eq!(d["old"]["raid_disks"], 4, "{d}");
    assert_eq!(d["new"]["raid_disks"], 5, "{d}");
    assert_eq!(d["size_bytes"], 45 << 20, "{d}");
    for path in &m {
        assert_eq!(member(&d, path)["new_data_offset_bytes"], 1536 * 512, "{d}");
    }
    let got = read_all(dir.path(), &m);
    assert_eq!(first_wrong_block(&got), None);
    // What the kernel reads of those 45 MiB once it has finished the reshape.
    assert_eq!(sha(&got), kernel_sha("reshape_r5_grow"));
    // A read across the position, not from its start.
    let part = ok_bytes(
        &[
            &["read", "--offset", "12580864", "--length", "8192"][..],
            &m.iter().map(String::as_str).collect::<Vec<_>>()[..],
        ]
        .concat(),
        dir.path(),
    );
    assert_eq!(part, got[12580864..12580864 + 8192]);
}

#[test]
fn nvraid_finishes_a_raid5_grow_the_kernel_left_mid_way() {
    // `grow --continue` takes the kernel's record (12 MiB, data offset
    // moving 2048 -> 1536 sectors) and finishes the reshape: the kernel's
    // 45 MiB come back, the parity checks clean, and the kernel's md then
    // assembles the 5-member array nvraid finished and reads it.
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("reshape_r5_grow", dir.path());
    let mut args = vec!["grow", "--continue", "--json"];
    args.extend(m.iter().map(String::as_str));
    let grown: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(grown["raid_disks"], 5, "{grown}");
    assert_eq!(grown["size_bytes"], 60 << 20, "{grown}");
    assert_eq!(grown["data_offset_bytes"], 1536 * 512, "{grown}");
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "clean", "{d}");
    let all = read_all(dir.path(), &m);
    assert_eq!(all.len(), 60 << 20);
    assert_eq!(sha(&all[..45 << 20]), kernel_sha("reshape_r5_grow"));
    assert!(
        all[45 << 20..].iter().all(|&b| b == 0),
        "the grown space is not zeros"
    );
    let mut args = vec!["check"];
    args.extend(m.iter().map(String::as_str));
    ok(&args, dir.path());
    let images: Vec<PathBuf> = m.iter().map(|name| dir.path().join(name)).collect();
    kernel_reads(&images, &[sha(&all)]);
}

#[test]
fn nvraid_serves_a_raid5_the_kernel_left_mid_grow_and_finishes_the_grow_while_serving_it() {
    // The kernel's RAID 5 growing from 4 to 5 members, stopped cleanly at
    // 12 MiB: `nvraid serve` goes on with the grow from there while it
    // serves the array in its old shape (45 MiB), every byte of which
    // reads through NBD as the pattern while the grow runs; the grow
    // finishes; the array is then the kernel's 60 MiB of 5 members, and
    // the kernel's md assembles it, reads it and its check finds no
    // parity mismatch (one VM boot).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = unpack("reshape_r5_grow", d);
    let ctl = d.join("md.ctl").display().to_string();
    let status = || -> serde_json::Value {
        serde_json::from_str(&ok(&["status", "--json", "--socket", &ctl], d)).unwrap()
    };
    let server = serve_with(d, &m, &["--reshape-speed", "2"]);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains("event=reshape-resumed position=12582912 raid_disks=4->5"),
        "{log}"
    );
    let s = status();
    assert_eq!(s["array"]["size_bytes"], 45 << 20, "{s}");
    let got = common::reshape::served_bytes(d);
    let s = status();
    assert_eq!(
        s["array"]["reshape"]["state"], "running",
        "the grow ended before the read: {s}"
    );
    assert_eq!(got.len(), 45 << 20);
    assert_eq!(first_wrong_block(&got), None);
    assert_eq!(sha(&got), kernel_sha("reshape_r5_grow"));
    let started = std::time::Instant::now();
    while status()["array"]["reshape"]["state"] == "running" {
        assert!(started.elapsed().as_secs() < 300, "the grow did not end");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let s = status();
    assert_eq!(s["array"]["reshape"]["state"], "finished", "{s}");
    server.interrupt();
    let detail = detail(d, &m);
    assert_eq!(detail["state"], "clean", "{detail}");
    assert_eq!(detail["raid_disks"], 5, "{detail}");
    assert_eq!(detail["size_bytes"], 60 << 20, "{detail}");
    assert_eq!(detail["data_offset_bytes"], 1536 * 512, "{detail}");
    let all = read_all(d, &m);
    assert_eq!(sha(&all[..45 << 20]), kernel_sha("reshape_r5_grow"));
    assert!(all[45 << 20..].iter().all(|&b| b == 0), "the grown space");
    assert_checks_clean(d, &m, "after serve finished the kernel's grow");
    let images: Vec<PathBuf> = m.iter().map(|name| d.join(name)).collect();
    let out = Command::new(repo().join("tools/mdvm/mdvm-check"))
        .arg("--scrub")
        .arg("--expect")
        .arg(sha(&all))
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
        line.contains("level=raid5")
            && line.contains("size=62914560")
            && line.contains("mismatch=0"),
        "{line}\n{report}"
    );
}

#[test]
fn nvraid_finishes_the_kernels_raid10_grow_with_a_bitmap() {
    // raid10 near=2 with a bitmap of 4 KiB chunks growing from 4 to 6
    // members, left by the kernel at 384 KiB: md resized the bitmap when
    // the grow started (8 KiB chunks, its header still saying the old 30
    // MiB). nvraid reads every byte mid-way, `grow --continue` finishes
    // it with the bitmap the kernel made (chunk kept, the header's size
    // now the new array's), the pattern reads back, the new space is
    // zeros, the copies agree, and the kernel reads the result.
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("reshape_r10_bitmap", dir.path());
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "reshaping", "{d}");
    assert_eq!(d["position_bytes"], 384 * 1024, "{d}");
    assert_eq!(d["size_bytes"], 30 << 20, "{d}");
    let got = read_all(dir.path(), &m);
    assert_eq!(first_wrong_block(&got), None, "mid-way read");
    assert_eq!(sha(&got), kernel_sha("reshape_r10_bitmap"));
    let mut args = vec!["grow", "--continue", "--step", "1M", "--json"];
    args.extend(m.iter().map(String::as_str));
    let grown: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(grown["raid_disks"], 6, "{grown}");
    let size = grown["size_bytes"].as_u64().unwrap();
    assert_eq!(size, 45 << 20, "{grown}");
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "clean", "{d}");
    assert_eq!(d["bitmap"]["chunk_bytes"], 8192, "{d}");
    assert_eq!(d["bitmap"]["chunks"], size / 8192, "{d}");
    assert_eq!(d["bitmap"]["dirty_chunks"], 0, "{d}");
    let all = read_all(dir.path(), &m);
    assert_eq!(first_wrong_block(&all[..30 << 20]), None);
    assert!(all[30 << 20..].iter().all(|&b| b == 0), "the new space");
    let mut args = vec!["check", "--json"];
    args.extend(m.iter().map(String::as_str));
    let check: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    let images: Vec<PathBuf> = m.iter().map(|name| dir.path().join(name)).collect();
    kernel_reads(&images, &[sha(&all)]);
}

/// A RAID 5 chunk change the kernel left mid-way (`state`: one of the
/// `reshape_r5_chunk_*` fixtures): nvraid reads every byte of it through
/// the mid-reshape map (the kernel's bytes), `grow --continue` finishes it
/// in the new chunk at the new offset, the pattern reads back, the parity
/// checks clean and the kernel's md assembles the result and reads it.
fn nvraid_reads_and_finishes_a_kernel_chunk_change(
    state: &str,
    size: u64,
    position: u64,
    direction: &str,
    chunks: (u64, u64),
    new_offset: u64,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut m = unpack(state, dir.path());
    m.rotate_left(1); // roles decide, not the order given
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "reshaping", "{d}");
    assert_eq!(d["position_bytes"], position, "{d}");
    assert_eq!(d["direction"], direction, "{d}");
    assert_eq!(d["old"]["chunk_bytes"], chunks.0, "{d}");
    assert_eq!(d["new"]["chunk_bytes"], chunks.1, "{d}");
    assert_eq!(d["old"]["raid_disks"], 4, "{d}");
    assert_eq!(d["new"]["raid_disks"], 4, "{d}");
    assert_eq!(d["size_bytes"], size, "{d}");
    for path in &m {
        assert_eq!(member(&d, path)["new_data_offset_bytes"], new_offset, "{d}");
    }
    let got = read_all(dir.path(), &m);
    assert_eq!(got.len() as u64, size);
    assert_eq!(first_wrong_block(&got), None, "mid-way read");
    assert_eq!(sha(&got), kernel_sha(state));
    // A read across the position, not from its start.
    let at = (position - 4096).to_string();
    let part = ok_bytes(
        &[
            &["read", "--offset", at.as_str(), "--length", "8192"][..],
            &m.iter().map(String::as_str).collect::<Vec<_>>()[..],
        ]
        .concat(),
        dir.path(),
    );
    assert_eq!(
        part[..],
        got[(position - 4096) as usize..(position + 4096) as usize]
    );

    let mut args = vec!["grow", "--continue", "--json"];
    args.extend(m.iter().map(String::as_str));
    let grown: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(grown["size_bytes"], size, "{grown}");
    assert_eq!(grown["data_offset_bytes"], new_offset, "{grown}");
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "clean", "{d}");
    assert_eq!(d["chunk_bytes"], chunks.1, "{d}");
    let all = read_all(dir.path(), &m);
    assert_eq!(all.len() as u64, size);
    assert_eq!(first_wrong_block(&all), None, "after --continue");
    assert_eq!(sha(&all), kernel_sha(state));
    let mut args = vec!["check", "--json"];
    args.extend(m.iter().map(String::as_str));
    let check: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    let images: Vec<PathBuf> = m.iter().map(|name| dir.path().join(name)).collect();
    kernel_reads(&images, &[sha(&all)]);
}

#[test]
fn nvraid_reads_and_finishes_the_kernels_chunk_change_moving_the_offset_down() {
    // raid5 of 4, 64 -> 128 KiB chunks; no room after the data, so mdadm
    // moved the offset down (2048 -> 1024 sectors) and the kernel ran
    // forwards; stopped at 9 MiB of the 45 MiB.
    nvraid_reads_and_finishes_a_kernel_chunk_change(
        "reshape_r5_chunk_down",
        45 << 20,
        9 << 20,
        "forwards",
        (64 << 10, 128 << 10),
        1024 * 512,
    );
}

#[test]
fn nvraid_reads_and_finishes_the_kernels_chunk_change_moving_the_offset_up() {
    // raid5 of 4 using 12 MiB of each member, 64 -> 32 KiB chunks; more
    // room after the data than before it, so mdadm moved the offset up
    // (2048 -> 4096 sectors) and the kernel ran backwards from the end;
    // stopped at 27 MiB of the 36 MiB.
    nvraid_reads_and_finishes_a_kernel_chunk_change(
        "reshape_r5_chunk_up",
        36 << 20,
        27 << 20,
        "backwards",
        (64 << 10, 32 << 10),
        4096 * 512,
    );
}

#[test]
fn a_reshape_nvraid_does_not_continue_is_refused_with_nothing_written() {
    // The kernel's RAID 5 shrink without its leaving member: a backwards
    // reshape nvraid does not read around a missing member in, so `grow
    // --continue` names what it found and leaves every member as it was.
    // (Given every member, nvraid finishes it: tests/shrink.rs; its RAID 10
    // grow too: `nvraid_finishes_the_kernels_raid10_grow`.)
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("reshape_r5_shrink", dir.path());
    let mut args = vec!["grow", "--continue"];
    args.extend(m[..4].iter().map(String::as_str));
    refused(
        &args,
        dir.path(),
        &["backwards", "let the kernel finish it"],
    );
}

#[test]
fn a_reshape_serve_does_not_go_on_with_while_serving_is_startable_at_boot() {
    // The kernel's shrink in place (backwards, the data offset kept: its
    // last steps need mdadm's backup file): `serve` goes on beside
    // clients only with a reshape that moved the data offset; this one it
    // finishes before it serves (serve_resume.rs). The boot path's scan
    // calls it complete for that reason, so it is started, not left down.
    // The kernel's RAID 0 grow too (md's RAID 4 whose parity role no
    // member ever held: not a missing role).
    for state in ["reshape_r5_shrink", "reshape_r0_grow"] {
        let dir = tempfile::tempdir().unwrap();
        unpack(state, dir.path());
        let scan: serde_json::Value = serde_json::from_slice(
            &nvraid(&["assemble", "--scan", "--json", "."], dir.path()).stdout,
        )
        .unwrap();
        let array = &scan["arrays"][0];
        assert_eq!(array["status"], "complete", "{state}: {scan}");
        assert_eq!(array["reason"], serde_json::Value::Null, "{state}: {scan}");
    }
}

#[test]
fn a_raid5_the_kernel_left_mid_shrink_reads_every_byte() {
    // raid5 of 5 members (12 MiB used of each) shrinking to 4, backwards
    // (delta_disks -1), stopped half-way at 18 MiB: from there on the bytes
    // are in the new 4-member shape, below it in the old 5-member one, whose
    // fifth member (leaving, past the new member count) is still read.
    let dir = tempfile::tempdir().unwrap();
    let mut m = unpack("reshape_r5_shrink", dir.path());
    m.reverse();
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "reshaping", "{d}");
    assert_eq!(d["direction"], "backwards", "{d}");
    assert_eq!(d["position_bytes"], 18 << 20, "{d}");
    assert_eq!(d["old"]["raid_disks"], 5, "{d}");
    assert_eq!(d["new"]["raid_disks"], 4, "{d}");
    assert_eq!(d["size_bytes"], 36 << 20, "{d}");
    let leaving = member(&d, &m[0]);
    assert_eq!(leaving["role"], 4, "{d}");
    assert_eq!(
        leaving["new_data_offset_bytes"],
        serde_json::Value::Null,
        "{d}"
    );
    let got = read_all(dir.path(), &m);
    assert_eq!(got.len(), 36 << 20);
    assert_eq!(first_wrong_block(&got), None);
    assert_eq!(sha(&got), kernel_sha("reshape_r5_shrink"));
}

#[test]
fn a_raid10_the_kernel_left_mid_shrink_reads_every_byte_and_continue_finishes_it() {
    // raid10 near=2 of 5 members (12 MiB used of each) shrinking to 4,
    // backwards, its data offset moving up 128 sectors, stopped at 39168
    // sectors: from there on the bytes are in the new 4-member shape,
    // below it in the old 5-member one (the leaving fifth member read).
    // `grow --continue` finishes it: the kernel's bytes, the copies equal,
    // the fifth member a spare.
    let dir = tempfile::tempdir().unwrap();
    let mut m = unpack("reshape_r10_shrink", dir.path());
    m.reverse();
    let d = detail(dir.path(), &m);
    assert_eq!(d["state"], "reshaping", "{d}");
    assert_eq!(d["direction"], "backwards", "{d}");
    assert_eq!(d["position_bytes"], 39168 * 512, "{d}");
    assert_eq!(d["old"]["raid_disks"], 5, "{d}");
    assert_eq!(d["new"]["raid_disks"], 4, "{d}");
    assert_eq!(d["size_bytes"], 24 << 20, "{d}");
    let got = read_all(dir.path(), &m);
    assert_eq!(got.len(), 24 << 20);
    assert_eq!(first_wrong_block(&got), None);
    assert_eq!(sha(&got), kernel_sha("reshape_r10_shrink"));
    let mut args = vec!["grow", "--continue", "--step", "1M", "--json"];
    args.extend(m.iter().map(String::as_str));
    let grown: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(grown["raid_disks"], 4, "{grown}");
    assert_eq!(grown["size_bytes"], 24 << 20, "{grown}");
    assert_eq!(grown["data_offset_bytes"], 2176 * 512, "{grown}");
    let four: Vec<String> = m[1..].to_vec();
    let d = detail(dir.path(), &four);
    assert_eq!(d["state"], "clean", "{d}");
    let got = read_all(dir.path(), &four);
    assert_eq!(sha(&got), kernel_sha("reshape_r10_shrink"));
    let mut args = vec!["check", "--json"];
    args.extend(four.iter().map(String::as_str));
    let check: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
}

#[test]
fn a_raid0_over_members_of_unequal_size_reads_every_zone() {
    // md's original and alternate zone layouts place the same array bytes
    // differently on the members; both read back the kernel's bytes.
    for state in ["zones", "zones_alt"] {
        let dir = tempfile::tempdir().unwrap();
        let mut m = unpack(state, dir.path());
        m.reverse(); // roles decide, not the order given
        let d = detail(dir.path(), &m);
        // Members of 16 MiB + 64 KiB, 24 and 32 MiB, less 1 MiB of metadata:
        // zones of 3 x 241 chunks, 2 x 127 chunks and 1 x 128 chunks of 64 KiB.
        assert_eq!(
            d["size_bytes"],
            (3 * 241 + 2 * 127 + 128) * 65536u64,
            "{state}"
        );
        assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha(state), "{state}");
    }
}

#[test]
fn an_internal_bitmap_array_reads_like_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("bitmap", dir.path());
    assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("bitmap"));
}

/// md's bitmaps as the kernel left them: RAID 10 (the bits cover the
/// array's address space), a mirror reset with two chunks' bits set (a dirty
/// array whose resync visits only those chunks), a mirror whose second
/// member left while one chunk was written. nvraid reads what the kernel
/// reads and reports the same dirty chunks.
#[test]
fn kernel_bitmaps_read_and_resync_by_their_bits() {
    let dir = tempfile::tempdir().unwrap();
    let r10 = unpack("bitmap_r10", dir.path());
    assert_eq!(sha(&read_all(dir.path(), &r10)), kernel_sha("bitmap_r10"));
    let d = detail(dir.path(), &r10);
    assert_eq!(
        d["bitmap"],
        serde_json::json!({"chunk_bytes": 1u64 << 20, "chunks": 28, "dirty_chunks": 0, "events_cleared": 1}),
        "{d}"
    );

    let dirty = unpack("bitmap_dirty", dir.path());
    let d = detail(dir.path(), &dirty);
    assert_eq!(d["state"], "active", "{d}");
    assert_eq!(d["bitmap"]["dirty_chunks"], 2, "{d}");
    assert_eq!(
        sha(&read_all(dir.path(), &dirty)),
        kernel_sha("bitmap_dirty")
    );
    let repaired: serde_json::Value = serde_json::from_slice(&ok_bytes(
        &["repair", "--json", &dirty[0], &dirty[1]],
        dir.path(),
    ))
    .unwrap();
    assert_eq!(repaired["resynced"], true, "{repaired}");
    assert_eq!(
        repaired["bytes"],
        2u64 << 20,
        "only the two dirty 1 MiB chunks: {repaired}"
    );
    let d = detail(dir.path(), &dirty);
    assert_eq!(d["state"], "clean", "{d}");
    assert_eq!(d["bitmap"]["dirty_chunks"], 0, "{d}");

    let readd = unpack("bitmap_readd", dir.path());
    let d = detail(dir.path(), &readd);
    assert_eq!(d["bitmap"]["dirty_chunks"], 1, "{d}");
    // md removed it: the freshest role table lists its slot as free.
    assert_eq!(member(&d, &readd[1])["state"], "spare", "{d}");
    assert_eq!(member(&d, &readd[1])["events"], 2, "{d}");
    assert_eq!(
        sha(&read_all(dir.path(), &readd)),
        kernel_sha("bitmap_readd")
    );
    // md's re-add: member 1 goes back into role 1 and only the chunk
    // written while it was away (1 MiB) is copied.
    let readded: serde_json::Value = serde_json::from_slice(&ok_bytes(
        &["add", "--json", "--new", &readd[1], &readd[0]],
        dir.path(),
    ))
    .unwrap();
    assert_eq!(readded["outcome"], "re-added", "{readded}");
    assert_eq!(readded["rebuilt"][0]["role"], 1, "{readded}");
    assert_eq!(readded["rebuilt"][0]["bytes"], 1u64 << 20, "{readded}");
    let d = detail(dir.path(), &readd);
    assert_eq!(d["state"], "clean", "{d}");
    assert_eq!(d["bitmap"]["dirty_chunks"], 0, "{d}");
    let check = nvraid(&["check", "--json", &readd[0], &readd[1]], dir.path());
    assert_eq!(
        check.status.code(),
        Some(0),
        "copies agree after the re-add"
    );
    assert_eq!(
        sha(&read_all(dir.path(), &readd)),
        kernel_sha("bitmap_readd")
    );
    let images: Vec<PathBuf> = readd.iter().map(|n| dir.path().join(n)).collect();
    let stdout = kernel_reads(&images, &[kernel_sha("bitmap_readd")]);
    assert!(
        stdout.contains("[2/2] [UU]"),
        "the kernel takes both members as in sync: {stdout}"
    );
}

/// nvraid writes to degraded kernel-made arrays (one member left out, a
/// RAID 1 with a bitmap among them) and across every zone of a multi-zone
/// RAID 0; the kernel then assembles every member it is given and must read
/// nvraid's data: the member that missed the writes is recorded faulty and
/// never trusted again.
#[test]
fn kernel_reads_nvraid_writes_to_a_degraded_array_not_the_stale_copy() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = repo().join("tests/fixtures/md");
    let mut raid1 = Vec::new();
    for disk in 0..2 {
        let name = format!("raid1-{disk}.img");
        let out = Command::new("xz")
            .arg("-dc")
            .arg(fixtures.join(format!("raid1-2d/disk{disk}.img.xz")))
            .output()
            .unwrap();
        std::fs::write(dir.path().join(&name), out.stdout).unwrap();
        raid1.push(name);
    }
    let bitmap = unpack("bitmap", dir.path());
    // A multi-zone RAID 0 in md's alternate layout, written whole by nvraid
    // (no member left out): the kernel must find nvraid's bytes in every zone.
    let zones = unpack("zones_alt", dir.path());
    let mut expected = Vec::new();
    let mut images = Vec::new();
    for (members, leave_out) in [(&raid1, Some(1)), (&bitmap, Some(0)), (&zones, None)] {
        let kept: Vec<String> = members
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != leave_out)
            .map(|(_, m)| m.clone())
            .collect();
        let size = detail(dir.path(), &kept)["size_bytes"].as_u64().unwrap() as usize;
        let len = if leave_out.is_some() {
            1 << 20
        } else {
            size - (64 << 10)
        };
        let data: Vec<u8> = (0..len as u32).map(|i| (i % 251) as u8 ^ 0x5a).collect();
        let input = dir.path().join("new.bin");
        std::fs::write(&input, &data).unwrap();
        let mut args = vec![
            "write",
            "--degraded",
            "--offset",
            "64K",
            "--input",
            input.to_str().unwrap(),
        ];
        args.extend(kept.iter().map(String::as_str));
        ok_bytes(&args, dir.path());
        if let Some(left) = leave_out {
            // The left-out member is now faulty in the survivors' eyes.
            let d = detail(dir.path(), members);
            assert_eq!(member(&d, &members[left])["state"], "faulty", "{d}");
        }
        if members == &bitmap {
            // nvraid maintains md's bitmap: on the written member it is
            // not stale, it is as new as the superblock, and the written
            // region's bit (one 64 MiB chunk covers this array) stays set:
            // the array is degraded, so nothing is cleared (the member left
            // out needs it to come back).
            let image = std::fs::read(dir.path().join(&kept[0])).unwrap();
            let header = &image[8192..8192 + 256];
            assert_eq!(&header[..4], b"bitm");
            assert_eq!(
                u32::from_le_bytes(header[48..52].try_into().unwrap()) & 2,
                0
            );
            let events = u64::from_le_bytes(header[24..32].try_into().unwrap());
            let sb_events = u64::from_le_bytes(image[4096 + 200..4096 + 208].try_into().unwrap());
            assert_eq!(events, sb_events);
            assert_eq!(image[8192 + 256] & 1, 1, "the written chunk's bit");
        }
        let whole = read_all(dir.path(), &kept);
        assert_eq!(&whole[64 << 10..(64 << 10) + data.len()], &data[..]);
        expected.push(sha(&whole));
        images.extend(members.iter().map(|m| dir.path().join(m)));
    }
    let stdout = kernel_reads(&images, &expected);
    let arrays = stdout
        .lines()
        .filter(|l| l.starts_with("MDVM_CHECK md="))
        .count();
    assert_eq!(arrays, 3, "{stdout}");
}

/// `check` finds exactly the sectors where the dirty mirror's copies
/// differ; `repair` resyncs it from the first copy (md's source) and records
/// it clean; the kernel then assembles it clean and reads the same bytes.
#[test]
fn check_finds_and_repair_resyncs_a_dirty_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("dirty", dir.path());
    let out = nvraid(&["check", "--json", &m[0], &m[1]], dir.path());
    assert_eq!(out.status.code(), Some(5), "mismatches found: exit 5");
    let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The make script overwrote member 1 in 1 MiB at 8 MiB of the array.
    assert_eq!(found["mismatch_sectors"], 2048, "{found}");
    assert_eq!(
        found["regions"],
        serde_json::json!([[8u64 << 20, 9u64 << 20]])
    );
    let repaired: serde_json::Value =
        serde_json::from_slice(&ok_bytes(&["repair", "--json", &m[0], &m[1]], dir.path())).unwrap();
    assert_eq!(repaired["resynced"], true, "{repaired}");
    assert_eq!(repaired["repaired_sectors"], 2048, "{repaired}");
    let again = nvraid(&["check", "--json", &m[1], &m[0]], dir.path());
    assert_eq!(again.status.code(), Some(0));
    let clean = detail(dir.path(), &m);
    assert_eq!(clean["state"], "clean");
    assert!(clean["resync_from_bytes"].is_null(), "{clean}");
    assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("dirty"));
    let images: Vec<PathBuf> = m.iter().map(|n| dir.path().join(n)).collect();
    let stdout = kernel_reads(&images, &[kernel_sha("dirty")]);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("MDVM_CHECK md=") && l.contains("state=clean")),
        "the kernel should find the array clean: {stdout}"
    );
}

/// md's RAID 10 far (f2) and offset (o2) layouts, odd and even member
/// counts: nvraid reads the kernel's bytes, every second copy sits where
/// nvraid's map says (`check` finds no copy that differs), and with any one
/// member left out the other copies give the same bytes.
#[test]
fn raid10_far_and_offset_layouts_read_like_the_kernel() {
    for state in [
        "raid10_f2_4d",
        "raid10_f2_3d",
        "raid10_o2_4d",
        "raid10_o2_3d",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let m = unpack(state, dir.path());
        let layout = if state.contains("_f2_") {
            "far=2"
        } else {
            "offset=2"
        };
        assert_eq!(detail(dir.path(), &m)["layout"], layout, "{state}");
        assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha(state), "{state}");
        let mut check = vec!["check"];
        check.extend(m.iter().map(String::as_str));
        assert_eq!(
            nvraid(&check, dir.path()).status.code(),
            Some(0),
            "{state}: copies differ"
        );
        for gone in 0..m.len() {
            let rest: Vec<String> = m
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != gone)
                .map(|(_, n)| n.clone())
                .collect();
            assert_eq!(
                sha(&read_all(dir.path(), &rest)),
                kernel_sha(state),
                "{state} without member {gone}"
            );
        }
    }
}

/// md's RAID 5 and RAID 6 arrays, every layout family, 3 to 6 members:
/// nvraid reads exactly what the kernel reads (in any member order, with
/// `read`, and served read-only over NBD), `detail` names the level and
/// md's layout. With one member (RAID 6: two) left out, the missing chunks
/// are rebuilt from parity and the bytes are still the kernel's. nvraid's
/// write to the kernel's array updates its parity: the bytes come back
/// with members left out.
#[test]
fn raid5_and_raid6_arrays_read_like_the_kernel() {
    let states = [
        ("raid5_ls_4d", "left-symmetric"),
        ("raid5_la_3d", "left-asymmetric"),
        ("raid5_rs_5d", "right-symmetric"),
        ("raid5_ra_4d", "right-asymmetric"),
        ("raid5_pf_4d", "parity-first"),
        ("raid5_pl_3d", "parity-last"),
        ("raid6_ls_5d", "left-symmetric"),
        ("raid6_la_4d", "left-asymmetric"),
        ("raid6_rs_6d", "right-symmetric"),
        ("raid6_ra_5d", "right-asymmetric"),
    ];
    for (state, layout) in states {
        let dir = tempfile::tempdir().unwrap();
        let mut m = unpack(state, dir.path());
        m.reverse();
        assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha(state), "{state}");
        let d = detail(dir.path(), &m);
        assert_eq!(
            d["level"],
            if state.starts_with("raid5") { 5 } else { 6 },
            "{d}"
        );
        assert_eq!(d["layout"], layout, "{d}");
        assert_eq!(d["state"], "clean", "{d}");
        // Degraded: as many members left out as the stripe has parity
        // chunks; every missing chunk is rebuilt from parity, and the bytes
        // are still the kernel's.
        let mut kept: Vec<String> = unpack(state, dir.path());
        kept.remove(1);
        if state.starts_with("raid6") {
            kept.remove(kept.len() - 1);
        }
        assert_eq!(
            sha(&read_all(dir.path(), &kept)),
            kernel_sha(state),
            "{state} degraded"
        );
        let d = detail(dir.path(), &kept);
        assert!(d["state"].as_str().unwrap().contains("degraded"), "{d}");
        if matches!(state, "raid5_ls_4d" | "raid6_la_4d") {
            // Served read-only over NBD (the fast path): the same bytes.
            let mut server = serve_with(dir.path(), &m, &["--read-only"]);
            let uri = format!(
                "nbd+unix:///?socket={}",
                dir.path().join("md.sock").display()
            );
            let out = Command::new(tool("nbdcopy"))
                .args([uri.as_str(), "-"])
                .output()
                .unwrap();
            let _ = Command::new("kill")
                .arg("-INT")
                .arg(server.id().to_string())
                .status();
            assert!(server.wait().unwrap().success(), "{state}: serve exit");
            assert!(out.status.success(), "{state}: nbdcopy");
            assert_eq!(sha(&out.stdout), kernel_sha(state), "{state} through NBD");
        }
        // A write across two chunks of the kernel's array, then reads with
        // members left out: the new bytes come back from parity.
        let m = unpack(state, dir.path());
        let data: Vec<u8> = (0..96 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("x.bin"), &data).unwrap();
        let mut write = vec!["write", "--input", "x.bin", "--offset", "40960"];
        write.extend(m.iter().map(String::as_str));
        ok(&write, dir.path());
        for gone in 0..m.len() {
            let mut kept = m.clone();
            kept.remove(gone);
            let mut read = vec!["read", "--offset", "40960", "--length", "98304"];
            read.extend(kept.iter().map(String::as_str));
            let back = ok_bytes(&read, dir.path());
            assert!(back == data, "{state}: written bytes without member {gone}");
        }
    }
}

/// A RAID 5 with md's partial parity log, reset by the kernel in the middle
/// of partial-stripe writes (its logs hold entries): nvraid, assembling it
/// writable, replays the newest log write of every member, after which
/// every stripe's parity matches its data (`repair` finds nothing to fix)
/// and the array reads as the kernel reads it after its own recovery, with
/// any one member left out.
#[test]
fn the_kernels_partial_parity_log_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("ppl", dir.path());
    // Spoil the parity of every logged row: only the replay (partial
    // parity XOR the written blocks) can put it back.
    let spoiled: usize = m
        .iter()
        .map(|name| spoil_logged_parity(&dir.path().join(name)))
        .sum();
    assert!(spoiled > 0, "the fixture's logs hold entries");
    let mut repair = vec!["repair", "--json"];
    repair.extend(m.iter().map(String::as_str));
    let out = nvraid(&repair, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("replayed") && stderr.contains("partial parity log entries"),
        "{stderr}"
    );
    let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(found["mismatch_sectors"], 0, "{found}");
    assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("ppl"));
    for gone in 0..m.len() {
        let mut kept = m.clone();
        kept.remove(gone);
        assert_eq!(
            sha(&read_all(dir.path(), &kept)),
            kernel_sha("ppl"),
            "without member {gone}"
        );
    }
}

/// The fixtures' logged writes: (array block, pattern seed), 4 KiB each.
fn journal_writes() -> Vec<(u64, u64)> {
    let mut w = vec![(3, 0x1111), (40, 0x1111), (70, 0x1111)];
    w.extend((100..124).map(|b| (b, 0x2222)));
    w
}

/// The state's member images and what a command did to them.
fn images(dir: &Path, members: &[String]) -> Vec<Vec<u8>> {
    members
        .iter()
        .map(|m| std::fs::read(dir.join(m)).unwrap())
        .collect()
}

/// The kernel's write journal in write-back mode holds writes the members
/// do not: a read-only assembly says so and reads the members as they are;
/// a writable one without the journal is refused with nothing written; a
/// writable one with it replays the log (data-only stripes through the
/// array, so parity follows), after which the array reads as the kernel
/// reads it after its own recovery, with any one data member left out, the
/// parity checks clean, the log is empty (a second assembly replays
/// nothing), and the kernel assembles the array with its journal and reads
/// the same bytes.
#[test]
fn the_kernels_write_back_journal_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("journal", dir.path());
    let data = &m[..3];
    let before = images(dir.path(), &m);

    let mut args = vec!["read"];
    args.extend(m.iter().map(String::as_str));
    let out = nvraid(&args, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("data for 19 stripes not replayed yet"),
        "{stderr}"
    );
    assert_ne!(
        sha(&out.stdout),
        kernel_sha("journal"),
        "the members alone lack the writes"
    );

    let mut repair_data = vec!["repair", "--json"];
    repair_data.extend(data.iter().map(String::as_str));
    let out = nvraid(&repair_data, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("write journal") && stderr.contains("journal member"),
        "{stderr}"
    );
    assert_eq!(
        images(dir.path(), &m),
        before,
        "a refused command changed a member"
    );

    let mut repair = vec!["repair", "--json"];
    repair.extend(m.iter().map(String::as_str));
    let out = nvraid(&repair, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("replayed the write journal") && stderr.contains("19 data-only stripes"),
        "{stderr}"
    );
    let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(found["mismatch_sectors"], 0, "{found}");
    assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("journal"));
    for gone in 0..3 {
        let mut kept = m.clone();
        kept.remove(gone);
        assert_eq!(
            sha(&read_all(dir.path(), &kept)),
            kernel_sha("journal"),
            "without member {gone}"
        );
    }
    let out = nvraid(&repair_data, dir.path());
    assert!(!out.status.success(), "still refused without the journal");
    let out = nvraid(&repair, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("replayed"),
        "the log was emptied: {stderr}"
    );
    let d = detail(dir.path(), &m);
    assert_eq!(member(&d, &m[3])["state"], "journal", "{d}");

    let images: Vec<PathBuf> = m.iter().map(|n| dir.path().join(n)).collect();
    let stdout = kernel_reads(&images, &[kernel_sha("journal")]);
    assert!(stdout.contains("MDVM_CHECK md="), "{stdout}");
}

/// Write-through mode logs each write with its parity. With the logged
/// rows of every member spoiled, only replaying the log exactly (data and
/// parity pages where they belong) gives the kernel's bytes back with
/// consistent parity.
#[test]
fn the_kernels_write_through_journal_is_replayed_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let m = unpack("journal_wt", dir.path());
    // Spoil every page the log holds for the writes: each written block
    // on its member and its stripe's P (md's left-symmetric layout over 3
    // members, 16 blocks per chunk, two data chunks per row).
    let mut members: Vec<Vec<u8>> = images(dir.path(), &m[..3]);
    let data_offset = 2048 * 512;
    for (block, _) in journal_writes() {
        let (chunk, in_chunk) = (block / 16, block % 16);
        let (row, d) = (chunk / 2, chunk % 2);
        let parity = 2 - row % 3;
        let member = (parity + 1 + d) % 3;
        let at = (data_offset + (row * 16 + in_chunk) * 4096) as usize;
        for disk in [member, parity] {
            members[disk as usize][at..at + 4096].fill(0xee);
        }
    }
    for (name, image) in m.iter().zip(&members) {
        std::fs::write(dir.path().join(name), image).unwrap();
    }
    let mut repair = vec!["repair", "--json"];
    repair.extend(m.iter().map(String::as_str));
    let out = nvraid(&repair, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("replayed the write journal") && stderr.contains("0 data-only"),
        "{stderr}"
    );
    let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(found["mismatch_sectors"], 0, "{found}");
    assert_eq!(sha(&read_all(dir.path(), &m)), kernel_sha("journal_wt"));
}

/// `examine --json`'s role table agrees with mdadm's reading of the same
/// superblocks the kernel wrote: the device role of each member, and the
/// `Array State` mdadm derives from the table (per role of the array, `A`
/// when one device holds it, `R` when two do, `.` when none does).
#[test]
fn examines_role_table_agrees_with_mdadm_on_the_kernels_superblocks() {
    for state in [
        "spare",
        "recovering",
        "bitmap_readd",
        "reshape_r5_shrink",
        "splitbrain",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for name in unpack(state, d) {
            let ours: serde_json::Value =
                serde_json::from_str(&ok(&["examine", "--json", &name], d)).unwrap();
            let ours = &ours[0];
            let table = ours["role_table"].as_array().unwrap();
            let sb = &ours["superblock"];
            let text = mdadm_examine(&d.join(&name));
            let field = |label: &str| examine_field(&text, label);
            // This member's own entry is its device role.
            let own = &table[sb["dev_number"].as_u64().unwrap() as usize];
            let role = match own["role"].as_str().unwrap() {
                "active" => format!("Active device {}", own["slot"]),
                "spare" => "spare".to_string(),
                other => other.to_string(),
            };
            assert_eq!(field("Device Role"), role, "{state} {name}: {ours}");
            // mdadm counts roles up to raid_disks, plus the roles a shrink
            // still has (delta_disks < 0).
            let raid_disks = sb["raid_disks"].as_u64().unwrap() as i64;
            let delta = sb["delta_disks"].as_u64().unwrap() as u32 as i32;
            let reshaping = sb["feature_map"].as_u64().unwrap() & 4 != 0;
            let roles = raid_disks
                + if reshaping && delta < 0 {
                    -i64::from(delta)
                } else {
                    0
                };
            let state_of_roles: String = (0..roles)
                .map(|r| {
                    let held = table
                        .iter()
                        .filter(|e| e["role"] == "active" && e["slot"] == r)
                        .count();
                    match held {
                        0 => '.',
                        1 => 'A',
                        2 => 'R',
                        _ => '?',
                    }
                })
                .collect();
            let array_state = field("Array State");
            assert_eq!(
                array_state.split_whitespace().next().unwrap(),
                state_of_roles,
                "{state} {name}: {ours}"
            );
        }
    }
}
