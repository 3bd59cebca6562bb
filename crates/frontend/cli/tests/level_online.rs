//! `nvraid grow --socket CTL --level N`: md's takeovers that move no byte,
//! made on a served array while fio writes and verifies through NBD
//! (RAID 4 <-> 5 parity-last, RAID 1 of two <-> RAID 5 of two, RAID 6 ->
//! 5 with Q on the last member, RAID 4 without its parity -> 0); the
//! array reassembled in the new level by nvraid and by the kernel's md; a
//! server killed between two members' superblock writes; what is refused,
//! by name, with no member byte changed.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

fn names(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("d{i}")).collect()
}

fn create(dir: &Path, level: &str, layout: Option<&str>, members: &[String], size: &str) {
    let mut args = vec!["create", "--level", level, "--size", size, "--force"];
    if let Some(layout) = layout {
        args.extend(["--layout", layout]);
    }
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

/// md's level number each member's superblock records.
fn md_levels(dir: &Path, members: &[String]) -> Vec<i64> {
    members
        .iter()
        .map(|m| {
            let e: serde_json::Value =
                serde_json::from_str(&ok(&["examine", "--json", m], dir)).unwrap();
            e[0]["superblock"]["level"].as_i64().unwrap()
        })
        .collect()
}

/// fio's verified random writes through the server (two jobs of 12 MiB,
/// paced so that they run for seconds); `verify_only`: read back what an
/// earlier run wrote.
fn fio_verify(dir: &Path, verify_only: bool) -> Child {
    let mut fio = fio_nbd(dir, "level");
    fio.args(FIO_VERIFY_JOB).args([
        "--size=12m",
        "--offset_increment=12m",
        "--rate_iops=1000",
        "--do_verify=1",
        "--randseed=11",
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

fn fio_done(fio: Child, what: &str) {
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: fio failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{what}: {job}");
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 24 * MIB,
        "{what}: fio verified less than it wrote: {job}"
    );
}

/// `grow --socket --level to` on the server in `dir`: its stdout.
fn level_online(dir: &Path, to: &str) -> String {
    ok(&["grow", "--socket", &control(dir), "--level", to], dir)
}

/// Serve `members`, start fio writing and verifying, take the array over
/// as `to` while fio runs, let fio verify every block; then the server
/// stopped, the array reassembled in the new level (`md_level`), checked
/// (no mismatch) and served again with fio reading every block back.
/// The grow's stdout.
fn takes_over_while_fio_verifies(
    dir: &Path,
    served: &[String],
    kept: &[String],
    to: &str,
    md_level: i64,
) -> String {
    let server = serve(dir, served);
    let mut fio = fio_verify(dir, false);
    std::thread::sleep(Duration::from_millis(700));
    let out = level_online(dir, to);
    // fio was still writing: the change happened under its writes.
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio ended before the level changed: {out}"
    );
    // A member the takeover dropped is written no more from here on.
    let leaving: Vec<String> = served
        .iter()
        .filter(|m| !kept.contains(m))
        .cloned()
        .collect();
    let left = hashes(dir, &leaving);
    fio_done(fio, &format!("served through --level {to}"));
    assert_eq!(
        hashes(dir, &leaving),
        left,
        "{leaving:?} written after it left"
    );
    let status: serde_json::Value =
        serde_json::from_str(&ok(&["status", "--json", "--socket", &control(dir)], dir)).unwrap();
    assert_eq!(status["array"]["reshape"]["kind"], "level", "{status}");
    assert_eq!(status["array"]["reshape"]["state"], "finished", "{status}");
    assert_eq!(status["array"]["reshape"]["md_level"], md_level, "{status}");
    // A member the takeover dropped left; it did not fail: no alert, and
    // the array is not degraded by it.
    for m in status["array"]["members"].as_array().unwrap() {
        let left = served.contains(&m["path"].as_str().unwrap_or("").to_string())
            && !kept.contains(&m["path"].as_str().unwrap_or("").to_string());
        if left {
            assert_eq!(m["state"], "left", "{status}");
        }
    }
    assert!(
        !status["array"]["state"]
            .as_str()
            .unwrap()
            .contains("degraded"),
        "{status}"
    );
    server.interrupt();
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    assert!(
        !log.contains("Fail"),
        "a member leaving raised a failure:\n{log}"
    );
    assert!(
        md_levels(dir, kept).iter().all(|&l| l == md_level),
        "--level {to}: {:?}",
        md_levels(dir, kept)
    );
    let after = detail(dir, kept);
    assert_eq!(after["state"], "clean", "{after}");
    assert_eq!(after["raid_disks"], kept.len(), "{after}");
    if md_level != 0 {
        assert_checks_clean(dir, kept, &format!("after --level {to} online"));
    }
    let server = serve(dir, kept);
    fio_done(
        fio_verify(dir, true),
        &format!("served again after --level {to}"),
    );
    server.interrupt();
    out
}

#[test]
fn a_served_raid5_parity_last_becomes_md_raid4_and_back_while_fio_verifies() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names(4);
    // nvraid creates a RAID 4 as md's RAID 5 parity-last; md's level 4
    // is what the takeover makes of it, and back.
    create(d, "4", None, &m, "16M");
    assert_eq!(md_levels(d, &m), vec![5; 4]);
    let out = takes_over_while_fio_verifies(d, &m, &m, "4", 4);
    assert!(
        out.contains("to raid4 (md level 4)") && out.contains("no byte moved"),
        "{out}"
    );
    let out = takes_over_while_fio_verifies(d, &m, &m, "5", 5);
    assert!(out.contains("from raid4 (md level 4) to raid5"), "{out}");
    assert_eq!(detail(d, &m)["layout"], "parity-last", "{}", detail(d, &m));
}

#[test]
fn a_served_raid1_of_two_becomes_a_raid5_of_two_and_back_while_fio_verifies() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names(2);
    create(d, "1", None, &m, "32M");
    let out = takes_over_while_fio_verifies(d, &m, &m, "5", 5);
    assert!(out.contains("from raid1 (md level 1)"), "{out}");
    assert_eq!(detail(d, &m)["chunk_bytes"], 64 * 1024);
    takes_over_while_fio_verifies(d, &m, &m, "1", 1);
}

