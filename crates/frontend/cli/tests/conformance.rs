//! `nvraid serve` through the NBD conformance cases of
//! tools/nbd-conformance (libnbd's Python bindings, a client written apart
//! from nvraid): handshake, list, read, write, flush, integrity, zero,
//! unaligned requests, bad requests, and writes to a read-only export; over
//! a Unix socket and TCP, on RAID 0 and RAID 5; and a flushed write that
//! must survive kill -9 of the server.
//!
//! Needs Debian's python3-libnbd (`./test.sh` installs it).

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// Debian's Python, where python3-libnbd installs `nbd`.
const PYTHON: &str = "/usr/bin/python3";

/// Run the conformance script; its output, which must show every case
/// passing.
fn conformance(uri: &str, extra: &[&str]) -> String {
    let script = repo().join("tools/nbd-conformance/conformance.py");
    let out = Command::new(PYTHON)
        .arg(&script)
        .arg(uri)
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("{PYTHON} {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "conformance cases failed against {uri}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    stdout
}

/// A new array of `count` members at `level` in a temporary directory.
fn array(level: &str, count: usize) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let members = members(dir.path(), count);
    create(dir.path(), level, &members);
    (dir, members)
}

fn members(dir: &Path, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| dir.join(format!("m{i}.img")).display().to_string())
        .collect()
}

fn create(dir: &Path, level: &str, members: &[String]) {
    let mut args = vec!["create", "--level", level, "--size", "64M"];
    args.extend(members.iter().map(String::as_str));
    ok(&args, dir);
}

fn unix_uri(dir: &Path) -> String {
    format!("nbd+unix:///?socket={}", dir.join("md.sock").display())
}

/// A server that is killed when dropped, also when a test fails before
/// it stops it.
fn stop(server: Served) {
    drop(server);
}

fn assert_cases(output: &str, cases: &[&str]) {
    for case in cases {
        assert!(
            output.contains(&format!("PASS {case}:")),
            "case {case} did not run:\n{output}"
        );
    }
}

#[test]
fn every_case_passes_on_raid0_over_unix_and_tcp() {
    let (dir, members) = array("0", 4);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcp = format!("tcp:127.0.0.1:{port}");
    let server = serve_with(dir.path(), &members, &["--listen", &tcp]);
    let output = conformance(&unix_uri(dir.path()), &[]);
    assert_cases(
        &output,
        &[
            "handshake",
            "list",
            "read",
            "write",
            "flush",
            "integrity",
            "zero",
            "unaligned",
            "bad_requests",
        ],
    );
    // The server advertises block sizes (the script checks them when
    // they are there).
    assert!(output.contains("blocks 512/"), "{output}");
    let output = conformance(
        &format!("nbd://127.0.0.1:{port}/"),
        &["--cases", "handshake,read,write,integrity"],
    );
    assert_cases(&output, &["handshake", "read", "write", "integrity"]);
    stop(server);
}

/// TLS connections are owned by the workers too (rustls driven
/// non-blocking): the same cases through `nbds+unix://`, with the server
/// requiring TLS.
#[test]
fn every_case_passes_over_tls() {
    let (dir, members) = array("0", 4);
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let (cert, key) = self_signed_certificate(dir.path(), 2048);
    std::fs::copy(&cert, pki.join("ca-cert.pem")).unwrap();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let server = serve_with(
        dir.path(),
        &members,
        &["--tls", "require", "--tls-cert", &cert, "--tls-key", &key],
    );
    let uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={}",
        dir.path().join("md.sock").display(),
        pki.display()
    );
    let output = conformance(&uri, &[]);
    assert_cases(
        &output,
        &[
            "handshake",
            "read",
            "write",
            "flush",
            "integrity",
            "unaligned",
        ],
    );
    stop(server);
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
    assert!(log.contains("event=tls-started"), "{log}");
}

#[test]
fn every_case_passes_on_raid5() {
    let (dir, members) = array("5", 4);
    let server = serve(dir.path(), &members);
    let output = conformance(&unix_uri(dir.path()), &[]);
    assert_cases(&output, &["integrity", "unaligned", "zero"]);
    stop(server);
}

/// The write caches serve the same cases: in RAM, and with a journal on
/// a separate member (RAID 5).
#[test]
fn every_case_passes_through_the_write_caches() {
    for (level, cache) in [("0", "writeback"), ("5", "journal")] {
        let (dir, members) = array(level, 4);
        let journal = dir.path().join("journal.img");
        std::fs::File::create(&journal)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let journal = journal.display().to_string();
        let mut extra = vec!["--cache", cache];
        if cache == "journal" {
            extra.extend(["--journal", journal.as_str()]);
        }
        let server = serve_with(dir.path(), &members, &extra);
        let output = conformance(&unix_uri(dir.path()), &[]);
        assert_cases(&output, &["flush", "integrity", "zero", "unaligned"]);
        // The cache says so: 4 KiB blocks.
        assert!(output.contains("blocks 4096/"), "{cache}: {output}");
        stop(server);
    }
}

#[test]
fn a_read_only_export_refuses_writes_with_eperm() {
    let (dir, members) = array("1", 2);
    let server = serve_with(dir.path(), &members, &["--read-only"]);
    let output = conformance(&unix_uri(dir.path()), &["--read-only"]);
    assert_cases(&output, &["handshake", "list", "read", "read_only_writes"]);
    stop(server);
}

#[test]
fn a_flushed_write_survives_kill_9_of_the_server() {
    let (dir, members) = array("10", 3);
    let server = serve(dir.path(), &members);
    conformance(&unix_uri(dir.path()), &["--marker-write"]);
    // SIGKILL: no orderly stop, no final flush.
    stop(server);
    let server = serve(dir.path(), &members);
    let output = conformance(&unix_uri(dir.path()), &["--marker-check"]);
    assert!(output.contains("PASS marker"), "{output}");
    stop(server);
}
