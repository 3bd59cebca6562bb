//! `nvraid grow --socket CTL --level 10 [--add NEW...]` and `--level 0`:
//! md's takeovers between RAID 0 of N and RAID 10 near=2 of 2N made on a
//! served array (the roles renumbered: RAID 0 role k is RAID 10 role 2k),
//! while fio writes and verifies through NBD; the second copies rebuilt
//! by the server; a new mirror failing during its rebuild; a server killed
//! between two members' superblock writes and after all of them; what is
//! refused, by name, with no member byte changed; the kernel's md
//! assembling what is left.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

fn create(dir: &Path, level: &str, layout: Option<&str>, members: &[String], size: &str) {
    let mut args = vec![
        "create", "--level", level, "--size", size, "--force", "--bitmap", "none",
    ];
    if let Some(layout) = layout {
        args.extend(["--layout", layout]);
    }
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

/// Member images' hashes.
fn hashes(dir: &Path, members: &[String]) -> Vec<String> {
    members
        .iter()
        .map(|m| sha(&std::fs::read(dir.join(m)).unwrap()))
        .collect()
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

/// `grow --socket CTL` with `args`: its stdout.
fn grow_online(dir: &Path, args: &[&str]) -> String {
    let ctl = control(dir);
    let mut all = vec!["grow", "--socket", ctl.as_str()];
    all.extend(args);
    ok(&all, dir)
}

/// The array's bytes written as [`pattern`] (`nvraid write`).
fn write_pattern(dir: &Path, members: &[String]) -> Vec<u8> {
    let bytes = detail(dir, members)["size_bytes"].as_u64().unwrap();
    let data = pattern(bytes);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], members), dir);
    data
}

/// The array on `members` holds `data` (`nvraid read`).
fn holds(dir: &Path, members: &[String], data: &[u8], what: &str) {
    let got = ok_bytes(&with(&["read"], members), dir);
    assert!(got == data, "{what}: the bytes differ");
}

#[test]
fn a_served_raid0_becomes_a_raid10_its_mirrors_rebuilt_while_fio_verifies() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names("d", 2);
    create(d, "0", None, &m, "32M");
    let new: Vec<String> = ["n0", "n1"].iter().map(|n| blank_mib(d, n, 33)).collect();
    let server = serve_with(d, &m, &["--rebuild-speed", "10:20"]);
    let fio = fio_verify(d, "r10", 400, 7, false);
    std::thread::sleep(Duration::from_millis(700));
    let out = grow_online(d, &["--level", "10", "--add", "n0", "--add", "n1"]);
    assert!(
        out.contains("from raid0 (md level 0) to raid10 (near=2) (md level 10), 2 to 4 members"),
        "{out}"
    );
    assert!(out.contains("n0, n1 rebuilt as the second copies"), "{out}");
    let s = status(d);
    assert_eq!(s["array"]["raid_disks"], 4, "{s}");
    assert!(
        !s["array"]["state"].as_str().unwrap().contains("degraded"),
        "{s}"
    );
    // RAID 0 role k is RAID 10 role 2k; the new mirrors the odd roles.
    let role_of = |path: &str| {
        s["array"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["path"] == path)
            .map(|x| x["role"].as_u64().unwrap())
    };
    assert_eq!(
        [role_of("d0"), role_of("n0"), role_of("d1"), role_of("n1")],
        [Some(0), Some(1), Some(2), Some(3)],
        "{s}"
    );
    fio_done(fio);
    server.interrupt();
    let all = vec!["d0".to_string(), "n0".into(), "d1".into(), "n1".into()];
    let after = detail(d, &all);
    assert_eq!(after["level"], 10, "{after}");
    assert_eq!(after["raid_disks"], 4, "{after}");
    assert_eq!(after["state"], "clean", "{after}");
    assert_eq!(md_levels(d, &all), vec![10; 4]);
    assert_checks_clean(d, &all, "after the online takeover and the rebuild");
    // The rebuilt mirrors alone (one copy of each pair) hold what fio
    // wrote.
    let server = serve(d, &new);
    fio_done(fio_verify(d, "r10", 400, 7, true));
    server.interrupt();
}

