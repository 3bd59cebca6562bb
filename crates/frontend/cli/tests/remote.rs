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
        let file = dir.join(format!("{name}.img"));
        if !file.exists() {
            std::fs::File::create(&file).unwrap().set_len(size).unwrap();
        }
        let socket = dir.join(format!("{name}.sock"));
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
        while !socket.exists() {
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