#[test]
fn a_served_raid6_with_q_last_becomes_a_raid5_and_its_q_member_leaves() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names(5);
    create(d, "6", Some("left-symmetric-6"), &m, "16M");
    let kept: Vec<String> = m[..4].to_vec();
    let out = takes_over_while_fio_verifies(d, &m, &kept, "5", 5);
    assert!(
        out.contains("5 to 4 members") && out.contains("d4 left the array"),
        "{out}"
    );
    assert_eq!(
        detail(d, &kept)["layout"],
        "left-symmetric",
        "{}",
        detail(d, &kept)
    );
    // The Q member keeps the superblock it had (RAID 6, one event behind
    // the others, which call its slot a spare's): no assembly takes it in.
    let q: serde_json::Value = serde_json::from_str(&ok(&["examine", "--json", "d4"], d)).unwrap();
    assert_eq!(q[0]["superblock"]["level"], 6, "{q}");
    let mut all = m.clone();
    all.truncate(5);
    let said = refusal(
        &{
            let mut args = vec!["detail"];
            args.extend(all.iter().map(String::as_str));
            args
        },
        d,
    );
    assert!(said.contains("d4"), "{said}");
}

#[test]
fn a_served_raid4_without_its_parity_member_becomes_a_raid0_while_fio_verifies() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names(4);
    // md's RAID 0 keeps no bitmap: md takes over only a RAID 4 without
    // one (one with it is refused, below).
    let mut args = vec![
        "create", "--level", "4", "--size", "16M", "--bitmap", "none",
    ];
    args.extend(m.iter().map(String::as_str));
    ok(&args, d);
    std::fs::remove_file(d.join("d3")).unwrap();
    let kept: Vec<String> = m[..3].to_vec();
    let out = takes_over_while_fio_verifies(d, &kept, &kept, "0", 0);
    assert!(
        out.contains("to raid0 (md level 0), 4 to 3 members"),
        "{out}"
    );
}

/// Member images' hashes.
fn hashes(dir: &Path, members: &[String]) -> Vec<String> {
    members
        .iter()
        .map(|m| sha(&std::fs::read(dir.join(m)).unwrap()))
        .collect()
}

/// `grow --socket` arguments refused: exit 1, every needle said, no
/// member byte changed.
fn refused_online(dir: &Path, members: &[String], args: &[&str], needles: &[&str]) {
    let before = hashes(dir, members);
    let ctl = control(dir);
    let mut all = vec!["grow", "--socket", ctl.as_str()];
    all.extend(args);
    let said = refusal(&all, dir);
    for needle in needles {
        assert!(said.contains(needle), "{args:?}: {said:?} lacks {needle:?}");
    }
    said_once(&said);
    assert_eq!(hashes(dir, members), before, "{args:?} changed a member");
}

#[test]
fn online_level_changes_md_does_not_make_in_place_are_refused_naming_the_supported_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names(4);
    create(d, "5", None, &m, "8M");
    let server = serve(d, &m);
    // Left-symmetric to RAID 4: md only from parity-last.
    refused_online(d, &m, &["--level", "4"], &["parity-last"]);
    // RAID 5 -> 6 needs a member for Q; RAID 5 -> 0 a RAID 4 without parity.
    refused_online(d, &m, &["--level", "6"], &["--add NEW"]);
    refused_online(d, &m, &["--level", "1"], &["two members"]);
    refused_online(d, &m, &["--level", "5"], &["already is"]);
    // Mirrors are added with a level change to a served RAID 0 only
    // (raid10_online.rs).
    refused_online(
        d,
        &m,
        &["--level", "10", "-n", "8", "--add", "x"],
        &["raid5", "RAID 0 only"],
    );
    // RAID 5 -> 6 with its Q member added is made online (raid0_online.rs);
    // a Q member that is not there is named, nothing written.
    refused_online(d, &m, &["--level", "6", "-n", "5", "--add", "x"], &["x: "]);
    server.interrupt();
}

#[test]
fn an_online_level_change_of_a_degraded_array_is_refused_where_md_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names(4);
    create(d, "4", None, &m, "8M");
    std::fs::rename(d.join("d1"), d.join("away")).unwrap();
    let present = vec!["d0".to_string(), "d2".into(), "d3".into()];
    let server = serve(d, &present);
    // A data member missing: not a RAID 0 (md needs the parity to be the
    // one missing), nor a RAID 5 (md takes over whole arrays only).
    refused_online(
        d,
        &present,
        &["--level", "0"],
        &["role(s) [1]", "parity member (role 3)"],
    );
    refused_online(d, &present, &["--level", "5"], &["degraded"]);
    server.interrupt();
    // The parity member missing, but the array keeps a write-intent
    // bitmap, which md's RAID 0 cannot: refused as md refuses it.
    std::fs::rename(d.join("away"), d.join("d1")).unwrap();
    std::fs::rename(d.join("d3"), d.join("parity")).unwrap();
    let present: Vec<String> = m[..3].to_vec();
    assert!(
        detail(d, &present)["bitmap"].is_object(),
        "{}",
        detail(d, &present)
    );
    let server = serve(d, &present);
    refused_online(
        d,
        &present,
        &["--level", "0"],
        &["write-intent bitmap", "RAID 0"],
    );
    server.interrupt();
}

