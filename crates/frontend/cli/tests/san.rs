//! Faults on a real (namespaced) storage network: `bench/san` brings up
//! four storage nodes, each an nbdkit in its own network namespace behind a
//! veth link shaped with tc, and `nvraid serve` runs a RAID 10 over them in
//! the head namespace. While fio writes through it with crc32c
//! verification, one node's link is taken down (`ip link set down`): fio
//! sees no error and the member turns faulty after the request timeout.
//! The link comes back, the member is re-added (only what it missed is
//! copied, by the write-intent bitmap), and every copy matches.
//!
//! Needs root, iproute2 (ip, tc), nbdkit, nbdinfo and fio (`./test.sh`
//! installs them).

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The test's own bed (its own name prefix, so a bed a developer has up
/// is left alone); brought down on drop, also after a failure.
struct Bed;

const PREFIX: &str = "nvsant";

fn san(args: &[&str]) -> String {
    let out = Command::new(repo().join("bench/san"))
        .env("NVRAID_SAN_PREFIX", PREFIX)
        .env("NVRAID", env!("CARGO_BIN_EXE_nvraid"))
        .args(args)
        .output()
        .expect("bench/san runs (python3)");
    assert!(
        out.status.success(),
        "bench/san {args:?} failed (needs root, iproute2, nbdkit): {}{}",
        String::from_utf8_lossy(&out.stderr),
        node_logs()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The nodes' server logs (the bed's state directory goes with the bed, so
/// a failure shows them before it is brought down).
fn node_logs() -> String {
    let state = Path::new("/run").join(format!("nvraid-san-{PREFIX}"));
    let mut logs: Vec<_> = std::fs::read_dir(&state)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    logs.iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            format!("\n--- {}:\n{text}", p.display())
        })
        .collect()
}

impl Bed {
    fn up(nodes: usize, rate: &str) -> (Bed, Vec<String>) {
        san(&["down"]);
        let out = san(&["up", &nodes.to_string(), "--rate", rate, "--size", "256M"]);
        (Bed, out.lines().map(str::to_string).collect())
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        san(&["down"]);
    }
}

/// `nvraid ARGS` in the head namespace.
fn head_nvraid(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{PREFIX}-head"),
            env!("CARGO_BIN_EXE_nvraid"),
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn head_ok(args: &[&str], dir: &Path) -> String {
    let out = head_nvraid(args, dir);
    assert!(
        out.status.success(),
        "nvraid {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn head_serve(dir: &Path, members: &[String], extra: &[&str]) -> Served {
    let mut command = Command::new("ip");
    command.args([
        "netns",
        "exec",
        &format!("{PREFIX}-head"),
        env!("CARGO_BIN_EXE_nvraid"),
    ]);
    serve_through(dir, command, members, extra)
}

#[test]
fn raid10_over_a_shaped_network_survives_a_link_down_and_re_adds_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (bed, uris) = Bed::up(4, "1gbit");
    assert_eq!(uris.len(), 4, "{uris:?}");
    let mut create = vec!["create", "--level", "10"];
    create.extend(uris.iter().map(String::as_str));
    head_ok(&create, d);

    // The advisor finds each member's link and its shaper: 4 x 1 Gbit/s,
    // less the headers of a 9000-byte MTU frame.
    let mut plan = vec!["topology", "--json", "--plan", "--level", "10"];
    plan.extend(uris.iter().map(String::as_str));
    let report: serde_json::Value = serde_json::from_str(&head_ok(&plan, d)).unwrap();
    let read = report["plan"]["read"]["bytes_per_sec"].as_f64().unwrap();
    let expected = 4.0 * 125e6 * 8948.0 / 9014.0;
    assert!((read / expected - 1.0).abs() < 1e-6, "{read} vs {expected}");
    let limit = report["plan"]["read"]["limited_by"].to_string();
    assert!(limit.contains("tbf"), "{limit}");
    let server = head_serve(
        d,
        &uris,
        &["--nbd-timeout", "1s", "--nbd-connect-timeout", "1s"],
    );

    let fio = fio_nbd(d, "net")
        .args(FIO_VERIFY_JOB)
        .args(["--size=24m", "--offset_increment=24m", "--rate_iops=1500"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    san(&["link", "2", "down"]);
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("err= 0"),
        "fio saw errors when a link went down:\n{text}\n{}\nserve log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
    );
    assert_eq!(member_states(d)[1], "faulty", "node 2 holds role 1");
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("marked faulty"), "{log}");

    // The link comes back: the node still has its data, so it is re-added
    // and gets only what it missed.
    san(&["link", "2", "up"]);
    ok(&["remove", "--socket", "md.ctl", "--member", &uris[1]], d);
    let added = nvraid(
        &["add", "--socket", "md.ctl", "--new", &uris[1], "--json"],
        d,
    );
    assert!(
        added.status.success(),
        "add failed: {}\nserve log:\n{}\nnode logs:{}",
        String::from_utf8_lossy(&added.stderr),
        std::fs::read_to_string(d.join("serve.log")).unwrap_or_default(),
        node_logs()
    );
    let added: serde_json::Value = serde_json::from_slice(&added.stdout).unwrap();
    assert_eq!(added["re_added"], true, "{added}");
    let start = Instant::now();
    while member_states(d).iter().any(|s| s != "active") {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{:?}",
            member_states(d)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let verify = fio_nbd(d, "net")
        .args(FIO_VERIFY_JOB)
        .args(["--size=24m", "--offset_increment=24m", "--verify_only"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success() && text.contains("err= 0"), "{text}");
    let _ = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let mut server = server;
    assert!(server.wait().unwrap().success());
    let mut check = vec!["check"];
    check.extend(uris.iter().map(String::as_str));
    let out = head_ok(&check, d);
    assert!(out.contains(" 0 mismatched sectors"), "{out}");
    drop(bed);
}
