//! `nvraid serve` keeps answering whatever mix of requests its clients
//! send: no request may park a worker on a lock or a stripe that only
//! another parked request can give back. Raw NBD clients (no block sizes
//! negotiated, so the server accepts any alignment) over the Unix socket.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_checks_clean, ok, serve_with};
use nvraid_nbd::{Command, RequestHeader};

const KIB: u64 = 1024;
/// The part of the export the clients share.
const SPAN: u64 = 1 << 20;
/// Each 16 KiB group of the span: bytes 0..8 KiB belong to the aligned
/// writer, 8 KiB..SPLIT to the first unaligned writer, SPLIT..16 KiB to the
/// second (so the unaligned writers share the block SPLIT falls in).
const GROUP: u64 = 16 * KIB;
const SPLIT: u64 = 14 * KIB + 100;
/// The unaligned writers keep to the first few groups (the aligned one
/// writes all of them), so that they often meet in one block.
const UNALIGNED_GROUPS: u64 = 4;

/// A client that negotiated no block sizes (NBD_OPT_EXPORT_NAME).
fn connect(socket: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(socket).unwrap();
    // A reply that does not come within this is a hung server.
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).unwrap();
    // FIXED_NEWSTYLE | NO_ZEROES, then EXPORT_NAME "" (option 1, no data).
    stream.write_all(&3u32.to_be_bytes()).unwrap();
    stream.write_all(b"IHAVEOPT").unwrap();
    stream.write_all(&1u32.to_be_bytes()).unwrap();
    stream.write_all(&0u32.to_be_bytes()).unwrap();
    let mut info = [0u8; 10];
    stream.read_exact(&mut info).unwrap();
    stream
}

fn send(stream: &mut UnixStream, command: Command, cookie: u64, offset: u64, payload: &[u8]) {
    let header = RequestHeader {
        flags: 0,
        command,
        cookie,
        offset,
        length: payload.len() as u32,
    };
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(payload);
    stream.write_all(&bytes).unwrap();
}

/// A simple reply's cookie; panics on an error or when none comes.
fn reply(stream: &mut UnixStream, what: &str) -> u64 {
    let mut head = [0u8; 16];
    if let Err(e) = stream.read_exact(&mut head) {
        panic!("no reply to {what}: {e} (the server stopped answering)");
    }
    let error = u32::from_be_bytes(head[4..8].try_into().unwrap());
    assert_eq!(error, 0, "{what} failed");
    u64::from_be_bytes(head[8..16].try_into().unwrap())
}

fn read(stream: &mut UnixStream, offset: u64, length: u32) -> Vec<u8> {
    let header = RequestHeader {
        flags: 0,
        command: Command::Read,
        cookie: 1,
        offset,
        length,
    };
    stream.write_all(&header.encode()).unwrap();
    reply(stream, "the read");
    let mut data = vec![0u8; length as usize];
    stream.read_exact(&mut data).unwrap();
    data
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, length: usize) -> Vec<u8> {
        (0..length).map(|_| self.next() as u8).collect()
    }
}

/// The aligned writer: 4 or 8 KiB at blocks 0–1 of a group, four groups
/// in flight at a time.
fn aligned_writer(socket: &Path, ledger: Arc<Mutex<Vec<u8>>>, rounds: u64) {
    let mut stream = connect(socket);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let groups = SPAN / GROUP;
    for round in 0..rounds {
        let first = rng.below(groups);
        let mut sent = Vec::new();
        for k in 0..4 {
            let group = (first + k) % groups;
            let offset = group * GROUP + rng.below(2) * 4 * KIB;
            let length = if offset.is_multiple_of(GROUP) && rng.below(2) == 0 {
                8 * KIB
            } else {
                4 * KIB
            };
            let data = rng.bytes(length as usize);
            send(&mut stream, Command::Write, round * 4 + k, offset, &data);
            sent.push((offset, data));
        }
        for _ in 0..4 {
            let cookie = reply(&mut stream, "an aligned write");
            let (offset, data) = &sent[(cookie - round * 4) as usize];
            let at = *offset as usize;
            ledger.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
        }
    }
}

/// An unaligned writer: 1–3,000 bytes at any offset inside its bytes of
/// a group (`from..to` within it), one write at a time.
fn unaligned_writer(
    socket: &Path,
    ledger: Arc<Mutex<Vec<u8>>>,
    (from, to): (u64, u64),
    seed: u64,
    rounds: u64,
) {
    let mut stream = connect(socket);
    let mut rng = Rng(seed);
    for round in 0..rounds {
        let group = rng.below(UNALIGNED_GROUPS);
        let offset = group * GROUP + from + rng.below(to - from);
        let end = (offset + 1 + rng.below(3000)).min(group * GROUP + to);
        let data = rng.bytes((end - offset) as usize);
        // Every tenth is a write of zeroes.
        let command = if round % 10 == 9 {
            Command::WriteZeroes
        } else {
            Command::Write
        };
        if command == Command::WriteZeroes {
            let header = RequestHeader {
                flags: 0,
                command,
                cookie: round,
                offset,
                length: data.len() as u32,
            };
            stream.write_all(&header.encode()).unwrap();
        } else {
            send(&mut stream, command, round, offset, &data);
        }
        let cookie = reply(&mut stream, "an unaligned write");
        assert_eq!(cookie, round);
        let at = offset as usize;
        let mut ledger = ledger.lock().unwrap();
        match command {
            Command::WriteZeroes => ledger[at..at + data.len()].fill(0),
            _ => ledger[at..at + data.len()].copy_from_slice(&data),
        }
    }
}

