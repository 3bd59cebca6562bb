//! Failures of the members a served grow adds: an added member failing
//! mid-grow (in a step, a superblock update or a client's request) is
//! recorded faulty on the others and the RAID 5/6 grows degraded, as md's
//! does; a client's new-shape write that fails on it succeeds through the
//! parity instead of returning EIO.
//!
//! And `grow --socket CTL --size` (the tests under "Online --size"): the
//! members grown under a served array, the array raised to them while
//! clients write, the new region resynced online (and resumed after a
//! kill), a smaller size cut with `--force` only, refusals changing no
//! byte, and the kernel's md assembling what is left.

mod common;

use common::reshape::*;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn create(dir: &Path, level: &str, members: &[String], size: &str) {
    let mut args = vec!["create", "--level", level, "--size", size, "--force"];
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

fn grow_cmd(dir: &Path, raid_devices: u32, add: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .args(["grow", "--socket", &control(dir), "-n"])
        .arg(raid_devices.to_string())
        .args(["--add", add, "--step", "1M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Poll `status` until the reshape's position is at least `at` (and
/// short of its end).
fn wait_grown_to(dir: &Path, at: u64) -> u64 {
    let started = Instant::now();
    loop {
        let s = status(dir);
        let r = &s["array"]["reshape"];
        let (p, end) = (
            r["position_bytes"].as_u64().unwrap_or(0),
            r["end_bytes"].as_u64().unwrap_or(0),
        );
        if r["state"] == "running" && p >= at.max(1) && p < end {
            return p;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no grow past {at}: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A RAID 5 of four 16 MiB members filled with a pattern (`xor` varies
/// it), served and growing to five onto an nbdkit node of `new.img`
/// whose writes fail once told to, already 2 MiB in: the members, the
/// array's size, its bytes, the node, the server and the grow command.
fn growing_onto_a_failing_member(
    d: &Path,
    xor: u8,
) -> (Vec<String>, u64, Vec<u8>, ErrorFilterNode, Served, Child) {
    tool("fio");
    tool("nbdcopy");
    let members: Vec<String> = (0..4).map(|i| format!("m{i}.img")).collect();
    create(d, "5", &members, "16M");
    let size = detail(d, &members)["size_bytes"].as_u64().unwrap();
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 ^ xor).collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    let mut write = vec!["write", "--input", "data.bin"];
    write.extend(members.iter().map(String::as_str));
    ok(&write, d);
    blank_mib(d, "new.img", 16);
    let node = ErrorFilterNode::up(d, "new.img", "error-pwrite");
    let server = serve_with(d, &members, &["--reshape-speed", "0:8"]);
    let grow = grow_cmd(d, 5, &node.uri());
    wait_grown_to(d, 2 << 20);
    (members, size, data, node, server, grow)
}

/// fio reading 4K at random past the grow's position through NBD, 500
/// IOPS for up to two minutes: clients busy, so a grow whose minimum rate
/// is 0 stops stepping. Threads, not forked jobs: killing fio ends its
/// reads.
fn busy_reader(d: &Path) -> Child {
    let mut reader = fio_nbd(d, "busy");
    reader
        .args([
            "--thread",
            "--rw=randread",
            "--bs=4k",
            "--offset=32m",
            "--size=8m",
            "--time_based",
            "--runtime=120",
            "--rate_iops=500",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    reader.spawn().expect("fio")
}

fn position(dir: &Path) -> u64 {
    status(dir)["array"]["reshape"]["position_bytes"]
        .as_u64()
        .unwrap()
}

fn superblock(dir: &Path, member: &str) -> serde_json::Value {
    let examine: serde_json::Value =
        serde_json::from_str(&ok(&["examine", "--json", member], dir)).unwrap();
    examine[0]["superblock"].clone()
}

/// md's role-table entry of a faulty member.
const ROLE_FAULTY: u16 = 0xfffe;

/// The grow of `count` members by one finished (exit 0, "from N to
/// N+1").
fn grow_finished(grow: Child, count: usize) {
    let out = grow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the grow did not go on without the added member: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("from {count} to {}", count + 1)),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The old members (the server stopped) record the finished shape of one
/// member more with the added member's entry faulty, and assemble as
/// that shape, degraded.
fn recorded_with_the_added_member_faulty(d: &Path, members: &[String], added_image: &str) {
    let count = members.len();
    // Its own superblock (written before it failed) names its slot.
    let dev = superblock(d, added_image)["dev_number"].as_u64().unwrap() as usize;
    for m in members {
        let sb = superblock(d, m);
        assert_eq!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{m}: {sb}");
        assert_eq!(sb["raid_disks"], count + 1, "{m}: {sb}");
        // md's v1.2 superblock at 4 KiB, its role table at byte 256:
        // one little-endian u16 per slot.
        let bytes = std::fs::read(d.join(m)).unwrap();
        let at = 4096 + 256 + 2 * dev;
        let entry = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        assert_eq!(
            entry, ROLE_FAULTY,
            "{m} does not record the added member (slot {dev}) faulty: {sb}"
        );
    }
    let degraded = detail(d, members);
    assert_eq!(degraded["raid_disks"], count + 1, "{degraded}");
    assert!(
        degraded["state"].as_str().unwrap().contains("degraded"),
        "{degraded}"
    );
}

/// The member added to a served RAID 5/6 fails part-way through the
/// online grow (every request on it failing: a step, a superblock update
/// or a client's request sees it first): it is recorded faulty on the old
/// members and the grow goes on degraded to the end while fio writes and
/// verifies; the grown array assembles degraded in the new shape, every
/// block fio wrote reads back, and a member added afterwards is rebuilt
/// with every row's parity in agreement.
fn an_added_member_failing_mid_grow(level: &str, count: usize) {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..count).map(|i| format!("m{i}.img")).collect();
    create(d, level, &members, "32M");
    blank_mib(d, "new.img", 32);
    let node = ErrorFilterNode::up(d, "new.img", "error");
    let server = serve_with(d, &members, &["--reshape-speed", "12"]);
    let fio = fio_verify_grow(d, false);
    std::thread::sleep(Duration::from_millis(300));
    let grow = grow_cmd(d, count as u32 + 1, &node.uri());
    wait_grown_to(d, 1);
    node.fail();
    grow_finished(grow, count);
    fio_done(fio);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains("a member the grow added, marked faulty"),
        "{log}"
    );
    server.interrupt();
    drop(node);
    recorded_with_the_added_member_faulty(d, &members, "new.img");
    // Served degraded: fio finds every block it wrote.
    let server = serve(d, &members);
    fio_done(fio_verify_grow(d, true));
    server.interrupt();
    // A blank member rebuilt into the missing role: check is clean, and
    // fio finds every block again.
    blank_mib(d, "spare.img", 32);
    let mut add = vec!["add", "--new", "spare.img"];
    add.extend(members.iter().map(String::as_str));
    ok(&add, d);
    let mut whole = members.clone();
    whole.push("spare.img".into());
    assert_checks_clean(d, &whole, "after the degraded online grow and a rebuild");
    let server = serve(d, &whole);
    fio_done(fio_verify_grow(d, true));
    server.interrupt();
}

#[test]
fn an_added_member_failing_mid_online_grow_is_recorded_faulty_and_the_raid5_grows_degraded() {
    an_added_member_failing_mid_grow("5", 4);
}

#[test]
fn an_added_member_failing_mid_online_grow_is_recorded_faulty_and_the_raid6_grows_degraded() {
    an_added_member_failing_mid_grow("6", 5);
}

/// RAID 10 near: the added member's chunks keep their other copy in the
/// new shape, so the grow goes on the same way.
#[test]
fn an_added_member_failing_mid_online_grow_is_recorded_faulty_and_the_raid10_grows_degraded() {
    an_added_member_failing_mid_grow("10", 4);
}

/// A client's write below the position (in the new shape) whose write to
/// the added member fails: the member is recorded faulty and the write
/// succeeds through the parity (it returned EIO before, the member left
/// in use, the stripe's parity not matching its data). The grow waits
/// while a reader keeps the clients busy (`--reshape-speed 0:8`), so the
/// client's write is the first to reach the failing member; the grow
/// then finishes degraded and every byte, the write's included, reads
/// back.
#[test]
fn a_new_shape_write_failing_on_an_added_member_fails_the_member_not_the_write() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (members, size, mut data, node, server, grow) = growing_onto_a_failing_member(d, 0x5c);
    // A reader past the position keeps the clients busy: the grow, whose
    // minimum is 0, stops stepping.
    let mut reader = busy_reader(d);
    let started = Instant::now();
    let paused = loop {
        let p = position(d);
        std::thread::sleep(Duration::from_millis(400));
        if position(d) == p {
            break p;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the grow did not wait for the busy clients"
        );
    };
    assert!(paused >= 2 << 20, "{paused}");
    node.fail();
    // 1 MiB at 0: new-shape stripes whose data or parity lies on the
    // added member.
    let new: Vec<u8> = (0..1u64 << 20).map(|i| (i % 241) as u8 ^ 0xa7).collect();
    std::fs::write(d.join("new.bin"), &new).unwrap();
    let copied = Command::new(tool("nbdcopy"))
        .arg(d.join("new.bin"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .output()
        .unwrap();
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        copied.status.success(),
        "the write failed on the added member instead of failing it: {}\n{log}",
        String::from_utf8_lossy(&copied.stderr)
    );
    assert_eq!(
        position(d),
        paused,
        "a step ran while the clients were busy: the write was not the first to fail"
    );
    assert!(
        log.contains("a member the grow added, marked faulty"),
        "{log}"
    );
    data[..new.len()].copy_from_slice(&new);
    let _ = reader.kill();
    let _ = reader.wait();
    grow_finished(grow, members.len());
    let got = Command::new(tool("nbdcopy"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .arg("-")
        .output()
        .unwrap();
    assert!(got.status.success());
    // The served array took the grown shape (degraded) at the end: a new
    // connection is told the grown size, its new region zeros.
    assert_eq!(got.stdout.len() as u64, size / 3 * 4, "the served size");
    assert!(
        got.stdout[..size as usize] == data[..],
        "a byte changed across the degraded grow"
    );
    assert!(got.stdout[size as usize..].iter().all(|&b| b == 0));
    server.interrupt();
    drop(node);
    recorded_with_the_added_member_faulty(d, &members, "new.img");
    let mut read = vec!["read"];
    read.extend(members.iter().map(String::as_str));
    let all = ok_bytes(&read, d);
    assert_eq!(all.len() as u64, size / 3 * 4);
    assert!(
        all[..size as usize] == data[..],
        "the degraded grown array reads another byte"
    );
}

/// A server killed (SIGKILL) after a member its grow added was recorded
/// faulty: the old members record the reshape at its last position with
/// that slot faulty, the added member its own older superblock. `grow
/// --continue` given the failed one too refuses it by name, nothing
/// written (its rows are stale); given the old members it finishes the
/// grow degraded, and every byte acknowledged, the write that failed it
/// included, reads back.
#[test]
fn a_server_killed_after_an_added_member_failed_leaves_a_grow_continue_finishes_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (members, size, mut data, node, mut server, grow) = growing_onto_a_failing_member(d, 0x3c);
    let mut reader = busy_reader(d);
    std::thread::sleep(Duration::from_millis(600));
    node.fail();
    let new: Vec<u8> = (0..1u64 << 20).map(|i| (i % 239) as u8 ^ 0x6b).collect();
    std::fs::write(d.join("new.bin"), &new).unwrap();
    let copied = Command::new(tool("nbdcopy"))
        .arg(d.join("new.bin"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .output()
        .unwrap();
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    data[..new.len()].copy_from_slice(&new);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains("a member the grow added, marked faulty"),
        "{log}"
    );
    server.kill().unwrap();
    server.wait().unwrap();
    // The grow command loses its server.
    let _ = grow.wait_with_output();
    let _ = reader.kill();
    let _ = reader.wait();
    drop(node);
    let sb = superblock(d, "m0.img");
    assert_ne!(sb["feature_map"].as_u64().unwrap() & 4, 0, "{sb}");
    // Given with the others, the failed member is refused by name,
    // nothing written: its rows are stale.
    let mut cont = vec!["grow", "--continue"];
    cont.extend(members.iter().map(String::as_str));
    let mut with_it = cont.clone();
    with_it.push("new.img");
    refused(&with_it, d, &["new.img takes no part in the reshape"]);
    let out = nvraid(&cont, d);
    assert!(
        out.status.success(),
        "grow --continue: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    recorded_with_the_added_member_faulty(d, &members, "new.img");
    let mut read = vec!["read"];
    read.extend(members.iter().map(String::as_str));
    let got = ok_bytes(&read, d);
    assert_eq!(got.len() as u64, size / 3 * 4);
    assert!(
        got[..size as usize] == data[..],
        "a byte changed across the killed degraded grow"
    );
}

/// The kernel's md assembles a RAID 5 whose added member failed part-way
/// through its online grow (the grow finished degraded, the server then
/// stopped): it takes the record of the old members (five roles, the
/// fifth faulty) and leaves the failed member's stale superblock out,
/// reads the pattern, rebuilds that image added back blank, and its check
/// then finds no parity mismatch.
#[test]
fn the_kernel_assembles_a_raid5_grown_online_degraded_after_its_added_member_failed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    let per = 14 * MIB; // what each 15 MiB member holds past its data offset
    let mut args = vec!["create", "--level", "5", "--size", "15M"];
    args.extend(names.iter().map(String::as_str));
    ok(&args, d);
    std::fs::write(d.join("data"), pattern(3 * per)).unwrap();
    let mut args = vec!["write", "--input", "data"];
    args.extend(names.iter().map(String::as_str));
    ok(&args, d);
    std::fs::remove_file(d.join("data")).unwrap();
    blank_mib(d, "d4", 16);
    let node = ErrorFilterNode::up(d, "d4", "error");
    let server = serve_with(d, &names, &["--reshape-speed", "8"]);
    let grow = grow_cmd(d, 5, &node.uri());
    wait_grown_to(d, 2 * MIB);
    node.fail();
    grow_finished(grow, 4);
    server.interrupt();
    drop(node);
    recorded_with_the_added_member_faulty(d, &names, "d4");
    let script = d.join("check.sh");
    std::fs::write(
        &script,
        format!(
            r#"set +e
mdadm --assemble --scan --run 2>&1
echo 200000 > /proc/sys/dev/raid/speed_limit_min
echo 2000000 > /proc/sys/dev/raid/speed_limit_max
cat /proc/mdstat
sys=$(ls -d /sys/block/md* | head -1); md=/dev/${{sys##*/}}
before="disks=$(cat $sys/md/raid_disks) degraded=$(cat $sys/md/degraded) size=$(blockdev --getsize64 $md)"
if pattern verify -n {bytes} $md; then pv=ok; else pv=FAILED; fi
mdadm --zero-superblock /dev/vde 2>&1
mdadm $md --add /dev/vde 2>&1
sleep 1; mdadm --wait $md >/dev/null 2>&1
i=0; while grep -q -e recovery -e resync /proc/mdstat && [ $i -lt 240 ]; do sleep 1; i=$((i+1)); done
echo check > $sys/md/sync_action; sleep 1; mdadm --wait $md >/dev/null 2>&1
cat /proc/mdstat
echo "KERNEL $before pattern=$pv after_degraded=$(cat $sys/md/degraded) mismatch=$(cat $sys/md/mismatch_cnt)"
"#,
            bytes = 3 * per
        ),
    )
    .unwrap();
    let images: Vec<std::path::PathBuf> = names
        .iter()
        .chain([&"d4".to_string()])
        .map(|n| d.join(n))
        .collect();
    let out = mdvm_on("mdvm", "6.1", &[])
        .arg("--snapshot")
        .arg("--script")
        .arg(&script)
        .args(&images)
        .output()
        .expect("tools/mdvm/mdvm (./test.sh installs its tools)");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = report
        .lines()
        .find(|l| l.starts_with("KERNEL "))
        .unwrap_or_else(|| panic!("no report:\n{report}"));
    assert_eq!(
        line,
        format!(
            "KERNEL disks=5 degraded=1 size={} pattern=ok after_degraded=0 mismatch=0",
            4 * per
        ),
        "\n{report}"
    );
}

/// fio's verified writes through NBD while a served array grows (or the
/// read pass checking them).
fn fio_verify_grow(dir: &Path, verify_only: bool) -> Child {
    fio_verify(dir, "grow", 2000, 7, verify_only)
}

// ---- Online --size ----

fn size_data_members(level: &str, count: u64) -> u64 {
    match level {
        "1" => 1,
        "10" => count / 2,
        "6" => count - 2,
        _ => count - 1,
    }
}

/// A RAID `level` of `count` 15 MiB members (14 MiB of each used) with
/// md's bitmap, filled with the pattern: the members and the array's size.
fn size_filled(dir: &Path, level: &str, count: usize) -> (Vec<String>, u64) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", level, "--bitmap", "internal", "--size", "15M", "--force",
    ];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let size = size_data_members(level, count as u64) * 14 * MIB;
    std::fs::write(dir.join("data"), pattern(size)).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, size)
}

/// Every member file grows by `mib` MiB of bytes that are no array's (the
/// new region's copies and parity disagree until it is resynced).
fn size_grow_files(dir: &Path, members: &[String], mib: u64) {
    use std::io::Write;
    for (i, name) in members.iter().enumerate() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(name))
            .unwrap();
        let junk: Vec<u8> = (0..mib * MIB)
            .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8 * 7 + 1))
            .collect();
        f.write_all(&junk).unwrap();
    }
}

fn size_cmd(dir: &Path, size: &str, force: bool) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvraid"));
    c.current_dir(dir)
        .args(["grow", "--socket", &control(dir), "--size", size]);
    if force {
        c.arg("--force");
    }
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The size a new NBD connection to the served array is told.
fn nbd_size(dir: &Path) -> u64 {
    let out = Command::new(tool("nbdinfo"))
        .arg("--size")
        .arg(format!(
            "nbd+unix:///?socket={}",
            dir.join("md.sock").display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Everything a new NBD connection reads.
fn nbd_read_all(dir: &Path) -> Vec<u8> {
    let out = Command::new(tool("nbdcopy"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            dir.join("md.sock").display()
        ))
        .arg("-")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Poll `status` until the served array's size change resyncs its new
/// region part-way, past array byte `past` (the resync counts from the
/// old end, `from`); the status. The resync is shown where a dirty
/// array's is (`array.resync`, its position, rate and ETA), not as a
/// reshape.
fn wait_size_resync_past(dir: &Path, from: u64, past: u64) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let s = status(dir);
        assert!(s["array"]["reshape"].is_null(), "{s}");
        let r = &s["array"]["resync"];
        let (done, total) = (
            r["done_bytes"].as_u64().unwrap_or(0),
            r["total_bytes"].as_u64().unwrap_or(0),
        );
        if r["finished"] == false && from + done > past && done < total {
            for field in ["rate_bytes_per_second", "eta_seconds", "resynced_bytes"] {
                assert!(r[field].is_number(), "{field}: {s}");
            }
            assert!(r["error"].is_null(), "{s}");
            return s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no resync of the new region part-way past {past}: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// qemu-io writes `count` 4 KiB blocks, each its own byte, at random
/// places of `[from, data.len())` of the served array; every write must be
/// acknowledged. `data` gets them; the blocks written are returned.
fn write_new_region(dir: &Path, from: u64, count: u64, seed: u64, data: &mut [u8]) -> Vec<u64> {
    let (first, blocks) = (from / 4096, data.len() as u64 / 4096);
    let mut rng = seed;
    let mut qemu_io = Command::new(tool("qemu-io"));
    qemu_io.args(["-f", "raw"]);
    let mut writes = Vec::new();
    for i in 0..count {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let b = first + rng % (blocks - first);
        let byte = (i % 250 + 1) as u8;
        qemu_io.args(["-c", &format!("write -P {byte} {} 4096", b * 4096)]);
        writes.push((b, byte));
    }
    let out = qemu_io
        .arg(format!(
            "nbd+unix:///?socket={}",
            dir.join("md.sock").display()
        ))
        .output()
        .expect("qemu-io (qemu-utils)");
    let acked = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("wrote 4096/4096"))
        .count();
    assert_eq!(
        acked,
        writes.len(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for &(b, byte) in &writes {
        data[(b * 4096) as usize..((b + 1) * 4096) as usize].fill(byte);
    }
    writes.into_iter().map(|(b, _)| b).collect()
}

/// `got` holds the pattern below `old` and every block in `written` as
/// `data` has it.
fn assert_holds(got: &[u8], data: &[u8], old: u64, written: &[u64], what: &str) {
    assert!(got.len() >= data.len(), "{what}: {} bytes read", got.len());
    assert!(
        got[..old as usize] == data[..old as usize],
        "{what}: the old bytes changed"
    );
    for &b in written {
        let r = (b * 4096) as usize..((b + 1) * 4096) as usize;
        assert!(
            got[r.clone()] == data[r],
            "{what}: block {b} written in the new region lost"
        );
    }
}

fn member_hashes(dir: &Path, members: &[String]) -> Vec<String> {
    members
        .iter()
        .map(|m| sha(&std::fs::read(dir.join(m)).unwrap()))
        .collect()
}

/// The bytes [`switch_writer`] writes.
const SWITCH_BYTES: u64 = 4 * MIB;

/// fio writing the first [`SWITCH_BYTES`] through NBD at random, 400
/// IOPS 16 deep (about 2.5 s), then verifying every block it wrote.
fn switch_writer(dir: &Path) -> Child {
    let mut fio = fio_nbd(dir, "switch");
    fio.args([
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--size=4m",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--do_verify=1",
        "--rate_iops=400",
        "--output-format=json",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("fio")
}

/// A [`switch_writer`] wrote and verified all it wrote, with no error.
fn switch_writer_done(fio: Child) {
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed across the switch: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= SWITCH_BYTES,
        "fio verified less than it wrote: {job}"
    );
}

/// `--size max` on a served RAID 5, 6, 1 and 10 after every member file
/// grew by 8 MiB, fio writing across the switch: the server answers once
/// the superblocks record the new size, a new NBD connection is told it, blocks written into the new
/// region while its resync runs read back, the command follows the
/// resync to its end, and once stopped the array records the new size,
/// clean, with every copy and parity in agreement.
#[test]
fn size_max_on_a_served_array_raises_it_and_resyncs_the_new_region_while_clients_write() {
    for (level, count) in [("5", 4), ("6", 4), ("1", 2), ("10", 4)] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, old) = size_filled(d, level, count);
        let grown = size_data_members(level, count as u64) * 22 * MIB;
        let server = serve_with(d, &m, &["--reshape-speed", "0:4"]);
        assert_eq!(nbd_size(d), old, "raid{level}");
        size_grow_files(d, &m, 8);
        // fio writes (and then verifies) the first 4 MiB across the
        // switch: requests held at its gate and let through.
        let fio = switch_writer(d);
        std::thread::sleep(Duration::from_millis(500));
        let cmd = size_cmd(d, "max", false);
        let s = wait_size_resync_past(d, old, old);
        assert_eq!(
            old + s["array"]["resync"]["total_bytes"].as_u64().unwrap(),
            grown,
            "raid{level}: {s}"
        );
        assert_eq!(nbd_size(d), grown, "raid{level}: a new connection's size");
        switch_writer_done(fio);
        let mut data = pattern(old);
        // fio verified its own blocks.
        data[..SWITCH_BYTES as usize].copy_from_slice(&nbd_read_all(d)[..SWITCH_BYTES as usize]);
        data.resize(grown as usize, 0);
        let written = write_new_region(d, old, 64, 0x9e37 + count as u64, &mut data);
        assert_holds(
            &nbd_read_all(d),
            &data,
            old,
            &written,
            &format!("raid{level} mid-resync"),
        );
        let out = cmd.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("resized online") && text.contains("resynced"),
            "raid{level}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = status(d);
        assert_eq!(s["array"]["resync"]["finished"], true, "raid{level}: {s}");
        assert_eq!(
            s["array"]["resync"]["done_bytes"], s["array"]["resync"]["total_bytes"],
            "raid{level}: {s}"
        );
        assert!(s["array"]["reshape"].is_null(), "raid{level}: {s}");
        assert_holds(
            &nbd_read_all(d),
            &data,
            old,
            &written,
            &format!("raid{level} resynced"),
        );
        server.interrupt();
        let det = detail(d, &m);
        assert_eq!(det["size_bytes"], grown, "raid{level}: {det}");
        assert_eq!(det["state"], "clean", "raid{level}: {det}");
        assert_checks_clean(d, &m, &format!("raid{level} after the online --size max"));
        assert_holds(
            &read(d, &m, grown),
            &data,
            old,
            &written,
            &format!("raid{level} offline"),
        );
    }
}

/// A larger `--size SIZE` (not max) on a served RAID 5: the array uses
/// that much of each member, no more.
#[test]
fn a_larger_size_on_a_served_raid5_uses_that_much_of_each_member() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, old) = size_filled(d, "5", 4);
    let server = serve(d, &m);
    size_grow_files(d, &m, 8);
    let out = size_cmd(d, "18M", false).wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(nbd_size(d), 3 * 18 * MIB);
    let got = nbd_read_all(d);
    assert!(got[..old as usize] == pattern(old)[..]);
    server.interrupt();
    let det = detail(d, &m);
    assert_eq!(det["size_bytes"], 3 * 18 * MIB, "{det}");
    assert_checks_clean(d, &m, "after the online --size 18M");
}

/// A smaller size on a served array: refused without `--force`, naming
/// the filesystem check, no member byte changed; with it, a new connection
/// is told the smaller size at once, a connection made before gets an
/// error past the new end, and the superblocks record it.
#[test]
fn a_smaller_size_on_a_served_array_needs_force_and_cuts_the_served_size_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, old) = size_filled(d, "5", 4);
    let server = serve(d, &m);
    let before = member_hashes(d, &m);
    let stderr = refusal(&["grow", "--socket", &control(d), "--size", "10M"], d);
    for needle in ["cuts off", "resize2fs", "xfs cannot shrink", "--force"] {
        assert!(stderr.contains(needle), "{stderr}");
    }
    assert_eq!(
        member_hashes(d, &m),
        before,
        "a refused shrink changed a member"
    );
    assert_eq!(nbd_size(d), old);
    // A connection made before the cut, reading past the new end after it.
    let early = Command::new(tool("qemu-io"))
        .args(["-f", "raw", "-c", "sleep 3000", "-c"])
        .arg(format!("read {} 4096", 40 * MIB))
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = size_cmd(d, "10M", true).wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("past the new end fail"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(nbd_size(d), 30 * MIB);
    let early_out = early.wait_with_output().unwrap();
    let early_text = format!(
        "{}{}",
        String::from_utf8_lossy(&early_out.stdout),
        String::from_utf8_lossy(&early_out.stderr)
    );
    assert!(
        !early_text.contains("read 4096/4096"),
        "a read past the new end succeeded: {early_text}"
    );
    let got = nbd_read_all(d);
    assert!(got[..] == pattern(old)[..30 * MIB as usize]);
    server.interrupt();
    let det = detail(d, &m);
    assert_eq!(det["size_bytes"], 30 * MIB, "{det}");
    assert_eq!(det["state"], "clean", "{det}");
    assert_checks_clean(d, &m, "after the online shrink");
}

/// What md refuses, or nvraid cannot do on a served array, is refused by
/// name with no member byte changed: RAID 0, md's partial parity log, a
/// degraded array, a size larger than the members hold, nothing to change,
/// a reshape or a rebuild running, and a second size change while the
/// first one's resync runs.
#[test]
fn size_changes_refused_on_a_served_array_name_the_reason_and_change_nothing() {
    let refused_served = |d: &Path, m: &[String], size: &str, needles: &[&str]| {
        let before = member_hashes(d, m);
        let stderr = refusal(&["grow", "--socket", &control(d), "--size", size], d);
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "--size {size}: {stderr:?} lacks {needle:?}"
            );
        }
        said_once(&stderr);
        assert_eq!(
            member_hashes(d, m),
            before,
            "--size {size} changed a member"
        );
    };
    // RAID 0.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r0: Vec<String> = (0..2).map(|i| format!("z{i}")).collect();
    ok(
        &with(&["create", "--level", "0", "--size", "15M", "--force"], &r0),
        d,
    );
    let server = serve(d, &r0);
    size_grow_files(d, &r0, 4);
    refused_served(d, &r0, "max", &["raid0", "cannot be resized"]);
    server.interrupt();
    // md's partial parity log.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p: Vec<String> = (0..3).map(|i| format!("p{i}")).collect();
    ok(
        &with(
            &[
                "create",
                "--level",
                "5",
                "--consistency-policy",
                "ppl",
                "--size",
                "15M",
                "--force",
            ],
            &p,
        ),
        d,
    );
    let server = serve(d, &p);
    size_grow_files(d, &p, 4);
    refused_served(d, &p, "max", &["partial parity log"]);
    server.interrupt();
    // Larger than the members hold, nothing to change, degraded.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, _) = size_filled(d, "5", 4);
    let server = serve(d, &m);
    refused_served(d, &m, "max", &["nothing to change", "larger first"]);
    refused_served(d, &m, "20M", &["--size", "holds only"]);
    server.interrupt();
    let server = serve(d, &m[..3]);
    size_grow_files(d, &m[..3], 4);
    refused_served(d, &m[..3], "max", &["degraded"]);
    server.interrupt();
    // A reshape running (a grow by a member, paced slow), then a rebuild.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, _) = size_filled(d, "5", 4);
    blank_mib(d, "new.img", 15);
    let server = serve_with(d, &m, &["--reshape-speed", "0:1", "--rebuild-speed", "1:1"]);
    size_grow_files(d, &m, 4);
    let grow = grow_cmd(d, 5, "new.img");
    wait_reshape_past(d, 0);
    refused_served(d, &m, "max", &["reshape runs"]);
    server.interrupt();
    let _ = grow.wait_with_output();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, _) = size_filled(d, "5", 4);
    blank_mib(d, "spare.img", 15);
    let server = serve_with(d, &m, &["--rebuild-speed", "1:1"]);
    ok(&["fail", "--socket", &control(d), "--member", "d1"], d);
    ok(&["remove", "--socket", &control(d), "--member", "d1"], d);
    ok(&["add", "--socket", &control(d), "--new", "spare.img"], d);
    size_grow_files(d, &m, 4);
    // The rebuild writes the members meanwhile: the size is what must
    // not change.
    let before = nbd_size(d);
    let stderr = refusal(&["grow", "--socket", &control(d), "--size", "max"], d);
    assert!(stderr.contains("rebuild"), "{stderr}");
    said_once(&stderr);
    assert_eq!(nbd_size(d), before);
    assert_eq!(
        status(d)["array"]["reshape"],
        serde_json::Value::Null,
        "{}",
        status(d)
    );
    server.interrupt();
    // A second change while the first one's resync runs.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, old) = size_filled(d, "5", 4);
    let server = serve_with(d, &m, &["--reshape-speed", "0:2"]);
    size_grow_files(d, &m, 8);
    let cmd = size_cmd(d, "max", false);
    wait_size_resync_past(d, old, old);
    let stderr = refusal(&["grow", "--socket", &control(d), "--size", "16M"], d);
    assert!(stderr.contains("resync"), "{stderr}");
    drop(cmd);
    server.interrupt();
}

/// serve killed (the failpoint `size-superblocks`: every superblock
/// records the new size, the shape not yet swapped), then killed again
/// (SIGKILL) part-way through the new region's resync with blocks written
/// there acknowledged: each next `serve` assembles at the new size and
/// resyncs what is left from the recorded `resync_offset`; every block
/// reads back, and the finished array is clean with no mismatch.
#[test]
fn a_served_size_change_killed_after_its_superblocks_and_mid_resync_resumes_at_the_new_size() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, old) = size_filled(d, "5", 4);
    let grown = 3 * 22 * MIB;
    let mut server = serve_env(d, &m, &[], &[("NVRAID_FAILPOINT", "size-superblocks:1")]);
    size_grow_files(d, &m, 8);
    let out = size_cmd(d, "max", false).wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let status_code = server.wait().unwrap();
    assert!(!status_code.success());
    assert!(
        serve_log(d).contains("failpoint size-superblocks"),
        "{}",
        serve_log(d)
    );
    let det = detail(d, &m);
    assert_eq!(
        det["size_bytes"], grown,
        "the superblocks record the new size: {det}"
    );
    assert_ne!(
        det["state"], "clean",
        "the new region awaits its resync: {det}"
    );
    // Served again, slowly: the resync resumes at the old end; killed
    // part-way (no client wrote: the checkpoint is the resync's own).
    let mut server = serve_with(d, &m, &["--resync-speed", "2"]);
    assert_eq!(nbd_size(d), grown);
    std::thread::sleep(Duration::from_millis(2500));
    server.kill().unwrap();
    server.wait().unwrap();
    let log = serve_log(d);
    assert!(log.contains(&format!("resyncing from byte {old}")), "{log}");
    let resumed_at = |log: &str| -> u64 {
        log.split("resyncing from byte ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{log}"))
    };
    // From the checkpoint the killed resync left; clients write into the
    // new region (acknowledged), and it is killed again.
    let mut server = serve_with(d, &m, &["--resync-speed", "2"]);
    let from = resumed_at(&serve_log(d));
    assert!(
        from > old && from < grown,
        "resumed at {from}: {}",
        serve_log(d)
    );
    let mut data = pattern(old);
    data.resize(grown as usize, 0);
    let written = write_new_region(d, old, 48, 0x51ce, &mut data);
    std::thread::sleep(Duration::from_millis(500));
    server.kill().unwrap();
    server.wait().unwrap();
    let det = detail(d, &m);
    assert_eq!(det["size_bytes"], grown, "{det}");
    assert_ne!(det["state"], "clean", "{det}");
    // Once more, to the end (the clients wrote: from the bitmap's marks).
    let server = serve(d, &m);
    wait_resynced(d);
    assert_holds(&nbd_read_all(d), &data, old, &written, "after the kills");
    server.interrupt();
    let det = detail(d, &m);
    assert_eq!(det["state"], "clean", "{det}");
    assert_checks_clean(d, &m, "after a size change killed twice");
    assert_holds(
        &read(d, &m, grown),
        &data,
        old,
        &written,
        "offline after the kills",
    );
}

