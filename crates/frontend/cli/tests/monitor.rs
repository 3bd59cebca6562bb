//! Alerts and metrics of `nvraid serve` (docs/monitor.md), through the
//! real binary: the alert program gets Fail and DegradedArray when a member
//! is failed through the control socket, RebuildStarted/RebuildFinished
//! when it comes back; /metrics follows the member and the I/O; a missing
//! or hanging program is logged and retried while the array serves; the
//! journald sink speaks the native protocol; `--metrics` on an address in
//! use is refused before any member changes.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A RAID 1 of two 64 MiB files (with md's bitmap, so a member comes back
/// by re-add).
fn raid1(dir: &Path) -> Vec<String> {
    let members = vec!["m0.img".to_string(), "m1.img".to_string()];
    ok(
        &[
            "create", "--level", "1", "--size", "64M", "--force", "m0.img", "m1.img",
        ],
        dir,
    );
    members
}

/// An executable shell script `name` in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The alert program of these tests: one line per call, its arguments and
/// environment, appended to `events.txt`.
fn recorder(dir: &Path, name: &str) -> PathBuf {
    script(
        dir,
        name,
        &format!(
            "echo \"$*|$NVRAID_EVENT|$NVRAID_ARRAY|$NVRAID_UUID|$NVRAID_MEMBER\" >> {}",
            dir.join("events.txt").display()
        ),
    )
}

fn events(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("events.txt")).unwrap_or_default()
}

