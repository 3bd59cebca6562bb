//! The server against real NBD clients (libnbd tools, qemu, fio). Every
//! tool is required: a missing one fails the test with the package name.

mod common;

use std::process::Command;

use common::{random_bytes, require, run, sha256_file, TestServer};
use nvraid_testing::MemTarget;

const MIB: u64 = 1 << 20;

#[test]
fn nbdinfo_reports_size_flags_and_block_sizes() {
    let nbdinfo = require("nbdinfo", "libnbd-bin");
    let server = TestServer::start(MemTarget::new(64 * MIB, 512));
    let output = run(Command::new(nbdinfo).arg("--json").arg(server.uri()));
    let info: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(info["protocol"], "newstyle-fixed");
    assert_eq!(info["structured"], true);
    let export = &info["exports"][0];
    assert_eq!(export["export-size"], 64 * MIB);
    assert_eq!(export["is_read_only"], false);
    for flag in [
        "can_flush",
        "can_fua",
        "can_multi_conn",
        "can_trim",
        "can_zero",
        "can_cache",
        "can_df",
    ] {
        assert_eq!(export[flag], true, "{flag} in {export}");
    }
    assert_eq!(export["can_fast_zero"], false);
    assert_eq!(export["block_size_minimum"], 512);
    assert_eq!(export["block_size_preferred"], 4096);
    assert_eq!(export["block_size_maximum"], 32 * MIB);
    assert_eq!(export["contexts"][0], "base:allocation");
    server.wait_log(&["client=unix:", "event=disconnected"]);
}

#[test]
fn nbdinfo_sees_a_read_only_export() {
    let nbdinfo = require("nbdinfo", "libnbd-bin");
    let server = TestServer::start_with(MemTarget::new(MIB, 4096), |o| o.read_only = true);
    let output = run(Command::new(nbdinfo).arg("--json").arg(server.uri()));
    let info: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let export = &info["exports"][0];
    assert_eq!(export["is_read_only"], true);
    assert_eq!(export["can_trim"], false);
    assert_eq!(export["block_size_minimum"], 4096);
}

#[test]
fn nbdcopy_round_trip_survives_a_restart() {
    let nbdcopy = require("nbdcopy", "libnbd-bin");
    let size = 256 * MIB;
    let target = MemTarget::new(size, 512);
    let server = TestServer::start(target.clone());
    let source = server.dir.path().join("source.img");
    std::fs::write(&source, random_bytes(size as usize, 7)).unwrap();
    run(Command::new(&nbdcopy)
        .args(["--connections=4", "--requests=16"])
        .arg(&source)
        .arg(server.uri()));
    let back = server.dir.path().join("back.img");
    run(Command::new(&nbdcopy).arg(server.uri()).arg(&back));
    let expected = sha256_file(&source);
    assert_eq!(sha256_file(&back), expected);
    let source_bytes = std::fs::read(&source).unwrap();
    let dir = server.stop();
    // The shutdown flush made every write durable.
    assert!(
        target.durable_contents() == source_bytes,
        "shutdown flush lost data"
    );
    target.crash();
    let server = TestServer::start_in(dir, target, |_| {});
    let again = server.dir.path().join("again.img");
    run(Command::new(&nbdcopy).arg(server.uri()).arg(&again));
    assert_eq!(sha256_file(&again), expected);
}

#[test]
fn qemu_img_compare_matches_the_image() {
    let qemu_img = require("qemu-img", "qemu-utils");
    let nbdcopy = require("nbdcopy", "libnbd-bin");
    let size = 16 * MIB;
    let target = MemTarget::new(size, 512);
    let data = random_bytes(size as usize, 11);
    target.fill(&data);
    let server = TestServer::start(target);
    let image = server.dir.path().join("image.raw");
    std::fs::write(&image, &data).unwrap();
    run(Command::new(&qemu_img)
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&image)
        .arg(server.uri()));
    // A one-byte difference must be found.
    let mut changed = data.clone();
    changed[5 * MIB as usize + 3] ^= 1;
    std::fs::write(&image, &changed).unwrap();
    let status = Command::new(&qemu_img)
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&image)
        .arg(server.uri())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    drop(nbdcopy);
}

#[test]
fn qemu_io_patterns_at_unaligned_and_crossing_offsets() {
    let qemu_io = require("qemu-io", "qemu-utils");
    let server = TestServer::start_with(MemTarget::new(8 * MIB, 4096), |o| {
        o.preferred_block_bytes = 65536
    });
    let writes = [
        "write -P 0x11 0 4096",
        "write -P 0x22 1000 3000",
        "write -P 0x33 65000 2000",
        "write -P 0x44 131071 70000",
        "write -P 0x55 -q 8384512 4096",
    ];
    let reads = [
        "read -P 0x11 0 1000",
        "read -P 0x22 1000 3000",
        "read -P 0x11 4000 96",
        "read -P 0x33 65000 2000",
        "read -P 0x44 131071 70000",
        "read -P 0x00 201071 1000",
        "read -P 0x55 8384512 4096",
    ];
    let mut command = Command::new(qemu_io);
    command.args(["-f", "raw"]);
    for op in writes.iter().chain(reads.iter()) {
        command.args(["-c", op]);
    }
    command.arg(server.uri());
    let output = run(&mut command);
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert!(!text.contains("failed"), "{text}");
    let contents = server.target.contents();
    assert!(contents[1000..4000].iter().all(|b| *b == 0x22));
    assert!(contents[131071..201071].iter().all(|b| *b == 0x44));
}

#[test]
fn fio_nbd_random_writes_verify_over_several_connections() {
    let fio = require("fio", "fio");
    let server = TestServer::start(MemTarget::new(64 * MIB, 512));
    // fio leaves verify state files in its working directory: keep them out
    // of the source tree.
    let scratch = tempfile::tempdir().unwrap();
    let output = run(Command::new(fio)
        .current_dir(scratch.path())
        .arg("--name=verify")
        .arg("--ioengine=nbd")
        .arg(format!("--uri={}", server.uri()))
        .args([
            "--rw=randwrite",
            "--bs=4k",
            "--size=16m",
            "--iodepth=16",
            "--numjobs=4",
            "--offset_increment=16m",
        ])
        .args([
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--group_reporting",
            "--output-format=json",
        ]));
    let text = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(
        job["write"]["io_bytes"].as_u64().unwrap() >= 4 * 16 * MIB,
        "{job}"
    );
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() > 0,
        "verify phase read nothing: {job}"
    );
    let connected = server
        .log_lines()
        .iter()
        .filter(|l| l.contains("event=transmission"))
        .count();
    assert!(
        connected >= 4,
        "expected several connections, saw {connected}"
    );
}