/// Once an online level change is written the served array takes the
/// new level (`Array::swap_shape`): another reshape follows in the same
/// server run (it was refused until `serve` restarted).
#[test]
fn a_second_reshape_runs_after_an_online_level_change_in_the_same_server_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names(4);
    create(d, "4", None, &m, "8M");
    std::fs::File::create(d.join("new"))
        .unwrap()
        .set_len(16 * MIB)
        .unwrap();
    let server = serve(d, &m);
    // Created as md's RAID 5 parity-last: to md's RAID 4, and back, and
    // to RAID 4 again, then a grow.
    level_online(d, "4");
    level_online(d, "5");
    level_online(d, "4");
    ok(
        &[
            "grow",
            "--socket",
            &control(d),
            "-n",
            "5",
            "--add",
            "new",
            "--step",
            "1M",
        ],
        d,
    );
    let s: serde_json::Value =
        serde_json::from_str(&ok(&["status", "--json", "--socket", &control(d)], d)).unwrap();
    assert_eq!(s["array"]["raid_disks"], 5, "{s}");
    server.interrupt();
    let mut all = m.clone();
    all.push("new".into());
    assert_eq!(md_levels(d, &all), vec![4; 5]);
    assert_checks_clean(d, &all, "after a level change and a grow in one run");
}

/// A server killed between two members' superblock writes of the switch
/// leaves what the offline takeover leaves cut short there: the members
/// written record the new level one event ahead. `grow --level` offline
/// finishes it, and every byte written before reads back.
#[test]
fn a_server_killed_between_the_level_changes_superblock_writes_is_finished_offline() {
    // (level, layout, members, served, --level, md level, kill point)
    for (level, layout, count, served, to, md, kill) in [
        ("4", None, 4, 4, "4", 4, "reshape-superblock:1"),
        ("4", None, 4, 4, "4", 4, "reshape-superblock:3"),
        ("1", None, 2, 2, "5", 5, "reshape-superblock:1"),
        // The last role dropped: the Q member, a missing parity.
        (
            "6",
            Some("left-symmetric-6"),
            5,
            5,
            "5",
            5,
            "reshape-superblock:1",
        ),
        (
            "6",
            Some("left-symmetric-6"),
            5,
            5,
            "5",
            5,
            "reshape-superblock:3",
        ),
        ("4", None, 4, 3, "0", 0, "reshape-superblock:2"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let m = names(count);
        let mut args = vec!["create", "--level", level, "--size", "8M", "--force"];
        if let Some(layout) = layout {
            args.extend(["--layout", layout]);
        }
        if md == 0 {
            args.extend(["--bitmap", "none"]);
        }
        args.extend(m.iter().map(String::as_str));
        ok(&args, d);
        let bytes = detail(d, &m)["size_bytes"].as_u64().unwrap();
        let data: Vec<u8> = (0..bytes).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(d.join("data"), &data).unwrap();
        let mut args = vec!["write", "--input", "data"];
        args.extend(m.iter().map(String::as_str));
        ok(&args, d);
        let served: Vec<String> = m[..served].to_vec();
        for gone in &m[served.len()..] {
            std::fs::remove_file(d.join(gone)).unwrap();
        }
        // The members the new level keeps (a RAID 6's Q member leaves).
        let kept: Vec<String> = if level == "6" {
            m[..count - 1].to_vec()
        } else {
            served.clone()
        };
        let what = format!("{level}->{to} at {kill}");
        let mut server = serve_env(d, &served, &[], &[("NVRAID_FAILPOINT", kill)]);
        let _ = nvraid(&["grow", "--socket", &control(d), "--level", to], d);
        let status = server.wait().unwrap();
        assert!(!status.success(), "{what}: the server lived");
        let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
        assert!(log.contains("failpoint reshape-superblock"), "{log}");
        let levels = md_levels(d, &kept);
        assert!(
            levels.contains(&md) && levels.iter().any(|&l| l != md),
            "{what}: not cut between members: {levels:?}"
        );
        // Run again offline, with every member served (the Q member too):
        // finished, the leaving member named and left as it was.
        let mut args = vec!["grow", "--level", to];
        args.extend(served.iter().map(String::as_str));
        let out = ok(&args, d);
        assert!(out.contains("level changed"), "{what}: {out}");
        if level == "6" {
            assert!(out.contains("d4 left the array"), "{what}: {out}");
            assert_eq!(md_levels(d, &["d4".to_string()]), vec![6], "{what}");
        }
        assert_eq!(md_levels(d, &kept), vec![md; kept.len()], "{what}");
        let after = detail(d, &kept);
        assert_eq!(after["raid_disks"], kept.len(), "{what}: {after}");
        assert!(
            !after["state"].as_str().unwrap().contains("degraded"),
            "{what}: {after}"
        );
        let mut args = vec!["read"];
        args.extend(kept.iter().map(String::as_str));
        let got = ok_bytes(&args, d);
        assert!(got == data, "{what}: the bytes differ");
        if md != 0 {
            assert_checks_clean(d, &kept, &what);
        }
    }
}

/// The kernel's md (tools/mdvm, 6.1) assembles arrays taken over online:
/// each in its new level, holding the pattern written before the change,
/// no parity mismatch.
#[test]
fn the_kernel_assembles_arrays_whose_level_changed_online() {
    let dir = tempfile::tempdir().unwrap();
    let mut images: Vec<PathBuf> = Vec::new();
    let mut expect = Vec::new();
    // (name, create level, layout, members, served, online --level, md level after)
    for (name, level, layout, count, served, to, md) in [
        ("r54", "4", None, 4, 4, "4", "raid4"),
        ("r15", "1", None, 2, 2, "5", "raid5"),
        ("r65", "6", Some("left-symmetric-6"), 5, 5, "5", "raid5"),
        ("r40", "4", None, 4, 3, "0", "raid0"),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let m = names(count);
        let mut args = vec![
            "create", "--level", level, "--size", "8M", "--name", name, "--bitmap", "none",
        ];
        if let Some(layout) = layout {
            args.extend(["--layout", layout]);
        }
        args.extend(m.iter().map(String::as_str));
        ok(&args, &sub);
        let bytes = detail(&sub, &m)["size_bytes"].as_u64().unwrap();
        std::fs::write(sub.join("data"), pattern(bytes)).unwrap();
        let mut args = vec!["write", "--input", "data"];
        args.extend(m.iter().map(String::as_str));
        ok(&args, &sub);
        std::fs::remove_file(sub.join("data")).unwrap();
        let served: Vec<String> = m[..served].to_vec();
        let server = serve(&sub, &served);
        level_online(&sub, to);
        server.interrupt();
        let kept = if md == "raid5" && level == "6" {
            &m[..4]
        } else {
            &served[..]
        };
        images.extend(kept.iter().map(|n| sub.join(n)));
        expect.push((md, kept.len(), bytes));
    }
    let report = kernel_checks(&images, &expect);
    eprintln!("{report}");
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), expect.len(), "{report}");
    for (md, disks, bytes) in &expect {
        assert!(
            lines.iter().any(|l| l.contains(&format!("level={md} "))
                && l.contains(&format!("disks={disks} "))
                && l.contains(&format!("size={bytes} "))
                && l.contains("pattern=ok")
                && l.contains("mismatch=0")),
            "no {md} of {disks} holding the pattern:\n{report}"
        );
    }
}

