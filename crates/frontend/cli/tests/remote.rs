//! NBD exports as members, end to end: arrays over nbdkit exports (mixed
//! with local files), served to fio through `nvraid serve`, with a node's
//! server killed or slowed mid-run, then a new node added and rebuilt.
//!
//! Needs nbdkit and fio (`./test.sh` installs them).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An nbdkit serving one file (or memory) on a unix socket.
struct Node {
    child: Child,
    socket: PathBuf,
}

impl Node {
    /// nbdkit's file plugin over `NAME.img` (created at `size` if missing).
    /// `extra` holds nbdkit options (those starting with `-`, such as
    /// `--filter=delay` or `-r`) and plugin or filter parameters (such as
    /// `wdelay=100ms`).
    fn file(dir: &Path, name: &str, size: u64, extra: &[&str]) -> Node {
        Node::serving(dir, name, name, size, extra)
    }

    /// nbdkit's file plugin over `IMAGE.img` (created at `size` if
    /// missing) at socket `SOCKET.sock`: another export may take a
    /// member's address.
    fn serving(dir: &Path, image: &str, socket: &str, size: u64, extra: &[&str]) -> Node {
        let file = dir.join(format!("{image}.img"));
        if !file.exists() {
            std::fs::File::create(&file).unwrap().set_len(size).unwrap();
        }
        let socket = dir.join(format!("{socket}.sock"));
        let _ = std::fs::remove_file(&socket);
        let mut args: Vec<String> = Vec::new();
        let (filters, params): (Vec<&str>, Vec<&str>) =
            extra.iter().partition(|a| a.starts_with('-'));
        args.extend(filters.iter().map(|s| s.to_string()));
        args.push("file".into());
        args.push(file.display().to_string());
        args.extend(params.iter().map(|s| s.to_string()));
        let child = Command::new("nbdkit")
            .arg("-f")
            .arg("-U")
            .arg(&socket)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit (./test.sh installs it)");
        let start = Instant::now();
        // Ready when it takes a connection: the socket file appears a
        // moment before nbdkit listens on it.
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nbdkit did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Node { child, socket }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn stop(mut server: Served) {
    let _ = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let status = server.wait().unwrap();
    assert!(status.success(), "serve exited with {status}");
}

/// RAID 10 over three NBD nodes and a local file. One node's server is
/// killed while fio writes through `nvraid serve` with crc32c verification:
/// fio sees no error, the member turns faulty. A new node is added through
/// the control socket and rebuilt while the server runs; afterwards every
/// copy matches (`check`) and fio's data verifies.
#[test]
fn raid10_over_nbd_nodes_survives_a_killed_node_and_rebuilds_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::file(d, &format!("node{i}"), 64 << 20, &[]))
        .collect();
    std::fs::File::create(d.join("local.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut members: Vec<String> = nodes.iter().map(Node::uri).collect();
    members.push(d.join("local.img").display().to_string());
    let mut create = vec!["create", "--level", "10"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    let examine = ok(&["examine", &members[1]], d);
    assert!(examine.contains("raid10"), "{examine}");

    let server = serve_with(d, &members, &["--nbd-timeout", "2s"]);
    let fio = fio_nbd(d, "write")
        .args(FIO_VERIFY_JOB)
        .args(["--size=24m", "--offset_increment=24m", "--rate_iops=3000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    nodes[1].kill();
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("err= 0"),
        "fio saw errors after a node died:\n{text}\n{}\nserve log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
    );
    assert_eq!(member_states(d)[1], "faulty");

    // A new node takes the role and is rebuilt online.
    let fresh = Node::file(d, "node1b", 64 << 20, &[]);
    ok(
        &["remove", "--socket", "md.ctl", "--member", &members[1]],
        d,
    );
    ok(&["add", "--socket", "md.ctl", "--new", &fresh.uri()], d);
    let start = Instant::now();
    loop {
        let states = member_states(d);
        if states.iter().all(|s| s == "active") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "rebuild did not finish: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let verify = fio_nbd(d, "write")
        .args(FIO_VERIFY_JOB)
        .args(["--size=24m", "--offset_increment=24m", "--verify_only"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success() && text.contains("err= 0"),
        "data did not verify after the rebuild:\n{text}"
    );
    stop(server);
    members[1] = fresh.uri();
    let mut check = vec!["check"];
    check.extend(members.iter().map(String::as_str));
    let out = ok(&check, d);
    assert!(out.contains(" 0 mismatched sectors"), "{out}");
}

/// A node that turns slow while the array runs (nbdkit's rate filter,
/// adjusted through its rate file to about 100 ms per 4 KiB request),
/// under a 40 ms request timeout: its requests time out, the member is
/// marked faulty, and the client writing and reading through the server
/// sees no error.
#[test]
fn a_node_that_turns_slow_is_marked_faulty_after_the_request_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rate_file = d.join("rate");
    let fast = Node::file(d, "fast", 32 << 20, &[]);
    let rate_param = format!("rate-file={}", rate_file.display());
    let slow = Node::file(
        d,
        "slow",
        32 << 20,
        &["--filter=rate", &rate_param, "burstiness=0.1"],
    );
    let members = vec![fast.uri(), slow.uri()];
    let mut create = vec!["create", "--level", "1"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    let server = serve_with(d, &members, &["--nbd-timeout", "40ms"]);
    // 4 KiB in 100 ms is about 330 kbit/s (written atomically, as the
    // filter asks).
    std::fs::write(d.join("rate.new"), "330K\n").unwrap();
    std::fs::rename(d.join("rate.new"), &rate_file).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = fio_nbd(d, "slow")
        .args(FIO_VERIFY_JOB)
        .args(["--size=4m", "--offset_increment=4m"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("err= 0"),
        "fio saw errors with a slow node:\n{text}\nserve log:\n{}",
        std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
    );
    assert_eq!(member_states(d), ["active", "faulty"]);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains("timed out") && log.contains("marked faulty"),
        "{log}"
    );
    stop(server);
}

/// A node slow from the start (nbdkit's delay filter, 100 ms per write)
/// under a 40 ms request timeout. Its superblock reads are quick, so it
/// assembles; the bitmap the writable assembly writes to every member
/// times out on it, and md's rule applies: it is marked faulty and the
/// server starts degraded, rather than refusing to start. The client sees
/// no error.
#[test]
fn a_node_slow_from_the_start_is_marked_faulty_and_the_server_starts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fast = Node::file(d, "fast", 32 << 20, &[]);
    let slow = Node::file(d, "slow", 32 << 20, &[]);
    let members = [fast.uri(), slow.uri()];
    let mut create = vec!["create", "--level", "1"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    drop(slow);
    let slow = Node::file(d, "slow", 32 << 20, &["--filter=delay", "wdelay=100ms"]);
    let members = vec![fast.uri(), slow.uri()];
    let server = serve_with(d, &members, &["--nbd-timeout", "40ms"]);
    let out = fio_nbd(d, "slow")
        .args(FIO_VERIFY_JOB)
        .args(["--size=4m", "--offset_increment=4m"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap_or_default();
    assert!(
        out.status.success() && text.contains("err= 0"),
        "fio saw errors with a slow node:\n{text}\nserve log:\n{log}"
    );
    assert_eq!(member_states(d), ["active", "faulty"]);
    assert!(log.contains("marked faulty"), "{log}");
    stop(server);
}

/// Bad input names the culprit and changes nothing: an export that holds
/// a filesystem, a server that is not there, an export that shrank since
/// the array was made, a read-only export for a writable array.
#[test]
fn bad_remote_members_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let nodes = d.join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let a = Node::file(&nodes, "a", 16 << 20, &[]);
    let b = Node::file(&nodes, "b", 16 << 20, &[]);
    // An ext4 superblock magic at byte 1080 of export b.
    let mut image = std::fs::read(nodes.join("b.img")).unwrap();
    image[1080..1082].copy_from_slice(&[0x53, 0xef]);
    std::fs::write(nodes.join("b.img"), &image).unwrap();
    let (ua, ub) = (a.uri(), b.uri());
    let before = hash_files(&nodes);
    let out = nvraid(&["create", "--level", "1", &ua, &ub], d);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&ub) && err.contains("ext2/3/4"), "{err}");
    assert_eq!(
        before,
        hash_files(&nodes),
        "a refused create changed a byte"
    );

    let gone = format!("nbd+unix:///?socket={}", d.join("nobody.sock").display());
    let out = nvraid(&["create", "--level", "1", &ua, &gone], d);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&gone) && err.contains("cannot reach"), "{err}");
    assert_eq!(before, hash_files(&nodes));

    // Make a good array on a and c, then serve c shrunk.
    let c = Node::file(&nodes, "c", 16 << 20, &[]);
    ok(&["create", "--force", "--level", "1", &ua, &c.uri()], d);
    drop(c);
    let small = std::fs::File::options()
        .write(true)
        .open(nodes.join("c.img"))
        .unwrap();
    small.set_len(8 << 20).unwrap();
    drop(small);
    let c = Node::file(&nodes, "c", 8 << 20, &[]);
    let before = hash_files(&nodes);
    let out = nvraid(&["detail", &ua, &c.uri()], d);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&c.uri()), "{err}");
    assert_eq!(before, hash_files(&nodes));

    let ro = Node::file(&nodes, "ro", 16 << 20, &["-r"]);
    let out = nvraid(&["create", "--force", "--level", "1", &ua, &ro.uri()], d);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&ro.uri()) && err.contains("read-only"),
        "{err}"
    );
}

