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
//! The same with the kernel's own target: `--backend kernel-nvmet` makes
//! each node a VM (tools/mdvm, Linux 6.12) in the node's namespace, whose
//! `nvmet-tcp` serves the VM's disk (a file on /dev/shm) on 0.0.0.0:4420,
//! reached through qemu's user network forwarding 10.77.I.2:4420; beside
//! the link going down and back, node 1 is killed and started again (its
//! VM boots anew) and the data is still there.
//!
//! Needs root and iproute2 (ip, tc); `./test.sh` installs them, and for the
//! kernel nodes qemu and the 6.12 kernel (tools/mdvm/fetch-kernel).

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// A test's own bed (its own name prefix: the NBD bed's test, the other
/// test here, or a bed a developer has up, are left alone); brought down
/// on drop.
struct Bed(&'static str);

const PREFIX: &str = "nvsanv";
const KERNEL_PREFIX: &str = "nvsank";

fn san(args: &[&str]) -> String {
    san_in(PREFIX, args)
}

fn san_in(prefix: &str, args: &[&str]) -> String {
    let out = Command::new(repo().join("bench/san"))
        .env("NVRAID_SAN_PREFIX", prefix)
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
        san_in(self.0, &["down"]);
    }
}

fn head_nvraid(args: &[String], dir: &Path) -> std::process::Output {
    head_nvraid_in(PREFIX, ("5s", "2s"), args, dir)
}

/// `nvraid ARGS` in bed `prefix`'s head namespace, with (request,
/// connect) timeouts for its members.
fn head_nvraid_in(
    prefix: &str,
    (request, connect): (&str, &str),
    args: &[String],
    dir: &Path,
) -> std::process::Output {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{prefix}-head"),
            env!("CARGO_BIN_EXE_nvraid"),
            "--nbd-timeout",
            request,
            "--nbd-connect-timeout",
            connect,
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
    let bed = Bed(PREFIX);
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

/// Kernel `nvmet-tcp` nodes on the bed (one VM per node, its port on
/// 0.0.0.0 behind qemu's forwarding): a RAID 1 over two of them keeps its
/// data through node 2's link going down and back, and through node 1's VM
/// being killed and booted again.
#[test]
fn a_raid1_over_kernel_nvmet_nodes_on_the_bed_keeps_its_data_through_a_link_down_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let san = |args: &[&str]| san_in(KERNEL_PREFIX, args);
    san(&["down"]);
    let out = san(&[
        "up",
        "2",
        "--backend",
        "kernel-nvmet",
        "--size",
        "64M",
        "--rate",
        "1gbit",
    ]);
    let bed = Bed(KERNEL_PREFIX);
    let uris: Vec<String> = out.lines().map(str::to_string).collect();
    assert_eq!(
        uris,
        [
            "nvme+tcp://10.77.1.2/nqn.2026-11.io.nvraid.san:node1",
            "nvme+tcp://10.77.2.2/nqn.2026-11.io.nvraid.san:node2"
        ]
    );
    // The nodes are VMs (tools/mdvm) whose script sets up the kernel's
    // target, not nvraid.
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("/run/nvraid-san-{KERNEL_PREFIX}/state.json")).unwrap(),
    )
    .unwrap();
    for i in 1..=2 {
        let pid = &state["pids"][i.to_string()];
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains("tools/mdvm/mdvm") && cmdline.contains("nvmet_tcp virtio_net"),
            "node {i}: {cmdline}"
        );
        let script =
            std::fs::read_to_string(format!("/run/nvraid-san-{KERNEL_PREFIX}/node{i}-guest.sh"))
                .unwrap();
        assert!(
            script.contains("echo 0.0.0.0 > $C/ports/1/addr_traddr"),
            "{script}"
        );
    }
    let head = |args: &[&str]| {
        // The nodes' VMs are emulated: more time than on the other bed.
        let args: Vec<String> = args
            .iter()
            .map(|s| s.to_string())
            .chain(uris.iter().cloned())
            .collect();
        head_nvraid_in(KERNEL_PREFIX, ("30s", "10s"), &args, d)
    };
    let run = |args: &[&str]| {
        let out = head(args);
        assert!(
            out.status.success(),
            "nvraid {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["create", "--level", "1"]);
    let first = pattern(4 << 20, 3);
    std::fs::write(d.join("p1"), &first).unwrap();
    run(&["write", "-i", "p1"]);
    run(&["read", "--length", "4194304", "-o", "r1"]);
    assert!(std::fs::read(d.join("r1")).unwrap() == first);

    // Node 2's link goes down: opening the array fails, naming it.
    san(&["link", "2", "down"]);
    let out = head(&["read", "--length", "4194304", "-o", "r1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "read with node 2 unreachable: {err}");
    assert!(
        err.contains("nvme+tcp://10.77.2.2:4420/nqn.2026-11.io.nvraid.san:node2")
            && err.contains("cannot reach the target"),
        "{err}"
    );
    san(&["link", "2", "up"]);
    run(&["read", "--length", "4194304", "-o", "r1"]);
    assert!(std::fs::read(d.join("r1")).unwrap() == first);

    // Node 1's VM killed and booted again (`start` returns once its
    // target answers): its disk kept the data; more is written and read.
    san(&["kill", "1"]);
    san(&["start", "1"]);
    run(&["read", "--length", "4194304", "-o", "r1"]);
    assert!(std::fs::read(d.join("r1")).unwrap() == first);
    let second = pattern(2 << 20, 4);
    std::fs::write(d.join("p2"), &second).unwrap();
    run(&["write", "--offset", "4M", "-i", "p2"]);
    run(&["read", "--offset", "4M", "--length", "2097152", "-o", "r2"]);
    assert!(std::fs::read(d.join("r2")).unwrap() == second);
    drop(bed);
}
