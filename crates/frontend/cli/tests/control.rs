//! `serve`'s control socket and the files named on the command line: the
//! control path is taken only when free or a dead socket; one slow control
//! client does not hold up the others; files read whole (certificates,
//! keys, report inputs) are read with a bound; a read-only server says so;
//! a member named twice is refused by name.

mod common;

use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `run_within` for a command that must be refused (exit code 1) with
/// every `needles` in its message and no file in `dir` changed.
fn refused_within(args: &[&str], dir: &Path, needles: &[&str]) -> String {
    let before = hash_files(dir);
    let out = run_within(args, dir, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: {stderr:?} lacks {needle:?}"
        );
    }
    assert_eq!(hash_files(dir), before, "{args:?} changed a file");
    said_once(&stderr);
    stderr
}

fn mirror(dir: &Path, names: &[&str]) {
    let mut args = vec!["create", "--level", "1", "--size", "16M"];
    args.extend_from_slice(names);
    ok(&args, dir);
}

fn status_of(dir: &Path, socket: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&["status", "--json", "--socket", socket], dir)).unwrap()
}

#[test]
fn serve_refuses_a_control_path_that_is_not_a_dead_socket() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    mirror(d, &["m0", "m1"]);
    mirror(d, &["n0", "n1"]);
    std::fs::write(d.join("precious.txt"), b"keep me\n").unwrap();
    // A regular file given with --control stays, byte for byte.
    refused_within(
        &[
            "serve",
            "--listen",
            "unix:a.sock",
            "--control",
            "precious.txt",
            "m0",
            "m1",
        ],
        d,
        &["precious.txt", "regular file", "--control"],
    );
    assert_eq!(std::fs::read(d.join("precious.txt")).unwrap(), b"keep me\n");
    // So does one at the default control path (<listen>.ctl).
    std::fs::write(d.join("b.ctl"), b"also mine\n").unwrap();
    refused_within(
        &["serve", "--listen", "unix:b.sock", "m0", "m1"],
        d,
        &["b.ctl", "regular file"],
    );
    assert_eq!(std::fs::read(d.join("b.ctl")).unwrap(), b"also mine\n");
    assert!(!d.join("a.sock").exists() && !d.join("b.sock").exists());

    // A running server's control socket survives a second serve given it.
    let mut first = serve(d, &["m0".into(), "m1".into()]);
    refused_within(
        &[
            "serve",
            "--listen",
            "unix:other.sock",
            "--control",
            "md.ctl",
            "n0",
            "n1",
        ],
        d,
        &["md.ctl", "a running server answers"],
    );
    let status = status_of(d, "md.ctl");
    let members: Vec<&str> = status["array"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["path"].as_str())
        .collect();
    assert!(
        members.iter().any(|p| p.ends_with("m0")),
        "the first server answers: {status}"
    );
    ok(&["fail", "--socket", "md.ctl", "--member", "m1"], d);

    // A socket left by a server that died is a dead socket: taken over.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(d.join("md.ctl").exists(), "SIGKILL leaves the socket");
    let log = std::fs::File::create(d.join("second.log")).unwrap();
    let mut second = Served(
        Command::new(env!("CARGO_BIN_EXE_nvraid"))
            .args(["serve", "--listen", "unix:second.sock"])
            .args(["--control", "md.ctl", "n0", "n1"])
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    loop {
        let out = nvraid(&["status", "--json", "--socket", "md.ctl"], d);
        if out.status.success() {
            let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let text = s["array"].to_string();
            assert!(text.contains("n0") && !text.contains("m0"), "{s}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the second server did not take the dead socket: {}",
            std::fs::read_to_string(d.join("second.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Command::new("kill")
        .args(["-INT", &second.id().to_string()])
        .status()
        .unwrap();
    assert!(second.wait().unwrap().success());
    assert!(
        !d.join("md.ctl").exists(),
        "a clean stop removes its own socket"
    );
}

/// One client trickling a byte a second never finishes its request; before,
/// the one control thread waited on it (a timeout per read, not per
/// request) and every other client timed out.
#[test]
fn a_slow_control_client_does_not_stall_status() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    mirror(d, &["m0", "m1"]);
    std::fs::File::create(d.join("m2"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let server = serve(d, &["m0".into(), "m1".into()]);
    let ctl = d.join("md.ctl");
    let stop = Arc::new(AtomicBool::new(false));
    // How long each trickling connection lasted, and what it was told.
    let cut: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
    let trickler = {
        let (stop, cut, ctl) = (stop.clone(), cut.clone(), ctl.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut stream = UnixStream::connect(&ctl).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let opened = Instant::now();
                let mut told = Vec::new();
                'trickle: while !stop.load(Ordering::Relaxed) {
                    if stream.write_all(b" ").is_err() {
                        break;
                    }
                    let tick = Instant::now();
                    while tick.elapsed() < Duration::from_secs(1) {
                        let mut buf = [0u8; 512];
                        match stream.read(&mut buf) {
                            Ok(0) => break 'trickle,
                            Ok(n) => told.extend_from_slice(&buf[..n]),
                            Err(_) => {}
                        }
                    }
                }
                let told = String::from_utf8_lossy(&told).into_owned();
                cut.lock().unwrap().push((opened.elapsed(), told));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let socket = ctl.to_str().unwrap();
    let timed = |args: &[&str]| {
        let started = Instant::now();
        let out = run_within(args, d, Duration::from_secs(30));
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            took < Duration::from_secs(3),
            "{args:?} took {took:?} beside a slow client"
        );
        out
    };
    timed(&["status", "--socket", socket]);
    timed(&["fail", "--socket", socket, "--member", "m1"]);
    timed(&["remove", "--socket", socket, "--member", "m1"]);
    timed(&["add", "--socket", socket, "--new", "m2"]);
    timed(&["status", "--socket", socket]);
    // The slow client is cut off at the request's deadline (5 s), told why.
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
    let cut = cut.lock().unwrap();
    let (lasted, told) = &cut[0];
    assert!(
        *lasted < Duration::from_secs(8),
        "a trickling client held on for {lasted:?}"
    );
    assert!(told.contains("not complete within 5 s"), "{told:?}");
    drop(server);
}

#[test]
fn tls_cert_from_dev_zero_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    self_signed_certificate(d, 2048);
    mirror(d, &["m0", "m1"]);
    let serve_tls = |cert: &str, key: &str, ca: Option<&str>| {
        let mut args = vec![
            "serve",
            "--listen",
            "unix:s.sock",
            "--tls",
            "require",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ];
        if let Some(ca) = ca {
            args.extend(["--tls-verify-peer", "--tls-ca", ca]);
        }
        args.extend(["m0", "m1"]);
        refused_within(&args, d, &["/dev/zero", "longer than 4 MiB"]);
    };
    serve_tls("/dev/zero", "key.pem", None);
    serve_tls("cert.pem", "/dev/zero", None);
    serve_tls("cert.pem", "key.pem", Some("/dev/zero"));
    assert!(!d.join("s.sock").exists());
}

/// `write --input` from a stream (a character device, a pipe) reads at
/// most what the array holds from the offset: `/dev/zero` used to measure
/// as 0 bytes and write nothing, with success, and stdin was spooled
/// without any bound.
#[test]
fn write_from_an_endless_stream_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    mirror(d, &["m0", "m1"]);
    let args = ["write", "--input", "/dev/zero", "m0", "m1"];
    refused_within(&args, d, &["/dev/zero", "more than the", "nothing written"]);
    let args = [
        "write",
        "--offset",
        "8M",
        "--input",
        "/dev/zero",
        "m0",
        "m1",
    ];
    refused_within(&args, d, &["/dev/zero", "nothing written"]);
    // A stream within the room is written whole.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(["write", "--offset", "4K", "m0", "m1"])
        .current_dir(d)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&[0xa5; 8192])
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let back = ok_bytes(&["read", "--offset", "4K", "--length", "8K", "m0", "m1"], d);
    assert_eq!(back, vec![0xa5; 8192]);
}

#[test]
fn nbd_tls_files_from_dev_zero_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    self_signed_certificate(d, 2048);
    for args in [
        &["--nbd-tls-ca", "/dev/zero", "examine", "cert.pem"][..],
        &[
            "--nbd-tls-ca",
            "cert.pem",
            "--nbd-tls-cert",
            "/dev/zero",
            "--nbd-tls-key",
            "key.pem",
            "examine",
            "cert.pem",
        ][..],
        &[
            "--nbd-tls-ca",
            "cert.pem",
            "--nbd-tls-cert",
            "cert.pem",
            "--nbd-tls-key",
            "/dev/zero",
            "examine",
            "cert.pem",
        ][..],
    ] {
        let out = run_within(args, d, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("/dev/zero") && stderr.contains("longer than 4 MiB"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn report_input_from_dev_zero_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    refused_within(
        &["report", "-o", "page.html", "/dev/zero"],
        d,
        &["/dev/zero", "longer than 64 MiB"],
    );
    assert!(!d.join("page.html").exists());
}

/// A read-only server's members are open for reading only; `fail` used to
/// end in "Bad file descriptor".
#[test]
fn fail_on_a_read_only_server_is_refused_as_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    mirror(d, &["m0", "m1"]);
    std::fs::File::create(d.join("m2"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let server = serve_with(d, &["m0".into(), "m1".into()], &["--read-only"]);
    let before = hash_files(d);
    for (args, member) in [
        (&["fail", "--socket", "md.ctl", "--member", "m1"][..], "m1"),
        (
            &["remove", "--socket", "md.ctl", "--member", "m1"][..],
            "m1",
        ),
        (&["add", "--socket", "md.ctl", "--new", "m2"][..], "m2"),
        (
            &[
                "replace", "--socket", "md.ctl", "--old", "m1", "--new", "m2",
            ][..],
            "m1",
        ),
    ] {
        let out = run_within(args, d, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("{member}: "))
                && stderr.contains("read-only")
                && !stderr.contains("Bad file descriptor"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(hash_files(d), before, "a refused command changed a member");
    let s = status_of(d, "md.ctl");
    assert_eq!(s["array"]["state"], "clean", "{s}");
    drop(server);
}

/// `serve c1 c1` said "in use by pid <its own pid>".
#[test]
fn a_member_named_twice_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    mirror(d, &["c0", "c1"]);
    std::os::unix::fs::symlink("c1", d.join("again")).unwrap();
    std::fs::File::create(d.join("j"))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    std::fs::write(d.join("data"), vec![5u8; 4096]).unwrap();
    for args in [
        &["serve", "--listen", "unix:s.sock", "c0", "c1", "c1"][..],
        &["serve", "--listen", "unix:s.sock", "c0", "c1", "again"][..],
        &["write", "--input", "data", "c1", "c0", "c1"][..],
        &["fail", "--member", "c1", "c0", "c1", "again"][..],
        &["assemble", "c0", "again", "c1"][..],
        &["check", "c0", "c1", "c1"][..],
    ] {
        let stderr = refused_within(args, d, &["given twice"]);
        assert!(
            !stderr.contains("in use by") && (stderr.contains("c1") || stderr.contains("again")),
            "{args:?}: {stderr}"
        );
    }
}
