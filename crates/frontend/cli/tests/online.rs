//! Recovery while `nvraid serve` runs: a member failed and replaced through
//! the control socket while fio writes and verifies through NBD, a hot spare
//! that takes over by itself, a rebuild killed half-way that resumes after
//! the restart, and `remove`. Every test ends with `check` finding the
//! copies equal, and the kernel reading the same bytes.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn status(dir: &Path) -> serde_json::Value {
    let control = dir.join("md.ctl");
    serde_json::from_str(&ok(
        &["status", "--json", "--socket", control.to_str().unwrap()],
        dir,
    ))
    .unwrap()
}

/// Wait until the server reports the rebuild finished (or fail the test
/// with its status after `limit`).
fn wait_rebuilt(dir: &Path, limit: Duration) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let s = status(dir);
        let rebuild = &s["array"]["recovery"]["rebuild"];
        if rebuild["finished"] == true {
            return s;
        }
        assert!(rebuild["error"].is_null(), "{s}");
        assert!(started.elapsed() < limit, "rebuild not finished: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(server: Served) {
    server.interrupt();
}

fn control(dir: &Path) -> String {
    dir.join("md.ctl").display().to_string()
}

fn fio_verify(dir: &Path) -> Child {
    fio_nbd(dir, "online")
        .args(FIO_VERIFY_JOB)
        .args([
            "--size=24m",
            "--offset_increment=24m",
            "--rate_iops=3000",
            "--do_verify=1",
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio (apt-get install fio)")
}

fn fio_done(fio: Child) {
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 48 << 20,
        "{job}"
    );
}

fn assert_in_sync(dir: &Path, members: &[&str]) -> String {
    let mut args = vec!["check", "--json"];
    args.extend(members);
    let out = nvraid(&args, dir);
    assert_eq!(
        out.status.code(),
        Some(0),
        "copies differ: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mut args = vec!["detail", "--json"];
    args.extend(members);
    let d: serde_json::Value = serde_json::from_slice(&ok_bytes(&args, dir)).unwrap();
    assert_eq!(d["state"], "clean", "{d}");
    let mut args = vec!["read"];
    args.extend(members);
    sha(&ok_bytes(&args, dir))
}

#[test]
fn a_member_replaced_through_the_control_socket_is_rebuilt_while_fio_verifies() {
    tool("fio");
    for level in ["1", "10", "5", "6"] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let count = if level == "1" { 2 } else { 4 };
        let members: Vec<String> = (0..count).map(|i| format!("m{i}.img")).collect();
        let mut create = vec!["create", "--level", level, "--size", "64M", "--force"];
        create.extend(members.iter().map(String::as_str));
        ok(&create, d);
        std::fs::File::create(d.join("new.img"))
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let server = serve(d, &members);
        let fio = fio_verify(d);
        std::thread::sleep(Duration::from_millis(800));
        ok(&["fail", "--socket", &control(d), "--member", "m1.img"], d);
        ok(
            &["remove", "--socket", &control(d), "--member", "m1.img"],
            d,
        );
        ok(&["add", "--socket", &control(d), "--new", "new.img"], d);
        fio_done(fio);
        let s = wait_rebuilt(d, Duration::from_secs(60));
        let rebuild = &s["array"]["recovery"]["rebuild"];
        assert_eq!(rebuild["role"], 1, "{s}");
        assert_eq!(rebuild["member"], "new.img", "{s}");
        stop(server);
        let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
        assert!(log.contains("rebuilt while serving"), "{log}");
        let mut now: Vec<&str> = members.iter().map(String::as_str).collect();
        now[1] = "new.img";
        let sha = assert_in_sync(d, &now);
        if level == "1" {
            let images: Vec<_> = now.iter().map(|m| d.join(m)).collect();
            kernel_reads(&images, &[sha]);
        }
    }
}

#[test]
fn a_hot_spare_takes_over_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "1", "--size", "32M", "--spares", "1", "m0.img", "m1.img", "s.img",
        ],
        d,
    );
    let all: Vec<String> = ["m0.img", "m1.img", "s.img"].map(String::from).to_vec();
    let server = serve(d, &all);
    let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    let before = status(d);
    assert_eq!(
        before["array"]["recovery"]["spares"],
        serde_json::json!(["s.img"]),
        "{before}"
    );
    ok(&["fail", "--socket", &control(d), "--member", "m1.img"], d);
    let s = wait_rebuilt(d, Duration::from_secs(30));
    assert_eq!(
        s["array"]["recovery"]["spares"],
        serde_json::json!([]),
        "{s}"
    );
    assert_eq!(s["array"]["recovery"]["rebuild"]["member"], "s.img", "{s}");
    stop(server);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("hot spare s.img takes over role 1"), "{log}");
    assert_in_sync(d, &["m0.img", "s.img"]);
}