/// The I/O operations the server counted on the member `path` (`status`'s
/// per-member `io.ops`).
fn ops_of(dir: &Path, path: &str) -> u64 {
    let s = status(dir);
    s["array"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == path)
        .and_then(|x| x["io"]["ops"].as_u64())
        .unwrap_or_else(|| panic!("{path} has no io counts: {s}"))
}

#[test]
fn a_served_raid0_becomes_a_degraded_raid10_filled_later_then_goes_back_to_raid0() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names("d", 2);
    create(d, "0", None, &m, "32M");
    blank_mib(d, "n0", 33);
    blank_mib(d, "n1", 33);
    let server = serve(d, &m);
    let fio = fio_verify(d, "r10", 400, 9, false);
    std::thread::sleep(Duration::from_millis(500));
    // Each member's I/O counts follow it through the renumbering (d1:
    // role 1, then 2, then 1 again); they only ever grow.
    let counted = |what: &str, before: &[(&str, u64)]| {
        for &(path, ops) in before {
            let now = ops_of(d, path);
            assert!(
                now >= ops,
                "{what}: {path}'s I/O count fell from {ops} to {now}: {}",
                status(d)
            );
        }
    };
    let before = [("d0", ops_of(d, "d0")), ("d1", ops_of(d, "d1"))];
    assert!(before.iter().all(|&(_, ops)| ops > 0), "{before:?}");
    let out = grow_online(d, &["--level", "10"]);
    assert!(out.contains("served degraded"), "{out}");
    counted("raid0 -> raid10", &before);
    let s = status(d);
    assert!(
        s["array"]["state"].as_str().unwrap().contains("degraded"),
        "{s}"
    );
    // The second copies with the ordinary online add, rebuilt meanwhile.
    for n in ["n0", "n1"] {
        ok(&["add", "--socket", &control(d), "--new", n], d);
    }
    let started = std::time::Instant::now();
    loop {
        let s = status(d);
        if !s["array"]["state"].as_str().unwrap().contains("degraded")
            && s["array"]["members"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x["state"] == "active")
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{s}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Back to RAID 0: the first working copy of each pair kept (d0, d1,
    // roles 0 and 2), the others (n0, n1) leave and are written no more.
    let before: Vec<(&str, u64)> = ["d0", "d1"].iter().map(|&p| (p, ops_of(d, p))).collect();
    let out = grow_online(d, &["--level", "0"]);
    assert!(
        out.contains("to raid0 (md level 0), 4 to 2 members")
            && out.contains("n0, n1 left the array"),
        "{out}"
    );
    let left = hashes(d, &["n0".into(), "n1".into()]);
    fio_done(fio);
    assert_eq!(
        hashes(d, &["n0".into(), "n1".into()]),
        left,
        "written after they left"
    );
    let s = status(d);
    assert_eq!(s["array"]["raid_disks"], 2, "{s}");
    counted("raid10 -> raid0", &before);
    server.interrupt();
    assert_eq!(md_levels(d, &m), vec![0; 2]);
    let after = detail(d, &m);
    assert_eq!(after["level"], 0, "{after}");
    let server = serve(d, &m);
    fio_done(fio_verify(d, "r10", 400, 9, true));
    server.interrupt();
}

#[test]
fn a_degraded_raid10_becomes_a_raid0_keeping_the_working_copy_of_each_pair() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names("d", 4);
    create(d, "10", None, &m, "8M");
    let data = write_pattern(d, &m);
    // Role 0 gone: its pair's other copy (d1, role 1) is kept as role 0.
    std::fs::rename(d.join("d0"), d.join("away")).unwrap();
    let present: Vec<String> = m[1..].to_vec();
    let server = serve(d, &present);
    let out = grow_online(d, &["--level", "0"]);
    assert!(out.contains("d3 left the array"), "{out}");
    server.interrupt();
    let kept = vec!["d1".to_string(), "d2".into()];
    let after = detail(d, &kept);
    assert_eq!(after["level"], 0, "{after}");
    assert_eq!(after["raid_disks"], 2, "{after}");
    let e: serde_json::Value = serde_json::from_str(&ok(&["examine", "--json", "d1"], d)).unwrap();
    assert_eq!(e[0]["role"], "Active device 0", "{e}");
    holds(d, &kept, &data, "the kept copies");
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
fn raid0_raid10_takeovers_md_refuses_are_refused_naming_the_culprit_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // RAID 10 layouts md does not take over as RAID 0: far, offset, three
    // copies, an odd member count.
    for (layout, count) in [("f2", 4), ("o2", 4), ("n3", 6), ("n2", 3)] {
        let sub = d.join(format!("{layout}-{count}"));
        std::fs::create_dir(&sub).unwrap();
        let m = names("d", count);
        create(&sub, "10", Some(layout), &m, "8M");
        let server = serve(&sub, &m);
        refused_online(
            &sub,
            &m,
            &["--level", "0"],
            &["near=2", "even member count"],
        );
        server.interrupt();
    }
    // md's RAID 0 keeps no bitmap: a RAID 10 with one is refused.
    let sub = d.join("bitmap");
    std::fs::create_dir(&sub).unwrap();
    let m = names("d", 4);
    ok(
        &with(&["create", "--level", "10", "--size", "8M", "--force"], &m),
        &sub,
    );
    let server = serve(&sub, &m);
    refused_online(
        &sub,
        &m,
        &["--level", "0"],
        &["write-intent bitmap", "RAID 0"],
    );
    server.interrupt();
    // A RAID 0 -> 10 with new members that cannot join: nothing written.
    let sub = d.join("raid0");
    std::fs::create_dir(&sub).unwrap();
    let m = names("d", 2);
    create(&sub, "0", None, &m, "8M");
    blank_mib(&sub, "small", 4);
    blank_mib(&sub, "n0", 9);
    blank_mib(&sub, "n1", 9);
    // A member of another array.
    create(
        &sub,
        "1",
        None,
        &["fs".to_string(), "other".to_string()],
        "9M",
    );
    let server = serve(&sub, &m);
    let mut all = m.clone();
    all.extend(["small".into(), "n0".into(), "n1".into(), "fs".into()]);
    refused_online(
        &sub,
        &all,
        &["--level", "10", "--add", "n0", "--add", "small"],
        &["small", "too small"],
    );
    refused_online(
        &sub,
        &all,
        &["--level", "10", "--add", "nosuch"],
        &["nosuch"],
    );
    refused_online(
        &sub,
        &all,
        &["--level", "10", "--add", "n0", "--add", "n0"],
        &["n0", "twice"],
    );
    refused_online(
        &sub,
        &all,
        &["--level", "10", "--add", "fs"],
        &["fs", "--force"],
    );
    refused_online(
        &sub,
        &all,
        &["--level", "10", "-n", "6", "--add", "n0"],
        &["--raid-devices 6", "RAID 10 near=2 of 4"],
    );
    refused_online(
        &sub,
        &all,
        &["--level", "10", "--add", "n0", "--add", "n1", "--add", "fs"],
        &["3 members added", "2 second copies"],
    );
    // The array is still the served RAID 0 of two.
    let s = status(&sub);
    assert_eq!(s["array"]["raid_disks"], 2, "{s}");
    server.interrupt();
    assert_eq!(md_levels(&sub, &m), vec![0; 2]);
    // A RAID 5 gains no mirrors.
    let sub = d.join("raid5");
    std::fs::create_dir(&sub).unwrap();
    let m = names("d", 3);
    create(&sub, "5", None, &m, "8M");
    blank_mib(&sub, "n0", 9);
    let server = serve(&sub, &m);
    refused_online(
        &sub,
        &m,
        &["--level", "10", "--add", "n0"],
        &["RAID 0 only"],
    );
    server.interrupt();
}

