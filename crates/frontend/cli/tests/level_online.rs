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