/// A member failed (`nvraid fail --socket`) while the new region is
/// resynced: the server goes on degraded; every block written into the new
/// region before and after reads back, served and offline (their stripes'
/// parity was computed from the data, never trusted from the grown
/// devices); a blank member rebuilt into the role leaves every parity in
/// agreement and every block in place.
#[test]
fn a_member_failing_during_the_new_regions_resync_keeps_every_written_block() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, old) = size_filled(d, "5", 4);
    let grown = 3 * 22 * MIB;
    let server = serve_with(d, &m, &["--reshape-speed", "0:2"]);
    size_grow_files(d, &m, 8);
    let cmd = size_cmd(d, "max", false);
    wait_size_resync_past(d, old, old);
    let mut data = pattern(old);
    data.resize(grown as usize, 0);
    let mut written = write_new_region(d, old, 48, 0xfa11, &mut data);
    ok(&["fail", "--socket", "md.ctl", "--member", "d3"], d);
    written.extend(write_new_region(d, old, 48, 0xfa12, &mut data));
    assert_holds(&nbd_read_all(d), &data, old, &written, "degraded, served");
    let out = cmd.wait_with_output().unwrap();
    let s = status(d);
    assert!(
        s["array"]["resync"]["finished"] == true || s["array"]["resync"]["error"].is_string(),
        "{s}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_holds(
        &nbd_read_all(d),
        &data,
        old,
        &written,
        "degraded, after the resync",
    );
    server.interrupt();
    let three = &m[..3];
    assert_holds(
        &read(d, three, grown),
        &data,
        old,
        &written,
        "degraded, offline",
    );
    blank_mib(d, "spare.img", 23);
    ok(&with(&["add", "--new", "spare.img"], three), d);
    let mut whole = three.to_vec();
    whole.push("spare.img".into());
    assert_checks_clean(d, &whole, "after the degraded resync and a rebuild");
    assert_holds(&read(d, &whole, grown), &data, old, &written, "rebuilt");
}