/// A rebuild paced to 4 MB/s is killed (SIGKILL) part-way; the next server
/// resumes it from the checkpoint in the new member's superblock, not from
/// the start.
#[test]
fn a_rebuild_killed_while_serving_resumes_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "1", "--size", "48M", "m0.img", "m1.img",
        ],
        d,
    );
    let data: Vec<u8> = (0..(47u32 << 20)).map(|i| (i % 253) as u8 ^ 0x33).collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    ok(&["write", "--input", "data.bin", "m0.img", "m1.img"], d);
    std::fs::File::create(d.join("new.img"))
        .unwrap()
        .set_len(48 << 20)
        .unwrap();
    let members = ["m0.img", "m1.img"].map(String::from).to_vec();
    let mut server = serve_with(d, &members, &["--rebuild-speed", "4:4"]);
    ok(&["fail", "--socket", &control(d), "--member", "m1.img"], d);
    ok(&["add", "--socket", &control(d), "--new", "new.img"], d);
    std::thread::sleep(Duration::from_millis(3500));
    let s = status(d);
    let done = s["array"]["recovery"]["rebuild"]["done_bytes"]
        .as_u64()
        .unwrap();
    assert!(done > 0 && done < 47 << 20, "{s}");
    server.kill().unwrap();
    server.wait().unwrap();
    // The new member's superblock holds a recovery checkpoint.
    let e: serde_json::Value =
        serde_json::from_slice(&ok_bytes(&["examine", "--json", "new.img"], d)).unwrap();
    let checkpoint = e[0]["superblock"]["recovery_offset"].as_u64().unwrap_or(0) * 512;
    assert!(checkpoint > 0, "{e}");
    let now = ["m0.img", "new.img"].map(String::from).to_vec();
    let server = serve(d, &now);
    let s = wait_rebuilt(d, Duration::from_secs(60));
    stop(server);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("rebuilt while serving"), "{log}");
    assert!(
        s["array"]["recovery"]["rebuild"]["copied_bytes"]
            .as_u64()
            .unwrap()
            <= (48 << 20) - checkpoint,
        "resumed from the checkpoint: {s}"
    );
    let sha_now = assert_in_sync(d, &["m0.img", "new.img"]);
    let mut expected = data.clone();
    expected.resize(sha_len(d), 0);
    assert_eq!(sha_now, sha(&expected));
}

fn sha_len(dir: &Path) -> usize {
    let d: serde_json::Value =
        serde_json::from_slice(&ok_bytes(&["detail", "--json", "m0.img", "new.img"], dir)).unwrap();
    d["size_bytes"].as_u64().unwrap() as usize
}

#[test]
fn bad_online_requests_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "1", "--size", "16M", "m0.img", "m1.img",
        ],
        d,
    );
    std::fs::File::create(d.join("small.img"))
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let server = serve(d, &["m0.img".into(), "m1.img".into()]);
    let ctl = control(d);
    let refused = |args: &[&str], needle: &str| {
        let out = nvraid(args, d);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    refused(
        &["remove", "--socket", &ctl, "--member", "m1.img"],
        "fail it first",
    );
    refused(
        &["add", "--socket", &ctl, "--new", "m1.img"],
        "already a working member",
    );
    refused(
        &[
            "replace",
            "--socket",
            &ctl,
            "--old",
            "m1.img",
            "--new",
            "small.img",
        ],
        "too small",
    );
    refused(
        &[
            "replace",
            "--socket",
            &ctl,
            "--old",
            "nope.img",
            "--new",
            "small.img",
        ],
        "not a working member",
    );
    let s = status(d);
    assert_eq!(s["array"]["state"], "clean", "nothing changed: {s}");
    stop(server);
}

/// md's re-add while serving: a member failed and removed comes back; only
/// the chunks written while it was away (the bitmap's) are copied to it.
#[test]
fn a_removed_member_is_re_added_while_serving_copying_only_what_it_missed() {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create",
            "--level",
            "1",
            "--size",
            "32M",
            "--bitmap-chunk",
            "1M",
            "m0.img",
            "m1.img",
        ],
        d,
    );
    let server = serve(d, &["m0.img".into(), "m1.img".into()]);
    ok(&["fail", "--socket", &control(d), "--member", "m1.img"], d);
    ok(
        &["remove", "--socket", &control(d), "--member", "m1.img"],
        d,
    );
    // 2 MiB written at 4 MiB while m1 is away: bitmap chunks 4 and 5.
    let fio = fio_nbd(d, "away")
        .args(["--rw=write", "--bs=64k", "--offset=4m", "--size=2m"])
        .output()
        .unwrap();
    assert!(
        fio.status.success(),
        "{}",
        String::from_utf8_lossy(&fio.stderr)
    );
    let reply: serde_json::Value = serde_json::from_str(&ok(
        &["add", "--json", "--socket", &control(d), "--new", "m1.img"],
        d,
    ))
    .unwrap();
    assert_eq!(reply["re_added"], true, "{reply}");
    let s = wait_rebuilt(d, Duration::from_secs(30));
    assert_eq!(
        s["array"]["recovery"]["rebuild"]["copied_bytes"],
        2u64 << 20,
        "{s}"
    );
    stop(server);
    assert_in_sync(d, &["m0.img", "m1.img"]);
}