/// The served array's NBD URI (`md.sock` in `dir`).
fn array_uri(dir: &Path) -> String {
    format!("nbd+unix:///?socket={}", dir.join("md.sock").display())
}

/// Bytes that differ from block to block and from `seed` to `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Write `data` at the start of the served array (nbdcopy, several
/// connections).
fn write_array(dir: &Path, data: &[u8]) {
    let file = dir.join("in.bin");
    std::fs::write(&file, data).unwrap();
    let out = Command::new("nbdcopy")
        .arg(&file)
        .arg(array_uri(dir))
        .output()
        .expect("nbdcopy (./test.sh installs libnbd-bin)");
    assert!(
        out.status.success(),
        "writing the array failed: {}\nserve log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
}

/// Read the first `len` bytes of the served array; every 4 KiB block must
/// be `expect`'s (the first wrong block is named).
fn check_array(dir: &Path, expect: &[u8], what: &str) {
    let file = dir.join("out.bin");
    let _ = std::fs::remove_file(&file);
    let out = Command::new("nbdcopy")
        .arg(array_uri(dir))
        .arg(&file)
        .output()
        .expect("nbdcopy (./test.sh installs libnbd-bin)");
    assert!(
        out.status.success(),
        "{what}: reading the array failed: {}\nserve log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
    let got = std::fs::read(&file).unwrap();
    assert!(got.len() >= expect.len(), "{what}: short read");
    for (block, (want, have)) in expect.chunks(4096).zip(got.chunks(4096)).enumerate() {
        assert!(
            want == have,
            "{what}: block {block} read wrong data ({} zero bytes of 4096)",
            have.iter().filter(|&&b| b == 0).count()
        );
    }
}

/// `status --json`'s member in `role`.
fn member_status(dir: &Path, role: usize) -> serde_json::Value {
    let out = ok(&["status", "--socket", "md.ctl", "--json"], dir);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    status["array"]["members"][role].clone()
}

/// A stranger takes a member's address while the array is served: a blank
/// export, a member of another array, an older copy of the member itself.
/// Each time the member's new connection is refused before any request
/// goes on it: every block the client reads is the array's, no byte of
/// the stranger changes, and the member is marked faulty with the reason.
#[test]
fn a_stranger_behind_a_members_address_is_refused() {
    const SIZE: u64 = 16 << 20;
    for (case, reason) in [
        ("blank", "no md superblock"),
        ("other-array", "array UUID differs"),
        ("older-copy", "older copy of this member"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (a, mut b, members) = mirror_of_two_nodes(d, SIZE);
        match case {
            "blank" => {
                std::fs::File::create(d.join("stranger.img"))
                    .unwrap()
                    .set_len(SIZE)
                    .unwrap();
            }
            "other-array" => {
                let other = d.join("other");
                std::fs::create_dir(&other).unwrap();
                let x = Node::file(&other, "x", SIZE, &[]);
                let y = Node::file(&other, "y", SIZE, &[]);
                ok(&["create", "--level", "1", &x.uri(), &y.uri()], &other);
                drop((x, y));
                std::fs::copy(other.join("y.img"), d.join("stranger.img")).unwrap();
            }
            _ => {
                // b as it is now; the array's first write moves its events on.
                std::fs::copy(d.join("b.img"), d.join("stranger.img")).unwrap();
            }
        }
        let stranger_before = std::fs::read(d.join("stranger.img")).unwrap();

        let server = serve_with(d, &members, &["--nbd-timeout", "3s"]);
        let data = pattern(8 << 20, 1);
        write_array(d, &data);
        check_array(d, &data, case);

        b.kill();
        let stranger = Node::serving(d, "stranger", "b", SIZE, &[]);
        assert_eq!(stranger.uri(), members[1]);
        for pass in 0..3 {
            check_array(d, &data, &format!("{case}: read {pass} after the swap"));
        }
        let data2 = pattern(8 << 20, 2);
        write_array(d, &data2);
        check_array(d, &data2, &format!("{case}: after a write"));

        let member = member_status(d, 1);
        assert_eq!(member["state"], "faulty", "{case}: {member}");
        let why = member["reason"].as_str().unwrap_or_default();
        assert!(why.contains(reason), "{case}: reason {why:?}");
        let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
        assert!(
            log.contains(reason) && log.contains("marked faulty"),
            "{case}: {log}"
        );
        stop(server);
        drop(stranger);
        assert!(
            std::fs::read(d.join("stranger.img")).unwrap() == stranger_before,
            "{case}: a byte of the stranger changed"
        );
        drop(a);
    }
}

/// A RAID 1 created over two nbdkit file nodes `a` and `b` of `size`
/// bytes: the nodes and the members' URIs.
fn mirror_of_two_nodes(d: &Path, size: u64) -> (Node, Node, Vec<String>) {
    let a = Node::file(d, "a", size, &[]);
    let b = Node::file(d, "b", size, &[]);
    let members = vec![a.uri(), b.uri()];
    let mut create = vec!["create", "--level", "1"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    (a, b, members)
}

/// The member's own server restarted at the same address is the member:
/// its new connections pass the check, reads and writes go on, nothing
/// turns faulty, and afterwards both copies match.
#[test]
fn a_member_whose_server_comes_back_is_accepted() {
    const SIZE: u64 = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (a, mut b, members) = mirror_of_two_nodes(d, SIZE);
    let server = serve_with(d, &members, &["--nbd-timeout", "3s"]);
    let data = pattern(8 << 20, 3);
    write_array(d, &data);
    b.kill();
    let b = Node::file(d, "b", SIZE, &[]);
    for pass in 0..2 {
        check_array(d, &data, &format!("read {pass} after the restart"));
    }
    let data2 = pattern(8 << 20, 4);
    write_array(d, &data2);
    check_array(d, &data2, "after a write");
    assert_eq!(
        member_states(d),
        ["active", "active"],
        "serve log:\n{}",
        std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
    );
    stop(server);
    assert_checks_clean(d, &members, "after the member's server came back");
    drop((a, b));
}

/// A member's link goes dead under `--nbd-timeout 3s` (its server stopped
/// with SIGSTOP: requests get no reply, a new connection no handshake)
/// while a client reads and another writes: each finishes, without an
/// error, within the timeout and a margin (a read that timed out is not
/// retried on a connection that would take another timeout to fail, and
/// no reconnection outlives the deadline of what waits for it); the
/// member turns faulty, and stopping the server takes no longer either.
#[test]
fn deadlines_hold_when_a_members_link_goes_dead() {
    const SIZE: u64 = 16 << 20;
    let timeout = Duration::from_secs(3);
    let bound = timeout + Duration::from_millis(1500);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = Node::file(d, "a", SIZE, &[]);
    let b = Node::file(d, "b", SIZE, &[]);
    let members = vec![a.uri(), b.uri()];
    let mut create = vec!["create", "--level", "1"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    let server = serve_with(d, &members, &["--nbd-timeout", "3s"]);
    let data = pattern(8 << 20, 5);
    write_array(d, &data);
    check_array(d, &data, "before the link died");

    let pid = b.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    std::fs::write(d.join("w.bin"), pattern(1 << 20, 6)).unwrap();
    let start = Instant::now();
    let reader = Command::new("nbdcopy")
        .arg(array_uri(d))
        .arg(d.join("r.bin"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let writer = Command::new("nbdcopy")
        .arg(d.join("w.bin"))
        .arg(array_uri(d))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for (what, child) in [("read", reader), ("write", writer)] {
        let out = child.wait_with_output().unwrap();
        let took = start.elapsed();
        assert!(
            out.status.success(),
            "the {what} failed: {}\nserve log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
        );
        assert!(
            took < bound,
            "the {what} took {took:?} with a {timeout:?} request timeout\nserve log:\n{}",
            std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
        );
    }
    assert_eq!(member_states(d), ["active", "faulty"]);
    let start = Instant::now();
    stop(server);
    let took = start.elapsed();
    assert!(took < bound, "stopping the server took {took:?}");
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    drop((a, b));
}