/// The kernel's md (tools/mdvm) assembles a RAID 5 whose size was raised
/// online, once with the resync finished and once killed part-way through
/// it: the new size, the pattern, and no mismatch after its check.
#[test]
fn the_kernel_assembles_a_raid5_resized_online_finished_and_killed_mid_resync() {
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for (name, kill) in [("done", false), ("killed", true)] {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let (m, old) = size_filled(&sub, "5", 4);
        let mut server = serve_with(&sub, &m, &["--reshape-speed", "0:2"]);
        size_grow_files(&sub, &m, 8);
        let cmd = size_cmd(&sub, "max", false);
        if kill {
            wait_size_resync_past(&sub, old, old + MIB);
            server.kill().unwrap();
            server.wait().unwrap();
            let _ = cmd.wait_with_output();
        } else {
            let out = cmd.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            server.interrupt();
        }
        images.extend(m.iter().map(|n| sub.join(n)));
    }
    let report = kernel_finishes(&images, 3 * 14 * MIB);
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 2, "two arrays expected:\n{report}");
    for line in lines {
        assert!(
            line.contains(&format!("size={}", 3 * 22 * MIB))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("degraded=0"),
            "{line}\n{report}"
        );
    }
    assert!(report.contains("STALE_BITMAPS 0"), "{report}");
}