/// `check` and `repair` through the control socket, beside the server's
/// clients: a planted difference is found (exit 5), rewritten, and gone.
#[test]
fn check_and_repair_run_inside_the_server() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "1", "--size", "16M", "m0.img", "m1.img",
        ],
        d,
    );
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 249) as u8).collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    ok(&["write", "--input", "data.bin", "m0.img", "m1.img"], d);
    let mut m1 = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("m1.img"))
        .unwrap();
    m1.seek(SeekFrom::Start((1 << 20) + (3 << 20))).unwrap();
    m1.write_all(&[0u8; 4096]).unwrap();
    drop(m1);
    let server = serve(d, &["m0.img".into(), "m1.img".into()]);
    let out = nvraid(&["check", "--json", "--socket", &control(d)], d);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(found["mismatch_sectors"], 8, "{found}");
    assert_eq!(
        found["regions"],
        serde_json::json!([[3u64 << 20, (3u64 << 20) + 4096]])
    );
    let repaired: serde_json::Value =
        serde_json::from_str(&ok(&["repair", "--json", "--socket", &control(d)], d)).unwrap();
    assert_eq!(repaired["repaired_sectors"], 8, "{repaired}");
    let again = nvraid(&["check", "--socket", &control(d)], d);
    assert_eq!(again.status.code(), Some(0));
    stop(server);
    let sha_now = assert_in_sync(d, &["m0.img", "m1.img"]);
    let d2: serde_json::Value =
        serde_json::from_slice(&ok_bytes(&["detail", "--json", "m0.img", "m1.img"], d)).unwrap();
    let mut expected = data;
    expected.resize(d2["size_bytes"].as_u64().unwrap() as usize, 0);
    assert_eq!(sha_now, sha(&expected));
}

/// A member missing while the array ran degraded (a disk left out at boot)
/// comes back with `serve --re-add`: assembly sets it aside (faulty in the
/// survivors' role table, its events behind), the server re-adds it by the
/// write-intent bitmap once it runs, and it recovers what it missed; every
/// byte written while it was away reads back with it in place. Without
/// `--re-add` it stays out.
#[test]
fn serve_re_add_puts_a_member_missing_at_the_last_start_back_by_the_bitmap() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create", "--level", "5", "--size", "32M", "m0", "m1", "m2", "m3",
        ],
        d,
    );
    let three: Vec<String> = ["m0", "m1", "m3"].iter().map(|s| s.to_string()).collect();
    let four: Vec<String> = ["m0", "m1", "m2", "m3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Degraded: m2 missing; 1 MiB written at 4 MiB.
    let server = serve(d, &three);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4099) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    let copied = Command::new("nbdcopy")
        .arg("--destination-is-zero")
        .arg("data")
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .current_dir(d)
        .status()
        .unwrap();
    assert!(copied.success());
    stop(server);

    // Without --re-add: m2 stays out.
    let server = serve(d, &four);
    assert_eq!(member_states(d)[2], "missing", "{:?}", member_states(d));
    stop(server);

    // With it: re-added in role 2 by the bitmap, recovered, in sync.
    let server = serve_with(d, &four, &["--re-add"]);
    let status = wait_rebuilt(d, Duration::from_secs(60));
    assert_eq!(member_states(d), ["active"; 4], "{status}");
    stop(server);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains("event=re-added member=m2 role=2 recovery=bitmap"),
        "{log}"
    );
    let mut read = vec!["read", "--offset", "0", "--length", "1048576"];
    read.extend(four.iter().map(String::as_str));
    // Read with m2 in the array and m0 left out: m2's blocks must be right.
    let mut degraded_read = vec!["read", "--offset", "0", "--length", "1048576"];
    degraded_read.extend(["m1", "m2", "m3"]);
    assert_eq!(ok_bytes(&read, d), data);
    assert_eq!(ok_bytes(&degraded_read, d), data);
    assert_checks_clean(d, &four, "after the re-add");
}