/// tools/mdvm: assemble every array on `images`, check each (RAID 0 has
/// no check: mismatch 0 stands), verify the pattern over its size.
fn kernel_checks(images: &[PathBuf], _expect: &[(&str, usize, u64)]) -> String {
    let script = images[0]
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("check.sh");
    std::fs::write(
        &script,
        r#"set +e
mdadm --assemble --scan --run 2>&1
cat /proc/mdstat
for sys in /sys/block/md*; do
  md=/dev/${sys##*/}
  level=$(cat $sys/md/level)
  if [ "$level" != raid0 ]; then echo check > $sys/md/sync_action; sleep 1; mdadm --wait $md >/dev/null 2>&1; fi
  size=$(blockdev --getsize64 $md)
  if pattern verify -n $size $md; then pv=ok; else pv=FAILED; fi
  mm=$(cat $sys/md/mismatch_cnt 2>/dev/null || echo 0)
  echo "KERNEL md=$md level=$level disks=$(cat $sys/md/raid_disks) size=$size pattern=$pv mismatch=$mm "
done
"#,
    )
    .unwrap();
    let out = mdvm_on("mdvm", "6.1", &[])
        .arg("--snapshot")
        .arg("--script")
        .arg(&script)
        .args(images)
        .output()
        .expect("tools/mdvm/mdvm (./test.sh installs its tools)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn an_online_level_change_is_refused_with_a_partial_parity_log_or_served_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names(4);
    // A RAID 4 (md's RAID 5 parity-last) keeping md's PPL: md takes no
    // array with one over; nvraid neither.
    let mut args = vec![
        "create",
        "--level",
        "4",
        "--size",
        "8M",
        "--force",
        "--consistency-policy",
        "ppl",
    ];
    args.extend(m.iter().map(String::as_str));
    ok(&args, d);
    let server = serve(d, &m);
    refused_online(d, &m, &["--level", "4"], &["partial parity log"]);
    server.interrupt();
    // Served read-only: nothing may be written.
    let server = serve_with(d, &m, &["--read-only"]);
    refused_online(d, &m, &["--level", "4"], &["read-only"]);
    server.interrupt();
    assert_eq!(md_levels(d, &m), vec![5; 4]);
}

// ---------------------------------------------------------------------
// Level changes with a reshape: a served RAID 1 of two taken over as a
// RAID 5 and grown (`--level 5 -n N --add NEW...`), a served RAID 5 of
// more than two shrunk to two and taken over as a RAID 1 (`--level 1
// --array-size SIZE`).

/// A RAID 1 of two members (the array named as `dir`) of 48 MiB files using 40 MiB each, the pattern written over
/// it; `adds` blank 64 MiB files beside them. The members' names, the new
/// ones after.
fn raid1_of_two_and_new(dir: &Path, adds: usize) -> (Vec<String>, Vec<String>) {
    let m = names(2);
    for name in &m {
        blank_mib(dir, name, 48);
    }
    let name = dir.file_name().unwrap().to_str().unwrap();
    let args = vec![
        "create", "--level", "1", "--size", "40M", "--force", "--name", name,
    ];
    ok(&with(&args, &m), dir);
    let bytes = detail(dir, &m)["size_bytes"].as_u64().unwrap();
    std::fs::write(dir.join("data"), pattern(bytes)).unwrap();
    ok(&with(&["write", "--input", "data"], &m), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    let new: Vec<String> = (0..adds)
        .map(|i| blank_mib(dir, &format!("new{i}"), 64))
        .collect();
    (m, new)
}

/// A RAID 5 of four members (the array named as `dir`) of 33 MiB files using 31 MiB each, resynced, the pattern
/// written over it. The members' names and the size a RAID 5
/// of two of them holds (what `--array-size` may be at most).
fn raid5_of_four(dir: &Path) -> (Vec<String>, u64) {
    let m = names(4);
    for name in &m {
        blank_mib(dir, name, 33);
    }
    let name = dir.file_name().unwrap().to_str().unwrap();
    let args = vec![
        "create", "--level", "5", "--size", "31M", "--force", "--name", name,
    ];
    ok(&with(&args, &m), dir);
    ok(&with(&["repair"], &m), dir);
    let bytes = detail(dir, &m)["size_bytes"].as_u64().unwrap();
    std::fs::write(dir.join("data"), pattern(bytes)).unwrap();
    ok(&with(&["write", "--input", "data"], &m), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (m, bytes / 3)
}

/// `grow --socket --level 5 -n N --add NEW... --step 1M`: its stdout.
fn raid5_grown_online(dir: &Path, new: &[String]) -> String {
    let n = (2 + new.len()).to_string();
    let ctl = control(dir);
    let mut args = vec![
        "grow", "--socket", &ctl, "--level", "5", "-n", &n, "--step", "1M",
    ];
    for spec in new {
        args.extend(["--add", spec.as_str()]);
    }
    ok(&args, dir)
}

/// `grow --socket --level 1 --array-size SIZE --step 1M`: its stdout.
fn raid1_of_shrunk_online(dir: &Path, size: u64) -> String {
    ok(
        &[
            "grow",
            "--socket",
            &control(dir),
            "--level",
            "1",
            "--array-size",
            &size.to_string(),
            "--step",
            "1M",
        ],
        dir,
    )
}

/// The bytes past fio's 24 MiB are still the pattern (the first `bytes`
/// of the array on `members`).
fn pattern_past_fio(dir: &Path, members: &[String], bytes: u64, what: &str) {
    let got = read(dir, members, bytes);
    let want = pattern(bytes);
    assert!(
        got[24 << 20..] == want[24 << 20..bytes as usize],
        "{what}: the bytes fio did not write are not the pattern"
    );
}

#[test]
fn a_served_raid1_of_two_is_taken_over_and_grown_to_a_raid5_of_four_while_fio_verifies() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, new) = raid1_of_two_and_new(d, 2);
    let bytes = detail(d, &m)["size_bytes"].as_u64().unwrap();
    let server = serve_with(d, &m, &["--reshape-speed", "6:6"]);
    let fio = fio_verify(d, false);
    std::thread::sleep(Duration::from_millis(700));
    let out = raid5_grown_online(d, &new);
    assert!(
        out.contains("level changed online from raid1 (md level 1) to raid5")
            && out.contains("2 to 2 members")
            && out.contains("grown online from 2 to 4 members"),
        "{out}"
    );
    fio_done(fio, "served through --level 5 -n 4");
    let s = status(d);
    let reshape = &s["array"]["reshape"];
    assert_eq!(reshape["kind"], "grow", "{s}");
    assert_eq!(reshape["state"], "finished", "{s}");
    assert_eq!(reshape["raid_disks"], 4, "{s}");
    assert_eq!(s["array"]["raid_disks"], 4, "{s}");
    server.interrupt();
    let all: Vec<String> = m.iter().chain(&new).cloned().collect();
    assert_eq!(md_levels(d, &all), vec![5; 4]);
    let after = detail(d, &all);
    assert_eq!(after["state"], "clean", "{after}");
    assert_eq!(after["raid_disks"], 4, "{after}");
    assert_eq!(after["size_bytes"], 3 * bytes, "{after}");
    assert_checks_clean(d, &all, "after --level 5 -n 4 online");
    pattern_past_fio(d, &all, bytes, "--level 5 -n 4 online");
    let server = serve(d, &all);
    fio_done(fio_verify(d, true), "served again after --level 5 -n 4");
    server.interrupt();
}

#[test]
fn a_served_raid5_of_four_is_shrunk_to_two_and_taken_over_as_a_raid1_while_fio_verifies() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, two) = raid5_of_four(d);
    let server = serve_with(d, &m, &["--reshape-speed", "6:6"]);
    let fio = fio_verify(d, false);
    std::thread::sleep(Duration::from_millis(700));
    let out = raid1_of_shrunk_online(d, two);
    assert!(
        out.contains("shrunk online to two members and taken over as a RAID 1 (md level 1)"),
        "{out}"
    );
    fio_done(fio, "served through --level 1 --array-size");
    let s = status(d);
    let reshape = &s["array"]["reshape"];
    assert_eq!(reshape["kind"], "level", "{s}");
    assert_eq!(reshape["state"], "finished", "{s}");
    assert_eq!(reshape["md_level_before"], 5, "{s}");
    assert_eq!(reshape["md_level"], 1, "{s}");
    assert!(reshape["then_level"].is_null(), "{s}");
    assert_eq!(s["array"]["raid_disks"], 2, "{s}");
    assert_eq!(s["array"]["size_bytes"], two, "{s}");
    server.interrupt();
    let kept: Vec<String> = m[..2].to_vec();
    assert_eq!(md_levels(d, &kept), vec![1; 2]);
    let after = detail(d, &kept);
    assert_eq!(after["state"], "clean", "{after}");
    assert_eq!(after["raid_disks"], 2, "{after}");
    assert_eq!(after["size_bytes"], two, "{after}");
    assert_checks_clean(d, &kept, "after --level 1 --array-size online");
    pattern_past_fio(d, &kept, two, "--level 1 --array-size online");
    let server = serve(d, &kept);
    fio_done(fio_verify(d, true), "served again after --level 1");
    server.interrupt();
}

