//! A served array whose shape changes while it runs (`Array::swap_shape`
//! at the end of every served reshape): `status` shows the new shape and
//! size, an NBD client connecting after the change is told the new size
//! and reads and writes the grown region, a second reshape runs in the
//! same server run, and the array assembled afterwards holds every byte.

mod common;

use common::reshape::*;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};

fn create(dir: &Path, level: &str, members: &[String], size: &str) {
    let mut args = vec!["create", "--level", level, "--size", size, "--force"];
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

fn uri(dir: &Path) -> String {
    format!("nbd+unix:///?socket={}", dir.join("md.sock").display())
}

/// The export's size as a new NBD connection is told it (nbdinfo).
fn nbd_size(dir: &Path) -> u64 {
    let out = Command::new(tool("nbdinfo"))
        .args(["--size", &uri(dir)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Through a new NBD connection (qemu-io): write `len` bytes of `byte` at
/// `offset`, flush, and read them back checking each byte; whether every
/// step succeeded.
fn nbd_write_read(dir: &Path, offset: u64, len: u64, byte: u8) -> bool {
    let out = Command::new(tool("qemu-io"))
        .args(["-f", "raw", &uri(dir)])
        .args(["-c", &format!("write -P {byte} {offset} {len}")])
        .args(["-c", "flush"])
        .args(["-c", &format!("read -P {byte} {offset} {len}")])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    out.status.success()
        && text.contains(&format!("wrote {len}/{len}"))
        && text.contains(&format!("read {len}/{len}"))
        && !text.contains("failed")
        && !text.contains("error")
}

/// `grow --socket` with `args`, waited for; its stdout.
fn grow_online(dir: &Path, args: &[&str]) -> String {
    let control = control(dir);
    let mut all = vec!["grow", "--socket", control.as_str(), "--step", "1M"];
    all.extend(args);
    ok(&all, dir)
}

#[test]
fn a_client_connecting_after_online_grows_sees_each_new_size_and_a_second_grow_runs_in_the_same_run(
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "16M");
    blank_mib(d, "n4.img", 16);
    blank_mib(d, "n5.img", 16);
    let server = serve(d, &members);
    let size0 = nbd_size(d);
    let data = pattern(size0);
    {
        // The old size filled through NBD.
        let mut copy = Command::new(tool("nbdcopy"))
            .args(["-", &uri(d)])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        copy.stdin.take().unwrap().write_all(&data).unwrap();
        assert!(copy.wait().unwrap().success());
    }

    let said = grow_online(d, &["-n", "5", "--add", "n4.img"]);
    assert!(said.contains("served from now on"), "{said}");
    let s = status(d);
    let size1 = s["array"]["size_bytes"].as_u64().unwrap();
    assert!(size1 > size0, "{s}");
    assert_eq!(s["array"]["raid_disks"], 5, "{s}");
    assert_eq!(s["export"]["size_bytes"], size1, "{s}");
    assert!(
        s["export"]["target"]
            .as_str()
            .unwrap()
            .contains("5 members"),
        "{s}"
    );
    assert_eq!(
        nbd_size(d),
        size1,
        "a new NBD connection was told the old size"
    );
    // The grown region, through the fast path.
    let at1 = size1 - (1 << 20);
    assert!(nbd_write_read(d, at1, 1 << 20, 0xa5), "the grown region");

    // A second grow in the same run.
    let said = grow_online(d, &["-n", "6", "--add", "n5.img"]);
    assert!(said.contains("from 5 to 6"), "{said}");
    let s = status(d);
    let size2 = s["array"]["size_bytes"].as_u64().unwrap();
    assert!(size2 > size1, "{s}");
    assert_eq!(s["array"]["raid_disks"], 6, "{s}");
    assert_eq!(nbd_size(d), size2);
    let at2 = size2 - (1 << 20);
    assert!(
        nbd_write_read(d, at2, 1 << 20, 0x5a),
        "the region the second grow added"
    );
    server.interrupt();

    members.extend(["n4.img".to_string(), "n5.img".to_string()]);
    let grown = detail(d, &members);
    assert_eq!(grown["raid_disks"], 6, "{grown}");
    assert_eq!(grown["size_bytes"], size2, "{grown}");
    assert_eq!(grown["state"], "clean", "{grown}");
    let all = read(d, &members, size2);
    assert!(all[..size0 as usize] == data[..], "the first fill moved");
    assert!(all[at1 as usize..(at1 + (1 << 20)) as usize]
        .iter()
        .all(|&b| b == 0xa5));
    assert!(all[at2 as usize..].iter().all(|&b| b == 0x5a));
    assert_checks_clean(d, &members, "after two online grows in one run");
}

#[test]
fn status_shows_the_new_level_after_an_online_level_change_and_a_grow_follows_in_the_same_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..2).map(|i| format!("m{i}.img")).collect();
    create(d, "1", &members, "16M");
    blank_mib(d, "n2.img", 16);
    let server = serve(d, &members);
    let size0 = nbd_size(d);
    assert!(nbd_write_read(d, 0, 1 << 20, 0x11));
    grow_online(d, &["--level", "5"]);
    let s = status(d);
    assert_eq!(s["array"]["level"], 5, "{s}");
    assert!(
        s["export"]["target"].as_str().unwrap().contains("raid5"),
        "{s}"
    );
    grow_online(d, &["-n", "3", "--add", "n2.img"]);
    let s = status(d);
    assert_eq!(s["array"]["raid_disks"], 3, "{s}");
    let size1 = s["array"]["size_bytes"].as_u64().unwrap();
    assert!(size1 > size0, "{s}");
    assert_eq!(nbd_size(d), size1);
    assert!(nbd_write_read(d, size1 - (1 << 20), 1 << 20, 0x22));
    server.interrupt();
    members.push("n2.img".into());
    let grown = detail(d, &members);
    assert_eq!(grown["level"], 5, "{grown}");
    assert_eq!(grown["raid_disks"], 3, "{grown}");
    let all = read(d, &members, size1);
    assert!(all[..1 << 20].iter().all(|&b| b == 0x11));
    assert!(all[(size1 - (1 << 20)) as usize..]
        .iter()
        .all(|&b| b == 0x22));
    assert_checks_clean(d, &members, "after a level change and a grow in one run");
}