/// RAID 5 served by `workers` workers; an aligned writer and two
/// unaligned ones, all in the first MiB (the same stripes, and the
/// unaligned ones in the same blocks), many writes each: every write is
/// answered, the first MiB reads back as the ledger says, SIGTERM stops
/// the server in order, and the parity agrees with the data.
fn aligned_and_unaligned_writers_on_raid5(workers: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    let mut create = vec!["create", "--level", "5", "--size", "8M"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    let mut server = serve_with(d, &members, &["--workers", workers]);
    let socket = d.join("md.sock");

    // The span starts from known bytes.
    let mut first = connect(&socket);
    let mut seed = Rng(7);
    let initial = seed.bytes(SPAN as usize);
    send(&mut first, Command::Write, 1, 0, &initial);
    reply(&mut first, "the first write");
    let ledger = Arc::new(Mutex::new(initial));

    let writers = [
        std::thread::spawn({
            let (socket, ledger) = (socket.clone(), Arc::clone(&ledger));
            move || aligned_writer(&socket, ledger, 300)
        }),
        std::thread::spawn({
            let (socket, ledger) = (socket.clone(), Arc::clone(&ledger));
            move || unaligned_writer(&socket, ledger, (8 * KIB, SPLIT), 11, 1000)
        }),
        std::thread::spawn({
            let (socket, ledger) = (socket.clone(), Arc::clone(&ledger));
            move || unaligned_writer(&socket, ledger, (SPLIT, 16 * KIB), 13, 1000)
        }),
    ];
    let mut failures = Vec::new();
    for writer in writers {
        if let Err(panic) = writer.join() {
            failures.push(
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "a writer panicked".into()),
            );
        }
    }
    let log = || std::fs::read_to_string(d.join("serve.log")).unwrap_or_default();
    assert!(
        failures.is_empty(),
        "{failures:?} with --workers {workers}; server log:\n{}",
        log()
    );
    let back = read(&mut first, 0, SPAN as u32);
    let ledger = ledger.lock().unwrap();
    let wrong = back.iter().zip(ledger.iter()).position(|(a, b)| a != b);
    assert_eq!(wrong, None, "first wrong byte, with --workers {workers}");
    drop(first);

    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = server.try_wait().unwrap() {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "SIGTERM did not stop the server within 30 s; log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        exit.success(),
        "serve did not stop cleanly: {exit:?}\n{}",
        log()
    );
    assert_checks_clean(d, &members, "after the writers");
}

#[test]
fn unaligned_writes_beside_aligned_ones_never_stall_a_single_worker() {
    aligned_and_unaligned_writers_on_raid5("1");
}

#[test]
fn unaligned_writes_beside_aligned_ones_never_stall_two_workers() {
    aligned_and_unaligned_writers_on_raid5("2");
}

/// udev holds a shared lock on a block device while it probes it, and it
/// probes the members just after a server closed them: a restarted server
/// opening them then found one "in use by (udev-worker)" and refused it
/// (`systemctl restart` failed). It waits for the probe now, and serves.
#[test]
fn a_server_starting_while_udev_probes_a_member_waits_for_the_probe() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    ok(
        &["create", "--level", "5", "--size", "8M", "m0", "m1", "m2"],
        d,
    );
    // flock(1) holds a shared lock, as udev's worker does while it probes.
    let mut probe = std::process::Command::new("flock")
        .arg("--shared")
        .arg(d.join("m1"))
        .args(["sleep", "2"])
        .spawn()
        .expect("flock(1) (util-linux)");
    let held = || {
        !std::process::Command::new("flock")
            .args(["--nonblock", "--exclusive"])
            .arg(d.join("m1"))
            .arg("true")
            .status()
            .unwrap()
            .success()
    };
    let until = Instant::now() + Duration::from_secs(10);
    while !held() {
        assert!(Instant::now() < until, "flock(1) took no lock");
        std::thread::sleep(Duration::from_millis(10));
    }
    let served = serve_with(d, &members, &[]);
    probe.wait().unwrap();
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains("shared lock") && log.contains("waiting for it"),
        "the server did not wait for the probe:\n{log}"
    );
    served.interrupt();
}