#[test]
fn online_level_changes_with_a_reshape_refuse_bad_input_before_writing_a_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, new) = raid1_of_two_and_new(d, 1);
    let small = blank_mib(d, "small", 8);
    // A new member carrying a signature: another array's member.
    let other: Vec<String> = vec![blank_mib(d, "o0", 64), blank_mib(d, "o1", 64)];
    create(d, "1", None, &other, "8M");
    // Every file a refusal could touch: the members and the new ones.
    let watched: Vec<String> = m
        .iter()
        .chain(&new)
        .chain([&small, &other[0]])
        .cloned()
        .collect();
    let server = serve(d, &m);
    let grown = |adds: &[&str], n: &str| -> Vec<String> {
        let mut args = vec!["--level".to_string(), "5".into(), "-n".into(), n.into()];
        for a in adds {
            args.extend(["--add".to_string(), a.to_string()]);
        }
        args
    };
    for (args, needles) in [
        // Too small for the rows the RAID 5 uses of each member.
        (grown(&["new0", "small"], "4"), vec!["small"]),
        // Carries an array's superblock (md's, nvraid's).
        (grown(&["o0"], "3"), vec!["o0"]),
        // The count is two plus one per --add, as offline.
        (
            grown(&["new0"], "4"),
            vec!["--raid-devices", "2 + the --add count"],
        ),
        // A member twice.
        (grown(&["new0", "new0"], "4"), vec!["new0"]),
        (
            grown(&["d1"], "3"),
            vec!["d1", "member of the array already"],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused_online(d, &watched, &args, &needles);
        assert_eq!(md_levels(d, &m), vec![1, 1], "{args:?}");
    }
    server.interrupt();
    // Degraded: md takes over, and nvraid grows, whole arrays only.
    let server = serve(d, &m[..1]);
    refused_online(
        d,
        &watched,
        &["--level", "5", "-n", "3", "--add", "new0"],
        &["degraded"],
    );
    server.interrupt();
    // A RAID 1 of three: md takes only two over as RAID 5.
    let three: Vec<String> = vec![
        blank_mib(d, "t0", 16),
        blank_mib(d, "t1", 16),
        blank_mib(d, "t2", 16),
    ];
    create(d, "1", None, &three, "8M");
    let server = serve(d, &three);
    let all3: Vec<String> = three.iter().chain(&new).cloned().collect();
    refused_online(
        d,
        &all3,
        &["--level", "5", "-n", "4", "--add", "new0"],
        &["raid1 of 3", "exactly two members"],
    );
    server.interrupt();

    // A RAID 5 of four to RAID 1: the shrink's checks, as offline.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, two) = raid5_of_four(d);
    let server = serve(d, &m);
    let too_big = (two + (1 << 20)).to_string();
    let fits = two.to_string();
    for (args, needles) in [
        (
            vec!["--level", "1", "--array-size", too_big.as_str()],
            vec!["--array-size"],
        ),
        (
            vec!["--level", "1", "-n", "3", "--array-size", fits.as_str()],
            vec!["--raid-devices 3", "shrunk to 2 first"],
        ),
    ] {
        refused_online(d, &m, &args, &needles);
    }
    assert_eq!(md_levels(d, &m), vec![5; 4]);
    server.interrupt();
    // A RAID 6: md takes no RAID 6 over as RAID 1 (the takeover's words,
    // as offline, where no shrink to two comes first either).
    let six: Vec<String> = (0..4).map(|i| blank_mib(d, &format!("s{i}"), 16)).collect();
    create(d, "6", None, &six, "8M");
    // Resynced first: a fresh RAID 6 served is resynced in the background,
    // whose end is recorded on the members (not the refusal's doing).
    ok(&with(&["repair"], &six), d);
    let server = serve(d, &six);
    refused_online(d, &six, &["--level", "1", "--array-size", "8M"], &["raid6"]);
    assert_eq!(md_levels(d, &six), vec![6; 4]);
    server.interrupt();
}

