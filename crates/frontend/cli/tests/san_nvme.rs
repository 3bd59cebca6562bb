//! NVMe/TCP nodes on the storage-network bed: `bench/san up 2 --backend
//! nvraid-nvme` makes two storage nodes, each in its own network namespace
//! behind a shaped veth link, each serving its own RAID 0 as an NVMe/TCP
//! subsystem (`nvraid serve --nvme-tcp`; this host's kernel has no nvmet).
//! From the head namespace nvraid makes a RAID 1 of the two `nvme+tcp://`
//! members, writes and reads a pattern; node 2's link is taken down:
//! opening the array fails at once naming that member; the link comes back
//! (the bed returns once the node answers an NVMe/TCP ICReq), the pattern
//! reads back and more is written and read.
//!
//! Needs root and iproute2 (ip, tc); `./test.sh` installs them.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// The test's own bed (its own name prefix: the NBD bed's test, or a bed a
/// developer has up, are left alone); brought down on drop.
struct Bed;

const PREFIX: &str = "nvsanv";

fn san(args: &[&str]) -> String {
    let out = Command::new(repo().join("bench/san"))
        .env("NVRAID_SAN_PREFIX", PREFIX)
        .env("NVRAID", env!("CARGO_BIN_EXE_nvraid"))
        .args(args)
        .output()
        .expect("bench/san runs (python3)");
    assert!(
        out.status.success(),
        "bench/san {args:?} failed (needs root, iproute2): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

impl Drop for Bed {
    fn drop(&mut self) {
        san(&["down"]);
    }
}

fn head_nvraid(args: &[String], dir: &Path) -> std::process::Output {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{PREFIX}-head"),
            env!("CARGO_BIN_EXE_nvraid"),
            "--nbd-timeout",
            "5s",
            "--nbd-connect-timeout",
            "2s",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// `nvraid ARGS` in the head namespace; its stderr.
fn head_ok(args: &[String], dir: &Path) -> String {
    let out = head_nvraid(args, dir);
    assert!(
        out.status.success(),
        "nvraid {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `nvraid ARGS` in the head namespace, which must fail; its stderr.
fn head_fails(args: &[String], dir: &Path) -> String {
    let out = head_nvraid(args, dir);
    assert!(!out.status.success(), "nvraid {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

#[test]
fn a_raid1_over_nvme_tcp_nodes_on_the_bed_keeps_its_data_through_a_link_down() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    san(&["down"]);
    let out = san(&[
        "up",
        "2",
        "--backend",
        "nvraid-nvme",
        "--size",
        "64M",
        "--rate",
        "1gbit",
    ]);
    let bed = Bed;
    let uris: Vec<String> = out.lines().map(str::to_string).collect();
    assert_eq!(
        uris,
        [
            "nvme+tcp://10.77.1.2/nqn.2026-11.io.nvraid.san:node1",
            "nvme+tcp://10.77.2.2/nqn.2026-11.io.nvraid.san:node2"
        ]
    );
    assert_eq!(san(&["uris"]).lines().collect::<Vec<_>>(), uris);
    let run = |head: &[&str]| {
        let args: Vec<String> = head
            .iter()
            .map(|s| s.to_string())
            .chain(uris.iter().cloned())
            .collect();
        head_ok(&args, d)
    };
    run(&["create", "--level", "1"]);
    let first = pattern(4 << 20, 1);
    std::fs::write(d.join("p1"), &first).unwrap();
    run(&["write", "-i", "p1"]);
    run(&["read", "--length", "4194304", "-o", "r1"]);
    assert!(std::fs::read(d.join("r1")).unwrap() == first);

    // Node 2's link goes down: opening the array now fails at once,
    // naming the member that cannot be reached.
    san(&["link", "2", "down"]);
    let args: Vec<String> = ["read", "--length", "4194304", "-o", "r1"]
        .iter()
        .map(|s| s.to_string())
        .chain(uris.iter().cloned())
        .collect();
    let err = head_fails(&args, d);
    assert!(
        err.contains("nvme+tcp://10.77.2.2:4420/nqn.2026-11.io.nvraid.san:node2")
            && err.contains("cannot reach the target"),
        "{err}"
    );

    // The link comes back (the bed returns once the node answers an
    // ICReq); the data reads back, then more is written and read.
    san(&["link", "2", "up"]);
    run(&["read", "--length", "4194304", "-o", "r1"]);
    assert!(std::fs::read(d.join("r1")).unwrap() == first);
    let second = pattern(2 << 20, 2);
    std::fs::write(d.join("p2"), &second).unwrap();
    run(&["write", "--offset", "4M", "-i", "p2"]);
    run(&["read", "--offset", "4M", "--length", "2097152", "-o", "r2"]);
    assert!(std::fs::read(d.join("r2")).unwrap() == second);
    drop(bed);
}