#[test]
fn a_new_mirror_failing_during_its_rebuild_leaves_the_raid10_serving_degraded() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = names("d", 2);
    create(d, "0", None, &m, "32M");
    blank_mib(d, "n0", 33);
    blank_mib(d, "n1", 33);
    let node = FailingNode::slow(d, "n1");
    let server = serve_with(d, &m, &["--rebuild-speed", "2:4"]);
    let fio = fio_verify(d, "r10", 300, 5, false);
    std::thread::sleep(Duration::from_millis(300));
    let grow = std::process::Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(d)
        .args([
            "grow",
            "--socket",
            &control(d),
            "--level",
            "10",
            "--add",
            "n0",
            "--add",
        ])
        .arg(node.uri())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for n1's rebuild to run, then fail it.
    let started = std::time::Instant::now();
    loop {
        let s = status(d);
        let rebuild = &s["array"]["recovery"]["rebuild"];
        if rebuild["role"] == 3 && rebuild["done_bytes"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    node.fail();
    let out = grow.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the grow hid the failure: {said}");
    assert!(said.contains("stopped rebuilding"), "{said}");
    fio_done(fio);
    let s = status(d);
    assert_eq!(s["array"]["raid_disks"], 4, "{s}");
    assert!(
        s["array"]["state"].as_str().unwrap().contains("degraded"),
        "{s}"
    );
    server.interrupt();
    drop(node);
    // The RAID 10 without n1 (its role missing) holds every byte.
    let present = vec!["d0".to_string(), "n0".into(), "d1".into()];
    let server = serve(d, &present);
    fio_done(fio_verify(d, "r10", 300, 5, true));
    server.interrupt();
}

/// A server killed after the first member's superblock (members then
/// disagree: assembly refuses, naming the field; `grow --level` offline
/// finishes it) or after every member's (the new level assembles as it
/// is): either way every byte reads back in the new level.
#[test]
fn a_server_killed_in_the_takeovers_superblock_writes_leaves_every_byte() {
    // (create level, members, online --level, kill point, cut mid-way)
    for (level, count, to, kill, mid) in [
        ("0", 3, "10", "reshape-superblock:1", true),
        ("0", 3, "10", "reshape-superblock:2", true),
        ("0", 3, "10", "reshape-superblock:3", false),
        ("10", 4, "0", "reshape-superblock:1", true),
        ("10", 4, "0", "reshape-superblock:2", false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let m = names("d", count);
        create(d, level, None, &m, "8M");
        let data = write_pattern(d, &m);
        let what = format!("{level}->{to} at {kill}");
        let mut server = serve_env(d, &m, &[], &[("NVRAID_FAILPOINT", kill)]);
        let _ = nvraid(&["grow", "--socket", &control(d), "--level", to], d);
        let exit = server.wait().unwrap();
        assert!(!exit.success(), "{what}: the server lived");
        assert!(
            serve_log(d).contains("failpoint reshape-superblock"),
            "{what}"
        );
        // The members the new level keeps (a RAID 10's first copies).
        let kept: Vec<String> = if to == "0" {
            m.iter().step_by(2).cloned().collect()
        } else {
            m.clone()
        };
        let levels = md_levels(d, &kept);
        let md: i64 = to.parse().unwrap();
        if mid {
            assert!(
                levels.contains(&md) && levels.iter().any(|&l| l != md),
                "{what}: not cut between members: {levels:?}"
            );
            let said = refusal(&with(&["detail"], &m), d);
            assert!(said.contains("level"), "{what}: {said}");
            let out = ok(&with(&["grow", "--level", to], &m), d);
            assert!(out.contains("level changed"), "{what}: {out}");
            if to == "0" {
                assert!(out.contains("d1, d3 left the array"), "{what}: {out}");
            }
        }
        assert_eq!(md_levels(d, &kept), vec![md; kept.len()], "{what}");
        let after = detail(d, &kept);
        assert_eq!(
            after["level"],
            if to == "0" { 0 } else { 10 },
            "{what}: {after}"
        );
        holds(d, &kept, &data, &what);
        // And served: the next `serve` takes the new level.
        let server = serve(d, &kept);
        let s = status(d);
        assert_eq!(
            s["array"]["raid_disks"].as_u64().unwrap(),
            if to == "0" { 2 } else { 6 },
            "{what}: {s}"
        );
        server.interrupt();
    }
}

/// The kernel's md (tools/mdvm, 6.1) assembles what the online takeovers
/// leave: a RAID 0 taken over as RAID 10 with its mirrors rebuilt (whole,
/// `check` finding no mismatch), one left degraded (no mirrors added),
/// and a RAID 10 taken back to RAID 0; each holding the pattern written
/// before.
#[test]
fn the_kernel_assembles_arrays_taken_between_raid0_and_raid10_online() {
    let dir = tempfile::tempdir().unwrap();
    let mut images: Vec<PathBuf> = Vec::new();
    let mut sizes = Vec::new();
    // (name, create level, members, online --level, mirrors added, kill
    // point: the server killed between the first and second member's
    // superblock write)
    for (name, level, count, to, add, kill) in [
        ("r0to10", "0", 2, "10", true, None),
        ("r0to10d", "0", 2, "10", false, None),
        ("r10to0", "10", 4, "0", false, None),
        ("c0to10", "0", 2, "10", false, Some("reshape-superblock:1")),
        ("c10to0", "10", 4, "0", false, Some("reshape-superblock:1")),
        // The same, then finished offline (`grow --level`).
        ("f0to10", "0", 2, "10", false, Some("reshape-superblock:1")),
        ("f10to0", "10", 4, "0", false, Some("reshape-superblock:1")),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let m = names(&format!("{name}-d"), count);
        let mut args = vec![
            "create", "--level", level, "--size", "8M", "--name", name, "--bitmap", "none",
            "--force",
        ];
        args.extend(m.iter().map(String::as_str));
        ok(&args, &sub);
        let bytes = write_pattern(&sub, &m).len() as u64;
        std::fs::remove_file(sub.join("data")).unwrap();
        if let Some(kill) = kill {
            // Every member given to md: it must not mix the two levels.
            let mut server = serve_env(&sub, &m, &[], &[("NVRAID_FAILPOINT", kill)]);
            let _ = nvraid(&["grow", "--socket", &control(&sub), "--level", to], &sub);
            assert!(
                !server.wait().unwrap().success(),
                "{name}: the server lived"
            );
            if name.starts_with('f') {
                ok(&with(&["grow", "--level", to], &m), &sub);
                // The second copies a RAID 10 -> 0 let go keep their old
                // superblock (as md leaves the devices mdadm removed):
                // blanked before reuse, so not given to md.
                let kept: Vec<String> = if to == "0" {
                    m.iter().step_by(2).cloned().collect()
                } else {
                    m.clone()
                };
                images.extend(kept.iter().map(|n| sub.join(n)));
                sizes.push((name, bytes));
                continue;
            }
            images.extend(m.iter().map(|n| sub.join(n)));
            sizes.push((name, bytes));
            continue;
        }
        let server = serve(&sub, &m);
        let mut kept = m.clone();
        if add {
            let new: Vec<String> = (0..count)
                .map(|i| blank_mib(&sub, &format!("{name}-n{i}"), 9))
                .collect();
            let mut args = vec!["--level", to];
            for n in &new {
                args.extend(["--add", n.as_str()]);
            }
            grow_online(&sub, &args);
            kept.extend(new);
        } else {
            grow_online(&sub, &["--level", to]);
        }
        server.interrupt();
        if to == "0" {
            kept = m.iter().step_by(2).cloned().collect();
        }
        images.extend(kept.iter().map(|n| sub.join(n)));
        sizes.push((name, bytes));
    }
    let report = kernel_reports(dir.path(), &images, &sizes);
    eprintln!("{report}");
    let line = kernel_line(&report, "r0to10");
    assert!(
        line.contains("level=raid10 ")
            && line.contains("disks=4 ")
            && line.contains("degraded=0 ")
            && line.contains("pattern=ok")
            && line.contains("mismatch=0 "),
        "{report}"
    );
    let line = kernel_line(&report, "r0to10d");
    assert!(
        line.contains("level=raid10 ")
            && line.contains("disks=4 ")
            && line.contains("degraded=2 ")
            && line.contains("pattern=ok"),
        "{report}"
    );
    let line = kernel_line(&report, "r10to0");
    assert!(
        line.contains("level=raid0 ") && line.contains("disks=2 ") && line.contains("pattern=ok"),
        "{report}"
    );
    // Finished offline: md assembles the new level (the RAID 10 without
    // its mirrors; the RAID 0 of the first copies, the second ones left).
    let line = kernel_line(&report, "f0to10");
    assert!(
        line.contains("level=raid10 ")
            && line.contains("degraded=2 ")
            && line.contains("pattern=ok"),
        "{report}"
    );
    let line = kernel_line(&report, "f10to0");
    assert!(
        line.contains("level=raid0 ") && line.contains("disks=2 ") && line.contains("pattern=ok"),
        "{report}"
    );
    // Cut between members: whatever md makes of the members (the old or
    // the new level, or nothing), it never serves misplaced bytes.
    for name in ["c0to10", "c10to0"] {
        for line in report
            .lines()
            .filter(|l| l.starts_with("KERNEL ") && l.contains(&format!("name={name} ")))
        {
            assert!(line.contains("pattern=ok"), "{name}: {line}\n{report}");
        }
    }
}