#[test]
fn a_second_reshape_waits_for_the_takeover_that_follows_a_served_shrink() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, two) = raid5_of_four(d);
    let server = serve_with(d, &m, &["--reshape-speed", "2:2"]);
    let shrink = grow_spawned(
        d,
        &[
            "--level",
            "1",
            "--array-size",
            &two.to_string(),
            "--step",
            "1M",
        ],
    );
    let mid = wait_reshape_below(d, two - 2 * MIB);
    assert_eq!(mid["array"]["reshape"]["kind"], "shrink", "{mid}");
    assert_eq!(
        mid["array"]["reshape"]["then_level"]["state"], "pending",
        "{mid}"
    );
    // Anything else asked of the server meanwhile is refused by name.
    let said = refusal(&["grow", "--socket", &control(d), "--level", "5"], d);
    assert!(said.contains("takeover as RAID 1"), "{said}");
    let out = shrink.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("taken over as a RAID 1"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Then another may follow in the same run: back to RAID 5 of two.
    level_online(d, "5");
    assert_eq!(status(d)["array"]["reshape"]["md_level"], 5);
    server.interrupt();
    assert_eq!(md_levels(d, &m[..2]), vec![5, 5]);
    assert_checks_clean(d, &m[..2], "RAID 1 back to RAID 5 of two");
    assert!(read(d, &m[..2], two) == pattern(two));
}

/// `grow --socket CTL args...` started in the background (the server's
/// answer and the reshape's progress on its pipes).
fn grow_spawned(d: &Path, args: &[&str]) -> Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(d)
        .args(["grow", "--socket", &control(d)])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The server serving `served` SIGKILLed while the reshape `args` start
/// runs part-way, once fio has written and verified through it during the
/// reshape (`shrink`: the position falls from the end). The status seen
/// last before the kill.
fn killed_mid_reshape(
    d: &Path,
    served: &[String],
    args: &[&str],
    shrink: bool,
) -> serde_json::Value {
    let mut server = serve_with(d, served, &["--reshape-speed", "2:2"]);
    let grow = grow_spawned(d, args);
    let started = if shrink {
        wait_reshape_below(d, u64::MAX)
    } else {
        wait_reshape_past(d, 0)
    };
    let kind = started["array"]["reshape"]["kind"].clone();
    fio_done(fio_verify(d, false), "during the reshape");
    let last = status(d);
    assert_eq!(last["array"]["reshape"]["state"], "running", "{last}");
    assert_eq!(last["array"]["reshape"]["kind"], kind, "{last}");
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = grow.wait_with_output();
    last
}

/// A server stopped by `NVRAID_FAILPOINT` at `point` (the process ends
/// where it stands, as if SIGKILLed) in the level change `args` asks,
/// after fio wrote and verified through it.
fn killed_at_failpoint(d: &Path, served: &[String], args: &[&str], point: &str) {
    let mut server = serve_env(d, served, &[], &[("NVRAID_FAILPOINT", point)]);
    fio_done(fio_verify(d, false), "before the level change");
    let ctl = control(d);
    let mut all = vec!["grow", "--socket", ctl.as_str()];
    all.extend(args);
    let _ = nvraid(&all, d);
    let exited = server.wait().unwrap();
    assert!(!exited.success(), "{point}: the server lived");
    assert!(serve_log(d).contains("failpoint"), "{}", serve_log(d));
}