/// Waits until `events.txt` has a line starting with `prefix`.
fn wait_event(dir: &Path, prefix: &str, limit: Duration) {
    let started = Instant::now();
    while !events(dir).lines().any(|l| l.starts_with(prefix)) {
        assert!(
            started.elapsed() < limit,
            "no {prefix:?} event after {limit:?}: {}\nserve.log: {}",
            events(dir),
            log(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
}

/// Waits until serve.log contains `needle`.
fn wait_log(dir: &Path, needle: &str, limit: Duration) {
    let started = Instant::now();
    while !log(dir).contains(needle) {
        assert!(
            started.elapsed() < limit,
            "{needle:?} not logged after {limit:?}: {}",
            log(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A TCP address nothing listens on now.
fn free_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

/// The value of the sample of `name` whose labels contain every `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
}

fn control(dir: &Path) -> String {
    dir.join("md.ctl").display().to_string()
}

fn stop(server: Served, limit: Duration) {
    let started = Instant::now();
    server.interrupt();
    assert!(
        started.elapsed() < limit,
        "serve took {:?} to stop",
        started.elapsed()
    );
}

/// Writes `mib` MiB through the server's NBD socket with fio.
fn write_through_nbd(dir: &Path, mib: u32) {
    tool("fio");
    let out = fio_nbd(dir, "monitor")
        .args([
            "--rw=write",
            "--bs=64k",
            &format!("--size={mib}m"),
            "--output-format=terse",
        ])
        .output()
        .expect("fio (apt-get install fio)");
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The journal socket the tests point the server at: absent, so the log
/// goes to standard error (serve.log), whatever the machine runs.
fn no_journal(dir: &Path) -> String {
    dir.join("no-journal.socket").display().to_string()
}

fn uuid(dir: &Path, members: &[&str]) -> String {
    let mut args = vec!["detail", "--json"];
    args.extend(members);
    let d: serde_json::Value = serde_json::from_slice(&ok_bytes(&args, dir)).unwrap();
    d["uuid"].as_str().unwrap().to_string()
}

#[test]
fn a_failed_member_raises_fail_and_degraded_and_its_rebuild_is_reported_and_measured() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = raid1(d);
    let uuid = uuid(d, &["m0.img", "m1.img"]);
    let program = recorder(d, "alert");
    let mail = script(
        d,
        "sendmail",
        &format!("cat >> {}", d.join("mail.txt").display()),
    );
    let address = free_address();
    let server = serve_env(
        d,
        &members,
        &[
            "--metrics",
            &address,
            "--alert-program",
            program.to_str().unwrap(),
            "--alert-mail",
            "root@localhost",
        ],
        &[
            ("NVRAID_JOURNAL_SOCKET", &no_journal(d)),
            ("NVRAID_SENDMAIL", mail.to_str().unwrap()),
        ],
    );
    let m1 = ["member=\"m1.img\""];
    let text = get(&address, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert_eq!(sample(&text, "nvraid_array_degraded", &[]), 0.0);
    assert_eq!(
        sample(&text, "nvraid_member_state", &[m1[0], "state=\"active\""]),
        1.0
    );
    let ops_before = sample(&text, "nvraid_member_ops_total", &["member=\"m0.img\""]);
    write_through_nbd(d, 8);
    let text = get(&address, "/metrics");
    let ops_after = sample(&text, "nvraid_member_ops_total", &["member=\"m0.img\""]);
    assert!(
        ops_after > ops_before,
        "{ops_before} -> {ops_after}\n{text}"
    );
    assert!(
        sample(&text, "nvraid_member_bytes_total", &["member=\"m1.img\""]) >= (8 << 20) as f64,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "nvraid_export_requests_total",
            &["export=\"nbd\"", "op=\"write\""]
        ),
        128.0,
        "{text}"
    );
    // Every one of those writes is in the latency histogram, once.
    let nbd_write = ["export=\"nbd\"", "op=\"write\""];
    let duration = "nvraid_export_request_duration_seconds";
    assert_eq!(
        sample(&text, &format!("{duration}_count"), &nbd_write),
        128.0,
        "{text}"
    );
    let all = [nbd_write[0], nbd_write[1], "le=\"+Inf\""];
    assert_eq!(
        sample(&text, &format!("{duration}_bucket"), &all),
        128.0,
        "{text}"
    );
    let sum = sample(&text, &format!("{duration}_sum"), &nbd_write);
    assert!(sum > 0.0 && sum < 128.0 * 5.0, "{sum}\n{text}");
    assert_eq!(
        sample(&text, &format!("{duration}_count"), &["op=\"read\""]),
        0.0
    );
    assert!(get(&address, "/").starts_with("HTTP/1.1 404"));
    assert!(
        events(d).is_empty(),
        "events on a healthy array: {}",
        events(d)
    );

    ok(&["fail", "--socket", &control(d), "--member", "m1.img"], d);
    wait_event(d, "Fail nvraid m1.img|", Duration::from_secs(10));
    wait_event(d, "DegradedArray nvraid|", Duration::from_secs(10));
    let text = get(&address, "/metrics");
    assert_eq!(
        sample(&text, "nvraid_member_state", &[m1[0], "state=\"faulty\""]),
        1.0,
        "{text}"
    );
    assert_eq!(sample(&text, "nvraid_array_degraded", &[]), 1.0);
    assert_eq!(
        sample(&text, "nvraid_array_members", &["state=\"faulty\""]),
        1.0
    );

    ok(
        &["remove", "--socket", &control(d), "--member", "m1.img"],
        d,
    );
    ok(&["add", "--socket", &control(d), "--new", "m1.img"], d);
    wait_event(d, "RebuildStarted nvraid m1.img|", Duration::from_secs(10));
    wait_event(d, "RebuildFinished nvraid m1.img|", Duration::from_secs(60));
    wait_event(d, "SpareActive nvraid m1.img|", Duration::from_secs(10));
    let text = get(&address, "/metrics");
    assert_eq!(
        sample(&text, "nvraid_member_state", &[m1[0], "state=\"active\""]),
        1.0,
        "{text}"
    );
    assert_eq!(sample(&text, "nvraid_array_degraded", &[]), 0.0, "{text}");
    assert_eq!(
        sample(
            &text,
            "nvraid_array_progress_ratio",
            &["operation=\"rebuild\""]
        ),
        1.0,
        "{text}"
    );
    stop(server, Duration::from_secs(20));

    // Each event once, in order, with the environment.
    let lines: Vec<String> = events(d).lines().map(str::to_string).collect();
    assert_eq!(
        lines,
        [
            format!("Fail nvraid m1.img|Fail|nvraid|{uuid}|m1.img"),
            format!("DegradedArray nvraid|DegradedArray|nvraid|{uuid}|"),
            format!("RebuildStarted nvraid m1.img|RebuildStarted|nvraid|{uuid}|m1.img"),
            format!("RebuildFinished nvraid m1.img|RebuildFinished|nvraid|{uuid}|m1.img"),
            format!("SpareActive nvraid m1.img|SpareActive|nvraid|{uuid}|m1.img"),
        ],
        "serve.log: {}",
        log(d)
    );
    // The log has them too (standard error without journald), and the
    // mail went through sendmail.
    let log = log(d);
    assert!(
        log.contains("nvraid_event=Fail") && log.contains("nvraid_member=m1.img"),
        "{log}"
    );
    let mail = std::fs::read_to_string(d.join("mail.txt")).unwrap();
    assert!(mail.contains("To: root@localhost"), "{mail}");
    assert!(
        mail.contains("Subject: nvraid: Fail event on nvraid"),
        "{mail}"
    );
    assert!(mail.contains("Subject: nvraid: RebuildFinished"), "{mail}");
}

#[test]
fn a_missing_alert_program_is_retried_until_it_appears_and_nothing_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    raid1(d);
    let program = d.join("later");
    // Served degraded: DegradedArray at start, for a program not there.
    let server = serve_env(
        d,
        &["m0.img".to_string()],
        &["--alert-program", program.to_str().unwrap()],
        &[("NVRAID_JOURNAL_SOCKET", &no_journal(d))],
    );
    wait_log(d, "ALERT FAILED", Duration::from_secs(10));
    let failed = log(d);
    assert!(
        failed.contains("nvraid_event=DegradedArray") && failed.contains("cannot run it"),
        "{failed}"
    );
    // The array serves meanwhile.
    write_through_nbd(d, 4);
    let renamed = d.join("alert.tmp");
    std::fs::rename(recorder(d, "alert.tmp"), &renamed).unwrap();
    std::fs::rename(&renamed, &program).unwrap();
    wait_event(d, "DegradedArray nvraid|", Duration::from_secs(30));
    wait_log(d, "delivered DegradedArray", Duration::from_secs(5));
    stop(server, Duration::from_secs(20));
    assert_eq!(events(d).lines().count(), 1, "{}", events(d));
}

#[test]
fn a_hanging_alert_program_is_killed_logged_and_retried_while_the_array_serves() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    raid1(d);
    let calls = d.join("calls.txt");
    let program = script(
        d,
        "hang",
        &format!("echo \"$*\" >> {}\nsleep 999.4242", calls.display()),
    );
    let server = serve_env(
        d,
        &["m0.img".to_string()],
        &[
            "--alert-program",
            program.to_str().unwrap(),
            "--alert-timeout",
            "1",
        ],
        &[("NVRAID_JOURNAL_SOCKET", &no_journal(d))],
    );
    wait_log(d, "was killed", Duration::from_secs(10));
    // I/O goes on while the program hangs.
    let started = Instant::now();
    write_through_nbd(d, 8);
    ok(&["status", "--socket", &control(d)], d);
    assert!(started.elapsed() < Duration::from_secs(20));
    // Retried: called again after the backoff.
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::fs::read_to_string(&calls)
        .unwrap_or_default()
        .lines()
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "not retried: {}", log(d));
        std::thread::sleep(Duration::from_millis(100));
    }
    let calls_text = std::fs::read_to_string(&calls).unwrap();
    assert!(
        calls_text.lines().all(|l| l == "DegradedArray nvraid"),
        "{calls_text}"
    );
    stop(server, Duration::from_secs(20));
    wait_log(d, "ALERT NOT DELIVERED", Duration::from_secs(1));
    // Each killed program's `sleep` went with it (its process group).
    let left = Command::new("pgrep")
        .args(["-f", "sleep 999.4242"])
        .output()
        .unwrap();
    assert_eq!(
        left.status.code(),
        Some(1),
        "left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn events_reach_journald_through_its_native_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    raid1(d);
    let uuid = uuid(d, &["m0.img"]);
    let path = d.join("journal.socket");
    let journal = UnixDatagram::bind(&path).unwrap();
    journal
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let server = serve_env(
        d,
        &["m0.img".to_string()],
        &[],
        &[("NVRAID_JOURNAL_SOCKET", path.to_str().unwrap())],
    );
    let mut buf = vec![0u8; 65536];
    let entry = loop {
        let n = journal.recv(&mut buf).expect("no journal entry");
        let entry = String::from_utf8_lossy(&buf[..n]).to_string();
        if entry.contains("NVRAID_EVENT=") {
            break entry;
        }
    };
    let fields: Vec<&str> = entry.lines().collect();
    for field in [
        "NVRAID_EVENT=DegradedArray",
        "NVRAID_ARRAY=nvraid",
        &format!("NVRAID_UUID={uuid}"),
        "PRIORITY=2",
        "SYSLOG_IDENTIFIER=nvraid",
    ] {
        assert!(fields.contains(&field), "{field} not in {entry:?}");
    }
    assert!(
        fields
            .iter()
            .any(|f| f.starts_with("MESSAGE=array nvraid: degraded")),
        "{entry:?}"
    );
    stop(server, Duration::from_secs(20));
    assert!(!log(d).contains("nvraid_event="), "{}", log(d));
}

#[test]
fn metrics_on_an_address_in_use_is_refused_by_name_before_any_member_changes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    raid1(d);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let socket = format!("unix:{}", d.join("md.sock").display());
    refused(
        &[
            "serve",
            "--listen",
            &socket,
            "--metrics",
            &address,
            "m0.img",
            "m1.img",
        ],
        d,
        &[&format!("--metrics {address}"), "in use"],
    );
    refused(
        &[
            "serve",
            "--listen",
            &socket,
            "--metrics",
            "no-such-host.invalid:1",
            "m0.img",
            "m1.img",
        ],
        d,
        &["--metrics no-such-host.invalid:1"],
    );
}
