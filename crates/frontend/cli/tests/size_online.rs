//! Failures of the members a served grow adds: an added member failing
//! mid-grow (in a step, a superblock update or a client's request) is
//! recorded faulty on the others and the RAID 5/6 grows degraded, as md's
//! does; a client's new-shape write that fails on it succeeds through the
//! parity instead of returning EIO.

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

/// `grow --socket CTL --size ...` is not done online yet: refused before
/// the server is asked anything, naming the offline command, instead of
/// asking for `--raid-devices` as a member grow would.
#[test]
fn size_on_a_served_array_is_refused_naming_the_offline_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    refused(
        &["grow", "--socket", "md.ctl", "--size", "max"],
        d,
        &["not changed online yet", "nvraid grow --size SIZE MEMBERS"],
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