#[test]
fn a_server_killed_between_or_during_the_takeover_and_the_grow_leaves_what_the_docs_say() {
    tool("fio");
    // Killed after the takeover, before the grow is recorded (the
    // takeover's last failpoint: both members written): a RAID 5 of two,
    // the new members untouched; served so, the same command again grows
    // it.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, new) = raid1_of_two_and_new(d, 2);
    let bytes = detail(d, &m)["size_bytes"].as_u64().unwrap();
    let blank = hashes(d, &new);
    let grow_args = [
        "--level", "5", "-n", "4", "--add", "new0", "--add", "new1", "--step", "1M",
    ];
    killed_at_failpoint(d, &m, &grow_args, "reshape-superblock:2");
    assert_eq!(md_levels(d, &m), vec![5, 5]);
    assert_eq!(hashes(d, &new), blank, "the grow wrote a new member");
    let left = detail(d, &m);
    assert_eq!(left["raid_disks"], 2, "{left}");
    let server = serve(d, &m);
    fio_done(fio_verify(d, true), "a RAID 5 of two after the kill");
    let out = ok(
        &[&["grow", "--socket", &control(d)][..], &grow_args[..]].concat(),
        d,
    );
    assert!(
        !out.contains("level changed") && out.contains("grown online from 2 to 4 members"),
        "{out}"
    );
    fio_done(fio_verify(d, true), "grown after the kill");
    server.interrupt();
    let all: Vec<String> = m.iter().chain(&new).cloned().collect();
    assert_eq!(md_levels(d, &all), vec![5; 4]);
    assert_checks_clean(d, &all, "killed before the grow, grown after");
    pattern_past_fio(d, &all, bytes, "killed before the grow");

    // SIGKILLed mid-grow: a RAID 5 growing 2 -> 4 that `serve` finishes
    // (the array was dirty: before it is served); every block fio wrote
    // during the grow reads back.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, new) = raid1_of_two_and_new(d, 2);
    let last = killed_mid_reshape(d, &m, &grow_args, false);
    assert_eq!(last["array"]["reshape"]["kind"], "grow", "{last}");
    let all: Vec<String> = m.iter().chain(&new).cloned().collect();
    let left = detail(d, &all);
    assert_eq!(left["state"], "reshaping", "{left}");
    assert_eq!(md_levels(d, &all), vec![5; 4]);
    let server = serve(d, &all);
    assert!(
        serve_log(d).contains("event=reshape-finished raid_disks=2->4"),
        "{}",
        serve_log(d)
    );
    fio_done(fio_verify(d, true), "the grow finished after the kill");
    wait_resynced(d);
    server.interrupt();
    assert_checks_clean(d, &all, "killed mid-grow, finished by serve");
    pattern_past_fio(d, &all, bytes, "killed mid-grow");
}

#[test]
fn a_server_killed_mid_shrink_before_the_takeover_leaves_a_raid5_that_serve_finishes() {
    tool("fio");
    // SIGKILLed mid-shrink: a RAID 5 shrinking 4 -> 2 (md's record has
    // no room for the level that follows); `serve` finishes the shrink,
    // serves the RAID 5 of two, and `--level 1` takes it over.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, two) = raid5_of_four(d);
    let size = two.to_string();
    let last = killed_mid_reshape(
        d,
        &m,
        &["--level", "1", "--array-size", &size, "--step", "1M"],
        true,
    );
    assert_eq!(last["array"]["reshape"]["kind"], "shrink", "{last}");
    assert_eq!(
        last["array"]["reshape"]["then_level"]["state"], "pending",
        "{last}"
    );
    let left = detail(d, &m);
    assert_eq!(left["state"], "reshaping", "{left}");
    assert_eq!(left["direction"], "backwards", "{left}");
    let server = serve(d, &m);
    assert!(
        serve_log(d).contains("event=reshape-finished raid_disks=4->2"),
        "{}",
        serve_log(d)
    );
    fio_done(fio_verify(d, true), "the shrink finished after the kill");
    wait_resynced(d);
    assert_eq!(status(d)["array"]["raid_disks"], 2);
    let out = level_online(d, "1");
    assert!(out.contains("from raid5"), "{out}");
    fio_done(fio_verify(d, true), "taken over after the kill");
    server.interrupt();
    let kept: Vec<String> = m[..2].to_vec();
    assert_eq!(md_levels(d, &kept), vec![1, 1]);
    assert_checks_clean(d, &kept, "killed mid-shrink, then --level 1");
    pattern_past_fio(d, &kept, two, "killed mid-shrink");
}

#[test]
fn a_server_killed_after_the_shrink_before_the_takeover_leaves_a_raid5_of_two() {
    tool("fio");
    // Killed once the shrink to two has ended, before the server's
    // takeover writes anything (the failpoint `level-after-shrink`): the
    // members record a RAID 5 of two, the other two spares; served so,
    // `--level 1` takes it over.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, two) = raid5_of_four(d);
    let size = two.to_string();
    killed_at_failpoint(
        d,
        &m,
        &["--level", "1", "--array-size", &size, "--step", "1M"],
        "level-after-shrink:1",
    );
    let kept: Vec<String> = m[..2].to_vec();
    assert_eq!(md_levels(d, &kept), vec![5, 5]);
    let left = detail(d, &kept);
    assert_eq!(left["raid_disks"], 2, "{left}");
    assert_eq!(left["size_bytes"], two, "{left}");
    let server = serve(d, &kept);
    fio_done(fio_verify(d, true), "a RAID 5 of two after the kill");
    wait_resynced(d);
    let out = level_online(d, "1");
    assert!(out.contains("from raid5"), "{out}");
    fio_done(fio_verify(d, true), "taken over after the kill");
    server.interrupt();
    assert_eq!(md_levels(d, &kept), vec![1, 1]);
    assert_checks_clean(d, &kept, "killed after the shrink, then --level 1");
    pattern_past_fio(d, &kept, two, "killed after the shrink");
}