/// A RAID 5 stripe can cross the edge of a barrier region (4 MiB of the
/// array): with three 64 KiB data chunks, stripe 21 holds array bytes
/// [4032 KiB, 4224 KiB). A rebuild step beside clients must hold every
/// region its stripe touches from its reads to its write of the new
/// member; holding only the first let a client write to the stripe's far
/// side land on the new member in between, and the step's write then put
/// the old bytes back (the array read the old data there, and its parity
/// no longer matched). The rebuild pauses between reading stripe 21 and
/// writing it while the client writes there.
#[test]
fn a_client_write_across_a_barrier_region_edge_waits_for_the_rebuild_step_of_its_stripe() {
    // Stripe 21's data chunk 1 (array bytes [4096 KiB, 4160 KiB)) is on
    // role 0 (left-symmetric: parity on role 2, data from role 3 on), the
    // role the new member takes; its member offset is 21 chunks.
    client_write_during_a_paused_rebuild("16M", 21 * 64 * 1024, (4096 << 10, 128 << 10));
}

/// Beside idle clients, a rebuild reads the next step's first pieces
/// while it writes the last ones of the step it holds, before it holds
/// the next (16 MiB of the member per step while idle). A client write
/// that lands there between those reads and that hold must not be undone:
/// the hold sees that a write came and the pieces are read again. The
/// rebuild pauses before writing the first step's last piece (the next
/// step's first two are read by then) while the client writes the array
/// bytes of the next step's first piece (member bytes [16 MiB, 17 MiB),
/// stripes 256 to 271: array bytes [48 MiB, 51 MiB), every chunk of
/// which, role 0's data or parity among them, the write changes).
#[test]
fn a_client_write_between_a_rebuilds_read_ahead_and_its_hold_is_not_undone() {
    client_write_during_a_paused_rebuild("40M", (15 << 20) + 4096, (48 << 20, 3 << 20));
}

/// A RAID 5 of four file members of `size` (64 KiB chunks, no bitmap)
/// filled with a pattern, served; member 0 is failed, removed and
/// replaced by a blank one, whose rebuild pauses 3 s before writing the
/// piece holding member byte `pause_at`; meanwhile a client writes
/// `[at, at + len)` of the array through NBD. After the rebuild, the
/// array with the new member reads the client's bytes and checks clean.
fn client_write_during_a_paused_rebuild(size: &str, pause_at: u64, (at, len): (usize, usize)) {
    tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    let mut create = vec![
        "create", "--level", "5", "--chunk", "64K", "--bitmap", "none", "--size", size,
    ];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    let array_size = {
        let mut args = vec!["detail", "--json"];
        args.extend(members.iter().map(String::as_str));
        let detail: serde_json::Value = serde_json::from_slice(&ok_bytes(&args, d)).unwrap();
        detail["size_bytes"].as_u64().unwrap() as usize
    };
    let mut data: Vec<u8> = (0..array_size as u32)
        .map(|i| (i % 251) as u8 ^ 0x5c)
        .collect();
    std::fs::write(d.join("data.bin"), &data).unwrap();
    let mut write = vec!["write", "--input", "data.bin"];
    write.extend(members.iter().map(String::as_str));
    ok(&write, d);
    let member_len = std::fs::metadata(d.join("m0")).unwrap().len();
    std::fs::File::create(d.join("new"))
        .unwrap()
        .set_len(member_len)
        .unwrap();
    let pause = format!("rebuild-write:{pause_at}:3000");
    let server = serve_env(d, &members, &[], &[("NVRAID_PAUSE", &pause)]);
    ok(&["fail", "--socket", &control(d), "--member", "m0"], d);
    ok(&["remove", "--socket", &control(d), "--member", "m0"], d);
    ok(&["add", "--socket", &control(d), "--new", "new"], d);
    let started = Instant::now();
    while !std::fs::read_to_string(d.join("serve.log"))
        .unwrap()
        .contains("pause point rebuild-write reached")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the rebuild never reached member byte {pause_at}: {}",
            std::fs::read_to_string(d.join("serve.log")).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let wrote = fio_nbd(d, "during")
        .args([
            "--rw=write",
            "--bs=128k",
            "--buffer_pattern=0xa5",
            "--fsync=1",
        ])
        .arg(format!("--offset={at}"))
        .arg(format!("--size={len}"))
        .output()
        .expect("fio (apt-get install fio)");
    assert!(
        wrote.status.success(),
        "{}",
        String::from_utf8_lossy(&wrote.stderr)
    );
    data[at..at + len].fill(0xa5);
    wait_rebuilt(d, Duration::from_secs(60));
    stop(server);
    let now: Vec<String> = ["new", "m1", "m2", "m3"].map(String::from).to_vec();
    let mut read = vec!["read"];
    read.extend(now.iter().map(String::as_str));
    let back = ok_bytes(&read, d);
    assert!(
        back[at..at + len] == data[at..at + len],
        "the client's write was undone by the rebuild"
    );
    assert_eq!(sha(&back), sha(&data));
    assert_checks_clean(d, &now, "after the rebuild");
}