/// The kernel's md (tools/mdvm, 6.1) assembles what the served level
/// changes with a reshape leave, finished and killed part-way: a RAID 1
/// of two taken over and grown to a RAID 5 of four; the same killed
/// inside a grow step (md finishes the grow); a RAID 5 of four shrunk and
/// taken over as a RAID 1 of two; the same killed inside a shrink step
/// (md finishes the shrink: a RAID 5 of two, as the docs say). Each holds
/// the pattern written before, and md's check finds no mismatch.
#[test]
fn the_kernel_assembles_what_served_level_changes_with_a_reshape_leave() {
    let dir = tempfile::tempdir().unwrap();
    let mut images: Vec<PathBuf> = Vec::new();
    let mut bytes: Vec<(&str, u64)> = Vec::new();
    for (name, kill) in [("r15", None), ("r15k", Some("reshape-write:20"))] {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let (m, new) = raid1_of_two_and_new(&d, 2);
        bytes.push((name, detail(&d, &m)["size_bytes"].as_u64().unwrap()));
        let args = [
            "--level", "5", "-n", "4", "--add", "new0", "--add", "new1", "--step", "1M",
        ];
        match kill {
            None => {
                let server = serve(&d, &m);
                raid5_grown_online(&d, &new);
                server.interrupt();
            }
            Some(point) => {
                let mut server = serve_env(&d, &m, &[], &[("NVRAID_FAILPOINT", point)]);
                let _ = nvraid(
                    &[&["grow", "--socket", &control(&d)][..], &args[..]].concat(),
                    &d,
                );
                assert!(
                    !server.wait().unwrap().success(),
                    "{name}: the server lived"
                );
                let all: Vec<String> = m.iter().chain(&new).cloned().collect();
                assert_eq!(detail(&d, &all)["state"], "reshaping", "{name}");
            }
        }
        images.extend(m.iter().chain(&new).map(|n| d.join(n)));
    }
    for (name, kill) in [("r51", None), ("r51k", Some("reshape-write:20"))] {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let (m, two) = raid5_of_four(&d);
        bytes.push((name, two));
        match kill {
            None => {
                let server = serve(&d, &m);
                raid1_of_shrunk_online(&d, two);
                server.interrupt();
                // The two that left are spares: the kept pair alone.
                images.extend(m[..2].iter().map(|n| d.join(n)));
            }
            Some(point) => {
                let size = two.to_string();
                let mut server = serve_env(&d, &m, &[], &[("NVRAID_FAILPOINT", point)]);
                let _ = nvraid(
                    &[
                        "grow",
                        "--socket",
                        &control(&d),
                        "--level",
                        "1",
                        "--array-size",
                        &size,
                        "--step",
                        "1M",
                    ],
                    &d,
                );
                assert!(
                    !server.wait().unwrap().success(),
                    "{name}: the server lived"
                );
                assert_eq!(detail(&d, &m)["state"], "reshaping", "{name}");
                images.extend(m.iter().map(|n| d.join(n)));
            }
        }
    }
    let report = kernel_reports(dir.path(), &images, &bytes);
    eprintln!("{report}");
    for (name, level, disks) in [
        ("r15", "raid5", 4),
        ("r15k", "raid5", 4),
        ("r51", "raid1", 2),
        ("r51k", "raid5", 2),
    ] {
        let line = kernel_line(&report, name);
        assert!(
            line.contains(&format!("level={level} "))
                && line.contains(&format!("disks={disks} "))
                && line.contains("degraded=0 ")
                && line.contains("pattern=ok")
                && line.contains("mismatch=0 "),
            "{name}: {line}\n{report}"
        );
    }
}

#[test]
fn a_member_failing_mid_grow_after_the_takeover_is_read_around_and_the_grow_finishes() {
    // A served RAID 1 of two, its second member through nbdkit's error
    // filter, taken over and grown to four; part-way that member's every
    // request fails. It is recorded faulty and the grow goes on degraded,
    // as any served RAID 5 grow does; the grown array reads the pattern.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, new) = raid1_of_two_and_new(d, 2);
    let bytes = detail(d, &m)["size_bytes"].as_u64().unwrap();
    let node = FailingNode::up(d, "d1");
    let served = vec![m[0].clone(), node.uri()];
    let server = serve_with(d, &served, &["--reshape-speed", "3:3"]);
    let grow = grow_spawned(
        d,
        &[
            "--level", "5", "-n", "4", "--add", "new0", "--add", "new1", "--step", "1M",
        ],
    );
    wait_reshape_past(d, 4 * MIB);
    node.fail();
    let out = grow.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("grown online from 2 to 4 members"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = status(d);
    assert_eq!(s["array"]["reshape"]["state"], "finished", "{s}");
    assert!(
        s["array"]["state"].as_str().unwrap().contains("degraded"),
        "{s}"
    );
    assert!(
        served_bytes(d)[..bytes as usize] == pattern(bytes)[..],
        "read around the failed member"
    );
    server.interrupt();
    assert!(serve_log(d).contains("faulty"), "{}", serve_log(d));
    drop(node);
    let kept = vec![m[0].clone(), new[0].clone(), new[1].clone()];
    assert_eq!(md_levels(d, &kept), vec![5; 3]);
    assert!(read(d, &kept, bytes) == pattern(bytes), "degraded after");
}

#[test]
fn a_member_failing_mid_shrink_leaves_a_degraded_raid5_of_two_and_the_takeover_refused() {
    // A served RAID 5 of four, its second member (kept by the shrink)
    // through nbdkit's error filter, asked for RAID 1; part-way through
    // the shrink that member fails. The shrink finishes around it, as any
    // served shrink does; md takes over only whole arrays, so the server
    // does not take the degraded RAID 5 of two over: `then_level` says
    // why, the command fails naming it, the array reads the pattern.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, two) = raid5_of_four(d);
    let node = FailingNode::up(d, "d1");
    let mut served = m.clone();
    served[1] = node.uri();
    let server = serve_with(d, &served, &["--reshape-speed", "3:3"]);
    let shrink = grow_spawned(
        d,
        &[
            "--level",
            "1",
            "--array-size",
            &two.to_string(),
            "--step",
            "1M",
        ],
    );
    wait_reshape_below(d, two - 4 * MIB);
    node.fail();
    let out = shrink.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && said.contains("takeover as RAID 1 failed")
            && said.contains("degraded"),
        "{said}"
    );
    let s = status(d);
    let reshape = &s["array"]["reshape"];
    assert_eq!(reshape["kind"], "shrink", "{s}");
    assert_eq!(reshape["state"], "finished", "{s}");
    assert_eq!(reshape["then_level"]["state"], "failed", "{s}");
    assert_eq!(s["array"]["raid_disks"], 2, "{s}");
    assert!(
        served_bytes(d) == pattern(two),
        "read around the failed member"
    );
    server.interrupt();
    drop(node);
    assert_eq!(md_levels(d, &m[..1]), vec![5]);
}
